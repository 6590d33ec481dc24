"""App threads and load-aware accept (--threads, --balance): real worker
processes, real sockets on 127.0.0.1, real signals.

Who served what is read from the answers of apps:where (pid, thread, and
CLOCK_MONOTONIC start and end, which compare across processes): two requests
ran at the same time in one process when their intervals overlap. Nothing
here asserts a speed.
"""
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from httpraw import Closed, Conn, in_app_header, request, wait_for, wait_in_app
from test_handover import needs_wrk, wrk
from test_supervision import free_port

# Every server here sets its own --threads.
APP_MODES = ("inline",)


def get_json(port, path, timeout=20):
    r = request(port, f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode(), timeout=timeout)
    assert r.status == 200, r
    return json.loads(r.body)


def burst(port, n, path):
    """n requests released together, each on a new connection; their answers."""
    gate = threading.Barrier(n)
    out, errors = [None] * n, []

    def one(i):
        try:
            gate.wait(10)
            out[i] = get_json(port, path)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def overlap(a, b):
    return a["start"] < b["end"] and b["start"] < a["end"]


def most_at_once(answers):
    """Per pid, the largest number of requests running at one moment."""
    peak = collections.Counter()
    for a in answers:
        here = [b for b in answers if b["pid"] == a["pid"] and b["start"] <= a["start"] < b["end"]]
        peak[a["pid"]] = max(peak[a["pid"]], len(here))
    return peak


def ready_workers(s, n):
    """Wait until the master has n workers and each has started its loop."""
    assert wait_for(lambda: len(s.worker_pids()) == n and s.log().count("Booted worker") >= n, timeout=20)
    seen = set()
    deadline = time.monotonic() + 20
    while len(seen) < n and time.monotonic() < deadline:
        seen.add(get_json(s.port, "/?t=0")["pid"])
    assert len(seen) == n, (seen, s.worker_pids())
    return sorted(seen)


def listening_sockets(port):
    """LISTEN sockets on 127.0.0.1:port, from /proc/net/tcp."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                n += 1
    return n


# ---- threads ---------------------------------------------------------------

def test_threads_run_requests_at_once_in_one_process(make_server):
    s = make_server("apps:where", "--workers", "0", "--threads", "4")
    answers = burst(s.port, 4, "/?t=0.6")
    assert {a["pid"] for a in answers} == {s.pid}
    assert len({a["thread"] for a in answers}) == 4
    assert all(overlap(a, b) for a in answers for b in answers)
    assert all(a["multithread"] is True for a in answers)


def voluntary_switches(pid, tid):
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return int(next(line for line in f if line.startswith("voluntary_ctxt_switches")).split()[1])


def test_a_kept_alive_request_on_an_app_thread_wakes_the_loop_once(make_server):
    """The loop hands a request to an app thread; the thread answers. It
    used to wake the loop through the pool's eventfd to take the connection
    back and arm its socket: a second context switch of the loop per
    request. The thread arms the socket itself now and leaves the
    connection unannounced, so the loop wakes once per request: when the
    next one arrives."""
    s = make_server("apps:hello", "--workers", "0", "--threads", "2")
    n = 300
    with Conn(s.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 200
        before = voluntary_switches(s.pid, s.pid)        # the loop is the main thread
        for _ in range(n):
            c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            assert c.read_response().status == 200
        per_request = (voluntary_switches(s.pid, s.pid) - before) / n
    assert per_request < 1.25, per_request        # 1.0 now; 1.50-1.55 before


def test_one_thread_is_inline_and_not_multithread(make_server):
    s = make_server("apps:where", "--workers", "0")
    answers = burst(s.port, 3, "/?t=0.2")
    assert most_at_once(answers)[s.pid] == 1
    assert all(a["multithread"] is False for a in answers)


def test_a_worker_runs_at_most_its_threads_and_the_rest_wait(make_server):
    """Backpressure: past its threads a worker stops accepting; the extra
    connections wait in the kernel's queue and are all served."""
    s = make_server("apps:where", "--workers", "1", "--threads", "2")
    ready_workers(s, 1)
    answers = burst(s.port, 6, "/?t=0.4")
    assert max(most_at_once(answers).values()) == 2


