"""WSGI conformance through real server processes.

(a) apps under wsgiref.validate.validator: no warnings, assertions or
    tracebacks in the server log;
(b) the environ: PEP 3333 keys and types, over TCP/IPv4, IPv6 and unix sockets;
(c) a real Flask app: JSON, forms, multipart, chunked uploads, streaming;
(d) the wsgi.input API on Content-Length and chunked bodies, in memory and
    spooled to a temp file.

Note: wsgiref.validate's InputWrapper insists on read(size) with exactly one
argument, so the validated apps read with a size.
"""
import io
import json
import os
import re
import shutil
import socket
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ServerProc, mode_env
from apps import RELEASED
from httpraw import Conn, asleep, wait_for

LOG_MARKERS = ("WSGIWarning", "AssertionError", "Traceback")


def chunked(data, sizes=(1, 7, 100, 4096, 65536)):
    """data as a chunked body, with chunk sizes cycling through `sizes`."""
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        out.append(b"%x\r\n" % len(data[pos:pos + n]) + data[pos:pos + n] + b"\r\n")
        pos += n
        i += 1
    out.append(b"0\r\n\r\n")
    return b"".join(out)


def post(path, body, *, te=False, ctype=None, version="HTTP/1.1", extra=b""):
    head = f"POST {path} {version}\r\nHost: t\r\n".encode()
    if ctype:
        head += f"Content-Type: {ctype}\r\n".encode()
    head += extra
    if te:
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def assert_clean_log(s, released=0):
    """No warning, assertion or traceback in the server's log, once the
    server is done with its requests: `released` responses of a validated
    app let go of (the validator checks at their garbage collection that
    close() was called), and its workers asleep (nothing left to log)."""
    wait_for(lambda: s.log().count(RELEASED) >= released, 20)
    wait_for(lambda: all(asleep(p) for p in s.worker_pids()), 20)
    log = s.log()
    bad = [m for m in LOG_MARKERS if m in log]
    assert not bad, f"{bad} in the server log:\n{log}"


# ---- (a) wsgiref.validate ---------------------------------------------------

VALIDATED_REQUESTS = [
    ("GET", b"GET /v?a=1 HTTP/1.1\r\nHost: t\r\n\r\n"),
    ("HEAD", b"HEAD /v HTTP/1.1\r\nHost: t\r\n\r\n"),
    ("POST-cl", post("/v", b"hello validator")),
    ("POST-cl-empty", post("/v", b"")),
    ("POST-chunked", post("/v", b"x" * 70000, te=True)),
    ("GET-1.0", b"GET /v HTTP/1.0\r\n\r\n"),
    ("DELETE", b"DELETE /v/1 HTTP/1.1\r\nHost: t\r\nContent-Type: text/plain\r\n\r\n"),
]


def _validated_checks(name, r, echo):
    assert r.status == 200, (name, r.status, r.body)
    if name == "HEAD":
        assert r.body == b""
        return
    if not echo:
        sent = {"POST-cl": 15, "POST-chunked": 70000}.get(name, 0)
        assert r.body == b"validated %d" % sent
        return
    d = json.loads(r.body)
    assert d["method"] == name.split("-")[0]
    if name == "POST-cl":
        assert d["body"] == "hello validator"
    if name == "POST-chunked":
        assert d["body"] == "x" * 70000


@pytest.mark.parametrize("app", ["apps:validated()", "apps:validated_echo()"])
def test_validator_separate_connections(make_server, app):
    s = make_server(app)
    for name, raw in VALIDATED_REQUESTS:
        with Conn(s.port) as c:
            c.send(raw)
            _validated_checks(name, c.read_response("HEAD" if name == "HEAD" else "GET"), "echo" in app)
    assert_clean_log(s, released=len(VALIDATED_REQUESTS))


