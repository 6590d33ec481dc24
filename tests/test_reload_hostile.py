"""Reloads sent during reloads while workers import slowly (hostile
review of retire_leftover_old): after things settle, exactly --workers
workers run, all serving the newest code that imports."""
import os
import signal

import pytest

from conftest import ServerProc
from httpraw import Conn, wait_for
from test_reload import SLOW_IMPORT, Load, versions_served, workers

# SLOW_IMPORT, and an import that fails while a file "broken" exists.
# The check comes before the slow part: a worker that began importing v2
# before v3 was written imports v2 whole.
BREAKABLE = SLOW_IMPORT.replace(
    "def in_a_worker",
    'BROKEN = os.path.exists(os.path.join(HERE, "broken"))\n'
    "def in_a_worker", 1).replace(
    "def app(environ",
    "if BROKEN:\n"
    '    raise RuntimeError("the new code does not import")\n'
    "def app(environ", 1)


def start(tmp_path, n):
    (tmp_path / "slowapp.py").write_text(BREAKABLE)
    (tmp_path / "version").write_text("v1")
    return ServerProc("slowapp:app", "--pythonpath", str(tmp_path), "--workers", str(n), "--lazy-apps",
                      "--log-level", "debug")


def importing(d):
    return [n for n in os.listdir(d) if n.startswith("importing-")]


@pytest.mark.parametrize("n", [1, 2])
def test_code_that_does_not_import_sent_during_a_reload_leaves_the_newest_that_imports(tmp_path, n):
    """Reload 1 (v2) imports slowly; reload 2 (v3) does not import. The
    workers of v2 come ready while the master holds for the import: they
    must be the ones kept, not the v1 ones, and no more than --workers."""
    d = str(tmp_path)
    s = start(tmp_path, n)
    try:
        assert wait_for(lambda: versions_served(s, 2 * n)[0] == {"v1"}, 20)
        (tmp_path / "version").write_text("v2")
        (tmp_path / "slow").write_text("")
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: len(importing(d)) >= n, 30), (importing(d), s.log()[-3000:])
        (tmp_path / "broken").write_text("")
        os.unlink(tmp_path / "slow")
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "could not import the app" in s.log(), 30), s.log()[-3000:]
        # v2's workers finish importing (4 s) meanwhile; then it settles.
        assert wait_for(lambda: versions_served(s, 4 * n)[0] == {"v2"} and len(workers(s)) == n, 30), \
            (versions_served(s, 4 * n), workers(s), s.log()[-4000:])
    finally:
        s.stop()


# A request to /grow makes the worker hold 200 MiB (over --max-rss 150).
GROWING = BREAKABLE.replace(
    "def app(environ, start_response):",
    "HOG = []\n"
    "def app(environ, start_response):\n"
    '    if environ["PATH_INFO"] == "/grow":\n'
    "        HOG.append(bytearray(200 << 20))", 1)


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy-apps", "preload"])
def test_max_rss_with_one_worker_keeps_serving_until_its_replacement_is_ready(tmp_path, lazy):
    """--max-rss retired the worker at once, before its replacement was
    ready: with --workers 1 nobody took its kept-alive connections, and
    every client of a keep-alive load lost its connection (6 of 6 with
    --lazy-apps and a replacement importing for 4 s). As --max-requests
    under --lazy-apps: the replacement first, then the worker retires."""
    d = str(tmp_path)
    (tmp_path / "slowapp.py").write_text(GROWING)
    (tmp_path / "version").write_text("v1")
    s = ServerProc("slowapp:app", "--pythonpath", d, "--workers", "1", "--threads", "2", "--max-rss", "150",
                   "--log-level", "debug", *(["--lazy-apps"] if lazy else []))
    try:
        assert wait_for(lambda: versions_served(s, 2)[0] == {"v1"}, 20)
        before = set(workers(s))
        load = Load(s.port, clients=6, seconds=40)
        assert wait_for(lambda: load.done > 100, 20)
        (tmp_path / "slow").write_text("")      # the replacement imports for 4 s (--lazy-apps)
        with Conn(s.port) as c:
            c.send(b"GET /grow HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
        assert wait_for(lambda: "--max-rss 150" in s.log(), 20), s.log()[-3000:]
        assert wait_for(lambda: set(workers(s)) and not before & set(workers(s)), 30), s.log()[-3000:]
        done = load.done
        # The load goes on on the replacement (or every client has failed).
        wait_for(lambda: load.done > done + 100 or not any(t.is_alive() for t in load.threads), 20)
        failures = load.finish()
        assert failures == [], (failures, s.log()[-3000:])
        assert load.done > done + 100
    finally:
        s.stop()