def test_pipelined_and_kept_alive_requests_on_threads(make_server):
    s = make_server("apps:echo", "--workers", "0", "--threads", "3")
    with Conn(s.port) as c:
        c.send(b"".join(b"GET /p%d HTTP/1.1\r\nHost: a\r\n\r\n" % i for i in range(20)))
        paths = [json.loads(c.read_response().body)["path"] for _ in range(20)]
        assert paths == ["/p%d" % i for i in range(20)]
        for i in range(5):
            c.send(b"POST /k HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
            assert json.loads(c.read_response().body)["body"] == "abc"


# ---- least-busy ------------------------------------------------------------

def test_least_busy_puts_one_request_per_worker_before_doubling_up(make_server):
    s = make_server("apps:where", "--workers", "4", "--threads", "2")
    pids = ready_workers(s, 4)
    for _ in range(2):
        four = burst(s.port, 4, "/?t=0.8")
        assert sorted(a["pid"] for a in four) == pids, four
        eight = burst(s.port, 8, "/?t=0.8")
        assert collections.Counter(a["pid"] for a in eight) == {p: 2 for p in pids}, eight
        assert all(v == 2 for v in most_at_once(eight).values())


def test_kept_alive_request_at_a_saturated_worker_moves_to_a_free_one(make_server, tmp_path):
    s = make_server("apps:where", "--workers", "2", "--threads", "2", "--keep-alive", "30")
    ready_workers(s, 2)
    conns = collections.defaultdict(list)
    for _ in range(20):            # kept-alive connections, until 3 sit on one worker
        c = Conn(s.port, timeout=20)
        c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        conns[json.loads(c.read_response().body)["pid"]].append(c)
        if any(len(v) >= 3 for v in conns.values()):
            break
    busy = next(p for p, v in conns.items() if len(v) >= 3)
    other = next(p for p in s.worker_pids() if p != busy)
    a, b, c = conns[busy][:3]
    try:
        marks = [tmp_path / "a", tmp_path / "b"]
        a.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: a\r\n" + in_app_header(marks[0]) + b"\r\n")
        b.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: a\r\n" + in_app_header(marks[1]) + b"\r\n")
        assert all(wait_in_app(m) for m in marks)      # both threads of `busy` are in the app now
        c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        moved = json.loads(c.read_response().body)
        assert moved["pid"] == other, (moved, busy)
        ra, rb = json.loads(a.read_response().body), json.loads(b.read_response().body)
        assert ra["pid"] == rb["pid"] == busy
        assert moved["end"] < ra["end"]          # it did not wait behind them
        # The moved connection stays usable, now served by the other worker.
        c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        assert json.loads(c.read_response().body)["pid"] == other
    finally:
        for v in conns.values():
            for x in v:
                x.close()


def test_sigkilled_worker_does_not_throttle_the_others(make_server):
    """A dead worker's slot (count 0) must leave the minimum at once, or the
    live worker would be held to one request at a time. The replacement
    imports the app slowly here, so only the survivor serves meanwhile."""
    s = make_server("apps:where", "--workers", "2", "--threads", "2", "--lazy-apps",
                    env={"FW_TEST_IMPORT_DELAY": "3"})
    victim, survivor = ready_workers(s, 2)
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: victim not in s.worker_pids() and "died (signal SIGKILL)" in s.log())
    answers = burst(s.port, 2, "/?t=1")
    assert [a["pid"] for a in answers] == [survivor, survivor]
    assert overlap(*answers), answers
    assert wait_for(lambda: len(s.worker_pids()) == 2, timeout=20)
    assert len(ready_workers(s, 2)) == 2


