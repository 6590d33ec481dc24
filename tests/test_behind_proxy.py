"""Behind a proxy (issue 11): the scheme a trusted proxy says the client
used (--forwarded-allow-ips, secure_scheme_headers, Forwarded proto=), and
the PROXY protocol (--proxy-protocol, --proxy-allow-from), gunicorn's
settings. Real servers on 127.0.0.1; a client bound to 127.0.0.2 is a peer
that is not 127.0.0.1. HAProxy (Debian's package) with send-proxy-v2 in
front of forkwsgi at the end.
"""
import collections
import json
import os
import shutil
import socket
import struct
import subprocess
import time

import pytest

from conftest import ServerProc
from httpraw import Closed, Conn, in_app_header, proc_gone, wait_for, wait_in_app

APP_MODES = ("inline",)      # each server here chooses its own --threads

GET = b"GET / HTTP/1.1\r\nHost: t\r\n"


def ask(s, headers=b"", source=None, prefix=b""):
    """One request (after `prefix`) from `source`; (status, JSON body or None)."""
    with Conn(s.port, source=source) as c:
        c.send(prefix + GET + headers + b"\r\n")
        r = c.read_response()
        return r.status, json.loads(r.body) if r.status == 200 else None


@pytest.fixture(scope="module")
def plain():
    """Default settings: 127.0.0.1 and ::1 may set the scheme."""
    s = ServerProc("apps:client")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def forwarded():
    """--forwarded-proto: Forwarded's proto= says the scheme too."""
    s = ServerProc("apps:client", "--forwarded-proto")
    yield s
    s.stop()


# ---- the scheme: --forwarded-allow-ips and secure_scheme_headers --------------

@pytest.mark.parametrize("header, scheme", [
    (b"", "http"),
    (b"X-Forwarded-Proto: https\r\n", "https"),
    (b"x-forwarded-proto: https\r\n", "https"),             # names: any case
    (b"X-Forwarded-Proto: HTTPS\r\n", "http"),              # values: exact, as gunicorn
    (b"X-Forwarded-Proto: http\r\n", "http"),
    (b"X-Forwarded-Ssl: on\r\n", "https"),
    (b"X-Forwarded-Protocol: ssl\r\n", "https"),
    (b"X-Forwarded-Proto: https\r\nX-Forwarded-Ssl: on\r\n", "https"),
    (b"X_Forwarded_Proto: https\r\n", "http"),              # '_' is not '-'
])
def test_scheme_headers_from_an_allowed_proxy(plain, header, scheme):
    status, d = ask(plain, header)
    assert status == 200 and d["url_scheme"] == scheme


def test_scheme_headers_from_another_peer_are_plain_headers(plain):
    status, d = ask(plain, b"X-Forwarded-Proto: https\r\n", source="127.0.0.2")
    assert status == 200 and d["remote_addr"] == "127.0.0.2"
    assert d["url_scheme"] == "http" and d["x_forwarded_proto"] == "https"
    # Disagreeing ones too: they mean nothing from there.
    status, d = ask(plain, b"X-Forwarded-Proto: https\r\nX-Forwarded-Ssl: off\r\n", source="127.0.0.2")
    assert status == 200 and d["url_scheme"] == "http"


@pytest.mark.parametrize("header", [
    b"X-Forwarded-Proto: https\r\nX-Forwarded-Ssl: off\r\n",
    b"X-Forwarded-Proto: https\r\nX-Forwarded-Proto: http\r\n",
    b"X-Forwarded-Proto: http\r\nForwarded: proto=https\r\n",
])
def test_scheme_headers_that_disagree_answer_400(forwarded, header):
    status, _ = ask(forwarded, header)
    assert status == 400
    assert wait_for(lambda: "400 scheme headers disagree" in forwarded.log())


@pytest.mark.parametrize("header, scheme", [
    (b"Forwarded: proto=https\r\n", "http"),
    (b"X-Forwarded-Proto: http\r\nForwarded: proto=https\r\n", "http"),
    (b"X-Forwarded-Proto: https\r\nForwarded: proto=http\r\n", "https"),
])
def test_forwarded_is_a_plain_header_by_default_as_in_gunicorn(plain, header, scheme):
    """Hostile review (gunicorn migration): nginx passes a client's own
    Forwarded header on by default, and forkwsgi took its proto= from the
    allowed proxy: a plain-HTTP client got wsgi.url_scheme https (gunicorn:
    http), and one that sent proto=https behind nginx's X-Forwarded-Proto
    $scheme got a 400. gunicorn reads no Forwarded; neither does forkwsgi
    without --forwarded-proto."""
    status, d = ask(plain, header)
    assert status == 200 and d["url_scheme"] == scheme


