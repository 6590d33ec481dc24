"""Expect: 100-continue: answered 100 Continue at once, and the body is read
by the loop before the app runs (PEP 3333's first way, as gunicorn does), so
no thread ever waits for a client's body (issue 23, item 2: the app used to
run first and its read waited on the socket, on the loop thread inline)."""

from httpraw import Conn, wait_for

APP_MODES = ("inline", "threads", "handoff")     # handoff: the app threads' hand-offs (conftest)


def continue_then(c, head, body):
    """Send head, read its 100 Continue, send body: the final response."""
    c.send(head)
    assert c.read_response().status == 100
    c.send(body)
    return c.read_response()


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


def test_continue_at_once_and_body_read_before_the_app(make_server):
    """Even for an app that then answers without reading: the body was
    read, so the connection carries the next request."""
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        r = continue_then(c, b"POST /reject HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
                          b"hello")
        assert r.status == 403 and r.header("connection") is None
        c.send(b"GET /read HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().body == b"got 0"


def test_expect_with_a_body_over_the_limit_gets_413_not_100(make_server):
    s = make_server("apps:expect", "--limit-request-body", "10")
    with Conn(s.port) as c:
        c.send(b"POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n")
        r = c.read_response()
        assert r.status == 413 and c.is_closed()


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


def test_a_malformed_chunk_after_100_continue_is_400_before_the_app(make_server):
    """The body is decoded by the loop before the app runs: a bad chunk
    size after the 100 Continue is a 400 that closes the connection, and
    the app never sees a half body (no exception in it to log)."""
    s = make_server("apps:expect")
    with Conn(s.port) as c:
        r = continue_then(c, b"POST /read HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                             b"Expect: 100-continue\r\n\r\n", b"3\r\nabc\r\nzz\r\nxy\r\n0\r\n\r\n")
        assert r.status == 400 and r.header("connection") == "close"
        assert c.is_closed(5)
    with Conn(s.port) as c:
        c.send(b"POST /read HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok")
        assert c.read_response().body == b"got 2"
    assert wait_for(lambda: ": 400 " in s.log())      # (the worker's log lines leave through a queue)
    assert "Traceback" not in s.log()
