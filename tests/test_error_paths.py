"""Error paths users meet, driven through real sockets: the app ending its
process (sys.exit, KeyboardInterrupt), a stop while app threads hold and
queue requests, a --spool-dir that cannot be used or fills up, an
iterable whose close() raises, start_response misuse (PEP 3333), and
wsgi.file_wrapper (sendfile) to a slow reader."""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import HERE, ServerProc
from httpraw import Closed, Conn, request, wait_for

APP = "error_apps:app"


def get(port, path, timeout=10.0, headers=b""):
    return request(port, f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode() + headers + b"\r\n", timeout=timeout)


class Gate:
    """Requests that hold an app thread until opened: /gate?mark=M&open=O."""

    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.open_path = str(tmp_path / "open")
        self.n = 0

    def path(self):
        self.n += 1
        return f"/gate?mark={self.dir}/in{self.n}&open={self.open_path}"

    def entered(self, n):
        return os.path.exists(f"{self.dir}/in{n}")

    def open(self):
        with open(self.open_path, "w"):
            pass


@pytest.fixture
def serve(servers):
    def start(*args, **kw):
        s = ServerProc(APP, *args, **kw)
        servers.append(s)
        return s
    return start


# ---- the app ends its process ------------------------------------------------

def test_sys_exit_in_the_app_lets_the_requests_in_flight_finish(serve, tmp_path):
    """sys.exit() in a request asks the process to end: the request that
    called it gets a 500, the worker's other requests finish, the worker
    exits with its code and is replaced, and the log says why. (Before, the
    worker stopped at once: the client of /exit and the requests in flight
    on other threads got no answer at all.)"""
    s = serve("--workers", "1", "--threads", "2")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    first = s.worker_pids()[0]
    gate = Gate(tmp_path)
    held = Conn(s.port, timeout=20)
    held.send(f"GET {gate.path()} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert wait_for(lambda: gate.entered(1))
    r = get(s.port, "/exit?code=3")
    assert r.status == 500
    gate.open()
    r = held.read_response()
    assert r.status == 200 and r.body == b"gated in1"
    held.close()
    assert wait_for(lambda: first not in s.worker_pids() and len(s.worker_pids()) == 1, timeout=15)
    assert get(s.port, "/").status == 200
    log = s.log()
    assert "The app raised SystemExit" in log and "GET /exit?code=3" in log
    # (the master may see it drain, or only its exit)
    assert f"Worker 1 (pid {first}) retires (the app called sys.exit())" in log or \
        f"Worker 1 (pid {first}) exited (exit code 3) (the app called sys.exit())" in log
    assert "died" not in log


def test_keyboard_interrupt_in_the_app_stops_its_worker_now(serve):
    s = serve("--workers", "1", "--threads", "2")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    first = s.worker_pids()[0]
    try:
        get(s.port, "/interrupt", timeout=5)
    except (Closed, OSError):
        pass                    # stopping now: its answer may be lost
    assert wait_for(lambda: first not in s.worker_pids() and len(s.worker_pids()) == 1, timeout=15)
    assert get(s.port, "/").status == 200
    assert "KeyboardInterrupt in the app: this server stops now; GET /interrupt" in s.log()


EMBEDDED = """
import sys
sys.path.insert(0, {here!r})
import forkwsgi, error_apps
forkwsgi.run(error_apps.app, "127.0.0.1", {port})
"""


def test_an_embedded_server_reraises_the_apps_sys_exit(tmp_path):
    """forkwsgi.run() in the app's own process: the request gets its 500,
    then serve() re-raises SystemExit and the process exits with its code."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    script = tmp_path / "embedded.py"
    script.write_text(EMBEDDED.format(here=HERE, port=port))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: _answers(port), timeout=15)
        assert get(port, "/exit?code=5").status == 500
        assert p.wait(10) == 5
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    assert b"The app raised SystemExit" in p.stdout.read()


def _answers(port):
    try:
        return get(port, "/", timeout=1).status == 200
    except OSError:
        return False


# ---- stops while app threads hold and queue requests -------------------------

def hold_two_of(s, gate, n):
    """n kept-alive connections (accepted, so they are the worker's), each
    sending a gated request: the worker's two app threads hold two of
    them, the others wait for a thread."""
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    conns = [Conn(s.port, timeout=20) for _ in range(n)]
    for c in conns:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200
    for c in conns:
        c.send(f"GET {gate.path()} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    # (which two: the order the loop reads them in)
    assert wait_for(lambda: sum(gate.entered(i) for i in range(1, n + 1)) == 2)
    return conns


def test_a_graceful_stop_serves_held_and_queued_requests(serve, tmp_path):
    """SIGTERM while both app threads hold a request and two more requests
    (on kept-alive connections) wait for a thread: all four are answered,
    with Connection: close, and the server exits 0."""
    s = serve("--workers", "1", "--threads", "2", "--graceful-timeout", "20")
    gate = Gate(tmp_path)
    conns = hold_two_of(s, gate, 4)
    time.sleep(0.2)
    assert sum(gate.entered(i) for i in range(1, 5)) == 2      # two threads: two wait
    s.signal(signal.SIGTERM)
    assert wait_for(lambda: "Received SIGTERM" in s.log())
    gate.open()
    for c in conns:
        r = c.read_response()
        assert r.status == 200 and r.body.startswith(b"gated ")
        assert r.header("connection") == "close"
        c.close()
    assert s.proc.wait(15) == 0


def test_a_quick_stop_ends_held_and_queued_requests_at_once(serve, tmp_path):
    """SIGINT (stop now) while the app threads hold requests that never
    end by themselves: their clients are cut, the queued ones closed, and
    the server is gone within its quick-stop bound (2 s, then SIGKILL)."""
    s = serve("--workers", "1", "--threads", "2")
    conns = hold_two_of(s, Gate(tmp_path), 3)
    t = time.monotonic()
    s.signal(signal.SIGINT)
    assert s.proc.wait(10) is not None
    took = time.monotonic() - t
    for c in conns:
        assert c.is_closed(5)
        c.close()
    assert took < 5.0, took


# ---- --spool-dir -------------------------------------------------------------

@pytest.mark.parametrize("workers", ["1", "0"])
def test_an_unusable_spool_dir_is_refused_at_start(tmp_path, workers):
    """A missing --spool-dir, or a file, stops the server at start with one
    line, not a 500 for every request whose body spools."""
    a_file = tmp_path / "file"
    a_file.write_text("")
    for path, why in ((str(tmp_path / "missing"), "does not exist"), (str(a_file), "is not a directory")):
        p = subprocess.run([sys.executable, "-m", "forkwsgi", APP, "--bind", "127.0.0.1:0", "--workers", workers,
                            "--spool-dir", path], capture_output=True, text=True, timeout=30, cwd=HERE)
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().splitlines()[-1] == f"forkwsgi: error: --spool-dir {path}: {why}"


def _tmpfs(path, options):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    d = tmp_path / "spool"
    _tmpfs(d, "size=1m")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.fixture
def read_only_disk(tmp_path):
    d = tmp_path / "ro"
    _tmpfs(d, "size=1m,ro")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_read_only_spool_dir_is_refused_at_start(read_only_disk):
    p = subprocess.run([sys.executable, "-m", "forkwsgi", APP, "--bind", "127.0.0.1:0",
                        "--spool-dir", str(read_only_disk)], capture_output=True, text=True, timeout=30, cwd=HERE)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1] == \
        f"forkwsgi: error: --spool-dir {read_only_disk}: is not writable (read-only, or permissions)"


def test_a_full_spool_dir_answers_500_for_that_body_and_serves_on(serve, small_disk):
    """A body that does not fit on the spool disk: 500 and the connection
    closes (its body was not read), the log says why; bodies that fit, and
    other connections, are served as before."""
    s = serve("--workers", "1", "--threads", "2", "--spool-dir", str(small_disk), "--spool-threshold", "1000")
    other = Conn(s.port, timeout=10)
    other.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert other.read_response().status == 200
    big = os.urandom(3 << 20)
    with Conn(s.port, timeout=20) as c:
        c.send(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(big))
        try:
            c.send(big)
        except OSError:
            pass                    # the server may close before it all went
        r = c.read_response()
        assert r.status == 500 and r.header("connection") == "close"
    assert wait_for(lambda: "cannot write a spool file: No space left on device" in s.log())
    fits = b"x" * 200_000
    r = request(s.port, b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(fits) + fits)
    assert r.status == 200 and r.body == b"200000"
    other.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert other.read_response().status == 200
    other.close()
    assert os.listdir(small_disk) == []          # spool files are unlinked


# ---- the response --------------------------------------------------------------

def test_an_iterable_whose_close_raises(serve):
    """The response is complete (its close() runs after the last byte), the
    error is logged with the request, and the connection serves on."""
    s = serve("--workers", "1")
    with Conn(s.port) as c:
        c.send(b"GET /close-raises HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.body == b"ab"
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200
    assert wait_for(lambda: "Error closing the response of GET /close-raises" in s.log())
    assert "RuntimeError: close() failed" in s.log()


@pytest.mark.parametrize("path, error", [
    ("/twice", "AssertionError: start_response() called twice without exc_info"),
    ("/status-int", "TypeError: status must be str, not int"),
    ("/header-int", "TypeError: header value must be str, not int"),
])
def test_start_response_misuse_is_a_500_with_the_reason_logged(serve, path, error):
    """PEP 3333: a second start_response without exc_info is an error, the
    status and header values are str. The client gets a 500 that closes
    its connection (as for any exception in the app, and as gunicorn
    does), the log the app's error; the worker serves on."""
    s = serve("--workers", "1")
    with Conn(s.port) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == 500 and r.header("connection") == "close"
        assert c.is_closed(5)
    assert get(s.port, "/").status == 200
    assert wait_for(lambda: error in s.log()), s.log()[-2000:]


def test_file_wrapper_to_a_slow_reader_is_complete_and_blocks_no_one(serve, tmp_path):
    """A 4 MiB file sent with sendfile to a client that reads 64 KiB every
    20 ms through a small receive buffer, longer in all than
    --write-timeout 1 (but never stalled that long): every byte arrives,
    in order, while a single-threaded worker answers others at once."""
    data = os.urandom(4 << 20)
    f = tmp_path / "blob"
    f.write_bytes(data)
    s = serve("--workers", "1", "--write-timeout", "1")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", s.port))
    sock.sendall(f"GET /file HTTP/1.1\r\nHost: t\r\nX-File: {f}\r\n\r\n".encode())
    got = bytearray()
    worst = [0.0]
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t = time.monotonic()
            assert get(s.port, "/").status == 200
            worst[0] = max(worst[0], time.monotonic() - t)
            time.sleep(0.05)
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
            head, sep, body = bytes(got).partition(b"\r\n\r\n")
            if sep and len(body) >= len(data):
                break
            time.sleep(0.02)
    finally:
        stop.set()
        prober.join(10)
        sock.close()
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: %d" % len(data) in head.lower()
    assert body == data
    assert worst[0] < 1.0, worst
