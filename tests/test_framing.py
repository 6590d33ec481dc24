"""Request framing rules (RFC 9112), each over a raw socket to a real server.

Every rejected request must get its status and a closed connection, and the
server must go on serving others.
"""
import json

import pytest

from httpraw import Conn

BAD = [
    # (id, raw request, allowed statuses)
    ("cl_and_te", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", {400}),
    ("duplicate_cl", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", {400}),
    ("cl_list", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc", {400}),
    ("cl_sign", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc", {400}),
    ("cl_hex", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\nabc", {400}),
    ("cl_empty", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", {400}),
    ("cl_overflow", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", {400}),
    ("te_not_last_chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", {400}),
    ("te_chunked_twice", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", {400}),
    ("te_unknown", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", {400}),
    ("te_gzip_chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", {400, 501}),
    ("te_http10", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", {400}),
    ("te_space_in_value", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chun ked\r\n\r\n", {400}),
    ("obs_fold", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", {400}),
    ("bare_cr_value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", {400}),
    ("bare_lf_header", b"GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", {400}),
    ("nul_value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n", {400}),
    ("ctl_value", b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x01c\r\n\r\n", {400}),
    ("space_before_colon", b"GET / HTTP/1.1\r\nHost: a\r\nX-A : b\r\n\r\n", {400}),
    ("space_in_name", b"GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n", {400}),
    ("bad_name_char", b"GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n", {400}),
    ("empty_name", b"GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", {400}),
    ("leading_space_first_header", b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", {400}),
    ("bad_method_char", b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("lowercase_http", b"GET / http/1.1\r\nHost: a\r\n\r\n", {400}),
    ("http2_version", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", {505, 400}),
    ("http2_preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", {505, 400}),
    ("http09", b"GET /\r\n\r\n", {400}),
    ("http_1_2", b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", {505}),
    ("http_3_0", b"GET / HTTP/3.0\r\nHost: a\r\n\r\n", {505}),
    ("no_host_11", b"GET / HTTP/1.1\r\n\r\n", {400}),
    ("two_hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", {400}),
    ("two_hosts_10", b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", {400}),
    ("bad_host_chars", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", {400}),
    ("host_with_slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", {400}),
    ("asterisk_get", b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("authority_get", b"GET example.com:80 HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("connect_origin", b"CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("connect_no_port", b"CONNECT example.com HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("absolute_userinfo", b"GET http://u:p@a/ HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("absolute_ftp", b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("relative_target", b"GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("double_space", b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("trailing_space_version", b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", {400}),
    ("tab_separator", b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("obs_text_target", b"GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n", {400}),
    ("chunk_size_bad", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", {400}),
    ("chunk_size_overflow", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000000\r\n", {400, 413}),
    ("chunk_size_negative", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", {400}),
    ("chunk_missing_crlf", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n", {400}),
    ("chunk_bare_lf", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n", {400}),
    ("chunk_ext_ctl", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;a=\x01\r\nabc\r\n0\r\n\r\n", {400}),
    ("trailer_obs_fold", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\r\n b\r\n\r\n", {400}),
    ("expect_other", b"POST / HTTP/1.1\r\nHost: a\r\nExpect: something\r\nContent-Length: 0\r\n\r\n", {417}),
]


@pytest.mark.parametrize("name,raw,statuses", BAD, ids=[b[0] for b in BAD])
def test_rejected_and_closed(server, name, raw, statuses):
    with Conn(server.port, timeout=5) as c:
        c.send(raw)
        r = c.read_response()
        assert r.status in statuses, (name, r.status, r.body)
        assert r.header("connection") == "close"
        assert len(r.body) < 100 and r.body.strip()   # a short body saying what
        assert c.is_closed(timeout=5)
    # and the server still serves others
    assert server.get("/ok").status == 200


def test_tls_handshake_on_plain_port_answered_at_once(server):
    hello = bytes.fromhex("16030100a5010000a10303") + b"\x00" * 40
    with Conn(server.port, timeout=3) as c:
        c.send(hello)
        r = c.read_response()
        assert r.status == 400
        assert c.is_closed(timeout=3)


def test_underscore_header_cannot_pose_as_dash(server):
    r = server.get("/", b"X-Forwarded-For: 1.2.3.4\r\nX_Forwarded_For: 6.6.6.6\r\n")
    h = json.loads(r.body)["headers"]
    assert h["HTTP_X_FORWARDED_FOR"] == "1.2.3.4"
    r = server.get("/", b"X_Forwarded_For: 6.6.6.6\r\n")
    assert "HTTP_X_FORWARDED_FOR" not in json.loads(r.body)["headers"]


def test_repeated_headers_joined(server):
    r = server.get("/", b"Accept: a\r\nX-Multi: 1\r\nAccept: b\r\nX-Multi: 2\r\nX-Multi: 3\r\n")
    h = json.loads(r.body)["headers"]
    assert h["HTTP_ACCEPT"] == "a, b"
    assert h["HTTP_X_MULTI"] == "1, 2, 3"


def test_te_matched_case_insensitively(server):
    r = server.request(b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-ENCODING: ChUnKeD\r\n\r\n"
                       b"3\r\nabc\r\n0\r\n\r\n")
    assert r.status == 200
    assert json.loads(r.body)["body"] == "abc"


def test_chunked_with_extensions_and_trailers(server):
    r = server.request(b"POST /t HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"4;ext=1;q=\"x y\"\r\nWiki\r\n5 ; a\r\npedia\r\nA\r\n in chunks\r\n"
                       b"0;last\r\nX-Trailer: yes\r\nContent-Length: 99\r\n\r\n")
    assert r.status == 200
    d = json.loads(r.body)
    assert d["body"] == "Wikipedia in chunks"
    assert "HTTP_X_TRAILER" not in d["headers"]
    assert "CONTENT_LENGTH" not in d["headers"]


def test_path_never_normalised(server):
    r = server.get("///a/../b/./c%2F%252F?q=%20")
    d = json.loads(r.body)
    assert d["path"] == "///a/../b/./c/%2F"     # decoded once, nothing collapsed
    assert d["raw_uri"] == "///a/../b/./c%2F%252F?q=%20"
    assert d["query"] == "q=%20"


def test_fragment_stripped(server):
    d = json.loads(server.get("/p?x=1#frag").body)
    assert (d["path"], d["query"], d["raw_uri"]) == ("/p", "x=1", "/p?x=1#frag")


def test_absolute_form(server):
    d = json.loads(server.get("http://example.com:8080/x/y?z=1").body)
    assert (d["path"], d["query"]) == ("/x/y", "z=1")
    d = json.loads(server.get("http://example.com").body)
    assert d["path"] == "/"


def test_absolute_form_names_the_host(server):
    """RFC 9112 3.2.2: with an absolute-form target the server ignores Host
    and takes the target's (issue 23, item 11: HTTP_HOST was the header)."""
    r = server.request(b"GET http://real.test:8080/x HTTP/1.1\r\nHost: other.test\r\n\r\n")
    assert json.loads(r.body)["headers"]["HTTP_HOST"] == "real.test:8080"


@pytest.mark.parametrize("host", [b"h.test:99999x", b"h.test:99999", b"a:1:2", b"[::1", b":80"])
def test_invalid_host_is_400(server, host):
    """RFC 9112 3.2: a Host that is no authority gets 400 (item 11)."""
    r = server.request(b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    assert r.status == 400


def test_options_asterisk_and_connect(server):
    assert server.request(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n").status == 200
    with Conn(server.port) as c:
        c.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and json.loads(r.body)["method"] == "CONNECT"
        # A 2xx to CONNECT makes a tunnel of the connection for a proxy in
        # front: it is the last response on it (item 8).
        assert r.header("connection") == "close" and c.is_closed()


def test_leading_empty_lines_ignored(server):
    assert server.request(b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n").status == 200


def test_pipelined_in_one_write_answered_in_order(server):
    reqs = b"".join(b"GET /%d HTTP/1.1\r\nHost: a\r\n\r\n" % i for i in range(20))
    reqs += b"POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
    reqs += b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
    reqs += b"GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    with Conn(server.port) as c:
        c.send(reqs)
        paths = []
        for _ in range(23):
            r = c.read_response()
            assert r.status == 200
            d = json.loads(r.body)
            paths.append((d["path"], d["body"]))
        assert paths == [(f"/{i}", "") for i in range(20)] + [("/post", "hello"), ("/chunked", "hi"), ("/last", "")]
        assert c.is_closed()


def test_pipelined_bad_request_after_good_ones(server):
    with Conn(server.port) as c:
        c.send(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\nGET /3 HTTP/1.1\r\n\r\n")
        assert c.read_response().status == 200
        assert c.read_response().status == 200
        assert c.read_response().status == 400
        assert c.is_closed()


def test_byte_at_a_time(server):
    raw = (b"POST /slow?x=y HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n"
           b"3;e=f\r\nabc\r\n0\r\nT: v\r\n\r\n")
    with Conn(server.port) as c:
        import socket
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(raw)):
            c.send(raw[i:i + 1])
        d = json.loads(c.read_response().body)
        assert (d["path"], d["query"], d["body"], d["headers"]["HTTP_X_A"]) == ("/slow", "x=y", "abc", "1")


def test_keep_alive_rules(server):
    with Conn(server.port) as c:    # 1.1: kept by default
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.header("connection") is None
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n")
        r = c.read_response()
        assert r.header("connection") == "close"
        assert c.is_closed()
    with Conn(server.port) as c:    # 1.0: closed by default
        c.send(b"GET / HTTP/1.0\r\n\r\n")
        c.read_response()
        assert c.is_closed()
    with Conn(server.port) as c:    # 1.0 + keep-alive
        c.send(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        r = c.read_response()
        assert r.header("connection") == "keep-alive"
        c.send(b"GET / HTTP/1.0\r\n\r\n")
        assert c.read_response().status == 200
        assert c.is_closed()

