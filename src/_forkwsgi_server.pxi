# Part of _forkwsgi.pyx, included there (one module, one namespace).

# ---- the settings the C core takes ------------------------------------------
#
# One table, by the names of the settings registry (python/forkwsgi/settings.py):
# where each value goes in fw_config and how it is stored. Nothing else maps
# a setting to the core.

# The access log's atoms (cserver/fw_alog.h), by the names accesslog.py uses.
ACCESS_LOG_ATOMS = {
    "text": FW_AL_TEXT, "remote_addr": FW_AL_REMOTE_ADDR, "remote_port": FW_AL_REMOTE_PORT,
    "user": FW_AL_USER, "time": FW_AL_TIME, "request": FW_AL_REQUEST, "method": FW_AL_METHOD,
    "path": FW_AL_PATH, "query": FW_AL_QUERY, "protocol": FW_AL_PROTOCOL, "status": FW_AL_STATUS,
    "bytes": FW_AL_BYTES, "seconds": FW_AL_SECONDS,
    "millis": FW_AL_MILLIS, "micros": FW_AL_MICROS, "decimal": FW_AL_DECIMAL, "pid": FW_AL_PID,
    "request_header": FW_AL_REQ_HEADER, "response_header": FW_AL_RESP_HEADER, "uri": FW_AL_URI,
}


cdef fw_alog *_access_log_new(object spec) except NULL:
    """spec: (fd, path or None, [(atom, bytes arg)], json, read by a Python
    thread). The log copies what it keeps; items and texts here live for
    this call only."""
    fd, path, items, json, _ = spec
    cdef Py_ssize_t n = len(items)
    cdef fw_alog_item *arr = <fw_alog_item *>PyMem_Malloc((n if n else 1) * sizeof(fw_alog_item))
    if arr == NULL:
        raise MemoryError()
    cdef fw_alog_cfg cfg
    memset(&cfg, 0, sizeof(cfg))
    keep = [bytes(arg) for _, arg in items]
    cdef bytes bpath = os.fsencode(path) if path is not None else None
    cdef fw_alog *a
    try:
        for i in range(n):
            arr[i].atom = <int>items[i][0]
            arr[i].arg = <const char *>keep[i]
            arr[i].arg_len = <size_t>len(keep[i])
        cfg.fd = <int>fd
        cfg.path = <const char *>bpath if bpath is not None else NULL
        cfg.items = arr
        cfg.nitems = <int>n
        cfg.json = 1 if json else 0
        a = fw_alog_new(&cfg)
        if a == NULL:
            raise OSError(errno, f"access log: {os.strerror(errno)}")
        return a
    finally:
        PyMem_Free(arr)


cdef enum Kind:
    K_SIZE = 0          # bytes, size_t
    K_U64 = 1           # a count or bytes, uint64_t
    K_INT = 2           # int
    K_MS = 3            # seconds (float) stored as int milliseconds
    K_NETS = 4          # addresses and networks (a list of text), a parsed fw_netlist the Server owns
    K_PROXY = 5         # PROXY protocol versions: "off", "v1", "v2", "auto" as an int mask
    K_US = 6            # seconds (float, at most 0.1) stored as int microseconds
    K_ONOFF = 7         # "on" or "off" as an int 1 or 0

cdef fw_config _layout

cdef Py_ssize_t _at(void *field):
    return <char *>field - <char *>&_layout

