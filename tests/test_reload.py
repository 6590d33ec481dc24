"""Reloads that run new code (issue 11): with the app preloaded (the
default), SIGHUP and SIGUSR2 make the master re-execute itself in place:
same PID, the running workers serve on until new ones (forked from the new
image, with the new code) are ready; kept-alive clients lose nothing. Code
that does not import leaves the running workers serving.

The app is a file in the test's directory, edited between requests, as an
operator deploys.
"""
import json
import os
import re
import signal
import threading
import time

import pytest

from conftest import ServerProc
from httpraw import Closed, Conn, accept_queue, wait_for
from test_supervision import free_port

APP_MODES = ("inline",)

APP = '''import os
VERSION = "{version}"
def app(environ, start_response):
    if environ["PATH_INFO"] == "/emit":
        environ["forkwsgi.offload"]("events", ("%s-%s" % (VERSION, environ["QUERY_STRING"])).encode())
    body = ("%s %d" % (VERSION, os.getpid())).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
'''


def write_app(directory, version, broken=False):
    path = os.path.join(directory, "deployed.py")
    text = APP.format(version=version) + ("\ndef broken(:\n" if broken else "")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)         # as a deploy does: never a half-written file
    # A new mtime even within the same second: the import reads the new source.
    t = time.time() + 2
    os.utime(path, (t, t))


def ask(conn, path="/"):
    conn.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    r = conn.read_response()
    assert r.status == 200, r
    version, pid = r.body.decode().split()
    return version, int(pid)


def versions_served(s, n=12):
    """(versions, worker pids) over n new connections."""
    seen, pids = set(), set()
    for _ in range(n):
        with Conn(s.port) as c:
            v, pid = ask(c)
        seen.add(v)
        pids.add(pid)
    return seen, pids


class Load:
    """Kept-alive clients (more than the server has threads) asking in a
    loop, each on one connection for the whole test; any failure counts.
    Bounded: at most `limit` requests per client and `seconds` in all."""

    def __init__(self, port, clients=8, limit=20000, seconds=60):
        self.port, self.limit, self.deadline = port, limit, time.monotonic() + seconds
        self.stop = threading.Event()
        self.failures, self.done = [], 0
        self.by_pid = {}                     # worker pid -> responses it gave
        self.versions = [[] for _ in range(clients)]
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(clients)]
        for t in self.threads:
            t.start()

    def run(self, i):
        try:
            with Conn(self.port) as c:
                for _ in range(self.limit):
                    if self.stop.is_set() or time.monotonic() > self.deadline:
                        return
                    v, pid = ask(c)
                    with self.lock:
                        self.done += 1
                        self.by_pid[pid] = self.by_pid.get(pid, 0) + 1
                    if not self.versions[i] or self.versions[i][-1] != v:
                        self.versions[i].append(v)
                    time.sleep(0.002)
        except (Closed, OSError, AssertionError, ValueError) as e:
            with self.lock:
                self.failures.append(f"client {i}: {type(e).__name__}: {e}")

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        return self.failures


def start(tmp_path, *args):
    write_app(str(tmp_path), "v1")
    return ServerProc("deployed:app", "--pythonpath", str(tmp_path), "--workers", "2", "--threads", "2", *args)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR2])
def test_reload_runs_new_code_under_the_same_pid_and_loses_no_request(tmp_path, sig):
    s = start(tmp_path)
    try:
        assert versions_served(s)[0] == {"v1"}
        old_workers = set(s.worker_pids())
        load = Load(s.port)
        assert wait_for(lambda: load.done > 200, 20)
        write_app(str(tmp_path), "v2")
        s.signal(sig)
        assert wait_for(lambda: versions_served(s, 6)[0] == {"v2"}, 30), s.log()
        # Every old worker retired (each once a new one was ready).
        assert wait_for(lambda: not old_workers & set(s.worker_pids()), 20), s.log()
        done_at_reload = load.done
        assert wait_for(lambda: load.done > done_at_reload + 200, 20)
        failures = load.finish()
        assert failures == [], (failures, s.log()[-6000:])
        # The connections kept alive across the reload: each went from v1 to v2.
        assert all(v == ["v1", "v2"] for v in load.versions), load.versions
        assert s.alive()                           # the same master, the same PID
        with open(f"/proc/{s.pid}/cmdline", "rb") as f:
            assert b"forkwsgi" in f.read()
        log = s.log()
        assert "Reloaded in place (same PID %d)" % s.pid in log
        assert "ERROR" not in log and "Traceback" not in log, log
    finally:
        s.stop()


