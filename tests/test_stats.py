"""The stats server (--stats, issue 12): uWSGI's document, answered by the
master from shared memory; counts checked exactly against the requests the
test makes, and the real uwsgitop (PyPI) run in a terminal (tmux) on it.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import HERE, ServerProc
from httpraw import Conn, free_port, get_each_on_a_new_connection, wait_for


APP_MODES = ("inline",)


def fetch(addr):
    """One document from the stats server at (host, port) or a unix path."""
    fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(addr)
        with s.makefile("rb") as f:         # the server closes after the document
            return json.load(f)


def start(*args, app="apps:logged"):
    port = free_port()
    s = ServerProc(app, "--stats", f"127.0.0.1:{port}", *args)
    s.stats_addr = ("127.0.0.1", port)
    return s


def test_counts_are_exact_across_workers_and_threads():
    s = start("--workers", "2", "--threads", "2")
    try:
        sent = {"2xx": 0, "4xx": 0, "5xx": 0}
        body = 0
        conns = [Conn(s.port) for _ in range(6)]
        for i in range(120):
            status = (200, 404, 503)[i % 3]
            n = i % 7
            c = conns[i % len(conns)]
            c.send(f"GET /?status={status}&len={n} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            r = c.read_response()
            assert r.status == status
            sent[f"{status // 100}xx"] += 1
            body += n
        for c in conns:
            c.close()
        # A response is counted once it is on the wire, by the loop after
        # the app thread sent it: the last may land a moment after the client read it.
        assert wait_for(lambda: sum(w["requests"] for w in fetch(s.stats_addr)["workers"]) == 120, 5)
        doc = fetch(s.stats_addr)
        workers = doc["workers"]
        assert sorted(w["pid"] for w in workers) == sorted(s.worker_pids())
        assert sum(w["requests"] for w in workers) == 120
        assert sum(w["tx"] for w in workers) == body
        for cls, n in sent.items():
            assert sum(w["forkwsgi"]["status_classes"][cls] for w in workers) == n
        assert sum(core["requests"] for w in workers for core in w["cores"]) == 120
        # The app threads, and the loop thread (core 2) once it ran requests
        # itself (--inline-first: a worker's first request runs there; how
        # many more do depends on the machine: a call that sleeps 2 ms
        # sends the next second's to the app threads).
        assert all([c["id"] for c in w["cores"]] == [0, 1, 2] and w["cores"][2]["requests"] > 0
                   for w in workers if w["requests"])
        assert all(w["status"] == "idle" and w["respawn_count"] == 0 for w in workers)
        assert all(w["avg_rt"] > 0 and w["running_time"] >= w["avg_rt"] for w in workers if w["requests"])
        assert doc["pid"] == s.pid and doc["forkwsgi"]["totals"]["requests"] == 120
        # delta_requests: since the previous document.
        again = fetch(s.stats_addr)
        assert sum(w["delta_requests"] for w in again["workers"]) == 0
    finally:
        s.stop()


def test_exceptions_are_counted():
    s = start("--workers", "1", app="apps:errors")
    try:
        for path in ("/raise", "/raise-after-start", "/raise-mid-body", "/no-start"):
            with Conn(s.port) as c:
                c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                try:
                    c.read_response()
                except Exception:  # noqa: BLE001 - a broken response is what these paths make
                    pass
        assert wait_for(lambda: fetch(s.stats_addr)["workers"][0]["exceptions"] == 4, 5), fetch(s.stats_addr)
    finally:
        s.stop()


def test_busy_workers_and_the_listen_queue():
    """Every worker busy: the master still answers, shows each busy with
    the request it is in; connections waiting for a thread are in the
    kernel's queue and counted there."""
    s = start("--workers", "2", "--threads", "1", app="apps:sleep")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        socks = []

        def busy(doc):
            return [w for w in doc["workers"] if w["status"] == "busy"]
        conns = []
        for _ in range(2):
            c = Conn(s.port, timeout=20)
            c.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: t\r\n\r\n")
            conns.append(c)
        assert wait_for(lambda: len(busy(fetch(s.stats_addr))) == 2, 5)
        for _ in range(3):              # no worker takes these while both are busy
            socks.append(socket.create_connection(("127.0.0.1", s.port)))
        doc = fetch(s.stats_addr)
        assert doc["load"] == 2
        assert doc["listen_queue"] == 3 and doc["sockets"][0]["queue"] == 3
        for w in busy(doc):
            core = w["cores"][0]
            assert core["in_request"] == 1 and core["req_info"]["request"] == "GET /?..."
            assert abs(core["req_info"]["request_start"] - time.time()) < 5
        for c in conns:
            assert c.read_response().status == 200
            c.close()
        for x in socks:
            x.close()
    finally:
        s.stop()


