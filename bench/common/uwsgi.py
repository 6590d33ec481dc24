"""uWSGI in its own virtualenv, bench/.venv-uwsgi (pip compiles it, at a
pinned version): where it is and its creation."""
import os
import subprocess
import sys

from .base import BENCH, OUT, first_error_line, log, run_quiet

UWSGI_VERSION = "2.0.31"
UWSGI_VENV = os.path.join(BENCH, ".venv-uwsgi")
UWSGI_BIN = os.path.join(UWSGI_VENV, "bin", "uwsgi")


def ensure_uwsgi():
    """bench/.venv-uwsgi with uWSGI (compiled by pip). Returns (version, None)
    or (None, why it is not there)."""
    if not os.path.exists(os.path.join(UWSGI_VENV, "bin", "python")):
        log(f"creating {UWSGI_VENV}")
        subprocess.run([sys.executable, "-m", "venv", UWSGI_VENV], check=True)
    if not os.path.exists(UWSGI_BIN):
        log(f"pip install uwsgi=={UWSGI_VERSION} into bench/.venv-uwsgi (it compiles: a minute or two)")
        r = run_quiet([os.path.join(UWSGI_VENV, "bin", "python"), "-m", "pip", "--disable-pip-version-check",
                       "install", f"uwsgi=={UWSGI_VERSION}"])
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, "uwsgi-pip.log"), "w") as f:
            f.write(r.stdout)
        if r.returncode != 0 or not os.path.exists(UWSGI_BIN):
            return None, f"pip install uwsgi=={UWSGI_VERSION} failed: {first_error_line(r.stdout)}"
    r = run_quiet([UWSGI_BIN, "--version"])
    return (r.stdout.strip(), None) if r.returncode == 0 else (None, f"uwsgi --version: {r.stdout.strip()}")
