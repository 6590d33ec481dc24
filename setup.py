"""Build forkwsgi's extension: the pure C core (cserver/), the per-request WSGI
glue in C (src/*.c) and the Python-facing objects in Cython (src/_forkwsgi.pyx).

A C compiler, the Python headers and Cython (a build requirement, which pip
fetches) are needed. FORKWSGI_SANITIZE=1 builds with ASan/UBSan (for the
sanitizer test run).
"""
import os
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

cflags = ["-std=gnu11", "-Wall", "-Wextra", "-Wimplicit-fallthrough", "-Werror",
          "-Wno-missing-field-initializers", "-O2", "-fvisibility=hidden"]
ldflags = []
if os.environ.get("FORKWSGI_SANITIZE"):
    cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    ldflags += ["-fsanitize=address,undefined"]

# src/_forkwsgi.c is what Cython makes of src/_forkwsgi.pyx.
glue = sorted(f for f in glob("src/*.c") if not f.endswith("_forkwsgi.c"))

setup(
    ext_modules=cythonize(
        [
            Extension(
                "forkwsgi._forkwsgi",
                sources=["src/_forkwsgi.pyx"] + sorted(glob("cserver/*.c")) + glue,
                include_dirs=["cserver", "src"],
                depends=glob("cserver/*.h") + glob("src/*.h"),
                extra_compile_args=cflags,
                extra_link_args=ldflags,
            )
        ],
        compiler_directives={"language_level": 3},
        quiet=True,
    ),
)
