"""One app for the pipelining tests (tests/test_pipelining.py), routed by path.

/n/<i>              "i=<i>": a short list body with its Content-Length
/list?kb=N          N KiB in one bytes of a list (the whole body known up front)
/gen?kb=N           N KiB yielded 16 KiB at a time, Content-Length set
/chunked?n=N        N chunks yielded, no Content-Length (chunked on HTTP/1.1)
/file?path=P        wsgi.file_wrapper over P (sendfile)
/read               reads wsgi.input: answers "len=<n>"
/write              start_response's write(), then an empty iterable
/raise              raises before start_response (a 500)
/ticks              "ticks=<n>": how often a thread of the app's own has
                    woken (every millisecond) since its first request
Every body says which request it answers, so order can be checked.
"""
import threading
import time

_ticks = [0]
_ticker = []


def _tick():
    while True:
        time.sleep(0.001)
        _ticks[0] += 1


def _q(environ):
    return dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)


def _fill(tag, size):
    tag = tag.encode()
    reps = size // len(tag) + 1
    return (tag * reps)[:size]


def app(environ, start_response):
    path = environ["PATH_INFO"]
    q = _q(environ)
    if path.startswith("/n/"):
        body = f"i={path[3:]}".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    if path == "/list":
        body = _fill("list.", int(q["kb"]) * 1024)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    if path == "/gen":
        size = int(q["kb"]) * 1024
        body = _fill("gen.", size)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(size))])
        return (body[i:i + 16384] for i in range(0, size, 16384))
    if path == "/chunked":
        n = int(q.get("n", "3"))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (f"c{i};".encode() for i in range(n))
    if path == "/file":
        f = open(q["path"], "rb")
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](f, 65536)
    if path == "/read":
        n = len(environ["wsgi.input"].read())
        body = f"len={n}".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    if path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
        write(b"wrote")
        return []
    if path == "/raise":
        raise RuntimeError("pipelining test: the app fails")
    if path == "/ticks":
        if not _ticker:         # started in the worker, after the fork
            _ticker.append(threading.Thread(target=_tick, daemon=True))
            _ticker[0].start()
        body = f"ticks={_ticks[0]}".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    start_response("404 Not Found", [("Content-Length", "0")])
    return []
