"""The command line: one clear line for every mistake, signals, bind forms."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import HERE, ServerProc
from httpraw import Conn, bytes_waiting, in_app_header, wait_for, wait_in_app

from forkwsgi import config

# Command-line handling; the app mode does not matter.
APP_MODES = ("inline",)


def run_cli(*args, timeout=20, cwd=HERE):
    # The caller's PYTHONPATH stays after HERE (as in conftest.ServerProc):
    # without it `python -m forkwsgi` ran whatever forkwsgi is installed,
    # not the tree under test.
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "forkwsgi", *args], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def one_line_error(rc, err, needle):
    assert rc != 0
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("forkwsgi: error:") and needle in lines[0], err


def test_help_lists_every_setting_with_default():
    rc, out, err = run_cli("--help")
    assert rc == 0
    for s in config.SETTINGS:
        assert s.flags[-1] in out, s.flags
    assert "(default: 127.0.0.1:8000)" in out
    assert "(default: 10.0)" in out          # header timeout
    assert "(default: 1073741824)" in out    # body limit


@pytest.mark.parametrize("args,needle", [
    (["no_such_module_xyz:app"], "no module named 'no_such_module_xyz'"),
    (["apps:no_such_attr"], "has no attribute 'no_such_attr'"),
    (["apps"], "has no attribute 'application'"),
    (["apps:echo", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["apps:echo", "--keep-alive", "soon"], "invalid value for --keep-alive"),
    (["apps:echo", "--backlog", "0"], "invalid value for --backlog"),
    # past a C int: refused at start, not by the worker (a traceback and exit 3 before)
    (["apps:echo", "--max-connections", "99999999999"], "--max-connections (command line): '99999999999': "
                                                        "must be at most 2147483647"),
    (["apps:echo", "--body-min-rate", "3G"], "--body-min-rate (command line): '3G': must be at most"),
    (["apps:echo", "--threads", "4294967297"], "invalid value for --threads"),
    (["apps:echo", "--bind", "nonsense"], "bind address 'nonsense'"),
    (["apps:echo", "--bind", "127.0.0.1:99999"], "invalid port"),
    (["apps:echo", "--bind", "fd://notanumber"], "fd://N needs a number"),
    (["apps:echo", "--chdir", "/no/such/dir"], "cannot change to /no/such/dir"),
    (["apps:echo", "-c", "/no/such/config.py"], "cannot read config file"),
    ([], "no app given"),
    (["apps:_counter_lock"], "is not callable"),
])
def test_bad_usage_is_one_line(args, needle):
    rc, out, err = run_cli(*args)
    one_line_error(rc, err, needle)


def test_port_in_use():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        rc, out, err = run_cli("apps:echo", "--bind", f"127.0.0.1:{port}")
        one_line_error(rc, err, "Address already in use")
    finally:
        s.close()


def test_import_error_inside_app_module_is_shown(tmp_path):
    (tmp_path / "broken_app.py").write_text("import not_installed_dependency_xyz\napp = None\n")
    rc, out, err = run_cli("broken_app:app", cwd=str(tmp_path))
    assert rc != 0 and "not_installed_dependency_xyz" in err


def test_factory_and_chdir(tmp_path, make_server):
    (tmp_path / "fac.py").write_text(
        "def make(greeting='hi'):\n"
        "    def app(e, sr):\n"
        "        sr('200 OK', [])\n"
        "        return [greeting.encode()]\n"
        "    return app\n")
    s = make_server("fac:make()", "--chdir", str(tmp_path))
    assert s.get("/").body == b"hi"
    s2 = make_server("fac:make('hello')", "--chdir", str(tmp_path))
    assert s2.get("/").body == b"hello"


def test_config_file_and_env(tmp_path, make_server):
    cfg = tmp_path / "conf.py"
    cfg.write_text("keepalive = 0\nlimit_request_fields = 3\n")
    s = make_server("apps:echo", "-c", str(cfg))
    r = s.get("/")
    assert r.header("connection") == "close"
    assert s.get("/", b"A: 1\r\nB: 2\r\nC: 3\r\n").status == 431
    # env overrides the file, the command line overrides env
    s2 = make_server("apps:echo", "-c", str(cfg), env={"FORKWSGI_LIMIT_REQUEST_FIELDS": "10"})
    assert s2.get("/", b"A: 1\r\nB: 2\r\nC: 3\r\n").status == 200
    s3 = make_server("apps:echo", "-c", str(cfg), "--limit-request-fields", "2",
                     env={"FORKWSGI_LIMIT_REQUEST_FIELDS": "10"})
    assert s3.get("/", b"A: 1\r\nB: 2\r\n").status == 431


def test_unix_socket_bind(tmp_path, make_server):
    path = str(tmp_path / "s.sock")
    s = make_server("apps:echo", bind=[f"unix:{path}"])
    assert s.unix_path == path
    with Conn(None, path=path) as c:
        c.send(b"GET /u HTTP/1.1\r\nHost: a\r\n\r\n")
        import json
        d = json.loads(c.read_response().body)
        assert d["path"] == "/u" and d["server_name"] == path and d["server_port"] == ""
        assert d["remote_addr"] == "" and d["remote_port"] == ""


def test_the_unix_socket_file_is_kept_by_a_reload_and_removed_at_the_stop(tmp_path, make_server):
    """Hostile review (gunicorn migration): the unix socket's file was left
    behind at the stop; gunicorn removes it. An in-place reload (SIGHUP)
    keeps it, and serves on it."""
    path = str(tmp_path / "s.sock")
    s = make_server("apps:echo", "--workers", "1", bind=[f"unix:{path}"])
    before = s.worker_pids()
    s.signal(signal.SIGHUP)
    assert wait_for(lambda: s.worker_pids() and not set(s.worker_pids()) & set(before), timeout=20), s.log()
    assert os.path.exists(path)
    with Conn(None, path=path) as c:
        c.send(b"GET /u HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 200
    s.signal(signal.SIGTERM)
    s.proc.wait(20)
    assert not os.path.exists(path), s.log()[-2000:]


def test_fd_bind(make_server):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=HERE)
    p = subprocess.Popen([sys.executable, "-m", "forkwsgi", "apps:echo", "--bind", f"fd://{sock.fileno()}"],
                         pass_fds=[sock.fileno()], env=env, cwd=HERE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sock.close()
        from httpraw import request
        assert wait_for(lambda: _can_connect(port), timeout=10)
        assert request(port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").status == 200
    finally:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(10)


def _can_connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_two_binds(make_server):
    s = make_server("apps:echo", bind=["127.0.0.1:0", "127.0.0.1:0"])
    import re

    def ports():
        return [int(p) for p in re.findall(r"Listening at: http://127.0.0.1:(\d+)", s.log())]
    # The server answers on the first before the log says the second (seen
    # under the ASan build beside another suite run: 1 line of 2).
    assert wait_for(lambda: len(ports()) == 2, timeout=10), s.log()
    from httpraw import request
    for p in ports():
        assert request(p, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").status == 200


def test_sigterm_finishes_in_flight_request(make_server, tmp_path):
    s = make_server("apps:sleep")
    c = Conn(s.port, timeout=10)
    mark = tmp_path / "in-app"
    c.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: a\r\n" + in_app_header(mark) + b"\r\n")
    assert wait_in_app(mark)
    s.signal(signal.SIGTERM)
    r = c.read_response()
    assert r.status == 200 and r.body == b"slept"
    assert r.header("connection") == "close"
    assert s.proc.wait(10) == 0
    assert "stopping gracefully" in s.log()


def test_sigterm_closes_idle_connections(make_server):
    s = make_server("apps:echo", "--keep-alive", "60")
    c = Conn(s.port)
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    c.read_response()
    s.signal(signal.SIGTERM)
    assert c.is_closed(5)
    assert s.proc.wait(10) == 0


def test_graceful_timeout_bounds_the_stop(make_server):
    s = make_server("apps:big", "--graceful-timeout", "1")
    c = Conn(s.port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.send(b"GET /?mb=500 HTTP/1.1\r\nHost: a\r\n\r\n")   # never read
    assert wait_for(lambda: bytes_waiting(c.sock) > 0)     # the response is on its way
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.proc.wait(10) == 0
    assert time.monotonic() - t0 < 5
    c.close()



@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGQUIT])
def test_fast_stop(make_server, sig):
    s = make_server("apps:echo")
    assert s.get("/").status == 200
    s.signal(sig)
    assert s.proc.wait(10) == 0
    assert "Traceback" not in s.log()


@pytest.mark.parametrize("balance", config.BALANCE_MODES)
def test_port_of_a_reuseport_server_is_refused_in_every_mode(balance):
    """A port another server listens on with SO_REUSEPORT would take any
    SO_REUSEPORT socket of the same user into its group, sharing its
    connections between two apps: --balance reuseport refuses it too."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        rc, out, err = run_cli("apps:echo", "--bind", f"127.0.0.1:{port}", "--balance", balance,
                               "--workers", "2", timeout=10)
        one_line_error(rc, err, "Address already in use")
    finally:
        s.close()


