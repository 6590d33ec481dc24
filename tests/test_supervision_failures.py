"""Supervision when things fail (an app that does not import, a full
metrics listener, logrotate under --user): defects found by attacking it,
each test failed before its fix.

- With --lazy-apps, a new worker that could not import the app stopped the
  whole server (exit 4), running workers and all: after a SIGHUP, or when a
  worker retired (--max-requests) after the code on disk broke.
- While a reload's new code did not import, --timeout still retired
  workers that nothing could replace: capacity drained to zero.
- A retried import that worked ran in the old interpreter, whose
  sys.modules kept modules of the failed tries: old and new code mixed.
- 64 silent connections to --metrics made every /healthz fail (the
  newcomer was closed at the cap, not the oldest).
- /healthz quoted the import's exception (a DSN, a credential).
- Each reload's import check left prometheus_client files in the workers'
  directory: a counter bumped at import grew with every reload.
- A --metrics address changed in the config file was ignored by a reload.
- Under --user, SIGUSR1 made a root-owned error log the workers could not
  write; the offload sibling never reopened its logs.
"""
import os
import pwd
import shutil
import signal
import socket
import stat
import tempfile
import time

import pytest

from conftest import HERE, ServerProc
from httpraw import Closed, Conn, accept_queue, wait_for
from test_reload import ready_workers, start_flaky, workers, write_app
from test_supervision import free_port, healthz, serving

APP_MODES = ("inline",)


def get(port, path="/"):
    with Conn(port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        return c.read_response()


def version_of(port):
    r = get(port)
    assert r.status == 200, r
    return r.body.decode().split()[0]


# ---- --lazy-apps: an app that stops importing --------------------------------

def test_lazy_apps_a_hup_to_code_that_does_not_import_keeps_the_server(tmp_path):
    write_app(str(tmp_path), "v1")
    s = ServerProc("deployed:app", "--pythonpath", str(tmp_path), "--workers", "2", "--lazy-apps",
                   "--log-level", "debug")
    try:
        # both serve v1 (a lazy worker still importing would import the
        # broken code below, and fail like the new ones)
        assert wait_for(lambda: len(ready_workers(s)) == 2)
        first = set(workers(s))
        write_app(str(tmp_path), "v2", broken=True)
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "could not import the app" in s.log(), 20), s.log()[-3000:]
        time.sleep(1.0)
        assert s.alive(), s.log()[-3000:]
        assert set(workers(s)) == first                  # the running workers serve on
        assert {version_of(s.port) for _ in range(6)} == {"v1"}
        write_app(str(tmp_path), "v3")                   # fixed: the retry finds it
        assert wait_for(lambda: version_of(s.port) == "v3", 40), s.log()[-3000:]
        assert wait_for(lambda: len(workers(s)) == 2 and not set(workers(s)) & first, 20)
        assert {version_of(s.port) for _ in range(6)} == {"v3"}
    finally:
        s.stop()


def test_lazy_apps_reuseport_replacement_that_cannot_import_resets_no_connection(tmp_path):
    """--balance reuseport: the master made each new worker's listening
    socket before the fork, so with --lazy-apps it joined the port's group
    while the worker was still importing: connections the kernel gave it
    waited for the import, and were reset when the import failed (a review:
    44 of 41,376 requests). Now a worker listens once its app is imported."""
    write_app(str(tmp_path), "v1")
    s = ServerProc("deployed:app", "--pythonpath", str(tmp_path), "--workers", "2", "--lazy-apps",
                   "--balance", "reuseport", "--max-requests", "20", "--log-level", "debug")
    try:
        assert wait_for(lambda: len(ready_workers(s)) == 2)
        write_app(str(tmp_path), "v2", broken=True)
        failed, served = [], 0
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:         # through the first import retries
            try:
                assert get(s.port).status == 200
                served += 1
            except (ConnectionError, Closed) as e:
                failed.append(repr(e))
        assert "could not import the app" in s.log(), s.log()[-3000:]
        assert failed == [], f"{len(failed)} of {served + len(failed)}: {failed[:3]}"
    finally:
        s.stop()


def test_lazy_apps_max_requests_after_the_code_broke_on_disk_keeps_the_server(tmp_path):
    """Nobody sends a signal: a worker retires at --max-requests, its
    replacement cannot import the code now on disk."""
    write_app(str(tmp_path), "v1")
    s = ServerProc("deployed:app", "--pythonpath", str(tmp_path), "--workers", "2", "--lazy-apps",
                   "--max-requests", "20", "--log-level", "debug")
    try:
        # Both serve v1 first: a lazy worker still importing would import
        # the broken code below, and a server none of whose workers ever
        # served stops (the first request was reset: 1 run in 20 under load).
        assert wait_for(lambda: len(ready_workers(s)) == 2)
        write_app(str(tmp_path), "v2", broken=True)
        deadline = time.monotonic() + 20
        while "could not import the app" not in s.log() and time.monotonic() < deadline:
            assert get(s.port).status == 200
        assert "could not import the app" in s.log(), s.log()[-3000:]
        for _ in range(100):                             # past --max-requests again: held
            assert get(s.port).status == 200
        assert s.alive() and len(workers(s)) >= 1
    finally:
        s.stop()


