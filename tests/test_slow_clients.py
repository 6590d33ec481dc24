"""No slow client holds a loop thread or gets a worker killed (issue 23,
items 2 to 6).

- A body that trickles after "Expect: 100-continue" is read by the loop
  before the app runs: other connections are served meanwhile, directly and
  through HAProxy, and --timeout (the app's time) never fires for it.
- A body must keep a minimum rate once it has taken longer than
  --body-timeout (--body-min-rate): a byte now and then is cut with a 408.
- write() to a client that does not read never stalls the worker's other
  connections.
- The write timeout counts time without progress: a reader that takes
  bytes, however slowly, is kept; one that stops is reset.

Every client here targets 127.0.0.1 and is bounded in time.
"""
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from httpraw import Conn, asleep, non_readers, server_stalled, wait_for
from test_behind_proxy import HAPROXY, HAPROXY_CONF


def trickle_expect(port, stop, length=1000, every=0.5, errors=None, continued=None):
    """A POST with Expect: 100-continue whose body comes a byte every
    `every` seconds until `stop` is set (the attack of item 2). Once the
    server's 100 Continue came (it waits for the body), True is appended
    to `continued`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
                      b"Expect: 100-continue\r\n\r\n" % length)
            got = b""
            while b"\r\n\r\n" not in got:
                piece = s.recv(1024)
                if not piece:
                    raise ConnectionError(f"closed before 100 Continue: {got!r}")
                got += piece
            if continued is not None:
                continued.append(got.startswith(b"HTTP/1.1 100"))
            while not stop.wait(every):
                s.sendall(b"x")
    except OSError as e:
        if errors is not None:
            errors.append(repr(e))


def probe(port, timeout=2.0, path="/read"):
    """A GET on a new connection: its latency, or the exception."""
    t = time.monotonic()
    try:
        with Conn(port, timeout=timeout) as c:
            c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            r = c.read_response()
            assert r.status == 200, r
        return time.monotonic() - t
    except Exception as e:      # noqa: BLE001 (the caller reports it)
        return e


def probes_during(port, seconds, every=0.25, path="/read"):
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(probe(port, path=path))
        time.sleep(every)
    return out


def attack(port, n, seconds, every=0.5):
    """n trickling Expect uploads while probes run; returns the probes."""
    stop = threading.Event()
    errors, continued = [], []
    threads = [threading.Thread(target=trickle_expect, args=(port, stop),
                                kwargs={"every": every, "errors": errors, "continued": continued})
               for _ in range(n)]
    for t in threads:
        t.start()
    # Every upload in the server, waiting for its body (a server that
    # never says 100 Continue to some is what the probes then measure).
    wait_for(lambda: len(continued) + len(errors) >= n, 20)
    try:
        got = probes_during(port, seconds)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    return got


@pytest.mark.parametrize("threads,attackers", [(1, 2), (4, 8)])
def test_trickling_expect_bodies_block_neither_loop_nor_worker(make_server, app_mode, threads, attackers):
    """dac5946: with --threads 1, 2 such connections stopped a 2-worker
    server (0 of 3 probes answered) and --timeout killed both workers; with
    --threads 4, 8 did. Here every probe is answered within a second, over
    longer than --timeout, and no worker is killed."""
    if app_mode == "threads":
        pytest.skip("each case sets its own --threads")
    s = make_server("apps:expect", "--workers", "2", "--threads", str(threads), "--timeout", "2")
    assert wait_for(lambda: len(s.worker_pids()) >= 2)
    pids = sorted(s.worker_pids())
    got = attack(s.port, attackers, 5.0)
    bad = [p for p in got if not isinstance(p, float) or p > 1.0]
    print(f"--threads {threads}, {attackers} attackers: {len(got)} probes, worst "
          f"{max(p for p in got if isinstance(p, float)) * 1000:.0f} ms, bad {bad}")
    assert not bad, bad
    assert sorted(s.worker_pids()) == pids, s.log()[-2000:]
    assert "timeout" not in s.log().lower().replace("--body-timeout", ""), s.log()[-2000:]


@pytest.mark.skipif(not HAPROXY, reason="haproxy is installed by .ci/run")
def test_trickling_expect_bodies_through_haproxy(make_server, app_mode, tmp_path):
    """The same attack through HAProxy with its defaults, which passes the
    Expect and the trickle on."""
    if app_mode == "threads":
        pytest.skip("inline is the default the attack stopped")
    s = make_server("apps:expect", "--workers", "2", "--timeout", "2")
    assert wait_for(lambda: len(s.worker_pids()) >= 2)
    pids = sorted(s.worker_pids())
    with socket.socket() as tmp:
        tmp.bind(("127.0.0.1", 0))
        port = tmp.getsockname()[1]
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(HAPROXY_CONF.format(mode="http", port=port, upstream=s.port, send=""))
    proxy = subprocess.Popen([HAPROXY, "-f", str(conf), "-db"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: not isinstance(probe(port), Exception), timeout=10)
        got = attack(port, 2, 5.0)
    finally:
        os.killpg(proxy.pid, signal.SIGTERM)
        proxy.wait(10)
    bad = [p for p in got if not isinstance(p, float) or p > 1.0]
    assert not bad, bad
    assert sorted(s.worker_pids()) == pids, s.log()[-2000:]


def test_a_slow_legitimate_upload_is_not_app_time(make_server):
    """Item 3: an Expect upload that takes longer than --timeout (but keeps
    a decent rate) is answered, and its worker, with the other request it
    serves meanwhile, lives on: --timeout measures the app, not the client."""
    s = make_server("apps:expect", "--workers", "1", "--timeout", "2")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    pid = s.worker_pids()[0]
    with Conn(s.port, timeout=10) as c:
        c.send(b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 4000\r\nExpect: 100-continue\r\n\r\n")
        assert c.read_response().status == 100
        t0 = time.monotonic()
        for _ in range(20):
            c.send(b"y" * 200)
            time.sleep(0.2)
            assert not isinstance(probe(s.port), Exception)
        r = c.read_response()
        assert r.status == 200 and r.body == b"got 4000"
        assert time.monotonic() - t0 > 3.0          # longer than --timeout
    assert s.worker_pids() == [pid]


def test_body_min_rate_cuts_a_trickle_and_keeps_a_slow_link(make_server):
    """Item 4: with --body-timeout 1 (the grace) and the default
    --body-min-rate 500, a byte every 0.3 s is answered 408 once the grace
    is over, at its next byte; 2,000 bytes in 3 s (a slow link, pauses
    under the body timeout) are served."""
    s = make_server("apps:expect", "--body-timeout", "1")
    with Conn(s.port, timeout=10) as slow:
        slow.send(b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        t0 = time.monotonic()
        sent = 0
        with pytest.raises(OSError):
            while time.monotonic() - t0 < 8:
                slow.send(b"z")
                sent += 1
                time.sleep(0.3)
                slow.sock.settimeout(0.01)
                try:
                    if slow.sock.recv(1, socket.MSG_PEEK):
                        break
                except socket.timeout:
                    pass
                finally:
                    slow.sock.settimeout(10)
            raise OSError("answered")
        r = slow.read_response()
        assert r.status == 408, r
        assert time.monotonic() - t0 < 3.0
    assert "below --body-min-rate" in s.log()
    with Conn(s.port, timeout=10) as ok:
        ok.send(b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n")
        for _ in range(10):
            ok.send(b"w" * 200)
            time.sleep(0.3)
        r = ok.read_response()
        assert r.status == 200 and r.body == b"got 2000"


def test_write_to_a_client_that_does_not_read_stalls_no_one(make_server):
    """Item 5: dac5946 stopped a 2-worker server for about 30 s (until
    --write-timeout) with two clients that do not read a write() response.
    Here the other connections are served meanwhile, and a client that
    reads gets the whole body."""
    s = make_server("apps:writes", "--workers", "2")
    assert wait_for(lambda: len(s.worker_pids()) >= 2)
    stuck = non_readers(s.port, "/?mb=8", 2)
    try:
        assert wait_for(lambda: all(server_stalled(x) for x in stuck), 20), s.log()[-1500:]
        got = probes_during(s.port, 3.0, path="/?mb=0")
        bad = [p for p in got if not isinstance(p, float) or p > 1.0]
        assert not bad, bad
        with Conn(s.port, timeout=20) as c:
            c.send(b"GET /?mb=2 HTTP/1.1\r\nHost: t\r\n\r\n")
            r = c.read_response()
            assert r.status == 200 and r.body == (bytes(range(256)) * 256) * 32
    finally:
        for x in stuck:
            x.close()


def read_slowly(sock, total, rate, limit):
    """Read `total` bytes at about `rate` bytes a second; returns the bytes
    read when the peer reset or closed, or total."""
    got = 0
    end = time.monotonic() + limit
    while got < total and time.monotonic() < end:
        try:
            d = sock.recv(min(16384, total - got))
        except ConnectionResetError:
            return got
        if not d:
            return got
        got += len(d)
        time.sleep(len(d) / rate)
    return got


def test_write_timeout_keeps_a_slow_reader_of_pipelined_responses(make_server):
    """Item 6: --write-timeout 1. A client pipelines 100 requests for 64 KiB
    each and reads through a 4 KiB buffer at ~200 KB/s for 4 s. The kernel's
    send buffer grows to megabytes, so the socket turns writable again only
    every few seconds although bytes leave all along: dac5946 reset such a
    reader at the write timeout (at 30.3 s with the default 30 s). It makes
    progress, so it is kept."""
    s = make_server("apps:blob", "--write-timeout", "1")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", s.port))
    sock.settimeout(10)
    sock.sendall(b"GET /?kb=64 HTTP/1.1\r\nHost: t\r\n\r\n" * 100)
    t0 = time.monotonic()
    got = read_slowly(sock, 800_000, 200_000, 30)
    sock.close()
    assert got == 800_000, (got, time.monotonic() - t0, s.log()[-500:])
    assert time.monotonic() - t0 > 3
    assert "client stopped reading" not in s.log()


def test_write_timeout_resets_a_reader_that_stops(make_server):
    """...while a client that stops reading is reset after --write-timeout."""
    s = make_server("apps:big", "--write-timeout", "2")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", s.port))
    sock.sendall(b"GET /?mb=20 HTTP/1.1\r\nHost: t\r\n\r\n")
    sock.settimeout(10)
    assert read_slowly(sock, 1 << 20, 2_000_000, 10) == 1 << 20
    time.sleep(4)                                   # stops reading for twice the timeout
    read = 0
    try:
        while True:
            d = sock.recv(1 << 20)
            if not d:
                pytest.fail("closed without a reset")
            read += len(d)
    except ConnectionResetError:
        pass
    sock.close()
    assert read < 19 << 20
    assert wait_for(lambda: "client stopped reading" in s.log(), timeout=5)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_slow_reader_of_a_big_list_body_bounded_memory(make_server):
    """Item 11: a client that does not read a 64 MiB list body cost about
    twice its size (the body, and a copy of it queued for the socket). What
    the socket does not take is now written from the app's own bytes."""
    s = make_server("apps:blob", "--workers", "1")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    pid = s.worker_pids()[0]
    with Conn(s.port) as c:                 # warm up: the app and its imports in memory
        c.send(b"GET /?kb=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        c.read_response()
    base = rss_mib(pid)
    stuck = non_readers(s.port, "/?kb=65536", 1)
    try:
        assert wait_for(lambda: rss_mib(pid) > base + 60, timeout=10)
        # Growth is over once the writes stalled and the worker sleeps.
        assert wait_for(lambda: server_stalled(stuck[0]) and asleep(pid), 20), s.log()[-1500:]
        grown = rss_mib(pid) - base
        print(f"64 MiB list body to a client that does not read: worker RSS +{grown:.0f} MiB")
        assert grown < 96, grown
        assert probe(s.port, path="/?kb=1") is not None
    finally:
        for x in stuck:
            x.close()