@pytest.mark.parametrize("app", ["apps:validated()", "apps:validated_echo()"])
def test_validator_keepalive_reuse(make_server, app):
    s = make_server(app)
    served = 0
    with Conn(s.port) as c:
        for _ in range(2):
            for name, raw in VALIDATED_REQUESTS:
                if name == "GET-1.0":
                    continue            # would end the connection
                c.send(raw)
                r = c.read_response("HEAD" if name == "HEAD" else "GET")
                _validated_checks(name, r, "echo" in app)
                assert (r.header("connection") or "").lower() != "close"
                served += 1
        assert not c.is_closed(0.2)
    assert_clean_log(s, released=served)


@pytest.mark.parametrize("app", ["apps:validated()", "apps:validated_echo()"])
def test_validator_pipelined(make_server, app):
    s = make_server(app)
    reqs = [(n, raw) for n, raw in VALIDATED_REQUESTS if n != "GET-1.0"]
    with Conn(s.port) as c:
        c.send(b"".join(raw for _, raw in reqs))
        for name, _ in reqs:
            _validated_checks(name, c.read_response("HEAD" if name == "HEAD" else "GET"), "echo" in app)
    assert_clean_log(s, released=len(reqs))


# ---- (b) the environ ----------------------------------------------------------

CGI_KEYS = {"REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "RAW_URI", "SERVER_PROTOCOL",
            "SERVER_NAME", "SERVER_PORT", "REMOTE_ADDR", "REMOTE_PORT", "CONTENT_TYPE", "CONTENT_LENGTH",
            "SERVER_SOFTWARE"}
CANARY = "FORKWSGI_TEST_CANARY"


def echo_over(conn, raw):
    conn.send(raw)
    r = conn.read_response()
    assert r.status == 200, (r.status, r.body)
    return json.loads(r.body)


def check_common_environ(d, app_mode):
    assert d["version"] == [1, 0]
    assert d["multithread"] is (app_mode == "threads")     # FORKWSGI_THREADS=3 in that mode
    assert d["multiprocess"] is False          # one process serves everything
    assert d["run_once"] is False
    assert d["input_terminated"] is True
    assert d["script_name"] == ""
    assert d["has_os_environ_keys"] is False
    assert d["server_software"].startswith("forkwsgi/")     # as gunicorn's "gunicorn/VERSION"
    for k, t in d["types"].items():
        assert t == "str", (k, t)
    for k in d["types"]:
        assert k in CGI_KEYS or k.startswith("HTTP_"), f"unexpected environ key {k!r}"
    for k in ("REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL",
              "SERVER_NAME", "SERVER_PORT", "REMOTE_ADDR", "REMOTE_PORT"):
        assert k in d["types"], f"{k} missing"


