"""The WSGI apps of bench/run_balance.py (identical for every server).

sleep_app  GET /?d=SECONDS sleeps that long (0..60 s) and answers "ok".
cpu_app    5 x (time.sleep(0.010) + ~10 ms of pure-Python work holding the
           GIL), ~100 ms per request, half of it on the CPU.

Both answer with these headers, which the client uses:
  X-Pid    os.getpid() of the process that ran the app
  X-Start  time.monotonic() when the app was called (CLOCK_MONOTONIC is
  X-End    system-wide, so the client can compare them across processes)
  X-Cpu    CPU time of the calling thread spent in the app, seconds

The CPU slice is a loop of SPIN_ITERS iterations. run_balance.py calibrates
it once, pinned to the servers' CPU, and passes the count to every server in
the environment (BALANCE_SPIN_ITERS) so all servers do the same work; if the
variable is missing the app calibrates itself at import time.
"""
import os
import time
from urllib.parse import parse_qs

SLICES = 5
SLICE_SLEEP = 0.010
SLICE_CPU = 0.010
MAX_DELAY = 60.0


def spin(n):
    """Pure-Python work: holds the GIL for the whole loop."""
    x = 0
    for i in range(n):
        x += i * i
    return x


def calibrate(target=SLICE_CPU, trials=7):
    """Iterations of spin() that take `target` seconds of CPU on this
    machine: the fastest of several trials, so a busy moment does not inflate
    the count."""
    n = 20000
    while True:                              # grow to a measurable size
        t0 = time.thread_time()
        spin(n)
        if time.thread_time() - t0 >= 0.005:
            break
        n *= 2
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        spin(n)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(n * target / best))


_env = os.environ.get("BALANCE_SPIN_ITERS")
SPIN_ITERS = int(_env) if _env else calibrate()


def _answer(start_response, t0, c0, body=b"ok"):
    t1 = time.monotonic()
    start_response("200 OK", [
        ("Content-Type", "text/plain"),
        ("Content-Length", str(len(body))),
        ("X-Pid", str(os.getpid())),
        ("X-Start", f"{t0:.6f}"),
        ("X-End", f"{t1:.6f}"),
        ("X-Cpu", f"{time.thread_time() - c0:.6f}"),
    ])
    return [body]


def sleep_app(environ, start_response):
    t0, c0 = time.monotonic(), time.thread_time()
    try:
        d = float(parse_qs(environ.get("QUERY_STRING", "")).get("d", ["0"])[0])
    except ValueError:
        d = 0.0
    if d > 0:
        time.sleep(min(d, MAX_DELAY))
    return _answer(start_response, t0, c0)


def cpu_app(environ, start_response):
    t0, c0 = time.monotonic(), time.thread_time()
    for _ in range(SLICES):
        time.sleep(SLICE_SLEEP)
        spin(SPIN_ITERS)
    return _answer(start_response, t0, c0)


if __name__ == "__main__":
    # python3 balance_apps.py  ->  the calibrated count (run_balance.py uses this)
    print(calibrate())