@pytest.mark.parametrize("header, scheme", [
    (b"Forwarded: for=192.0.2.60;proto=https;by=203.0.113.43\r\n", "https"),
    (b"Forwarded: Proto=HTTPS\r\n", "https"),                # RFC 7239: case-insensitive
    (b'Forwarded: for="[2001:db8::1]:4711";proto="https"\r\n', "https"),
    (b"Forwarded: proto=https, for=10.0.0.1;proto=http\r\n", "http"),     # the nearest proxy's
    (b"Forwarded: proto=http\r\nForwarded: for=10.0.0.1;proto=https\r\n", "https"),
    (b'Forwarded: for="a,proto=http";proto=https\r\n', "https"),
    (b"Forwarded: for=192.0.2.60\r\n", "http"),
    (b"Forwarded: proto=https\r\nX-Forwarded-Proto: https\r\n", "https"),
])
def test_forwarded_proto_from_an_allowed_proxy(forwarded, header, scheme):
    status, d = ask(forwarded, header)
    assert status == 200 and d["url_scheme"] == scheme
    assert d["remote_addr"] == "127.0.0.1"          # for= is the app's business, as X-Forwarded-For


def test_forwarded_allow_ips_star_and_networks():
    star = ServerProc("apps:client", "--forwarded-allow-ips", "*")
    net = ServerProc("apps:client", "--forwarded-allow-ips", "10.0.0.0/8, 127.0.0.2/31")
    try:
        assert ask(star, b"X-Forwarded-Proto: https\r\n", source="127.0.0.2")[1]["url_scheme"] == "https"
        assert ask(net, b"X-Forwarded-Proto: https\r\n", source="127.0.0.3")[1]["url_scheme"] == "https"
        assert ask(net, b"X-Forwarded-Proto: https\r\n", source="127.0.0.4")[1]["url_scheme"] == "http"
        assert ask(net, b"X-Forwarded-Proto: https\r\n")[1]["url_scheme"] == "http"     # 127.0.0.1
    finally:
        star.stop()
        net.stop()


def test_settings_from_a_config_file_and_gunicorns_variable(tmp_path):
    conf = tmp_path / "conf.py"
    conf.write_text('secure_scheme_headers = {"X-Scheme": "secure"}\n')
    s = ServerProc("apps:client", "-c", str(conf), env={"FORWARDED_ALLOW_IPS": "127.0.0.2"})
    try:
        assert ask(s, b"X-Scheme: secure\r\n", source="127.0.0.2")[1]["url_scheme"] == "https"
        assert ask(s, b"X-Scheme: plain\r\n", source="127.0.0.2")[1]["url_scheme"] == "http"
        # Only the configured headers count now; 127.0.0.1 is not in the list.
        assert ask(s, b"X-Forwarded-Proto: https\r\n", source="127.0.0.2")[1]["url_scheme"] == "http"
        assert ask(s, b"X-Scheme: secure\r\n")[1]["url_scheme"] == "http"
    finally:
        s.stop()


def test_unix_socket_peers_are_allowed(tmp_path):
    path = str(tmp_path / "s.sock")
    s = ServerProc("apps:client", bind=[f"unix:{path}"])
    try:
        with Conn(None, path=path) as c:
            c.send(GET + b"X-Forwarded-Proto: https\r\n\r\n")
            assert json.loads(c.read_response().body)["url_scheme"] == "https"
    finally:
        s.stop()


# ---- the PROXY protocol --------------------------------------------------------

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v1(src, sport, dport=8000):
    proto, dst = ("TCP6", "::1") if ":" in src else ("TCP4", "127.0.0.1")
    return f"PROXY {proto} {src} {dst} {sport} {dport}\r\n".encode()


