"""Build forkwsgi's extension: the pure C core (cserver/), the per-request WSGI
glue in C (src/*.c) and the Python-facing objects in Cython (src/_forkwsgi.pyx).

A C compiler, the Python headers and Cython (a build requirement, which pip
fetches) are needed, on Linux only.

Environment:
- FORKWSGI_WERROR=1 turns warnings into errors (-Werror). Development and CI
  set it (the Makefile, .ci/run, the wheel builds); a user's `pip install`
  does not, so a newer compiler's new warning does not break it.
- FORKWSGI_SANITIZE=1 builds with ASan/UBSan (for the sanitizer test run).
- FORKWSGI_COVERAGE=1 builds with gcov counters (make coverage).
"""
import os
import sys

if not sys.platform.startswith("linux"):
    sys.exit("forkwsgi needs Linux (epoll, SO_REUSEPORT, SCM_RIGHTS)")

from glob import glob  # noqa: E402

from Cython.Build import cythonize  # noqa: E402
from setuptools import Extension, setup  # noqa: E402

cflags = ["-std=gnu11", "-pthread", "-Wall", "-Wextra", "-Wimplicit-fallthrough",
          "-Wno-missing-field-initializers", "-O2", "-fvisibility=hidden"]
# -pthread, -ldl: before glibc 2.34 the pthread functions and dlopen live in
# libpthread and libdl (dlopen: cserver/fw_kafka.c loads librdkafka).
ldflags = ["-pthread", "-ldl"]
if os.environ.get("FORKWSGI_WERROR") == "1":
    cflags.append("-Werror")
if os.environ.get("FORKWSGI_SANITIZE"):
    cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-O1", "-g"]
    ldflags += ["-fsanitize=address,undefined"]
if os.environ.get("FORKWSGI_COVERAGE"):
    # gcov line and branch counts (make coverage); -O0 keeps lines apart.
    cflags += ["--coverage", "-O0", "-g", "-DFORKWSGI_COVERAGE"]
    ldflags += ["--coverage"]

# src/_forkwsgi.c is what Cython makes of src/_forkwsgi.pyx.
glue = sorted(f for f in glob("src/*.c") if not f.endswith("_forkwsgi.c"))

setup(
    ext_modules=cythonize(
        [
            Extension(
                "forkwsgi._forkwsgi",
                sources=["src/_forkwsgi.pyx"] + sorted(glob("cserver/*.c")) + glue,
                include_dirs=["cserver", "src"],
                depends=glob("cserver/*.h") + glob("src/*.h") + glob("src/*.pxi"),
                extra_compile_args=cflags,
                extra_link_args=ldflags,
            )
        ],
        compiler_directives={"language_level": 3},
        quiet=True,
    ),
)
