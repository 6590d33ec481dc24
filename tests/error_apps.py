"""Apps for tests/test_error_paths.py: an app that ends its process, one
whose iterable's close() raises, start_response misuse, a gated request
(it says when it is in the app, and waits for a file), a file sent with
wsgi.file_wrapper."""
import os
import sys
import time


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    if path == "/exit":
        sys.exit(int(query.get("code", "3")))
    if path == "/interrupt":
        raise KeyboardInterrupt
    if path == "/gate":
        # Marks "in the app" (query mark=PATH), then waits for the file
        # open=PATH to appear (at most 20 s).
        open(query["mark"], "w").close()
        end = time.monotonic() + 20
        while not os.path.exists(query["open"]) and time.monotonic() < end:
            time.sleep(0.01)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"gated " + query["mark"].rsplit("/", 1)[-1].encode()]
    if path == "/close-raises":
        class Body:
            def __iter__(self):
                return iter([b"a", b"b"])

            def close(self):
                raise RuntimeError("close() failed")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()
    if path == "/twice":
        start_response("200 OK", [])
        start_response("500 Again", [])
        return [b"never"]
    if path == "/status-int":
        start_response(200, [])
        return [b"never"]
    if path == "/header-int":
        start_response("200 OK", [("X-Count", 1)])
        return [b"never"]
    if path == "/no-reason":
        start_response("200", [])
        return [b"never"]
    if path == "/file":
        f = open(environ["HTTP_X_FILE"], "rb")
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](f, 1 << 16)
    if path == "/body":
        n = len(environ["wsgi.input"].read())
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(n).encode()]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
