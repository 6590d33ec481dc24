"""Offload counters in shared memory.

Shared memory made by the master: one 64-byte block per worker slot (the
producer counters of cserver/fw_offload.h, written by that worker), then
SIB_BLOCKS blocks for the sibling (SIB, written by the sibling). stats()
reads them in any process that attach()ed them: forkwsgi.offload_stats()."""
import struct
import time

from .. import _forkwsgi

COUNTER_BLOCK = 64
SIB = struct.Struct("<QQQQQQQdQQQ")
SIB_NAMES = ("delivered", "retried", "in_flight", "journaled", "pending", "batches", "sink_errors",
             "oldest_ts", "rejected", "dequeued", "disk_errors")
# What a new sibling carries on from its predecessor (the rest describes now).
SIB_CUMULATIVE = ("delivered", "retried", "journaled", "batches", "sink_errors", "rejected", "dequeued",
                  "disk_errors")
SIB_BLOCKS = 2                           # the sibling's counters take two blocks


# In a worker: the shared counters, for stats() (set by attach()).
_shared = None


def counters_size(nslots):
    return COUNTER_BLOCK * (nslots + SIB_BLOCKS)


def sibling_counters(buf, nslots):
    """The sibling's part of the shared counters."""
    return memoryview(buf)[nslots * COUNTER_BLOCK:(nslots + SIB_BLOCKS) * COUNTER_BLOCK]


def read_counters(buf, nslots):
    """{"workers": producer counters summed over every slot ever used,
    "sibling": the sibling's}, from the shared counters."""
    workers = dict.fromkeys(_forkwsgi.PRODUCER_NAMES, 0)
    for i in range(nslots):
        for name, v in _forkwsgi.producer_counters(buf, i * COUNTER_BLOCK).items():
            workers[name] += v
    sib = dict(zip(SIB_NAMES, SIB.unpack_from(buf, nslots * COUNTER_BLOCK)))
    oldest = sib.pop("oldest_ts")
    sib["oldest_age"] = round(max(0.0, time.time() - oldest), 3) if oldest else 0.0
    # Records handed to the queue and not yet taken off it by a sibling.
    sib["queue_depth"] = max(0, workers["queued"] - sib.pop("dequeued"))
    return {"workers": workers, "sibling": sib}


def attach(buf, nslots):
    """Make stats() read `buf` (None: offload is off in this process)."""
    global _shared
    _shared = (buf, nslots) if buf is not None else None


def stats():
    """The offload counters of the whole server (every worker's and the
    sibling's), or None when offload is not enabled in this process:
    workers: queued, spilled, dropped, blocked_ns, bytes;
    sibling: delivered, retried, in_flight, journaled, pending (held by the
    sibling), queue_depth (records in the queue), batches, sink_errors,
    rejected (refused for good by the sink: kept in rejected.fwo),
    disk_errors (writes to --offload-dir that failed: a full disk, EIO),
    oldest_age (seconds the oldest record the sibling holds has waited).
    The sibling's totals carry on across its restarts."""
    if _shared is None:
        return None
    return read_counters(*_shared)
