# Part of _forkwsgi.pyx, included there (one module, one namespace).

# ---- the master's side of the scoreboard --------------------------------------

cdef class _Scoreboard:
    """The scoreboard buffer and, optionally, the kick eventfds, for one call."""
    cdef Py_buffer buf
    cdef int nslots
    cdef int *kicks

    def __cinit__(self, scoreboard, kick_fds=None):
        self.buf.buf = NULL
        self.kicks = NULL
        PyObject_GetBuffer(scoreboard, &self.buf, PyBUF_WRITABLE)
        self.nslots = <int>(self.buf.len // FW_SB_SLOT_SIZE)
        if (<uintptr_t>self.buf.buf & (FW_SB_SLOT_SIZE - 1)) or self.nslots < 1:
            raise ValueError("bad scoreboard buffer")
        if kick_fds is not None:
            self.kicks = <int *>PyMem_Malloc(self.nslots * sizeof(int))
            if self.kicks == NULL:
                raise MemoryError()
            _int_list(kick_fds, self.kicks, self.nslots, "kick_fds")

    def __dealloc__(self):
        if self.buf.buf != NULL:
            PyBuffer_Release(&self.buf)
        PyMem_Free(self.kicks)


def sb_spawn(scoreboard, int slot, kick_fds, uint32_t image=0):
    """sb_spawn(scoreboard, slot, kick_fds, image=0): reset a slot for a new worker
    (before fork) that runs code `image` (a newer reload, a larger number)."""
    cdef _Scoreboard s = _Scoreboard(scoreboard, kick_fds)
    fw_sb_spawn(s.buf.buf, s.nslots, slot, s.kicks, image)


def sb_release(scoreboard, int slot, kick_fds):
    """sb_release(scoreboard, slot, kick_fds): free a dead worker's slot and kick the others."""
    cdef _Scoreboard s = _Scoreboard(scoreboard, kick_fds)
    fw_sb_release(s.buf.buf, s.nslots, slot, s.kicks)


def sb_retire(scoreboard, int slot, kick_fds=None):
    """sb_retire(scoreboard, slot, None): mark a worker as retiring while others serve
    on (it hands its idle connections to them), before the SIGTERM that retires it."""
    cdef _Scoreboard s = _Scoreboard(scoreboard)
    fw_sb_retire(s.buf.buf, s.nslots, slot)


def sb_end(scoreboard, int slot):
    """sb_end(scoreboard, slot): the whole server stops, before the SIGTERM
    that stops the worker: it closes its idle connections, even if retiring."""
    cdef _Scoreboard s = _Scoreboard(scoreboard)
    fw_sb_end(s.buf.buf, s.nslots, slot)


def sb_hold(scoreboard, int slot, bint on):
    """sb_hold(scoreboard, slot, on): ask a worker not to retire by itself
    (--max-requests) while on: the master could not replace it."""
    cdef _Scoreboard s = _Scoreboard(scoreboard)
    fw_sb_hold(s.buf.buf, s.nslots, slot, on)


_STATES = ("free", "alive", "draining")
_WHY = (None, "asked", "max_requests", "app_exit")      # fw_sb_why: why a slot drains


def sb_read(scoreboard):
    """sb_read(scoreboard) -> a dict per slot."""
    cdef _Scoreboard s = _Scoreboard(scoreboard)
    cdef fw_sb_view v
    out = []
    for i in range(s.nslots):
        fw_sb_view_of(s.buf.buf, s.nslots, i, &v)
        out.append({"state": _STATES[v.state] if v.state < 3 else "?", "pid": v.pid, "gen": v.gen,
                    "inflight": v.inflight, "armed": v.armed, "threads": v.threads, "open": v.open,
                    "retire": v.retire, "accepted": v.accepted, "handed_in": v.handed_in,
                    "handed_out": v.handed_out, "kicks_sent": v.kicks_sent, "arms": v.arms, "beat": v.beat,
                    "hold": v.hold, "image": v.image, "waiting": v.waiting,
                    "why": _WHY[v.why] if v.why < 4 else None})
    return out


# ---- the master's views of what workers share ------------------------------------

cdef class _Buffer:
    """A buffer (shared memory) held for one call."""
    cdef Py_buffer view

    def __cinit__(self, obj, bint writable=False):
        self.view.buf = NULL
        PyObject_GetBuffer(obj, &self.view, PyBUF_WRITABLE if writable else 0)

    def __dealloc__(self):
        if self.view.buf != NULL:
            PyBuffer_Release(&self.view)


def status_read(status, int slot, int threads, bint every=False):
    """What the app threads of the worker in `slot` are in, from the shared
    status entries (STATUS_SIZE bytes per app thread, `threads` per slot):
    [(thread, began_ns, request line)] for each thread inside the app; with
    every, [(thread, began_ns or 0, request line or None, calls)] for all."""
    cdef _Buffer b = _Buffer(status)
    cdef uint64_t began, calls
    cdef char line[FW_STATUS_SIZE]
    cdef Py_ssize_t off
    out = []
    for t in range(threads):
        off = (<Py_ssize_t>slot * threads + t) * FW_STATUS_SIZE
        if off < 0 or off + FW_STATUS_SIZE > b.view.len:
            raise ValueError("status: no such slot or thread")
        inside = fw_status_read(<char *>b.view.buf + off, &began, &calls, line, sizeof(line))
        if every:
            out.append((t, began if inside else 0, line.decode("latin-1") if inside else None, calls))
        elif inside:
            out.append((t, began, line.decode("latin-1")))
    return out


def stats_read(stats, Py_ssize_t offset):
    """One worker's counters (cserver/fw_stats.h) at `offset` in the shared
    stats: a dict of counts, with the duration histograms as lists of
    per-bucket counts (bounds: STATS_BOUNDS), and "codes": {status code:
    responses} of the codes 100..599 seen."""
    cdef _Buffer b = _Buffer(stats)
    cdef fw_stats_view v
    cdef int i
    if offset < 0 or offset + FW_STATS_SIZE > b.view.len or offset % 8:
        raise ValueError("stats: bad offset")
    fw_stats_read(<const fw_stats *>(<char *>b.view.buf + offset), &v)
    return {"requests": v.requests, "bytes_out": v.bytes_out, "status": [v.status[i] for i in range(6)],
            "total_us": v.total_us, "total_hist": [v.total_hist[i] for i in range(FW_STATS_NBUCKETS)],
            "conns_open": v.conns_open, "conns_idle": v.conns_idle, "app_calls": v.app_calls, "app_us": v.app_us,
            "app_hist": [v.app_hist[i] for i in range(FW_STATS_NBUCKETS)], "exceptions": v.exceptions,
            "codes": {FW_STATS_CODE_MIN + i: v.codes[i] for i in range(FW_STATS_CODES) if v.codes[i]}}


PRODUCER_NAMES = ("queued", "spilled", "dropped", "blocked_ns", "bytes")


def producer_counters(counters, Py_ssize_t offset):
    """One producer's offload counters (cserver/fw_offload.h), at `offset`
    in the shared counters: {queued, spilled, dropped, blocked_ns, bytes}."""
    cdef _Buffer b = _Buffer(counters)
    cdef fw_offload_totals t
    if offset < 0 or offset + 64 > b.view.len or offset % 8:
        raise ValueError("counters: bad offset")
    fw_offload_counters_read(<const fw_offload_counters *>(<char *>b.view.buf + offset), &t)
    return {"queued": t.queued, "spilled": t.spilled, "dropped": t.dropped, "blocked_ns": t.blocked_ns,
            "bytes": t.bytes}
