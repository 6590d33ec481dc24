"""Size limits: each answered with its status, configurable, connection closed."""
import json

import pytest

from httpraw import Conn


def _status_and_closed(port, raw):
    with Conn(port, timeout=5) as c:
        c.send(raw)
        r = c.read_response()
        return r.status, c.is_closed(5)


def test_request_line_414_default(server):
    ok = b"GET /" + b"a" * 8000 + b" HTTP/1.1\r\nHost: a\r\n\r\n"
    assert server.request(ok).status == 200
    long = b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n"
    assert _status_and_closed(server.port, long) == (414, True)
    # also before the line is complete: no waiting for a CRLF that never comes
    assert _status_and_closed(server.port, b"GET /" + b"a" * 9000) == (414, True)


def test_header_count_431(make_server):
    s = make_server("apps:echo", "--limit-request-fields", "5")
    five = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(4)) + b"\r\n"
    assert s.request(five).status == 200
    six = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(5)) + b"\r\n"
    assert _status_and_closed(s.port, six) == (431, True)


def test_header_count_default_100(server):
    many = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n"
    assert _status_and_closed(server.port, many) == (431, True)


def test_header_block_size_431(make_server):
    s = make_server("apps:echo", "--limit-request-head", "2048")
    ok = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * 1500 + b"\r\n\r\n"
    assert s.request(ok).status == 200
    big = b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * 3000 + b"\r\n\r\n"
    assert _status_and_closed(s.port, big) == (431, True)
    # an endless head is cut off at the limit, not buffered forever
    assert _status_and_closed(s.port, b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X: y\r\n" * 1000) == (431, True)


def test_custom_request_line_limit(make_server):
    s = make_server("apps:echo", "--limit-request-line", "100")
    assert s.request(b"GET /" + b"a" * 50 + b" HTTP/1.1\r\nHost: a\r\n\r\n").status == 200
    assert _status_and_closed(s.port, b"GET /" + b"a" * 200 + b" HTTP/1.1\r\nHost: a\r\n\r\n") == (414, True)


def test_body_limit_413_content_length(make_server):
    s = make_server("apps:echo", "--limit-request-body", "1000")
    assert s.request(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n" + b"x" * 1000).status == 200
    # answered from the head alone: the client need not send the body
    assert _status_and_closed(s.port, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n") == (413, True)


def test_body_limit_413_chunked(make_server):
    s = make_server("apps:echo", "--limit-request-body", "1000")
    raw = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + b"200\r\n" + b"x" * 512 + b"\r\n"
    assert s.request(raw + b"0\r\n\r\n").status == 200
    assert _status_and_closed(s.port, raw * 1 + b"200\r\n" + b"x" * 512 + b"\r\n0\r\n\r\n") == (413, True)


def test_default_body_limit_is_1_gib(server):
    assert _status_and_closed(server.port, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % (1 << 30 + 1)) == (413, True)
    with Conn(server.port) as c:    # exactly 1 GiB is allowed: the server waits for the body
        c.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\nabc" % (1 << 30))
        assert not c.is_closed(timeout=0.5)


def test_size_suffixes_on_cli(make_server):
    s = make_server("apps:echo", "--limit-request-body", "1K")
    assert _status_and_closed(s.port, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1025\r\n\r\n") == (413, True)
    assert s.request(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc").status == 200
