"""WSGI apps for tests/test_connection_owner.py (the loop as the
connection's owner, attacked)."""
import threading
import time


def _q(environ):
    return dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)


def slow_cleanup(environ, start_response):
    """/stream?mb=N&cleanup=S&mark=PATH: a streamed body of N MiB in 256
    KiB chunks whose generator's finally block takes S seconds (an app
    that unsubscribes, flushes, releases a lock: app code); it creates the
    file PATH as it begins, for the test to wait for. /fast: a tiny
    answer."""
    q = _q(environ)
    if environ["PATH_INFO"] != "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"fast"]
    mb, cleanup = int(q.get("mb", "64")), float(q.get("cleanup", "3"))
    start_response("200 OK", [("Content-Type", "application/octet-stream")])

    def gen():
        try:
            for _ in range(mb * 4):
                yield b"s" * (256 << 10)
        finally:
            if "mark" in q:
                open(q["mark"], "w").close()
            time.sleep(cleanup)
    return gen()


def _hold_gil(seconds, mark, after=0.5):
    """After `after` seconds, a C call that keeps the GIL for `seconds` (a
    C extension that does not release it: ctypes.PyDLL calls with the GIL
    held). The file `mark` (if not None) is created just before it, with
    the GIL already held."""
    import ctypes
    libc = ctypes.PyDLL(None)
    time.sleep(after)
    if mark:
        open(mark, "w").close()
    libc.usleep(int(seconds * 1e6))


def gil_hog(environ, start_response):
    """/hog?s=S&mark=PATH: starts a background thread of the app that
    holds the GIL in C for S seconds (a cache rebuild in a C extension, a
    huge regex), creating the file PATH as it starts; answers at once.
    Anything else: a tiny answer."""
    q = _q(environ)
    if environ["PATH_INFO"] == "/hog":
        threading.Thread(target=_hold_gil, args=(float(q.get("s", "5")), q.get("mark")), daemon=True).start()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def stubborn_writer(environ, start_response):
    """write() that ignores the client going away (an app that catches
    everything), for a while."""
    write = start_response("200 OK", [("Content-Type", "application/octet-stream")])
    piece = b"w" * 65536
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            write(piece)
        except OSError:
            time.sleep(0.05)
    return []


def _piece(i, n):
    """n bytes that say which chunk they belong to and where they are."""
    pat = (b"%d:" % i) + bytes(range(97, 123))
    return (pat * (n // len(pat) + 1))[:n]


def mix(environ, start_response):
    """?sizes=1,70000,3&kind=list|gen|tuple&cl=1: a body of those chunks,
    each made by _piece; cl=1 gives the Content-Length."""
    q = _q(environ)
    sizes = [int(x) for x in q.get("sizes", "1").split(",") if x]
    chunks = [_piece(i, n) for i, n in enumerate(sizes)]
    headers = [("Content-Type", "application/octet-stream")]
    if q.get("cl") == "1":
        headers.append(("Content-Length", str(sum(sizes))))
    start_response("200 OK", headers)
    kind = q.get("kind", "list")
    if kind == "gen":
        return (c for c in chunks)
    if kind == "tuple":
        return tuple(chunks)
    return chunks


def mutated_list(environ, start_response):
    """A list body of 8 chunks of 256 KiB that a thread of the app keeps
    changing while the server sends it (items replaced, the list emptied
    and refilled)."""
    body = [bytes([65 + i]) * (256 << 10) for i in range(8)]
    stop = time.monotonic() + 3

    def meddle():
        i = 0
        while time.monotonic() < stop:
            i += 1
            if i % 3 == 0:
                body.clear()
            elif i % 3 == 1:
                body.extend(b"z" * (70 << 10) for _ in range(8))
            else:
                for k in range(len(body)):
                    body[k] = b"y" * (100 << 10)
            time.sleep(0.001)
    threading.Thread(target=meddle, daemon=True).start()
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return body


def pinned_sleep(environ, start_response):
    """?long=PID&t=S&short=S2: sleeps S seconds in worker PID, S2 in any
    other; answers who ran it and when it started (CLOCK_MONOTONIC)."""
    import json
    import os
    q = _q(environ)
    start = time.monotonic()
    mine = q.get("long") == str(os.getpid())
    time.sleep(float(q.get("t", "0")) if mine else float(q.get("short", "0")))
    body = json.dumps({"pid": os.getpid(), "start": start}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
