"""The master's observer sockets (--stats, --metrics): small servers that
answer from the master's memory without ever making it wait.

The master supervises in one thread: it reaps and respawns workers, ends
requests stuck past --timeout, honours signals and pings systemd's
watchdog. A client of these sockets must never hold it up: every socket
here is non-blocking, each client has a deadline from its accept to its
last byte (CLIENT_DEADLINE), at most MAX_CLIENTS are served at once (more
are closed as they come, said in the log now and then), and the master's
one select() watches these sockets with everything else (Arbiter.sleep).
A client that sends nothing, trickles its request or never reads the
answer costs a socket and a few kilobytes until its deadline.
"""
import errno
import logging
import select
import time

from . import binding

log = logging.getLogger("forkwsgi")

CLIENT_DEADLINE = 2.0          # seconds from accept to the last byte of the answer
MAX_CLIENTS = 64               # served at once, per socket
MAX_REQUEST = 8192             # bytes of a request head, at most
REFUSED_LOG_EVERY = 10.0       # seconds between log lines about refused clients


class Client:
    """One connection being served: what it sent, what is left to send."""

    __slots__ = ("sock", "request", "answer", "deadline")

    def __init__(self, sock, deadline):
        self.sock = sock
        self.request = b""
        self.answer = None         # bytes once known; sent as the socket takes them
        self.deadline = deadline


class Observer:
    """A listening socket whose clients each get one answer, then a close.

    Subclasses say whether a request comes first (wants_request) and what
    the answer is (answer_for)."""

    name = ""
    wants_request = True

    def __init__(self, addr, sock=None):
        self.addr = addr
        # Unauthenticated: a port given alone listens on loopback only.
        self.sock = sock if sock is not None else binding.create(addr, 64, any_host="127.0.0.1")
        self.sock.setblocking(False)
        self.clients = {}          # fd -> Client
        self.refused = 0
        self.refused_logged_at = 0.0

    def fileno(self):
        return self.sock.fileno()

    # ---- what the master's select() watches ----------------------------------

    def read_fds(self):
        return [self.sock.fileno()] + [fd for fd, c in self.clients.items() if c.answer is None]

    def write_fds(self):
        return [fd for fd, c in self.clients.items() if c.answer is not None]

    def next_deadline(self):
        return min((c.deadline for c in self.clients.values()), default=None)

    def owns(self, fd):
        return fd == self.sock.fileno() or fd in self.clients

    # ---- serving ---------------------------------------------------------------

    def ready(self, fd, master):
        """fd (the listener or a client) is readable or writable: serve it."""
        if fd == self.sock.fileno():
            self._accept(master)
            return
        c = self.clients.get(fd)
        if c is None:
            return
        try:
            if c.answer is None:
                self._read(c, master)
            if c.answer is not None:
                self._write(c)
        except OSError:
            self._drop(c)

    def expire(self, now):
        """Close the clients whose deadline passed."""
        for c in [c for c in self.clients.values() if c.deadline <= now]:
            self._drop(c)

    def _accept(self, master):
        for _ in range(MAX_CLIENTS):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._refused(f"{e.strerror}")
                else:
                    log.warning("%s server: %s", self.name, e)
                return
            if len(self.clients) >= MAX_CLIENTS:
                # The oldest goes, not the newcomer: clients that connect and
                # stay silent must not lock out a probe (/healthz) that asks
                # at once and is answered in the same pass.
                self._drop(min(self.clients.values(), key=lambda c: c.deadline))
                self._refused(f"{MAX_CLIENTS} clients already being served: the oldest was closed")
            conn.setblocking(False)
            c = Client(conn, time.monotonic() + CLIENT_DEADLINE)
            self.clients[conn.fileno()] = c
            try:
                if not self.wants_request:
                    c.answer = self.answer_for(b"", master)
                    self._write(c)
            except OSError:
                self._drop(c)

    def _read(self, c, master):
        while True:
            try:
                chunk = c.sock.recv(MAX_REQUEST)
            except (BlockingIOError, InterruptedError):
                return
            if not chunk:
                c.answer = self.answer_for(c.request, master) if c.request else b""
                return
            c.request += chunk
            if self.request_complete(c.request) or len(c.request) >= MAX_REQUEST:
                c.answer = self.answer_for(c.request[:MAX_REQUEST], master)
                return

    def _write(self, c):
        while c.answer:
            try:
                n = c.sock.send(c.answer)
            except (BlockingIOError, InterruptedError):
                return
            c.answer = c.answer[n:]
        self._drop(c)

    def _drop(self, c):
        self.clients.pop(c.sock.fileno(), None)
        try:
            c.sock.close()
        except OSError:
            pass

    def _refused(self, why):
        self.refused += 1
        now = time.monotonic()
        if now - self.refused_logged_at >= REFUSED_LOG_EVERY:
            self.refused_logged_at = now
            log.warning("%s server: refused a client (%s); %d refused so far", self.name, why, self.refused)

    # ---- what a subclass says ------------------------------------------------------

    def request_complete(self, request):
        """A question: has the whole request arrived?"""
        return True

    def answer_for(self, request, master):
        """The bytes to send back for request (b"" when none is read)."""
        raise NotImplementedError

    def announcement(self):
        """The start-up log line: what is served, and where."""
        raise NotImplementedError

    def close(self):
        for c in list(self.clients.values()):
            self._drop(c)
        self.sock.close()


