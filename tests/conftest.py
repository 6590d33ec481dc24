"""Shared fixtures: real forkwsgi server processes on 127.0.0.1.

Every server is started as `python -m forkwsgi ...` with --bind 127.0.0.1:0;
the port comes from its "Listening at" log line. Servers are stopped by PID
(SIGTERM, then SIGKILL) at teardown.

The tests that use the `server` and `make_server` fixtures run twice: with
the app inline on the worker's loop thread (the default, --threads 1) and on
app threads (FORKWSGI_THREADS=3), since each request then takes another path
through the core. A module that sets APP_MODES = ("inline",) runs once (its
servers choose their own --threads).
"""
import importlib.util
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from httpraw import Conn, children, request  # noqa: E402


# The tests' own directory (not what they write under it), then the package.
_COMPILE = """import compileall, py_compile, sys
mode = py_compile.PycInvalidationMode.CHECKED_HASH
compileall.compile_dir(sys.argv[1], maxlevels=0, quiet=1, invalidation_mode=mode)
for d in sys.argv[2:]:
    compileall.compile_dir(d, quiet=1, invalidation_mode=mode)
"""


def _compile_for_children():
    """With PYTHONDONTWRITEBYTECODE set (this machine's sessions set it),
    every server the suite starts (~1,500) compiled forkwsgi's modules (and
    apps.py) from source again, as nothing writes their __pycache__: ~30 ms
    of each start. They are compiled once here. Checked-hash pycs: Python
    uses one only while its source is unchanged, whatever the mtime, so a
    module edited during a run is never run stale. What tests write (in
    tmp_path) is compiled from source as before."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return                       # the processes write their own
    spec = importlib.util.find_spec("forkwsgi")
    if spec is None or not spec.submodule_search_locations:
        return
    subprocess.run([sys.executable, "-c", _COMPILE, HERE, *spec.submodule_search_locations],
                   check=False, stdout=subprocess.DEVNULL, timeout=120)


_compile_for_children()


class ServerProc:
    def __init__(self, app="apps:echo", *args, env=None, bind=None, wait=True, nofile=None, new_session=False,
                 cwd=HERE):
        self.logfile = tempfile.NamedTemporaryFile(prefix="forkwsgi-test-", suffix=".log", delete=False)
        binds = ["127.0.0.1:0"] if bind is None else bind
        cmd = [sys.executable, "-m", "forkwsgi", *([app] if app else [])]      # None: the app is in a config file
        for b in binds:
            cmd += ["--bind", b]
        cmd += list(args)
        e = dict(os.environ)
        e["PYTHONPATH"] = HERE + os.pathsep + e.get("PYTHONPATH", "")
        e["PYTHONUNBUFFERED"] = "1"
        if env:
            e.update(env)
        self.cmd = cmd
        preexec = None
        if nofile:       # the server's own descriptor limit (ulimit -n)
            def preexec():
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        # new_session: a process group of its own, for signals sent to the group.
        self.proc = subprocess.Popen(cmd, stdout=self.logfile, stderr=subprocess.STDOUT, env=e, cwd=cwd,
                                     preexec_fn=preexec, start_new_session=new_session)
        self.pid = self.proc.pid
        self.port = None
        self.unix_path = None
        if wait:
            self.wait_ready()

    def log(self):
        with open(self.logfile.name, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_ready(self, timeout=20.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = self.log()
            m = re.search(r"Listening at: http://(?:\[[^\]]*\]|[^:\s]+):(\d+)", text)
            u = re.search(r"Listening at: unix:(\S+)", text)
            if m:
                self.port = int(m.group(1))
                return self
            if u:
                self.unix_path = u.group(1)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{text}")
            # Short: the suite starts ~1,500 servers, and each waits half
            # an interval on average past its "Listening at" line.
            time.sleep(0.005)
        raise RuntimeError(f"server did not start:\n{self.log()}")

    def conn(self, timeout=10.0):
        return Conn(self.port, timeout=timeout)

    def request(self, data, method="GET", timeout=10.0):
        return request(self.port, data, method, timeout)

    def get(self, path="/", headers=b"", method="GET"):
        return self.request(f"{method} {path} HTTP/1.1\r\nHost: t\r\n".encode() + headers + b"\r\n", method)

    def worker_pids(self):
        """PIDs of the server's child processes (workers, offload sibling),
        whichever of its threads started them."""
        return children(self.pid)

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig):
        os.kill(self.pid, sig)

    def stop(self, timeout=15.0):
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                wait_exit(self.proc, timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(5)
            except ProcessLookupError:
                pass
        self.logfile.close()
        try:
            os.unlink(self.logfile.name)
        except OSError:
            pass
        return self.proc.returncode


def wait_exit(proc, timeout):
    """proc.wait(timeout), woken by the exit itself: Popen.wait with a
    timeout sleeps between checks, growing to 50 ms, which the ~1,500
    servers the suite stops would each wait out in part. A pidfd (Linux
    5.3) becomes readable when the process exits."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):      # no pidfd here, or already reaped
        return proc.wait(timeout)
    try:
        p = select.poll()
        p.register(fd, select.POLLIN)
        if not p.poll(timeout * 1000):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait(timeout)              # exited: this only reaps it


# A module runs its tests in each of its APP_MODES (inline and threads by
# default): inline (--threads 1), threads (--threads 3: quick calls run on
# the loop thread, --inline-first), handoff (--threads 3, every request
# handed to an app thread: --inline-first off), which modules that drive
# the app threads' hand-offs (parking, Expect, errors) opt in to.
APP_MODE_ENV = {"inline": {}, "threads": {"FORKWSGI_THREADS": "3"},
                "handoff": {"FORKWSGI_THREADS": "3", "FORKWSGI_INLINE_FIRST": "off"}}
DEFAULT_APP_MODES = ("inline", "threads")


def pytest_generate_tests(metafunc):
    if "app_mode" in metafunc.fixturenames:
        modes = getattr(metafunc.module, "APP_MODES", DEFAULT_APP_MODES)
        metafunc.parametrize("app_mode", modes, scope="module")


def mode_env(app_mode, env=None):
    e = dict(APP_MODE_ENV[app_mode])
    e.update(env or {})
    return e


@pytest.fixture(scope="module")
def server(app_mode):
    """The echo app with default settings, shared by a test module."""
    s = ServerProc("apps:echo", env=mode_env(app_mode, None))
    yield s
    s.stop()


@pytest.fixture
def make_server(app_mode):
    """Start servers with custom apps/options; all are stopped at teardown."""
    started = []

    def make(app="apps:echo", *args, env=None, **kw):
        s = ServerProc(app, *args, env=mode_env(app_mode, env), **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def servers():
    """A list to put ServerProcs a test starts itself in; all are stopped
    at teardown."""
    started = []
    yield started
    for s in started:
        s.stop()


# Two test files run at once (pytest-xdist). A test marked `alone` needs
# the machine to itself (it pins its server to one CPU and counts on that
# CPU's time): it holds this lock exclusively, every other test shares it,
# so the file beside it waits between two of its tests.
def pytest_configure(config):
    config.addinivalue_line("markers", "alone: runs while no test of another file runs (CPU pinning)")


@pytest.fixture(autouse=True)
def _machine_share(request, tmp_path_factory):
    import fcntl
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield                 # one process: nothing runs beside
        return
    path = tmp_path_factory.getbasetemp().parent / "machine.lock"      # the same for every worker
    with open(path, "a") as f:
        alone = request.node.get_closest_marker("alone") is not None
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
