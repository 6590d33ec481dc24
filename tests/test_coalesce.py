"""Write coalescing (--write-coalesce, with --threads 1): the responses
finished in one loop pass while more of its requests wait leave together
at the pass's end, within the budget; a response never waits for its own
app call (PEP 3333), and after a slow request none waits for a few
seconds. Each test drives the same scene: a request holds the loop (Z), and
meanwhile X (fast) and Y (slow) arrive, so that one pass serves X then Y."""
import json
import os
import socket
import threading
import time

import pytest

from conftest import ServerProc
from httpraw import Conn, wait_for


def unread_at_server(server_port, client_port):
    """Bytes the server's socket of the connection from client_port holds
    unread (/proc/net/tcp: its rx_queue)."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
                return int(fields[4].split(":")[1], 16)
    return 0


def dechunk(body):
    out, rest = b"", body
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, rest = out + rest[:n], rest[n + 2:]


def accept_queue(port):
    """Connections waiting in the listening socket's accept queue."""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
                return int(fields[4].split(":")[1], 16)
    return 0


def connect(s, n):
    """n connections the server has accepted: idle, so that a request sent
    on one later comes as an event of its own (one that comes with the
    accept is served in the listener's event)."""
    conns = [Conn(s.port) for _ in range(n)]
    assert wait_for(lambda: accept_queue(s.port) == 0, 10)
    return conns


def start(*args):
    return ServerProc("coalesce_apps:app", "--threads", "1", *args)


def send_queued(s, conn, target):
    """Send a request while the loop is busy, and wait until it is in the
    server's socket (so that requests sent after it come after it in the
    next pass)."""
    conn.send(f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    port = conn.sock.getsockname()[1]
    assert wait_for(lambda: unread_at_server(s.port, port) > 0, 5)


def one_pass(s, tmp_path, y_seconds, gen):
    """Z holds the loop until X (fast) and Y (y_seconds) have arrived, so
    that the next pass serves X, then Y. Returns (when X's response
    arrived, Y's app start and end)."""
    mark, hold = tmp_path / f"z-{time.monotonic_ns()}", tmp_path / f"go-{time.monotonic_ns()}"
    z, x, y = connect(s, 3)
    try:
        z.send(f"GET /?id=z&mark={mark}&hold={hold} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        assert wait_for(lambda: mark.exists(), 10)
        send_queued(s, x, f"/?id=x&gen={gen}")
        send_queued(s, y, f"/?id=y&t={y_seconds}&gen={gen}")
        hold.touch()
        rx = x.read_response()
        x_arrived = time.monotonic()
        ry = y.read_response()
        assert z.read_response().status == 200
        assert json.loads(rx.body)["id"] == "x" and json.loads(ry.body)["id"] == "y"
        answer = json.loads(ry.body)
        return x_arrived, answer["start"], answer["end"]
    finally:
        for c in (x, y, z):
            c.close()


@pytest.mark.parametrize("gen", ["0", "1"], ids=["list", "generator"])
def test_a_response_waits_for_the_rest_of_its_pass_within_the_budget(tmp_path, gen):
    """Budget 5 s: X's response waits while Y (0.1 s) runs, and leaves at
    the pass's end. With the budget at 0, X leaves before Y ends."""
    s = start("--write-coalesce", "5000000")
    try:
        x_arrived, y_start, y_end = one_pass(s, tmp_path, 0.1, gen)
        assert x_arrived >= y_end, (x_arrived, y_start, y_end)
    finally:
        s.stop()
    s = start("--write-coalesce", "0")
    try:
        x_arrived, y_start, y_end = one_pass(s, tmp_path, 0.1, gen)
        assert x_arrived < y_end - 0.05, (x_arrived, y_start, y_end)
    finally:
        s.stop()


def test_after_a_slow_request_no_response_waits(tmp_path):
    """Budget 3 s (Z, which holds the loop meanwhile, must not pass for a
    slow request). X waits for Y (0.05 s) as above; then for a slow Y
    (3.2 s), once: no average of the pass foresaw it. Y's time tells the
    worker that its requests can be slow: in the passes of the next 5 s no
    response waits."""
    s = start("--write-coalesce", "3000000")
    try:
        x_arrived, y_start, y_end = one_pass(s, tmp_path, 0.05, "1")
        assert x_arrived >= y_end, (x_arrived, y_start, y_end)
        x_arrived, y_start, y_end = one_pass(s, tmp_path, 3.2, "1")
        assert x_arrived >= y_end, (x_arrived, y_start, y_end)
        x_arrived, y_start, y_end = one_pass(s, tmp_path, 0.05, "1")
        assert x_arrived < y_end - 0.02, (x_arrived, y_start, y_end)
    finally:
        s.stop()


def test_a_streamed_chunk_is_on_the_wire_before_the_next_is_asked_for(tmp_path):
    """PEP 3333: a server must not delay a block while the app produces the
    next. S's first chunk waits for the pass (X after it), then leaves
    before S's generator is resumed."""
    s = start("--write-coalesce", "5000000")
    mark, hold = tmp_path / "z", tmp_path / "go"
    z, st, x = connect(s, 3)
    try:
        z.send(f"GET /?id=z&mark={mark}&hold={hold} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        assert wait_for(lambda: mark.exists(), 10)
        send_queued(s, st, "/stream?t=1")
        send_queued(s, x, "/?id=x")
        hold.touch()
        st.sock.settimeout(10)
        got = b""
        while b"first\n" not in got:
            chunk = st.sock.recv(65536)
            assert chunk, got
            got += chunk
        first_arrived = time.monotonic()
        while not got.endswith(b"\r\n0\r\n\r\n"):
            chunk = st.sock.recv(65536)
            assert chunk, got
            got += chunk
        lines = dechunk(got.split(b"\r\n\r\n", 1)[1]).splitlines()
        assert lines[0] == b"first"
        second = json.loads(lines[1])
        assert first_arrived < second["produced"] - 0.5, (first_arrived, second)
        assert x.read_response().status == 200
    finally:
        for c in (x, st, z):
            c.close()
        s.stop()


def test_many_kept_alive_clients_each_get_their_own_responses():
    """16 kept-alive clients, 150 requests each, lists, generators and
    pipelined pairs mixed: every response is whole, in order, and the
    client's own (passes of many events: responses wait and leave together)."""
    s = start("--write-coalesce", "2000")
    errors = []

    def client(n):
        try:
            with Conn(s.port) as c:
                for i in range(150):
                    gen = i % 2
                    if i % 5 == 0:      # a pipelined pair
                        c.send(f"GET /?id={n}-{i}a&gen={gen} HTTP/1.1\r\nHost: t\r\n\r\n"
                               f"GET /?id={n}-{i}b&gen={1 - gen} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                        ids = [json.loads(c.read_response().body)["id"] for _ in range(2)]
                        want = [f"{n}-{i}a", f"{n}-{i}b"]
                    else:
                        c.send(f"GET /?id={n}-{i}&gen={gen} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                        ids = [json.loads(c.read_response().body)["id"]]
                        want = [f"{n}-{i}"]
                    if ids != want:
                        errors.append((ids, want))
                        return
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(repr(e))

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
    finally:
        s.stop()