def test_code_that_does_not_import_leaves_the_workers_serving(tmp_path):
    s = start(tmp_path)
    try:
        served, pids = versions_served(s)
        assert served == {"v1"}
        write_app(str(tmp_path), "v2", broken=True)
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: the new code does not load" in s.log(), 30), s.log()
        assert "SyntaxError" in s.log()
        served2, pids2 = versions_served(s)
        assert served2 == {"v1"} and pids2 <= pids | set(s.worker_pids())
        assert set(s.worker_pids()) >= pids2
        # Fixed: the next SIGHUP reloads.
        write_app(str(tmp_path), "v3")
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: versions_served(s, 6)[0] == {"v3"}, 30), s.log()
    finally:
        s.stop()


# The import fails in the new master, not in the reload's check: the app
# file changes between the two (a deploy copying in place), or what the
# import reaches (a secret store, a database) fails for a moment.
FLAKY = """
import sys as _sys
if os.path.exists(os.path.join(os.path.dirname(__file__), "flaky")) and \\
        not _sys.argv[0].endswith("preflight.py"):
    raise RuntimeError("the secret store did not answer")
"""


def start_flaky(tmp_path, *args, app="deployed:app"):
    """Two workers on deployed.py (v1), whose import fails while the file
    `flaky` is there (except in the reload's own check); `app` may be a
    module of tmp_path that wraps it."""
    path = os.path.join(str(tmp_path), "deployed.py")
    with open(path, "w") as f:
        f.write(APP.format(version="v1") + FLAKY)
    return ServerProc(app, "--pythonpath", str(tmp_path), "--workers", "2", *args)


