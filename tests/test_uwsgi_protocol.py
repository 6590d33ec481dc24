"""The uwsgi protocol (issue 25, item 14): --uwsgi-socket, so that nginx's
`uwsgi_pass` configs of uWSGI deployments work unchanged.

First raw packets over real sockets (TCP and unix), as nginx's uwsgi
module writes them: good requests with bodies (in place and spooled), a
packet split byte by byte, and the refusals (oversized datasize,
truncated, a bad modifier, a bad CONTENT_LENGTH, a client too slow for
--header-timeout). Then the real thing: Debian's nginx with
`include uwsgi_params; uwsgi_pass ...;` in front, over TCP and a unix
socket.
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

import uwsgi_apps
from conftest import ServerProc, mode_env
from httpraw import Closed, Conn, free_port, wait_for
from nginx_conf import nginx_conf

NGINX = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
UWSGI_PARAMS = "/etc/nginx/uwsgi_params"
ACCESS_FORMAT = '%(h)s "%(r)s" %(s)s %(b)s "%(a)s" %({content-type}i)s'


def logged(s, pattern):
    """pattern's first group in the server's log, waited for: a server counts
    as ready at its first "Listening at" line, and the others follow it."""
    assert wait_for(lambda: re.search(pattern, s.log()), 20), s.log()
    return re.search(pattern, s.log()).group(1)


def packet(variables, modifier1=0, modifier2=0):
    """A uwsgi request packet: (key, value) pairs of str or bytes."""
    def b(s):
        return s if isinstance(s, bytes) else s.encode("latin-1")
    data = b"".join(struct.pack("<H", len(b(k))) + b(k) + struct.pack("<H", len(b(v))) + b(v)
                    for k, v in variables)
    return struct.pack("<BHB", modifier1, len(data), modifier2) + data


def nginx_vars(method="GET", uri="/", path=None, query="", body=b"", extra=()):
    """The variables nginx's uwsgi_params send, then the request's headers."""
    return [("QUERY_STRING", query), ("REQUEST_METHOD", method), ("CONTENT_TYPE", ""),
            ("CONTENT_LENGTH", str(len(body)) if body else ""), ("REQUEST_URI", uri),
            ("PATH_INFO", path if path is not None else uri.split("?")[0]), ("DOCUMENT_ROOT", "/srv/www"),
            ("SERVER_PROTOCOL", "HTTP/1.1"), ("REQUEST_SCHEME", "http"), ("REMOTE_ADDR", "192.0.2.7"),
            ("REMOTE_PORT", "40123"), ("SERVER_PORT", "80"), ("SERVER_NAME", "example.org"),
            ("HTTP_HOST", "example.org"), ("HTTP_USER_AGENT", "uwsgi-test/1"), *extra]


@pytest.fixture(scope="module")
def srv(app_mode, tmp_path_factory):
    """An HTTP --bind and two uwsgi sockets (TCP, unix), tight limits for
    the refusals, an access log."""
    d = tmp_path_factory.mktemp("uwsgi")
    s = ServerProc("uwsgi_apps:app", "--uwsgi-socket", "127.0.0.1:0", "--uwsgi-socket", f"unix:{d}/app.sock",
                   "--header-timeout", "2", "--limit-request-head", "4096", "--limit-request-fields", "40",
                   "--spool-threshold", "65536", "--access-logfile", str(d / "access.log"),
                   "--access-logformat", ACCESS_FORMAT, env=mode_env(app_mode))
    assert wait_for(lambda: "uwsgi://" in s.log() and "(uwsgi)" in s.log()), s.log()
    s.uwsgi_port = int(logged(s, r"Listening at: uwsgi://127\.0\.0\.1:(\d+)"))
    s.uwsgi_path = logged(s, r"Listening at: unix:(\S+) \(uwsgi\)")
    s.access_log = d / "access.log"
    yield s
    s.stop()


def send(s, data, unix=False, timeout=10.0):
    """Send data on a new connection to s's uwsgi socket; the response."""
    with Conn(s.uwsgi_port, path=s.uwsgi_path if unix else None, timeout=timeout) as c:
        c.send(data)
        r = c.read_response()
        r.closed = c.is_closed(5)
        return r


