"""The offload queue, the master's side (or an embedded server's): the
settings the sibling and producers share, the hold on --offload-dir, and
the ring file (cserver/fw_ring.h) every worker writes and the sibling
reads."""
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import time

from .. import _forkwsgi
from ..config import ConfigError
from .counters import counters_size, read_counters, sibling_counters
from .producer import producer_options
from .sinks import check_sink, sink_file

log = logging.getLogger("forkwsgi")


def default_offload_dir():
    """Where the journal lives when --offload-dir is not given: the state
    directory systemd made for the service (StateDirectory=; the first one
    if several), else ./forkwsgi-offload."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(state, "offload") if state else "forkwsgi-offload"


def sibling_config(cfg):
    """The settings the sibling and the producers use, from the server's:
    absolute paths (the sibling may run elsewhere), the spill directory."""
    out = dict(cfg, offload_dir=os.path.abspath(cfg["offload_dir"] or default_offload_dir()))
    out["offload_spill_dir"] = os.path.join(out["offload_dir"], "spill")
    return out


def check_config(cfg):
    """Settings the sibling could not work with, as config.ConfigError (one
    line at start), plus a warning for a spill bound below the record size."""
    try:
        check_sink(cfg)
    except ValueError as e:
        raise ConfigError(f"--offload-sink: {e}") from None
    if cfg["offload_max_spill"] < cfg["offload_max_record"]:
        log.warning("offload: --offload-max-spill (%d) is below --offload-max-record (%d): records too large "
                    "for the queue and the spill file are dropped", cfg["offload_max_spill"],
                    cfg["offload_max_record"])


RING = "ring.fwr"
LOCK = "server.lock"
LOCK_WAIT = 3.0           # seconds a new server waits for the last one's master to be gone


def ring_path(cfg):
    return os.path.join(cfg["offload_dir"], RING)


def flock_within(fd, seconds, waiting):
    """flock(LOCK_EX) on fd, trying for up to `seconds`; waiting() is
    called once if it has to wait. True once held, False if still taken."""
    deadline = time.monotonic() + seconds
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            if not told:
                waiting()
                told = True
            time.sleep(0.05)


def _open_own(path):
    """Open or make one of the master's files in --offload-dir. Under
    --user the directory is the user's, who could have left a link (or a
    second name of some file of root's) there: neither is opened."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link: not forkwsgi's; remove it") from None
        raise
    if os.fstat(fd).st_nlink != 1:
        os.close(fd)
        raise ConfigError(f"{path} has more than one name (a hard link): not forkwsgi's; remove it")
    return fd


