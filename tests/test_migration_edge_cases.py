"""Edge cases of coming from gunicorn, uWSGI and bjoern (configs, command
lines, protocols) that broke: each test failed before its fix.

- --chmod-socket 666 (uWSGI's chmod-socket = 666) stopped the server: the
  worker parsed the master's number (438) again as octal digits.
- None in a config file was the text "None": gunicorn's own example config
  (user = None, pidfile = None) did not start.
- -e KEY=a,b (raw_env, an ini's env =) was split at the comma.
- A statsd host name whose lookup hangs blocked the master at each retry.
- bjoern's listen() + run(), unix:@name and statsd= failed.
- -b localhost and -b tcp://HOST:PORT (gunicorn's forms) were refused.
- --check-config on a config file that raises exited 2 (gunicorn: 1).
- A logging config with disable_existing_loggers: True silenced the server.
- uwsgi modifier1 30 took SCRIPT_NAME off the middle of a path segment.
- Behind uwsgi_pass the client saw Server: forkwsgi (uWSGI sends none).
"""
import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import HERE, ServerProc
from httpraw import Conn, wait_for
from test_supervision import free_port, healthz
from test_uwsgi_protocol import packet

APP_MODES = ("inline",)

ENV_APP = """
import os
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [os.environ.get(environ["QUERY_STRING"], "-").encode()]
"""


def get(port, path="/"):
    with Conn(port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        return c.read_response()


def read_to_close(sock):
    data = b""
    while True:
        d = sock.recv(65536)
        if not d:
            return data
        data += d


def forkwsgi(*args, cwd=HERE, timeout=30, env=None):
    e = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "forkwsgi", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=e)


@pytest.mark.parametrize("how", ["flag", "ini"])
def test_chmod_socket_666_starts_and_sets_the_mode(servers, tmp_path, how):
    path = tmp_path / "app.sock"
    if how == "flag":
        s = ServerProc("apps:hello", "--workers", "1", "--chmod-socket", "666", bind=[f"unix:{path}"])
    else:
        ini = tmp_path / "app.ini"
        ini.write_text(f"[uwsgi]\nmodule = apps:hello\nhttp-socket = {path}\nchmod-socket = 666\nprocesses = 1\n")
        s = ServerProc(None, "--ini", str(ini), bind=[])
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 1 and "Booted worker" in s.log(), 15), s.log()
    time.sleep(0.5)
    assert s.alive(), s.log()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    with Conn(None, path=str(path)) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200


def test_none_in_a_config_file_is_not_set(servers, tmp_path):
    """As gunicorn's examples/example_config.py writes them."""
    (tmp_path / "envapp.py").write_text(ENV_APP)
    conf = tmp_path / "example_config.py"
    conf.write_text("bind = '127.0.0.1:0'\nworkers = 1\nuser = None\ngroup = None\npidfile = None\n"
                    "proc_name = None\nstatsd_host = None\nchdir = None\numask = 0\ntmp_upload_dir = None\n")
    p = forkwsgi("-c", str(conf), "envapp:app", "--check-config", cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    p = forkwsgi("-c", str(conf), "envapp:app", "--print-config", cwd=str(tmp_path))
    assert "'None'" not in p.stdout, p.stdout
    s = ServerProc("envapp:app", "-c", str(conf), "--chdir", str(tmp_path))
    servers.append(s)
    assert get(s.port, "/?HOME").status == 200
    assert not (tmp_path / "None").exists()


def test_env_values_keep_their_commas(servers, tmp_path):
    (tmp_path / "envapp.py").write_text(ENV_APP)
    s = ServerProc("envapp:app", "--chdir", str(tmp_path), "-e", "ALLOWED_HOSTS=a.com,b.com",
                   "-e", "DB=postgres://h/db?x=a,B=c")
    servers.append(s)
    assert get(s.port, "/?ALLOWED_HOSTS").body == b"a.com,b.com"
    assert get(s.port, "/?DB").body == b"postgres://h/db?x=a,B=c"
    assert get(s.port, "/?B").body == b"-"


SLOW_DNS = """
import socket, time
_real = socket.getaddrinfo
def _slow(host, *a, **k):
    if host == "slow.statsd.test":
        time.sleep(3)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    return _real(host, *a, **k)
socket.getaddrinfo = _slow
import forkwsgi.statsd
forkwsgi.statsd.RETRY = 1.0
"""


def test_a_statsd_name_that_does_not_resolve_never_holds_the_master(servers, tmp_path):
    """The lookup waits 3 s and fails, and is tried again every second:
    /healthz (the master's loop) answers at once all the while."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_DNS)
    mport = free_port()
    s = ServerProc("apps:hello", "--workers", "1", "--statsd-host", "slow.statsd.test:8125",
                   "--metrics", f"127.0.0.1:{mport}",
                   env={"PYTHONPATH": os.pathsep.join([str(tmp_path), HERE, os.environ.get("PYTHONPATH", "")])})
    servers.append(s)
    def serving():
        try:
            return healthz(mport) < 1.0           # the master has the worker ready
        except (OSError, AssertionError):
            return False
    assert wait_for(serving, 20)
    worst, end = 0.0, time.monotonic() + 7
    while time.monotonic() < end:
        worst = max(worst, healthz(mport, timeout=10))
        time.sleep(0.1)
    assert worst < 1.0, worst


BJOERN = """
import sys, threading, time, socket
sys.path.insert(0, {here!r})
import forkwsgi as bjoern

def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"bjoern"]

