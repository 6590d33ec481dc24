"""bench/run_floor.py, the CPython floor of one WSGI request against the
budget of the keep-alive goal (keep-alive hello at ≥ 0.95× the C
reference's requests per server CPU-second): a short run with the
reference's figure given (no server started), checked for every case's line
and for a verdict that follows from the figures it printed; with --no-write
it leaves bench/RESULTS.md as it was. ~2 s."""
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "bench", "run_floor.py")
RESULTS = os.path.join(REPO, "bench", "RESULTS.md")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_short_run_prints_every_case_and_a_consistent_verdict():
    before = read(RESULTS)
    r = subprocess.run([sys.executable, SCRIPT, "--ref-us", "3.60", "--number", "20000", "--repeat", "3",
                        "--no-write"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert read(RESULTS) == before, "--no-write changed bench/RESULTS.md"
    ns = {name: float(v) for name, v in re.findall(r"^  (\w+) +(-?[\d.]+) ns$", r.stdout, re.M)}
    assert set(ns) == {"app", "environ", "body", "request"}, r.stdout
    assert ns["app"] > 0 and ns["request"] > ns["body"], r.stdout
    budget = float(re.search(r"a server may spend (\d+) ns more", r.stdout).group(1))
    assert abs(budget - 3600 * (1 / 0.95 - 1)) < 1, r.stdout          # 189 ns
    best = float(re.search(r"only this Python: ([\d.]+)x", r.stdout).group(1))
    assert abs(best - 3600 / (3600 + ns["request"])) < 0.002, r.stdout


def test_json_gives_the_floor_of_each_run_core_workload():
    """--json (what run_core.py calls in each round): one JSON line, the
    floor of keep-alive hello, 4k and post-1k in ns per request (timings:
    only their presence and sign are checked)."""
    before = read(RESULTS)
    r = subprocess.run([sys.executable, SCRIPT, "--json", "--number", "20000", "--repeat", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert read(RESULTS) == before, "--json changed bench/RESULTS.md"
    floors = json.loads(r.stdout)
    assert set(floors) == {"keepalive-hello", "keepalive-4k", "post-1k"}, r.stdout
    assert all(v > 0 for v in floors.values()), floors
