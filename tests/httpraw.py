"""A small raw HTTP/1.1 client for tests: bytes in, parsed responses out.

Deliberately independent of the server's code: it reads what is on the
wire (status line, headers, a body framed by Content-Length, chunked or
close) so tests can check framing exactly.
"""
import fcntl
import os
import random
import signal
import socket
import struct
import termios
import time


class Response:
    def __init__(self, version, status, reason, headers, body, raw_head):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers          # list of (lower-case name, value)
        self.body = body
        self.raw_head = raw_head

    def header(self, name, default=None):
        name = name.lower()
        vals = [v for k, v in self.headers if k == name]
        return ", ".join(vals) if vals else default

    def __repr__(self):
        return f"<Response {self.status} {self.reason!r} {len(self.body)}B>"


class Closed(Exception):
    """The server closed the connection before a complete response."""


class Conn:
    """A client connection with a read buffer."""

    def __init__(self, port, host="127.0.0.1", timeout=10.0, family=socket.AF_INET, path=None, source=None):
        """source: the client's own address (e.g. 127.0.0.2: a peer that
        is not 127.0.0.1)."""
        if path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        else:
            self.sock = socket.create_connection((host, port), timeout=timeout,
                                                 source_address=(source, 0) if source else None)
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise Closed("connection closed")
        self.buf += chunk

    def _readline(self):
        while b"\r\n" not in self.buf:
            if len(self.buf) > 1 << 20:
                raise ValueError("response line too long")
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _readn(self, n):
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_response(self, method="GET"):
        """One response, including any 1xx before it when 'interim' is not wanted."""
        line = self._readline()
        parts = line.split(b" ", 2)
        version, status = parts[0].decode(), int(parts[1])
        reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        headers = []
        raw = [line]
        while True:
            h = self._readline()
            raw.append(h)
            if not h:
                break
            k, _, v = h.partition(b":")
            headers.append((k.decode("latin-1").lower(), v.strip().decode("latin-1")))
        r = Response(version, status, reason, headers, b"", b"\r\n".join(raw) + b"\r\n")
        if method == "HEAD" or status < 200 or status in (204, 304):
            return r
        te = r.header("transfer-encoding")
        cl = r.header("content-length")
        if te is not None:
            assert te.lower() == "chunked", te
            body = []
            while True:
                size = int(self._readline().split(b";")[0], 16)
                if size == 0:
                    while self._readline():
                        pass
                    break
                body.append(self._readn(size))
                assert self._readn(2) == b"\r\n"
            r.body = b"".join(body)
        elif cl is not None:
            r.body = self._readn(int(cl))
        else:
            r.body = self.read_until_close()
        return r

    def read_until_close(self, limit=None):
        try:
            while True:
                if limit is not None and len(self.buf) >= limit:
                    break
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    break
                self.buf += chunk
        except ConnectionResetError:
            pass
        data, self.buf = self.buf, b""
        return data

    def is_closed(self, timeout=5.0):
        """True if the server closes the connection within timeout (pending data ignored)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def non_readers(port, path, n):
    """n connections that ask for path and never read (a small receive
    buffer, so the server's writes stall at once)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        socks.append(s)
    return socks


def request(port, data, method="GET", timeout=10.0):
    """Send raw bytes on a new connection and read one response."""
    with Conn(port, timeout=timeout) as c:
        c.send(data)
        return c.read_response(method)


def serves_on_unix(path, timeout=5.0):
    """Question: does a GET on a new connection to the unix socket at path
    get a 200?"""
    try:
        with socket.socket(socket.AF_UNIX) as c:
            c.settimeout(timeout)
            c.connect(path)
            c.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            return c.recv(100).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def get_each_on_a_new_connection(port, n, path="/"):
    """n GET requests, each on its own connection; every answer must be a 200."""
    for _ in range(n):
        r = request(port, f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        assert r.status == 200, r


def in_app_header(path):
    """The header that makes a test app (apps.entered) create the file
    `path` once the request is in the app."""
    return f"X-Entered: {path}\r\n".encode()


def wait_in_app(path, timeout=20.0):
    """Wait until the request sent with in_app_header(path) is in the app
    (True), within a deadline generous for a busy machine."""
    return wait_for(lambda: os.path.exists(path), timeout)


def wait_for(pred, timeout=10.0, interval=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def unsanitized_env():
    """os.environ without the sanitizer setup of `make asan-ext` (when pytest
    runs under it), for programs that are not ours: the real uWSGI, make."""
    env = dict(os.environ)
    for var in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS"):
        env.pop(var, None)
    return env


def proc_stat(pid):
    """/proc/PID/stat's fields after "(comm)" (state, ppid, pgrp, ...), or
    None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_state(pid):
    """The process's state letter (R, S, T, Z, ...), or "gone"."""
    fields = proc_stat(pid)
    return fields[0] if fields else "gone"


def proc_gone(pid):
    """No such process, or a zombie: it has exited, its files, locks and
    mappings released; only its reaper has not collected it (a killed
    master's orphans go to PID 1, which in some containers collects them a
    second or two later)."""
    return proc_state(pid) in ("gone", "Z", "X")


def group_members(pgid):
    """Live processes of process group pgid, from /proc (not pgrep: under
    the ASan build's LD_PRELOAD pgrep hangs)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat(name)
            if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                out.append(int(name))
    return out


def stop_and_wait(pid, timeout=30):
    """SIGSTOP `pid` and wait until it is stopped. kill() returns with the
    SIGSTOP only queued: the process stops when it next runs, which under a
    CPU hog can take seconds (the offload sibling runs SCHED_IDLE).
    Meanwhile it runs on; and a signal with a lower number (SIGTERM) that
    comes before it stopped is taken first, handled, and never pending."""
    os.kill(pid, signal.SIGSTOP)

    assert wait_for(lambda: proc_state(pid) in ("T", "t"), timeout=timeout), f"pid {pid} did not stop in {timeout} s"


def established(port):
    """Connections to 127.0.0.1:port that the server holds open (its ends:
    ESTABLISHED with local port `port`), from /proc/net/tcp."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].split(":")[1], 16) == port:
                n += 1
    return n


def _tcp_lines():
    with open("/proc/net/tcp") as f:
        return [line.split() for line in f.readlines()[1:]]


def accept_queue(port):
    """Connections waiting in the accept queue of the LISTEN socket on
    127.0.0.1:port (its rx_queue in /proc/net/tcp)."""
    for fields in _tcp_lines():
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:
            return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"nothing listens on {port}")


def _server_end(sock):
    """/proc/net/tcp's fields of the server's end of the client socket
    `sock`, or None when there is none any more (reset, or closed and done)."""
    try:
        here, there = sock.getsockname()[1], sock.getpeername()[1]
    except OSError:                 # reset: the client's end is not connected any more
        return None
    for fields in _tcp_lines():
        if int(fields[1].split(":")[1], 16) == there and int(fields[2].split(":")[1], 16) == here:
            return fields
    return None


def server_unread(sock):
    """Bytes the client `sock` sent that the server has not read yet (the
    rx_queue of the server's end in /proc/net/tcp): 0 once its loop read
    them."""
    fields = _server_end(sock)
    if fields is None:
        raise AssertionError(f"no server end for the client socket {sock}")
    return int(fields[4].split(":")[1], 16)


def server_stalled(sock):
    """The server's end of the client socket `sock` holds bytes that the
    client's receive window does not admit: its zero-window probe timer
    runs (timer 4 in /proc/net/tcp). Its writes make no progress until
    the client reads."""
    fields = _server_end(sock)
    return fields is not None and fields[5].split(":")[0] == "04"


def server_gone(sock):
    """The server's end of the client socket `sock` is closed: gone, or
    no longer ESTABLISHED (it closed and waits for the client, its last
    bytes perhaps still queued)."""
    fields = _server_end(sock)
    return fields is None or fields[3] != "01"


def task_files(pid, name):
    """The text of /proc/PID/task/TID/`name` for each thread of process
    `pid` (a thread that ends meanwhile is left out); None if the process
    is gone."""
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return None
    out = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                out.append(f.read())
        except OSError:
            pass
    return out


def children(pid):
    """The PIDs of process `pid`'s children (zombies too), whichever of its
    threads started them; [] if it is gone."""
    return [int(p) for text in task_files(pid, "children") or () for p in text.split()]


def asleep(pid):
    """Every thread of process `pid` sleeps (state S: in epoll, on a lock,
    a timer or a socket): none runs or waits for a CPU, so the process has
    done all it can until something wakes it. False if it is gone."""
    stats = task_files(pid, "stat")
    return stats is not None and all(st.rsplit(")", 1)[1].split()[0] == "S" for st in stats)


def signal_pending(pid, sig):
    """`sig`, sent to process `pid`, is not taken yet by any of its threads
    (its bit in ShdPnd, /proc/PID/status). An ignored signal is never
    pending; a caught one is until a thread takes it; one whose default
    stops or ends the process, until it did. False if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("ShdPnd:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def bytes_waiting(sock):
    """Bytes in the socket's receive queue (FIONREAD): > 0 once the
    server's answer started to arrive."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def free_port():
    """A port on 127.0.0.1 nobody uses now, for a server to bind a moment
    later. Picked below the kernel's ephemeral range (32768 and up here;
    test_kafka's brokers take 20000-32000): the kernel's own pick for port
    0 is in that range, where the client sockets of the test file running
    beside (xdist) take their local ports, and one of them could take it
    before the server binds it (EADDRINUSE)."""
    for _ in range(200):
        port = random.randrange(10000, 20000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