def open_elsewhere(fd):
    """Whether the file has another open description: a process of an
    earlier server that still reads or writes it (a sibling that drains, a
    worker that finishes its requests after its master was killed). The
    kernel grants a write lease only to the file's one opener (a mapping
    counts); where leases are not to be had (some network file systems),
    a sibling's reader lock is all that tells."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except BlockingIOError:
        return True
    except OSError:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return False


def lock_dir(directory, wait=LOCK_WAIT):
    """Hold --offload-dir for this server (flock on server.lock, which
    names the holder's pid): two servers on one directory would deliver
    each other's records twice. A server that just died may still be going
    away: wait up to `wait` seconds. Returns the lock's fd; ConfigError if
    another server holds it."""
    fd = _open_own(os.path.join(directory, LOCK))

    def holder():
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"

    if not flock_within(fd, wait, lambda: log.info("offload: %s is held by pid %s: waiting up to %.0f s for it "
                                                   "to end", directory, holder(), wait)):
        pid = holder()
        os.close(fd)
        raise ConfigError(f"--offload-dir {directory} is used by another forkwsgi server (pid {pid}): "
                          "give each server a directory of its own")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def open_ring(cfg):
    """The ring file (cserver/fw_ring.h), made or checked: its fd. A ring
    left by the last run (records not yet journaled) is kept as it is, its
    capacity with it; an empty one of another size that no process of an
    earlier server still has open is made anew. A damaged one is set aside
    (ring.fwr.damaged-TIME) and a new one made."""
    path = ring_path(cfg)
    want = cfg["offload_queue_bytes"]
    for _ in range(3):
        fd = _open_own(path)
        try:
            cap = _forkwsgi.ring_prepare(fd, want)
        except ValueError:
            os.close(fd)
            aside = f"{path}.damaged-{int(time.time())}"
            os.replace(path, aside)
            log.error("offload: %s is not a ring this version can read (damaged?): set aside as %s; records "
                      "in it are not delivered", path, aside)
            continue
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                if os.path.getsize(path) == 0:
                    os.unlink(path)
            raise ConfigError(f"--offload-dir {cfg['offload_dir']}: cannot make the offload ring of {want} bytes "
                              f"({e.strerror or e}): free some space, or set a smaller --offload-queue-bytes") from None
        used, _ = _forkwsgi.ring_usage(fd)
        if cap != _forkwsgi.ring_capacity(want):
            # Made anew only if no one else has it: a sibling of the last
            # server that still drains it would go on with the journal
            # beside ours (ours would lock the new file), and what its
            # workers still write would go to a file no one reads.
            if not used and not open_elsewhere(fd):
                os.close(fd)
                os.unlink(path)             # empty: made anew at the size asked for
                continue
            why = (f"holds {used} bytes of records from the last run" if used else
                   "is still open in a process of the last server (a sibling that drains, a worker that finishes "
                   "its requests)")
            log.warning("offload: the ring in %s %s: it keeps its size (%d bytes); --offload-queue-bytes applies "
                        "at a start that finds it empty and unused", path, why, cap)
        return fd
    raise ConfigError(f"--offload-dir {cfg['offload_dir']}: cannot make the offload ring")


def close_out(counters, nslots, ring_fd, path, logger):
    """The server's last step once its sibling is gone: the totals to the
    log. What is left in the ring stays there for the next start."""
    used, _ = _forkwsgi.ring_usage(ring_fd)
    if used:
        logger.warning("offload: %d bytes of records still queued at exit: kept in the ring %s for the next start",
                       used, path)
    totals = read_counters(counters, nslots)
    logger.info("offload totals: %s", ", ".join(f"{k} {v}" for part in totals.values() for k, v in part.items()))


class OffloadQueue:
    """What the serving process holds for offload its whole life (the
    master, or a server without one): the hold on --offload-dir, the ring
    file (whose records outlive every process), and the shared counters (in
    a memfd when shared_fd, for a sibling that is spawned, not forked).
    Raises config.ConfigError for settings the sibling could not work with,
    a directory another server holds, or a ring that cannot be made."""

    def __init__(self, cfg, nslots, shared_fd=False, inherited=None, owner=None):
        """inherited: what state() gave a master before it re-executed
        itself (reexec.py): the same lock, ring and counters, taken over.
        owner: --user/--group (process.Owner), whose workers spill and
        whose sibling journals here: --offload-dir and the jsonl sink's
        file are given to it; the lock stays the master's."""
        self.cfg = sibling_config(cfg)
        check_config(self.cfg)
        self.nslots = nslots
        self.counters = None
        self.counters_fd = self.ring_fd = self.lock_fd = -1
        try:
            size = counters_size(nslots)
            if inherited:
                self.lock_fd, self.ring_fd = inherited["lock_fd"], inherited["ring_fd"]
                self.counters_fd = inherited["counters_fd"]
            else:
                os.makedirs(self.cfg["offload_spill_dir"], exist_ok=True)
                self.lock_fd = lock_dir(self.cfg["offload_dir"])
                self.ring_fd = open_ring(self.cfg)
                if owner:
                    owner.give_tree(self.cfg["offload_dir"], keep={LOCK})
                    owner.give(sink_file(self.cfg["offload_sink"]))      # check_config made it
                if shared_fd:
                    self.counters_fd = os.memfd_create("forkwsgi-offload-counters", os.MFD_CLOEXEC)
                    os.ftruncate(self.counters_fd, size)
            self.counters = mmap.mmap(self.counters_fd, size)
        except BaseException:
            self.close()
            raise

    def state(self):
        """(JSON state, descriptors to keep across exec) for a re-executed
        master; needs the counters in a memfd (shared_fd)."""
        state = {"lock_fd": self.lock_fd, "ring_fd": self.ring_fd, "counters_fd": self.counters_fd}
        return state, list(state.values())

    def describe(self):
        _, cap = _forkwsgi.ring_usage(self.ring_fd)
        return "Offload to {} (ring {} of {} KiB, journal {}, overflow {})".format(
            self.cfg["offload_sink"], ring_path(self.cfg), cap >> 10, self.cfg["offload_dir"],
            self.cfg["offload_overflow"])

    def usage(self):
        """(bytes of records in the ring, its capacity)."""
        return _forkwsgi.ring_usage(self.ring_fd)

    def producer_options(self, slot):
        """producer.setup()'s arguments for the producer in counter slot `slot`."""
        return {"options": producer_options(self.cfg, self.ring_fd, self.counters, slot),
                "stats": (self.counters, self.nslots)}

    def sibling_counters(self):
        return sibling_counters(self.counters, self.nslots)

    def close_in_child(self):
        """In a forked worker or sibling: let go of the hold on the
        directory (it is the master's: a new server may start as soon as the
        master is gone, while old workers still finish)."""
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def close_out(self, logger=log):
        """Once the last sibling is gone: the totals to the log."""
        close_out(self.counters, self.nslots, self.ring_fd, ring_path(self.cfg), logger)

    def close(self):
        if self.counters is not None:
            self.counters.close()
        for fd in (self.counters_fd, self.ring_fd, self.lock_fd):
            if fd >= 0:
                os.close(fd)
        self.counters = None
        self.counters_fd = self.ring_fd = self.lock_fd = -1
