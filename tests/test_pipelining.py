"""Pipelined requests: the responses to the requests already read are
written together (one write for a batch), in order, with the keep-alive,
error, timeout and backpressure rules of one request at a time.

How many writes the server made is read from the client socket's
TCP_INFO (tcpi_data_segs_in): on loopback every send() of the server is a
segment of its own (TCP_NODELAY), and a batch of small responses fits one.
Every test runs with the app inline (--threads 1) and on app threads
(--threads 4).
"""
import os
import socket
import struct
import threading
import time

import pytest

from conftest import ServerProc
from httpraw import Closed, Conn, asleep, server_stalled, wait_for

APP = "pipeline_apps:app"


def data_segs_in(c):
    """Data segments this client socket has received (struct tcp_info's
    tcpi_data_segs_in, Linux 4.6+)."""
    info = c.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, 152)[0]


def get(path, extra=b"", version=b"1.1"):
    return b"GET " + path.encode() + b" HTTP/" + version + b"\r\nHost: t\r\n" + extra + b"\r\n"


def read_all(c, n, method="GET"):
    return [c.read_response(method) for _ in range(n)]


@pytest.fixture(scope="module", params=["1", "4"], ids=["inline", "threads4"])
def srv(request):
    s = ServerProc(APP, "--threads", request.param)
    yield s
    s.stop()


@pytest.fixture(params=["1", "4"], ids=["inline", "threads4"])
def make(request):
    started = []

    def make_(*args, **kw):
        s = ServerProc(APP, "--threads", request.param, *args, **kw)
        started.append(s)
        return s

    yield make_
    for s in started:
        s.stop()


def test_batch_of_16_leaves_in_one_write(srv):
    with Conn(srv.port) as c:
        for rep in range(5):
            before = data_segs_in(c)
            c.send(b"".join(get(f"/n/{rep}.{i}") for i in range(16)))
            rs = read_all(c, 16)
            assert [r.body for r in rs] == [f"i={rep}.{i}".encode() for i in range(16)]
            assert all(r.header("connection") is None for r in rs)
            # One write; two if the loop read the requests in two parts.
            assert data_segs_in(c) - before <= 2, f"round {rep}: the batch took {data_segs_in(c) - before} writes"


def test_app_threads_run_between_batches(srv):
    """Inline, the loop keeps the GIL from one pipelined request to the
    next; it must let go of it before it waits, or a thread of the app's own
    never runs while the server is idle (or runs only when a request comes)."""
    with Conn(srv.port) as c:
        seen = []
        for _ in range(4):
            c.send(get("/ticks") * 16)
            counts = [int(r.body.split(b"=")[1]) for r in read_all(c, 16)]
            assert counts == sorted(counts)
            seen.append(counts[-1])
            time.sleep(0.5)
    # About 500 wake-ups in each idle 0.5 s; far fewer on a busy machine,
    # none at all if the loop waited with the GIL held.
    assert all(b - a >= 20 for a, b in zip(seen[1:], seen[2:])), seen


def test_app_threads_run_between_passes_of_many_connections(srv):
    """Inline, the loop also keeps the GIL from one connection's request to
    the next connection's within a loop pass (once a pass, not once a
    request). It must still let go before the loop sleeps, whichever event
    came last: requests on 8 connections at once, then idle, four times."""
    conns = [Conn(srv.port) for _ in range(8)]
    try:
        seen = []
        for _ in range(4):
            for c in conns:
                c.send(get("/ticks"))
            counts = [int(c.read_response().body.split(b"=")[1]) for c in conns]
            seen.append(max(counts))
            time.sleep(0.5)
        assert all(b - a >= 20 for a, b in zip(seen[1:], seen[2:])), seen
    finally:
        for c in conns:
            c.close()


def test_deep_pipeline_answered_in_order(srv):
    n = 1000        # more than one read of the server's, more than one batch
    with Conn(srv.port) as c:
        before = data_segs_in(c)
        c.send(b"".join(get(f"/n/{i}") for i in range(n)))
        rs = read_all(c, n)
        assert [r.body for r in rs] == [f"i={i}".encode() for i in range(n)]
        assert data_segs_in(c) - before < n // 4


def test_connection_close_ends_the_pipeline(srv):
    with Conn(srv.port) as c:
        before = data_segs_in(c)
        c.send(get("/n/0") + get("/n/1") + get("/n/2", b"Connection: close\r\n") + get("/n/3") + get("/n/4"))
        rs = read_all(c, 3)
        assert [r.body for r in rs] == [b"i=0", b"i=1", b"i=2"]
        assert rs[2].header("connection") == "close"
        assert c.is_closed()
        assert c.buf == b"", "answered a request after Connection: close"
        assert data_segs_in(c) - before <= 2


