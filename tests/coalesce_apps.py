"""Apps for tests/test_coalesce.py (write coalescing, --threads 1)."""
import json
import os
import time


def _query(environ):
    return dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)


def timed(environ, start_response):
    """?id=ID&t=SECONDS&mark=PATH&hold=PATH&gen=1: creates mark as it
    starts (the request is in the app now), waits until hold exists (20 s
    at most), sleeps t, answers when it started and ended (CLOCK_MONOTONIC,
    system-wide); as a generator (gen=1, as Flask and Django answer) or a
    list."""
    q = _query(environ)
    start = time.monotonic()
    if "mark" in q:
        open(q["mark"], "w").close()
    deadline = start + 20
    while "hold" in q and not os.path.exists(q["hold"]) and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(float(q.get("t", "0")))
    body = json.dumps({"id": q.get("id", ""), "start": start, "end": time.monotonic()}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    if q.get("gen") == "1":
        return (b for b in [body])
    return [body]


def two_chunks(environ, start_response):
    """A stream: a first line, then, after ?t=SECONDS, a second that says
    when the generator was resumed for it and when it was produced."""
    q = _query(environ)
    pause = float(q.get("t", "1"))
    start_response("200 OK", [("Content-Type", "text/plain")])

    def body():
        yield b"first\n"
        resumed = time.monotonic()
        time.sleep(pause)
        yield json.dumps({"resumed": resumed, "produced": time.monotonic()}).encode() + b"\n"
    return body()


def app(environ, start_response):
    if environ["PATH_INFO"] == "/stream":
        return two_chunks(environ, start_response)
    return timed(environ, start_response)
