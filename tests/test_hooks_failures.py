"""Server hooks that raise do what they do in gunicorn (hooks.FAILURE);
what pre_request changes of req reaches the app (gunicorn builds the
environ after it); the objects hooks get have gunicorn's attributes, or
an AttributeError that says what to use instead."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import HERE, ServerProc
from httpraw import Closed, Conn, wait_for

APP_MODES = ("inline",)

NOTE = '''
import json, os
def _note(*words):
    with open({notes!r}, "a") as f:
        f.write(json.dumps([str(w) for w in words]) + "\\n")
'''


def notes(path):
    if not os.path.exists(path):
        return []
    return [json.loads(ln) for ln in open(path).read().splitlines()]


def conf_file(tmp_path, body):
    notes_path = str(tmp_path / "notes")
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(NOTE.format(notes=notes_path) + body)
    return str(conf), notes_path


def run_forkwsgi(*args, timeout=30):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "forkwsgi", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=HERE)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                     # a zombie child of ours is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---- start: on_starting, when_ready, the first nworkers_changed ----------------

@pytest.mark.parametrize("hook,args", [("on_starting", "server"), ("when_ready", "server"),
                                       ("nworkers_changed", "server, new, old")])
def test_a_start_hook_that_raises_stops_the_start_with_exit_1(tmp_path, hook, args):
    conf, path = conf_file(tmp_path, f"def {hook}({args}):\n    raise RuntimeError('no config service')\n"
                                     "def pre_fork(server, worker): _note('pre_fork')\n")
    p = run_forkwsgi("apps:hello", "-c", conf, "--bind", "127.0.0.1:0", "-w", "2")
    assert p.returncode == 1, p.stderr
    assert f"hook {hook} raised: not starting (exit 1)" in p.stderr
    assert "RuntimeError: no config service" in p.stderr
    assert notes(path) == []                      # no worker was ever forked


# ---- a worker that cannot boot: post_fork, post_worker_init -------------------

@pytest.mark.parametrize("hook,args", [("post_fork", "server, worker"), ("post_worker_init", "worker")])
def test_a_boot_hook_that_raises_means_the_worker_cannot_boot_and_the_master_stops(tmp_path, hook, args):
    conf, path = conf_file(tmp_path, f"def {hook}({args}):\n    raise RuntimeError('no db pool')\n"
                                     "def worker_exit(server, worker): _note('worker_exit', os.getpid())\n"
                                     "def on_exit(server): _note('on_exit')\n")
    s = ServerProc("apps:hello", "-c", conf, "-w", "2", wait=False)
    try:
        assert s.proc.wait(20) == 3, s.log()
        log = s.log()
        assert f"hook {hook} raised: worker 1 cannot boot (exit 3)" in log or \
               f"hook {hook} raised: worker 2 cannot boot (exit 3)" in log, log
        assert "failed to boot: stopping" in log and "RuntimeError: no db pool" in log
        # As in gunicorn: worker_exit in the worker that could not boot; on_exit in the master.
        assert any(n[0] == "worker_exit" for n in notes(path)), notes(path)
        assert notes(path)[-1] == ["on_exit"]
    finally:
        s.stop()


def test_a_replacement_that_cannot_boot_never_serves_and_is_retried(tmp_path):
    """Once the server has served, a worker whose post_fork raises is not
    the end of the server (forkwsgi's back-off retries it while the others
    serve on), but it never serves without its hook's effect."""
    broken = tmp_path / "broken"
    conf, path = conf_file(tmp_path, f"def post_fork(server, worker):\n"
                                     f"    if os.path.exists({str(broken)!r}):\n"
                                     f"        raise RuntimeError('no db pool')\n"
                                     f"    _note('post_fork', os.getpid())\n")
    s = ServerProc("apps:pid", "-c", conf, "-w", "2")
    try:
        assert wait_for(lambda: len(notes(path)) == 2, 10)
        with Conn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
        broken.write_text("")
        victim, other = s.worker_pids()
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: s.log().count("hook post_fork raised") >= 1, 10), s.log()
        assert s.alive()
        served = {s.get("/").body.strip() for _ in range(6)}
        assert served == {str(other).encode()}           # only the worker that ran its post_fork
        os.unlink(broken)
        assert wait_for(lambda: len(notes(path)) == 3, 15), s.log()
        assert wait_for(lambda: len(s.worker_pids()) == 2, 10)
    finally:
        s.stop()


