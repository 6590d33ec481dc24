"""No class of clients starves another (issue 23, item 1).

While kept-alive clients keep every app thread busy, the work that waits
(ready kept-alive connections and connections in the accept queue) is
served in arrival order, or close to it, under every balance mode: a
client that opens a new connection per request, or a load balancer's
health check, gets its turn. At dac5946 a 2 x 2 server gave new
connections 6 requests in 12 s (the first after 12 s), and a health check
behind nginx timed out 2 times in 3.

Every load here is bounded in time and count and targets 127.0.0.1.
"""
import shutil
import socket
import subprocess
import threading
import time

import pytest

from conftest import ServerProc
from httpraw import established, wait_for
from test_handover import pinned
from test_proxy_pools import NGINX, Proxy

APP_MODES = ("inline",)      # each server here chooses its own --threads

REQ = b"GET /?t=0.05 HTTP/1.1\r\nHost: t\r\n\r\n"


def read_response(sock, buf=b""):
    """One Content-Length response from sock; returns what followed it."""
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            raise EOFError("closed before a response")
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    n = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:"))
    while len(rest) < n:
        d = sock.recv(65536)
        if not d:
            raise EOFError("closed mid-body")
        rest += d
    return rest[n:]


def mixed_load(port, seconds, kept_alive=8, new_conn=4, think=0.02, req=REQ, new_think=0.0):
    """`kept_alive` clients on one connection each (think time between
    requests) and `new_conn` clients that open a connection per request
    (new_think between them), for `seconds`, each sending `req`. Returns the
    latencies of each class and the errors."""
    lat = {"kept": [], "new": []}
    errors = []
    end = time.monotonic() + seconds

    def kept():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            buf = b""
            while time.monotonic() < end:
                t = time.monotonic()
                s.sendall(req)
                buf = read_response(s, buf)
                lat["kept"].append(time.monotonic() - t)
                time.sleep(think)
            s.close()
        except Exception as e:      # noqa: BLE001 (reported below)
            errors.append(repr(e))

    def new():
        try:
            while time.monotonic() < end:
                t = time.monotonic()
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.sendall(req)
                read_response(s)
                s.close()
                lat["new"].append(time.monotonic() - t)
                time.sleep(new_think)
        except Exception as e:      # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=kept) for _ in range(kept_alive)]
    threads += [threading.Thread(target=new) for _ in range(new_conn)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    return lat, errors


@pytest.mark.parametrize("balance,threads", [("least-busy", 2), ("least-busy", 1), ("shared", 2),
                                             ("shared", 1), ("reuseport", 2)])
def test_new_connections_get_their_turn_while_kept_alive_clients_saturate(servers, balance, threads):
    """8 kept-alive clients and 4 that connect per request, 2 workers, an
    app that takes 50 ms: every thread is busy all along. The new
    connections' requests are at least 25 % of those served (their share of
    the clients is 33 %), none waits more than 2 s, and none waits more
    than 0.5 s longer than the slowest kept-alive request: the two classes
    wait alike (at dac5946 the first new connection was served after 12 s).
    The bound is relative because this is a fairness test on a shared
    machine: in CI beside another test, every request of both classes once
    waited about 1.1 s together (kept-alive 1,034 ms, new 1,135 ms), where
    they wait 200-320 ms alone or beside busy loops."""
    s = ServerProc("apps:sleep", "--workers", "2", "--threads", str(threads), "--balance", balance)
    servers.append(s)
    assert wait_for(lambda: s.log().count("Booted worker") >= 2)
    lat, errors = mixed_load(s.port, 6.0)
    assert not errors, errors[:3]
    served = len(lat["kept"]) + len(lat["new"])
    share = len(lat["new"]) / served
    worst = max(lat["new"])
    print(f"{balance} x{threads}: kept-alive {len(lat['kept'])} (max {max(lat['kept']) * 1000:.0f} ms), "
          f"new-connection {len(lat['new'])} (max {worst * 1000:.0f} ms), share {share:.0%}")
    assert served > 100
    assert share >= 0.25, (len(lat["kept"]), len(lat["new"]))
    assert worst < 2.0, sorted(lat["new"])[-5:]
    assert worst < max(lat["kept"]) + 0.5, (sorted(lat["new"])[-5:], sorted(lat["kept"])[-5:])


@pytest.mark.parametrize("workers", [1, 2])
def test_health_checks_get_their_turn_behind_cpu_bound_kept_alive_saturation(servers, workers):
    """Inline first (the default with --threads 4): the loop thread runs the
    quick CPU-bound calls (5 ms) of 32 kept-alive clients itself, so every
    thread is busy whenever the loop polls, while a health check connects
    every 50 ms. The listeners were armed only between two calls of the
    loop thread's run, never while it polled, and take_waiting left the
    accept queue to a poll that did not come: with 1 worker, health checks
    and kept-alive requests waited up to 2.6 s (5 s with 64 clients). Now
    none waits 1.5 s (about 0.2 s here)."""
    s = ServerProc("apps:spin", "--workers", str(workers), "--threads", "4")
    servers.append(s)
    assert wait_for(lambda: s.log().count("Booted worker") >= workers)
    lat, errors = mixed_load(s.port, 4.0, kept_alive=32, new_conn=1, think=0.0,
                             req=b"GET /?t=0.005 HTTP/1.1\r\nHost: t\r\n\r\n", new_think=0.05)
    assert not errors, errors[:3]
    worst = max(lat["new"])
    print(f"workers {workers}: kept-alive {len(lat['kept'])} (max {max(lat['kept']) * 1000:.0f} ms), "
          f"health checks {len(lat['new'])} (max {worst * 1000:.0f} ms)")
    assert len(lat["new"]) >= 10
    assert worst < 1.5, sorted(lat["new"])[-5:]
    assert max(lat["kept"]) < 1.5, sorted(lat["kept"])[-5:]


WRK = shutil.which("wrk")


@pytest.mark.skipif(not (NGINX and WRK), reason="nginx and wrk are installed by .ci/run")
def test_health_check_on_a_new_connection_behind_nginx_under_saturation(servers, tmp_path):
    """nginx (keepalive 32) in front of a 4 x 4 server, wrk with 64
    connections through it keeps every thread busy; a health check opens a
    new connection to the server every 0.5 s. Each is answered within 1 s
    (at dac5946: 2 of 3 timed out at 5 s, so a load balancer would have
    marked the instance down)."""
    s = ServerProc("apps:sleep", "--workers", "4", "--threads", "4")
    servers.append(s)
    assert wait_for(lambda: s.log().count("Booted worker") >= 4)
    proxy = Proxy("nginx", s.port, tmp_path)
    try:
        seconds = 6
        load = subprocess.Popen(pinned([WRK, "-t1", "-c64", f"-d{seconds}s", "--timeout", "5s",
                                        f"http://127.0.0.1:{proxy.port}/?t=0.02"], 1),
                                stdout=subprocess.PIPE, text=True)
        # Saturated: nginx holds a connection to the server for each of its
        # 16 threads (wrk's 64 connections keep them busy).
        assert wait_for(lambda: established(s.port) >= 16, timeout=20)
        checks = []
        end = time.monotonic() + seconds - 2
        while time.monotonic() < end:
            t = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
                    c.settimeout(5)
                    c.sendall(b"GET /?t=0 HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n")
                    read_response(c)
                checks.append(time.monotonic() - t)
            except (OSError, EOFError) as e:
                checks.append(e)
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t)))
        out, _ = load.communicate(timeout=seconds + 30)
    finally:
        proxy.stop()
    failed = [c for c in checks if not isinstance(c, float)]
    print(f"health checks: {len(checks)}, failed {len(failed)}, "
          f"max {max(c for c in checks if isinstance(c, float)) * 1000:.0f} ms; wrk: "
          + " ".join(out.split("\n")[-4:-2]))
    assert "requests in" in out and int(out.split(" requests in")[0].split()[-1]) > 500, out
    assert not failed, failed
    assert max(checks) < 1.0, checks