def workers(s):
    """The server's workers: its children titled so (not the import checks
    it runs, nor one of those between its fork and its exec)."""
    def is_worker(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().startswith(b"forkwsgi: worker")
        except OSError:
            return False
    return [p for p in s.worker_pids() if is_worker(p)]


def ready_workers(s):
    """The workers that have said they serve (their app imported: with
    --lazy-apps, after their fork). Needs --log-level debug."""
    ready = {int(p) for p in re.findall(r"worker \d+ \(pid (\d+)\) ready", s.log())}
    return [p for p in workers(s) if p in ready]


def healthz(port):
    with Conn(port) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
        r = c.read_response()
    return r.status, r.body.decode().strip()


def test_a_reload_whose_new_image_cannot_import_never_drains_the_server(tmp_path):
    """Issue 24, item 2: at dac5946, with --max-requests, every worker that
    retired after such a reload was logged "replacing it" and never was: 0
    workers, every request hung. Now the workers of the code before do not
    retire by themselves while no app is loaded; one that dies is said to
    be unreplaceable, /healthz says the capacity is short, the import is
    tried again, and once it works the server is back to --workers with the
    new code."""
    mport = free_port()
    s = start_flaky(tmp_path, "--max-requests", "30", "--metrics", f"127.0.0.1:{mport}")
    try:
        assert wait_for(lambda: len(workers(s)) == 2)
        open(os.path.join(str(tmp_path), "flaky"), "w").close()
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: the app does not import" in s.log(), 30), s.log()
        assert "the secret store did not answer" in s.log()
        before = workers(s)
        load = Load(s.port, clients=6, seconds=20)
        # 30 requests per worker go by many times over (or a worker is lost).
        wait_for(lambda: all(load.by_pid.get(p, 0) >= 160 for p in before) or len(workers(s)) < 2, 15)
        assert len(workers(s)) == 2, s.log()[-3000:]
        # full capacity, but a failed deploy shows; what the import said
        # (a DSN, a credential) stays in the log
        assert healthz(mport) == (200, "ok: 2 worker(s) serving the code before the reload; the app does not "
                                       "import (see the server's log)")
        failures = load.finish()
        assert not failures, failures[:3]
        assert load.done > 300
        victim = workers(s)[0]
        os.kill(victim, signal.SIGKILL)     # a crash: its own clients see their connection end
        assert wait_for(lambda: "cannot be replaced while the app does not import" in s.log(), 5), \
            s.log()[-3000:]
        status, said = healthz(mport)
        assert (status, said) == (200, "degraded: 1 of 2 worker(s) serving; the app does not import (see the "
                                       "server's log)")
        assert "secret store" not in said
        assert versions_served(s, 20)[0] == {"v1"}          # the one left serves every new client
        os.unlink(os.path.join(str(tmp_path), "flaky"))     # the secret store answers again
        assert wait_for(lambda: "the app imports now" in s.log(), 30), s.log()[-3000:]
        assert wait_for(lambda: healthz(mport) == (200, "ok"), 20), s.log()[-3000:]
        # the last worker of the code before may still be finishing its requests
        assert wait_for(lambda: len(workers(s)) == 2, 10), s.log()[-3000:]
        assert versions_served(s, 6)[0] == {"v1"}           # the new image's code (same text)
    finally:
        s.stop()


# deployed.py's app, with /grow making the worker hold 200 MiB (over --max-rss 150).
GROW = """
import deployed
HOG = []
def app(environ, start_response):
    if environ["PATH_INFO"] == "/grow":
        HOG.append(bytearray(200 << 20))
    return deployed.app(environ, start_response)
"""


def test_max_rss_waits_for_an_app_to_fork_from(tmp_path):
    """...and --max-rss does not recycle a worker no new one can replace."""
    (tmp_path / "grow_deployed.py").write_text(GROW)
    s = start_flaky(tmp_path, "--max-rss", "150", app="grow_deployed:app")
    try:
        with Conn(s.port) as c:
            ask(c, "/grow")
        assert wait_for(lambda: "--max-rss 150: recycling it" in s.log(), 20), s.log()[-3000:]
        open(os.path.join(str(tmp_path), "flaky"), "w").close()
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: the app does not import" in s.log(), 30), s.log()
        with Conn(s.port) as c:
            ask(c, "/grow")
        assert wait_for(lambda: "but the app does not import: it serves on" in s.log(), 10), s.log()[-3000:]
        booted, recycled = s.log().count("Booted worker"), s.log().count("recycling it")
        time.sleep(2.5)                     # (the children now are the workers and the import's retries)
        assert (s.log().count("Booted worker"), s.log().count("recycling it")) == (booted, recycled)
        with Conn(s.port) as c:
            assert ask(c)[0] == "v1"
    finally:
        s.stop()


@pytest.mark.parametrize("mistake, line", [("def broken(:\n", 3), ("x = 1\n1 / 0\n", 4)],
                         ids=["SyntaxError", "ZeroDivisionError"])
def test_a_broken_module_the_app_imports_is_named_with_its_line(tmp_path, mistake, line):
    """The reason a reload is refused names the file and line of the mistake:
    for a SyntaxError in a module the app imports (its traceback ends in
    the importer), and for an exception raised at import (its last frame).
    The old workers serve on."""
    helper = tmp_path / "deployed_helper.py"
    helper.write_text('GREETING = "v1"\n')
    (tmp_path / "deployed_main.py").write_text(
        "import os\nfrom deployed_helper import GREETING\n"
        "def app(environ, start_response):\n"
        "    body = ('%s %d' % (GREETING, os.getpid())).encode()\n"
        "    start_response('200 OK', [('Content-Length', str(len(body)))])\n"
        "    return [body]\n")
    s = ServerProc("deployed_main:app", "--pythonpath", str(tmp_path), "--workers", "2")
    try:
        assert versions_served(s)[0] == {"v1"}
        workers = set(s.worker_pids())
        helper.write_text('GREETING = "v2"\n# the mistake:\n' + mistake)
        t = time.time() + 2
        os.utime(helper, (t, t))              # a new mtime: the import reads the new source
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "reload: the new code does not load" in s.log(), 30), s.log()
        (reason,) = [ln for ln in s.log().splitlines() if "reload: the new code does not load" in ln]
        assert f"{helper}, line {line}" in reason, reason
        served, pids = versions_served(s)
        assert served == {"v1"} and pids <= workers and set(s.worker_pids()) == workers
    finally:
        s.stop()


