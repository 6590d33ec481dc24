"""Places, pins and the small shell helpers every benchmark script uses."""
import os
import re
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCH)
OUT = os.path.join(BENCH, "out")
RESULTS = os.path.join(BENCH, "RESULTS.md")
HOST = "127.0.0.1"
SERVER_CPU = "0"       # every server under test
CLIENT_CPU = "1"       # wrk, the Python clients, nginx in front


def log(msg=""):
    print(msg, flush=True)


def wait_until(cond, timeout, pause=0.1):
    """Until cond() is true (checked every `pause` s); False if it is not
    within `timeout` s. For waiting on an observable event (a file's size,
    a log line, a count) instead of sleeping a guessed time."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
    return True


def run_quiet(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def apt_install(*packages):
    """Debian packages the benchmark needs (as root); what fails is logged."""
    log(f"installing with apt-get: {' '.join(packages)}")
    try:
        run_quiet(["apt-get", "update"])
        r = run_quiet(["apt-get", "install", "-y", *packages])
        if r.returncode != 0:
            log(r.stdout[-2000:])
    except OSError as e:
        log(f"apt-get unavailable: {e}")


def first_error_line(output):
    """The first compiler error in a tool's output (pip building a package)
    if there is one, else its first ERROR line, else its last line."""
    lines = [ln.strip() for ln in output.splitlines()]
    for pattern in (r": (fatal )?error: ", r"^ERROR: ", r"\berror\b"):
        for line in lines:
            if re.search(pattern, line):
                return line
    return lines[-1] if lines else "(no output)"


def rotated(items, rnd):
    """`items` (a list or tuple) in round `rnd`'s order: rotated by one per
    round, so each comes first in turn and none always runs after the same
    neighbour (the rounds of a benchmark are interleaved this way)."""
    k = rnd % len(items)
    return items[k:] + items[:k]


def invocation():
    """The command line that started this script, as run from the repository
    root (for the "Run on ... by `...`" line of its section); --no-write left out."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join(["python3", script, *(a for a in sys.argv[1:] if a != "--no-write")])


def git_head(where=ROOT):
    """The short commit of the checkout at `where` ("" outside git)."""
    r = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""