def test_restarts_and_totals_survive_them():
    """A worker recycled twice by --max-requests, then killed: its respawn
    count, and the totals (requests since the start) that never go back."""
    s = start("--workers", "1", "--max-requests", "50", app="apps:hello")
    try:
        get_each_on_a_new_connection(s.port, 130)
        assert wait_for(lambda: fetch(s.stats_addr)["forkwsgi"]["totals"]["requests"] == 130, 5)
        # The second recycle done (the worker of requests 101-130 alone), then the kill.
        assert wait_for(lambda: [w["respawn_count"] for w in fetch(s.stats_addr)["workers"]] == [2]
                        and len(s.worker_pids()) == 1, 10)
        victim = s.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)

        def replaced():
            pids = s.worker_pids()
            return len(pids) == 1 and victim not in pids
        assert wait_for(replaced, 10)
        doc = fetch(s.stats_addr)
        totals = doc["forkwsgi"]["totals"]
        assert totals["requests"] == 130
        assert totals["respawns"] == 3            # two recycles (at 50 and 100) and the kill
        assert [w["respawn_count"] for w in doc["workers"]] == [3]
    finally:
        s.stop()


def test_the_start_up_line_gives_the_stats_address_as_no_url():
    """The stats server is no HTTP server (uWSGI's: a raw JSON document per
    connection): the start-up line says so, and gives HOST:PORT, not an
    http:// URL a browser would be pointed at in vain."""
    s = start("--workers", "1", app="apps:hello")
    try:
        host, port = s.stats_addr
        assert f"Stats (uWSGI's, raw JSON over TCP) at {host}:{port}" in s.log(), s.log()
        assert f"http://{host}:{port}" not in s.log()
    finally:
        s.stop()


def test_unix_socket_and_reload_in_place_keep_the_stats_server(tmp_path):
    path = str(tmp_path / "stats.sock")
    s = ServerProc("apps:hello", "--workers", "1", "--stats", f"unix:{path}")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        assert f"Stats (uWSGI's, raw JSON over a unix socket) at unix:{path}" in s.log()
        with Conn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            c.read_response()
        assert wait_for(lambda: fetch(path)["forkwsgi"]["totals"]["requests"] == 1, 5)
        old = s.worker_pids()
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: s.worker_pids() and not set(old) & set(s.worker_pids()), 20), s.log()
        doc = fetch(path)
        assert doc["forkwsgi"]["reloads"] == 1 and doc["forkwsgi"]["totals"]["requests"] == 1
        assert doc["pid"] == s.pid
    finally:
        s.stop()


@pytest.mark.skipif(not shutil.which("tmux") or not shutil.which("uwsgitop"), reason="needs tmux and uwsgitop")
def test_uwsgitop_shows_every_worker():
    s = start("--workers", "2", "--threads", "2", app="apps:hello")
    session = f"fwtop{os.getpid()}"
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        with Conn(s.port) as c:
            for _ in range(25):
                c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                c.read_response()
        host, port = s.stats_addr
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "40",
                        f"uwsgitop --frequency 1 {host}:{port}"], check=True, timeout=10)

        def screen():
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True, timeout=10).stdout
        assert wait_for(lambda: all(str(p) in screen() for p in s.worker_pids()), 15), screen()
        text = screen()
        assert "req: 25" in text, text
        rows = [ln.split() for ln in text.splitlines() if any(ln.split()[2:3] == [str(p)] for p in s.worker_pids())]
        assert sorted(int(r[3]) for r in rows) == sorted(w["requests"] for w in fetch(s.stats_addr)["workers"])
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10)
        s.stop()


@pytest.mark.skipif(not shutil.which("tmux") or not shutil.which("uwsgitop"), reason="needs tmux and uwsgitop")
def test_uwsgitop_total_survives_worker_recycles():
    """Issue 25, item 16: uwsgitop's total (req:) went down at each
    --max-requests recycle (981 shown for 4,020 served): it sums the
    workers' "requests", and a new worker started from 0. The requests of
    ended workers are now reported by the worker that serves their index."""
    s = start("--workers", "2", "--max-requests", "20", app="apps:hello")
    session = f"fwrec{os.getpid()}"
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        served = 0
        for _ in range(3):
            get_each_on_a_new_connection(s.port, 35)
            served += 35
        assert wait_for(lambda: s.log().count("max-requests") >= 4, 10), s.log()
        assert wait_for(lambda: sum(w["requests"] for w in fetch(s.stats_addr)["workers"]) == served, 10), \
            fetch(s.stats_addr)["workers"]
        host, port = s.stats_addr
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "40",
                        f"uwsgitop --frequency 1 {host}:{port}"], check=True, timeout=10)

        def screen():
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True, timeout=10).stdout
        assert wait_for(lambda: f"req: {served}" in screen(), 15), screen()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10)
        s.stop()