def test_env_names_are_the_flags_and_the_settings():
    _, cfg = config.load(["apps:echo"], {"FORKWSGI_KEEP_ALIVE": "2", "FORKWSGI_LIMIT_REQUEST_BODY": "1K"})
    assert cfg["keepalive"] == 2 and cfg["limit_request_body"] == 1024
    _, cfg = config.load(["apps:echo"], {"FORKWSGI_KEEPALIVE": "3"})
    assert cfg["keepalive"] == 3
    with pytest.raises(config.ConfigError, match="FORKWSGI_KEEP_ALIVE and FORKWSGI_KEEPALIVE"):
        config.load(["apps:echo"], {"FORKWSGI_KEEP_ALIVE": "2", "FORKWSGI_KEEPALIVE": "3"})


def test_env_variable_that_is_no_setting_is_named_in_a_warning(make_server):
    s = make_server("apps:echo", env={"FORKWSGI_KEEP_ALIVE": "0", "FORKWSGI_WORKER": "3"})
    assert s.get("/").header("connection") == "close"      # the documented spelling works
    warned = [line for line in s.log().splitlines() if "[WARNING]" in line]
    assert len(warned) == 1, s.log()
    assert "FORKWSGI_WORKER is not a setting" in warned[0] and "FORKWSGI_WORKERS" in warned[0]