def v2(src=None, sport=0, dst=None, dport=0, command=1, tlvs=b""):
    if src is None:
        body, fam = b"", 0x00
    elif ":" in src:
        body = socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst or "::1")
        body, fam = body + struct.pack(">HH", sport, dport), 0x21
    else:
        body = socket.inet_pton(socket.AF_INET, src) + socket.inet_pton(socket.AF_INET, dst or "127.0.0.1")
        body, fam = body + struct.pack(">HH", sport, dport), 0x11
    body += tlvs
    return V2_SIG + bytes([0x20 | command, fam]) + struct.pack(">H", len(body)) + body


@pytest.fixture(scope="module", params=[1, 3], ids=["inline", "threads"])
def proxied(request):
    s = ServerProc("apps:client", "--proxy-protocol", "--threads", str(request.param), "--header-timeout", "2")
    yield s
    s.stop()


@pytest.mark.parametrize("header, addr, port", [
    (v1("192.0.2.1", 56324), "192.0.2.1", "56324"),
    (v1("2001:db8::7", 1), "2001:db8::7", "1"),
    (b"PROXY UNKNOWN\r\n", "127.0.0.1", None),
    (b"PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n", "127.0.0.1", None),
    (v2("203.0.113.7", 40000), "203.0.113.7", "40000"),
    (v2("2001:db8::9", 65535), "2001:db8::9", "65535"),
    (v2("203.0.113.7", 40000, tlvs=b"\x04\x00\x03abc\x20\x00\x01\x00"), "203.0.113.7", "40000"),
    (v2("192.0.2.1", 1, command=0), "127.0.0.1", None),     # LOCAL: a health check
    (v2(), "127.0.0.1", None),                              # PROXY over UNSPEC
], ids=["v1-tcp4", "v1-tcp6", "v1-unknown", "v1-unknown-fields", "v2-tcp4", "v2-tcp6", "v2-tlvs", "v2-local",
        "v2-unspec"])
def test_proxy_protocol_names_the_client(proxied, header, addr, port):
    with Conn(proxied.port) as c:
        mine = str(c.sock.getsockname()[1])
        c.send(header + GET + b"\r\n")
        d = json.loads(c.read_response().body)
        assert (d["remote_addr"], d["remote_port"]) == (addr, port or mine)
        # Kept alive: the same client for every request, no header again.
        c.send(GET + b"\r\n" + GET + b"\r\n")
        assert [json.loads(c.read_response().body)["remote_addr"] for _ in range(2)] == [addr, addr]


def test_proxy_header_split_across_reads(proxied):
    with Conn(proxied.port) as c:
        for b in v2("198.51.100.3", 4242):
            c.send(bytes([b]))
            time.sleep(0.002)
        time.sleep(0.05)
        c.send(GET + b"\r\n")
        assert json.loads(c.read_response().body)["remote_addr"] == "198.51.100.3"
    with Conn(proxied.port) as c:
        h = v1("198.51.100.4", 4243)
        c.send(h[:7])
        time.sleep(0.05)
        c.send(h[7:-1])
        time.sleep(0.05)
        c.send(h[-1:] + GET + b"\r\n")
        assert json.loads(c.read_response().body)["remote_addr"] == "198.51.100.4"


def closed_with(s, data, reason, source=None, timeout=5.0):
    with Conn(s.port, source=source) as c:
        try:
            c.send(data)
        except OSError:
            pass                          # closed before all of it went out
        assert c.is_closed(timeout) and c.buf == b""   # no response: just closed
    assert wait_for(lambda: reason in s.log()), s.log()[-3000:]


@pytest.mark.parametrize("data, reason", [
    (b"PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n" + GET + b"\r\n", "v1 header: not five fields"),
    (b"PROXY TCP4 192.0.2.1 198.51.100.2 70000 80\r\n", "v1 header: bad port"),
    (b"PROXY UNKNOWN " + b"x" * 100 + b"\r\n", "v1 header longer than 107 bytes"),
    (V2_SIG + b"\x21\x11\x00\x0b" + bytes(11), "v2 header: addresses longer than the header"),
    (V2_SIG + b"\x22\x11\x00\x0c", "v2 header: command not LOCAL or PROXY"),
    (v1("192.0.2.1", 1).replace(b"\r\n", b"\n"), "a byte that is not printable ASCII"),
], ids=["v1-fields", "v1-port", "v1-too-long", "v2-short", "v2-command", "v1-lf"])
def test_malformed_proxy_header_closes(proxied, data, reason):
    closed_with(proxied, data, reason)


