"""Real traffic against pre-forked workers (issue 9): keep-alive clients
outnumbering threads, reloads under kept-alive load, stops with requests
already waiting, idle-connection floods, running out of descriptors, and a
master killed outright.

wrk (Debian's package; .ci/run installs it) drives the keep-alive load,
bounded in time, pinned to the other CPU than the server where taskset
exists. Every server and client targets 127.0.0.1 and ends by PID.
"""
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import ServerProc
from httpraw import Conn, established, in_app_header, stop_and_wait, wait_for, wait_in_app

APP_MODES = ("inline",)      # each server here chooses its own --threads

WRK = shutil.which("wrk")
TASKSET = shutil.which("taskset")
needs_wrk = pytest.mark.skipif(WRK is None, reason="wrk is not installed (.ci/run installs it)")


def pinned(cmd, cpu):
    return [TASKSET, "-c", str(cpu)] + cmd if TASKSET and os.cpu_count() >= 2 else cmd


def wrk_cmd(port, connections, seconds, path="/", script=None):
    """wrk's keep-alive load for `seconds` (a Lua script may make it POST),
    pinned to CPU 1. Stopped early by SIGINT, it reports what it did."""
    cmd = [WRK, "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s"]
    if script:
        cmd += ["-s", script]
    return pinned(cmd + [f"http://127.0.0.1:{port}{path}"], 1)


def wrk(port, connections, seconds, path="/", script=None):
    """Keep-alive load: (requests, socket errors, non-2xx responses, wrk's report)."""
    out = subprocess.run(wrk_cmd(port, connections, seconds, path, script),
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    return wrk_report(out)


def wrk_report(out):
    """(requests, socket errors, non-2xx responses, out) from wrk's report."""
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = sum(int(x) for x in m.groups()) if m else 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return requests, errors, int(m.group(1)) if m else 0, out


def error_lines(s):
    return [line for line in s.log().splitlines() if "[ERROR]" in line]


def server(*args, env=None):
    return ServerProc("apps:hello", *args, env=env)


# ---- item 1: keep-alive load with more clients than threads ----------------

@needs_wrk
@pytest.mark.parametrize("workers,threads,clients", [(2, 2, 12), (4, 4, 50)])
def test_keep_alive_clients_outnumbering_threads_lose_nothing(servers, workers, threads, clients):
    """A handed-over socket used to stay in the sender's epoll set; handed
    back under the same fd number it failed EPOLL_CTL_ADD (EEXIST) and the
    connection was dropped: 3,578 read errors per 172k requests at 4x4."""
    s = server("--workers", str(workers), "--threads", str(threads))
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == workers)
    requests, errors, non2xx, out = wrk(s.port, clients, 4)
    assert requests > 2000, out
    assert (errors, non2xx) == (0, 0), out
    assert error_lines(s) == []


# ---- item 3: reloads under kept-alive load ------------------------------------

def keep_alive_clients(port, n, per_client, pause=0.003):
    """n clients, each on one kept-alive connection (http.client reconnects
    only after a clean close between requests, as real clients do); returns
    (answered, failures)."""
    answered, failures = [0], []
    lock = threading.Lock()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for i in range(per_client):
            try:
                conn.request("GET", "/?i=%d" % i)
                r = conn.getresponse()
                body = r.read()
                assert r.status == 200 and body == b"Hello, World!", (r.status, body)
                with lock:
                    answered[0] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted
                with lock:
                    failures.append(repr(e))
                conn.close()
            time.sleep(pause)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, answered, failures