CORE_SETTINGS = {
    "limit_request_line": (K_SIZE, _at(&_layout.limits.max_line)),
    "limit_request_head": (K_SIZE, _at(&_layout.limits.max_head)),
    "limit_request_fields": (K_SIZE, _at(&_layout.limits.max_headers)),
    "limit_request_body": (K_U64, _at(&_layout.limits.max_body)),
    "header_timeout": (K_MS, _at(&_layout.header_timeout_ms)),
    "body_timeout": (K_MS, _at(&_layout.body_timeout_ms)),
    "body_min_rate": (K_INT, _at(&_layout.body_min_rate)),
    "keepalive": (K_MS, _at(&_layout.keepalive_timeout_ms)),
    "write_timeout": (K_MS, _at(&_layout.write_timeout_ms)),
    "graceful_timeout": (K_MS, _at(&_layout.graceful_timeout_ms)),
    "spool_threshold": (K_SIZE, _at(&_layout.spool_threshold)),
    "max_connections": (K_INT, _at(&_layout.max_connections)),
    "max_requests": (K_U64, _at(&_layout.max_requests)),
    "threads": (K_INT, _at(&_layout.threads)),
    "write_coalesce": (K_US, _at(&_layout.write_coalesce_us)),
    "inline_first": (K_ONOFF, _at(&_layout.inline_first)),
    "forwarded_allow_ips": (K_NETS, _at(&_layout.forwarded_allow)),
    "proxy_protocol": (K_PROXY, _at(&_layout.proxy_protocol)),
    "proxy_allow_ips": (K_NETS, _at(&_layout.proxy_allow)),
    "uwsgi_allow_ips": (K_NETS, _at(&_layout.uwsgi_allow)),
}

_PROXY_VERSIONS = {"off": 0, "v1": FW_PROXY_V1, "v2": FW_PROXY_V2, "auto": FW_PROXY_V1 | FW_PROXY_V2,
                   "detect": FW_PROXY_V1 | FW_PROXY_V2 | FW_PROXY_PLAIN}


cdef int _ms(double seconds):
    if seconds <= 0:
        return 0
    if seconds > 86400 * 365:
        seconds = 86400 * 365
    return <int>(seconds * 1000 + 0.5)


cdef int _store(fw_config *cfg, str name, object value) except -1:
    kind, off = CORE_SETTINGS[name]
    cdef char *field = <char *>cfg + <Py_ssize_t>off
    cdef fw_netlist *nets = NULL
    cdef int rc
    if kind == K_NETS:
        spec = ",".join(value).encode("ascii", "replace")
        rc = fw_netlist_parse(spec, &nets)
        if rc != 0:
            raise ValueError(f"{name}: not IP addresses or networks: {value!r}") if rc != -ENOMEM else MemoryError()
        fw_netlist_free((<fw_netlist **>field)[0])
        (<fw_netlist **>field)[0] = nets
        return 0
    if kind == K_PROXY:
        if value not in _PROXY_VERSIONS:
            raise ValueError(f"{name}: use off, v1, v2 or auto")
        (<int *>field)[0] = _PROXY_VERSIONS[value]
        return 0
    if kind == K_ONOFF:
        if value not in ("on", "off"):
            raise ValueError(f"{name}: use on or off")
        (<int *>field)[0] = value == "on"
        return 0
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    if kind == K_SIZE:
        (<size_t *>field)[0] = <size_t>value
    elif kind == K_U64:
        (<uint64_t *>field)[0] = <uint64_t>value
    elif kind == K_INT:
        if value > 0x7fffffff:
            raise ValueError(f"{name} is too large")
        (<int *>field)[0] = <int>value
    elif kind == K_US:
        (<int *>field)[0] = <int>(min(value, 0.1) * 1e6 + 0.5)
    else:
        (<int *>field)[0] = _ms(value)
    return 0


cdef int _int_list(object seq, int *out, Py_ssize_t n, str what) except -1:
    """A sequence of n fds (-1: none) into out."""
    items = list(seq)
    if len(items) != n:
        raise ValueError(f"{what}: need one entry per scoreboard slot")
    for i in range(n):
        v = items[i]
        out[i] = -1 if v < 0 or v > 0x7fffffff else <int>v
    return 0


cdef object _take_error():
    """The exception set by C code (a signal handler that raised), as an
    object to raise."""
    cdef PyObject *t = NULL
    cdef PyObject *v = NULL
    cdef PyObject *tb = NULL
    PyErr_Fetch(&t, &v, &tb)
    PyErr_NormalizeException(&t, &v, &tb)
    if v != NULL and tb != NULL:
        PyException_SetTraceback(v, tb)
    exc = <object>v if v != NULL else RuntimeError("unknown error")
    Py_XDECREF(t)
    Py_XDECREF(v)
    Py_XDECREF(tb)
    return exc