# ---- a held reload ------------------------------------------------------------

SLEEPY = """
import time, deployed
def app(environ, start_response):
    if environ["PATH_INFO"] == "/sleep":
        time.sleep(float(environ["QUERY_STRING"]))
    return deployed.app(environ, start_response)
"""


def test_timeout_during_a_held_reload_does_not_drain_the_workers(tmp_path):
    (tmp_path / "apps_sleep_deployed.py").write_text(SLEEPY)
    mport = free_port()
    s = start_flaky(tmp_path, "--threads", "2", "--timeout", "1", "--metrics", f"127.0.0.1:{mport}",
                    app="apps_sleep_deployed:app")
    try:
        assert wait_for(lambda: len(workers(s)) == 2)
        open(os.path.join(str(tmp_path), "flaky"), "w").close()
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: the app does not import" in s.log(), 30), s.log()
        held = set(workers(s))
        slow = [Conn(s.port, timeout=20) for _ in range(2)]
        for c in slow:                                   # one per worker (least-busy), past --timeout
            c.send(b"GET /sleep?3 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert wait_for(lambda: s.log().count("it cannot be replaced: it serves on") >= 1, 10), s.log()[-3000:]
        for c in slow:
            assert c.read_response().status == 200
            c.close()
        assert set(workers(s)) == held
        with Conn(mport) as c:
            c.send(b"GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
            said = c.read_response().body.decode()
        assert said.startswith("ok: 2 worker(s) serving the code before the reload"), said
        assert "secret store" not in said
        assert "timed out" not in s.log()
    finally:
        s.stop()


def test_a_retried_import_that_works_runs_only_new_code(tmp_path):
    """A package whose module a is imported, then b fails: after the retry
    works, the workers serve a's newest text, not the copy a failed try
    left in sys.modules."""
    pkg = tmp_path / "pkgapp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from . import a, b\n"
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [a.VERSION.encode() + b' ' + str(__import__('os').getpid()).encode()]\n")
    (pkg / "a.py").write_text('VERSION = "v1"\n')
    (pkg / "b.py").write_text("import os\nif os.path.exists(os.path.join(os.path.dirname(__file__), 'flaky')) "
                              "and not __import__('sys').argv[0].endswith('preflight.py'):\n"
                              "    raise RuntimeError('not yet')\n")
    s = ServerProc("pkgapp:app", "--pythonpath", str(tmp_path), "--workers", "2")
    try:
        assert wait_for(lambda: len(workers(s)) == 2)

        def edit(version):
            path = pkg / "a.py"
            path.write_text(f'VERSION = "{version}"\n')
            t = time.time() + 2
            os.utime(path, (t, t))
        edit("v2")
        (pkg / "flaky").write_text("")
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: the app does not import" in s.log(), 30), s.log()
        edit("v3")
        (pkg / "flaky").unlink()
        assert wait_for(lambda: "the app imports now" in s.log(), 40), s.log()[-3000:]
        assert wait_for(lambda: {version_of(s.port) for _ in range(6)} == {"v3"}, 20), s.log()[-3000:]
    finally:
        s.stop()


# ---- the --metrics port ---------------------------------------------------------

def test_healthz_answers_while_silent_clients_fill_the_metrics_port():
    mport = free_port()
    s = ServerProc("apps:hello", "--workers", "1", "--metrics", f"127.0.0.1:{mport}")
    silent = []
    try:
        for _ in range(80):
            silent.append(socket.create_connection(("127.0.0.1", mport), timeout=5))
        assert wait_for(lambda: accept_queue(mport) == 0)        # the master has accepted them
        answered = 0
        for _ in range(10):
            try:
                healthz(mport)
                answered += 1
            except (OSError, AssertionError):
                pass
            silent.append(socket.create_connection(("127.0.0.1", mport), timeout=5))
        assert answered == 10
    finally:
        for c in silent:
            c.close()
        s.stop()


PROM_APP = """
from prometheus_client import Counter
LOADS = Counter("app_loads", "imports of the app")
LOADS.inc()
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
"""


def test_reload_checks_leave_no_app_metrics_behind(tmp_path):
    """Each import check bumped the import-time counter in the workers'
    directory, for good."""
    (tmp_path / "promapp.py").write_text(PROM_APP)
    mport = free_port()
    s = ServerProc("promapp:app", "--pythonpath", str(tmp_path), "--workers", "1", "--lazy-apps",
                   "--metrics", f"127.0.0.1:{mport}", "-c", str(write_conf(tmp_path, mport)))

    def loads():
        with Conn(mport) as c:
            c.send(b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n")
            body = c.read_response().body.decode()
        return [line for line in body.splitlines() if line.startswith("app_loads_total")]
    try:
        assert wait_for(lambda: len(workers(s)) == 1)
        # --lazy-apps: the worker exists before it has imported the app.
        assert wait_for(lambda: loads() != [], 20)
        before = loads()
        for n in range(3):
            s.signal(signal.SIGHUP)
            assert wait_for(lambda: s.log().count("Reloaded in place") == n + 1, 30), s.log()[-3000:]
            assert wait_for(lambda: len(workers(s)) == 1, 60), (workers(s), s.log()[-3000:])
        # One import per worker: the first and one per reload (a dead
        # worker's counts stay, as prometheus_client's multiprocess mode
        # keeps them); the import checks count nothing.
        assert before == ["app_loads_total 1.0"], before
        assert wait_for(lambda: loads() == ["app_loads_total 4.0"], 30), loads()
    finally:
        s.stop()


def write_conf(tmp_path, mport, name="conf.py"):
    path = tmp_path / name
    path.write_text(f'metrics = "127.0.0.1:{mport}"\n')
    return path


def test_a_reload_moves_the_metrics_port(tmp_path):
    first, second = free_port(), free_port()
    conf = write_conf(tmp_path, first)
    s = ServerProc("apps:hello", "--workers", "1", "-c", str(conf))
    try:
        # A forked worker is not yet a serving one: /healthz says 503 until
        # the worker has said it is ready (seen in CI, 1 of 2,479).
        assert wait_for(lambda: serving(first)), s.log()[-3000:]
        assert healthz(first) < 1
        write_conf(tmp_path, second)
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: --metrics moved from" in s.log(), 30), s.log()[-3000:]
        assert wait_for(lambda: serving(second)), s.log()[-3000:]
        assert healthz(second) < 1
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", first), timeout=2).close()
    finally:
        s.stop()


# ---- --user and SIGUSR1 ------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_log_rotation_under_user_gives_the_new_files_to_the_user():
    nobody = pwd.getpwnam("nobody")
    d = tempfile.mkdtemp(prefix="forkwsgi-rotate-")
    os.chmod(d, 0o755)                # root's directory: nobody cannot create files in it
    errors, access = os.path.join(d, "error.log"), os.path.join(d, "access.log")
    s = ServerProc("apps:logged", "--workers", "1", "--user", "nobody", "--error-logfile", errors,
                   "--access-logfile", access, wait=False)
    try:
        assert wait_for(lambda: os.path.exists(errors) and "Booted worker" in open(errors).read(), 20)
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        port = int(open(errors).read().split("Listening at: http://127.0.0.1:")[1].split()[0])
        assert get(port, "/?msg=before").status == 200
        os.rename(errors, errors + ".1")
        os.rename(access, access + ".1")
        s.signal(signal.SIGUSR1)
        assert wait_for(lambda: os.path.exists(errors) and os.path.exists(access), 10)
        for path in (errors, access):
            st = os.stat(path)
            assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid), path
            assert stat.S_IMODE(st.st_mode) & 0o200
        assert wait_for(lambda: get(port, "/?msg=after-rotation").status == 200 and
                        "after-rotation" in open(access).read(), 10), open(access).read()
    finally:
        s.stop()
        shutil.rmtree(d, ignore_errors=True)


# ---- an upgrade of forkwsgi itself under a running server --------------------------

OTHER_BUILD = """
# Only in the reload's check (python -m forkwsgi.preflight): a forkwsgi
# build whose shared memory is laid out otherwise, as after an upgrade.
with open("/proc/self/cmdline", "rb") as _f:
    if b"forkwsgi.preflight" in _f.read():
        import forkwsgi.slots
        forkwsgi.slots.LAYOUT = "status 512, stats 9999, scoreboard 128"
"""


def test_a_reload_into_a_build_with_another_memory_layout_is_refused(tmp_path):
    """The master would exec into the new build and read the running
    workers' shared memory wrongly: the check reports its layout, and a
    different one keeps the workers serving, with an error that says a
    restart is needed."""
    (tmp_path / "sitecustomize.py").write_text(OTHER_BUILD)
    s = ServerProc("apps:pid", "--workers", "2",
                   env={"PYTHONPATH": os.pathsep.join([str(tmp_path), HERE, os.environ.get("PYTHONPATH", "")])})
    try:
        assert wait_for(lambda: len(workers(s)) == 2)
        before = set(workers(s))
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "an upgrade of forkwsgi itself takes a restart" in s.log(), 30), s.log()[-3000:]
        time.sleep(1.0)
        assert "Reloaded in place" not in s.log()
        assert set(workers(s)) == before
        assert get(s.port).status == 200
    finally:
        s.stop()