def test_proxy_header_from_a_peer_not_allowed_closes(proxied):
    closed_with(proxied, v1("192.0.2.1", 1) + GET + b"\r\n",
                "127.0.0.2:", source="127.0.0.2")
    assert wait_for(lambda: "PROXY protocol: header from a peer not in --proxy-allow-from: connection closed"
                    in proxied.log())


def test_detect_serves_connections_without_a_header_as_gunicorn(proxied):
    """Hostile review (gunicorn migration): gunicorn's proxy_protocol
    (--proxy-protocol) serves a connection that starts without a header (a
    health check, a kubelet probe that reaches the pod directly); forkwsgi
    closed it, so such probes never passed. Now the flag alone (and
    proxy_protocol = True) is `detect`: such a connection is served, its
    peer the client, from any peer; a header still needs --proxy-allow-from."""
    for source, addr in ((None, "127.0.0.1"), ("127.0.0.2", "127.0.0.2")):
        status, d = ask(proxied, source=source)
        assert status == 200 and d["remote_addr"] == addr, (source, d)
    with Conn(proxied.port) as c:               # a request split at its first byte waits for the rest
        c.send(b"\r")
        time.sleep(0.1)
        c.send(b"\n" + GET + b"\r\n")
        assert c.read_response().status == 200
    status, d = ask(proxied, prefix=v1("192.0.2.9", 9))
    assert status == 200 and d["remote_addr"] == "192.0.2.9"


def test_a_strict_mode_closes_a_connection_without_a_header():
    s = ServerProc("apps:client", "--proxy-protocol", "auto")
    try:
        closed_with(s, GET + b"\r\n", "PROXY protocol: no PROXY header: connection closed")
        closed_with(s, GET + b"\r\n", "peer not in --proxy-allow-from", source="127.0.0.2")
    finally:
        s.stop()


def test_proxy_header_incomplete_at_the_header_timeout_closes(proxied):
    t0 = time.monotonic()
    closed_with(proxied, b"PROXY TCP4 192.0.2.1 ", "header not complete within --header-timeout")
    assert 1.5 < time.monotonic() - t0 < 6


def test_proxy_protocol_versions_and_allowed_networks():
    s = ServerProc("apps:client", "--proxy-protocol", "v1", "--proxy-allow-from", "127.0.0.2/31")
    try:
        status, d = ask(s, source="127.0.0.2", prefix=v1("192.0.2.5", 5))
        assert status == 200 and d["remote_addr"] == "192.0.2.5"
        closed_with(s, v2("192.0.2.5", 5) + GET + b"\r\n", "a PROXY v2 header, but only v1 is accepted",
                    source="127.0.0.3")
        closed_with(s, v1("192.0.2.5", 5) + GET + b"\r\n", "peer not in --proxy-allow-from")   # 127.0.0.1
    finally:
        s.stop()


@pytest.mark.parametrize("header, addr, port", [
    (v1("2001:db8::5", 5555), "2001:db8::5", "5555"),
    (v2("203.0.113.9", 9999), "203.0.113.9", "9999"),
    (v2("203.0.113.9", 9999, command=0), "127.0.0.1", None),       # LOCAL: the socket's peer
], ids=["v1-tcp6", "v2-tcp4", "v2-local"])
def test_proxied_client_survives_keep_alive_hand_off(header, addr, port):
    """--max-requests 3 on 2 workers: the worker serving the connection
    retires after its third request and hands the idle kept-alive
    connection to the other one (SCM_RIGHTS); the client its PROXY header
    named must travel with it, or the next worker would say 127.0.0.1."""
    s = ServerProc("apps:client", "--workers", "2", "--threads", "1", "--max-requests", "3",
                   "--proxy-protocol")
    try:
        assert wait_for(lambda: len(s.worker_pids()) >= 2)
        seen = []
        with Conn(s.port) as c:
            mine = str(c.sock.getsockname()[1])
            c.send(header)
            for _ in range(8):
                c.send(GET + b"\r\n")
                d = json.loads(c.read_response().body)
                seen.append((d["pid"], d["remote_addr"], d["remote_port"]))
                if [pid for pid, _, _ in seen].count(d["pid"]) == 3:
                    # idle while the retiring worker hands it on: sent once it has exited
                    assert wait_for(lambda: proc_gone(d["pid"]), timeout=20), s.log()
        assert len({pid for pid, _, _ in seen}) >= 2, seen          # it moved
        assert {(a, p) for _, a, p in seen} == {(addr, port or mine)}, seen
        assert "PROXY protocol" not in s.log()                     # no header expected after a hand-off
    finally:
        s.stop()


