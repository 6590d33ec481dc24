"""gunicorn's config files (issue 11): its setting names and its server
hooks, each called in the right process at the right moment. The config
file below is written as for gunicorn: gunicorn's names only."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import HERE, ServerProc
from httpraw import Conn, wait_for

APP_MODES = ("inline",)

CONF = '''
import os
workers = 2
threads = 2
loglevel = "info"
accesslog = {access!r}
access_log_format = "%(s)s %(U)s"
proc_name = "hooked"
worker_connections = 500
preload_app = True
keepalive = 80
raw_env = ["FW_FROM_CONF=yes"]
worker_class = "gthread"
timeout = {timeout}

def _note(*words):
    with open({notes!r}, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\\n")

def on_starting(server): _note("on_starting", os.getpid(), server.cfg.workers, server.cfg.loglevel)
def when_ready(server): _note("when_ready", os.getpid(), server.pid)
def on_reload(server): _note("on_reload", os.getpid())
def pre_fork(server, worker): _note("pre_fork", os.getpid(), worker.age, worker.pid)
def post_fork(server, worker): _note("post_fork", os.getpid(), worker.pid, worker.ppid)
def post_worker_init(worker): _note("post_worker_init", os.getpid(), worker.app is not None)
def worker_int(worker): _note("worker_int", os.getpid())
def worker_abort(worker): _note("worker_abort", os.getpid())
def pre_exec(server): _note("pre_exec", os.getpid())
def pre_request(worker, req): _note("pre_request", os.getpid(), req.method, req.path)
def post_request(worker, req, environ, resp): _note("post_request", os.getpid(), req.path, resp.status_code, resp.sent)
def child_exit(server, worker): _note("child_exit", os.getpid(), worker.pid)
def worker_exit(server, worker): _note("worker_exit", os.getpid(), worker.pid)
def nworkers_changed(server, new_value, old_value): _note("nworkers_changed", os.getpid(), new_value, old_value)
def on_exit(server): _note("on_exit", os.getpid())
'''


def notes(path):
    if not os.path.exists(path):
        return []
    return [ln.split() for ln in open(path).read().splitlines()]


def named(path, name):
    return [n for n in notes(path) if n[0] == name]


def start(tmp_path, app="apps:hello", timeout=30):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(CONF.format(access=str(tmp_path / "access.log"), notes=str(tmp_path / "notes"),
                                timeout=timeout))
    s = ServerProc(app, "-c", str(conf))
    return s, str(tmp_path / "notes")


def test_every_hook_in_the_right_process_at_the_right_moment(tmp_path):
    s, path = start(tmp_path)
    try:
        assert wait_for(lambda: len(named(path, "post_worker_init")) == 2, 15), notes(path)
        master = str(s.pid)
        assert named(path, "on_starting") == [["on_starting", master, "2", "INFO"]]
        assert named(path, "when_ready") == [["when_ready", master, master]]
        assert [n[1] for n in named(path, "pre_fork")] == [master, master]
        assert [n[2] for n in named(path, "pre_fork")] == ["1", "2"]             # worker.age
        workers = sorted(str(p) for p in s.worker_pids())
        assert sorted(n[1] for n in named(path, "post_fork")) == workers
        assert all(n[1] == n[2] and n[3] == master for n in named(path, "post_fork"))
        assert sorted(n[1] for n in named(path, "post_worker_init")) == workers
        # The order at start (gunicorn's): nworkers_changed (None -> 2), on_starting, when_ready,
        # then per worker pre_fork (master) before its post_fork.
        order = [n[0] for n in notes(path)]
        assert order[0] == "nworkers_changed" and named(path, "nworkers_changed") == [
            ["nworkers_changed", master, "2", "None"]]
        assert order.index("on_starting") < order.index("when_ready") < order.index("pre_fork") < order.index("post_fork")

        # A request: pre_request and post_request in the worker that served it.
        with Conn(s.port) as c:
            c.send(b"GET /hello?x=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            r = c.read_response()
        assert r.status == 200
        assert wait_for(lambda: named(path, "post_request"), 5)
        pre, post = named(path, "pre_request")[0], named(path, "post_request")[0]
        assert pre[1] in workers and pre[2:] == ["GET", "/hello"]
        assert post[1] == pre[1] and post[2:] == ["/hello", "200", str(len(r.body))]

        # SIGTTIN / SIGTTOU: nworkers_changed in the master; the retired worker's exit hooks.
        s.signal(signal.SIGTTIN)
        assert wait_for(lambda: len(named(path, "post_worker_init")) == 3, 10)
        assert named(path, "nworkers_changed")[1:] == [["nworkers_changed", master, "3", "2"]]
        s.signal(signal.SIGTTOU)
        assert wait_for(lambda: len(named(path, "child_exit")) == 1, 10), notes(path)
        assert named(path, "nworkers_changed")[2] == ["nworkers_changed", master, "2", "3"]
        gone = named(path, "child_exit")[0]
        assert gone[1] == master
        assert ["worker_exit", gone[2], gone[2]] in named(path, "worker_exit")

        # SIGHUP: on_reload and pre_exec in the master (the in-place reload), new workers.
        before = set(s.worker_pids())
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: named(path, "pre_exec") and not before & set(s.worker_pids())
                        and len(s.worker_pids()) == 2, 20), notes(path)
        assert named(path, "on_reload") == [["on_reload", master]]
        assert named(path, "pre_exec") == [["pre_exec", master]]
        assert len(named(path, "on_starting")) == 1 and len(named(path, "when_ready")) == 1

        # A stop: every worker's worker_exit, the master's child_exit for each, then on_exit.
        alive = sorted(str(p) for p in s.worker_pids())
        s.signal(signal.SIGTERM)
        s.proc.wait(20)
        exits = {n[1] for n in named(path, "worker_exit")}
        assert set(alive) <= exits
        assert set(alive) <= {n[2] for n in named(path, "child_exit")}
        assert notes(path)[-1] == ["on_exit", master]
        # gunicorn's names took effect.
        log = s.log()
        assert "2 worker(s) x 2 thread(s)" in log
        assert wait_for(lambda: os.path.exists(tmp_path / "access.log") and
                        "200 /hello" in (tmp_path / "access.log").read_text(), 5)
        assert "is not a setting" not in log and "no counterpart" not in log, log
        assert " raised" not in log, log                 # no hook failed (an attribute missing, ...)
    finally:
        s.stop()


def test_worker_int_and_worker_abort(tmp_path):
    s, path = start(tmp_path, app="apps:sleep", timeout=1)
    try:
        assert wait_for(lambda: len(named(path, "post_worker_init")) == 2, 15)
        victim = s.worker_pids()[0]
        os.kill(victim, signal.SIGINT)
        assert wait_for(lambda: ["worker_int", str(victim)] in named(path, "worker_int"), 10), notes(path)
        # --timeout (gunicorn's timeout = 1): worker_abort in the stuck worker before it is killed.
        with Conn(s.port, timeout=10) as c:
            c.send(b"GET /?t=5 HTTP/1.1\r\nHost: t\r\n\r\n")
            assert wait_for(lambda: named(path, "worker_abort"), 10), (notes(path), s.log())
        stuck = named(path, "worker_abort")[0][1]
        assert stuck != str(s.pid)
    finally:
        s.stop()


# Hooks that use what real gunicorn hooks use of server, worker, req and
# resp; each records what it saw as one JSON line. An attribute missing
# would raise in the hook: logged ("hook ... raised"), which fails the test.
ATTRS_CONF = '''
import json, os
workers = 2
threads = 2
max_requests = 1000
timeout = 25

def _fact(hook, **values):
    with open({facts!r}, "a") as f:
        f.write(json.dumps(dict(values, hook=hook, pid=os.getpid())) + "\\n")

def _server(server):
    return dict(address=server.address, listeners=[str(s) for s in server.LISTENERS],
                fds=[s.fileno() for s in server.LISTENERS], workers=sorted(server.WORKERS),
                ages=sorted(w.age for w in server.WORKERS.values()),
                proc_name=server.proc_name, num_workers=server.num_workers,
                worker_class=server.cfg.worker_class, cfg_address=server.cfg.address,
                preload_app=server.cfg.preload_app)

def _worker(worker):
    return dict(nr=worker.nr, max_requests=worker.max_requests, timeout=worker.timeout,
                sockets=[str(s) for s in worker.sockets],
                wpid=worker.pid)

def nworkers_changed(server, new_value, old_value):
    _fact("nworkers_changed", new=new_value, old=old_value, **_server(server))
def on_starting(server): _fact("on_starting", **_server(server))
def when_ready(server): _fact("when_ready", **_server(server))
def post_fork(server, worker): _fact("post_fork", **_worker(worker))
def pre_request(worker, req):
    _fact("pre_request", scheme=req.scheme, peer=req.peer_addr, fragment=req.fragment, uri=req.uri,
          body=req.body is not None, **_worker(worker))
def post_request(worker, req, environ, resp):
    _fact("post_request", length=resp.response_length, sent=resp.sent, **_worker(worker))
def child_exit(server, worker): _fact("child_exit", **_server(server), **_worker(worker))
def worker_exit(server, worker): _fact("worker_exit", **_worker(worker))
'''


def facts(path, hook):
    if not os.path.exists(path):
        return []
    return [f for f in map(json.loads, open(path).read().splitlines()) if f["hook"] == hook]


@pytest.mark.parametrize("lazy", [False, True], ids=["preloaded", "lazy-apps"])
def test_hooks_see_gunicorns_attributes(tmp_path, lazy):
    """server.address, .LISTENERS, .WORKERS, .proc_name, .num_workers,
    .cfg.worker_class, .cfg.address, .cfg.preload_app; worker.nr,
    .max_requests, .timeout, .sockets; req.scheme, .peer_addr, .fragment,
    .body; resp.response_length: each as gunicorn gives it, read from
    inside the hooks of a real server. nworkers_changed(server, 2, None)
    comes first, as in gunicorn."""
    conf = tmp_path / "gunicorn.conf.py"
    path = str(tmp_path / "facts")
    conf.write_text(ATTRS_CONF.format(facts=path))
    # A gunicorn config file without preload_app is not preloaded (gunicorn's default).
    s = ServerProc("apps:echo", "-c", str(conf), *(["--lazy-apps"] if lazy else ["--preload"]))
    try:
        assert wait_for(lambda: len(facts(path, "post_fork")) == 2, 15)
        url = f"http://127.0.0.1:{s.port}"
        (changed,) = facts(path, "nworkers_changed")
        assert (changed["new"], changed["old"], changed["pid"]) == (2, None, s.pid)
        assert [f["hook"] for f in map(json.loads, open(path).read().splitlines())][:3] == \
            ["nworkers_changed", "on_starting", "when_ready"]
        (ready,) = facts(path, "when_ready")
        assert ready["address"] == [["127.0.0.1", s.port]] and ready["listeners"] == [url]
        assert ready["cfg_address"] == [["127.0.0.1", 0]]            # as configured: --bind 127.0.0.1:0
        assert all(isinstance(fd, int) and fd >= 0 for fd in ready["fds"])
        assert ready["proc_name"] == "apps:echo" and ready["num_workers"] == 2
        assert ready["worker_class"] == "gthread"                    # threads = 2
        assert ready["preload_app"] is (not lazy)
        for f in facts(path, "post_fork"):
            assert f["wpid"] == f["pid"] and f["nr"] == 0
            assert f["max_requests"] == 1000 and f["timeout"] == 25 and f["sockets"] == [url]

        with Conn(s.port) as c:
            for i in range(3):
                c.send(f"GET /x?n={i}#frag HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                r = c.read_response()
                assert r.status == 200
            client_port = c.sock.getsockname()[1]
        assert wait_for(lambda: len(facts(path, "post_request")) == 3, 5)
        pre, post = facts(path, "pre_request")[0], facts(path, "post_request")[0]
        assert pre["scheme"] == "http" and pre["peer"] == ["127.0.0.1", client_port]
        assert pre["fragment"] == "frag" and pre["uri"] == "/x?n=0#frag" and pre["body"]
        assert post["length"] == post["sent"] == len(r.body)          # the app's Content-Length

        # SIGTTOU: nworkers_changed sees the two workers; the retired one's
        # child_exit (master) and worker_exit (itself) see its count.
        workers = sorted(s.worker_pids())
        s.signal(signal.SIGTTOU)
        assert wait_for(lambda: facts(path, "child_exit"), 10)
        ttou = facts(path, "nworkers_changed")[1]
        assert (ttou["new"], ttou["old"]) == (1, 2) and ttou["workers"] == workers and ttou["ages"] == [1, 2]
        s.signal(signal.SIGTERM)
        s.proc.wait(20)
        served = {f["wpid"]: f["nr"] for f in facts(path, "worker_exit")}
        assert sorted(served) == workers and sum(served.values()) == 3, served
        exited = facts(path, "child_exit")
        assert {f["wpid"]: f["nr"] for f in exited} == served
        assert exited[-1]["workers"] == []                           # the last one out
        log = s.log()
        assert " raised" not in log and "Traceback" not in log, log
    finally:
        s.stop()


def run_forkwsgi(*args, timeout=30):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "forkwsgi", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=HERE)


def test_gunicorn_names_without_counterpart_warn_typos_and_refusals_fail_check_config(tmp_path):
    conf = tmp_path / "g.conf.py"
    conf.write_text('wsgi_app = "apps:hello"\ndaemon = True\nenable_backlog_metric = True\n'
                    'worker_class = "gevent"\nworkerz = 3\n'
                    'def post_forkk(server, worker):\n    pass\n')
    p = run_forkwsgi("-c", str(conf), "--check-config")
    assert p.returncode == 1
    err = p.stderr
    assert "error: " in err and "'daemon' = True (gunicorn) has no counterpart here" in err and "systemd" in err
    assert "'enable_backlog_metric' (gunicorn) has no counterpart here" in err and "--metrics" in err
    assert "error: " in err and "worker class 'gevent' has no counterpart" in err
    assert "'workerz' is not a setting: ignored (did you mean workers?)" in err
    assert "function 'post_forkk' is no server hook" in err and "post_fork" in err
    # wsgi_app names the app: print-config shows gunicorn names under forkwsgi's.
    ok = tmp_path / "ok.conf.py"
    ok.write_text('wsgi_app = "apps:hello"\nloglevel = "debug"\naccesslog = "-"\nworker_connections = 77\n')
    p = run_forkwsgi("-c", str(ok), "--check-config")
    assert p.returncode == 0, p.stderr
    assert "configuration OK (apps:hello)" in p.stdout
    p = run_forkwsgi("-c", str(ok), "--print-config")
    assert "log_level             = 'DEBUG'" in p.stdout.replace("  (", " (") or "'DEBUG'" in p.stdout
    assert "max_connections" in p.stdout and "77" in p.stdout


def test_a_hook_with_the_wrong_arguments_is_a_one_line_error(tmp_path):
    conf = tmp_path / "bad.conf.py"
    conf.write_text("def pre_fork(server):\n    pass\n")
    p = run_forkwsgi("apps:hello", "-c", str(conf), "--bind", "127.0.0.1:0")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0
    assert "pre_fork must take 2 argument(s)" in p.stderr
