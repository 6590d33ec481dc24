"""--write-coalesce: inline (--threads 1), the responses finished in one pass
of the worker's loop leave together at its end, so that the client side is
woken once per pass rather than once per response; a response waits at most
the setting plus the app call running then, and never after a slow call.

Each test puts several requests into one loop pass: a blocking request holds
the loop in the app while the others are sent, so the next pass finds all
of them readable. Arrival times are read on the client (each app call takes
a known time); the assertions leave wide margins for a busy machine."""
import os
import selectors
import socket
import struct
import time

import pytest

from httpraw import in_app_header, wait_for, wait_in_app

APP_MODES = ("inline",)
APP = "coalesce_apps:app"


def get(path, extra=b""):
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode() + extra + b"\r\n"


def idle_conns(srv, n):
    """n kept-alive connections, each accepted and idle (one request served)."""
    conns = [srv.conn() for _ in range(n)]
    for c in conns:
        c.send(get("/"))
        assert c.read_response().status == 200
    return conns


def arrivals(conns):
    """Wait for one response on each connection: {index: seconds since the
    call when its first bytes arrived}, each response read whole."""
    sel = selectors.DefaultSelector()
    for i, c in enumerate(conns):
        sel.register(c.sock, selectors.EVENT_READ, i)
    t0 = time.monotonic()
    seen = {}
    while len(seen) < len(conns) and time.monotonic() - t0 < 20:
        for key, _ in sel.select(timeout=1):
            i = key.data
            seen[i] = time.monotonic() - t0
            sel.unregister(key.fileobj)
    sel.close()
    assert len(seen) == len(conns), f"answers on {sorted(seen)} of {len(conns)} connections"
    for c in conns:
        assert c.read_response().body == b"coalesced\n"
    return seen


def one_pass(srv, tmp_path, paths, blocker_ms=180, extra=None):
    """Send the requests for paths while a blocking request holds the loop
    (180 ms: under twice the 0.1 s most tests set, so it is no slow call),
    so that they are read in one pass; their arrival times (ms, sorted by
    arrival) and the connections (in the order of paths)."""
    blocker, *conns = idle_conns(srv, 1 + len(paths))
    marker = str(tmp_path / "blocker-in")
    blocker.send(get(f"/?ms={blocker_ms}", in_app_header(marker)))
    assert wait_in_app(marker)
    for i, (c, p) in enumerate(zip(conns, paths)):
        c.send(get(p, (extra or {}).get(i, b"")))
    assert blocker.read_response().status == 200
    seen = arrivals(conns)
    return sorted(v * 1000 for v in seen.values()), conns


@pytest.mark.parametrize("coalesce", ["0.1", "0"])
def test_responses_finished_in_one_pass_leave_together(make_server, tmp_path, coalesce):
    srv = make_server(APP, "--write-coalesce", coalesce)
    times, _ = one_pass(srv, tmp_path, ["/?ms=20"] * 4)
    spread = times[-1] - times[0]
    if coalesce == "0":
        # Each written as its call ends: 20 ms apart at least.
        assert spread >= 55, times
    else:
        assert spread < 15, times


def test_a_response_waits_at_most_the_setting_plus_the_call_running(make_server, tmp_path):
    # 100 ms: the first response waits for the second call (it was done as
    # that call began), but is written before the fourth call: by then it
    # has waited two calls (120 ms). (The blocking call stays under the
    # 200 ms that would count as slow.)
    srv = make_server(APP, "--write-coalesce", "0.1")
    times, _ = one_pass(srv, tmp_path, ["/?ms=60"] * 4)
    assert times[1] - times[0] < 10, times
    assert times[3] - times[0] >= 15, times


@pytest.mark.parametrize("blocker_ms", [180, 700])
def test_after_a_slow_call_each_response_is_written_at_once(make_server, tmp_path, blocker_ms):
    # 100 ms: a call over twice that (200 ms) turns the wait off for a
    # second. The blocking call is that slow call, or not.
    srv = make_server(APP, "--write-coalesce", "0.1")
    times, _ = one_pass(srv, tmp_path, ["/?ms=15"] * 3, blocker_ms=blocker_ms)
    spread = times[-1] - times[0]
    if blocker_ms > 200:
        assert spread >= 25, times
    else:
        assert spread < 12, times


