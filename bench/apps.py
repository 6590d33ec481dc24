"""The WSGI apps every server in the benchmark serves (identical for all).

Both set Content-Length themselves so that no server has to fall back to
chunked encoding or connection close to frame the body.
"""

HELLO = b"Hello, World!"
BODY_4K = b"x" * 4096


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(HELLO)))])
    return [HELLO]


def body4k(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(BODY_4K)))])
    return [BODY_4K]
