"""The bundled demo app: ``forkwsgi forkwsgi.demo:app``.

/            a hello page
/echo        echoes the request body (POST) with its length
/environ     the WSGI environ as JSON (no objects)
/stream?n=5  a streamed (chunked) response of n lines
"""
import json


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "application/octet-stream"),
                                  ("X-Body-Length", str(len(body)))])
        return [body]
    if path == "/environ":
        data = {k: v for k, v in environ.items() if isinstance(v, (str, bool, int))}
        body = json.dumps(data, indent=1, sort_keys=True).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    if path == "/stream":
        try:
            n = int(environ.get("QUERY_STRING", "").partition("n=")[2] or 5)
        except ValueError:
            n = 5
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (f"line {i}\n".encode() for i in range(min(n, 10000)))
    if path == "/":
        start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"Hello from forkwsgi!\n"]
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"Not Found\n"]
