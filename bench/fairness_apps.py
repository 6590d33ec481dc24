"""Apps of bench/run_fairness.py, the same for forkwsgi and gunicorn.

/sleep?d=S       sleeps S seconds, answers "ok"
/read            reads the request body, answers its length
/ticker?n=N&every=S   N chunks streamed S seconds apart, each saying when it
                 was yielded (CLOCK_MONOTONIC, which the client reads too)
"""
import time
from urllib.parse import parse_qs


def app(environ, start_response):
    path = environ["PATH_INFO"]
    q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
    if path == "/read":
        body = environ["wsgi.input"].read()
        out = b"got %d" % len(body)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
        return [out]
    if path == "/ticker":
        n, every = int(q.get("n", "4")), float(q.get("every", "1"))
        start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])

        def chunks():
            for i in range(n):
                if i:
                    time.sleep(every)
                yield f"data: {i} {time.monotonic():.6f}\n\n".encode()
        return chunks()
    d = float(q.get("d", "0"))
    if d > 0:
        time.sleep(min(d, 30.0))
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
