"""The WSGI apps every server in the benchmark serves (identical for all).

All set Content-Length themselves so that no server has to fall back to
chunked encoding or connection close to frame the body. run_core.py serves
`route`, which picks one of the others by path as bench/refserver.c does.
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


def post_json(environ, start_response):
    """The POST workload: read the request body (1 KiB of JSON from
    bench/post.lua) through wsgi.input, answer hello. The body is not parsed:
    json.loads would cost every server the same and only dilute the
    difference between them. A short body is answered 400, which wrk counts."""
    expected = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(expected)
    if expected == 0 or len(body) != expected:
        start_response("400 Bad Request", [("Content-Type", "text/plain"),
                                           ("Content-Length", "0")])
        return [b""]
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(HELLO)))])
    return [HELLO]


def route(environ, start_response):
    """GET /4k -> body4k, /post -> post_json, anything else -> hello."""
    path = environ.get("PATH_INFO")
    if path == "/4k":
        return body4k(environ, start_response)
    if path == "/post":
        return post_json(environ, start_response)
    return hello(environ, start_response)
