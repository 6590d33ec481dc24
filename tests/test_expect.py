"""Expect: 100-continue: sent when the app first reads wsgi.input, never otherwise."""
import json

from httpraw import Conn


def test_continue_sent_on_first_read(make_server):
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        c.send(b"POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        r = c.read_response()
        assert r.status == 100
        c.send(b"hello")
        r = c.read_response()
        assert r.status == 200 and r.body == b"got 5"
        # the connection is still good
        c.send(b"GET /read HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().body == b"got 0"


def test_continue_chunked(make_server):
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        c.send(b"POST /read HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-Continue\r\n\r\n")
        assert c.read_response().status == 100
        c.send(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        assert c.read_response().body == b"got 5"


def test_no_continue_when_app_does_not_read(make_server):
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        c.send(b"POST /reject HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        r = c.read_response()
        assert r.status == 403
        assert r.header("connection") == "close"   # the unread body cannot be skipped safely
        assert c.is_closed()


def test_no_continue_after_body_arrived(make_server):
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        c.send(b"POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello")
        r = c.read_response()
        assert r.status == 200 and r.body == b"got 5"


def test_expect_ignored_on_http10(make_server):
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        c.send(b"POST /read HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi")
        r = c.read_response()
        assert r.status == 200 and r.body == b"got 2"


def test_other_expectation_417(server):
    r = server.request(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n")
    assert r.status == 417
