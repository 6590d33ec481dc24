"""start_response: keywords, exc_info by position, a tuple of headers, str
subclasses, latin-1 values sent as their bytes, and the app's list reused
after the call; non-latin-1 and non-str values are refused in the app."""
import pytest

from conftest import ServerProc
from httpraw import Conn


@pytest.fixture(scope="module")
def srv():
    s = ServerProc("sr_apps:app")
    yield s
    s.stop()


def get(s, path):
    with Conn(s.port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        return c.read_response()


@pytest.mark.parametrize("path,status", [("/kw", 201), ("/kw-exc", 202), ("/three", 200), ("/tuple", 200)])
def test_call_forms(srv, path, status):
    r = get(srv, path)
    assert (r.status, r.body) == (status, b"body")


def test_headers_list_changed_after_the_call(srv):
    r = get(srv, "/mutate")
    assert r.header("x-kept") == "1"
    assert r.header("x-changed") is None and r.header("x-late") is None


def test_headers_list_held_elsewhere_changed_after_the_call(srv):
    r = get(srv, "/global-list")
    assert r.header("x-kept") == "1" and r.header("x-late") is None


def test_headers_list_passed_borrowed_changed_after_the_call(srv):
    """A list whose reference count is low (a C caller's borrowed reference)
    is still the app's: what it adds later never reaches the wire unchecked."""
    r = get(srv, "/borrowed-list")
    assert r.status == 200 and r.header("content-type") == "text/plain"
    assert r.header("x-late") is None and b"Injected" not in r.raw_head


def test_write_of_an_ended_request_raises_and_never_writes(srv):
    """The write() callable is kept with its start_response across requests
    (a free list): one the app kept must not write into a later request, on
    the same connection or another, however many requests come between."""
    assert get(srv, "/keep-write").status == 200
    for _ in range(3):
        with Conn(srv.port) as c:
            for path in ("/write", "/old-write", "/write"):
                c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            bodies = [c.read_response().body for _ in range(3)]
        assert bodies == [b"by write", b"RuntimeError", b"by write"]
    assert b"stale" not in srv.log().encode()


def test_str_subclasses(srv):
    r = get(srv, "/subclass")
    assert (r.status, r.header("x-sub")) == (200, "v")


def test_latin1_value_goes_out_as_its_bytes(srv):
    r = get(srv, "/latin1")
    assert b"\r\nX-Latin: caf\xe9\r\n" in r.raw_head


@pytest.mark.parametrize("path,error", [("/nonlatin", "header value is not latin-1"),
                                        ("/status-nonlatin", "status is not latin-1"),
                                        ("/bytes", "header name must be str, not bytes")])
def test_refused_in_the_app(srv, path, error):
    r = get(srv, path)
    assert r.status == 500
    assert error in srv.log()


def test_header_values_judged_at_every_position(srv):
    """Header values are checked eight bytes at a time (src/start_response.c):
    a control character (NUL, CR, LF, DEL...) is refused wherever it sits,
    in a whole word or the tail, and HTAB or a latin-1 byte is not."""
    r = get(srv, "/value-matrix")
    assert (r.status, r.body) == (200, b"all judged right"), r.body[:2000]


def test_a_replacing_call_that_raises_leaves_the_first_head(srv):
    """start_response queues its head at once. A second call (with
    exc_info) whose headers are refused raises before it touches the
    queued head: an app that catches the error answers with its first
    head, status line and all, and the connection stays in step for the
    next request (sent in the same write)."""
    with Conn(srv.port) as c:
        c.send(b"GET /exc-bad-name HTTP/1.1\r\nHost: t\r\n\r\nGET /lazy-exc-bad HTTP/1.1\r\nHost: t\r\n\r\n"
               b"GET /kw HTTP/1.1\r\nHost: t\r\n\r\n")
        first, lazy, last = c.read_response(), c.read_response(), c.read_response()
    assert (first.status, first.header("x-first"), first.body) == (200, "1", b"body")
    assert (lazy.status, lazy.header("x-first"), lazy.body) == (200, "1", b"gbody")
    assert (last.status, last.body) == (201, b"body")


def test_a_replacing_call_with_a_bad_length_leaves_no_head(srv):
    """A bad Content-Length is only seen as the new head is queued, when
    the first is gone: the response has no head the app gave, so it is a
    500 that closes the connection (never a body without a status line)."""
    with Conn(srv.port) as c:
        c.send(b"GET /exc-bad-length HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
        assert r.status == 500 and r.header("connection") == "close"
        assert c.is_closed(5)