def test_sigterm_finishes_in_flight_requests_on_threads(make_server, tmp_path):
    s = make_server("apps:sleep", "--workers", "1", "--threads", "2")
    ready = wait_for(lambda: len(s.worker_pids()) == 1)
    assert ready
    idle = Conn(s.port, timeout=10)
    idle.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert idle.read_response().status == 200
    slow = Conn(s.port, timeout=10)
    mark = tmp_path / "in-app"
    slow.send(b"GET /?t=1.5 HTTP/1.1\r\nHost: a\r\n" + in_app_header(mark) + b"\r\n")
    assert wait_in_app(mark)
    s.signal(signal.SIGTERM)
    r = slow.read_response()
    assert r.status == 200 and r.body == b"slept" and r.header("connection") == "close"
    assert idle.is_closed(5)            # idle kept-alive connections are closed
    assert s.proc.wait(15) == 0


@pytest.mark.parametrize("inline_first, where", [("on", "on the loop thread"), ("off", "on app thread [12] ")])
def test_timeout_on_an_app_thread_logs_that_thread(make_server, tmp_path, inline_first, where):
    # The stuck request gets --graceful-timeout (and as long for atexit)
    # to end, then goes with its worker. The log names its thread as the
    # thread's name does (forkwsgi worker 1 thread K), or the loop thread
    # (--inline-first: the first request of a worker runs there).
    s = make_server("apps:sleep", "--workers", "1", "--threads", "2", "--timeout", "1.5",
                    "--graceful-timeout", "2", "--inline-first", inline_first)
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    stuck = s.worker_pids()[0]
    with Conn(s.port, timeout=15) as c:
        mark = tmp_path / "in-app"
        c.send(b"GET /?t=30 HTTP/1.1\r\nHost: a\r\n" + in_app_header(mark) + b"\r\n")
        assert wait_in_app(mark)
        # The other thread still serves while one is stuck.
        r = request(s.port, b"GET /?t=0 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert r.status == 200
        assert c.is_closed(10)
    assert wait_for(lambda: len(s.worker_pids()) == 1 and stuck not in s.worker_pids())
    log = s.log()
    assert "timed out" in log and "'GET /?t=30'" in log and re.search(where, log), log
    assert "in sleep" in log


# ---- other modes -----------------------------------------------------------

def test_reuseport_gives_each_worker_its_own_listening_socket(make_server):
    s = make_server("apps:where", "--workers", "2", "--threads", "2", "--balance", "reuseport")
    pids = ready_workers(s, 2)
    assert listening_sockets(s.port) == 2           # the master's socket only holds the port
    os.kill(pids[0], signal.SIGKILL)
    assert wait_for(lambda: len(s.worker_pids()) == 2 and pids[0] not in s.worker_pids())
    assert wait_for(lambda: listening_sockets(s.port) == 2)
    assert {a["pid"] for a in burst(s.port, 6, "/?t=0")} <= set(s.worker_pids())


def test_reuseport_with_max_requests_never_leaves_the_port_without_a_listener(make_server):
    """--balance reuseport with --max-requests: each worker's listening
    socket is its own. A worker that retired by itself at its limit closed
    it at once, and its replacement's came only when the master forked one:
    when the two workers retired together, nothing listened on the port
    and new connections were refused (a review through nginx: 6.7 % of
    POSTs answered 502). Now the master starts the replacement first and
    retires the old worker once the new one serves, as with --lazy-apps."""
    s = make_server("apps:where", "--workers", "2", "--balance", "reuseport", "--max-requests", "15")
    ready_workers(s, 2)
    # (The master looks at the counts every 20 ms, and a worker serves on
    # past its limit until its replacement is ready.)
    served, refused, pids = 0, 0, set()
    deadline = time.monotonic() + 30
    while len(pids) < 8 and served + refused < 20000 and time.monotonic() < deadline:
        try:
            pids.add(get_json(s.port, "/?t=0", timeout=10)["pid"])
            served += 1
        except ConnectionRefusedError:
            refused += 1
    assert refused == 0, f"{refused} of {served + refused} connections refused"
    assert len(pids) >= 8, pids             # workers were retired and replaced all along
    assert "starting its replacement; it retires once that one serves" in s.log()


def test_shared_mode_serves_from_every_worker(make_server):
    s = make_server("apps:where", "--workers", "2", "--threads", "2")
    ready_workers(s, 2)
    assert listening_sockets(s.port) == 1
    answers = burst(s.port, 4, "/?t=0.3")
    assert {a["pid"] for a in answers} <= set(s.worker_pids())


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:pid", *args], capture_output=True,
                       text=True, timeout=30, cwd=os.path.dirname(os.path.abspath(__file__)))
    return p.returncode, p.stderr.strip().splitlines()