# ---- the master's loop: pre_fork, child_exit, on_reload, nworkers_changed ---------

@pytest.mark.parametrize("hook,args,trigger", [
    ("pre_fork", "server, worker", None),
    ("child_exit", "server, worker", "kill-worker"),
    ("on_reload", "server", signal.SIGHUP),
    ("nworkers_changed", "server, new, old", signal.SIGTTIN),
])
def test_a_master_hook_that_raises_stops_the_master_and_its_workers_with_exit_255(tmp_path, hook, args, trigger):
    cond = "old is not None" if hook == "nworkers_changed" else "True"
    conf, path = conf_file(tmp_path, f"def {hook}({args}):\n    if {cond}:\n        raise RuntimeError('hook bug')\n"
                                     "def on_exit(server): _note('on_exit')\n")
    s = ServerProc("apps:hello", "-c", conf, "-w", "2", wait=trigger is not None)
    try:
        workers = []
        if trigger is not None:
            assert wait_for(lambda: len(s.worker_pids()) == 2, 10)
            workers = s.worker_pids()
            if trigger == "kill-worker":
                os.kill(workers[0], signal.SIGKILL)
            else:
                s.signal(trigger)
        assert s.proc.wait(20) == 255, s.log()
        log = s.log()
        assert f"hook {hook} raised: the master stops now (exit 255)" in log, log
        assert "RuntimeError: hook bug" in log
        assert not [w for w in workers if alive(w)]
        assert notes(path)[-1] == ["on_exit"]
    finally:
        s.stop()


def test_on_exit_that_raises_makes_the_exit_status_1(tmp_path):
    conf, _ = conf_file(tmp_path, "def on_exit(server):\n    raise RuntimeError('cannot flush')\n")
    s = ServerProc("apps:hello", "-c", conf, "-w", "1")
    try:
        assert s.get("/").status == 200
        s.signal(signal.SIGTERM)
        assert s.proc.wait(20) == 1
        assert "hook on_exit raised: exit status 1" in s.log()
    finally:
        s.stop()


# ---- requests: pre_request guards, post_request is logged -------------------------

def test_a_pre_request_that_raises_answers_500_and_the_app_is_not_called(tmp_path):
    conf, path = conf_file(tmp_path, '''
def pre_request(worker, req):
    if req.path.startswith("/admin"):
        raise RuntimeError("blocked")
def post_request(worker, req, environ, resp):
    _note("post_request", req.path, environ == {}, resp is None)
''')
    entered = tmp_path / "entered"
    s = ServerProc("apps:sleep", "-c", conf, "-w", "1")
    try:
        with Conn(s.port) as c:
            c.send(f"GET /admin/x?t=0 HTTP/1.1\r\nHost: t\r\nX-Entered: {entered}\r\n\r\n".encode())
            r = c.read_response()
            assert r.status == 500
            with pytest.raises((Closed, ConnectionError)):    # closed after the error, as gunicorn's
                c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                c.read_response()
        assert not entered.exists()                   # the guard held: the app never ran
        assert wait_for(lambda: notes(path), 5)
        assert notes(path)[0] == ["post_request", "/admin/x", "True", "True"]     # gunicorn's ({}, None)
        assert "Error handling request GET /admin/x" in s.log() and "RuntimeError: blocked" in s.log()
        # Other paths: served.
        with Conn(s.port) as c:
            c.send(f"GET /ok?t=0 HTTP/1.1\r\nHost: t\r\nX-Entered: {entered}\r\n\r\n".encode())
            assert c.read_response().status == 200
        assert entered.exists()
        assert s.alive()
    finally:
        s.stop()