def test_keep_alive_default_outlasts_the_proxies_upstream_idle_timeouts():
    # nginx upstream keepalive_timeout and cloud load balancers: 60 s; the
    # proxy must be the one to close an idle pooled connection.
    assert config.defaults()["keepalive"] > 60
    rc, out, err = run_cli("--help")
    assert f"(default: {config.defaults()['keepalive']})" in out


def print_config(*args, env=None, cwd=HERE, app="apps:hello"):
    # The caller's PYTHONPATH after HERE: the tree under test is the one run.
    e = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in [k for k in e if k.startswith("FORKWSGI_") or k in ("PORT", "WEB_CONCURRENCY")]:
        del e[k]
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "forkwsgi", *([app] if app else []), *args, "--print-config"],
                       capture_output=True, text=True, timeout=20, env=e, cwd=cwd)
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        name, _, rest = line.partition(" = ")
        value, _, origin = rest.rpartition("  (")
        out[name.strip()] = (value, origin.rstrip(")"))
    return out


def test_settings_precedence_gunicorn_order(tmp_path):
    """Least to most authoritative, as gunicorn: defaults (WEB_CONCURRENCY and
    PORT set those of --workers and --bind), the config file, FORKWSGI_*
    variables, FORKWSGI_CMD_ARGS, the command line. --print-config says
    where each setting came from."""
    conf = tmp_path / "conf.py"
    conf.write_text("workers = 2\nthreads = 3\nbacklog = 100\nkeepalive = 5\ntimeout = 7\n")
    got = print_config("-c", str(conf), "--timeout", "9",
                       env={"WEB_CONCURRENCY": "6", "PORT": "5005", "FORKWSGI_THREADS": "4",
                            "FORKWSGI_CMD_ARGS": "--backlog 200 --keep-alive 11 --timeout 8"})
    assert got["bind"] == ("['0.0.0.0:5005']", "PORT")
    assert got["workers"] == ("2", f"config file {conf}")
    assert got["threads"] == ("4", "FORKWSGI_THREADS")
    assert got["backlog"] == ("200", "FORKWSGI_CMD_ARGS")
    assert got["keepalive"] == ("11.0", "FORKWSGI_CMD_ARGS")
    assert got["timeout"] == ("9.0", "command line")
    assert got["max_requests"] == ("0", "default")
    got = print_config(env={"WEB_CONCURRENCY": "6", "PORT": "5005", "FORKWSGI_BIND": "127.0.0.1:7007"})
    assert got["workers"] == ("6", "WEB_CONCURRENCY")
    assert got["bind"] == ("['127.0.0.1:7007']", "FORKWSGI_BIND")