def test_hup_to_the_whole_process_group_reloads_once(tmp_path):
    """kill -HUP -PGID (a terminal hang-up): the workers leave it to the
    master, the check runs in its own group, and the reload happens."""
    write_app(str(tmp_path), "v1")
    s = ServerProc("deployed:app", "--pythonpath", str(tmp_path), "--workers", "2", new_session=True)
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2, 10)
        write_app(str(tmp_path), "v2")
        os.killpg(s.pid, signal.SIGHUP)
        assert wait_for(lambda: versions_served(s, 6)[0] == {"v2"}, 30), s.log()
        assert s.log().count("Reloaded in place") == 1
    finally:
        s.stop()


def test_lazy_apps_hup_stays_a_per_worker_reload_and_usr2_reexecutes(tmp_path):
    """Also: kept-alive clients lose nothing over three rolling reloads.
    Before, a response finished between a retiring worker's SIGTERM and its
    loop starting the stop said Connection: close (the worker was to hand
    the connection on, not close it): 1 to 3 of 8 clients lost their
    connection in about every other reload."""
    s = start(tmp_path, "--lazy-apps")
    try:
        load = Load(s.port)
        for version in ("v2", "v3", "v4"):
            assert wait_for(lambda: load.done > 100, 20)
            done = load.done
            write_app(str(tmp_path), version)
            s.signal(signal.SIGHUP)
            assert wait_for(lambda: versions_served(s, 6)[0] == {version}, 30), s.log()
            assert wait_for(lambda: load.done > done + 100, 20)
        failures = load.finish()
        assert failures == [], (failures, s.log()[-3000:])
        assert all(v == ["v1", "v2", "v3", "v4"] for v in load.versions), load.versions
        assert "each importing the app afresh (--lazy-apps)" in s.log()
        assert "Reloaded in place" not in s.log()
        write_app(str(tmp_path), "v5")
        s.signal(signal.SIGUSR2)
        assert wait_for(lambda: versions_served(s, 6)[0] == {"v5"}, 30), s.log()
        assert "Reloaded in place (same PID %d)" % s.pid in s.log()
    finally:
        s.stop()


def test_offload_records_survive_an_in_place_reload(tmp_path):
    """The offload queue and its counters are taken over across the exec;
    the old sibling hands over to a new one: every record is delivered once."""
    out = tmp_path / "out.jsonl"
    s = start(tmp_path, "--offload-sink", f"jsonl:{out}", "--offload-dir", str(tmp_path / "journal"),
              "--offload-linger", "0.02")
    sent = []
    try:
        with Conn(s.port) as c:
            for i in range(50):
                ask(c, f"/emit?{i}")
                sent.append(f"v1-{i}")
            write_app(str(tmp_path), "v2")
            s.signal(signal.SIGHUP)
            for i in range(50, 300):
                v, _ = ask(c, f"/emit?{i}")
                sent.append(f"{v}-{i}")
                time.sleep(0.005)
        assert wait_for(lambda: versions_served(s, 6)[0] == {"v2"}, 30), s.log()

        def delivered():
            if not out.exists():
                return []
            # Whole lines only: the sink may be writing the last one.
            return [json.loads(ln)["value"] for ln in out.read_text().splitlines(keepends=True)
                    if ln.endswith("\n")]
        assert wait_for(lambda: len(delivered()) >= len(sent), 30), (len(delivered()), s.log())
        assert sorted(delivered()) == sorted(sent)
        assert "Reloaded in place" in s.log()
    finally:
        s.stop()


def test_a_changed_bind_is_said_not_silently_dropped(tmp_path):
    """Issue 24, item 8: a bind changed in the config file was silently
    ignored by a reload. The listening sockets stay (the workers and their
    hand-offs number them), and a warning says a restart applies it."""
    first, second = free_port(), free_port()
    write_app(str(tmp_path), "v1")
    conf = tmp_path / "conf.py"
    conf.write_text(f'bind = ["127.0.0.1:{first}"]\n')
    s = ServerProc("deployed:app", "--pythonpath", str(tmp_path), "-c", str(conf), bind=[])
    try:
        conf.write_text(f'bind = ["127.0.0.1:{second}"]\n')
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "--bind changed to 127.0.0.1:%d" % second in s.log(), 30), s.log()
        assert "a restart applies it" in s.log()
        with Conn(first) as c:
            assert ask(c)[0] == "v1"
    finally:
        s.stop()



