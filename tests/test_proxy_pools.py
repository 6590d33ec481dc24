"""forkwsgi behind the proxies users put in front of it, with pooled
keep-alive upstream connections (issue 9, items 1, 3 and 3b): nginx
(`keepalive 32`, HTTP/1.1, `Connection ""`) and HAProxy (`http-reuse
always`), from Debian's packages, run as this test's own processes on
127.0.0.1 with config files written here. wrk drives GET and POST load
through them for a few seconds, with reloads and --max-requests recycling
in the middle: every response must be 2xx (no 502/503/504) and no socket
error may reach the client.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import ServerProc
from httpraw import free_port, wait_for
from nginx_conf import nginx_conf
from test_handover import error_lines, pinned, wrk, wrk_cmd, wrk_report

APP_MODES = ("inline",)

NGINX = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
HAPROXY = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")
pytestmark = pytest.mark.skipif(not (NGINX and HAPROXY and shutil.which("wrk")),
                                reason="nginx, haproxy and wrk are installed by .ci/run")

# The proxies close idle upstream connections after 60 s; forkwsgi keeps
# them 75 s (its default): the proxy, never the server, ends an idle one.
NGINX_HTTP = """
    upstream app {{
        server 127.0.0.1:{upstream};
        keepalive 32;
        keepalive_timeout 60s;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""

HAPROXY_CONF = """
global
    maxconn 4000
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 60s
    http-reuse always
frontend web
    bind 127.0.0.1:{port}
    default_backend app
backend app
    server app1 127.0.0.1:{upstream} pool-purge-delay 60s
"""

POST_LUA = 'wrk.method = "POST"\nwrk.body = string.rep("x", 1024)\n' \
           'wrk.headers["Content-Type"] = "application/octet-stream"\n'


class Proxy:
    """nginx or haproxy in the foreground, in front of upstream_port."""

    def __init__(self, kind, upstream_port, tmp):
        self.kind, self.port, self.dir = kind, free_port(), str(tmp)
        conf = os.path.join(self.dir, kind + ".conf")
        with open(conf, "w") as f:
            if kind == "nginx":
                f.write(nginx_conf(self.dir, NGINX_HTTP.format(upstream=upstream_port, port=self.port)))
            else:
                f.write(HAPROXY_CONF.format(dir=self.dir, upstream=upstream_port, port=self.port))
        cmd = [NGINX, "-p", self.dir, "-e", os.path.join(self.dir, "error.log"), "-c", conf] \
            if kind == "nginx" else [HAPROXY, "-f", conf, "-db"]
        self.log = open(os.path.join(self.dir, kind + ".out"), "w")
        self.proc = subprocess.Popen(pinned(cmd, 0), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

        def up():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False
        assert wait_for(up, timeout=10), open(self.log.name).read()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)    # nginx's master and its worker
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


@pytest.fixture
def stack(tmp_path):
    made = []

    def make(kind, *server_args):
        s = ServerProc("apps:echo", *server_args)
        made.append(s)
        assert wait_for(lambda: len(s.worker_pids()) >= 1)
        p = Proxy(kind, s.port, tmp_path)
        made.append(p)
        return s, p

    yield make
    for x in reversed(made):
        x.stop()


def post_script(tmp_path):
    script = tmp_path / "post.lua"
    script.write_text(POST_LUA)
    return str(script)


def wrk_post(port, tmp_path, connections, seconds):
    return wrk(port, connections, seconds, script=post_script(tmp_path))


def connections_to(port):
    """ESTABLISHED TCP connections whose server end is 127.0.0.1:port (/proc/net/tcp)."""
    with open("/proc/net/tcp") as f:
        return sum(1 for line in f.readlines()[1:]
                   if line.split()[3] == "01" and int(line.split()[1].split(":")[1], 16) == port)


def reloaded(s, old):
    """Every worker of `old` replaced by a new one that booted."""
    pids = set(s.worker_pids())
    return len(pids) == len(old) and not pids & old and s.log().count("Booted worker") >= 2 * len(old)


def wrk_through_a_reload(s, workers, port, connections, script=None, least=4.0, bound=90):
    """wrk's keep-alive load through one SIGHUP, for as long as the reload
    takes: the SIGHUP once the proxy carries the load to the server, the
    load on until every worker is replaced and for a second more (on the
    new ones), `least` seconds in all at least; then wrk is stopped (SIGINT:
    it reports what it did). Returns wrk_report's tuple."""
    # Every worker booted first (the stack waits for one only), from one
    # reading of the master's children (a reading can come back short).
    old = set()
    assert wait_for(lambda: old.clear() or old.update(s.worker_pids()) or len(old) == workers, timeout=30), s.log()
    t0 = time.monotonic()
    proc = subprocess.Popen(wrk_cmd(port, connections, bound, script=script), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: connections_to(s.port) > 0, timeout=20), "no load reached the server"
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: reloaded(s, old), timeout=bound - 10), s.log()
        time.sleep(max(1.0, least - (time.monotonic() - t0)))     # the load's shape, not an event
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    return wrk_report(out)


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_get_load_through_a_pooling_proxy_with_a_reload(stack, kind):
    """Before: through HAProxy 16 non-2xx and 320 socket errors in 159k."""
    s, p = stack(kind, "--workers", "4", "--threads", "4")
    requests, errors, non2xx, out = wrk_through_a_reload(s, 4, p.port, 32)
    assert requests > 2000, out
    assert (errors, non2xx) == (0, 0), out
    assert s.log().count("Booted worker") >= 8
    assert error_lines(s) == []


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_posts_from_kept_alive_clients_through_a_pooling_proxy(stack, kind, tmp_path):
    s, p = stack(kind, "--workers", "4", "--threads", "4")
    requests, errors, non2xx, out = wrk_through_a_reload(s, 4, p.port, 16, script=post_script(tmp_path))
    assert requests > 1000, out
    assert (errors, non2xx) == (0, 0), out
    assert error_lines(s) == []


def test_posts_through_nginx_while_workers_recycle(stack, tmp_path):
    """4x1 (no hand-off on arrival) and --max-requests: each retiring worker
    hands its idle pooled connections to the others. Before: 5,145 x 502 in
    20 s with --max-requests 2000, from connections closed with a request
    waiting in them."""
    s, p = stack("nginx", "--workers", "4", "--max-requests", "300", "--max-requests-jitter", "50")
    requests, errors, non2xx, out = wrk_post(p.port, tmp_path, 16, 4)
    assert requests > 2000, out
    assert len(re.findall("max-requests", s.log())) >= 4
    assert (errors, non2xx) == (0, 0), out
    assert error_lines(s) == []
