"""App for tests/test_vectors.py: apps.echo, readable for HEAD requests too.

A HEAD response has no body, so for HEAD the same JSON is also sent in an
`X-Echo` response header (json.dumps escapes everything outside printable
ASCII, so the value is a safe header value).
"""
import json

from apps import echo as _echo


def echo(environ, start_response):
    if environ["REQUEST_METHOD"] != "HEAD":
        return _echo(environ, start_response)
    seen = {}

    def capture(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, headers
        return lambda data: None

    body = b"".join(_echo(environ, capture))
    start_response(seen["status"], seen["headers"] + [("X-Echo", json.dumps(json.loads(body)))])
    return [body]