def test_forkwsgi_top_once_json():
    s = start("--workers", "2", "--threads", "2", app="apps:sleep")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        get_each_on_a_new_connection(s.port, 30, "/?t=0.001")
        slow = Conn(s.port, timeout=20)
        slow.send(b"GET /?t=3 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert wait_for(lambda: fetch(s.stats_addr)["load"] == 1, 5)
        host, port = s.stats_addr
        p = subprocess.run([sys.executable, "-m", "forkwsgi", "top", f"{host}:{port}", "--once", "--json",
                            "--interval", "0.5"], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")))
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)
        assert out["server"]["pid"] == s.pid and out["server"]["requests"] == 30
        assert out["server"]["in_flight"] == 1 and out["server"]["workers"] == 2
        assert sorted(w["pid"] for w in out["workers"]) == sorted(s.worker_pids())
        assert sum(w["requests"] for w in out["workers"]) == 30
        busy = [w for w in out["workers"] if w["oldest_request"]]
        assert len(busy) == 1 and busy[0]["oldest_request"] == "GET /?..." and busy[0]["state"] == "busy"
        assert 0 <= busy[0]["oldest_age_s"] < 5
        assert slow.read_response().status == 200
        slow.close()
        # A server that does not answer: one line and exit 1.
        bad = subprocess.run([sys.executable, "-m", "forkwsgi", "top", "127.0.0.1:1", "--once"],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1 and "no answer from 127.0.0.1:1" in bad.stderr
    finally:
        s.stop()


def run_top(addr, *args):
    host, port = addr
    return subprocess.run([sys.executable, "-m", "forkwsgi", "top", f"{host}:{port}", *args],
                          capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")))


def test_forkwsgi_top_age_of_the_oldest_request_is_exact():
    """top's OLDEST REQUEST age comes from the document's request_age (exact),
    not uWSGI's request_start (whole seconds: now - request_start overstated
    the age by the fraction of a second at which the request began). The
    request begins half a second past a whole second, so the old reading
    would be about 0.5 s off."""
    s = start("--workers", "1", "--threads", "2", app="apps:sleep")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        assert wait_for(lambda: 0.5 <= time.time() % 1 < 0.6, 2, interval=0.005)
        slow = Conn(s.port, timeout=20)
        slow.send(b"GET /?t=4 HTTP/1.1\r\nHost: t\r\n\r\n")
        sent = time.monotonic()
        assert wait_for(lambda: fetch(s.stats_addr)["load"] == 1, 5)
        core = next(c for c in fetch(s.stats_addr)["workers"][0]["cores"] if c["in_request"])
        assert isinstance(core["req_info"]["request_start"], int)           # uWSGI's, for uwsgitop
        assert 0 < core["req_info"]["request_age"] < time.monotonic() - sent + 0.05
        time.sleep(1)
        p = run_top(s.stats_addr, "--once", "--json", "--interval", "0.3")
        # top's last reading of the document came before it exited: the true
        # age then is at most this, and less only by the time top took to
        # print and exit.
        at_most = time.monotonic() - sent
        assert p.returncode == 0, p.stderr
        (row,) = json.loads(p.stdout)["workers"]
        assert row["oldest_request"] == "GET /?..." and row["state"] == "busy" and row["in_flight"] == 1
        assert at_most - 0.3 <= row["oldest_age_s"] <= at_most + 0.1, (row, at_most)
        assert slow.read_response().status == 200
        slow.close()
    finally:
        s.stop()


def test_a_worker_with_requests_in_flight_is_busy_in_every_document():
    """status (busy / idle) and in_flight come from one reading: under load,
    no document shows a worker idle with requests in flight, or busy with
    none (they came from two readings, a moment apart, and disagreed in
    about a third of the documents). Bounded: 2 s of load, 4 clients."""
    s = start("--workers", "1", "--threads", "2", app="apps:hello")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        stop = time.monotonic() + 2

        def load():
            with Conn(s.port) as c:
                while time.monotonic() < stop:
                    c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                    c.read_response()
        clients = [threading.Thread(target=load) for _ in range(4)]
        for t in clients:
            t.start()
        docs, seen_busy, wrong = 0, 0, []
        while time.monotonic() < stop:
            for w in fetch(s.stats_addr)["workers"]:
                docs += 1
                seen_busy += w["forkwsgi"]["in_flight"] > 0
                if (w["status"] == "busy") != (w["forkwsgi"]["in_flight"] > 0):
                    wrong.append((w["status"], w["forkwsgi"]["in_flight"]))
        for t in clients:
            t.join(10)
        assert docs > 20 and seen_busy > 0
        assert wrong == [], f"{len(wrong)} of {docs}: {wrong[:5]}"
    finally:
        s.stop()


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
def test_forkwsgi_top_live_in_a_terminal():
    s = start("--workers", "2", app="apps:hello")
    session = f"fwtop2{os.getpid()}"
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        get_each_on_a_new_connection(s.port, 12)
        host, port = s.stats_addr
        env = f"PYTHONPATH={HERE}:{os.environ.get('PYTHONPATH', '')}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "30",
                        f"env {env} {sys.executable} -m forkwsgi top {host}:{port} --interval 0.3; sleep 30"],
                       check=True, timeout=10)

        def screen():
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True, timeout=10).stdout
        assert wait_for(lambda: all(str(p) in screen() for p in s.worker_pids()), 15), screen()
        text = screen()
        assert f"master {s.pid}" in text and "requests 12" in text and "P99ms" in text, text
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True, timeout=10)
        assert wait_for(lambda: "P99ms" not in screen(), 10), screen()      # it quit (curses restored the screen)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10)
        s.stop()


