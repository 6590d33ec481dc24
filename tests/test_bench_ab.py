"""bench/run_ab.py, the before/after benchmark against an older git
revision: one quick run against HEAD (a worktree of HEAD built in a
temporary directory, one 2 s cell a side, and the C reference and the
CPython floor of --floor), checked for its ratio line, its table of the CPU
above the floor, and for leaving no worktree behind. It drives wrk, so it
is skipped where wrk, taskset, a second CPU, git or this checkout's built
extension are missing. Takes ~30-40 s, most of it the build of HEAD and the
floor's timing."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "run_ab.py")


def worktrees():
    r = subprocess.run(["git", "-C", REPO, "worktree", "list", "--porcelain"],
                       capture_output=True, text=True, timeout=30)
    return sorted(ln for ln in r.stdout.splitlines() if ln.startswith("worktree "))


def test_quick_run_against_head():
    for tool in ("wrk", "taskset", "git"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool}")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs (server on 0, wrk on 1)")
    if not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    if not glob.glob(os.path.join(REPO, "python", "forkwsgi", "_forkwsgi*.so")):
        pytest.skip("the extension is not built in this checkout")
    before = worktrees()
    r = subprocess.run([sys.executable, SCRIPT, "--rev", "HEAD", "--quick", "--no-write", "--floor",
                        "--workloads", "keepalive-hello", "--quiet-wait", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    # e.g. "keepalive-hello, threads 1: req/s × 1.004 (1.004–1.004), CPU/req × 0.991 (0.991–0.991)"
    ratio = r"\d+\.\d{3} \(\d+\.\d{3}–\d+\.\d{3}\)"
    assert re.search(rf"^keepalive-hello, threads 1: req/s × {ratio}, CPU/req × {ratio}$", r.stdout, re.M), \
        r.stdout[-3000:]
    # --floor: the C reference ran beside both sides and the floor was timed:
    # each side's CPU above the floor, in ns (any sign), and no verdict from one round
    ns = r"-?[\d,]+"
    assert re.search(rf"^\| keepalive-hello \| 1 \| {ns} \| {ns} \| {ns} \| {ns} \| {ns} \| too few rounds \|$",
                     r.stdout, re.M), r.stdout[-3000:]
    assert worktrees() == before