@pytest.mark.parametrize("threads", [1, 2])
def test_reloads_are_invisible_to_kept_alive_clients(servers, threads):
    """Six kept-alive clients, three SIGHUPs: a retiring worker hands its
    idle connections to the new workers instead of closing them (before:
    19 of 2,400 requests failed with RemoteDisconnected)."""
    s = server("--workers", "2", "--threads", str(threads))
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2)
    first = set(s.worker_pids())
    clients, answered, failures = keep_alive_clients(s.port, 6, 400)
    for i in range(3):
        # Each SIGHUP once the clients have made 400 more requests: reloads
        # while they are mid-run, however fast the machine runs them.
        assert wait_for(lambda: answered[0] >= 400 * (i + 1) or failures, timeout=60), s.log()
        s.signal(signal.SIGHUP)
    for t in clients:
        t.join(60)
    assert failures == []
    assert answered[0] == 2400
    assert wait_for(lambda: len(s.worker_pids()) == 2 and not first & set(s.worker_pids()))
    # Each SIGHUP reloads in place (test_reload.py); one that arrives while
    # the check of the previous runs joins it: 2 to 4 sets of workers.
    assert s.log().count("Reloaded in place") >= 1
    assert s.log().count("Booted worker") >= 4
    assert error_lines(s) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_a_worker_sent_sigterm_alone_hands_its_idle_connections_on(servers, threads):
    """kill -TERM of one worker while its master serves on (an operator
    recycling it): it closed its idle kept-alive connections at once, and
    a proxy's pooled connection that was sending its next request on one
    got a reset (a review through nginx: 14-18 POSTs a run answered 502).
    Now it retires as at --max-requests: they go to the other worker,
    unread, and their next requests are served there."""
    s = ServerProc("apps:where", "--workers", "2", "--threads", str(threads))
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2)
    by_pid = {}
    deadline = time.monotonic() + 20
    while len(by_pid) < 2 or min(len(v) for v in by_pid.values()) < 3:
        assert time.monotonic() < deadline, by_pid
        c = Conn(s.port)
        c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.status == 200
        by_pid.setdefault(json.loads(r.body)["pid"], []).append(c)
    victim = sorted(by_pid)[0]
    os.kill(victim, signal.SIGTERM)
    assert wait_for(lambda: victim not in s.worker_pids(), timeout=20), s.log()
    for c in by_pid[victim]:
        c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and json.loads(r.body)["pid"] != victim
    for conns in by_pid.values():
        for c in conns:
            c.close()
    assert error_lines(s) == []


@needs_wrk
@pytest.mark.parametrize("threads", [1, 4])
def test_reloads_under_wrk_load_lose_nothing(servers, threads):
    s = server("--workers", "2", "--threads", str(threads))
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2)

    wrk_done, hupped = threading.Event(), []

    def hups():
        # Each SIGHUP while wrk's connections are open, once the previous
        # reload has booted its workers: up to three reloads, each under load.
        for i in range(3):
            wait_for(lambda: wrk_done.is_set() or
                     (established(s.port) >= 12 and s.log().count("Booted worker") >= 2 * (i + 1)), timeout=30)
            if wrk_done.is_set():
                return
            s.signal(signal.SIGHUP)
            hupped.append(i)

    t = threading.Thread(target=hups)
    t.start()
    try:
        requests, errors, non2xx, out = wrk(s.port, 12, 4)
    finally:
        wrk_done.set()
        t.join()
    print(f"{len(hupped)} SIGHUP(s) during wrk's 4 s")
    assert hupped, "no reload while wrk ran"
    assert requests > 2000, out
    assert (errors, non2xx) == (0, 0), out
    assert error_lines(s) == []


@needs_wrk
def test_max_requests_recycling_loses_nothing_for_kept_alive_clients(servers):
    """--max-requests retires workers all the time: each hands its idle
    connections to the others, with no hand-off mode of its own (4x1)."""
    s = server("--workers", "4", "--max-requests", "500", "--max-requests-jitter", "100")
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 4)
    requests, errors, non2xx, out = wrk(s.port, 16, 4)
    assert requests > 5000, out
    assert s.log().count("max-requests") >= 4
    assert (errors, non2xx) == (0, 0), out
    assert error_lines(s) == []


def socket_holders(s, port, peer_port):
    """Descriptors, in the server's processes (master, workers), of the
    server's end (local port `port`) of the connection from `peer_port`."""
    with open("/proc/net/tcp") as f:
        inode = next(line.split()[9] for line in f.readlines()[1:]
                     if int(line.split()[1].split(":")[1], 16) == port and
                     int(line.split()[2].split(":")[1], 16) == peer_port)
    n = 0
    for pid in [s.pid, *s.worker_pids()]:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]"
            except OSError:
                pass
    return n


QUICK = b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n"


def served_by(c):
    """The worker that answered c's request (apps:where)."""
    r = c.read_response()
    assert r.status == 200, r
    return json.loads(r.body)["pid"]