def test_the_iterable_works_on_only_after_its_last_block_is_written(make_server, tmp_path):
    # PEP 3333: a block is not held while the app produces what follows it.
    # The generator's body is whole (its Content-Length) at its first
    # block; what it does after that must not hold the response back.
    srv = make_server(APP, "--write-coalesce", "0.1")
    done = tmp_path / "generator-done"
    times, conns = one_pass(srv, tmp_path, ["/?gen=1&after=1500", "/?ms=5"],
                            extra={0: f"X-Done: {done}\r\n".encode()})
    assert not done.exists(), "a response waited for the generator's work after its last block"
    assert wait_for(done.exists, 20)
    for c in conns:       # both kept alive
        c.send(get("/"))
        assert c.read_response().status == 200


def test_a_client_gone_while_its_response_waits_costs_no_one_else(make_server, tmp_path):
    srv = make_server(APP, "--write-coalesce", "0.1")
    blocker, gone, other = idle_conns(srv, 3)
    marker, gone_in = str(tmp_path / "blocker-in"), str(tmp_path / "gone-in")
    blocker.send(get("/?ms=300", in_app_header(marker)))
    assert wait_in_app(marker)
    gone.send(get("/?ms=200", in_app_header(gone_in)))
    other.send(get("/?ms=20"))
    assert blocker.read_response().status == 200
    assert wait_in_app(gone_in)
    # Reset while its call runs: its response is written (deferred) into a
    # connection that is gone.
    gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()
    assert other.read_response().body == b"coalesced\n"
    other.send(get("/"))
    assert other.read_response().status == 200
    fresh = srv.conn()
    fresh.send(get("/"))
    assert fresh.read_response().status == 200
    log = srv.log()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_the_setting_is_checked(tmp_path):
    import subprocess
    import sys
    for bad in ("-1", "0.5", "soon"):
        p = subprocess.run([sys.executable, "-m", "forkwsgi", APP, "--write-coalesce", bad, "--check-config"],
                           capture_output=True, text=True, timeout=60, cwd=os.path.dirname(__file__))
        assert p.returncode == 2, (bad, p.returncode, p.stderr)
        assert "--write-coalesce" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def access_lines(path, want, timeout=20):
    """{query string: microseconds} of the access log's lines (format
    "%(q)s %(D)s") once every query in want has its line (the writer batches)."""
    def read():
        if not os.path.exists(path):
            return {}
        return dict(line.rsplit(" ", 1) for line in open(path).read().splitlines() if " " in line)
    assert wait_for(lambda: all(q in read() for q in want), timeout), read()
    return {q: int(us) for q, us in read().items()}


def test_a_deferred_response_is_timed_to_its_own_write(make_server, tmp_path):
    # The pass's responses are all written first; their requests end (the
    # access log line, the --stats counters) as each connection is driven
    # on after, one by one. Failed before: the quick response was timed to
    # the end of the generator's work after its body (PEP 3333: run once
    # the body is written), which came before it in that second round:
    # ~810 ms for a 5 ms request.
    log = str(tmp_path / "access.log")
    srv = make_server(APP, "--write-coalesce", "0.1", "--access-logfile", log, "--access-logformat", "%(q)s %(D)s")
    one_pass(srv, tmp_path, ["/?gen=1&after=800", "/?ms=5&n=quick", "/?ms=5&n=last"])
    us = access_lines(log, ["gen=1&after=800", "ms=5&n=quick", "ms=5&n=last"])
    assert us["ms=5&n=quick"] < 400_000, us
    # A generator's request still ends with its close(), as before.
    assert us["gen=1&after=800"] >= 790_000, us


def test_an_app_call_after_a_flush_is_timed_from_its_own_start(make_server, tmp_path):
    # Before an app call, the responses deferred for the setting are
    # written and their connections driven on: here the generator's work
    # after its body (2 s) runs. --timeout (3 s) counts one call into the
    # app. Failed before: with the access log on, the call after that
    # flush (2 s) was timed from its request's parse, so it counted the
    # generator's 2 s too, and the master killed the worker for a 4 s call
    # ("timed out"); --stats counted that time twice as well (app_us).
    # (--max-requests only makes the master check every 0.2 s.)
    srv = make_server(APP, "--write-coalesce", "0.05", "--timeout", "3", "--max-requests", "1000000",
                      "--access-logfile", str(tmp_path / "access.log"))
    # The 100 ms call lets the generator's response wait past the setting
    # (50 ms), so that it is written before the next call, not at the
    # end of the pass.
    one_pass(srv, tmp_path, ["/?gen=1&after=2000", "/?ms=100", "/?ms=2000"])
    log = srv.log()
    assert "timed out" not in log, log
