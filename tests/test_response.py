"""Response framing and the app contract (PEP 3333) through a real server."""
import os
import re
import tempfile
import time

import pytest

from httpraw import Conn, wait_for

APP_MODES = ("inline", "threads", "handoff")     # handoff: the app threads' hand-offs (conftest)


@pytest.fixture(scope="module")
def errsrv(app_mode):
    from conftest import ServerProc, mode_env
    s = ServerProc("apps:errors", env=mode_env(app_mode))
    yield s
    s.stop()


def test_list_body_gets_content_length_in_one_write(server):
    r = server.get("/")
    assert r.header("content-length") == str(len(r.body))
    assert r.header("transfer-encoding") is None
    assert re.match(r"^\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT$", r.header("date"))


def test_generator_is_chunked_on_11_and_close_delimited_on_10(make_server):
    s = make_server("apps:stream")
    r = s.get("/?n=3&size=5")
    assert r.header("transfer-encoding") == "chunked"
    assert r.body == b"0000\n0000\n0000\n"
    with Conn(s.port) as c:
        c.send(b"GET /?n=4 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        r = c.read_response()
        assert r.header("transfer-encoding") is None and r.header("content-length") is None
        assert r.header("connection") == "close"
        assert r.body.count(b"\n") == 4


def test_head_has_no_body_but_same_headers(server, make_server):
    with Conn(server.port) as c:
        c.send(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response("HEAD")
        assert r.status == 200 and int(r.header("content-length")) > 0
        r2 = c.read_response()      # the next response follows at once: no HEAD body sent
        assert b"/after" in r2.body
    s = make_server("apps:stream")
    with Conn(s.port) as c:
        c.send(b"HEAD /?n=2 HTTP/1.1\r\nHost: a\r\n\r\nGET /?n=1 HTTP/1.1\r\nHost: a\r\n\r\n")
        c.read_response("HEAD")
        assert c.read_response().body.count(b"\n") == 1


@pytest.mark.parametrize("path,status", [("/204", 204), ("/304", 304)])
def test_no_body_statuses(errsrv, path, status):
    with Conn(errsrv.port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\nGET /write HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == status
        assert r.header("transfer-encoding") is None
        if status == 204:
            assert r.header("content-length") is None
        assert c.read_response().body == b"written and returned"


def test_hop_by_hop_headers_dropped_and_close_honoured(errsrv):
    with Conn(errsrv.port) as c:
        c.send(b"GET /hop HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.header("keep-alive") is None and r.header("x-ok") == "1"
        assert r.header("connection") == "close"
        assert c.is_closed()


@pytest.mark.parametrize("path", ["/crlf-header", "/crlf-status", "/nul-header"])
def test_header_injection_is_500_never_split(errsrv, path):
    with Conn(errsrv.port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == 500
        assert b"evil" not in r.raw_head.lower() and r.header("set-cookie") is None
        assert c.is_closed()
    assert "ValueError" in errsrv.log()


@pytest.mark.parametrize("path", ["/raise", "/raise-after-start", "/no-start", "/not-bytes"])
def test_app_errors_before_body_are_500(errsrv, path):
    r = errsrv.get(path)
    assert r.status == 500 and r.body == b"Internal Server Error\n"
    assert errsrv.alive()


def test_app_error_logged_with_traceback(errsrv):
    errsrv.get("/raise")
    assert wait_for(lambda: "app exploded before start_response" in errsrv.log())
    log = errsrv.log()
    assert "Traceback" in log and "GET /raise" in log


def test_error_after_headers_closes_connection(errsrv):
    with Conn(errsrv.port) as c:
        c.send(b"GET /raise-mid-body HTTP/1.1\r\nHost: a\r\n\r\n")
        data = c.read_until_close()
        assert data.startswith(b"HTTP/1.1 200 OK")
        assert b"first chunk" in data
        assert not data.endswith(b"0\r\n\r\n")   # no clean end: the client sees the break
    assert errsrv.get("/write").status == 200


def test_short_and_long_bodies_close(errsrv):
    with Conn(errsrv.port) as c:
        c.send(b"GET /short HTTP/1.1\r\nHost: a\r\n\r\n")
        data = c.read_until_close()
        assert data.endswith(b"only ten b")
    with Conn(errsrv.port) as c:
        c.send(b"GET /long HTTP/1.1\r\nHost: a\r\n\r\nGET /write HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.body == b"more "
        assert c.is_closed()


def test_exc_info_replaces_status_before_headers(errsrv):
    r = errsrv.get("/exc-info")
    assert r.status == 503 and r.body == b"replaced"


def test_exc_info_after_headers_reraises(errsrv):
    with Conn(errsrv.port) as c:
        c.send(b"GET /exc-info-late HTTP/1.1\r\nHost: a\r\n\r\n")
        data = c.read_until_close()
        assert data.startswith(b"HTTP/1.1 200 OK") and b"sent" in data and b"unreachable" not in data
    assert wait_for(lambda: "too late" in errsrv.log())


def test_write_callable(errsrv):
    r = errsrv.get("/write")
    assert r.body == b"written and returned"
    assert r.header("transfer-encoding") == "chunked"


@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_close_called(make_server, tmp_path, mode):
    s = make_server("apps:closing")
    mark = tmp_path / f"closed-{mode}"
    with Conn(s.port) as c:
        c.send(f"GET /?mode={mode}&mark={mark} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        if mode == "ok":
            assert c.read_response().body == b"ab"
        else:
            assert c.read_until_close().startswith(b"HTTP/1.1 200 OK")   # broken mid-body: closed
    assert wait_for(lambda: mark.exists())


def test_close_called_on_client_disconnect(make_server, tmp_path):
    s = make_server("apps:closing")
    mark = tmp_path / "closed-disconnect"
    c = Conn(s.port)
    c.send(f"GET /?mode=big&mark={mark} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    c.sock.recv(1000)
    c.sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    c.close()      # RST
    assert wait_for(lambda: mark.exists(), timeout=10)
    assert s.get("/?mark=%s" % (tmp_path / "x")).status == 200


def test_file_wrapper_sendfile(make_server, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    p = tmp_path / "blob"
    p.write_bytes(data)
    s = make_server("apps:files")
    r = s.get(f"/?path={p}")
    assert r.body == data and r.header("content-length") == str(len(data))
    r = s.get(f"/?path={p}&seek=1000")
    assert r.body == data[1000:]
    r = s.get(f"/?path={p}&len=10")
    assert r.body == data[:10]
    with Conn(s.port) as c:      # keep-alive continues after a sendfile response
        c.send(f"GET /?path={p}&len=5 HTTP/1.1\r\nHost: a\r\n\r\n".encode() * 2)
        assert c.read_response().body == data[:5]
        assert c.read_response().body == data[:5]


def test_file_wrapper_on_non_file_iterates(make_server):
    s = make_server("apps:files")
    r = s.get("/?path=/proc/self/status")       # not a regular file with a size: read() path
    assert r.status == 200 and b"Name:" in r.body


def test_date_header_cached_per_second(server):
    d1 = server.get("/").header("date")
    time.sleep(1.1)
    assert server.get("/").header("date") != d1


# ---- what frameworks do: their own Date, an empty body for HEAD ------------

def _dates(r):
    return [v for k, v in r.headers if k == "date"]


@pytest.mark.parametrize("path", ["/list", "/stream"])
def test_app_date_is_sent_instead_of_ours(make_server, path):
    from quirk_apps import APP_DATE
    s = make_server("quirk_apps:own_date")
    with Conn(s.port) as c:     # RFC 9110 6.6.1: at most one Date, the app's
        c.send(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\nHEAD {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        r = c.read_response()
        assert r.body == b"dated" and _dates(r) == [APP_DATE], r.raw_head
        assert _dates(c.read_response("HEAD")) == [APP_DATE]


def test_flask_send_file_has_one_date(make_server, tmp_path):
    pytest.importorskip("flask")
    p = tmp_path / "f.txt"
    p.write_bytes(b"file body")
    s = make_server("quirk_apps:flask_files()")
    r = s.get(f"/file?path={p}")
    assert r.status == 200 and r.body == b"file body"
    assert len(_dates(r)) == 1, r.raw_head


@pytest.mark.parametrize("app,path", [("quirk_apps:head_like_werkzeug", "/"),
                                      ("quirk_apps:head_like_werkzeug", "/iter"),
                                      ("quirk_apps:flask_files()", "/stream")])
def test_head_with_empty_body_gets_no_invented_length(make_server, app, path):
    if "flask" in app:
        pytest.importorskip("flask")
    s = make_server(app)
    with Conn(s.port) as c:
        c.send(f"HEAD {path} HTTP/1.1\r\nHost: a\r\n\r\nGET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        head = c.read_response("HEAD")
        get = c.read_response()         # kept alive: the HEAD had no body on the wire
    assert get.header("transfer-encoding") == "chunked" and get.body
    assert head.status == 200 and head.header("content-length") is None, head.raw_head
    assert head.header("transfer-encoding") is None


def test_head_of_a_list_body_keeps_the_length_the_get_gets(make_server):
    s = make_server("apps:hello")        # no Content-Length of its own, the same body for HEAD
    assert s.get("/", method="HEAD").header("content-length") == s.get("/").header("content-length") == "13"


# Around every size at which a body copied into the write buffer changes
# block: the first (4 KiB), each size class (8-128 KiB, fw_server.h), and
# past the largest; 64 KiB and more are lent rather than copied.
BOUNDARY_SIZES = sorted({n + d for n in (4096, 8192, 16384, 32768, 65536, 131072) for d in (-300, -1, 0, 1)}
                        | {1, 1000, 200000})


def test_list_bodies_across_write_buffer_sizes_arrive_whole(make_server):
    """List bodies of every size around the write buffer's block sizes,
    one and three parts, on one kept-alive connection, then all of them
    pipelined in one write: each arrives byte for byte (the write buffer
    moves to a spare block of the next size as a body is queued)."""
    from apps import sized_body
    s = make_server("apps:sized")
    paths = [f"/?n={n}&parts={k}" for n in BOUNDARY_SIZES for k in (1, 3)]
    with Conn(s.port) as c:
        for p in paths:
            c.send(f"GET {p} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            r = c.read_response()
            n = int(p.split("n=")[1].split("&")[0])
            assert r.status == 200 and r.body == sized_body(n), (p, len(r.body))
        c.send(b"".join(f"GET {p} HTTP/1.1\r\nHost: a\r\n\r\n".encode() for p in paths))
        for p in paths:
            r = c.read_response()
            n = int(p.split("n=")[1].split("&")[0])
            assert r.status == 200 and r.body == sized_body(n), (p, len(r.body))