def test_a_scrape_under_way_when_the_master_re_executes_is_answered(tmp_path):
    """Before, the clients the master had accepted on --metrics were reset
    by its exec (test_metrics's scraper failed now and then with
    ConnectionResetError). Now it answers them first (a second at most);
    signals that came meanwhile are handled by the new image (one to scale
    up here), and a stop that came meanwhile cancels the exec."""
    mport = free_port()
    s = start(tmp_path, "--metrics", f"127.0.0.1:{mport}", "--log-level", "debug")
    try:
        c = Conn(mport)
        c.send(b"GET /metrics HTTP/1.1\r\n")                  # the rest comes during the reload
        assert wait_for(lambda: accept_queue(mport) == 0)       # accepted by the master
        write_app(str(tmp_path), "v2")
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "answering 1 --metrics/--stats client(s) before the exec" in s.log(), 30), \
            s.log()[-3000:]
        s.signal(signal.SIGTTIN)                                # queued: for the new image
        c.send(b"Host: m\r\n\r\n")
        r = c.read_response()
        c.close()
        assert r.status == 200 and b"forkwsgi_requests_total" in r.body
        assert wait_for(lambda: versions_served(s, 6)[0] == {"v2"}, 30), s.log()[-3000:]
        assert wait_for(lambda: len(workers(s)) == 3, 20), s.log()[-3000:]
        assert s.log().count("Reloaded in place") == 1

        c = Conn(mport)
        c.send(b"GET /metrics HTTP/1.1\r\n")
        assert wait_for(lambda: accept_queue(mport) == 0)
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: s.log().count("answering 1 --metrics") == 2, 30), s.log()[-3000:]
        s.signal(signal.SIGTERM)
        assert s.proc.wait(timeout=20) == 0
        assert "reload: a stop came first; no re-execution" in s.log()
        assert s.log().count("Reloaded in place") == 1
        c.close()
    finally:
        s.stop()


SLOW_IMPORT = '''import os, time
HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = open(os.path.join(HERE, "version")).read()
def in_a_worker():      # not the reload's import check
    with open("/proc/self/cmdline", "rb") as f:
        return f.read().startswith(b"forkwsgi: worker")
if os.path.exists(os.path.join(HERE, "slow")) and in_a_worker():
    open(os.path.join(HERE, "importing-%d" % os.getpid()), "w").close()
    time.sleep(4)
def app(environ, start_response):
    body = ("%s %d" % (VERSION, os.getpid())).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
'''


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR2])
def test_a_reload_during_a_reload_leaves_only_workers_with_the_newest_code(tmp_path, sig):
    """A second reload while the first one's new worker was still importing
    the app: that worker was taken for an old one, but only one old worker
    retires per new one ready, so it was never retired: two workers for
    --workers 1 for good, one serving the code of the reload before (seen
    beside a CPU hog: 60 s and counting)."""
    d = str(tmp_path)
    (tmp_path / "slowapp.py").write_text(SLOW_IMPORT)
    (tmp_path / "version").write_text("v1")
    s = ServerProc("slowapp:app", "--pythonpath", d, "--workers", "1", "--lazy-apps")
    try:
        assert wait_for(lambda: versions_served(s, 2)[0] == {"v1"}, 20)
        (tmp_path / "version").write_text("v2")
        (tmp_path / "slow").write_text("")
        s.signal(sig)
        # The first reload's worker is importing (for 4 s) when the second comes.
        assert wait_for(lambda: any(n.startswith("importing-") for n in os.listdir(d)), 30), s.log()[-3000:]
        os.unlink(tmp_path / "slow")
        (tmp_path / "version").write_text("v3")
        s.signal(sig)
        assert wait_for(lambda: versions_served(s, 4)[0] == {"v3"}, 30), s.log()[-3000:]
        assert wait_for(lambda: len(workers(s)) == 1, 30), (workers(s), s.log()[-3000:])
        assert versions_served(s, 6)[0] == {"v3"}
    finally:
        s.stop()
