"""The app of tests/test_uwsgi_protocol.py: what the server made of a
request (uwsgi or HTTP), a 404, and a large streamed response."""
import hashlib
import json


def chunk(i, size):
    """The i-th chunk of /big: its bytes tell where they belong."""
    return (b"%08d" % i) * (size // 8) + b"." * (size % 8)


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/missing":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such page\n"]
    if path == "/big":
        # ?n=chunks&size=bytes: streamed, no Content-Length.
        q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
        n, size = int(q.get("n", 4)), int(q.get("size", 1024))
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return (chunk(i, size) for i in range(n))
    body = environ["wsgi.input"].read()
    data = {k: v for k, v in environ.items() if isinstance(v, str)}
    data["body_len"] = len(body)
    data["body_sha256"] = hashlib.sha256(body).hexdigest()
    out = json.dumps(data).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]
