"""forkwsgi under systemd: socket activation (LISTEN_FDS, driven by Debian's
systemd-socket-activate, as a .socket unit would) and sd_notify
(NOTIFY_SOCKET: a datagram socket this test reads, as systemd would)."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import HERE
from httpraw import free_port, request, serves_on_unix, wait_for

APP_MODES = ("inline",)


def env():
    return dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))


def stop(proc):
    """End the server (its own process group) by PID."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


needs_activate = pytest.mark.skipif(shutil.which("systemd-socket-activate") is None,
                                    reason="systemd-socket-activate (Debian's systemd package) is not installed")


@needs_activate
@pytest.mark.parametrize("workers", ["2", "0"], ids=["master", "no-master"])
def test_socket_activation_serves_the_passed_socket(tmp_path, workers):
    """No --bind: the socket systemd passes (fd 3) is served, and the client
    whose connection started the service gets its answer. Before, forkwsgi
    bound 127.0.0.1:8000 and that client hung."""
    port = free_port()
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen(["systemd-socket-activate", "-l", f"127.0.0.1:{port}", sys.executable, "-m", "forkwsgi",
                             "apps:hello", "--workers", workers],
                            cwd=HERE, env=env(), stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:          # systemd-socket-activate listening
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        r = request(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", timeout=15)
        assert r.status == 200, r
        r = request(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", timeout=15)
        assert r.status == 200, r
        text = (tmp_path / "log").read_text()
        assert "127.0.0.1:8000" not in text, text
        assert f"127.0.0.1:{port}" in text, text
    finally:
        stop(proc)
        log.close()


def listening(port):
    """A socket listens on 127.0.0.1:port (/proc/net/tcp, state LISTEN)."""
    with open("/proc/net/tcp") as f:
        return any(line.split()[3] == "0A" and line.split()[1] == f"0100007F:{port:04X}"
                   for line in f.readlines()[1:])


@needs_activate
def test_passed_sockets_win_over_bind_as_in_gunicorn(tmp_path):
    """Hostile review (gunicorn migration): with a bind in the config and
    socket activation, gunicorn serves the socket systemd passed and
    ignores bind; forkwsgi served --bind and left the socket unit's
    clients hanging. Now the passed socket is served, --bind is not, and
    the log says so."""
    port, other = free_port(), free_port()
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen(["systemd-socket-activate", "-l", f"127.0.0.1:{port}", sys.executable, "-m", "forkwsgi",
                             "apps:hello", "--workers", "1", "--bind", f"127.0.0.1:{other}"],
                            cwd=HERE, env=env(), stdout=log, stderr=log, start_new_session=True)
    try:
        assert wait_for(lambda: listening(port), timeout=10), open(log.name).read()    # systemd-socket-activate's
        r = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and r is None:
            try:
                r = request(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", timeout=5)
            except OSError:
                time.sleep(0.1)
        assert r is not None and r.status == 200, open(log.name).read()
        assert not listening(other)
        assert "serving them, as gunicorn does; --bind (command line) not used" in (tmp_path / "log").read_text()
    finally:
        stop(proc)
        log.close()


@needs_activate
def test_a_passed_unix_sockets_file_outlives_a_reload_and_the_stop(tmp_path):
    """Hostile review: with socket activation on a unix path and --bind
    naming it too, a reload (SIGHUP) then a stop removed the socket unit's
    file: the re-executed master no longer knew the socket was passed in,
    and removed what --bind names. nginx then got ENOENT until the .socket
    unit was restarted. A passed socket's file is never removed."""
    path = str(tmp_path / "app.sock")
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen(["systemd-socket-activate", "-l", path, sys.executable, "-m", "forkwsgi",
                             "apps:hello", "--workers", "1", "--bind", f"unix:{path}"],
                            cwd=HERE, env=env(), stdout=log, stderr=log, start_new_session=True)

    def served():
        return serves_on_unix(path)
    try:
        assert wait_for(served, timeout=15), open(log.name).read()
        assert wait_for(lambda: "Booted worker 1" in open(log.name).read(), timeout=10)
        os.kill(proc.pid, signal.SIGHUP)
        assert wait_for(lambda: open(log.name).read().count("Booted worker 1") >= 2, timeout=20), \
            open(log.name).read()
        assert served()
    finally:
        stop(proc)
        log.close()
    assert os.path.exists(path), open(tmp_path / "log").read()[-2000:]


def read_notifications(sock, until, timeout):
    """Datagrams from the notify socket until one contains `until`."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode())
        except socket.timeout:
            break
        if until in got[-1]:
            return got
    raise AssertionError(f"no {until!r} within {timeout} s: {got}")


def test_sd_notify_ready_reloading_stopping_and_watchdog(tmp_path):
    """Type=notify: READY=1 once the workers serve (a request then succeeds
    at once), WATCHDOG=1 every half WATCHDOG_USEC, RELOADING=1 then READY=1
    around a SIGHUP reload, STOPPING=1 at a stop."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    port = free_port()
    e = env()
    e.update(NOTIFY_SOCKET=path, WATCHDOG_USEC="400000")
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "forkwsgi", "apps:hello", "--workers", "2", "--threads", "2",
                             "--bind", f"127.0.0.1:{port}"],
                            cwd=HERE, env=e, stdout=log, stderr=log, start_new_session=True)
    try:
        got = read_notifications(sock, "READY=1", 20)
        r = request(port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", timeout=5)
        assert r.status == 200
        assert "STATUS=2 worker(s) serving" in got[-1], got
        t0 = time.monotonic()
        dogs = []
        while time.monotonic() - t0 < 1.0:
            sock.settimeout(1.0)
            try:
                m = sock.recv(4096).decode()
            except socket.timeout:
                break
            if "WATCHDOG=1" in m:
                dogs.append(m)
        assert len(dogs) >= 3, dogs                     # every 0.2 s
        proc.send_signal(signal.SIGHUP)
        got = read_notifications(sock, "RELOADING=1", 5)
        assert "MONOTONIC_USEC=" in got[-1]
        read_notifications(sock, "READY=1", 20)
        proc.send_signal(signal.SIGTERM)
        read_notifications(sock, "STOPPING=1", 5)
        assert proc.wait(15) == 0
    finally:
        stop(proc)
        log.close()
        sock.close()
