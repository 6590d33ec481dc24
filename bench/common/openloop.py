"""bench/openloop.c: a fixed-rate (open-loop) load generator, built into
bench/out/ and run pinned to the client CPU; its latencies read back."""
import math
import os
import re
import shutil
import subprocess
import threading

from .base import BENCH, CLIENT_CPU, HOST, OUT, apt_install, run_quiet
from .servers import pinned

OPENLOOP_SRC = os.path.join(BENCH, "openloop.c")
OPENLOOP = os.path.join(OUT, "openloop")


def build_openloop():
    """bench/out/openloop, rebuilt when its source is newer; exits on failure."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        apt_install("gcc")
        cc = shutil.which("cc") or shutil.which("gcc")
    os.makedirs(OUT, exist_ok=True)
    if not os.path.exists(OPENLOOP) or os.path.getmtime(OPENLOOP) < os.path.getmtime(OPENLOOP_SRC):
        r = run_quiet([cc, "-O2", "-Wall", "-o", OPENLOOP, OPENLOOP_SRC])
        if r.returncode != 0:
            raise SystemExit("building bench/openloop.c failed:\n" + r.stdout[-2000:])
    return OPENLOOP


def pct(sorted_vals, q):
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_vals:
        return None
    k = max(0, math.ceil(q / 100 * len(sorted_vals)) - 1)
    return sorted_vals[min(k, len(sorted_vals) - 1)]


def run_openloop(port, rate, seconds, out_path, conns, path="/", prefix=(), cpu=CLIENT_CPU, idle=0, fifo=False,
                 on_ready=None):
    """RATE requests a second for SECONDS on up to `conns` kept-alive
    connections, pinned to `cpu` (after `prefix`, e.g. chrt); with `fifo`,
    every connection sends in turn; `idle` more connections held open,
    silent. on_ready() is called once every connection is open, as the clock
    starts. Returns its summary counts with latency percentiles in
    microseconds (p50_us .. max_us, from each request's due time), lag
    percentiles and rps, or {"failure": why}."""
    opts = (["-f"] if fifo else []) + (["-i", str(idle)] if idle else [])
    argv = [*prefix, *pinned(cpu, [OPENLOOP, *opts, HOST, str(port), path, str(rate), str(seconds), str(conns),
                                   out_path])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(seconds + 40 + idle / 500, proc.kill)     # bounded: connects, run, grace
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("OPENLOOP-READY") and on_ready is not None:
                on_ready()
        proc.wait()
    finally:
        timer.cancel()
    stdout = "".join(lines)
    if proc.returncode == -9:
        return {"failure": "openloop did not finish"}
    m = re.search(r"^OPENLOOP (.*)$", stdout, re.M)
    if proc.returncode != 0 or not m:
        return {"failure": "openloop failed: " + stdout.strip()[-300:]}
    res = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    lat, lag = [], []
    with open(out_path) as f:
        for line in f:
            _due, la, lg, st = line.split()
            lag.append(int(lg))
            if st == "200":
                lat.append(int(la))
    lat.sort()
    lag.sort()
    # A request that failed or timed out has no latency: it counts in
    # "errors"/"timeouts", which must be 0 for the figures to stand.
    res.update({"p50_us": pct(lat, 50) / 1e3 if lat else None,
                "p90_us": pct(lat, 90) / 1e3 if lat else None,
                "p99_us": pct(lat, 99) / 1e3 if lat else None,
                "p999_us": pct(lat, 99.9) / 1e3 if lat else None,
                "max_us": lat[-1] / 1e3 if lat else None,
                "lag_p50_us": pct(lag, 50) / 1e3 if lag else None,
                "lag_p99_us": pct(lag, 99) / 1e3 if lag else None,
                "rps": res["ok"] / seconds})
    return res