@pytest.mark.parametrize("version", ["HTTP/1.1", "HTTP/1.0"])
def test_environ_tcp_ipv4(server, version, app_mode):
    with Conn(server.port) as c:
        d = echo_over(c, f"POST /p%20q?x=%20 {version}\r\nHost: example.org:8080\r\nContent-Type: text/x\r\n"
                         f"Content-Length: 2\r\n\r\nab".encode())
        client_port = c.sock.getsockname()[1]
    check_common_environ(d, app_mode)
    assert d["url_scheme"] == "http"
    assert d["protocol"] == version
    # SERVER_NAME/PORT: the listening address (Host goes to HTTP_HOST only)
    assert d["server_name"] == "127.0.0.1"
    assert d["server_port"] == str(server.port)
    assert d["remote_addr"] == "127.0.0.1"
    assert d["remote_port"] == str(client_port)
    assert d["path"] == "/p q" and d["query"] == "x=%20" and d["raw_uri"] == "/p%20q?x=%20"
    assert d["headers"] == {"HTTP_HOST": "example.org:8080", "CONTENT_TYPE": "text/x", "CONTENT_LENGTH": "2"}
    # no CONTENT_* when the request has none
    with Conn(server.port) as c:
        d = echo_over(c, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert "CONTENT_LENGTH" not in d["types"] and "CONTENT_TYPE" not in d["types"]
    check_common_environ(d, app_mode)


def test_environ_no_os_environ_leak(make_server, app_mode):
    s = make_server("apps:echo", env={CANARY: "leaked", "SERVER_SOFTWARE_CANARY": "x"})
    with Conn(s.port) as c:
        d = echo_over(c, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    check_common_environ(d, app_mode)
    server_env = set(os.environ) | {CANARY, "SERVER_SOFTWARE_CANARY", "PYTHONPATH", "PYTHONUNBUFFERED"}
    leaked = (set(d["types"]) & server_env) - CGI_KEYS
    assert not leaked, leaked


def test_environ_url_scheme_option(make_server):
    s = make_server("apps:echo", "--url-scheme", "https")
    with Conn(s.port) as c:
        assert echo_over(c, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")["url_scheme"] == "https"


def _ipv6_available():
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^`|~"


def _env_key(name):
    if name.lower() in ("content-type", "content-length"):
        return name.upper().replace("-", "_")
    return "HTTP_" + name.upper().replace("-", "_")


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.text(_NAME_CHARS, min_size=1, max_size=70), min_size=1, max_size=12))
def test_header_names_map_to_their_keys_request_after_request(server, names):
    """The environ keys of header names come from a cache kept from one
    request to the next (src/strcache.c: it compares the name's bytes, kept
    beside the key). Names of every length up to past the cache's bound, in
    mixed case, the same name cased two ways, sent on one connection
    request after request: each key is the name's PEP 3333 key, never a
    neighbour's."""
    names = [n for n in names if n.lower() not in ("content-length", "content-type", "host", "transfer-encoding",
                                                   "connection", "expect", "upgrade", "te", "trailer")]
    names += [n.swapcase() for n in names[:2]]
    with Conn(server.port) as c:
        for round_ in range(2):
            for i, name in enumerate(names):
                d = echo_over(c, f"GET / HTTP/1.1\r\nHost: a\r\n{name}: v{i}\r\n\r\n".encode())
                got = {k: v for k, v in d["headers"].items() if k != "HTTP_HOST"}
                assert got == {_env_key(name): f"v{i}"}, (name, got)


@pytest.mark.skipif(not _ipv6_available(), reason="no IPv6 loopback on this machine")
def test_environ_ipv6(make_server, app_mode):
    s = make_server("apps:echo", bind=["[::1]:0"])
    # conftest's port regex reads "http://[::1]:33415" as port 1 (its lazy
    # host part stops at the first "::"): take the port from the log here.
    m = re.search(r"Listening at: http://\[::1\]:(\d+)", s.log())
    assert m, s.log()
    s.port = int(m.group(1))
    with Conn(s.port, host="::1") as c:
        d = echo_over(c, b"GET /six HTTP/1.1\r\nHost: [::1]\r\n\r\n")
        client_port = c.sock.getsockname()[1]
    check_common_environ(d, app_mode)
    assert d["remote_addr"] == "::1"
    assert d["remote_port"] == str(client_port)
    assert d["server_name"] == "::1"
    assert d["server_port"] == str(s.port)
    assert d["headers"]["HTTP_HOST"] == "[::1]"


@pytest.fixture
def sockdir():
    d = tempfile.mkdtemp(prefix="fw", dir="/tmp")     # short: sun_path holds 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_environ_unix_socket(sockdir, make_server, app_mode):     # servers stop before sockdir goes
    path = os.path.join(sockdir, "s.sock")
    s = make_server("apps:echo", bind=[f"unix:{path}"])
    assert s.unix_path == path
    with Conn(None, path=path) as c:
        d = echo_over(c, b"POST /u HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc")
        d2 = echo_over(c, b"GET /again HTTP/1.1\r\nHost: localhost\r\n\r\n")      # kept alive
    check_common_environ(d, app_mode)
    assert d["body"] == "abc" and d2["path"] == "/again"
    assert d["server_name"] == path
    assert d["server_port"] == ""
    assert d["remote_addr"] == ""          # an unbound client socket has no address
    assert d["remote_port"] == ""
    # a client that bound its socket to a path is known by that path
    cpath = os.path.join(sockdir, "c.sock")
    with BoundUnixConn(path, cpath) as c:
        d = echo_over(c, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    check_common_environ(d, app_mode)
    assert d["remote_addr"] == cpath


class BoundUnixConn(Conn):
    """A unix-socket client whose own socket is bound to a path."""

    def __init__(self, path, own_path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.bind(own_path)
        self.sock.connect(path)
        self.buf = b""


# ---- (c) Flask ------------------------------------------------------------------

@pytest.fixture(scope="module")
def flask_server(app_mode):
    pytest.importorskip("flask")
    s = ServerProc("apps:flask_app()", env=mode_env(app_mode))
    yield s
    s.stop()


def _multipart(fields, files, boundary="----forkwsgiBoundary7MA4YWxk"):
    out = []
    for k, v in fields.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode())
    for k, (fname, data) in files.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{fname}"\r\n'
                   f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


BIG = bytes(range(256)) * (5 * 4096)          # 5 MiB


def flask_cases():
    payload = {"a": [1, 2, {"b": "é ü"}], "n": None, "s": "x" * 1000}
    mp_body, mp_type = _multipart({"field": "value", "other": "two words"},
                                  {"upload": ("notes.txt", b"line 1\nline 2\n" * 100)})
    return [
        ("json", post("/json", json.dumps(payload).encode(), ctype="application/json"),
         lambda r: r.status == 200 and r.json == {"received": payload, "n": len(payload)}),
        ("json-chunked", post("/json", json.dumps(payload).encode(), ctype="application/json", te=True),
         lambda r: r.status == 200 and r.json == {"received": payload, "n": len(payload)}),
        ("form", post("/form", b"a=1&b=hello+world&c=%C3%A9&d=", ctype="application/x-www-form-urlencoded"),
         lambda r: r.status == 200 and r.json == {"form": {"a": "1", "b": "hello world", "c": "é", "d": ""},
                                                  "files": {}}),
        ("multipart", post("/form", mp_body, ctype=mp_type),
         lambda r: r.status == 200 and r.json == {"form": {"field": "value", "other": "two words"},
                                                  "files": {"upload": "line 1\nline 2\n" * 100}}),
        ("multipart-chunked", post("/form", mp_body, ctype=mp_type, te=True),
         lambda r: r.status == 200 and r.json["files"] == {"upload": "line 1\nline 2\n" * 100}),
        ("upload-chunked-5MiB", post("/upload", BIG, ctype="application/octet-stream", te=True),
         lambda r: r.status == 200 and r.json == {"length": len(BIG), "head": BIG[:20].decode("latin-1")}),
        ("upload-cl-5MiB", post("/upload", BIG, ctype="application/octet-stream"),
         lambda r: r.status == 200 and r.json == {"length": len(BIG), "head": BIG[:20].decode("latin-1")}),
        ("stream", b"GET /stream?n=200 HTTP/1.1\r\nHost: t\r\n\r\n",
         lambda r: r.status == 200 and (r.header("transfer-encoding") or "").lower() == "chunked"
         and r.header("content-length") is None
         and r.body == "".join(f"part {i}\n" for i in range(200)).encode()),
        ("hello-utf8-path", b"GET /hello/w%C3%B6rld HTTP/1.1\r\nHost: t\r\n\r\n",
         lambda r: r.status == 200 and r.body.decode() == "hi wörld"),
        ("404", b"GET /no/such/page HTTP/1.1\r\nHost: t\r\n\r\n", lambda r: r.status == 404),
        ("405", b"GET /json HTTP/1.1\r\nHost: t\r\n\r\n", lambda r: r.status == 405),
    ]


def _flask_read(c):
    r = c.read_response()
    try:
        r.json = json.loads(r.body)
    except ValueError:
        r.json = None
    return r


@pytest.mark.parametrize("name", [c[0] for c in flask_cases()])
def test_flask(flask_server, name):
    raw, ok = {c[0]: c[1:] for c in flask_cases()}[name]
    with Conn(flask_server.port, timeout=30) as c:
        c.send(raw)
        r = _flask_read(c)
        assert ok(r), (r.status, r.headers, r.body[:500])


def test_flask_stream_http10_is_close_delimited(flask_server):
    with Conn(flask_server.port) as c:
        c.send(b"GET /stream?n=20 HTTP/1.0\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.header("transfer-encoding") is None
        assert r.body == "".join(f"part {i}\n" for i in range(20)).encode()


@pytest.mark.parametrize("te", [False, True], ids=["cl", "chunked"])
def test_flask_upload_expect_continue(flask_server, te):
    """As curl sends large uploads: the body follows "100 Continue"."""
    head = b"POST /upload HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Type: application/octet-stream\r\n"
    if te:
        head, wire = head + b"Transfer-Encoding: chunked\r\n\r\n", chunked(BIG)
    else:
        head, wire = head + b"Content-Length: %d\r\n\r\n" % len(BIG), BIG
    with Conn(flask_server.port, timeout=30) as c:
        c.send(head)
        assert c.read_response().status == 100
        c.send(wire)
        r = _flask_read(c)
        assert r.status == 200 and r.json == {"length": len(BIG), "head": BIG[:20].decode("latin-1")}
        c.send(b"GET /hello/again HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == b"hi again"


def test_flask_keepalive_reuse(flask_server):
    cases = flask_cases()
    with Conn(flask_server.port, timeout=30) as c:
        for _ in range(2):
            for name, raw, ok in cases:
                c.send(raw)
                r = _flask_read(c)
                assert ok(r), (name, r.status, r.headers, r.body[:500])
                assert (r.header("connection") or "").lower() != "close", name
        assert not c.is_closed(0.2)


def test_flask_log_clean(flask_server):
    # runs after the other Flask tests in this module
    with Conn(flask_server.port) as c:
        c.send(b"GET /hello/x HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200
    assert_clean_log(flask_server)


# ---- (d) wsgi.input --------------------------------------------------------------

def _lines(total, seed, long_every=0):
    """About `total` bytes of lines of pseudo-random lengths; every
    `long_every`-th line is longer than the spool file's 64 KiB window."""
    out, i, n = [], 0, 0
    x = seed
    while n < total:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        ln = 70_000 + x % 90_000 if long_every and i % long_every == long_every - 1 else x % 300
        line = bytes((33 + (x + k) % 90) for k in range(ln)) + (b"\r\n" if i % 7 == 3 else b"\n")
        out.append(line)
        n += len(line)
        i += 1
    return b"".join(out)


BODIES = {
    "empty": b"",
    "one-byte": b"x",
    "no-newline": b"abcdefgh",
    "lines": b"first line\nsecond\n\nfourth, after an empty one\nlast without newline",
    "crlf-binary": b"a\r\nb\r\n\x00\xff\xfe\n\n\n" + bytes(range(256)),
    "newline-only": b"\n",
    "small-many-lines": _lines(30_000, 7),
    "long-lines-300k": _lines(300_000, 11, long_every=3),
    "big-1.3MiB": _lines(1_300_000, 3, long_every=9),
    "big-no-final-newline": _lines(1_200_000, 5, long_every=4) + b"tail without a newline",
}
SPOOL_THRESHOLD = 1000


def emulate_input_api(body):
    b = io.BytesIO(body)
    return {
        "read3": b.read(3).decode("latin-1"),
        "readline": b.readline().decode("latin-1"),
        "readline2": b.readline(2).decode("latin-1"),
        "readlines": [x.decode("latin-1") for x in b.readlines()],
        "after": b.read().decode("latin-1"),
        "read0": b.read(0).decode("latin-1"),
    }


def _digest(b):
    import hashlib
    return [len(b), hashlib.sha256(b).hexdigest()[:16]]


def emulate_ops(ops, body):
    """What apps:input_ops must answer, computed on an io.BytesIO."""
    b = io.BytesIO(body)
    out = []
    for op in ops.split(","):
        name, _, arg = op.partition(":")
        n = int(arg) if arg else None
        if name == "read":
            out.append(_digest(b.read() if n is None else b.read(n)))
        elif name == "readline":
            out.append(_digest(b.readline() if n is None else b.readline(n)))
        elif name == "readlines":
            out.append([_digest(x) for x in b.readlines()])
        elif name == "iter":
            out.append([_digest(x) for x in b])
        elif name == "next":
            line = b.readline()
            out.append(_digest(line) if line else None)
        elif name == "chunks":
            parts = []
            while True:
                x = b.read(n)
                if not x:
                    break
                parts.append(_digest(x))
            out.append(parts)
    return out


OPS = [
    "read:3,readline,readline:2,readlines,read:0,read",
    "iter",
    "next,next,read:10,iter,next",
    "readline:5,readline:5,readline:100000,readline,readline:0,readline:-1,read:-1,read,readline",
    "read:70000,readline,read:1,readline:65537,readline:65536,read:0,iter",
    "chunks:65536",
    "chunks:100001",
    "read:0,read:1,read:65535,read:65536,read:65537,read:1000000,read:2000000,read",
]


@pytest.fixture(scope="module")
def input_servers(app_mode):
    env = mode_env(app_mode)
    servers = {
        ("api", "default"): ServerProc("apps:input_api", env=env),
        ("api", "spool"): ServerProc("apps:input_api", "--spool-threshold", str(SPOOL_THRESHOLD), env=env),
        ("ops", "default"): ServerProc("apps:input_ops", env=env),
        ("ops", "spool"): ServerProc("apps:input_ops", "--spool-threshold", str(SPOOL_THRESHOLD), env=env),
    }
    yield servers
    for s in servers.values():
        s.stop()


def _send(port, raw, expect_continue_body=None):
    with Conn(port, timeout=30) as c:
        c.send(raw)
        if expect_continue_body is not None:
            r = c.read_response()
            assert r.status == 100, (r.status, r.body)
            # the body in uneven pieces: the app reads live from the socket
            for i in range(0, len(expect_continue_body), 50_000):
                c.send(expect_continue_body[i:i + 50_000])
        r = c.read_response()
        assert r.status == 200, (r.status, r.body[:500])
        return json.loads(r.body)


def _framings(body):
    yield "cl", post("/", body)
    yield "chunked", post("/", body, te=True)


@pytest.mark.parametrize("body_name", list(BODIES))
def test_input_api(input_servers, body_name):
    body = BODIES[body_name]
    expected = emulate_input_api(body)
    results = {}
    for framing, raw in _framings(body):
        for mode in ("default", "spool"):
            got = _send(input_servers["api", mode].port, raw)
            assert got == expected, f"{framing} body, {mode} server: differs from io.BytesIO"
            results[framing, mode] = got
    assert len({json.dumps(v, sort_keys=True) for v in results.values()}) == 1


@pytest.mark.parametrize("ops", OPS)
@pytest.mark.parametrize("body_name", ["lines", "crlf-binary", "empty", "small-many-lines",
                                       "long-lines-300k", "big-1.3MiB", "big-no-final-newline"])
def test_input_ops(input_servers, body_name, ops):
    body = BODIES[body_name]
    expected = emulate_ops(ops, body)
    for framing, raw in _framings(body):
        for mode in ("default", "spool"):
            got = _send(input_servers["ops", mode].port, post("/?ops=" + ops, body, te=framing == "chunked"))
            assert got == expected, f"ops {ops!r} on {framing} body, {mode} server: differs from io.BytesIO"


@pytest.mark.parametrize("ops", OPS[:5])
@pytest.mark.parametrize("body_name", ["lines", "long-lines-300k", "big-no-final-newline"])
@pytest.mark.parametrize("te", [False, True], ids=["cl", "chunked"])
def test_input_ops_live_expect_continue(input_servers, body_name, ops, te):
    """With Expect: 100-continue the body is read from the socket as the app
    asks for it: same answers."""
    body = BODIES[body_name]
    head = f"POST /?ops={ops} HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n".encode()
    if te:
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        wire = chunked(body, sizes=(3, 40_000, 70_000, 1))
    else:
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        wire = body
    got = _send(input_servers["ops", "default"].port, head, expect_continue_body=wire)
    assert got == emulate_ops(ops, body)


@pytest.mark.parametrize("framing", ["cl", "chunked", "expect-cl", "expect-chunked"])
def test_input_stops_at_body_end_when_pipelined(input_servers, framing):
    """Reading more than the body never reaches into the next request."""
    body = b"line one\nline two\n"
    ops = "read:1000000,readline,read,next,iter"
    extra = b"Expect: 100-continue\r\n" if framing.startswith("expect") else b""
    first = post("/?ops=" + ops, body, te=framing.endswith("chunked"), extra=extra)
    second = post("/?ops=read", b"SECOND BODY")
    for mode in ("default", "spool"):
        with Conn(input_servers["ops", mode].port) as c:
            c.send(first + second + b"GET /?ops=read HTTP/1.1\r\nHost: t\r\n\r\n")
            answers = [c.read_response() for _ in range(3)]
        assert [a.status for a in answers] == [200, 200, 200], answers
        assert json.loads(answers[0].body) == emulate_ops(ops, body)
        assert json.loads(answers[1].body) == emulate_ops("read", b"SECOND BODY")
        assert json.loads(answers[2].body) == emulate_ops("read", b"")


op_sizes = st.one_of(st.sampled_from([0, 1, 2, 3, 100, 4095, 4096, 65535, 65536, 65537, 1 << 20]),
                     st.integers(1, 300_000))
input_op = st.one_of(
    st.just("read"), st.just("readline"), st.just("next"),
    op_sizes.map(lambda n: f"read:{n}"), op_sizes.map(lambda n: f"readline:{n}"),
)
input_ops_lists = st.tuples(st.lists(input_op, min_size=1, max_size=8),
                            st.sampled_from(["", "read", "iter", "readlines"])).map(
    lambda t: ",".join(t[0] + ([t[1]] if t[1] else [])))
line_pieces = st.one_of(st.binary(max_size=200), st.sampled_from([b"\n", b"\r\n", b"\n\n"]),
                        st.integers(1, 150_000).map(lambda n: b"L" * n))
input_bodies = st.lists(line_pieces, max_size=30).map(b"".join)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(body=input_bodies, ops=input_ops_lists, te=st.booleans(),
       sizes=st.lists(st.integers(1, 100_000), min_size=1, max_size=4))
def test_input_ops_random(input_servers, body, ops, te, sizes):
    """Random read/readline/next/iteration sequences equal io.BytesIO's, in
    memory and spooled, for Content-Length and chunked bodies."""
    expected = emulate_ops(ops, body)
    head = f"POST /?ops={ops} HTTP/1.1\r\nHost: t\r\n".encode()
    raw = (head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, sizes) if te
           else head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    for mode in ("default", "spool"):
        got = _send(input_servers["ops", mode].port, raw)
        assert got == expected, f"ops {ops!r}, {'chunked' if te else 'CL'} body of {len(body)} bytes, {mode} server"


def test_input_servers_log_clean(input_servers):
    for s in input_servers.values():
        assert_clean_log(s)


def test_server_header_software_and_thread_names(make_server, app_mode):
    """Issue 25, item 12: no Server header, no SERVER_SOFTWARE, and app
    threads named "Dummy-N" in log records. Now: "Server: forkwsgi" unless
    the app sends its own, SERVER_SOFTWARE "forkwsgi/VERSION" (gunicorn's
    "gunicorn/VERSION"), and app threads named after their worker."""
    # With app threads, requests run on them (--inline-first off; on, a
    # quick one runs on the worker's main thread: test_inline_first.py).
    s = make_server("apps:thread_name", "--workers", "2", "--inline-first", "off")
    with Conn(s.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.header("server") == "forkwsgi"
        if app_mode == "threads":
            assert re.fullmatch(r"forkwsgi worker [12] thread [123]", r.body.decode()), r.body
        else:
            assert r.body == b"MainThread"          # inline: the worker's own thread
        c.send(b"GET /?server=mine HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().headers.count(("server", "mine")) == 1
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n")
        bad = c.read_response()
        assert bad.status == 400 and bad.header("server") == "forkwsgi"