def test_bad_balance_and_threads_are_one_line_errors(tmp_path):
    code, err = _cli("--balance", "round-robin", "--bind", "127.0.0.1:0")
    assert code != 0 and len(err) == 1 and "--balance" in err[0] and "least-busy" in err[0], err
    code, err = _cli("--threads", "0", "--bind", "127.0.0.1:0")
    assert code != 0 and len(err) == 1 and "--threads" in err[0], err
    code, err = _cli("--balance", "reuseport", "--workers", "2", "--bind", f"unix:{tmp_path}/s.sock")
    assert code != 0 and len(err) == 1 and "reuseport" in err[0], err


def _steady_load(port, stop, results, keepalive):
    """Requests until stop (at most 3000): each result is a pid or an error.
    A kept-alive client retries once, on a new connection, a request that
    got no byte of answer on a reused connection the server had closed as
    idle (what clients do, RFC 9112 9.3.1); any other failure counts."""
    c, n = None, 0
    req = b"GET /?t=0.005 HTTP/1.1\r\nHost: a\r\n\r\n"
    while not stop.is_set() and n < 3000:
        n += 1
        try:
            if not keepalive:
                results.append(get_json(port, "/?t=0.005")["pid"])
                continue
            reused = c is not None
            if c is None:
                c = Conn(port, timeout=10)
            try:
                c.send(req)
                r = c.read_response()
            except (Closed, ConnectionResetError, BrokenPipeError):
                if not reused or c.buf:
                    raise
                c.close()
                c = Conn(port, timeout=10)
                c.send(req)
                r = c.read_response()
            results.append(json.loads(r.body)["pid"])
            if r.header("connection") == "close":
                c.close()
                c = None
        except Exception as e:  # noqa: BLE001 - every failure is counted
            results.append(repr(e))
            if c:
                c.close()
            c = None
    if c:
        c.close()


def test_sighup_under_load_with_threads_fails_nothing(make_server):
    s = make_server("apps:where", "--workers", "2", "--threads", "2", "--keep-alive", "30")
    before = set(ready_workers(s, 2))
    stop, results = threading.Event(), []
    loops = [threading.Thread(target=_steady_load, args=(s.port, stop, results, ka))
             for ka in (False, False, True, True)]
    for t in loops:
        t.start()
    try:
        assert wait_for(lambda: set(results) & before, timeout=20)           # the old workers serve the load
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: len(s.worker_pids()) == 2 and not set(s.worker_pids()) & before, timeout=20)
        new = set(s.worker_pids())
        assert wait_for(lambda: set(results) & new, timeout=20)              # and now the new ones
    finally:
        stop.set()
        for t in loops:
            t.join(30)
    errors = [r for r in results if not isinstance(r, int)]
    assert not errors, errors[:5]
    served_by = set(results)
    assert served_by & before and served_by - before      # old workers, then new ones


@needs_wrk
def test_connections_do_not_travel_to_and_fro_between_saturated_workers(make_server):
    """Every worker at its thread count, loads flickering around it: a
    kept-alive connection was handed to another worker on most requests
    (at 4 x 4 on one CPU, 98k of 219k requests; each trip a sendmsg, a
    recvmsg, a getpeername and a wake-up on both sides: 22 us of CPU per
    request against 17 without). A connection handed over stays where it
    arrived for FW_HANDOFF_HOLD_MS (100 ms): each moves at most once in
    that time."""
    mport = free_port()
    s = make_server("apps:where", "--workers", "2", "--threads", "2", "--metrics", f"127.0.0.1:{mport}")
    ready_workers(s, 2)
    clients, seconds = 16, 3
    requests, errors, non2xx, out = wrk(s.port, clients, seconds)
    assert requests > 1000 and (errors, non2xx) == (0, 0), out
    text = request(mport, b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n").body.decode()
    moved = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("forkwsgi_worker_handoffs_total{") and 'direction="out"' in line)
    assert moved <= clients * (seconds * 1000 / 100 + 2), (moved, requests)


