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
from httpraw import Closed, Conn, bytes_waiting, non_readers, request, server_unread, wait_for

APP = "error_apps:app"
APP_MODES = ("inline", "threads", "handoff")     # handoff: the app threads' hand-offs (conftest)


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
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    idle = Conn(s.port, timeout=20)        # a kept-alive connection with nothing in flight
    idle.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert idle.read_response().status == 200
    conns = hold_two_of(s, gate, 4)        # two in the app; the other two sent, waiting for a thread
    assert sum(gate.entered(i) for i in range(1, 5)) == 2
    s.signal(signal.SIGTERM)
    # The master's "Received SIGTERM" comes before the worker has the
    # signal: a response whose head is made before the worker begins its
    # stop keeps the connection alive (and it closes once idle). The idle
    # connection closing says the worker's stop has begun.
    assert idle.is_closed(10)
    idle.close()
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


def post_body(port, n):
    with Conn(port, timeout=20) as c:
        c.send(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % n)
        try:
            c.send(b"b" * n)
        except OSError:
            pass                    # the server may close before it all went
        return c.read_response()


def test_a_spool_dir_remounted_read_only_answers_500_and_serves_on(serve, small_disk):
    """The spool disk turns read-only while the server runs (as a disk does
    on errors): a body that must spool gets a 500 and the log says why;
    bodies under --spool-threshold are served as before."""
    s = serve("--workers", "1", "--spool-dir", str(small_disk), "--spool-threshold", "1000")
    assert get(s.port, "/").status == 200       # the worker has booted (it checks the dir)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    r = post_body(s.port, 100_000)
    assert r.status == 500 and r.header("connection") == "close"
    assert wait_for(lambda: "cannot create a spool file: Read-only file system" in s.log())
    r = request(s.port, b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 500\r\n\r\n" + b"s" * 500)
    assert r.status == 200 and r.body == b"500"


def test_a_spool_dir_full_before_the_body_answers_500_until_there_is_room(serve, small_disk):
    """No room at all on the spool disk: the first write of a spool file
    fails, 500; once room returns, the same body is served."""
    s = serve("--workers", "1", "--spool-dir", str(small_disk), "--spool-threshold", "1000")
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):          # to the last byte
            try:
                while True:
                    f.write(b"f" * size)
            except OSError:
                pass
    assert post_body(s.port, 50_000).status == 500
    assert wait_for(lambda: "cannot write a spool file: No space left on device" in s.log())
    filler.unlink()
    r = post_body(s.port, 50_000)
    assert r.status == 200 and r.body == b"50000"


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


@pytest.fixture(scope="module")
def one_worker():
    """One inline worker, shared by the tests whose requests leave no state."""
    s = ServerProc(APP, "--workers", "1")
    yield s
    s.stop()


@pytest.mark.parametrize("path, error", [
    ("/twice", "AssertionError: start_response() called twice without exc_info"),
    ("/status-int", "TypeError: status must be str, not int"),
    ("/header-int", "TypeError: header value must be str, not int"),
    ("/no-reason", "ValueError: invalid status line: '200'"),
    ("/sr-status?s=20%20OK", "ValueError: invalid status line: '20 OK'"),
    ("/sr-status?s=2x0%20OK", "ValueError: invalid status line: '2x0 OK'"),
    ("/sr-status?s=600%20Over", "ValueError: invalid status line: '600 Over'"),
    ("/sr-status?s=099%20Under", "ValueError: invalid status line: '099 Under'"),
    ("/sr-status?s=200%20A%7FB", "ValueError: invalid status line: '200 A\\x7fB'"),
    ("/sr-headers?case=not-a-tuple", "TypeError: header must be a (name, value) tuple, not 'X-B: 2'"),
    ("/sr-headers?case=one-item", "TypeError: header must be a (name, value) tuple, not ('X-A',)"),
    ("/sr-headers?case=not-a-list", "TypeError: headers must be a list of (name, value) tuples"),
    ("/sr-headers?case=empty-name", "ValueError: invalid header: ('', 'v')"),
    ("/sr-headers?case=space-in-name", "ValueError: invalid header: ('X A', 'v')"),
    ("/sr-headers?case=bad-length", "ValueError: invalid or duplicate response header ('Content-Length', '12a')"),
    ("/sr-headers?case=empty-length", "ValueError: invalid or duplicate response header ('Content-Length', '')"),
    ("/sr-headers?case=two-lengths", "ValueError: invalid or duplicate response header ('Content-Length', '5')"),
    ("/sr-headers?case=signed-length", "ValueError: invalid or duplicate response header ('Content-Length', '-5')"),
    ("/sr-headers?case=huge-length",
     "ValueError: invalid or duplicate response header ('Content-Length', '11111111111111111111')"),
    ("/sr-one-arg", "TypeError: start_response() missing required argument 'headers' (pos 2)"),
    ("/sr-write-first", "AssertionError: write() called before start_response()"),
    ("/sr-write-str", "TypeError: a bytes-like object is required, not 'str'"),
    ("/sr-write-two", "TypeError: write() takes exactly one argument (the bytes to send)"),
    ("/sr-write-bad-head", "ValueError: invalid or duplicate response header ('Content-Length', 'x')"),
    ("/sr-no-call", "RuntimeError: the app did not call start_response()"),
    ("/body-not-iterable", "The app returned a non-iterable for GET /body-not-iterable"),
])
def test_start_response_misuse_is_a_500_with_the_reason_logged(one_worker, path, error):
    """PEP 3333: a second start_response without exc_info is an error, the
    status is "NNN reason" and the headers a list of (name, value) str
    tuples, write() takes bytes once start_response was called, and the
    app returns an iterable. The client gets a 500 that closes its
    connection (as for any exception in the app, and as gunicorn does),
    the log the app's error; the worker serves on."""
    s = one_worker
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


