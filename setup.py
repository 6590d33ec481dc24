"""Build forkwsgi's C extension: the pure C core (cserver/) and the WSGI glue (src/).

Nothing but a C compiler and the Python headers is needed.
FORKWSGI_SANITIZE=1 builds with ASan/UBSan (for the sanitizer test run).
"""
import os
from glob import glob

from setuptools import Extension, setup

cflags = ["-std=gnu11", "-Wall", "-Wextra", "-Wimplicit-fallthrough", "-Werror",
          "-Wno-missing-field-initializers", "-O2", "-fvisibility=hidden"]
ldflags = []
if os.environ.get("FORKWSGI_SANITIZE"):
    cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    ldflags += ["-fsanitize=address,undefined"]

setup(
    ext_modules=[
        Extension(
            "forkwsgi._forkwsgi",
            sources=sorted(glob("cserver/*.c")) + sorted(glob("src/*.c")),
            include_dirs=["cserver", "src"],
            depends=glob("cserver/*.h") + glob("src/*.h"),
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ],
)
