"""Timeouts: header (slowloris), body, keep-alive idle, stalled writes."""
import socket
import time

from httpraw import Conn, wait_for


def test_header_timeout_408(make_server):
    s = make_server("apps:echo", "--header-timeout", "1")
    with Conn(s.port) as c:
        t0 = time.monotonic()
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n")
        r = c.read_response()
        took = time.monotonic() - t0
        assert r.status == 408 and c.is_closed(3)
        assert 0.8 < took < 5


def test_header_timeout_is_total_not_idle(make_server):
    """Trickling a byte every 0.3 s does not extend it (slowloris)."""
    s = make_server("apps:echo", "--header-timeout", "1")
    with Conn(s.port) as c:
        t0 = time.monotonic()
        got = None
        for b in b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: aaaaaaaaaaaaaaa":
            try:
                c.send(bytes([b]))
            except OSError:
                break
            time.sleep(0.3)
            c.sock.settimeout(0.01)
            try:
                got = c.sock.recv(100)
                break
            except socket.timeout:
                pass
            if time.monotonic() - t0 > 6:
                break
        assert got and got.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - t0 < 4


def test_silent_connection_closed_quietly(make_server):
    s = make_server("apps:echo", "--header-timeout", "1")
    with Conn(s.port) as c:
        assert c.is_closed(4)
        assert c.buf == b""


def test_body_timeout_408(make_server):
    s = make_server("apps:echo", "--body-timeout", "1")
    with Conn(s.port) as c:
        c.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
        r = c.read_response()
        assert r.status == 408 and c.is_closed(3)


def test_body_timeout_is_per_pause(make_server):
    """A body arriving steadily but slowly is fine as long as each pause is
    short (the minimum rate, tested apart, is off here)."""
    s = make_server("apps:echo", "--body-timeout", "1", "--body-min-rate", "0")
    with Conn(s.port) as c:
        c.send(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
        for i in range(10):
            time.sleep(0.25)
            c.send(b"x")
        assert c.read_response().status == 200


def test_keepalive_idle_timeout(make_server):
    s = make_server("apps:echo", "--keep-alive", "1")
    with Conn(s.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 200
        t0 = time.monotonic()
        assert c.is_closed(4)
        assert 0.8 < time.monotonic() - t0 < 4


def test_keepalive_zero_disables(make_server):
    s = make_server("apps:echo", "--keep-alive", "0")
    with Conn(s.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().header("connection") == "close"
        assert c.is_closed(2)


def test_write_timeout_drops_stalled_reader(make_server):
    s = make_server("apps:big", "--write-timeout", "1")
    with Conn(s.port) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.send(b"GET /?mb=200 HTTP/1.1\r\nHost: a\r\n\r\n")
        # never read: the server must give up (and say so)
        assert wait_for(lambda: "stopped reading" in s.log(), 20), s.log()[-1000:]
        got = len(c.read_until_close())
        assert got < 100 * 1024 * 1024
    assert s.get("/?mb=1").status == 200