def test_print_config_shows_the_app_and_the_hooks(tmp_path):
    """--print-config shows what the server would run: the app (from the
    command line, or wsgi_app in a config file) and the server hooks the
    config file defines, each with where it came from."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text('wsgi_app = "apps:echo"\nworkers = 2\n'
                    'def on_starting(server):\n    pass\n'
                    'def post_fork(server, worker):\n    pass\n')
    got = print_config("-c", str(conf), app=None)
    assert got["app"] == ("'apps:echo'", f"config file {conf}")
    assert got["hooks"] == ("on_starting, post_fork", f"config file {conf}")
    assert got["workers"] == ("2", f"config file {conf}")
    got = print_config("-c", str(conf))                  # the command line's app wins
    assert got["app"] == ("'apps:hello'", "command line")
    got = print_config()
    assert got["hooks"] == ("none", "none defined")


def test_check_config(tmp_path):
    """--check-config: exit 0 when the settings are valid and the app imports;
    1 with one line per problem otherwise, a name in the config file that is
    no setting among them (with a did-you-mean); the same name is only a
    warning when the server starts."""
    good = tmp_path / "good.py"
    good.write_text("import os\nworkers = 2\n_private = 1\ndef helper():\n    pass\n")
    rc, out, err = run_cli("apps:hello", "-c", str(good), "--check-config")
    assert rc == 0 and "configuration OK" in out, (out, err)
    bad = tmp_path / "bad.py"
    bad.write_text("workerz = 2\nkeepalive = 5\n")
    rc, out, err = run_cli("apps:hello", "-c", str(bad), "--check-config")
    assert rc == 1 and "'workerz' is not a setting: ignored (did you mean workers?)" in err, err
    rc, out, err = run_cli("apps:no_such_app", "--check-config")
    assert rc == 1 and "no_such_app" in err, err
    rc, out, err = run_cli("apps:hello", "--bind", "nowhere:xx", "--check-config")
    assert rc == 1 and "invalid port" in err, err


def test_a_typo_in_the_config_file_is_named_at_start(tmp_path, make_server):
    conf = tmp_path / "conf.py"
    conf.write_text("keepalive = 5\nthraeds = 4\n")
    s = make_server("apps:hello", "-c", str(conf))
    assert "'thraeds' is not a setting: ignored (did you mean threads?)" in s.log()


# A gunicorn config file as they are written: helper variables and
# constants around the settings (gunicorn ignores every name that is not
# one of its settings).
HELPERS_CONF = """import multiprocessing, os
BASE_DIR = os.path.dirname(os.path.abspath(__file__))
LOG_DIR = os.path.join(BASE_DIR, "logs")
cpu = multiprocessing.cpu_count()
cores = cpu
host = os.getenv("HOST", "127.0.0.1")
port = os.getenv("PORT", "0")
use_bind = f"{host}:{port}"
use_loglevel = "info"
workers_per_core = 1.0
max_workers_str = "2"
timeout_str = "30"
log_data = {"workers": 1}
def on_demand(x):
    return x
class Helper:
    pass