form = sys.argv[1]
if form == "listen":
    bjoern.listen(app, "127.0.0.1", {port}, statsd={{"enable": True, "host": "127.0.0.1", "port": 8125}})
    bjoern.run()
else:
    bjoern.run(app, "unix:@{name}")
"""


@pytest.mark.parametrize("form", ["listen", "abstract"])
def test_bjoern_listen_then_run_and_abstract_sockets(tmp_path, form):
    port, name = free_port(), f"forkwsgi-test-{os.getpid()}"
    script = tmp_path / "bj.py"
    script.write_text(BJOERN.format(here=HERE, port=port, name=name))
    p = subprocess.Popen([sys.executable, str(script), form], cwd=str(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def ask():
            try:
                if form == "listen":
                    c = socket.create_connection(("127.0.0.1", port), timeout=2)
                else:
                    c = socket.socket(socket.AF_UNIX)
                    c.settimeout(2)
                    c.connect("\0" + name)
                with c:
                    c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    return read_to_close(c)
            except OSError:
                return b""
        assert wait_for(lambda: ask().endswith(b"bjoern"), 15)
        assert not (tmp_path / f"@{name}").exists()           # abstract: no file
    finally:
        p.terminate()
        out = p.communicate(timeout=10)[0].decode()
    if form == "listen":
        assert "statsd=: forkwsgi sends statsd metrics from its master" in out


@pytest.mark.parametrize("addr", ["localhost", "tcp://127.0.0.1:8001"])
def test_gunicorns_bind_forms(addr):
    p = forkwsgi("apps:hello", "-b", addr, "--check-config")
    assert p.returncode == 0, p.stderr
    p = forkwsgi("apps:hello", "-b", addr, "--print-config")
    assert "bind" in p.stdout


def test_check_config_of_a_config_file_that_raises_is_1(tmp_path):
    conf = tmp_path / "bad.py"
    conf.write_text("workers = 1 / 0\n")
    p = forkwsgi("-c", str(conf), "apps:hello", "--check-config")
    assert p.returncode == 1 and "ZeroDivisionError" in p.stderr, (p.returncode, p.stderr)


def test_disable_existing_loggers_does_not_silence_the_server(servers, tmp_path):
    out = tmp_path / "root.log"
    conf = tmp_path / "logconf.py"
    conf.write_text("logconfig_dict = {'version': 1, 'disable_existing_loggers': True,\n"
                    "    'handlers': {'f': {'class': 'logging.FileHandler', 'filename': %r}},\n"
                    "    'root': {'handlers': ['f'], 'level': 'INFO'}}\n" % str(out))
    s = ServerProc("apps:hello", "-c", str(conf), "--workers", "1", wait=False)
    servers.append(s)
    assert wait_for(lambda: out.exists() and "Booted worker" in out.read_text(), 15), \
        (out.read_text() if out.exists() else None, s.log())


@pytest.fixture(scope="module")
def uwsgi_server():
    s = ServerProc("uwsgi_apps:app", "--uwsgi-socket", "127.0.0.1:0", "--workers", "1")
    yield s
    s.stop()


def uwsgi_ask(s, variables, modifier1=0):
    port = int(s.log().split("uwsgi://127.0.0.1:")[1].split()[0])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(packet(variables, modifier1=modifier1))
        return read_to_close(c)


def test_modifier30_takes_whole_segments_only(uwsgi_server):
    from test_uwsgi_protocol import nginx_vars
    for path, script, seen in (("/application", "/app", b'"PATH_INFO": "/application"'),
                               ("/app/x", "/app", b'"PATH_INFO": "/x"')):
        data = uwsgi_ask(uwsgi_server, nginx_vars(uri=path, extra=[("SCRIPT_NAME", script)]), modifier1=30)
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        assert seen in data, data[-600:]


def test_no_server_header_behind_uwsgi_pass(uwsgi_server):
    from test_uwsgi_protocol import nginx_vars
    data = uwsgi_ask(uwsgi_server, nginx_vars())
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 200") and b"\r\nserver:" not in head, head