def test_listen_queue_of_a_unix_socket(tmp_path):
    """sock_diag gives a unix listener's queue, as TCP_INFO a TCP one's."""
    sock_path = str(tmp_path / "app.sock")
    port = free_port()
    s = ServerProc("apps:sleep", "--workers", "1", "--stats", f"127.0.0.1:{port}", bind=[f"unix:{sock_path}"])
    try:
        busy = Conn(None, path=sock_path, timeout=20)
        busy.send(b"GET /?t=2 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert wait_for(lambda: fetch(("127.0.0.1", port))["load"] == 1, 5)
        waiting = []
        for _ in range(3):
            w = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            w.connect(sock_path)
            waiting.append(w)
        doc = fetch(("127.0.0.1", port))
        assert doc["listen_queue"] == 3 and doc["sockets"][0]["queue"] == 3
        assert doc["sockets"][0]["max_queue"] > 3
        assert busy.read_response().status == 200
        busy.close()
        for w in waiting:
            w.close()
    finally:
        s.stop()


def non_loopback_ipv4():
    """An address of this machine other than 127.0.0.1, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect(("192.0.2.1", 9))         # no packet is sent: this picks the outgoing address
            addr = u.getsockname()[0]
        return None if addr.startswith("127.") else addr
    except OSError:
        return None


def test_a_bare_port_listens_on_loopback_and_hides_query_strings():
    """Issue 24, item 5: --stats 18331 and --metrics :18332 listened on
    0.0.0.0, and the stats (no authentication) showed in-flight request
    lines with their query strings (api_key=SECRET). A bare port now listens
    on 127.0.0.1 only (said at start), and a query string shows as "?..."
    unless --stats-query-strings."""
    sport, mport = free_port(), free_port()
    s = ServerProc("apps:sleep", "--stats", str(sport), "--metrics", f":{mport}")
    other = non_loopback_ipv4()
    try:
        assert f"at 127.0.0.1:{sport}" in s.log() and f"127.0.0.1:{mport}" in s.log(), s.log()
        for port in (sport, mport):
            if other:
                with pytest.raises(OSError):
                    socket.create_connection((other, port), timeout=2).close()
        c = Conn(s.port, timeout=20)
        c.send(b"GET /?t=1&api_key=SECRET123 HTTP/1.1\r\nHost: t\r\n\r\n")

        def lines():
            doc = fetch(("127.0.0.1", sport))
            return [k["req_info"]["request"] for w in doc["workers"] for k in w["cores"] if k["req_info"]]
        assert wait_for(lambda: lines() == ["GET /?..."], 5), lines()
        assert "SECRET123" not in json.dumps(fetch(("127.0.0.1", sport)))
        assert c.read_response().status == 200
        c.close()
    finally:
        s.stop()
    s = start("--stats-query-strings", app="apps:sleep")
    try:
        with Conn(s.port, timeout=20) as c:
            c.send(b"GET /?t=1&api_key=SECRET123 HTTP/1.1\r\nHost: t\r\n\r\n")
            assert wait_for(lambda: "GET /?t=1&api_key=SECRET123" in json.dumps(fetch(s.stats_addr)), 5)
            assert c.read_response().status == 200
    finally:
        s.stop()