def _balancer_churn(mport):
    """Listener changes plus kicks sent, summed over the workers (/metrics)."""
    text = request(mport, b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("forkwsgi_worker_listener_changes_total{",
                                   "forkwsgi_worker_balancer_kicks_total{")))


def test_steady_kept_alive_traffic_leaves_the_listeners_alone(make_server):
    """No worker full, no request waiting, no connection accepted for a
    second: the least-busy order only matters to the next new connection,
    and that one's first request is placed by load anyway. Yet each request
    start and end re-ranked the workers, and as loads crossed, a worker
    added or removed the shared listeners (epoll_ctl) and kicked a peer
    (eventfd write) to do the same: -0.7 us per request at 4 x 4 without."""
    mport = free_port()
    s = make_server("apps:where", "--workers", "2", "--threads", "4", "--metrics", f"127.0.0.1:{mport}")
    ready_workers(s, 2)
    conns = [Conn(s.port, timeout=20) for _ in range(3)]     # 3 < 4 threads: no worker can fill up
    try:
        for c in conns:
            c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
            assert c.read_response().status == 200
        time.sleep(1.2)                                      # FW_RANK_LIVE_MS after the last accept
        before = _balancer_churn(mport)
        stop = time.monotonic() + 20
        counts = [0] * len(conns)

        def client(i):
            while counts[i] < 1500 and time.monotonic() < stop:
                conns[i].send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
                assert conns[i].read_response().status == 200
                counts[i] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(conns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        churn = _balancer_churn(mport) - before
        assert sum(counts) == 1500 * len(conns), counts
        # A backstop re-check or a scrape's timing may add a few; before the
        # rule it was one per few requests.
        assert churn <= 20, (churn, sum(counts))
    finally:
        for c in conns:
            c.close()


def _balancer_counts(mport):
    """(listener changes, kicks sent), each summed over the workers (/metrics)."""
    text = request(mport, b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n").body.decode()
    def total(prefix):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))
    return total("forkwsgi_worker_listener_changes_total{"), total("forkwsgi_worker_balancer_kicks_total{")


def test_kept_alive_saturation_leaves_the_listeners_alone(make_server):
    """More kept-alive clients than threads, no connection accepted for a
    second: every worker fills and frees a thread at each request, and the
    least loaded changes as often. Arming by the order then was a listener
    change (epoll_ctl) or a kick per request or more (2.4 at 4 x 4 under
    wrk -c50), for connections that were not coming: until one comes, a
    worker with a free thread stays armed and a full one keeps what it has.
    The connection that does come is served while they go on (a worker has
    a thread free now and then) and the order is exact again from its
    accept."""
    mport = free_port()
    s = make_server("apps:where", "--workers", "2", "--threads", "2", "--metrics", f"127.0.0.1:{mport}")
    ready_workers(s, 2)
    conns = [Conn(s.port, timeout=20) for _ in range(8)]       # 8 > 4 threads: the workers fill
    try:
        for c in conns:
            c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
            assert c.read_response().status == 200
        time.sleep(1.2)                                      # FW_RANK_LIVE_MS after the last accept
        changes0, kicks0 = _balancer_counts(mport)
        stop = time.monotonic() + 20
        counts = [0] * len(conns)

        def client(i, n):
            while counts[i] < n and time.monotonic() < stop:
                conns[i].send(b"GET /?t=0.001 HTTP/1.1\r\nHost: a\r\n\r\n")
                assert conns[i].read_response().status == 200
                counts[i] += 1

        def saturate(n, meanwhile=lambda: None):
            threads = [threading.Thread(target=client, args=(i, n)) for i in range(len(conns))]
            for t in threads:
                t.start()
            out = meanwhile()
            for t in threads:
                t.join(30)
            assert counts == [n] * len(conns), counts
            return out

        saturate(300)
        changes1, kicks1 = _balancer_counts(mport)
        n = sum(counts)
        # Before, more than one per request; a backstop re-check or a
        # scrape's timing may add a few changes. The kicks left are a free
        # thread asking the peer with requests waiting to hand one over:
        # how often that happens follows the scheduling (0.10 to 0.23 per
        # request in 15 runs on an idle machine, 0.28 once in a loaded CI),
        # far from the 2.4 per request this guards against.
        assert changes1 - changes0 <= 20 and kicks1 - kicks0 <= n / 2, (changes1 - changes0, kicks1 - kicks0, n)
        # A new connection while they saturate: served, and by a worker
        # that had a thread for it (it did not wait for the clients' end).
        def fresh():
            time.sleep(0.2)
            answer = get_json(s.port, "/?t=0")
            return answer, [c for c in counts]
        answer, counts_then = saturate(600, fresh)
        assert answer["pid"] in s.worker_pids() and sum(counts_then) < 600 * len(conns), counts_then
    finally:
        for c in conns:
            c.close()