def environ_of(r):
    assert r.status == 200, (r, r.body[:500])
    return json.loads(r.body)


# ---- raw packets ----------------------------------------------------------------

@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_variables_map_to_the_environ(srv, unix):
    r = send(srv, packet(nginx_vars("GET", "/a%2525b?x=1&y=%20", path="/a%25b", query="x=1&y=%20",
                                    extra=[("HTTP_X_CUSTOM", "yes"), ("UWSGI_APPID", "kept")])), unix=unix)
    e = environ_of(r)
    assert (e["REQUEST_METHOD"], e["PATH_INFO"], e["QUERY_STRING"]) == ("GET", "/a%25b", "x=1&y=%20")
    # PATH_INFO as nginx gave it (decoded already): not decoded again.
    assert (e["REQUEST_URI"], e["RAW_URI"]) == ("/a%2525b?x=1&y=%20", "/a%2525b?x=1&y=%20")
    assert (e["REMOTE_ADDR"], e["REMOTE_PORT"]) == ("192.0.2.7", "40123")
    assert (e["SERVER_NAME"], e["SERVER_PORT"], e["SERVER_PROTOCOL"]) == ("example.org", "80", "HTTP/1.1")
    assert (e["HTTP_HOST"], e["HTTP_X_CUSTOM"], e["DOCUMENT_ROOT"]) == ("example.org", "yes", "/srv/www")
    assert (e["UWSGI_APPID"], e["SCRIPT_NAME"], e["CONTENT_LENGTH"]) == ("kept", "", "")
    assert e["wsgi.url_scheme"] == "http" and e["SERVER_SOFTWARE"].startswith("forkwsgi/")
    # A plain HTTP/1.1 response, ended by the close (one request per connection).
    assert r.version == "HTTP/1.1" and r.header("connection") == "close" and r.closed
    assert r.header("content-length") == str(len(r.body))


@pytest.mark.parametrize("variables, scheme", [
    ([("REQUEST_SCHEME", "https")], "https"),
    ([("REQUEST_SCHEME", "http")], "http"),
    ([("HTTPS", "on"), ("REQUEST_SCHEME", "http")], "https"),
    ([("HTTPS", "1")], "https"),
    ([("HTTPS", "off"), ("REQUEST_SCHEME", "https")], "http"),
    ([("UWSGI_SCHEME", "https"), ("HTTPS", "off")], "https"),
    ([("REQUEST_SCHEME", "https"), ("HTTP_X_FORWARDED_PROTO", "http")], "http"),    # the proxy's header first
    ([("wsgi.url_scheme", "https")], "http"),                  # the server's own entries are not the packet's
    ([], "http"),
])
def test_url_scheme(srv, variables, scheme):
    e = environ_of(send(srv, packet([("REQUEST_METHOD", "GET"), ("PATH_INFO", "/"), *variables])))
    assert e["wsgi.url_scheme"] == scheme


def test_path_info_from_request_uri_and_modifier30(srv):
    # No PATH_INFO (a config without uwsgi_params' line): REQUEST_URI's, decoded once.
    e = environ_of(send(srv, packet([("REQUEST_METHOD", "GET"), ("REQUEST_URI", "/p%20q/%2525?z=1")])))
    assert (e["PATH_INFO"], e["QUERY_STRING"]) == ("/p q/%25", "z=1")
    # uwsgi_modifier1 30 with uwsgi_param SCRIPT_NAME: PATH_INFO without it (uWSGI's).
    e = environ_of(send(srv, packet([("REQUEST_METHOD", "GET"), ("SCRIPT_NAME", "/app"),
                                     ("PATH_INFO", "/app/x/y")], modifier1=30)))
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/x/y")
    # A repeated variable: the last one counts (an override after include uwsgi_params).
    e = environ_of(send(srv, packet(nginx_vars("GET", "/a") + [("PATH_INFO", "/b")])))
    assert e["PATH_INFO"] == "/b"