cdef class Server:
    """Server(app, fds, base_environ, listener_info, logger, *, status=None,
    balance=BALANCE_LEAST_BUSY, scoreboard=None, slot=0, kick_fds=None,
    pass_fds=None, pass_recv_fd=-1, release_listeners=False, accept_batch=-1,
    uwsgi=(), **settings): the C HTTP/1.1 server loop over listening sockets;
    those whose indexes are in `uwsgi` speak the uwsgi protocol instead.
    accept_batch: accepts per listener wake-up; -1 (or 0) keeps the core's
    default, 64 (fw_config_defaults).
    settings: the registry's names in CORE_SETTINGS, plus spool_dir and
    secure_scheme_headers (a dict, for the environ)."""

    cdef fw_glue g
    cdef fw_config cfg
    cdef Py_buffer scoreboard
    cdef int *balance_fds          # PyMem: nslots kick eventfds, then nslots hand-off send fds
    cdef char *spool_dir           # PyMem
    cdef fw_alog *access_log       # owned, NULL if none; freed after the server
    cdef Py_buffer stats_buf       # the master's shared counters of this worker, buf NULL if none
    cdef fw_scheme_header *scheme_headers   # PyMem, pointing into scheme_bytes
    cdef object app, logger, templates, scheme_bytes, thread_name

    def __cinit__(self):
        memset(&self.g, 0, sizeof(self.g))
        self.scoreboard.buf = NULL
        self.balance_fds = NULL
        self.spool_dir = NULL
        self.access_log = NULL
        self.stats_buf.buf = NULL
        self.scheme_headers = NULL

    def __init__(self, app, fds, dict base_environ, list listener_info, logger, *, status=None,
                 int balance=FW_BAL_LEAST_BUSY, scoreboard=None, int slot=0, kick_fds=None, pass_fds=None,
                 int pass_recv_fd=-1, bint release_listeners=False, int accept_batch=-1, access_log=None,
                 stats=None, str thread_name=None, uwsgi=(), **settings):
        if self.g.srv != NULL:
            raise RuntimeError("Server already initialised")
        fw_config_defaults(&self.cfg)
        cdef fw_config *cfg = &self.cfg
        spool_dir = settings.pop("spool_dir", None)
        self._scheme_setup(settings.pop("secure_scheme_headers", None) or {})
        self.g.forwarded_proto = 1 if settings.pop("forwarded_proto", False) else 0
        self._settings_setup(settings, balance, accept_batch, release_listeners)
        if scoreboard is not None:
            self._balance_setup(scoreboard, slot, kick_fds, pass_fds, pass_recv_fd)
        if status is not None:
            self._status_setup(status)
        cdef int ifds[64]
        cdef int n = self._listeners_setup(fds, listener_info, uwsgi, ifds)
        if spool_dir is not None:
            self._spool_setup(spool_dir)
        # The callbacks borrow these; this object keeps them alive. The
        # environ's templates, one per listener, have room for a request's
        # entries.
        self.templates = [fw_environ_template(base_environ, li) for li in listener_info]
        self.app, self.logger = app, logger
        self.g.app = <PyObject *>app
        self.g.logger = <PyObject *>logger
        self.g.templates = <PyObject *>self.templates
        # App threads are named after it ("forkwsgi worker 2 thread 1"), in
        # log records and tracebacks, instead of Python's "Dummy-N".
        self.thread_name = thread_name
        self.g.thread_name = <PyObject *>thread_name if thread_name is not None else NULL
        if stats is not None:
            self._stats_setup(stats)
        if access_log is not None:
            self.access_log = _access_log_new(access_log)
            cfg.access_log = self.access_log
            cfg.gil_each_write = 1 if access_log[4] else 0
        self.g.srv = fw_server_new(cfg, ifds, n, &fw_glue_ops, &self.g)
        if self.g.srv == NULL:
            raise OSError(errno, os.strerror(errno))

    cdef int _settings_setup(self, dict settings, int balance, int accept_batch, bint release_listeners) except -1:
        """The registry's settings (CORE_SETTINGS) and the loop's own into
        the core's config, checked."""
        cdef fw_config *cfg = &self.cfg
        for name, value in settings.items():
            if name not in CORE_SETTINGS:
                raise TypeError(f"Server: unknown setting {name!r}")
            _store(cfg, name, value)
        if cfg.threads < 1 or cfg.threads > 1024:
            raise ValueError("threads must be 1 to 1024")
        if balance < FW_BAL_SHARED or balance > FW_BAL_REUSEPORT:
            raise ValueError("unknown balance mode")
        if accept_batch > 0:
            cfg.accept_batch = accept_batch
        cfg.release_listeners = release_listeners
        cfg.balance.mode = balance
        cfg.balance.pass_recv_fd = -1
        if cfg.limits.max_head < cfg.limits.max_line:
            cfg.limits.max_line = cfg.limits.max_head      # the line is part of the head
        if cfg.limits.max_line < 64 or cfg.limits.max_headers < 1 or cfg.max_connections < 1:
            raise ValueError("invalid limits")
        return 0

    cdef int _status_setup(self, status) except -1:
        """A writable shared buffer of FW_STATUS_SIZE bytes per thread, 8-aligned."""
        PyObject_GetBuffer(status, &self.g.status, PyBUF_WRITABLE)
        if self.g.status.len < (fw_pool_max_threads(self.cfg.threads) if self.cfg.threads > 1 else 1) * FW_STATUS_SIZE \
                or (<uintptr_t>self.g.status.buf & 7):
            PyBuffer_Release(&self.g.status)
            self.g.status.buf = NULL
            raise ValueError("status must be a writable, 8-aligned buffer of 256 bytes per thread")
        return 0

    cdef int _listeners_setup(self, fds, list listener_info, uwsgi, int *ifds) except -1:
        """The listening fds into ifds (room for 64), checked against
        listener_info; those whose indexes are in `uwsgi` marked as speaking
        it. Returns how many."""
        fds = list(fds)
        cdef Py_ssize_t n = len(fds)
        if n < 1 or n > 64 or len(listener_info) != n:
            raise ValueError("need 1 to 64 listening fds and one listener_info entry each")
        for i in range(n):
            fd, li = fds[i], listener_info[i]
            if fd < 0 or fd > 0x7fffffff or not isinstance(li, tuple) or len(li) != 2:
                raise ValueError("bad fd or listener_info entry")
            ifds[i] = <int>fd
        for i in uwsgi:
            if not 0 <= i < n:
                raise ValueError("uwsgi: listener index out of range")
            self.cfg.uwsgi_listeners |= (<uint64_t>1) << <int>i
        return <int>n

    cdef int _spool_setup(self, spool_dir) except -1:
        """--spool-dir, a copy this object owns (PyMem)."""
        b = os.fsencode(spool_dir)
        self.spool_dir = <char *>PyMem_Malloc(len(b) + 1)
        if self.spool_dir == NULL:
            raise MemoryError()
        strcpy(self.spool_dir, b)
        self.cfg.spool_dir = self.spool_dir
        return 0

    cdef int _stats_setup(self, stats) except -1:
        """The master's shared counters of this worker: a writable shared
        buffer of FW_STATS_SIZE bytes, 8-aligned."""
        PyObject_GetBuffer(stats, &self.stats_buf, PyBUF_WRITABLE)
        if self.stats_buf.len < FW_STATS_SIZE or (<uintptr_t>self.stats_buf.buf & 7):
            PyBuffer_Release(&self.stats_buf)
            self.stats_buf.buf = NULL
            raise ValueError("stats must be a writable, 8-aligned buffer of STATS_SIZE bytes")
        self.cfg.stats = <fw_stats *>self.stats_buf.buf
        return 0

    cdef int _scheme_setup(self, dict headers) except -1:
        """secure_scheme_headers for the environ: names in lower case (the C
        side compares them case-insensitively), values exact."""
        self.scheme_bytes = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        cdef Py_ssize_t n = len(self.scheme_bytes)
        if n > 64:
            raise ValueError("secure_scheme_headers: 64 headers at most")
        self.scheme_headers = <fw_scheme_header *>PyMem_Malloc((n if n else 1) * sizeof(fw_scheme_header))
        if self.scheme_headers == NULL:
            raise MemoryError()
        cdef bytes name, value
        for i in range(n):
            name, value = self.scheme_bytes[i]
            self.scheme_headers[i].name = name
            self.scheme_headers[i].name_len = len(name)
            self.scheme_headers[i].value = value
            self.scheme_headers[i].value_len = len(value)
        self.g.scheme_headers = self.scheme_headers
        self.g.n_scheme_headers = <int>n
        return 0

    cdef int _balance_setup(self, scoreboard, int slot, kick_fds, pass_fds, int pass_recv_fd) except -1:
        """The shared scoreboard (writable, 64-aligned, one FW_SB_SLOT_SIZE slot
        per worker), this worker's slot, and the per-slot fds the master made."""
        PyObject_GetBuffer(scoreboard, &self.scoreboard, PyBUF_WRITABLE)
        cdef Py_ssize_t nslots = self.scoreboard.len // FW_SB_SLOT_SIZE
        if nslots < 1 or nslots > 4096 or (<uintptr_t>self.scoreboard.buf & (FW_SB_SLOT_SIZE - 1)) or \
                slot < 0 or slot >= nslots:
            raise ValueError("scoreboard must be a writable, 64-aligned buffer of SB_SLOT_SIZE bytes per "
                             "slot, and slot one of them")
        self.balance_fds = <int *>PyMem_Malloc(2 * nslots * sizeof(int))
        if self.balance_fds == NULL:
            raise MemoryError()
        for i in range(2 * nslots):
            self.balance_fds[i] = -1
        if kick_fds is not None:
            _int_list(kick_fds, self.balance_fds, nslots, "kick_fds")
        if pass_fds is not None:
            _int_list(pass_fds, self.balance_fds + nslots, nslots, "pass_fds")
        cdef fw_balance_cfg *bc = &self.cfg.balance
        bc.scoreboard = self.scoreboard.buf
        bc.nslots = <int>nslots
        bc.me = slot
        bc.kick_fds = self.balance_fds
        bc.pass_fds = self.balance_fds + nslots if pass_fds is not None else NULL
        bc.pass_recv_fd = pass_recv_fd
        return 0

    def start_threads(self):
        """start_threads(): start the app threads (threads > 1) now, not at
        serve(): a worker is ready only once it has them. OSError if they
        cannot start (the log says why)."""
        if self.g.srv == NULL:
            raise RuntimeError("Server not initialised")
        cdef int err
        with nogil:
            err = fw_server_start_threads(self.g.srv)       # 0 or -errno
        if err != 0:
            raise OSError(-err, f"cannot start the app threads: {os.strerror(-err)}")

    def serve(self, int signal_fd=-1):
        """serve(signal_fd=-1): run the loop until stop(), without the GIL;
        signal_fd is a signal.set_wakeup_fd() pipe whose readability makes
        the loop run signal handlers."""
        if self.g.srv == NULL:
            raise RuntimeError("Server not initialised")
        if self.g.serving:
            raise RuntimeError("Server is already serving")
        cdef int err = fw_server_watch_signals(self.g.srv, signal_fd)    # 0 or -errno
        if err != 0:
            raise OSError(-err, os.strerror(-err))
        self.g.serving = 1
        cdef int rc
        fw_logq_start(&self.g)          # -1: the lines are logged at once instead
        try:
            self.g.tstate = PyEval_SaveThread()
            rc = fw_server_run(self.g.srv)
            PyEval_RestoreThread(self.g.tstate)
            self.g.tstate = NULL
            if self.g.pending_exc != NULL:          # the app raised SystemExit & co
                exc = <object>self.g.pending_exc
                Py_XDECREF(self.g.pending_exc)
                self.g.pending_exc = NULL
                raise exc
            if rc == FW_RUN_SIGNAL and PyErr_Occurred() != NULL:   # a signal handler raised
                raise _take_error()
            if rc == FW_RUN_FAILED:
                raise OSError("the event loop failed (see the log)")
            if PyErr_Occurred() != NULL:
                PyErr_Clear()
        finally:
            self.g.serving = 0
            fw_environ_forget(&self.g)      # a kept environ holds the last request's values
            fw_logq_stop(&self.g)
            fw_server_watch_signals(self.g.srv, -1)

    def stop(self, bint graceful=True):
        """stop(graceful=True): ask the loop to stop; safe from any thread or
        a signal handler."""
        if self.g.srv != NULL:
            fw_server_stop(self.g.srv, graceful)

    def retire(self):
        """retire(): a graceful stop that hands idle connections to the
        workers that serve on (fw_server_retire); safe from any thread or a
        signal handler."""
        if self.g.srv != NULL:
            fw_server_retire(self.g.srv)

    def stats(self):
        """Counters of this server's loop and its scoreboard slot."""
        if self.g.srv == NULL:
            return None
        cdef fw_sb_view v
        fw_balance_view(&self.g.srv.bal, &v)
        out = {"connections": self.g.srv.nconns, "serving": bool(self.g.serving),
               "requests": self.g.srv.requests, "inflight": v.inflight, "accepted": v.accepted,
               "handed_in": v.handed_in, "handed_out": v.handed_out}
        cdef fw_alog_counts al
        if self.access_log != NULL:
            fw_alog_counts_read(self.access_log, &al)
            out.update(access_log_lines=al.lines, access_log_dropped=al.full + al.failed,
                       access_log_write_errors=al.write_errors)
        return out

    def close_access_log(self):
        """Write what the access log holds and end its thread (the loop has
        ended: a worker about to exit must not lose its last lines).
        Returns its counts: {responses, dropped, write_errors}, or None."""
        if self.g.serving:
            raise RuntimeError("the server is serving")
        if self.access_log == NULL:
            return None
        if self.g.srv != NULL:
            self.g.srv.cfg.access_log = NULL
        cdef fw_alog_counts al
        cdef fw_alog *a = self.access_log
        self.access_log = NULL
        # Joins the writer (or gives up on it after 2 s), without the GIL:
        # the writer may wait on a reader that needs it (accessrecords.py).
        with nogil:
            fw_alog_free(a, &al)
        return {"responses": al.lines + al.full, "dropped": al.full + al.failed,
                "write_errors": al.write_errors}

    def reopen_logs(self):
        """Reopen the access log file by its path (SIGUSR1, logrotate); the
        log's writer thread does it, so this never waits on the disk."""
        if self.access_log != NULL:
            fw_alog_reopen(self.access_log)

    def __dealloc__(self):
        if self.g.srv != NULL:
            fw_server_free(self.g.srv)
            self.g.srv = NULL
        fw_alog_free(self.access_log, NULL)      # writes what is queued
        self.access_log = NULL
        Py_XDECREF(self.g.pending_exc)
        self.g.pending_exc = NULL
        fw_environ_forget(&self.g)
        if self.g.status.buf != NULL:
            PyBuffer_Release(&self.g.status)
        if self.scoreboard.buf != NULL:
            PyBuffer_Release(&self.scoreboard)
        if self.stats_buf.buf != NULL:
            PyBuffer_Release(&self.stats_buf)
        PyMem_Free(self.balance_fds)
        PyMem_Free(self.spool_dir)
        PyMem_Free(self.scheme_headers)
        fw_netlist_free(<fw_netlist *>self.cfg.forwarded_allow)     # (K_NETS in CORE_SETTINGS)
        fw_netlist_free(<fw_netlist *>self.cfg.proxy_allow)
        fw_netlist_free(<fw_netlist *>self.cfg.uwsgi_allow)