def serve_for(observers, timeout, master, read_fds=(), write_fds=()):
    """One select() over the observers' sockets and the given fds, for up
    to timeout seconds (shortened to the nearest client deadline); serves
    what is ready among the observers' sockets and returns the other fds
    that are readable (or writable)."""
    rfds, wfds = list(read_fds), list(write_fds)
    deadline = None
    for obs in observers:
        rfds += obs.read_fds()
        wfds += obs.write_fds()
        d = obs.next_deadline()
        if d is not None and (deadline is None or d < deadline):
            deadline = d
    if deadline is not None:
        timeout = max(0.0, min(timeout, deadline - time.monotonic()))
    try:
        readable, writable = select_fds(rfds, wfds, timeout)
    except InterruptedError:
        return [], []
    others = _serve_ready(observers, set(readable) | set(writable), master)
    others_r = [fd for fd in others if fd in readable]
    others_w = [fd for fd in others if fd in writable]
    now = time.monotonic()
    for obs in observers:
        obs.expire(now)
    return others_r, others_w


def finish(observers, master, budget):
    """Before the master exec()s into a new image (a reload in place): the
    clients already accepted get their answers, for up to budget seconds
    (or until a stop signal), instead of a reset: a scrape that coincides
    with a reload must not fail. Nobody new is accepted meanwhile: they
    wait in the listening sockets' queues, which the new image inherits."""
    pending = sum(len(obs.clients) for obs in observers)
    if pending:
        log.debug("reload: answering %d --metrics/--stats client(s) before the exec", pending)
    end = time.monotonic() + budget
    while not master.stop_pending():
        rfds, wfds = [], []
        for obs in observers:
            rfds += [fd for fd, c in obs.clients.items() if c.answer is None]
            wfds += obs.write_fds()
        left = end - time.monotonic()
        if not (rfds or wfds) or left <= 0:
            return
        try:
            readable, writable = select_fds(rfds, wfds, min(left, 0.05))
        except InterruptedError:
            continue
        _serve_ready(observers, set(readable) | set(writable), master)


def _serve_ready(observers, fds, master):
    """Serve the observers' fds among fds; returns the others."""
    others = []
    for fd in fds:
        obs = next((o for o in observers if o.owns(fd)), None)
        if obs is not None:
            obs.ready(fd, master)
        else:
            others.append(fd)
    return others


def select_fds(rfds, wfds, timeout):
    """select() without its FD_SETSIZE limit (poll underneath)."""
    p = select.poll()
    for fd in rfds:
        p.register(fd, select.POLLIN)
    for fd in wfds:
        p.register(fd, select.POLLOUT | (select.POLLIN if fd in rfds else 0))
    readable, writable = [], []
    for fd, ev in p.poll(timeout * 1000):
        if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
            readable.append(fd)
        if ev & (select.POLLOUT | select.POLLHUP | select.POLLERR):
            writable.append(fd)
    return readable, writable

