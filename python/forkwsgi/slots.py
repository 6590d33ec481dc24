"""What the master shares with its workers, one slot per worker process:

- a status entry per app thread (src/glue.h, FW_STATUS_SIZE): when its
  current call into the app began and the request line (--timeout, and the
  log line of a worker that died);
- a scoreboard entry (cserver/fw_balance.h): the worker's load, read by
  the others to place connections;
- a stats block (cserver/fw_stats.h): its counters (by status code too) and latency histograms,
  which the master folds into its totals when the worker ends (so the
  server's counters never go back, whatever the restarts);
- a kick eventfd (least-busy with threads) and a hand-off socket pair:
  connections passed to the slot's owner.

Everything is made before the first fork, so every worker inherits every
other worker's kick eventfd and hand-off socket. A slot outlives its
worker: connections handed to a worker that died before reading them are
taken back here and passed on (stranded hand-offs). The shared memory lives
in memfds, so a master that re-executes itself in place (reexec.py) maps
the same pages its running workers use (state() / WorkerSlots(inherited=)).
"""
import array
import logging
import mmap
import os
import socket
import time

from . import _forkwsgi

log = logging.getLogger("forkwsgi")

STATUS_SIZE = _forkwsgi.STATUS_SIZE
STATS_SIZE = _forkwsgi.STATS_SIZE
# How this build lays out the memory it shares with the workers: a master
# re-executing itself into a build with another layout would read the
# running workers' memory wrongly (reexec.py checks it before the exec).
LAYOUT = f"status {STATUS_SIZE}, stats {STATS_SIZE}, scoreboard {_forkwsgi.SB_SLOT_SIZE}"
# A connection stranded in a dead worker's hand-off queue waits at most this
# long in the master for a live worker to take it.
STRANDED_SECONDS = 10.0
FW_PASS_REQUEST = 2              # hand-off flag: counted in the target's "incoming"


def empty_totals():
    return {"requests": 0, "bytes_out": 0, "status": [0] * 6, "total_us": 0,
            "total_hist": [0] * len(_forkwsgi.STATS_BOUNDS), "conns_open": 0, "conns_idle": 0, "app_calls": 0,
            "app_us": 0,
            "app_hist": [0] * len(_forkwsgi.STATS_BOUNDS), "exceptions": 0, "codes": {}}


def add_counters(into, c):
    """into += c, field by field (lists element-wise, dicts key by key);
    the conns_ are gauges."""
    for k, v in c.items():
        if k.startswith("conns_"):
            continue
        if isinstance(v, list):
            into[k] = [a + b for a, b in zip(into[k], v)]
        elif isinstance(v, dict):
            merged = into.setdefault(k, {})
            for key, n in v.items():
                merged[key] = merged.get(key, 0) + n
        else:
            into[k] += v
    return into


def totals_from_state(got):
    """The totals a master wrote before it re-executed itself (JSON: the
    codes' keys came back as text; a master before codes had none)."""
    totals = empty_totals()
    totals.update(got or {})
    totals["codes"] = {int(k): v for k, v in totals["codes"].items()}
    return totals


def _shared_memory(name, size, fd=None):
    """(memfd, a MAP_SHARED mapping of it): a new one, or fd's (inherited)."""
    if fd is None:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size)