@pytest.mark.parametrize("size", [10, 60000, 300000], ids=["small", "in-place", "spooled"])
def test_post_bodies(srv, size):
    body = os.urandom(size)
    r = send(srv, packet(nginx_vars("POST", "/upload", body=body,
                                    extra=[("CONTENT_TYPE", "application/octet-stream")])) + body)
    e = environ_of(r)
    assert (e["REQUEST_METHOD"], e["CONTENT_LENGTH"], e["CONTENT_TYPE"]) == ("POST", str(size),
                                                                             "application/octet-stream")
    assert (e["body_len"], e["body_sha256"]) == (size, hashlib.sha256(body).hexdigest())
    assert r.closed


def test_split_byte_by_byte(srv):
    body = b"0123456789"
    data = packet([("REQUEST_METHOD", "PUT"), ("PATH_INFO", "/split"), ("CONTENT_LENGTH", "10")]) + body
    with Conn(srv.uwsgi_port) as c:
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(data)):
            c.send(data[i:i + 1])
            time.sleep(0.002)
        e = environ_of(c.read_response())
    assert (e["REQUEST_METHOD"], e["PATH_INFO"], e["body_len"]) == ("PUT", "/split", 10)
    assert e["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_not_found_and_streamed_response(srv):
    r = send(srv, packet(nginx_vars("GET", "/missing")))
    assert (r.status, r.body) == (404, b"no such page\n")
    # Streamed without a length: no chunked framing, the close ends it.
    r = send(srv, packet(nginx_vars("GET", "/big?n=64&size=65536", query="n=64&size=65536")))
    assert r.status == 200 and r.header("transfer-encoding") is None and r.header("content-length") is None
    assert len(r.body) == 64 * 65536 and r.body[-65536:-65528] == b"00000063"


def test_head_has_no_body(srv):
    r = send(srv, packet(nginx_vars("HEAD", "/big?n=3", query="n=3")))
    assert r.status == 200 and r.closed and r.body == b""


def refused(s, data, status, said, shutdown=False):
    with Conn(s.uwsgi_port) as c:
        c.send(data)
        if shutdown:
            c.sock.shutdown(socket.SHUT_WR)
        r = c.read_response()
        assert r.status == status and c.is_closed(5), r
    assert wait_for(lambda: said in s.log()), s.log()[-3000:]


def test_refusals(srv):
    ok = packet(nginx_vars("GET", "/"))
    # modifier1 5 is a PSGI request, 72 an HTTP request line ('H'): not ours.
    refused(srv, b"\x05" + ok[1:], 400, "400 modifier1 is not a WSGI request")
    refused(srv, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "400 modifier1")
    refused(srv, ok[:3] + b"\x01" + ok[4:], 400, "400 modifier2 is not 0")
    # datasize over --limit-request-head: refused from the header alone.
    refused(srv, struct.pack("<BHB", 0, 5000, 0), 431, "431 datasize over --limit-request-head")
    refused(srv, packet([("HTTP_X_%d" % i, "v") for i in range(80)] + [("REQUEST_METHOD", "GET")]), 431,
            "431 more variables than --limit-request-fields allows")
    # A value running past datasize.
    refused(srv, b"\x00\x08\x00\x00\x01\x00K\x09\x00vvv", 400, "400 a value runs past datasize")
    refused(srv, packet([("REQUEST_METHOD", "POST"), ("CONTENT_LENGTH", "12a")]) + b"x" * 12, 400,
            "400 CONTENT_LENGTH is not a number")
    refused(srv, packet([("REQUEST_METHOD", "POST"), ("CONTENT_LENGTH", "3"), ("CONTENT_LENGTH", "30")]) + b"abc",
            400, "400 two different CONTENT_LENGTH")
    refused(srv, packet([("REQUEST_URI", "/")]), 400, "400 no REQUEST_METHOD")
    refused(srv, packet([("REQUEST_METHOD", "GET"), ("", "x")]), 400, "400 a key is empty")
    refused(srv, packet([("REQUEST_METHOD", "POST"), ("CONTENT_LENGTH", str(2 << 30))]), 413,
            "413 CONTENT_LENGTH over --limit-request-body")


def test_truncated_packet_is_not_answered(srv):
    # The client sends part of a packet and stops sending: no request, no answer.
    for part in (b"\x00\x40", packet(nginx_vars("GET", "/"))[:-3]):
        with Conn(srv.uwsgi_port) as c:
            c.send(part)
            c.sock.shutdown(socket.SHUT_WR)
            assert c.read_until_close() == b""
    # And a body cut short.
    with Conn(srv.uwsgi_port) as c:
        c.send(packet(nginx_vars("POST", "/", body=b"x" * 100)) + b"x" * 50)
        c.sock.shutdown(socket.SHUT_WR)
        assert c.read_until_close() == b""


def test_slow_client_gets_the_header_timeout(srv):
    with Conn(srv.uwsgi_port) as c:
        start = time.monotonic()
        c.send(packet(nginx_vars("GET", "/"))[:40])
        r = c.read_response()
        assert r.status == 408 and c.is_closed(5)
        assert 1.5 < time.monotonic() - start < 8


def test_access_log_names_the_client_the_proxy_named(srv):
    send(srv, packet(nginx_vars("GET", "/logged?q=1", query="q=1",
                                extra=[("CONTENT_TYPE", "text/x-test")])))
    line = '192.0.2.7 "GET /logged?q=1 HTTP/1.1" 200 '
    assert wait_for(lambda: line in srv.access_log.read_text()), srv.access_log.read_text()[-2000:]
    assert re.search(re.escape(line) + r'\d+ "uwsgi-test/1" text/x-test', srv.access_log.read_text())


def test_http_beside_uwsgi(srv):
    """The --bind address still speaks HTTP."""
    r = srv.get("/h?x=2")
    e = environ_of(r)
    assert (e["PATH_INFO"], e["QUERY_STRING"], e["REMOTE_ADDR"]) == ("/h", "x=2", "127.0.0.1")
    assert "REQUEST_URI" not in e and "DOCUMENT_ROOT" not in e


def test_only_allowed_peers(srv):
    """--uwsgi-allow-from (127.0.0.1 and ::1 by default, as gunicorn's
    uwsgi_allow_ips): another peer may not say who the client is."""
    with Conn(srv.uwsgi_port, source="127.0.0.2") as c:
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            c.send(packet(nginx_vars("GET", "/")))
            c.read_response()
    assert wait_for(lambda: "127.0.0.2" in srv.log() and "not in --uwsgi-allow-from" in srv.log())


# ---- settings ------------------------------------------------------------------

def test_uwsgi_socket_alone_opens_no_http_address(servers, tmp_path):
    s = ServerProc("uwsgi_apps:app", "--uwsgi-socket", f"unix:{tmp_path}/only.sock", bind=[], wait=False)
    servers.append(s)
    assert wait_for(lambda: "Listening at" in s.log() and s.worker_pids(), 20), s.log()
    assert re.findall(r"Listening at: (.*)", s.log()) == [f"unix:{tmp_path}/only.sock (uwsgi)"]
    with Conn(0, path=f"{tmp_path}/only.sock") as c:
        c.send(packet(nginx_vars("GET", "/one")))
        assert environ_of(c.read_response())["PATH_INFO"] == "/one"


def test_gunicorn_config_protocol_uwsgi(servers, tmp_path):
    """gunicorn 27's protocol = "uwsgi" makes the binds uwsgi sockets;
    uwsgi_allow_ips is --uwsgi-allow-from."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text('bind = ["127.0.0.1:0"]\nprotocol = "uwsgi"\nuwsgi_allow_ips = "127.0.0.1,127.0.0.2"\n')
    check = subprocess.run([sys.executable, "-m", "forkwsgi", "uwsgi_apps:app", "-c", str(conf),
                            "--check-config"], cwd=os.path.dirname(__file__), capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0 and "counterpart" not in check.stdout + check.stderr, check
    s = ServerProc("uwsgi_apps:app", "-c", str(conf), bind=[], wait=False)
    servers.append(s)
    assert wait_for(lambda: "Listening at: uwsgi://" in s.log(), 20), s.log()
    port = int(logged(s, r"Listening at: uwsgi://127\.0\.0\.1:(\d+)"))
    with Conn(port, source="127.0.0.2") as c:
        c.send(packet(nginx_vars("GET", "/g")))
        assert environ_of(c.read_response())["PATH_INFO"] == "/g"


def test_reload_in_place_keeps_what_each_socket_speaks(servers):
    """SIGHUP re-executes the master, which takes the sockets over: the new
    workers serve uwsgi on the uwsgi socket and HTTP on the --bind one."""
    s = ServerProc("uwsgi_apps:app", "--uwsgi-socket", "127.0.0.1:0", "--workers", "2")
    servers.append(s)
    port = int(logged(s, r"Listening at: uwsgi://127\.0\.0\.1:(\d+)"))
    assert wait_for(lambda: len(s.worker_pids()) == 2, 20)
    old = set(s.worker_pids())
    s.signal(signal.SIGHUP)
    assert wait_for(lambda: "Reloaded in place" in s.log() and len(s.worker_pids()) == 2 and
                    not old & set(s.worker_pids()), 60), s.log()
    for i in range(6):
        with Conn(port) as c:
            c.send(packet(nginx_vars("GET", f"/after/{i}")))
            assert environ_of(c.read_response())["PATH_INFO"] == f"/after/{i}"
        assert environ_of(s.get(f"/http/{i}"))["PATH_INFO"] == f"/http/{i}"


def test_bad_protocol_is_a_one_line_error():
    p = subprocess.run([sys.executable, "-m", "forkwsgi", "uwsgi_apps:app", "--protocol", "fastcgi"],
                       cwd=os.path.dirname(__file__), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p
    assert "invalid value for --protocol" in p.stderr and "use http, uwsgi" in p.stderr, p


# ---- behind a real nginx ---------------------------------------------------------

# Workers as root (this test runs as root): the unix socket lives in the
# test's private temp dir. nginx as www-data on a socket is item 8's test.
NGINX_HTTP = """
    client_max_body_size 20m;
    server {{
        listen 127.0.0.1:{tcp_port};
        location / {{
            include uwsgi_params;
            uwsgi_pass 127.0.0.1:{upstream};
        }}
    }}
    server {{
        listen 127.0.0.1:{unix_port};
        location / {{
            include uwsgi_params;
            uwsgi_pass unix:{path};
        }}
    }}
"""


@pytest.fixture(scope="module")
def nginx(srv, tmp_path_factory):
    if not (NGINX and os.path.exists(UWSGI_PARAMS)):
        pytest.skip("nginx (Debian's package, with /etc/nginx/uwsgi_params) is installed by .ci/run")
    d = tmp_path_factory.mktemp("nginx")
    shutil.copy(UWSGI_PARAMS, d / "uwsgi_params")       # `include uwsgi_params;` as users write it
    ports = {"tcp": free_port(), "unix": free_port()}
    conf = d / "nginx.conf"
    conf.write_text(nginx_conf(d, NGINX_HTTP.format(tcp_port=ports["tcp"], unix_port=ports["unix"],
                                                    upstream=srv.uwsgi_port, path=srv.uwsgi_path),
                               user="root" if os.geteuid() == 0 else None, connections=256))
    out = open(d / "nginx.out", "w")
    proc = subprocess.Popen([NGINX, "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)], stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def up():
        try:
            for p in ports.values():
                socket.create_connection(("127.0.0.1", p), timeout=1).close()
            return True
        except OSError:
            return False
    assert wait_for(up, 10), (d / "nginx.out").read_text()
    proc.ports, proc.error_log = ports, d / "error.log"
    yield proc
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    out.close()


def via(nginx, which, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", nginx.ports[which], timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def upstream_errors(nginx):
    """nginx's complaints about the upstream (its warnings about buffering
    a large response to a file are no complaint)."""
    return [line for line in nginx.error_log.read_text().splitlines()
            if any(level in line for level in ("[error]", "[crit]", "[alert]", "[emerg]"))]


@pytest.fixture(params=["tcp", "unix"])
def which(request, nginx):
    yield request.param
    assert upstream_errors(nginx) == []


def test_nginx_get_query_and_headers(nginx, which):
    status, headers, body = via(nginx, which, "GET", "/some/p%20th?a=1&b=%C3%A9", headers={"X-Custom": "v 1"})
    e = json.loads(body)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert (e["REQUEST_METHOD"], e["PATH_INFO"], e["QUERY_STRING"]) == ("GET", "/some/p th", "a=1&b=%C3%A9")
    assert (e["REQUEST_URI"], e["SERVER_PROTOCOL"], e["REQUEST_SCHEME"]) == ("/some/p%20th?a=1&b=%C3%A9",
                                                                           "HTTP/1.1", "http")
    assert (e["HTTP_X_CUSTOM"], e["REMOTE_ADDR"], e["wsgi.url_scheme"]) == ("v 1", "127.0.0.1", "http")
    assert e["HTTP_HOST"] == "127.0.0.1" and e["SERVER_PORT"] == str(nginx.ports[which])


def test_nginx_post_bodies(nginx, which):
    for size in (1000, 300000):
        data = os.urandom(size)
        status, _, body = via(nginx, which, "POST", "/form", body=data,
                              headers={"Content-Type": "application/x-test"})
        e = json.loads(body)
        assert status == 200 and (e["body_len"], e["body_sha256"]) == (size, hashlib.sha256(data).hexdigest())
        assert (e["CONTENT_LENGTH"], e["CONTENT_TYPE"]) == (str(size), "application/x-test")


def test_nginx_large_streamed_response(nginx, which):
    status, headers, body = via(nginx, which, "GET", "/big?n=200&size=65536")
    assert status == 200 and len(body) == 200 * 65536
    assert body == b"".join(uwsgi_apps.chunk(i, 65536) for i in range(200))


def test_nginx_404_from_the_app(nginx, which):
    assert via(nginx, which, "GET", "/missing")[::2] == (404, b"no such page\n")


def test_nginx_connection_per_request_load(nginx, which):
    """nginx opens a connection per request to the uwsgi socket: a few
    seconds of concurrent clients, every answer a 200."""
    wrk = shutil.which("wrk")
    if not wrk:
        pytest.skip("wrk is installed by .ci/run")
    out = subprocess.run([wrk, "-t1", "-c8", "-d2s", "--timeout", "5s",
                          f"http://127.0.0.1:{nginx.ports[which]}/w"], capture_output=True, text=True,
                         timeout=40).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    assert requests > 200 and "Non-2xx" not in out and "Socket errors" not in out, out


def test_a_uwsgi_socket_beyond_this_machine_says_who_may_use_it(servers):
    """Hostile review (uWSGI migration): socket = 0.0.0.0:3031 closed every
    peer but 127.0.0.1 and ::1 (uWSGI takes any), and said so only per
    connection. Now the start says it, once; not for a loopback address,
    nor once --uwsgi-allow-from is given."""
    cases = [(["--uwsgi-socket", f"0.0.0.0:{free_port()}"], True),
             (["--uwsgi-socket", f"127.0.0.1:{free_port()}"], False),
             (["--uwsgi-socket", f"0.0.0.0:{free_port()}", "--uwsgi-allow-from", "10.0.0.0/8"], False)]
    for args, said in cases:
        s = ServerProc("uwsgi_apps:app", *args)           # with an HTTP --bind too: ServerProc's ready check
        servers.append(s)
        assert wait_for(lambda: "Booted worker" in s.log()), s.log()
        assert ("takes uwsgi requests from 127.0.0.1 and ::1 only" in s.log()) == said, (args, s.log())
