"""The producer's side of offload, in a worker (or an embedded server):
the C producer's options, and the log line of each drop."""
import errno
import logging
import os
import time

from .. import _forkwsgi
from .counters import COUNTER_BLOCK, attach

log = logging.getLogger("forkwsgi")


def producer_options(cfg, ring_fd, counters, slot):
    """Keyword arguments of _forkwsgi.offload_setup for the producer in slot."""
    return {"ring_fd": ring_fd,
            "overflow": {"block": 0, "drop": 1, "spill": 2}[cfg["offload_overflow"]],
            "block_ms": int(cfg["offload_block_timeout"] * 1000),
            "max_record": cfg["offload_max_record"], "spill_dir": cfg["offload_spill_dir"],
            "spill_max": cfg["offload_max_spill"],
            "counters": memoryview(counters)[slot * COUNTER_BLOCK:(slot + 1) * COUNTER_BLOCK]}


def setup(options, stats):
    """This process's producer: forkwsgi.offload() from any thread. options:
    producer_options(); stats: (counters, nslots) for offload_stats()."""
    _forkwsgi.offload_setup(on_drop=on_drop, **options)
    attach(*stats)


def teardown():
    """Forget this process's producer: waits for offload() calls in
    progress; later ones raise."""
    _forkwsgi.offload_teardown()
    attach(None, 0)


_drops = {"last": 0.0, "count": 0}


def on_drop(topic, err=errno.EAGAIN):
    """Called by the C producer for every record the overflow policy drops,
    with the reason (an errno): counted there; logged here, at most once a
    second with the count."""
    _drops["count"] += 1
    now = time.monotonic()
    if now - _drops["last"] >= 1.0:
        if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
            why = "no room in the queue (--offload-overflow)"
        elif err == errno.EFBIG:
            why = "the spill file is full (--offload-max-spill)"
        else:
            why = f"the spill file cannot be written ({os.strerror(err)})"
        log.warning("offload: dropped %d record(s) (topic %r last): %s", _drops["count"], topic, why)
        _drops["last"], _drops["count"] = now, 0