def test_http10_ends_the_pipeline_unless_kept_alive(srv):
    with Conn(srv.port) as c:
        c.send(get("/n/0") + get("/n/1", b"Connection: keep-alive\r\n", b"1.0") + get("/n/2") +
               get("/n/3", version=b"1.0") + get("/n/4"))
        rs = read_all(c, 4)
        assert [r.body for r in rs] == [b"i=0", b"i=1", b"i=2", b"i=3"]
        assert [r.version for r in rs] == ["HTTP/1.1"] * 4
        assert rs[1].header("connection") == "keep-alive"
        assert rs[3].header("connection") == "close"
        assert c.is_closed()
        assert c.buf == b""


def test_head_in_the_pipeline(srv):
    with Conn(srv.port) as c:
        c.send(get("/n/0") + get("/list?kb=4").replace(b"GET", b"HEAD", 1) + get("/n/2") +
               get("/gen?kb=64").replace(b"GET", b"HEAD", 1) + get("/n/4"))
        r0 = c.read_response()
        h1 = c.read_response("HEAD")
        r2 = c.read_response()
        h3 = c.read_response("HEAD")
        r4 = c.read_response()
        assert (r0.body, r2.body, r4.body) == (b"i=0", b"i=2", b"i=4")
        assert (h1.status, h1.header("content-length"), h1.body) == (200, "4096", b"")
        assert (h3.status, h3.header("content-length"), h3.body) == (200, "65536", b"")
        assert not c.is_closed(0.3)
        assert c.buf == b""


def test_bad_request_mid_pipeline(srv):
    """Earlier responses are delivered, then the 400, then the close; the
    request after it is never answered."""
    with Conn(srv.port) as c:
        before = data_segs_in(c)
        c.send(get("/n/0") + get("/n/1") + get("/n/2") + b"GET /bad HTTP/1.1\r\nBad Header\r\n\r\n" + get("/n/4"))
        rs = read_all(c, 4)
        assert [r.status for r in rs] == [200, 200, 200, 400]
        assert [r.body for r in rs[:3]] == [b"i=0", b"i=1", b"i=2"]
        assert rs[3].header("connection") == "close"
        assert c.is_closed()
        assert c.buf == b""
        assert data_segs_in(c) - before <= 2


def test_app_error_mid_pipeline(srv):
    """A 500 (the app raised before start_response) after batched responses
    keeps them: the error head replaces only a head of its own."""
    with Conn(srv.port) as c:
        c.send(get("/n/0") + get("/n/1") + get("/raise") + get("/n/3"))
        rs = read_all(c, 3)
        assert [r.status for r in rs] == [200, 200, 500]
        assert [r.body for r in rs[:2]] == [b"i=0", b"i=1"]
        assert rs[2].header("connection") == "close"
        assert c.is_closed()
        assert c.buf == b""


def test_big_responses_mid_pipeline(srv):
    """Responses too big to batch (a 1 MiB list body, a 1 MiB generator)
    go out as they always did, in order with the small ones around them."""
    with Conn(srv.port, timeout=30) as c:
        c.send(get("/n/0") + get("/list?kb=1024") + get("/n/2") + get("/gen?kb=1024") + get("/n/4") +
               get("/chunked?n=5") + get("/n/6") + get("/list?kb=40") + get("/list?kb=40") + get("/n/9"))
        rs = read_all(c, 10)
        assert [r.status for r in rs] == [200] * 10
        assert rs[0].body == b"i=0" and rs[2].body == b"i=2" and rs[4].body == b"i=4"
        assert rs[6].body == b"i=6" and rs[9].body == b"i=9"
        assert rs[1].body == (b"list." * 300000)[:1 << 20]
        assert rs[3].body == (b"gen." * 300000)[:1 << 20]
        assert rs[5].body == b"c0;c1;c2;c3;c4;" and rs[5].header("transfer-encoding") == "chunked"
        assert rs[7].body == rs[8].body == (b"list." * 9000)[:40 << 10]
        assert not c.is_closed(0.3)


def test_file_wrapper_mid_pipeline(srv, tmp_path):
    """A sendfile response goes after what is batched before it, and what
    follows it is not sent ahead of it."""
    p = tmp_path / "f.bin"
    data = os.urandom(300 * 1024)
    p.write_bytes(data)
    small = tmp_path / "s.bin"
    small.write_bytes(b"small file")
    with Conn(srv.port, timeout=30) as c:
        c.send(get("/n/0") + get("/n/1") + get(f"/file?path={p}") + get("/n/3") + get(f"/file?path={small}") +
               get(f"/file?path={small}") + get("/n/6"))
        rs = read_all(c, 7)
        assert [r.status for r in rs] == [200] * 7
        assert [rs[i].body for i in (0, 1, 3, 6)] == [b"i=0", b"i=1", b"i=3", b"i=6"]
        assert rs[2].body == data
        assert rs[4].body == rs[5].body == b"small file"


def test_write_callable_mid_pipeline(srv):
    with Conn(srv.port) as c:
        c.send(get("/n/0") + get("/write") + get("/n/2") + get("/write") + get("/n/4"))
        rs = read_all(c, 5)
        assert [r.body for r in rs] == [b"i=0", b"wrote", b"i=2", b"wrote", b"i=4"]


