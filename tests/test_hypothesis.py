"""Property tests: random VALID requests against the real echo server.

Hypothesis builds requests (method, origin-form target with percent-escapes
and a query, header fields with optional whitespace around the value,
HTTP/1.0 or 1.1, bodies framed by Content-Length or chunked with random chunk
sizes, chunk extensions and trailers). The test computes what the server must
hand the app, independently of the server's code:

  method, raw_uri          exactly as sent
  path                     the target's path, percent-decoded once (bytes ->
                           latin-1, an invalid escape stays literal)
  query                    the raw text after the first '?'
  headers                  HTTP_<NAME> / CONTENT_TYPE / CONTENT_LENGTH, the
                           value without surrounding whitespace, repeated
                           fields (same name after mapping) joined by ", "
  body                     the de-chunked body

and checks it against what apps:echo reports, whether the bytes arrive in one
piece, split into several sends, pipelined, or on a reused connection.
"""
import json
import os
import socket
import string
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import ServerProc, mode_env
from httpraw import Conn

SETTINGS = settings(
    # FORKWSGI_HYPOTHESIS_EXAMPLES=2000 for a deeper run
    max_examples=int(os.environ.get("FORKWSGI_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)
PAUSE = 0.002           # between split sends: long enough to be separate reads

# ---- character classes (RFC 9110 / RFC 3986) -------------------------------

TCHAR = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
TCHAR_NO_US = TCHAR.replace("_", "")
VCHAR = "".join(chr(c) for c in range(0x21, 0x7F))
UNRESERVED = string.ascii_letters + string.digits + "-._~"
PCHAR = UNRESERVED + "!$&'()*+,;=:@"
HOSTCHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;="
HEX = "0123456789abcdefABCDEF"
# Names whose fields change framing or connection handling: set by the
# request model itself, never as random fields.
RESERVED = {"host", "content-length", "transfer-encoding", "connection", "expect"}
COMMON_NAMES = ["Accept", "accept", "ACCEPT", "User-Agent", "user-agent", "Cookie", "Referer",
                "X-Forwarded-For", "x-forwarded-for", "Content-Type", "content-type",
                "Cache-Control", "Authorization", "If-None-Match", "Sec-Fetch-Mode",
                "Upgrade-Insecure-Requests", "X-Dup", "x-dup", "X-DUP", "Keep-Alive", "TE",
                "Trailer", "Upgrade", "X-Request-Id"]


def environ_key(name):
    low = name.lower()
    if low == "content-type":
        return "CONTENT_TYPE"
    if low == "content-length":
        return "CONTENT_LENGTH"
    return "HTTP_" + name.upper().replace("-", "_")


# ---- the request model -----------------------------------------------------

@dataclass
class Req:
    method: str
    path: str
    query: object              # None: no '?' at all
    version: str
    fields: list               # [(name, ows_before, value, ows_after)] in wire order
    framing: str               # "none", "cl" or "chunked"
    body: bytes = b""
    chunk_lines: list = field(default_factory=list)    # [(size line, data)]
    last_chunk: str = "0"
    trailers: list = field(default_factory=list)        # ["Name: value"]

    @property
    def target(self):
        return self.path if self.query is None else self.path + "?" + self.query

    def encode(self):
        lines = [f"{self.method} {self.target} {self.version}"]
        lines += [f"{n}:{a}{v}{b}" for n, a, v, b in self.fields]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self.framing != "chunked":
            return head + self.body
        out = [head]
        for size_line, data in self.chunk_lines:
            out += [size_line.encode("latin-1"), b"\r\n", data, b"\r\n"]
        out.append(self.last_chunk.encode("latin-1") + b"\r\n")
        out += [t.encode("latin-1") + b"\r\n" for t in self.trailers]
        out.append(b"\r\n")
        return b"".join(out)

    def expected(self):
        headers = {}
        for n, _, v, _ in self.fields:
            k = environ_key(n)
            headers[k] = headers[k] + ", " + v if k in headers else v
        return {
            "method": self.method,
            "raw_uri": self.target,
            "path": unquote_to_bytes(self.path).decode("latin-1"),
            "query": self.query or "",
            "protocol": self.version,
            "headers": headers,
            "body": self.body.decode("latin-1"),
        }

    def with_connection(self, value):
        """A copy with a Connection field (replacing any)."""
        fields = [f for f in self.fields if f[0].lower() != "connection"]
        fields.append(("Connection", " ", value, ""))
        return Req(self.method, self.path, self.query, self.version, fields, self.framing,
                   self.body, self.chunk_lines, self.last_chunk, self.trailers)

    @property
    def keeps_alive(self):
        conn = [v.lower() for n, _, v, _ in self.fields if n.lower() == "connection"]
        if self.version == "HTTP/1.1":
            return "close" not in conn
        return "keep-alive" in conn


# ---- strategies ------------------------------------------------------------

methods = st.one_of(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    # any token but HEAD (no body in the answer) and CONNECT (authority-form only)
    st.text(TCHAR, min_size=1, max_size=12).filter(lambda m: m not in ("HEAD", "CONNECT")),
)
pct_escape = st.text(HEX, min_size=2, max_size=2).map(lambda h: "%" + h)
path_piece = st.one_of(
    st.text(PCHAR, min_size=1, max_size=8),
    pct_escape,
    st.sampled_from(["%", "%4", "%g1", "%%41", "%2F", "%2f", "%25", "%00", "%C3%A9", "%ff"]),
)
segment = st.lists(path_piece, max_size=4).map("".join)
paths = st.lists(segment, min_size=1, max_size=6).map(lambda segs: "/" + "/".join(segs))
query_piece = st.one_of(st.text(PCHAR + "/?", min_size=1, max_size=10), pct_escape,
                        st.sampled_from(["%", "a=1", "&", "=", "b=%20c"]))
queries = st.one_of(st.none(), st.lists(query_piece, max_size=5).map("".join))
header_names = st.one_of(st.sampled_from(COMMON_NAMES),
                         st.text(TCHAR_NO_US, min_size=1, max_size=16)).filter(
    lambda n: n.lower() not in RESERVED)
OBS_TEXT = "".join(chr(c) for c in range(0x80, 0x100))   # latin-1 in, latin-1 out
header_values = st.one_of(
    st.text(VCHAR + " \t", max_size=40),
    st.text(VCHAR + " \t" + OBS_TEXT, max_size=20),
).map(lambda v: v.strip(" \t"))
ows = st.sampled_from(["", "", " ", "  ", "\t", " \t "])
random_fields = st.lists(st.tuples(header_names, ows, header_values, ows), max_size=10)
# A Host value is an authority (RFC 9112 3.2): empty, or a reg-name with an
# optional port (of at most 5 digits up to 65535; empty allowed).
hosts = st.one_of(st.just(""), st.tuples(st.text(HOSTCHARS, min_size=1, max_size=20),
                                         st.one_of(st.just(""), st.just(":"),
                                                   st.integers(0, 65535).map(lambda p: f":{p}")))
                  .map("".join))
host_fields = st.tuples(st.sampled_from(["Host", "host", "HOST", "hOsT"]), ows, hosts, ows)
PATTERN = bytes(range(256)) * 1200
bodies = st.one_of(
    st.binary(max_size=2000),
    st.text(string.printable, max_size=500).map(str.encode),
    # now and then one larger than a socket read / the connection's buffer
    st.tuples(st.integers(16_000, 300_000), st.integers(0, 255)).map(lambda t: PATTERN[t[1]:t[1] + t[0]]),
)


def hex_size(draw, n):
    h = "%x" % n
    h = draw(st.sampled_from([h, h.upper()]))
    zeros = draw(st.integers(0, min(3, 16 - len(h))))
    return "0" * zeros + h


QDTEXT = "".join(c for c in VCHAR if c not in '"\\') + " \t"
quoted = st.lists(st.one_of(st.text(QDTEXT, min_size=1, max_size=6),
                            st.sampled_from(VCHAR + " \t").map(lambda c: "\\" + c)),   # quoted-pair
                  max_size=4).map(lambda parts: '"' + "".join(parts) + '"')
token = st.text(TCHAR, min_size=1, max_size=6)
bws = st.sampled_from(["", "", "", " ", "\t"])


@st.composite
def chunk_ext(draw):
    exts = draw(st.lists(st.tuples(bws, bws, token, st.one_of(st.none(), st.tuples(bws, bws, st.one_of(token, quoted)))),
                         max_size=2))
    out = ""
    for b1, b2, name, val in exts:
        out += f"{b1};{b2}{name}"
        if val is not None:
            out += f"{val[0]}={val[1]}{val[2]}"
    return out


@st.composite
def requests(draw, version=None):
    version = version or draw(st.sampled_from(["HTTP/1.0", "HTTP/1.1"]))
    fields = list(draw(random_fields))
    if version == "HTTP/1.1" or draw(st.booleans()):
        fields.insert(draw(st.integers(0, len(fields))), draw(host_fields))
    framing = draw(st.sampled_from(["none", "cl", "chunked"] if version == "HTTP/1.1" else ["none", "cl"]))
    req = Req(draw(methods), draw(paths), draw(queries), version, fields, framing)
    if framing == "none":
        return req
    req.body = draw(bodies)
    if framing == "cl":
        cl = str(len(req.body))
        if draw(st.integers(0, 4)) == 0:
            cl = "00" + cl          # 1*DIGIT: leading zeros are a valid length
        fields.insert(draw(st.integers(0, len(fields))),
                      (draw(st.sampled_from(["Content-Length", "content-length"])), draw(ows), cl, draw(ows)))
        return req
    te = draw(st.sampled_from(["chunked", "Chunked", "CHUNKED"]))
    fields.insert(draw(st.integers(0, len(fields))),
                  (draw(st.sampled_from(["Transfer-Encoding", "transfer-encoding"])), draw(ows), te, draw(ows)))
    pos = 0
    while pos < len(req.body):
        n = draw(st.integers(1, max(1, len(req.body) - pos)))
        if draw(st.booleans()):
            n = min(n, draw(st.integers(1, 40)))
        req.chunk_lines.append((hex_size(draw, n) + draw(chunk_ext()), req.body[pos:pos + n]))
        pos += n
    req.last_chunk = "0" * draw(st.integers(1, 3)) + draw(chunk_ext())
    req.trailers = [f"{n}:{a}{v}{b}" for n, a, v, b in
                    draw(st.lists(st.tuples(header_names, ows, header_values, ows), max_size=3))]
    return req


@st.composite
def split_points(draw, length, max_splits=8):
    if length < 2:
        return []
    return sorted(set(draw(st.lists(st.integers(1, length - 1), max_size=max_splits))))


# ---- wire helpers ----------------------------------------------------------

def connect(server):
    c = Conn(server.port, timeout=10)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def send_split(c, data, points):
    """data in pieces cut at `points`, PAUSE between them (none after the
    last: nothing follows it to be read apart)."""
    last = 0
    for p in list(points) + [len(data)]:
        if p > last:
            if last:
                time.sleep(PAUSE)
            c.send(data[last:p])
            last = p


def show(data, limit=3000):
    if len(data) <= limit:
        return repr(data)
    return f"{data[:limit]!r}... ({len(data)} bytes in all)"


def parsed(resp, data):
    assert resp.status == 200, f"answered {resp.status} {resp.body[:300]!r} to {show(data)}"
    d = json.loads(resp.body)
    return {k: d[k] for k in ("method", "raw_uri", "path", "query", "protocol", "headers", "body")}


def one(server, data, points=()):
    with connect(server) as c:
        send_split(c, data, points)
        return parsed(c.read_response(), data)


def check_connection_header(resp, req, data):
    """A 1.0 client only keeps the connection when told so; a 1.1 client
    that asked to close is told the connection closes."""
    conn = (resp.header("connection") or "").lower()
    if req.version == "HTTP/1.0" and req.keeps_alive:
        assert "keep-alive" in conn, f"HTTP/1.0 keep-alive not confirmed ({resp.headers}): {show(data)}"
    if req.version == "HTTP/1.1" and not req.keeps_alive:
        assert "close" in conn, f"close not confirmed ({resp.headers}): {show(data)}"


def check(got, req, data, how):
    exp = req.expected()
    assert got == exp, f"{how}: request {show(data)}"


# ---- (a) one piece vs split ------------------------------------------------

@st.composite
def req_and_splits(draw):
    req = draw(requests())
    return req, draw(split_points(len(req.encode())))


@SETTINGS
@given(case=req_and_splits())
@example(case=(Req("GET", "/a%41%4/%zz", "x=%41", "HTTP/1.1", [("Host", "", "h", "")], "none"), [1, 17, 18]))
def test_single_request_whole_and_split(server, case):
    req, points = case
    data = req.encode()
    check(one(server, data), req, data, "one piece")
    check(one(server, data, points), req, data, f"split at {points}")


# ---- (b) pipelining ----------------------------------------------------------

@st.composite
def pipelines(draw):
    reqs = draw(st.lists(requests(), min_size=2, max_size=5))
    # every request but the last keeps the connection open; the last may close it
    reqs = [r if r.keeps_alive else r.with_connection(draw(st.sampled_from(["keep-alive", "Keep-Alive"])))
            for r in reqs[:-1]] + [reqs[-1]]
    if draw(st.booleans()):
        reqs[-1] = reqs[-1].with_connection("close")
    data = b"".join(r.encode() for r in reqs)
    return reqs, data, draw(split_points(len(data), 10))


def run_pipeline(server, reqs, data, points):
    with connect(server) as c:
        # Read while sending: answers echoing large bodies could otherwise
        # fill both directions' socket buffers and deadlock client and server.
        answers, errors = [], []

        def reader():
            try:
                for _ in reqs:
                    answers.append(c.read_response())
            except Exception as e:          # reported below, in the test's thread
                errors.append(e)
        t = threading.Thread(target=reader)
        t.start()
        try:
            send_split(c, data, points)
        finally:
            t.join(30)
        assert not errors, f"reading answers failed: {errors[0]!r}; request {show(data)}"
        assert len(answers) == len(reqs)
        for i, r in enumerate(reqs):
            check(parsed(answers[i], data), r, data, f"pipelined #{i}, split at {list(points)}")
            check_connection_header(answers[i], r, data)
        if not reqs[-1].keeps_alive:
            assert c.is_closed(5), "connection left open after the last request asked to close it"


@pytest.fixture(scope="module")
def spool_server(app_mode):
    """echo with bodies over 1000 bytes pre-read and spooled to a temp file."""
    s = ServerProc("apps:echo", "--spool-threshold", "1000", env=mode_env(app_mode))
    yield s
    s.stop()


@pytest.fixture(params=["default", "spool"])
def any_server(request, server, spool_server):
    return server if request.param == "default" else spool_server


@SETTINGS
@given(case=pipelines())
def test_pipelined_in_order(any_server, case):
    server = any_server
    reqs, data, points = case
    run_pipeline(server, reqs, data, ())
    run_pipeline(server, reqs, data, points)


# ---- (c) keep-alive reuse == separate connections ----------------------------

@st.composite
def sequences(draw):
    reqs = draw(st.lists(requests(), min_size=2, max_size=5))
    return [r if r.keeps_alive else r.with_connection("keep-alive") for r in reqs]


@SETTINGS
@given(reqs=sequences())
def test_keepalive_reuse_equals_separate_connections(any_server, reqs):
    server = any_server
    separate = [one(server, r.encode()) for r in reqs]
    with connect(server) as c:
        reused = []
        for r in reqs:
            c.send(r.encode())
            resp = c.read_response()
            check_connection_header(resp, r, r.encode())
            reused.append(parsed(resp, r.encode()))
    for i, r in enumerate(reqs):
        check(separate[i], r, r.encode(), f"separate #{i}")
        check(reused[i], r, r.encode(), f"reused #{i}")
    assert reused == separate


# ---- empty lines before a request-line (RFC 9112 2.2) -------------------------

@st.composite
def crlf_pipelines(draw):
    reqs = [r if r.keeps_alive else r.with_connection("keep-alive")
            for r in draw(st.lists(requests(), min_size=1, max_size=4))]
    parts = []
    for r in reqs:
        parts.append(b"\r\n" * draw(st.integers(0, 2)))
        parts.append(r.encode())
    data = b"".join(parts)
    # A split may fall anywhere, also between the CR and LF of an empty line.
    points = draw(split_points(len(data), 10))
    return reqs, data, points


@SETTINGS
@given(case=crlf_pipelines())
def test_leading_empty_lines_ignored(server, case):
    reqs, data, points = case
    run_pipeline(server, reqs, data, points)


@pytest.mark.parametrize("keepalive", [False, True], ids=["new-conn", "kept-alive"])
def test_leading_crlf_split_between_cr_and_lf(server, keepalive):
    req = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
    with connect(server) as c:
        if keepalive:
            c.send(req)
            assert c.read_response().status == 200
        send_split(c, b"\r\n" + req, [1])
        r = c.read_response()
        assert r.status == 200, (r.status, r.body)
