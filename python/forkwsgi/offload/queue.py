"""The offload queue, the master's side (or an embedded server's): the
settings the sibling and producers share, the queue's socket pair, and
what is left in it when the server stops."""
import contextlib
import logging
import mmap
import os
import socket

from ..config import ConfigError
from .counters import counters_size, read_counters, sibling_counters
from .records import HDR
from .producer import producer_options
from .sinks import check_sink

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


def queued_record_max(cfg):
    """A buffer size that holds any record of the queue: a queued record is
    at most about the queue's size (larger ones are spilled by the producer)."""
    return min(cfg["offload_max_record"], cfg["offload_queue_bytes"] * 2) + HDR.size


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


def make_queue(cfg):
    """The queue: a SOCK_SEQPACKET pair (see cserver/fw_offload.h), (send, receive)."""
    os.makedirs(cfg["offload_spill_dir"], exist_ok=True)
    send, recv = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    want = cfg["offload_queue_bytes"]
    try:     # as root, past net.core.wmem_max
        send.setsockopt(socket.SOL_SOCKET, 32, want)      # SO_SNDBUFFORCE
    except OSError:
        send.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, want)
    return send, recv


def close_out(recv, cfg, counters, nslots, logger):
    """The server's last step once its sibling is gone: what is still queued
    goes to a spill file for the next start, and the totals go to the log."""
    try:
        rescue_queue(recv, cfg)
    except OSError as e:
        left = 0                              # the one being written, then the rest
        with contextlib.suppress(OSError):
            while recv.recv(1):
                left += 1
        logger.error("offload: could not move the records left in the queue to disk (%s): %d record(s) lost",
                     e.strerror or e, left + 1)
    totals = read_counters(counters, nslots)
    logger.info("offload totals: %s", ", ".join(f"{k} {v}" for part in totals.values() for k, v in part.items()))


def rescue_queue(recv, cfg):
    """After the last sibling is gone (the server stops): records still in
    the queue would die with it, so move them to a spill file of this
    process's, which the next start collects. Returns how many."""
    recv.setblocking(False)
    path = os.path.join(cfg["offload_spill_dir"], f"spill-{os.getpid()}.fwo")
    buf = bytearray(queued_record_max(cfg))
    n, fd = 0, None
    try:
        while True:
            try:
                got = recv.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            if not got:
                break
            if fd is None:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            view = memoryview(buf)[:got]
            while view:
                view = view[os.write(fd, view):]
            n += 1
        if fd is not None:
            os.fsync(fd)
    finally:
        if fd is not None:
            os.close(fd)
    if n:
        log.warning("offload: %d record(s) were still queued at exit: kept in %s for the next start", n, path)
    return n


class OffloadQueue:
    """What the serving process holds for offload its whole life (the
    master, or a server without one): the queue, both ends, so what is
    queued outlives any worker or sibling; and the shared counters (in a
    memfd when shared_fd, for a sibling that is spawned, not forked).
    Raises config.ConfigError for settings the sibling could not work with."""

    def __init__(self, cfg, nslots, shared_fd=False, inherited=None):
        """inherited: what state() gave a master before it re-executed
        itself (reexec.py): the same queue and counters, taken over."""
        self.cfg = sibling_config(cfg)
        check_config(self.cfg)
        self.nslots = nslots
        self.send = self.recv = self.counters = None
        self.counters_fd = -1
        try:
            size = counters_size(nslots)
            if inherited:
                self.send = socket.socket(fileno=inherited["send"])
                self.recv = socket.socket(fileno=inherited["recv"])
                self.counters_fd = inherited["counters_fd"]
            else:
                self.send, self.recv = make_queue(self.cfg)
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
        state = {"send": self.send.fileno(), "recv": self.recv.fileno(), "counters_fd": self.counters_fd}
        return state, list(state.values())

    def describe(self):
        return "Offload to {} (journal {}, overflow {})".format(
            self.cfg["offload_sink"], self.cfg["offload_dir"], self.cfg["offload_overflow"])

    def producer_options(self, slot):
        """producer.setup()'s arguments for the producer in counter slot `slot`."""
        return {"options": producer_options(self.cfg, self.send, self.counters, slot),
                "stats": (self.counters, self.nslots)}

    def sibling_counters(self):
        return sibling_counters(self.counters, self.nslots)

    def close_out(self, logger=log):
        """Once the last sibling is gone: what is still queued to a spill
        file, the totals to the log."""
        close_out(self.recv, self.cfg, self.counters, self.nslots, logger)

    def close(self):
        for sock in (self.send, self.recv):
            if sock is not None:
                sock.close()
        if self.counters is not None:
            self.counters.close()
        if self.counters_fd >= 0:
            os.close(self.counters_fd)
        self.send = self.recv = self.counters = None
        self.counters_fd = -1