bind = use_bind
loglevel = use_loglevel
workers = 1
timeout = int(timeout_str)
"""


def test_helper_names_in_a_config_file_are_ignored_typos_are_not(tmp_path, make_server):
    """Names that are no setting of forkwsgi's or gunicorn's, and no near miss
    of one (helper variables, ALL_CAPS constants, functions, classes), are
    ignored silently, at start and under --check-config. A typo of a setting
    and a gunicorn setting with no counterpart here are still named: a
    warning at start; under --check-config the typo is an error, the gunicorn
    setting a warning (gunicorn's --check-config passes it too)."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(HELPERS_CONF)
    rc, out, err = run_cli("apps:hello", "-c", str(conf), "--check-config")
    assert rc == 0 and "configuration OK" in out and err == "", (out, err)
    s = make_server("apps:hello", "-c", str(conf))
    assert s.get("/").status == 200
    log = s.log()
    assert "WARNING" not in log and "not a setting" not in log, log

    conf.write_text(HELPERS_CONF + 'thraeds = 4\nworker_tmp_dir = "/dev/shm"\n')
    rc, out, err = run_cli("apps:hello", "-c", str(conf), "--check-config")
    assert rc == 1, (out, err)
    problems = [ln for ln in err.splitlines() if ln.startswith("forkwsgi: error:")]
    assert len(problems) == 1, err
    assert "'thraeds' is not a setting: ignored (did you mean threads?)" in problems[0]
    warned = [ln for ln in err.splitlines() if ln.startswith("forkwsgi: warning:")]
    assert len(warned) == 1 and "'worker_tmp_dir' (gunicorn) has no counterpart here" in warned[0], err
    s = make_server("apps:hello", "-c", str(conf))
    warned = [ln for ln in s.log().splitlines() if "WARNING" in ln]
    assert len(warned) == 2 and "thraeds" in warned[0] and "worker_tmp_dir" in warned[1], warned


@pytest.mark.parametrize("workers", ["2", "0"], ids=["master", "no-master"])
def test_ops_flags_pid_env_pythonpath_name_umask(tmp_path, make_server, workers):
    """gunicorn's operations flags: --pid (the master's PID, written once
    bound, removed at exit), --env KEY=VALUE, --pythonpath, --name (in the
    process titles), --umask (the unix sockets' only, as gunicorn's: a
    file the app makes gets the process's umask; it got --umask's, which
    left log files unreadable to a log shipper), --preload (accepted: the
    default)."""
    mask = os.umask(0o022)
    os.umask(mask)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "opsapp.py").write_text(
        "import os\n"
        "def app(environ, start_response):\n"
        "    path = os.path.join(os.environ['FW_OUT_DIR'], 'made')\n"
        "    open(path, 'w').close()\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [('%s %o' % (os.environ['FW_GREETING'], os.stat(path).st_mode & 0o777)).encode()]\n")
    pid = tmp_path / "run" / "app.pid"
    pid.parent.mkdir()
    s = make_server("opsapp:app", "--workers", workers, "--pid", str(pid), "--env", "FW_GREETING=hello there",
                    "--env", f"FW_OUT_DIR={tmp_path}", "--pythonpath", f"{tmp_path / 'nowhere'},{lib}",
                    "--name", "shop", "--umask", "027", "--preload")
    assert s.get("/").body == b"hello there %o" % (0o666 & ~mask)
    assert pid.read_text().strip() == str(s.pid)
    with open(f"/proc/{s.pid}/cmdline", "rb") as f:
        title = f.read().split(b"\0")[0].decode()
    assert title.endswith("[shop]") or workers == "0", title
    if workers != "0":
        # A worker forked a moment ago still has the master's title until
        # it sets its own (CI's 3.13 run read it in that moment once).
        def title_of(p):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    return f.read().split(b"\0")[0].decode()
            except OSError:
                return None
        worker = s.worker_pids()[0]
        assert wait_for(lambda: title_of(worker) in ("forkwsgi: worker 1 [shop]", "forkwsgi: worker 2 [shop]")), \
            title_of(worker)
    s.stop()
    assert not pid.exists()


@pytest.mark.parametrize("how", ["flag", "SCRIPT_NAME"])
def test_root_path_mounts_the_app_under_a_prefix(tmp_path, make_server, how):
    """--root-path (or SCRIPT_NAME in the environment, as gunicorn reads it):
    behind a proxy that passes the full path, SCRIPT_NAME is the prefix and
    PATH_INFO what follows it; a path outside the prefix passes as it is."""
    (tmp_path / "where.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [('%s|%s' % (environ['SCRIPT_NAME'], environ['PATH_INFO'])).encode()]\n")
    if how == "flag":
        s = make_server("where:app", "--root-path", "/shop/", "--chdir", str(tmp_path))
    else:
        s = make_server("where:app", "--chdir", str(tmp_path), env={"SCRIPT_NAME": "/shop"})
    assert s.get("/shop/items/3").body == b"/shop|/items/3"
    assert s.get("/shop").body == b"/shop|"
    assert s.get("/shopping").body == b"/shop|/shopping"
    assert s.get("/other").body == b"/shop|/other"


def test_bind_on_every_ipv6_address_serves_ipv4_clients_too():
    """Issue 24, item 6: --bind [::]:PORT set IPV6_V6ONLY, so a service
    moved from gunicorn (whose [::] takes IPv4 too, as the system has it)
    stopped answering 127.0.0.1. Both families are served now."""
    s = ServerProc("apps:hello", bind=["[::]:0"])
    try:
        with Conn(s.port, host="127.0.0.1") as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
        with Conn(s.port, host="::1") as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
    finally:
        s.stop()