def test_partial_next_head_does_not_hold_the_batch(srv):
    """The responses owed go out when the server would wait for input: a
    head still arriving does not keep them back."""
    with Conn(srv.port, timeout=3) as c:
        c.send(get("/n/0") + get("/n/1") + b"GET /n/2 HTTP/1.1\r\nHo")
        rs = read_all(c, 2)
        assert [r.body for r in rs] == [b"i=0", b"i=1"]
        c.send(b"st: t\r\n\r\n")
        assert c.read_response().body == b"i=2"


@pytest.mark.parametrize("body", ["length", "chunked"])
def test_partial_next_body_does_not_hold_the_batch(srv, body):
    with Conn(srv.port, timeout=3) as c:
        if body == "length":
            c.send(get("/n/0") + b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        else:
            c.send(get("/n/0") + b"POST /read HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        assert c.read_response().body == b"i=0"
        c.send(b"defghij" if body == "length" else b"7\r\ndefghij\r\n0\r\n\r\n")
        assert c.read_response().body == b"len=10"


def test_bodies_in_the_pipeline(srv):
    with Conn(srv.port) as c:
        c.send(get("/n/0") + b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello" + get("/n/2") +
               b"POST /read HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n" +
               get("/n/4"))
        rs = read_all(c, 5)
        assert [r.body for r in rs] == [b"i=0", b"len=5", b"i=2", b"len=5", b"i=4"]


def test_expect_100_continue_after_a_batch(srv):
    """The client waits for 100 Continue: the batched responses go out
    before it, in order, and the body is read after."""
    with Conn(srv.port, timeout=3) as c:
        c.send(get("/n/0") + get("/n/1") +
               b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        rs = read_all(c, 3)
        assert [r.status for r in rs] == [200, 200, 100]
        assert [r.body for r in rs[:2]] == [b"i=0", b"i=1"]
        c.send(b"hello" + get("/n/3"))
        assert [r.body for r in read_all(c, 2)] == [b"len=5", b"i=3"]


def test_header_timeout_after_a_batch(make):
    s = make("--header-timeout", "1")
    with Conn(s.port, timeout=5) as c:
        c.send(get("/n/0") + get("/n/1") + b"GET /n/2 HTTP/1.1\r\nHo")
        t0 = time.monotonic()
        rs = read_all(c, 2)
        assert time.monotonic() - t0 < 0.8, "the batch waited for the next head"
        assert [r.body for r in rs] == [b"i=0", b"i=1"]
        r = c.read_response()
        assert r.status == 408
        assert 0.5 < time.monotonic() - t0 < 4
        assert c.is_closed()


def _rss_kb(s):
    rss = 0
    for pid in s.worker_pids() or [s.pid]:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = max(rss, int(line.split()[1]))
    return rss


def test_slow_reader_deep_pipeline_bounded_memory(make):
    """A client that pipelines 1000 requests for 64 KiB each and does not
    read: the server stops reading once the socket is full (backpressure),
    its memory stays bounded, and every response arrives in order once the
    client reads."""
    s = make()
    n = 1000
    with Conn(s.port, timeout=30) as c:
        c.send(get("/n/warm"))
        assert c.read_response().body == b"i=warm"
        base = _rss_kb(s)
        reqs = b"".join(get("/list?kb=64") if i % 2 else get(f"/n/{i}") for i in range(n))
        sender = threading.Thread(target=c.sock.sendall, args=(reqs,))
        sender.start()
        # The server stopped reading: its writes stalled and its workers
        # sleep (one that reads on sleeps only once it took all of them).
        assert wait_for(lambda: server_stalled(c.sock) and all(asleep(p) for p in s.worker_pids()), 20), \
            s.log()[-1500:]
        grown = _rss_kb(s) - base
        assert grown < 48 * 1024, f"server memory grew by {grown} KiB while the client did not read"
        body = (b"list." * 14000)[:64 << 10]
        for i in range(n):
            r = c.read_response()
            assert r.body == (body if i % 2 else f"i={i}".encode()), i
        sender.join()
        assert _rss_kb(s) - base < 48 * 1024


def test_client_gone_mid_batch(srv):
    """A client that sends a deep pipeline and goes away: the server drops
    the batch and serves on."""
    for _ in range(5):
        c = Conn(srv.port)
        c.send(b"".join(get(f"/n/{i}") for i in range(200)))
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
    with Conn(srv.port) as c:
        c.send(get("/n/ok"))
        assert c.read_response().body == b"i=ok"


def test_access_log_and_stats_count_each_pipelined_request(make, tmp_path):
    log = tmp_path / "access.log"
    s = make("--access-logfile", str(log))
    with Conn(s.port) as c:
        c.send(b"".join(get(f"/n/{i}") for i in range(16)))
        assert [r.body for r in read_all(c, 16)] == [f"i={i}".encode() for i in range(16)]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= 16:
            break
        time.sleep(0.05)
    assert [ln.split('"')[1] for ln in lines] == [f"GET /n/{i} HTTP/1.1" for i in range(16)]