def test_post_request_worker_exit_and_worker_int_that_raise_are_logged_and_the_server_goes_on(tmp_path):
    conf, _ = conf_file(tmp_path, '''
def post_request(worker, req, environ, resp): raise RuntimeError("post bug")
def worker_exit(server, worker): raise RuntimeError("exit bug")
def worker_int(worker): raise RuntimeError("int bug")
''')
    s = ServerProc("apps:hello", "-c", conf, "-w", "2")
    try:
        with Conn(s.port) as c:
            for _ in range(2):
                c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert c.read_response().status == 200
        assert wait_for(lambda: s.log().count("hook post_request raised") == 2, 5)
        os.kill(s.worker_pids()[0], signal.SIGINT)
        assert wait_for(lambda: "hook worker_int raised" in s.log() and "hook worker_exit raised" in s.log(), 10)
        assert wait_for(lambda: len(s.worker_pids()) == 2, 10)
        assert s.get("/").status == 200 and s.alive()
    finally:
        s.stop()


# ---- pre_request's changes reach the app ----------------------------------------

REWRITE = '''
def pre_request(worker, req):
    _note("path", req.path, req.query)
    if req.path.startswith("/old/"):
        req.path = "/new/" + req.path[len("/old/"):]
        req.query = req.query + "&added=1"
    names = [k for k, v in req.headers]
    if "X-REQUEST-ID" not in names:
        req.headers.append(("X-REQUEST-ID", "generated-by-hook"))
    req.headers = [(k, v) for k, v in req.headers if k != "X-REMOVE-ME"]
    req.headers = [(k, "hook-agent") if k == "USER-AGENT" else (k, v) for k, v in req.headers]
    req.headers.append(("X-MULTI", "b"))
    req.headers.append(("x-lower", "up"))
    req.headers.append(("X_UNDER", "dropped"))
    req.headers.append(("Content-Type", "text/x-hook"))
'''


def test_what_pre_request_changes_in_req_reaches_the_app(tmp_path):
    conf, path = conf_file(tmp_path, REWRITE)
    s = ServerProc("apps:echo", "-c", conf, "-w", "1")
    try:
        r = s.get("/old/a%20b?q=1", headers=b"User-Agent: client\r\nX-Remove-Me: 1\r\nX-Multi: a\r\n")
        assert r.status == 200
        seen = json.loads(r.body)
        h = seen["headers"]
        assert h["HTTP_X_REQUEST_ID"] == "generated-by-hook"
        assert "HTTP_X_REMOVE_ME" not in h
        assert h["HTTP_USER_AGENT"] == "hook-agent"
        assert h["HTTP_X_MULTI"] == "a, b"                    # joined as the server joins a repeated field
        assert h["HTTP_X_LOWER"] == "up"
        assert not [k for k in h if "UNDER" in k]             # a name with '_' is left out, as a client's
        assert h["CONTENT_TYPE"] == "text/x-hook" and "HTTP_CONTENT_TYPE" not in h
        assert h["HTTP_HOST"] == "t"
        assert seen["path"] == "/new/a b" and seen["query"] == "q=1&added=1"
        assert ["path", "/old/a%20b", "q=1"] in notes(path)   # req.path as gunicorn's: as sent
        assert "a name with '_' is left out of the environ" in s.log()
        # A request the hook leaves alone keeps the server's environ.
        seen = json.loads(s.get("/x%2Fy?z", headers=b"X-Request-Id: mine\r\n").body)
        assert seen["path"] == "/x/y" and seen["query"] == "z"
        assert seen["headers"]["HTTP_X_REQUEST_ID"] == "mine"
    finally:
        s.stop()