def booted(s, index):
    """PIDs of worker `index` as the master's log says it booted them, in order."""
    return [int(p) for p in re.findall(rf"Booted worker {index} \(pid (\d+)\)", s.log())]


def test_a_worker_forked_while_a_connection_is_stranded_does_not_inherit_it(servers, tmp_path):
    """Worker 2 retires (SIGTTOU) and hands its idle kept-alive connection
    to worker 1, which is stopped and then killed before it takes it: the
    master takes it back and holds it (stranded) until a worker is up, and
    forks worker 1's replacement meanwhile. That child must not keep the
    master's copy: with it, the worker that serves the connection later
    closes its own copy but the socket lives on, still in its epoll set
    with a pointer to the freed connection. Before: that worker died of
    SIGSEGV at its next event (under --max-requests recycling behind nginx:
    a 502 for the request it was serving)."""
    s = ServerProc("apps:where", "--workers", "2")
    servers.append(s)
    assert wait_for(lambda: booted(s, 1) and booted(s, 2), timeout=20)
    one, two = booted(s, 1)[0], booted(s, 2)[0]
    # A worker in the app (inline) takes no other connection: the second
    # goes to the other worker (and so both are up).
    a = Conn(s.port, timeout=20)
    a.send(b"GET /?t=0.5 HTTP/1.1\r\nHost: a\r\n" + in_app_header(tmp_path / "in-app") + b"\r\n")
    assert wait_in_app(tmp_path / "in-app")
    b = Conn(s.port, timeout=20)
    b.send(QUICK)
    on = {served_by(c): c for c in (b, a)}
    assert set(on) == {one, two}, on
    on[one].close()
    kept = on[two]
    with kept:
        stop_and_wait(one)
        s.signal(signal.SIGTTOU)        # worker 2 retires: the connection goes to worker 1's queue
        assert wait_for(lambda: f"Worker 2 (pid {two}) exited" in s.log(), timeout=20), s.log()
        os.kill(one, signal.SIGKILL)    # the master takes it back, and starts a new worker 1
        assert wait_for(lambda: len(booted(s, 1)) == 2, timeout=20), s.log()
        new = booted(s, 1)[1]
        kept.send(QUICK)
        assert served_by(kept) == new
        assert socket_holders(s, s.port, kept.sock.getsockname()[1]) == 1
    # The client closed it: the new worker closes its end and serves on.
    with Conn(s.port, timeout=20) as c:
        for _ in range(3):
            c.send(QUICK)
            assert served_by(c) == new
    died = [line for line in s.log().splitlines() if " died " in line]
    assert len(died) == 1 and "SIGKILL" in died[0], s.log()        # only the one killed here