class WorkerSlots:
    def __init__(self, nslots, threads, counting, logger=log, inherited=None):
        """inherited: what state() gave the master before it re-executed
        itself; then nslots, threads and counting are taken from it."""
        got = inherited or {}
        self.nslots = nslots = got.get("nslots", nslots)
        self.threads = threads = got.get("threads", threads)
        self.log = logger
        # An entry per app thread, spares for parked threads included.
        self.entries = _forkwsgi.status_entries(threads)
        self.status_stride = STATUS_SIZE * self.entries
        self.status_fd, self.status = _shared_memory("forkwsgi-status", self.status_stride * nslots,
                                                     got.get("status_fd"))
        self.scoreboard_fd, self.scoreboard = _shared_memory(
            "forkwsgi-scoreboard", _forkwsgi.SB_SLOT_SIZE * nslots, got.get("scoreboard_fd"))
        self.stats_fd, self.stats = _shared_memory("forkwsgi-stats", STATS_SIZE * nslots, got.get("stats_fd"))
        # The counters of workers that ended, summed (counts and histograms).
        self.retired = totals_from_state(got.get("retired"))
        if inherited:
            self.kick_fds = list(got["kick_fds"])
            self.pass_recv = [socket.socket(fileno=fd) for fd in got["pass_recv"]]
            self.pass_send = [socket.socket(fileno=fd) for fd in got["pass_send"]]
            now = time.monotonic()
            self.stranded = [(bytes.fromhex(d), fd, now - age) for d, fd, age in got["stranded"]]
            return
        self.kick_fds = []
        if counting:
            self.kick_fds = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(nslots)]
        # Hand-off sockets, in every balance mode: a retiring worker passes
        # its idle connections to the others (and with counting, a
        # saturated worker passes requests arriving on idle connections).
        self.pass_recv, self.pass_send = [], []
        for _ in range(nslots):
            r, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.pass_recv.append(r)
            self.pass_send.append(w)
        self.stranded = []           # (datagram, fd, since): hand-offs no live worker took yet

    def state(self):
        """What a re-executed master needs to take these slots over (JSON),
        and the descriptors that must survive exec for it."""
        now = time.monotonic()
        state = {"nslots": self.nslots, "threads": self.threads, "status_fd": self.status_fd,
                 "scoreboard_fd": self.scoreboard_fd, "stats_fd": self.stats_fd, "retired": self.retired,
                 "kick_fds": list(self.kick_fds),
                 "pass_recv": [s.fileno() for s in self.pass_recv],
                 "pass_send": [s.fileno() for s in self.pass_send],
                 "stranded": [(d.hex(), fd, now - since) for d, fd, since in self.stranded]}
        fds = [self.status_fd, self.scoreboard_fd, self.stats_fd, *state["kick_fds"], *state["pass_recv"],
               *state["pass_send"], *(fd for _, fd, _ in self.stranded)]
        return state, fds

    # ---- a worker's life in its slot ------------------------------------------

    def free_slot(self, used):
        return next((i for i in range(self.nslots) if i not in used), None)

    def prepare(self, slot, image=0):
        """A new worker in `slot`, running code `image` (each reload's is
        newer): its status entries and its stats block (memoryviews the
        caller releases), and the balance options of its server."""
        lo, hi = slot * self.status_stride, (slot + 1) * self.status_stride
        self.status[lo:hi] = bytes(self.status_stride)
        s_lo = slot * STATS_SIZE
        self.stats[s_lo:s_lo + STATS_SIZE] = bytes(STATS_SIZE)
        _forkwsgi.sb_spawn(self.scoreboard, slot, self.kick_fds or None, image)
        balance = {"scoreboard": self.scoreboard, "slot": slot, "kick_fds": self.kick_fds or None,
                   "pass_fds": [s.fileno() for s in self.pass_send],
                   "pass_recv_fd": self.pass_recv[slot].fileno()}
        return memoryview(self.status)[lo:hi], memoryview(self.stats)[s_lo:s_lo + STATS_SIZE], balance

    def counters(self, slot):
        """The counters of the worker in `slot` (cserver/fw_stats.h)."""
        return _forkwsgi.stats_read(self.stats, slot * STATS_SIZE)

    def fold(self, slot):
        """The worker in `slot` ended: its counts go into the totals (before
        the slot is reused and zeroed)."""
        add_counters(self.retired, self.counters(slot))

    def keep_only(self, slot):
        """In the worker of `slot`: only the owner reads a slot's hand-offs."""
        for j, s in enumerate(self.pass_recv):
            if j != slot:
                s.close()
        for fd in (self.status_fd, self.scoreboard_fd, self.stats_fd):
            os.close(fd)                 # the mappings stay
        self._drop_stranded()

    def close_all(self):
        """In a child that is no worker (the offload sibling)."""
        for s in self.pass_recv + self.pass_send:
            s.close()
        for fd in (self.status_fd, self.scoreboard_fd, self.stats_fd):
            os.close(fd)
        self._drop_stranded()

    def _drop_stranded(self):
        """In a child: the master's copies of the stranded connections are
        the master's. Kept, they would outlive the close of the worker that
        serves the connection: the client would not see that close, and
        that worker's epoll set keeps the socket registered (a registration
        lasts while any process holds the socket) with a pointer to the
        connection it freed: its next event crashes the worker, resetting
        every request in it (a 502 behind nginx)."""
        for _, fd, _ in self.stranded:
            os.close(fd)
        self.stranded = []

    def retire(self, slot):
        """The master asks the worker to retire while others serve on: it
        hands its idle connections to them instead of closing them."""
        _forkwsgi.sb_retire(self.scoreboard, slot, None)

    def end(self, slot):
        """The master stops the whole server: the worker closes its idle
        connections instead of handing them on (it would otherwise take a
        SIGTERM that reached it alone for a retirement)."""
        _forkwsgi.sb_end(self.scoreboard, slot)

    def hold(self, slot, on):
        """Ask the worker in `slot` not to retire by itself (--max-requests)
        while on: the master cannot replace it now."""
        _forkwsgi.sb_hold(self.scoreboard, slot, on)

    def states(self):
        """Each slot's state: "free", "alive" or "draining" (stopping)."""
        return [s["state"] for s in _forkwsgi.sb_read(self.scoreboard)]

    def drain_reason(self, slot):
        """Why the worker in `slot` drains, as it says: "asked" (a stop
        signal, the master's or one from outside), "max_requests", "app_exit"
        (the app raised SystemExit), or None (not draining)."""
        return _forkwsgi.sb_read(self.scoreboard)[slot]["why"]

    def beats(self):
        """Each slot's last loop pass (CLOCK_MONOTONIC ms), 0 before the
        first; None for a worker whose loop has ended (stopping, retiring:
        it beats no more, and the graceful timeout bounds it)."""
        return [s["beat"] if s["state"] != "draining" else None for s in _forkwsgi.sb_read(self.scoreboard)]

    def serving(self, slot):
        """What the worker's app threads are in: [(thread, began_ns, request line)]."""
        return _forkwsgi.status_read(self.status, slot, self.entries)

    def thread_label(self, t):
        """What the log calls the thread of status entry t: "app thread K"
        (K from 1, as in the thread's name, "forkwsgi worker N thread K"),
        or the loop thread: the only one with --threads 1, the entry after
        the app threads with more (--inline-first: it runs quick requests)."""
        return "the loop thread" if self.threads == 1 or t == self.threads else f"app thread {t + 1}"

    def threads_of(self, slot):
        """Every app thread of the worker in `slot`: [(thread, began_ns or 0,
        request line or None, calls into the app)]; a spare thread (one that
        stood in for a parked one) only once it has run."""
        every = _forkwsgi.status_read(self.status, slot, self.entries, True)
        return [e for e in every if e[0] < self.threads or e[3]]

    # ---- when a worker ended --------------------------------------------------

    def release(self, slot):
        """The worker in `slot` ended: take it out of the scoreboard (a stale
        count would throttle the others), and take back connections handed
        to it that it never read (their requests are still unread in the
        sockets) to pass them on."""
        _forkwsgi.sb_release(self.scoreboard, slot, self.kick_fds or None)
        for _ in range(256):
            # recvmsg, not socket.recv_fds: before 3.12 it ignores its flags,
            # and a blocking read would hang here.
            try:
                # The datagram: listener index, flags and the client's record
                # (cserver/fw_balance.h: FW_PASS_MSG_MAX bytes at most).
                msg, anc, _, _ = self.pass_recv[slot].recvmsg(
                    64, socket.CMSG_SPACE(4 * array.array("i").itemsize), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self.log.warning("hand-off queue of slot %d: %s", slot, e)
                break
            fds = array.array("i")
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
            # Not counted in the new target's "incoming"; the rest (the
            # client a PROXY header named) travels as it came.
            fwd = bytes([msg[0], msg[1] & ~FW_PASS_REQUEST]) + msg[2:] if len(msg) >= 2 else (msg or b"\0")
            self.stranded += [(fwd, fd, time.monotonic()) for fd in fds]

    def pass_on_stranded(self, stopping):
        """Send the stranded connections to the least busy live worker. When
        none can take one (every worker retiring or starting, as under fast
        --max-requests recycling), it waits here, retried at each turn of
        the master's loop, rather than being closed with a request in it.
        stopping: close them."""
        left, moved, lost = [], 0, 0
        for fwd, fd, since in self.stranded:
            target = None if stopping else self.least_busy()
            try:
                if target is None:
                    if not stopping and time.monotonic() - since < STRANDED_SECONDS:
                        left.append((fwd, fd, since))
                        continue
                    raise OSError("no live worker")
                self.pass_send[target].sendmsg(
                    [fwd], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], socket.MSG_DONTWAIT)
                moved += 1
            except BlockingIOError:
                left.append((fwd, fd, since))
                continue
            except OSError:
                lost += 1
            os.close(fd)
        self.stranded = left
        if moved or lost:
            self.log.info("%d handed-off connection(s) passed on, %d closed, %d waiting for a worker",
                          moved, lost, len(left))

    def least_busy(self):
        alive = [(s["inflight"], i) for i, s in enumerate(_forkwsgi.sb_read(self.scoreboard))
                 if s["state"] == "alive" and s["open"] and not s["retire"]]
        return min(alive)[1] if alive else None
