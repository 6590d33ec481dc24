"""The master never stops supervising (issue 24): no client of its own
sockets, no failed reload, no privilege setting can leave the server
without workers, without metrics or without its records.

Every client here targets 127.0.0.1, is bounded in time, and every process
started is ended by PID.
"""
import os
import signal
import socket
import threading
import time

from conftest import ServerProc
from httpraw import free_port, wait_for

APP_MODES = ("inline",)      # each server here chooses its own --threads


class Pests:
    """Clients of an observer socket that hold on as long as they can: some
    send nothing, some trickle a request a byte every 0.5 s, reconnecting
    whenever the server drops them, until stop()."""

    def __init__(self, port, silent=16, trickling=4):
        self.port, self.stop_event, self.threads = port, threading.Event(), []
        self.holding = set()        # threads connected (and, trickling, past their first byte)
        for _ in range(silent):
            self.threads.append(threading.Thread(target=self.silent, daemon=True))
        for _ in range(trickling):
            self.threads.append(threading.Thread(target=self.trickle, daemon=True))
        for t in self.threads:
            t.start()

    def connect(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.settimeout(5)
        s.connect(("127.0.0.1", self.port))
        return s

    def silent(self):
        while not self.stop_event.is_set():
            try:
                with self.connect() as s:
                    self.holding.add(threading.get_ident())
                    s.recv(1)           # never sends; waits to be dropped
            except OSError:
                time.sleep(0.05)

    def trickle(self):
        while not self.stop_event.is_set():
            try:
                with self.connect() as s:
                    for b in b"GET /metrics HTTP/1.1\r\nHost: m\r\n":
                        if self.stop_event.wait(0.5):
                            return
                        s.sendall(bytes([b]))
                        self.holding.add(threading.get_ident())
            except OSError:
                time.sleep(0.05)

    def all_holding(self):
        return len(self.holding) == len(self.threads)

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(10)


def healthz(port, timeout=2.0):
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            d = s.recv(4096)
            if not d:
                break
            data += d
    assert data.startswith(b"HTTP/1.1 200"), data
    return time.monotonic() - t


def serving(port):
    """/healthz says 200: a worker has said it is ready (a forked worker
    that has not yet is not counted: 503 "no worker serving")."""
    try:
        healthz(port)
        return True
    except (OSError, AssertionError):
        return False


def test_slow_and_silent_observer_clients_never_hold_the_master(servers):
    """Item 1: at dac5946 one client trickling GET /metrics kept a SIGKILLed
    worker from being replaced for 20 s, a stuck request from being ended by
    --timeout, and SIGTERM waited 40 s; 16 silent clients delayed /healthz
    by 15.9 s. With 16 silent and 4 trickling clients on each of --metrics
    and --stats: /healthz answers at once, a killed worker is replaced
    within a second, a request stuck in the app is ended on time, and
    SIGTERM is honoured within a second."""
    mport, sport = free_port(), free_port()
    s = ServerProc("apps:sleep", "--workers", "2", "--timeout", "2", "--graceful-timeout", "1",
                   "--metrics", f"127.0.0.1:{mport}", "--stats", f"127.0.0.1:{sport}", new_session=True)
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2)
    assert wait_for(lambda: serving(mport))
    pests = [Pests(mport), Pests(sport)]
    try:
        assert wait_for(lambda: all(p.all_holding() for p in pests), timeout=20)   # they hold the sockets now
        assert max(healthz(mport) for _ in range(5)) < 0.5
        victim = s.worker_pids()[0]
        t0 = time.monotonic()
        s_pids = set(s.worker_pids())
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: len(set(s.worker_pids()) - s_pids) == 1, timeout=5), s.log()[-2000:]
        replaced = time.monotonic() - t0
        # a request stuck in the app (--timeout 2) is ended on schedule: its
        # worker retires at once, and is killed with it after the graceful
        # time (--graceful-timeout 1: 1 s for requests, 1 s for atexit)
        stuck = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        stuck.sendall(b"GET /?t=30 HTTP/1.1\r\nHost: a\r\n\r\n")
        t1 = time.monotonic()
        assert wait_for(lambda: "timed out" in s.log(), timeout=8), s.log()[-2000:]
        timed_out = time.monotonic() - t1
        stuck.settimeout(8)
        assert stuck.recv(100) == b""
        ended = time.monotonic() - t1
        stuck.close()
        t2 = time.monotonic()
        s.signal(signal.SIGTERM)
        s.proc.wait(10)
        stopped = time.monotonic() - t2
    finally:
        for p in pests:
            p.stop()
    print(f"worker replaced in {replaced:.2f} s, stuck request timed out after {timed_out:.2f} s "
          f"and ended after {ended:.2f} s (--timeout 2, --graceful-timeout 1), SIGTERM honoured in {stopped:.2f} s")
    assert replaced < 1.0
    assert timed_out < 3.0
    assert ended < 6.0
    assert stopped < 1.5