def test_a_file_wrapper_pipelined_with_the_next_request(serve, tmp_path):
    """A sendfile response and the request pipelined behind it: the next
    waits for the file to be sent, then is answered on the same connection."""
    data = os.urandom(300_000)
    f = tmp_path / "blob"
    f.write_bytes(data)
    s = serve("--workers", "1")
    with Conn(s.port, timeout=10) as c:
        c.send(f"GET /file HTTP/1.1\r\nHost: t\r\nX-File: {f}\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == 200 and r.body == data
        r = c.read_response()
        assert r.status == 200 and r.body == b"ok"


def test_a_file_that_shrinks_while_it_is_sent_closes_the_connection(serve, tmp_path):
    """The file behind a wsgi.file_wrapper response is truncated while a
    slow client reads it (a log rotated under it): the response stops short
    of its Content-Length and the connection closes, so the client knows it
    is cut; the worker serves on."""
    data = os.urandom(8 << 20)
    f = tmp_path / "blob"
    f.write_bytes(data)
    s = serve("--workers", "1")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", s.port))
    try:
        sock.sendall(f"GET /file HTTP/1.1\r\nHost: t\r\nX-File: {f}\r\n\r\n".encode())
        got = sock.recv(65536)
        assert got.startswith(b"HTTP/1.1 200")
        os.truncate(f, 1 << 20)
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    finally:
        sock.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(data) in head.lower()
    # sendfile is zero-copy: bytes handed to the socket before the truncation
    # still point at the file's pages, and what leaves is what those pages
    # hold when the kernel sends them; past the new end the kernel may have
    # zeroed them already (seen under load). Before the new end they are
    # the file's.
    cut = 1 << 20
    assert len(body) < len(data) and body[:cut] == data[:min(len(body), cut)]
    assert get(s.port, "/").status == 200


# ---- wsgi.input ----------------------------------------------------------------------

def test_wsgi_input_refuses_bad_arguments_and_an_ended_request(one_worker):
    """read/readline/readlines take one optional integer; readlines(hint)
    stops once hint bytes are read; a wsgi.input or start_response kept
    from an ended request raises (ValueError, RuntimeError) instead of
    reading another request's body or answering it."""
    s = one_worker
    with Conn(s.port) as c:
        c.send(b"POST /input-misuse HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\n\r\nab\ncd\nef\n")
        r = c.read_response()
        assert r.status == 200
        assert r.body.decode().split("\n") == [
            "TypeError: read() takes at most 1 argument", "TypeError: readline() takes at most 1 argument",
            "TypeError: readlines() takes at most 1 argument"] + \
            ["TypeError: 'str' object cannot be interpreted as an integer"] * 3 + \
            ["[b'ab\\n', b'cd\\n']", "b'ef\\n'"]
        c.send(b"POST /input-kept HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nother")
        r = c.read_response()
        assert r.status == 200
        assert r.body.decode().split("\n") == ["ValueError: wsgi.input used after the request ended"] * 2 + \
            ["RuntimeError: start_response() called after the request ended"] + \
            ["RuntimeError: write() called after the request ended"] * 2


def spool_fd(pid, spool):
    """The fd of pid's spool file (unlinked) in the directory spool."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(spool)):
                return fd
        except OSError:
            pass
    return None


def test_a_spool_file_lost_under_the_app_is_an_oserror_in_the_app(serve, tmp_path):
    """The spool file of a body shrinks while the app reads it (a disk that
    fails, or someone truncates it): wsgi.input raises OSError, and goes on
    raising, instead of returning a short body as if it were whole. The
    response closes the connection (the body is in doubt); the worker
    serves on."""
    spool = tmp_path / "spool"
    spool.mkdir()
    s = serve("--workers", "1", "--spool-dir", str(spool), "--spool-threshold", "1000")
    mark, gate = tmp_path / "in", tmp_path / "open"
    body = b"0123456789" + b"x" * 299_990
    with Conn(s.port, timeout=20) as c:
        c.send(f"POST /input-spool-lost?mark={mark}&open={gate} HTTP/1.1\r\nHost: t\r\n"
               f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert wait_for(lambda: mark.exists() and mark.read_text())
        pid = int(mark.read_text())
        fd = spool_fd(pid, spool)
        assert fd is not None
        os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_TRUNC))
        gate.write_text("")
        r = c.read_response()
        assert r.status == 200 and r.header("connection") == "close"
        assert r.body.decode().split("\n") == ["b'0123456789'"] + \
            ["OSError: cannot read the request body's spool file"] * 2
        assert c.is_closed(5)
    assert get(s.port, "/").status == 200


# ---- the response the server frames ---------------------------------------------------

def read_all(port, path, timeout=10):
    """The raw bytes of one GET until the server closes."""
    with Conn(port, timeout=timeout) as c:
        c.send(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        assert c.is_closed(timeout)
        return c.buf


def test_many_small_list_items_are_written_as_they_pile_up(one_worker):
    """20 items of 60000 bytes with empty ones between: one Content-Length,
    every byte in order; the empty items add nothing."""
    r = get(one_worker.port, "/body-pieces")
    assert r.status == 200 and r.header("content-length") == "1200000"
    assert r.body == (b"p" * 59999 + b"\n") * 20


@pytest.mark.parametrize("path, error", [
    ("/body-not-bytes", "TypeError: the app must yield bytes, not str"),
    ("/sr-late-exc-info?case=bad", "TypeError: exc_info must be a 3-tuple"),
    ("/sr-late-exc-info?case=no-tb", "ValueError: raised late"),
])
def test_an_error_after_the_head_cuts_the_response(one_worker, path, error):
    """Once the head is out a 500 cannot be sent: the chunked body ends
    without its last chunk and the connection closes, so the client sees
    the response is incomplete; the log says why (PEP 3333: exc_info after
    the head re-raises; a str item is not a body)."""
    raw = read_all(one_worker.port, path)
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n") or raw == b""
    assert not raw.endswith(b"0\r\n\r\n")
    assert wait_for(lambda: error in one_worker.log()), one_worker.log()[-2000:]


def test_a_close_attribute_that_raises_is_logged(one_worker):
    with Conn(one_worker.port) as c:
        c.send(b"GET /body-close-attr-raises HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == b"body"
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == b"ok"
    assert wait_for(lambda: "Error closing the response of GET /body-close-attr-raises" in one_worker.log())
    assert "RuntimeError: no close today" in one_worker.log()


def test_bytes_past_the_apps_content_length_are_not_sent(one_worker):
    """The app says Content-Length: 3 and yields 6 bytes: 3 are sent and the
    connection closes (the next bytes would be read as a response)."""
    with Conn(one_worker.port) as c:
        c.send(b"GET /body-past-length HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.body == b"abc"
        assert c.is_closed(5) and c.buf == b""


def test_an_informational_status_as_the_answer_ends_the_connection(one_worker):
    """A 1xx as the app's final status would leave the client waiting for
    the real answer: it goes out bodiless and the connection closes."""
    with Conn(one_worker.port) as c:
        c.send(b"GET /body-informational HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
        assert r.status == 103 and r.header("link") == "</a.css>; rel=preload"
        assert r.header("connection") == "close" and r.header("content-length") is None   # (RFC 9110 8.6)
        assert c.is_closed(5) and c.buf == b""


def test_no_content_length_on_a_204_and_the_connection_stays(one_worker):
    with Conn(one_worker.port) as c:
        c.send(b"GET /body-no-content-length HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
        assert r.status == 204 and r.header("content-length") is None
        assert c.read_response().body == b"ok"


def test_hop_by_hop_headers_of_the_app_are_dropped_and_date_server_sent_once(one_worker):
    """PEP 3333: hop-by-hop headers are the server's; a Connection without
    "close" is dropped and the connection stays; other names of the same
    lengths are the app's and sent."""
    with Conn(one_worker.port) as c:
        c.send(b"GET /body-app-headers HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.body == b"headers"
        names = [k for k, _ in r.headers]
        for hop in ("te", "trailer", "upgrade", "proxy-connection", "transfer-encoding", "connection"):
            assert hop not in names
        assert [v for k, v in r.headers if k == "date"] == ["Mon, 01 Jan 2024 00:00:00 GMT"]
        assert [v for k, v in r.headers if k == "server"] == ["app/1"]
        assert [r.header(k) for k in ("xy", "x-trace-id", "x-request-origin", "x-request-origins", "x-kept")] == \
            ["2", "10", "16", "17", "1"]
        assert r.header("content-length") == "7"
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == b"ok"


def test_a_tuple_body_gets_a_content_length(one_worker):
    r = get(one_worker.port, "/body-tuple")
    assert r.status == 200 and r.header("content-length") == "16" and r.body == b"a tuple of bytes"


@pytest.mark.parametrize("kind", ["bytesio", "minus-one", "no-tell", "length"])
def test_file_wrapper_over_what_is_not_a_plain_file(one_worker, tmp_path, kind):
    """wsgi.file_wrapper falls back to reading the file-like object when it
    has no usable fileno() (BytesIO, or -1); sends from the fd's position
    when tell() fails; and sends no more than the app's Content-Length."""
    data = os.urandom(200_000)
    f = tmp_path / "blob"
    f.write_bytes(data)
    with Conn(one_worker.port) as c:
        c.send(f"GET /body-file?kind={kind} HTTP/1.1\r\nHost: t\r\nX-File: {f}\r\n\r\n".encode())
        r = c.read_response()
        assert r.status == 200
        assert r.body == {"no-tell": data[5:], "length": data[:1000]}.get(kind, data)
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == b"ok"


def test_file_wrapper_with_a_bad_content_length_is_a_500(one_worker, tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(b"x" * 5000)
    with Conn(one_worker.port) as c:
        c.send(f"GET /body-file?kind=bad-length HTTP/1.1\r\nHost: t\r\nX-File: {f}\r\n\r\n".encode())
        assert c.read_response().status == 500
    assert wait_for(lambda: "invalid or duplicate response header ('Content-Length', '1e3')" in one_worker.log())


# ---- write() to clients that do not read -------------------------------------------------

def test_inline_write_to_a_client_that_does_not_read_raises_past_its_bound(one_worker):
    """Inline (--threads 1) the loop thread cannot wait for one client:
    write() queues up to 64 MiB for it, then raises OSError in the app and
    the connection closes; others are served meanwhile."""
    s = one_worker
    (sock,) = non_readers(s.port, "/body-write-flood", 1)
    try:
        assert wait_for(lambda: "OSError: clients are not reading: 64 MiB of write() output queued for this one"
                        in s.log(), timeout=20), s.log()[-2000:]
        assert get(s.port, "/").status == 200
    finally:
        sock.close()


def test_app_threads_wait_in_write_for_slow_readers(serve):
    """With app threads, write() past 1 MiB queued waits while the loop
    writes. Five clients that do not read at first: each thread that waits
    gives its place to a spare (--threads 2 has 4; the fifth finds none
    left and waits without one), the sixth thread answers others
    meanwhile, and once the clients read every byte arrives. A client that
    then stops reading for --write-timeout makes write() raise in the app,
    and only its connection ends."""
    s = serve("--workers", "1", "--threads", "2", "--write-timeout", "3")
    socks = non_readers(s.port, "/body-write-flood?mb=4", 5)
    try:
        # Every response has begun: each app thread is in write().
        assert wait_for(lambda: all(bytes_waiting(sock) > 0 for sock in socks), 20)
        assert get(s.port, "/", timeout=5).status == 200
        for sock in socks:
            sock.settimeout(20)
        want = 4 << 20
        for sock in socks:
            got = b""
            while b"\r\n\r\n" not in got:
                got += sock.recv(65536)
            body = len(got.partition(b"\r\n\r\n")[2])
            while body < want:
                chunk = sock.recv(1 << 20)
                assert chunk, body
                body += len(chunk)
            assert body == want
    finally:
        for sock in socks:
            sock.close()
    (stuck,) = non_readers(s.port, "/body-write-flood?mb=16", 1)
    try:
        assert wait_for(lambda: "OSError: client stopped reading (write timeout)" in s.log(), timeout=20)
        assert get(s.port, "/").status == 200
    finally:
        stuck.close()
    assert "pool:" not in s.log()


# ---- stops ------------------------------------------------------------------------------

def test_a_graceful_stop_past_its_timeout_cuts_the_request_in_the_app(serve, tmp_path):
    """SIGTERM with --graceful-timeout 1 while an app thread holds a
    request for longer: at the timeout its client is cut, the log says so,
    and the process ends once the app returns."""
    s = serve("--workers", "0", "--threads", "2", "--graceful-timeout", "1")
    gate = Gate(tmp_path)
    held = Conn(s.port, timeout=20)
    held.send(f"GET {gate.path()} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert wait_for(lambda: gate.entered(1))
    s.signal(signal.SIGTERM)
    assert held.is_closed(10)
    held.close()
    assert wait_for(lambda: "graceful timeout: closing 1 connection(s)" in s.log())
    gate.open()
    assert s.proc.wait(15) == 0
    assert "waiting for 1 request(s) still in the app" in s.log()     # (logged as it waited)


@pytest.mark.parametrize("first, rest, body", [
    (b"GET / HTTP/1.1\r\nHo", b"st: t\r\n\r\n", b"ok"),
    (b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n01234", b"56789", b"10"),
], ids=["head", "body"])
def test_a_stop_while_a_request_is_half_received_serves_it_then_closes(serve, first, rest, body):
    """SIGTERM while a client is in the middle of sending its request (head
    or body): the request is served (with Connection: close), not dropped."""
    s = serve("--workers", "0", "--graceful-timeout", "10")
    with Conn(s.port, timeout=10) as c:
        c.send(first)
        assert wait_for(lambda: server_unread(c.sock) == 0)     # the loop has read the first bytes
        s.signal(signal.SIGTERM)
        assert wait_for(lambda: "Received SIGTERM" in s.log())
        c.send(rest)
        r = c.read_response()
        assert r.status == 200 and r.body == body and r.header("connection") == "close"
    assert s.proc.wait(15) == 0


def test_a_refused_body_sent_anyway_does_not_reset_the_answer(serve):
    """A body over --limit-request-body gets its 413 at once; a client that
    sends the body anyway before it reads still gets that 413 (the server
    reads and drops what comes after it instead of closing on unread
    bytes, which would reset the connection). A stop meanwhile closes the
    connection at once."""
    s = serve("--workers", "0", "--limit-request-body", "1000")
    with Conn(s.port, timeout=10) as c:
        c.send(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 300000\r\n\r\n")
        assert wait_for(lambda: bytes_waiting(c.sock) > 0)      # the 413 is here, unread
        c.send(b"b" * 300_000)
        assert wait_for(lambda: server_unread(c.sock) == 0)     # the server took the body in
        r = c.read_response()
        assert r.status == 413 and r.header("connection") == "close"
        s.signal(signal.SIGTERM)
        assert c.is_closed(5)
    assert s.proc.wait(10) == 0


def test_responses_owed_on_a_pipelined_connection_leave_while_its_next_request_waits(serve, tmp_path):
    """Two app threads: one held; a pipelined pair on another connection
    (its first request held too); a third client's request waits for a
    thread. When the pair's first request ends, the third client gets that
    thread (it came first) and the pair's second request waits: the first
    response of the pair is sent now, not held back with it."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    gate_a, gate_b = Gate(tmp_path / "a"), Gate(tmp_path / "b")
    s = serve("--workers", "1", "--threads", "2")
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    held = Conn(s.port, timeout=20)
    held.send(f"GET {gate_a.path()} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert wait_for(lambda: gate_a.entered(1))
    pair = Conn(s.port, timeout=20)
    pair.send(f"GET {gate_b.path()} HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert wait_for(lambda: gate_b.entered(1))
    third = Conn(s.port, timeout=20)
    third.send(f"GET {gate_a.path()} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    # Time passing is the point here: the server orders arrivals by the
    # millisecond, and the third's must come before the pair's second's
    # (which counts from the moment the pair's first ends).
    time.sleep(0.05)
    gate_b.open()
    r = pair.read_response()            # while gate a is still shut
    assert r.status == 200 and r.body == b"gated in1"
    gate_a.open()
    assert pair.read_response().body == b"ok"
    assert held.read_response().body == b"gated in1"
    assert third.read_response().body == b"gated in2"
    for c in (held, pair, third):
        c.close()


@pytest.mark.parametrize("head, status", [
    (b"HEAD /body-not-iterable HTTP/1.1\r\nHost: t\r\n\r\n", 500),
    (b"HEAD /" + b"u" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", 414),
], ids=["app-error", "uri-too-long"])
def test_an_error_answer_to_head_has_no_body(one_worker, head, status):
    """RFC 9110 9.3.2: the server's own error answers to HEAD carry the
    GET's headers (its Content-Length) but no body, whether the request
    parsed or not."""
    with Conn(one_worker.port) as c:
        c.send(head)
        r = c.read_response(method="HEAD")
        assert r.status == status and int(r.header("content-length")) > 0
        assert c.is_closed(5) and c.buf == b""


def test_a_body_under_the_spool_threshold_is_read_in_place_whole(one_worker):
    """A Content-Length body up to --spool-threshold (1 MiB) stays in the
    connection's buffer, read in as big reads as it needs."""
    body = os.urandom(1 << 20)
    with Conn(one_worker.port, timeout=20) as c:
        c.send(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        r = c.read_response()
        assert r.status == 200 and r.body == b"%d" % len(body)


# ---- a reload that meets a full disk, a huge environment, systemd's sockets --------

def test_a_reload_with_capture_output_on_a_full_disk_goes_ahead(servers, small_disk):
    """Hostile review: with --capture-output on a full disk, SIGHUP killed
    the master and every worker without a word: the master's flush of
    stderr before its re-execution raised ENOSPC. The reload goes ahead
    (what could not be written is lost) and the server serves on."""
    log = small_disk / "error.log"
    conf = small_disk.parent / "chatty.conf.py"
    conf.write_text("def when_ready(server):\n"
                    "    print('ready, says a hook')\n")     # in the master's stdout buffer until a flush
    s = ServerProc("apps:chatty", "-c", str(conf), "--workers", "1", "--error-logfile", str(log),
                   "--capture-output", wait=False)
    servers.append(s)
    assert wait_for(lambda: log.exists() and "Booted worker" in log.read_text(), 15)
    s.port = int(log.read_text().split("Listening at: http://127.0.0.1:")[1].split()[0])
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    before = s.worker_pids()
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)      # the disk is full from here
    try:
        while os.write(fd, b"x" * 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    with Conn(s.port) as c:
        c.send(b"GET /full?big=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        c.read_response()                  # its print() fails: a 500, an answer all the same
    s.signal(signal.SIGHUP)
    assert wait_for(lambda: s.worker_pids() and not set(s.worker_pids()) & set(before), timeout=30), \
        "no new workers after the reload"
    assert s.alive()
    assert request(s.port, b"GET /after HTTP/1.1\r\nHost: t\r\n\r\n").status in (200, 500)


def test_a_reload_whose_environment_cannot_be_passed_is_refused_and_the_workers_serve_on(servers, tmp_path):
    """Hostile review: an environment variable over 128 KiB (an ini's
    env = X=@(/etc/ssl/certs/ca-certificates.crt)) made the reload's check
    fail to start (E2BIG) and the exception ended the master. The reload
    is refused with a log line; the workers serve on."""
    conf = tmp_path / "big.conf.py"
    conf.write_text("raw_env = ['HUGE=' + 'a' * 200000]\n")
    s = ServerProc("apps:pid", "-c", str(conf), "--workers", "1", cwd=str(tmp_path))
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 1)
    before = s.worker_pids()
    s.signal(signal.SIGHUP)
    assert wait_for(lambda: "reload: cannot start the check of the new code" in s.log(), timeout=20), \
        s.log()[-2000:]
    time.sleep(0.3)
    assert s.alive() and s.worker_pids() == before
    assert request(s.port, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").status == 200