def test_a_plain_connection_in_detect_mode_takes_no_header_after_a_hand_off():
    """detect: a connection that came without a header keeps its peer when
    a retiring worker hands it on, and the worker taking it waits for no
    header: one sent mid-connection is no header (it would let a client
    name any address once its connection moved)."""
    s = ServerProc("apps:client", "--workers", "2", "--threads", "1", "--max-requests", "2",
                   "--proxy-protocol")
    try:
        assert wait_for(lambda: len(s.worker_pids()) >= 2)
        with Conn(s.port) as c:
            pids = []
            for _ in range(2):
                c.send(GET + b"\r\n")
                d = json.loads(c.read_response().body)
                assert d["remote_addr"] == "127.0.0.1"
                pids.append(d["pid"])
            assert pids[0] == pids[1]
            assert wait_for(lambda: proc_gone(pids[0]), timeout=20), s.log()
            c.send(v1("192.0.2.66", 66) + GET + b"\r\n")
            r = c.read_response()
            assert r.status != 200 or json.loads(r.body)["remote_addr"] != "192.0.2.66", r
    finally:
        s.stop()


def test_proxied_client_survives_hand_off_to_a_free_worker(tmp_path):
    """With threads, a request arriving on a kept-alive connection at a
    saturated worker moves (unread) to a free one: with the client its
    PROXY header named."""
    s = ServerProc("apps:client", "--workers", "2", "--threads", "2", "--proxy-protocol")
    conns = collections.defaultdict(list)
    try:
        assert wait_for(lambda: len(s.worker_pids()) >= 2)
        for i in range(20):            # kept-alive connections, until 3 sit on one worker
            c = Conn(s.port, timeout=20)
            c.send(v1(f"192.0.2.{i + 1}", 1000 + i) + GET + b"\r\n")
            d = json.loads(c.read_response().body)
            assert d["remote_addr"] == f"192.0.2.{i + 1}"
            conns[d["pid"]].append((c, d["remote_addr"]))
            if any(len(v) >= 3 for v in conns.values()):
                break
        busy = next(p for p, v in conns.items() if len(v) >= 3)
        (a, _), (b, _), (c, addr) = conns[busy][:3]
        marks = [tmp_path / "a", tmp_path / "b"]
        a.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: t\r\n" + in_app_header(marks[0]) + b"\r\n")
        b.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: t\r\n" + in_app_header(marks[1]) + b"\r\n")
        assert all(wait_in_app(m) for m in marks)      # both threads of `busy` are in the app now
        c.send(GET + b"\r\n")
        moved = json.loads(c.read_response().body)
        assert moved["pid"] != busy and moved["remote_addr"] == addr, (moved, addr)
        a.read_response(), b.read_response()
    finally:
        for v in conns.values():
            for x, _ in v:
                x.close()
        s.stop()