def test_a_path_pre_request_sets_is_mapped_under_the_root_path(tmp_path):
    conf, path = conf_file(tmp_path, '''
def pre_request(worker, req):
    _note("path", req.path)
    req.path = req.path.replace("/v1/", "/v2/")
''')
    s = ServerProc("apps:echo", "-c", conf, "-w", "1", "--root-path", "/app")
    try:
        seen = json.loads(s.get("/app/v1/x").body)
        assert (seen["script_name"], seen["path"]) == ("/app", "/v2/x")
        assert notes(path) == [["path", "/app/v1/x"]]         # gunicorn's req.path: the whole path
    finally:
        s.stop()


# ---- gunicorn's attributes, or an AttributeError naming what to use --------------

ATTRS = '''
raw_env = ["FW_A=1", "FW_B=x=y"]
timeout = 17
def _try(f):
    try:
        return repr(f())
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
def when_ready(server):
    _note("server", server.cfg.settings["workers"].value, server.cfg.settings["loglevel"].get(),
          server.cfg.env == {"FW_A": "1", "FW_B": "x=y"}, server.cfg.uid == os.geteuid(),
          server.cfg.gid == os.getegid(), server.app.cfg is server.cfg, server.app.app_uri,
          server.app.callable, _try(server.app.wsgi), server.timeout, server.master_name, server.reexec_pid)
def post_worker_init(worker):
    worker.notify()
    _note("worker", _try(lambda: worker.tmp))
def pre_request(worker, req):
    _note("req", req.should_close(), _try(lambda: req.req_number), _try(lambda: req.trailers))
def post_request(worker, req, environ, resp):
    _note("resp", resp.req is req, resp.version, _try(lambda: resp.chunked), _try(lambda: resp.should_close))
'''


def test_hooks_get_gunicorns_attributes_or_an_error_naming_what_to_use(tmp_path):
    conf, path = conf_file(tmp_path, ATTRS)
    s = ServerProc("apps:hello", "-c", conf, "-w", "1")
    try:
        with Conn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            assert c.read_response().status == 200
        assert wait_for(lambda: len(notes(path)) == 4, 10), (notes(path), s.log())
        got = {n[0]: n[1:] for n in notes(path)}
        # (a gunicorn config file without preload_app: the app is imported by each worker)
        assert got["server"][:7] == ["1", "INFO", "True", "True", "True", "True", "apps:hello"]
        assert got["server"][7] == "None" and got["server"][8].startswith("RuntimeError: server.app.wsgi()")
        assert float(got["server"][9]) == 17 and got["server"][10:] == ["Master", "0"]
        assert got["worker"][0].startswith("AttributeError: tmp: not in forkwsgi (no heartbeat file")
        should_close, req_number, trailers = got["req"]
        assert should_close == "True"                        # Connection: close
        assert req_number.startswith("AttributeError: req_number: not in forkwsgi") and "worker.nr" in req_number
        assert trailers.startswith("AttributeError: trailers: not in forkwsgi")
        is_req, version, chunked, resp_close = got["resp"]
        assert (is_req, version) == ("True", "forkwsgi")
        assert chunked.startswith("AttributeError: chunked: not in forkwsgi") and "response_length" in chunked
        assert resp_close.startswith("AttributeError: should_close: not in forkwsgi")
        assert " raised" not in s.log()
    finally:
        s.stop()


def test_a_pre_exec_that_raises_stops_the_reexecution(tmp_path):
    """gunicorn: pre_exec raising means the new master never starts, the
    old one serves on. Here the in-place re-execution does not happen: the
    same workers serve, and the log says why."""
    conf, _ = conf_file(tmp_path, "def pre_exec(server):\n    raise RuntimeError('no upgrade today')\n")
    s = ServerProc("apps:pid", "-c", conf, "--workers", "1", cwd=str(tmp_path))
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        before = s.worker_pids()
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "the pre_exec hook raised (above): no re-execution" in s.log(), timeout=20), \
            s.log()[-2000:]
        assert "no upgrade today" in s.log()
        time.sleep(0.5)
        assert s.alive() and s.worker_pids() == before
        with Conn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            r = c.read_response()
        assert r.status == 200 and r.body.decode() == str(before[0])
    finally:
        s.stop()