def test_a_connection_closed_while_a_forked_child_holds_it(servers):
    """The app forks (the child inherits the client's socket and outlives
    the request); then the client closes. The worker closes its end, but
    the socket lives on in the child: its epoll registration must not
    (it would point at the freed connection). Before: the worker died of
    SIGSEGV at the next event for it."""
    s = ServerProc("apps:forks", "--workers", "1")          # inline: its watches stay armed
    servers.append(s)
    with Conn(s.port, timeout=20) as k:
        k.send(b"GET /?t=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        r = k.read_response()
        assert r.status == 200
        worker = int(r.body)
    with Conn(s.port, timeout=20) as c:       # served on by the same worker
        for _ in range(3):
            c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
            r = c.read_response()
            assert r.status == 200 and int(r.body) == worker, s.log()
    assert " died " not in s.log(), s.log()


# ---- item 3b: a stop never resets a connection whose request is waiting ----

def received(port, peer_port):
    """Bytes waiting unread in the server's end (local port `port`) of the
    connection from `peer_port`, from /proc/net/tcp (None: no such socket)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == peer_port:
                return int(queues.split(":")[1], 16)
    return None


def test_stop_serves_a_request_already_waiting_on_an_idle_connection(servers, tmp_path):
    """Inline, one process: while the loop is busy in a slow request, a
    kept-alive connection's next request arrives and SIGTERM too. That
    connection is not idle: its request is served (with Connection: close),
    not answered with a reset."""
    s = ServerProc("apps:where", "--workers", "0")
    servers.append(s)
    with Conn(s.port, timeout=15) as kept, Conn(s.port, timeout=15) as slow:
        kept.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert kept.read_response().status == 200
        mark = tmp_path / "in-app"
        slow.send(b"GET /?t=1.0 HTTP/1.1\r\nHost: a\r\n" + in_app_header(mark) + b"\r\n")
        assert wait_in_app(mark)                          # the loop is in the app
        kept.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        # The request waits in the server's socket, unread.
        assert wait_for(lambda: received(s.port, kept.sock.getsockname()[1]), timeout=10)
        s.signal(signal.SIGTERM)
        assert slow.read_response().status == 200
        r = kept.read_response()
        assert r.status == 200 and r.header("connection") == "close"
        assert kept.is_closed(5)
    assert s.proc.wait(10) == 0


# ---- item 3c: idle connections never slow down accepting ---------------------

def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= n


@pytest.mark.parametrize("workers,threads", [(2, 2), (4, 4)])
def test_a_thousand_idle_connections_do_not_delay_a_request(servers, workers, threads):
    """A silent connection steers placement for 30 ms but never holds a
    thread's place (before: a request behind 1,000 idle connections at 2x2
    waited 7.5 s; behind 2,000 at 4x4, 2.15 s)."""
    if not raise_nofile(4096):
        pytest.skip("needs RLIMIT_NOFILE >= 4096")
    s = server("--workers", str(workers), "--threads", str(threads))   # inherits the limit
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == workers)
    idle = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", s.port)))
        worst = 0.0
        for _ in range(3):
            t = time.monotonic()
            with Conn(s.port, timeout=20) as c:
                c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                assert c.read_response().status == 200
            worst = max(worst, time.monotonic() - t)
        assert worst < 0.5, worst
    finally:
        for c in idle:
            c.close()


# ---- item 3d: out of descriptors, paused workers sleep ------------------------

def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_workers_out_of_descriptors_stay_asleep(servers):
    """ulimit -n 256 and 600 connections on 2x2: every worker pauses
    accepting; they used to kick each other in a loop (38-41 % CPU each)."""
    if not raise_nofile(2048):
        pytest.skip("needs RLIMIT_NOFILE >= 2048")
    s = ServerProc("apps:hello", "--workers", "2", "--threads", "2", nofile=256)
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2)
    workers = s.worker_pids()
    conns = []
    try:
        for _ in range(600):
            conns.append(socket.create_connection(("127.0.0.1", s.port)))
        # Every worker paused accepting (each says so once).
        assert wait_for(lambda: all(f"[{p}] [ERROR] accept: Too many open files" in s.log() for p in workers),
                        timeout=10)
        before = {p: cpu_seconds(p) for p in workers}
        time.sleep(2.0)
        used = {p: cpu_seconds(p) - before[p] for p in workers}
        assert all(v < 0.1 for v in used.values()), used     # under 5 % of a CPU
    finally:
        for c in conns:
            c.close()
    # Descriptors free again: the workers accept and serve.
    def served():
        try:
            with Conn(s.port, timeout=5) as c:
                c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
                return c.read_response().status == 200
        except OSError:
            return False
    assert wait_for(served, timeout=10)


# ---- item 3e: a worker whose master died lets go of the port at once ----------

def test_orphaned_worker_frees_the_port_and_finishes_its_request(servers, tmp_path):
    s = ServerProc("apps:where", "--workers", "2", "--threads", "2")
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2)
    workers = s.worker_pids()
    answer = {}
    marker = str(tmp_path / "entered")

    def slow():
        with Conn(s.port, timeout=20) as c:
            c.send(b"GET /?t=3 HTTP/1.1\r\nHost: a\r\n" + in_app_header(marker) + b"\r\n")
            answer["r"] = c.read_response()

    t = threading.Thread(target=slow)
    t.start()
    assert wait_in_app(marker)              # the request is in the app when the master dies
    os.kill(s.pid, signal.SIGKILL)
    s.proc.wait(5)
    try:
        def refused():
            try:
                socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
                return False
            except ConnectionRefusedError:
                return True
        assert wait_for(refused, timeout=1.0)
        again = socket.socket()
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", s.port))       # a new master could bind it
        again.close()
        t.join(20)
        assert answer["r"].status == 200
    finally:
        for p in workers:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