def test_master_passes_on_a_stranded_hand_off_whole():
    """A connection handed to a worker that died before taking it is taken
    back by the master and passed on: the datagram's client record too,
    only the REQUEST flag cleared (python/forkwsgi/slots.py)."""
    from forkwsgi import slots
    ws = slots.WorkerSlots(2, 1, False)
    a, b = socket.socketpair()
    try:
        record = bytes([0, 1 | 2 | 4, 4]) + struct.pack(">H", 4242) + socket.inet_aton("192.0.2.9") + bytes(12)
        ws.pass_send[0].sendmsg([record], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", a.fileno()))])
        ws.release(0)
        assert [m for m, _, _ in ws.stranded] == [bytes([0, 1 | 4]) + record[2:]]
    finally:
        ws.close_all()          # closes the stranded copy too (slots.py: _drop_stranded)
        a.close()
        b.close()


# ---- HAProxy with send-proxy-v2 in front ------------------------------------------

HAPROXY = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")

HAPROXY_CONF = """
global
    maxconn 100
defaults
    mode {mode}
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend web
    bind 127.0.0.1:{port}
    default_backend app
backend app
    server app1 127.0.0.1:{upstream} {send}
"""


@pytest.mark.skipif(not HAPROXY, reason="haproxy is installed by .ci/run")
@pytest.mark.parametrize("mode, send", [("http", "send-proxy-v2"), ("tcp", "send-proxy")])
def test_behind_haproxy_send_proxy(tmp_path, mode, send):
    """The client connects to HAProxy from 127.0.0.2; forkwsgi's peer is
    HAProxy (127.0.0.1), and REMOTE_ADDR/REMOTE_PORT are the client's."""
    s = ServerProc("apps:client", "--proxy-protocol")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = tmp_path / "haproxy.conf"
    conf.write_text(HAPROXY_CONF.format(mode=mode, port=port, upstream=s.port, send=send))
    log = open(tmp_path / "haproxy.out", "w")
    proxy = subprocess.Popen([HAPROXY, "-f", str(conf), "-db"], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    try:
        assert wait_for(up, timeout=10), open(log.name).read()
        with Conn(port, source="127.0.0.2") as c:
            mine = str(c.sock.getsockname()[1])
            for _ in range(3):
                c.send(GET + b"\r\n")
                d = json.loads(c.read_response().body)
                assert (d["remote_addr"], d["remote_port"]) == ("127.0.0.2", mine)
        assert "PROXY protocol" not in s.log()
    finally:
        proxy.terminate()
        try:
            proxy.wait(10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait(5)
        log.close()
        s.stop()


HAPROXY_RULES_CONF = """
global
    maxconn 100
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout tunnel 30s
frontend web
    bind 127.0.0.1:{port}
    http-request deny if {{ path_beg /denied }}
    http-request del-header X-Forwarded-Proto
    option forwardfor
    default_backend app
backend app
    server app1 127.0.0.1:{upstream}
"""


@pytest.mark.skipif(not HAPROXY, reason="haproxy is installed by .ci/run")
def test_connect_answered_2xx_opens_no_tunnel_through_haproxy(tmp_path):
    """Issue 23, item 8: HAProxy switches a connection whose CONNECT was
    answered 2xx to a raw tunnel (RFC 9110 9.3.6). At dac5946 forkwsgi kept
    that connection alive, so what the client sent next bypassed HAProxy's
    rules: a denied path was served, a forged X-Forwarded-For and
    X-Forwarded-Proto reached the app. The response to CONNECT now closes
    its connection: nothing more goes through."""
    logfile = tmp_path / "access.log"
    s = ServerProc("apps:echo", "--access-logfile", str(logfile))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = tmp_path / "haproxy.conf"
    conf.write_text(HAPROXY_RULES_CONF.format(port=port, upstream=s.port))
    log = open(tmp_path / "haproxy.out", "w")
    proxy = subprocess.Popen([HAPROXY, "-f", str(conf), "-db"], stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        assert wait_for(lambda: not isinstance(_try_connect(port), Exception), timeout=10), \
            open(log.name).read()
        with Conn(port) as c:
            c.send(b"CONNECT h.test:443 HTTP/1.1\r\nHost: h.test:443\r\n\r\n")
            r = c.read_response()
            assert r.status == 200
            c.send(b"GET /denied HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 6.6.6.6\r\n"
                   b"X-Forwarded-Proto: https\r\n\r\n")
            try:
                r2 = c.read_response()
            except (Closed, OSError):
                r2 = None           # closed: the tunnel ended with the server's close
            assert r2 is None or r2.status == 403, r2.body[:200]   # or HAProxy's own answer
        # the way HAProxy's rules apply: a denied path gets 403 from it
        with Conn(port) as c:
            c.send(b"GET /denied HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 403
        # One worker writes the access log in the order it serves: once a
        # request sent now is logged, a /denied that reached it would be too.
        assert s.get("/logged-last").status == 200
        assert wait_for(lambda: "/logged-last" in logfile.read_text(), timeout=20), logfile.read_text()
        assert "/denied" not in logfile.read_text(), logfile.read_text()
        assert "6.6.6.6" not in s.log()
    finally:
        os.killpg(proxy.pid, 15)
        proxy.wait(10)
        log.close()
        s.stop()


def _try_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError as e:
        return e
