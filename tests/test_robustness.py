"""Robustness: idle crowds, slowloris, slow readers, disconnects, huge uploads.

The server runs one thread here, so every check that "a normal request is
served promptly" also proves the loop is never blocked by the others.
"""
import contextlib
import json
import os
import socket
import struct
import threading
import time

import pytest

from httpraw import Conn, accept_queue, established, wait_for


def timed_get(s, path="/"):
    t0 = time.monotonic()
    r = s.get(path)
    return r, time.monotonic() - t0


def test_1000_idle_keepalive_connections(make_server):
    s = make_server("apps:echo", "--keep-alive", "60")
    conns = []
    try:
        for i in range(1000):
            c = Conn(s.port, timeout=10)
            c.send(b"GET /warm HTTP/1.1\r\nHost: a\r\n\r\n")
            conns.append(c)
        for c in conns:
            assert c.read_response().status == 200     # all idle, kept alive now
        r, took = timed_get(s, "/normal")
        assert r.status == 200 and json.loads(r.body)["path"] == "/normal"
        assert took < 2.0
        # and they are still usable
        for c in conns[::100]:
            c.send(b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n")
            assert c.read_response().status == 200
    finally:
        for c in conns:
            c.close()


def test_50_slowloris_clients(make_server):
    s = make_server("apps:echo", "--header-timeout", "5")
    conns = []
    try:
        for i in range(50):
            c = Conn(s.port, timeout=10)
            c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Half: ")
            conns.append(c)
        for _ in range(5):
            r, took = timed_get(s)
            assert r.status == 200 and took < 2.0
        # they all get 408 when their time is up
        for c in conns:
            r = c.read_response()
            assert r.status == 408
    finally:
        for c in conns:
            c.close()


def test_100mb_to_a_slow_reader_while_others_are_served(make_server):
    s = make_server("apps:big")
    total = 100 * 1024 * 1024
    got = 0
    with Conn(s.port, timeout=20) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        c.send(b"GET /?mb=100 HTTP/1.1\r\nHost: a\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += c.sock.recv(4096)
        got = len(head.split(b"\r\n\r\n", 1)[1])
        deadline = time.monotonic() + 60
        checks = 0
        while got < total and time.monotonic() < deadline:
            data = c.sock.recv(256 * 1024)
            assert data, "server closed early"
            got += len(data)
            if got > checks * 10 * 1024 * 1024:
                checks += 1
                r, took = timed_get(s, "/?mb=0")    # the loop is free meanwhile
                assert r.status == 200 and took < 2.0
            time.sleep(0.001)
        assert got == total
    assert checks >= 5


def test_client_disconnect_mid_response(make_server):
    s = make_server("apps:big")
    for _ in range(20):
        c = Conn(s.port)
        c.send(b"GET /?mb=50 HTTP/1.1\r\nHost: a\r\n\r\n")
        c.sock.recv(65536)
        c.close()
    assert s.alive()
    r = s.get("/?mb=1")
    assert r.status == 200 and len(r.body) == 1024 * 1024


def test_disconnect_mid_request_and_mid_body(server):
    for raw in (b"GET / HTTP/1.1\r\nHo", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nabc",
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"):
        for _ in range(10):
            c = Conn(server.port)
            c.send(raw)
            c.close()
    assert server.get("/").status == 200


def _rss_kb(server, field="VmHWM"):
    """Peak memory of the process that serves (the worker, under a master)."""
    peak = 0
    for pid in server.worker_pids() or [server.pid]:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    peak = max(peak, int(line.split()[1]))
    return peak


def test_512mb_upload_bounded_memory(make_server):
    s = make_server("apps:upload")
    size = 512 * 1024 * 1024
    block = os.urandom(1 << 20)
    import hashlib
    h = hashlib.sha256()
    with Conn(s.port, timeout=60) as c:
        c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // len(block)):
            c.sock.sendall(block)
            h.update(block)
        r = c.read_response()
    d = json.loads(r.body)
    assert d == {"length": size, "sha256": h.hexdigest()}
    assert _rss_kb(s) < 150 * 1024, "server memory grew with the upload"


def test_chunked_upload_streamed_bounded_memory(make_server):
    s = make_server("apps:upload")
    block = os.urandom(1 << 20)
    n = 200
    with Conn(s.port, timeout=60) as c:
        c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(n):
            c.sock.sendall(b"%x\r\n" % len(block) + block + b"\r\n")
        c.send(b"0\r\n\r\n")
        d = json.loads(c.read_response().body)
    assert d["length"] == n * len(block)
    assert _rss_kb(s) < 150 * 1024


def test_bad_requests_in_parallel_do_not_disturb_good_ones(server):
    stop = time.monotonic() + 3
    errors = []

    def bad():
        i = 0
        while time.monotonic() < stop and i < 300:
            i += 1
            try:
                with Conn(server.port, timeout=5) as c:
                    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n")
                    c.read_response()
            except Exception as e:   # noqa: BLE001 - counted below
                errors.append(e)

    threads = [threading.Thread(target=bad) for _ in range(4)]
    for t in threads:
        t.start()
    ok = 0
    while time.monotonic() < stop and ok < 500:
        assert server.get("/good").status == 200
        ok += 1
    for t in threads:
        t.join()
    assert not errors and ok > 10


def test_max_connections_queues_instead_of_failing(make_server):
    """At --max-connections with none of them idle (each is mid-request), a
    new connection waits in the backlog until one closes."""
    s = make_server("apps:echo", "--max-connections", "5", "--keep-alive", "30")
    held = [Conn(s.port) for _ in range(5)]
    for c in held:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n")        # a head not yet complete: busy, not idle
    waiting = Conn(s.port)                  # connects (backlog) but is not served yet
    waiting.send(b"GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
    waiting.sock.settimeout(0.5)
    try:
        assert waiting.sock.recv(10) == b"", "served past max-connections"
    except socket.timeout:
        pass
    held[0].close()
    waiting.sock.settimeout(10)
    assert waiting.read_response().status == 200
    for c in held[1:]:
        c.send(b"\r\n")
        assert c.read_response().status == 200
    for c in held[1:] + [waiting]:
        c.close()


def test_max_connections_closes_the_longest_idle_for_a_new_client(make_server):
    """At --max-connections with idle kept-alive connections (10,000 of
    them would wait out the 75 s keep-alive), the one idle longest is closed
    and the new client is served at once, as nginx does. Only one idle for
    2 s at least: a proxy's pooled connections, reused within milliseconds,
    are never cut as they carry a request (test_connection_owner.py)."""
    s = make_server("apps:echo", "--max-connections", "5", "--keep-alive", "30")
    held = [Conn(s.port) for _ in range(5)]
    for c in held:
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        c.read_response()
        time.sleep(0.01)                    # held[0] idles longest
    time.sleep(2.2)                         # idle long enough to be closed for a newcomer
    t0 = time.monotonic()
    newcomer = Conn(s.port)
    newcomer.send(b"GET /new HTTP/1.1\r\nHost: a\r\n\r\n")
    assert newcomer.read_response().status == 200
    assert time.monotonic() - t0 < 2.0
    assert held[0].is_closed(5)
    for c in held[1:]:                      # the others were left alone
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 200
    # The worker's log lines leave through its log thread (src/logq.c): the
    # line may follow the answers.
    assert wait_for(lambda: "--max-connections 5 reached: closing the longest idle" in s.log(), 10), s.log()
    for c in held + [newcomer]:
        c.close()


def test_a_client_reset_during_sendfile_never_kills_a_worker_whose_app_restored_sigpipe(make_server):
    """The app sets SIGPIPE back to its default at import (tests/sigpipe_apps.py).
    sendfile() has no MSG_NOSIGNAL: a client that resets in the middle of a
    wsgi.file_wrapper download made the kernel send the worker SIGPIPE,
    which killed it (20 resets: 1 or 2 dead workers inline; with threads, a
    dozen in a row and the master backing off to 10 s with none left).
    The server keeps SIGPIPE ignored while it serves: the worker serves on."""
    s = make_server("sigpipe_apps:app", "--workers", "1")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    pid = s.worker_pids()[0]
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /file HTTP/1.1\r\nHost: t\r\n\r\n")
            assert sock.recv(65536)                     # the download has begun
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with Conn(s.port, timeout=10) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200
    assert s.worker_pids() == [pid] and "SIGPIPE" not in s.log(), s.log()[-2000:]


@contextlib.contextmanager
def _held_connections(s, n, open_one, prefix=b""):
    """Warm the server (a request after prefix), open n connections with
    open_one(port) and hold them: yields a function that says the worker's
    RSS growth (KiB) since before the first. They close on leaving."""
    with Conn(s.port) as c:
        c.send(prefix + b"GET /warm HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 200
    before = _rss_kb(s, "VmRSS")
    conns = []
    try:
        for _ in range(n):
            conns.append(open_one(s.port))
        def grown():
            return _rss_kb(s, "VmRSS") - before
        grown.conns = conns
        yield grown
    finally:
        for c in conns:
            c.close()


def test_silent_connections_bounded_memory(make_server):
    """3,000 clients that connect and send nothing (a load balancer's idle
    pool, a connection flood): each costs the worker its connection record,
    not buffers. Before, the read at accept gave each one its 16 KiB read
    buffer and the header array on arrival: +8 KiB of RSS per connection
    (24 MiB here); then its record, 1.2 KiB (the request's state, the
    client's address as a sockaddr_storage and as text); then 224 bytes;
    now 240 (with its place on the list of connections that keep their
    request state a moment)."""
    s = make_server("apps:echo", "--workers", "1", "--keep-alive", "60")
    with _held_connections(s, 3000, lambda port: socket.create_connection(("127.0.0.1", port), timeout=10)) as grown:
        # Every one accepted: all established, none left in the accept queue.
        assert wait_for(lambda: established(s.port) >= 3000 and accept_queue(s.port) == 0, 20)
        assert grown() < 3000 * 0.4, f"{grown()} KiB for 3000 silent connections"
        assert s.get("/normal").status == 200


def test_a_burst_of_requests_on_new_connections_bounded_memory(make_server):
    """3,000 clients send one request each at the same moment, then stay
    idle (a proxy's pool filling up). An idle connection keeps its request
    state for a moment, for its next request to take as it is; when every
    connection of a loop pass kept its own, such a burst left the worker
    10 MiB larger (4.2 KiB a connection: the heap does not shrink under
    the blocks still in use). Now FW_KEPT_MAX (64) at most keep theirs,
    and the others give it back at once for the next one to reuse."""
    s = make_server("apps:echo", "--workers", "1", "--keep-alive", "60")

    def open_one(port):
        return socket.create_connection(("127.0.0.1", port), timeout=10)
    with _held_connections(s, 3000, open_one) as grown:
        for c in grown.conns:
            c.sendall(b"GET /burst HTTP/1.1\r\nHost: a\r\n\r\n")
        for c in grown.conns:
            got = b""
            while b'"/burst"' not in got:
                more = c.recv(65536)
                assert more, got
                got += more
        time.sleep(0.5)
        assert grown() < 3000 * 2.5, f"{grown()} KiB after a burst of 3000 requests"
        assert s.get("/after").status == 200


@pytest.mark.parametrize("sent, args", [
    (b"\r\n", []),
    (b"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n", ["--proxy-protocol", "v1", "--proxy-allow-from", "127.0.0.1"]),
], ids=["crlf", "proxy-header"])
def test_connections_that_sent_no_request_yet_bounded_memory(make_server, sent, args):
    """1,000 connections whose first bytes were no request: a CRLF (skipped
    before a request line), or a PROXY header and nothing yet (a load
    balancer's pre-opened connections behind HAProxy or an AWS NLB). They
    kept the request state and read buffer those bytes took: 4.8 KiB of
    RSS each until a request or the header timeout. Now they cost what a
    silent one does."""
    s = make_server("apps:echo", "--workers", "1", "--keep-alive", "60", "--header-timeout", "60", *args)

    def open_one(port):
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(sent)
        return c
    with _held_connections(s, 1000, open_one, prefix=b"" if sent == b"\r\n" else sent) as grown:
        assert wait_for(lambda: established(s.port) >= 1000 and accept_queue(s.port) == 0, 20)
        time.sleep(0.5)                         # every one's bytes read
        assert grown() < 1000 * 0.5, f"{grown()} KiB for 1000 connections that sent {sent!r}"
        c = grown.conns[-1]                     # and its request is served as before
        c.sendall(b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")
        assert b'"path": "/after"' in c.recv(65536)


def _kept_alive(port):
    """A connection that has sent three requests and is idle now."""
    c = Conn(port, timeout=10)
    for _ in range(3):
        c.send(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        assert c.read_response().status == 200
    return c


def test_kept_alive_connections_bounded_memory(make_server):
    """1,000 kept-alive clients, each having sent a few requests, then idle
    (a proxy's upstream pool between bursts): each used to keep a 16 KiB
    read buffer from its second request on (its reads went straight into
    a buffer made for READ_CHUNK): 16.5 KiB of RSS per connection with its
    write buffer and header array; then, its heads through the stack, a
    read buffer their size: 12.4 KiB; then, its buffers given back once it
    was idle for 50 ms, its 1.2 KiB record (and 12 KiB for those the last
    50 ms had served). Now a connection gives its buffers, header array and
    request state back once it is idle (after 2 ms for the last 64), and
    keeps its 240-byte record and its client's address as text; the next
    request on each is served as before."""
    s = make_server("apps:echo", "--workers", "1", "--keep-alive", "60")
    with _held_connections(s, 1000, _kept_alive) as grown:
        assert grown() < 1000 * 0.5, f"{grown()} KiB for 1000 kept-alive connections"
        conns = grown.conns
        for i, c in enumerate(conns):           # each one's buffers made again
            body = b"x" * (i % 300)
            c.send(b"POST /e HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            r = c.read_response()
            assert r.status == 200, (i, r)
            d = json.loads(r.body)
            assert (d["path"], d["body"], d["headers"].get("HTTP_HOST")) == ("/e", body.decode(), "a"), (i, d)


def _reads(pid):
    """read() calls process pid has made (syscr in /proc/PID/io)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("syscr:"))


def _reads_per_request(s, pid, head, n=200):
    with Conn(s.port) as c:
        c.send(head)
        assert c.read_response().status == 200
        before = _reads(pid)
        for _ in range(n):
            c.send(head)
            assert c.read_response().status == 200
        return (_reads(pid) - before) / n


def test_kept_alive_heads_over_4k_take_one_read_each(make_server):
    """Requests with heads over 4 KiB (big cookies, tokens) on a kept-alive
    connection, from its first request on: each head is one read(), as for
    small ones. The first read of a connection went into a 4 KiB stack
    buffer; when it filled, the rest went into a 32 KiB buffer, which is
    over what an idle connection keeps (16 KiB): freed after every request,
    so every next head began in the stack again: two reads, an epoll round
    trip and a malloc/free more per request (a04917a). Every head read with
    nothing waiting goes into a READ_CHUNK stack buffer now."""
    s = make_server("apps:hello", "--workers", "1")
    assert s.get("/").status == 200
    pid = s.worker_pids()[0]
    small = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
    big = b"GET / HTTP/1.1\r\nHost: t\r\nCookie: " + b"c" * 6000 + b"\r\n\r\n"
    # The small heads' count holds what every request costs anyway (an
    # app thread's wake-up reads in the threads mode).
    extra = _reads_per_request(s, pid, big) - _reads_per_request(s, pid, small)
    assert extra < 0.5, f"{extra:.2f} more read() per request for a 6 KiB head"