def _soon(pred, timeout=5.0):
    """wait_for at a 1 ms poll: this test counts in tens of milliseconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.001)
    return False


def test_a_held_connection_queued_at_a_saturated_worker_goes_to_a_worker_freed_meanwhile(make_server, tmp_path):
    """A connection handed over (FW_HANDOFF_HOLD_MS) sends its next request
    at once, to a worker whose threads are all in slow requests now; the
    other worker frees a thread within the hold, kicks, and the offer
    skips the held connection. Nothing offered it again once the hold was
    over: its light request waited the slow ones out (2 s) beside an idle
    worker. Retried when the machine was too slow to fit the steps into
    the hold (then the kick comes after it, and any build passes)."""
    s = make_server("apps:where_gated", "--workers", "2", "--threads", "2", "--keep-alive", "30")
    ready_workers(s, 2)
    conns = collections.defaultdict(list)
    for _ in range(60):            # kept-alive: three on one worker, two on the other
        c = Conn(s.port, timeout=20)
        c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
        conns[json.loads(c.read_response().body)["pid"]].append(c)
        if len(conns) == 2 and max(map(len, conns.values())) >= 3 and min(map(len, conns.values())) >= 2:
            break
    w1 = next(p for p, v in conns.items() if len(v) >= 3)
    w2 = next(p for p in conns if p != w1)
    a, b, c = conns[w1][:3]
    d, e = conns[w2][:2]
    try:
        for trial in range(4):
            gate = tmp_path / f"gate{trial}"
            marks = [tmp_path / f"{n}{trial}" for n in "abde"]
            for conn, mark in zip((a, b), marks[:2]):
                conn.send(f"GET /?gate={gate} HTTP/1.1\r\nHost: a\r\n".encode() + in_app_header(mark) + b"\r\n")
            assert _soon(lambda: all(m.exists() for m in marks[:2]))     # w1 saturated
            c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")
            moved = json.loads(c.read_response().body)
            t_moved = time.monotonic()
            assert moved["pid"] == w2, (moved, w1)
            for conn, mark in zip((d, e), marks[2:]):
                conn.send(b"GET /?t=2 HTTP/1.1\r\nHost: a\r\n" + in_app_header(mark) + b"\r\n")
            assert _soon(lambda: all(m.exists() for m in marks[2:]))     # w2 saturated
            c.send(b"GET /?t=0 HTTP/1.1\r\nHost: a\r\n\r\n")             # queued at w2, held
            time.sleep(0.005)
            gate.touch()                                                 # w1 free again
            in_hold = time.monotonic() - t_moved < 0.07
            sent = time.monotonic()
            r = json.loads(c.read_response().body)
            waited = time.monotonic() - sent
            for conn in (a, b, d, e):
                assert conn.read_response().status == 200
            if in_hold:
                break
        assert in_hold, "the steps never fitted into the hold"
        assert waited < 1.0 and r["pid"] == w1, (waited, r, w1, w2)
    finally:
        for v in conns.values():
            for x in v:
                x.close()
