"""The peers' virtualenv, bench/.venv, and the system packages the
benchmarks need: each script that runs a peer makes sure of what it uses,
so any of them works first on a fresh machine. The peers never see
forkwsgi; the framework apps' packages go into both interpreters (the
peers' and the one forkwsgi runs in) at the same versions."""
import json
import os
import shutil
import subprocess
import sys

from .base import BENCH, OUT, apt_install, first_error_line, log, run_quiet

PEER_VENV = os.path.join(BENCH, ".venv")
PEER_PY = os.path.join(PEER_VENV, "bin", "python")
# Every pinned version a benchmark installs into bench/.venv.
PINS = {"bjoern": "3.2.2", "gunicorn": "27.0.1", "fastpysgi": "0.6", "socketify": "0.0.31",
        "pyruvate": "1.6.1", "granian": "2.8.7", "flask": "3.1.3", "django": "5.2.19"}
FRAMEWORKS = ("flask", "django")


def ensure_system_packages():
    """wrk, libev-dev (bjoern builds against it), libuv1 (socketify), taskset
    and a C compiler from apt, if missing."""
    missing = []
    if not shutil.which("wrk"):
        missing.append("wrk")
    if not os.path.exists("/usr/include/ev.h"):
        missing.append("libev-dev")
    if not shutil.which("taskset"):
        missing.append("util-linux")
    if not shutil.which("cc"):
        missing.append("gcc")
    if not any(os.path.exists(f"/usr/lib/{arch}/libuv.so.1")
               for arch in ("x86_64-linux-gnu", "aarch64-linux-gnu")):
        missing.append("libuv1")
    if not missing:
        return
    apt_install(*missing)
    if not shutil.which("wrk") or not shutil.which("taskset") or not shutil.which("cc"):
        sys.exit("wrk, taskset and cc are required")


def installed_versions(python, packages):
    """package -> version installed for that interpreter (absent: not installed)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "v = {}\n"
            "for p in sys.argv[1:]:\n"
            "    try: v[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(v))")
    r = run_quiet([python, "-c", code, *packages])
    return json.loads(r.stdout) if r.returncode == 0 else {}


def _install(python, packages, where):
    """pip install the pinned versions missing from that interpreter.
    Returns {package: why it is unavailable} for those that fail to install
    or to import."""
    have = installed_versions(python, packages)
    unavailable = {}
    for package in packages:
        version = PINS[package]
        if have.get(package) == version:
            continue
        log(f"installing {package}=={version} into {where}")
        r = run_quiet([python, "-m", "pip", "--disable-pip-version-check", "install", f"{package}=={version}"])
        if r.returncode != 0:
            unavailable[package] = f"pip install {package}=={version} failed: {first_error_line(r.stdout)}"
            os.makedirs(OUT, exist_ok=True)
            with open(os.path.join(OUT, f"{package}-pip.log"), "w") as f:
                f.write(r.stdout)
    for package in packages:
        if package not in unavailable:
            r = run_quiet([python, "-c", f"import {package}"])
            if r.returncode != 0:
                unavailable[package] = f"import {package} fails: {r.stdout.strip().splitlines()[-1]}"
    return unavailable


def ensure_peers(packages):
    """bench/.venv with `packages` (keys of PINS) at their pinned versions;
    a framework among them goes into this interpreter too. Returns
    (versions installed in bench/.venv, {package: why unavailable})."""
    if not os.path.exists(PEER_PY):
        log(f"creating {PEER_VENV}")
        subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True)
    packages = list(packages)
    unavailable = _install(PEER_PY, packages, "bench/.venv")
    here = [p for p in packages if p in FRAMEWORKS]
    if here:
        for package, why in _install(sys.executable, here, "this interpreter").items():
            unavailable.setdefault(package, why + " (for forkwsgi's interpreter)")
    return installed_versions(PEER_PY, packages), unavailable


# The package each peer server of peer_command() comes from.
PACKAGE_OF = {"bjoern": "bjoern", "fastpysgi": "fastpysgi", "granian": "granian", "socketify": "socketify",
              "pyruvate": "pyruvate", "pyruvate-no-keepalive": "pyruvate", "gunicorn-sync": "gunicorn",
              "gunicorn-gthread": "gunicorn"}


def peers_ready(servers, extra=()):
    """What a script needs before it runs these servers (names as in
    peer_command; forkwsgi, uwsgi and the reference need nothing here) and
    the extra packages (frameworks): the system packages and bench/.venv.
    Returns {server or package: why it is unavailable}, each logged."""
    ensure_system_packages()
    packages = sorted({PACKAGE_OF[s] for s in servers if s in PACKAGE_OF} | set(extra))
    _, unavailable = ensure_peers(packages)
    out = {}
    for s in servers:
        if PACKAGE_OF.get(s) in unavailable:
            out[s] = unavailable[PACKAGE_OF[s]]
    for p in extra:
        if p in unavailable:
            out[p] = unavailable[p]
    for what, why in out.items():
        log(f"{what} unavailable: {why}")
    return out
