"""--inline-first (cserver/fw_lead.h): with --threads above 1, the worker's
loop thread runs quick requests itself and the app threads sleep; a call
that lasts is taken over by the standby thread, so that it never holds the
loop, and for a second every request goes to an app thread."""
import os
import re
import select
import signal
import time

from httpraw import Conn, in_app_header, wait_for, wait_in_app

APP_MODES = ("inline",)      # each server here sets its own --threads

APP_THREAD = r"forkwsgi worker 1 thread [1-4]"


def name(c, path="/", headers=b""):
    """The thread that ran GET path on c."""
    c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode() + headers + b"\r\n")
    r = c.read_response()
    assert r.status == 200
    return r.body.decode()


def answered(c):
    """Has anything of a response come on c (without waiting)?"""
    return bool(c.buf) or bool(select.select([c.sock], [], [], 0)[0])


def test_quick_requests_run_on_the_loop_thread(make_server):
    on = make_server("apps:thread_name", "--workers", "1", "--threads", "4")
    off = make_server("apps:thread_name", "--workers", "1", "--threads", "4", "--inline-first", "off")
    with on.conn() as a, off.conn() as b:
        # As in the next test: a call at the worker's start may be taken
        # over while the app threads take the GIL as they start (CI saw
        # it), sending the next second's requests to the app threads.
        time.sleep(1.1)
        assert {name(a) for _ in range(20)} == {"MainThread"}
        assert all(re.fullmatch(APP_THREAD, name(b)) for _ in range(20))


def test_a_call_that_lasts_does_not_hold_the_loop(make_server, tmp_path):
    """A 3 s call on the loop thread: meanwhile a kept-alive connection and
    new ones are answered, by app threads; the slow call's response comes
    after, whole; a second later quick requests run on the loop thread
    again."""
    s = make_server("apps:thread_name", "--workers", "1", "--threads", "4")
    with s.conn() as slow, s.conn() as kept:
        assert name(kept) == "MainThread"
        # A call the standby took over sends the next second's requests to
        # the app threads (OWN_OFF_MS). In CI a first call at the worker's
        # start was once taken over (the slow call below then ran on an app
        # thread); the standby takes a call whose thread sleeps, here most
        # likely on the GIL the app threads took as they started. Past that
        # second, the slow call is the loop thread's.
        time.sleep(1.1)
        mark = str(tmp_path / "in")
        slow.send(b"GET /?t=3 HTTP/1.1\r\nHost: t\r\n" + in_app_header(mark) + b"\r\n")
        assert wait_in_app(mark)
        during = [name(kept) for _ in range(10)]
        for _ in range(5):
            with s.conn() as fresh:
                during.append(name(fresh))
        assert not answered(slow), "the quick requests waited for the slow call"
        assert all(re.fullmatch(APP_THREAD, n) for n in during), during
        r = slow.read_response()
        assert r.status == 200 and r.body == b"MainThread", (r.body, s.log()[-2000:])
        # The slow call kept the loop thread a while; a second after the
        # takeover, quick calls are its own again.
        assert wait_for(lambda: name(kept) == "MainThread", 10)
        assert {name(kept) for _ in range(10)} == {"MainThread"}
    assert "Traceback" not in s.log()


def test_a_run_of_short_blocking_calls_is_taken_over_as_one(make_server):
    """The requests of one pass, each a 0.8 ms sleep, run one after the
    other on the loop thread: no single call lasts the standby's two ticks,
    but the run does, and the app threads idled meanwhile (a hostile
    review: forty 1 ms sleeps held the loop 40 ms, and wrk on 1 ms sleeps
    got a third of --inline-first off's rate). The standby takes such a run
    over as it would one long call: some of them run on app threads."""
    s = make_server("apps:thread_name", "--workers", "1", "--threads", "16")
    conns = [s.conn() for _ in range(16)]
    try:
        names = set()
        for _ in range(10):
            for c in conns:
                c.send(b"GET /?t=0.0008 HTTP/1.1\r\nHost: t\r\n\r\n")
            for c in conns:
                r = c.read_response()
                assert r.status == 200
                names.add(r.body.decode())
            if names != {"MainThread"}:
                break
        assert names - {"MainThread"}, "every call of every run stayed on the loop thread"
        assert all(n == "MainThread" or re.fullmatch(r"forkwsgi worker 1 thread \d+", n) for n in names), names
    finally:
        for c in conns:
            c.close()


def test_a_response_the_client_does_not_read_does_not_hold_the_loop(make_server):
    """The loop thread streams 32 MiB to a client that reads nothing: its
    request waits for the loop (parked), so the loop goes to the standby at
    once; others are served meanwhile, and the body arrives whole once the
    client reads."""
    s = make_server("apps:big", "--workers", "1", "--threads", "4")
    chunk = bytes(range(256)) * 256
    with Conn(s.port, timeout=20) as stalled, s.conn() as other:
        stalled.send(b"GET /?mb=32 HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(0.5)             # the server fills the socket and waits
        for _ in range(10):
            other.send(b"GET /?mb=0 HTTP/1.1\r\nHost: t\r\n\r\n")
            r = other.read_response()
            assert r.status == 200 and r.body == b""
        r = stalled.read_response()
        assert r.status == 200 and len(r.body) == 32 * 16 * len(chunk)
        assert r.body == chunk * (32 * 16)
        # And the loop thread has the loop back: quick requests are its own.
        stalled.send(b"GET /?mb=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert stalled.read_response().status == 200
    assert "Traceback" not in s.log()


def test_a_stop_while_the_standby_runs_the_loop(make_server, tmp_path):
    """SIGTERM to the worker while the loop thread is in a call that lasts
    (the standby runs the loop): the worker stops accepting at once, the
    call's response is sent whole, the worker exits 0 and is replaced. Sent
    to the worker alone, the stop is a retirement: the connection is kept
    alive and handed to the replacement, which serves its next request."""
    s = make_server("apps:thread_name", "--workers", "1", "--threads", "4", "--graceful-timeout", "20")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    [worker] = s.worker_pids()
    with s.conn() as slow:
        mark = str(tmp_path / "in")
        slow.send(b"GET /?t=2 HTTP/1.1\r\nHost: t\r\n" + in_app_header(mark) + b"\r\n")
        assert wait_in_app(mark)
        time.sleep(0.1)             # (taken over after 1 to 2 ms)

        os.kill(worker, signal.SIGTERM)
        r = slow.read_response()
        assert r.status == 200 and r.body == b"MainThread", (r.body, s.log()[-2000:]) and r.header("connection") != "close"
        assert wait_for(lambda: worker not in s.worker_pids() and len(s.worker_pids()) == 1, 15)
        assert name(slow) == "MainThread"       # served by the replacement
    assert re.search(rf"Worker 1 \(pid {worker}\) exited \(exit code 0\)", s.log()), s.log()
    with s.conn() as c:
        assert name(c) == "MainThread"
