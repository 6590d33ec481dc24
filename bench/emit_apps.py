"""The app of bench/run_emit.py: the cost of one forkwsgi.offload() call.

GET /loop?n=N&size=S: N records of S bytes emitted back to back, each call
timed with perf_counter_ns; answers JSON with the percentiles (ns) of that
request's calls and how many returned True. ?emit=0 times the loop without
the call (the floor of the timing itself)."""
import json
import os
import time

import forkwsgi


def app(environ, start_response):
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    n, size, emit = int(q.get("n", "1000")), int(q.get("size", "1024")), q.get("emit", "1") == "1"
    value = (f"{os.getpid()}-".encode() + b"x" * size)[:size]
    offload, perf = forkwsgi.offload, time.perf_counter_ns
    took, ok = [], 0
    for _ in range(n):
        t0 = perf()
        if emit:
            ok += offload("emit-bench", value)
        took.append(perf() - t0)
    took.sort()
    body = json.dumps({"n": n, "ok": ok if emit else n, "p50": took[n // 2], "p90": took[n * 9 // 10],
                       "p99": took[n * 99 // 100], "max": took[-1]}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
