# cython: language_level=3, boundscheck=False, wraparound=False
"""forkwsgi._forkwsgi: the extension's Python-facing objects.

The Server type over the C core's fw_server (cserver/fw_server.h), the one
table that turns the settings registry's values into an fw_config, the
scoreboard views for the master, and the module's set-up. The per-request
path (environ, start_response, wsgi.input, file_wrapper, the request
driver, offload()) stays in C under src/: it runs for every request, and
there C is what measures fastest.
"""
import os

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.errno cimport ENOMEM, errno
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memset, strcpy, strlen


cdef extern from "Python.h":
    ctypedef struct PyThreadState
    PyThreadState *PyEval_SaveThread()
    void PyEval_RestoreThread(PyThreadState *)
    PyObject *PyErr_Occurred()
    void PyErr_Clear()
    void PyErr_Fetch(PyObject **, PyObject **, PyObject **)
    void PyErr_NormalizeException(PyObject **, PyObject **, PyObject **)
    int PyException_SetTraceback(PyObject *, PyObject *)
    ctypedef struct PyMethodDef:
        const char *ml_name
    int PyModule_AddFunctions(object, PyMethodDef *) except -1
    int PyType_Ready(PyTypeObject *) except -1
    const char *PyUnicode_AsUTF8(object) except NULL


cdef extern from "glue.h":
    ctypedef struct fw_http_limits:
        size_t max_line
        size_t max_head
        size_t max_headers
        uint64_t max_body

    ctypedef struct fw_balance_cfg:
        int mode
        void *scoreboard
        int nslots
        int me
        const int *kick_fds
        const int *pass_fds
        int pass_recv_fd
        int backstop_ms

    ctypedef struct fw_alog:
        pass

    ctypedef struct fw_alog_item:
        int atom
        const char *arg
        size_t arg_len

    ctypedef struct fw_alog_cfg:
        int fd
        const char *path
        const fw_alog_item *items
        int nitems
        int json
        size_t buffer_bytes
        int flush_ms

    ctypedef struct fw_alog_counts:
        uint64_t lines, full, failed, write_errors

    enum fw_alog_atom:
        FW_AL_TEXT, FW_AL_REMOTE_ADDR, FW_AL_REMOTE_PORT, FW_AL_USER, FW_AL_TIME, FW_AL_REQUEST
        FW_AL_METHOD, FW_AL_PATH, FW_AL_QUERY, FW_AL_PROTOCOL, FW_AL_STATUS, FW_AL_BYTES
        FW_AL_SECONDS, FW_AL_MILLIS, FW_AL_MICROS, FW_AL_DECIMAL, FW_AL_PID
        FW_AL_REQ_HEADER, FW_AL_RESP_HEADER, FW_AL_URI

    fw_alog *fw_alog_new(const fw_alog_cfg *cfg)
    void fw_alog_free(fw_alog *a, fw_alog_counts *final) nogil
    void fw_alog_reopen(fw_alog *a)
    void fw_alog_counts_read(const fw_alog *a, fw_alog_counts *out)

    ctypedef struct fw_stats:
        pass

    enum:
        FW_STATS_NBUCKETS
        FW_STATS_SIZE
        FW_STATS_CODE_MIN
        FW_STATS_CODES

    ctypedef struct fw_stats_view:
        uint64_t requests, bytes_out, total_us, conns_open, conns_idle, app_calls, app_us, exceptions
        uint64_t status[6]
        uint64_t total_hist[18]
        uint64_t app_hist[18]
        uint64_t codes[500]

    void fw_stats_read(const fw_stats *s, fw_stats_view *out)
    uint64_t fw_stats_bound_us(int i)
    ctypedef struct fw_netlist:
        pass

    ctypedef struct fw_scheme_header:
        const char *name
        size_t name_len
        const char *value
        size_t value_len

    ctypedef struct fw_config:
        fw_http_limits limits
        int header_timeout_ms
        int body_timeout_ms
        int body_min_rate
        int keepalive_timeout_ms
        int write_timeout_ms
        int graceful_timeout_ms
        size_t spool_threshold
        const char *spool_dir
        int max_connections
        int accept_batch
        uint64_t max_requests
        int threads
        int release_listeners
        fw_balance_cfg balance
        fw_alog *access_log
        fw_stats *stats
        const fw_netlist *forwarded_allow
        int proxy_protocol
        const fw_netlist *proxy_allow
        uint64_t uwsgi_listeners
        const fw_netlist *uwsgi_allow

    ctypedef struct fw_balance:
        pass

    ctypedef struct fw_server:
        fw_config cfg
        int nconns
        uint64_t requests
        fw_balance bal

    ctypedef struct fw_app_ops:
        pass

    ctypedef struct fw_sb_view:
        uint32_t state, inflight, incoming, pending, armed, open, retire, threads, gen, hold, image, waiting
        int32_t pid
        int64_t beat
        uint64_t accepted, handed_in, handed_out, kicks_sent

    ctypedef struct fw_glue:
        fw_server *srv
        PyObject *thread_name
        PyObject *app
        PyObject *logger
        PyObject *templates
        PyObject *pending_exc
        const fw_scheme_header *scheme_headers
        int n_scheme_headers
        Py_buffer status
        PyThreadState *tstate
        int gil_kept
        int serving

    enum:
        FW_SB_SLOT_SIZE
        FW_STATUS_SIZE
        FW_BAL_SHARED
        FW_BAL_LEAST_BUSY
        FW_BAL_REUSEPORT
        FW_PROXY_V1
        FW_PROXY_V2

    object fw_environ_template(object base, object info)
    int fw_netlist_parse(const char *spec, fw_netlist **out)
    void fw_netlist_free(fw_netlist *l)
    const fw_app_ops fw_glue_ops
    PyMethodDef fw_offload_methods[]
    PyTypeObject StartResponse_Type
    PyTypeObject Writer_Type
    PyTypeObject Input_Type
    PyTypeObject FileWrapper_Type

    void fw_config_defaults(fw_config *cfg)
    fw_server *fw_server_new(const fw_config *cfg, const int *fds, int nfds, const fw_app_ops *ops, void *app)
    void fw_server_free(fw_server *srv)
    int fw_server_run(fw_server *srv)
    int fw_logq_start(fw_glue *s)
    int fw_pool_max_threads(int nthreads)
    void fw_logq_stop(fw_glue *s)
    void fw_server_stop(fw_server *srv, int graceful)
    int fw_server_watch_signals(fw_server *srv, int fd)
    void fw_balance_view(const fw_balance *b, fw_sb_view *out)
    int fw_sb_view_of(const void *scoreboard, int nslots, int i, fw_sb_view *out)
    void fw_sb_spawn(void *scoreboard, int nslots, int i, const int *kick_fds, uint32_t image)
    void fw_sb_retire(void *scoreboard, int nslots, int i)
    void fw_sb_hold(void *scoreboard, int nslots, int i, int on)
    void fw_sb_release(void *scoreboard, int nslots, int i, const int *kick_fds)
    ctypedef struct fw_offload_counters:
        pass
    ctypedef struct fw_offload_totals:
        uint64_t queued, spilled, dropped, blocked_ns, bytes
    void fw_offload_counters_read(const fw_offload_counters *c, fw_offload_totals *out)
    int fw_status_read(const void *entry, uint64_t *began, uint64_t *calls, char *line, size_t cap)
    int fw_environ_init() except -1
    int fw_request_init() except -1


SB_SLOT_SIZE = FW_SB_SLOT_SIZE
STATS_SIZE = FW_STATS_SIZE
# The histograms' bucket bounds in seconds, the last one open (cserver/fw_stats.h).
STATS_BOUNDS = tuple(fw_stats_bound_us(i) / 1e6 for i in range(FW_STATS_NBUCKETS - 1)) + (float("inf"),)
STATUS_SIZE = FW_STATUS_SIZE


def status_entries(int threads):
    """status_entries(threads): status entries a worker of `threads` app
    threads needs: its threads, and the spares that stand in for parked
    ones (cserver/fw_pool.h)."""
    return fw_pool_max_threads(threads) if threads > 1 else 1
BALANCE_SHARED = FW_BAL_SHARED
BALANCE_LEAST_BUSY = FW_BAL_LEAST_BUSY
BALANCE_REUSEPORT = FW_BAL_REUSEPORT


# ---- the settings the C core takes ------------------------------------------
#
# One table, by the names of the settings registry (python/forkwsgi/config.py):
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
    """spec: (fd, path or None, [(atom, bytes arg)], json). The log copies
    what it keeps; items and texts here live for this call only."""
    fd, path, items, json = spec
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
    "forwarded_allow_ips": (K_NETS, _at(&_layout.forwarded_allow)),
    "proxy_protocol": (K_PROXY, _at(&_layout.proxy_protocol)),
    "proxy_allow_ips": (K_NETS, _at(&_layout.proxy_allow)),
    "uwsgi_allow_ips": (K_NETS, _at(&_layout.uwsgi_allow)),
}

_PROXY_VERSIONS = {"off": 0, "v1": FW_PROXY_V1, "v2": FW_PROXY_V2, "auto": FW_PROXY_V1 | FW_PROXY_V2}


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
        if scoreboard is not None:
            self._balance_setup(scoreboard, slot, kick_fds, pass_fds, pass_recv_fd)
        if cfg.limits.max_head < cfg.limits.max_line:
            cfg.limits.max_line = cfg.limits.max_head      # the line is part of the head
        if cfg.limits.max_line < 64 or cfg.limits.max_headers < 1 or cfg.max_connections < 1:
            raise ValueError("invalid limits")
        if status is not None:
            # A writable shared buffer of FW_STATUS_SIZE bytes per thread, 8-aligned.
            PyObject_GetBuffer(status, &self.g.status, PyBUF_WRITABLE)
            if self.g.status.len < (fw_pool_max_threads(cfg.threads) if cfg.threads > 1 else 1) * FW_STATUS_SIZE \
                    or (<uintptr_t>self.g.status.buf & 7):
                PyBuffer_Release(&self.g.status)
                self.g.status.buf = NULL
                raise ValueError("status must be a writable, 8-aligned buffer of 256 bytes per thread")
        fds = list(fds)
        cdef Py_ssize_t n = len(fds)
        if n < 1 or n > 64 or len(listener_info) != n:
            raise ValueError("need 1 to 64 listening fds and one listener_info entry each")
        cdef int ifds[64]
        for i in range(n):
            fd, li = fds[i], listener_info[i]
            if fd < 0 or fd > 0x7fffffff or not isinstance(li, tuple) or len(li) != 2:
                raise ValueError("bad fd or listener_info entry")
            ifds[i] = <int>fd
        for i in uwsgi:
            if not 0 <= i < n:
                raise ValueError("uwsgi: listener index out of range")
            cfg.uwsgi_listeners |= (<uint64_t>1) << <int>i
        if spool_dir is not None:
            b = os.fsencode(spool_dir)
            self.spool_dir = <char *>PyMem_Malloc(len(b) + 1)
            if self.spool_dir == NULL:
                raise MemoryError()
            strcpy(self.spool_dir, b)
            cfg.spool_dir = self.spool_dir
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
            # A writable shared buffer of FW_STATS_SIZE bytes, 8-aligned.
            PyObject_GetBuffer(stats, &self.stats_buf, PyBUF_WRITABLE)
            if self.stats_buf.len < FW_STATS_SIZE or (<uintptr_t>self.stats_buf.buf & 7):
                PyBuffer_Release(&self.stats_buf)
                self.stats_buf.buf = NULL
                raise ValueError("stats must be a writable, 8-aligned buffer of STATS_SIZE bytes")
            cfg.stats = <fw_stats *>self.stats_buf.buf
        if access_log is not None:
            self.access_log = _access_log_new(access_log)
            cfg.access_log = self.access_log
        self.g.srv = fw_server_new(cfg, ifds, <int>n, &fw_glue_ops, &self.g)
        if self.g.srv == NULL:
            raise OSError(errno, os.strerror(errno))

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

    def serve(self, int signal_fd=-1):
        """serve(signal_fd=-1): run the loop until stop(), without the GIL;
        signal_fd is a signal.set_wakeup_fd() pipe whose readability makes
        the loop run signal handlers."""
        if self.g.srv == NULL:
            raise RuntimeError("Server not initialised")
        if self.g.serving:
            raise RuntimeError("Server is already serving")
        if fw_server_watch_signals(self.g.srv, signal_fd) != 0:
            raise OSError(errno, os.strerror(errno))
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
            if rc == 1 and PyErr_Occurred() != NULL:   # a signal handler raised
                raise _take_error()
            if rc < 0:
                raise OSError("the event loop failed (see the log)")
            if PyErr_Occurred() != NULL:
                PyErr_Clear()
        finally:
            self.g.serving = 0
            fw_logq_stop(&self.g)
            fw_server_watch_signals(self.g.srv, -1)

    def stop(self, bint graceful=True):
        """stop(graceful=True): ask the loop to stop; safe from any thread or
        a signal handler."""
        if self.g.srv != NULL:
            fw_server_stop(self.g.srv, graceful)

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


def sb_hold(scoreboard, int slot, bint on):
    """sb_hold(scoreboard, slot, on): ask a worker not to retire by itself
    (--max-requests) while on: the master could not replace it."""
    cdef _Scoreboard s = _Scoreboard(scoreboard)
    fw_sb_hold(s.buf.buf, s.nslots, slot, on)


_STATES = ("free", "alive", "draining")


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
                    "handed_out": v.handed_out, "kicks_sent": v.kicks_sent, "beat": v.beat,
                    "hold": v.hold, "image": v.image, "waiting": v.waiting})
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


# ---- the offload sibling's Kafka producer (cserver/fw_kafka.h) --------------------

cdef extern from "fw_kafka.h":
    ctypedef struct fw_kafka:
        pass

    ctypedef struct fw_kafka_err:
        uint32_t index
        int32_t code

    ctypedef struct fw_kafka_batch:
        uint64_t id
        uint32_t n
        uint32_t nerr
        fw_kafka_err *errs

    ctypedef struct fw_kafka_rec:
        const char *topic
        const void *key
        size_t key_len
        const void *value
        size_t value_len
        int64_t ts_ms

    ctypedef struct fw_kafka_log:
        int level
        char fac[16]
        char text[240]

    int FW_KAFKA_QUEUE_FULL
    int FW_KAFKA_ERR_INVALID_ARG
    void fw_kafka_fail(fw_kafka *k, fw_kafka_batch *b, uint32_t i, int code)
    fw_kafka *fw_kafka_open(const char *lib_path, const char *const *conf, char *err, size_t errlen)
    const char *fw_kafka_version(const fw_kafka *k)
    fw_kafka_batch *fw_kafka_batch_new(fw_kafka *k, uint64_t id, uint32_t n)
    int fw_kafka_produce(fw_kafka *k, fw_kafka_batch *b, uint32_t i, const fw_kafka_rec *r)
    void fw_kafka_poll(fw_kafka *k, int timeout_ms) nogil
    int fw_kafka_flush(fw_kafka *k, int timeout_ms) nogil
    void fw_kafka_purge(fw_kafka *k)
    fw_kafka_batch *fw_kafka_next_done(fw_kafka *k)
    void fw_kafka_batch_free(fw_kafka_batch *b)
    int fw_kafka_fatal(fw_kafka *k, char *buf, size_t len)
    int fw_kafka_next_log(fw_kafka *k, fw_kafka_log *out, unsigned *dropped)
    const char *fw_kafka_err_name(const fw_kafka *k, int code)
    const char *fw_kafka_err_text(const fw_kafka *k, int code)
    void fw_kafka_close(fw_kafka *k) nogil


cdef class KafkaProducer:
    """A librdkafka producer driven from C (cserver/fw_kafka.h), for the
    offload sibling's Kafka sink: produce() hands a whole batch of records
    to librdkafka in one C loop, poll() serves the delivery reports (without
    the GIL) and returns the batches that are finished.

    KafkaProducer(lib_path, conf): lib_path is librdkafka's shared library
    (offload/sinks.py gives the one confluent-kafka loaded), conf a list of
    (name, value) str pairs. ValueError with librdkafka's reason when it
    cannot be loaded or refuses a setting. One thread uses it."""

    cdef fw_kafka *k
    cdef readonly str version

    def __cinit__(self, str lib_path, conf):
        cdef char err[512]
        cdef const char **kv = NULL
        pairs = [(str(n).encode(), str(v).encode()) for n, v in conf]
        kv = <const char **>PyMem_Malloc((2 * len(pairs) + 1) * sizeof(char *))
        if kv == NULL:
            raise MemoryError()
        try:
            for i, (n, v) in enumerate(pairs):
                kv[2 * i] = n
                kv[2 * i + 1] = v
            kv[2 * len(pairs)] = NULL
            path = os.fsencode(lib_path)
            err[0] = 0
            self.k = fw_kafka_open(path, kv, err, sizeof(err))
        finally:
            PyMem_Free(kv)
        if self.k == NULL:
            raise ValueError(err.decode("utf-8", "replace"))
        self.version = fw_kafka_version(self.k).decode()

    cdef fw_kafka *_open(self) except NULL:
        if self.k == NULL:
            raise ValueError("the Kafka producer is closed")
        return self.k

    def produce(self, list records, uint64_t batch_id, double queue_full_wait=0.05):
        """Produce `records` (Record: topic, key, value, ts, ...) as batch
        `batch_id`. When librdkafka's queue is full, serve reports for up to
        queue_full_wait seconds (without the GIL) and try again."""
        cdef fw_kafka *k = self._open()
        cdef fw_kafka_rec r
        cdef fw_kafka_batch *b
        cdef uint32_t i = 0
        cdef Py_ssize_t n = len(records)
        cdef int wait_ms = _ms(queue_full_wait)
        cdef bytes key, value
        cdef const char *topic
        if n == 0:
            return
        b = fw_kafka_batch_new(k, batch_id, <uint32_t>n)
        if b == NULL:
            raise MemoryError()
        # The batch is k's from here: every record must get an outcome, so
        # one that is not a Record fails the rest (the caller retries them).
        try:
            for rec in records:
                if not isinstance(rec, tuple) or len(rec) < 4:
                    raise TypeError("a Record (topic, key, value, ts, ...) was expected")
                topic = PyUnicode_AsUTF8(<object>PyTuple_GET_ITEM(rec, 0))
                key = <object>PyTuple_GET_ITEM(rec, 1)
                value = <object>PyTuple_GET_ITEM(rec, 2)
                r.topic = topic
                if key is None:
                    r.key, r.key_len = NULL, 0
                else:
                    r.key, r.key_len = <const char *>key, len(key)
                r.value = <const char *>value
                r.value_len = len(value)
                r.ts_ms = <int64_t>(<double>(<object>PyTuple_GET_ITEM(rec, 3)) * 1000.0)
                while fw_kafka_produce(k, b, i, &r) == FW_KAFKA_QUEUE_FULL:
                    with nogil:
                        fw_kafka_poll(k, wait_ms)
                i += 1
        except BaseException:
            while i < n:
                fw_kafka_fail(k, b, i, FW_KAFKA_ERR_INVALID_ARG)
                i += 1
            raise

    def poll(self, double timeout):
        """Serve delivery reports, waiting up to `timeout` seconds for the
        first. Returns the batches finished since the last call, in order:
        (batch_id, failures), failures a list of (index, error name, error
        text)."""
        cdef fw_kafka *k = self._open()
        cdef int ms = _ms(timeout)
        with nogil:
            fw_kafka_poll(k, ms)
        return self._finished()

    cdef list _finished(self):
        cdef list out = []
        cdef fw_kafka_batch *b
        cdef uint32_t j
        while True:
            b = fw_kafka_next_done(self.k)
            if b == NULL:
                return out
            try:
                out.append((b.id, [(b.errs[j].index, fw_kafka_err_name(self.k, b.errs[j].code).decode(),
                                    fw_kafka_err_text(self.k, b.errs[j].code).decode("utf-8", "replace"))
                                   for j in range(b.nerr)]))
            finally:
                fw_kafka_batch_free(b)

    def flush(self, double timeout):
        """Wait up to `timeout` s for every report; returns (records still
        without one, the batches finished meanwhile as poll() gives them)."""
        cdef fw_kafka *k = self._open()
        cdef int ms = _ms(timeout)
        cdef int left
        with nogil:
            left = fw_kafka_flush(k, ms)
        return left, self._finished()

    def purge(self):
        """Drop what librdkafka holds; the reports come at the next poll."""
        fw_kafka_purge(self._open())

    def fatal(self):
        """The fatal error's text (the producer must be replaced), or None."""
        cdef char buf[512]
        if self.k == NULL:
            return "the producer is closed"
        if not fw_kafka_fatal(self.k, buf, sizeof(buf)):
            return None
        return buf.decode("utf-8", "replace")

    def logs(self):
        """librdkafka's log lines since the last call: a list of (syslog
        level, facility, text), then the number of lines dropped for room."""
        cdef fw_kafka_log line
        cdef unsigned dropped = 0
        cdef list out = []
        if self.k == NULL:
            return out, 0
        while fw_kafka_next_log(self.k, &line, &dropped):
            out.append((line.level, line.fac.decode("utf-8", "replace"), line.text.decode("utf-8", "replace")))
        return out, dropped

    def close(self):
        """Purge, destroy the producer (without the GIL: it waits for
        librdkafka's threads) and unload the library; batches not finished
        are forgotten."""
        cdef fw_kafka *k = self.k
        self.k = NULL
        if k != NULL:
            with nogil:
                fw_kafka_close(k)

    def __dealloc__(self):
        if self.k != NULL:
            fw_kafka_close(self.k)
            self.k = NULL


# ---- the module ------------------------------------------------------------------

PyType_Ready(&StartResponse_Type)
PyType_Ready(&Writer_Type)
PyType_Ready(&Input_Type)
PyType_Ready(&FileWrapper_Type)
fw_environ_init()
fw_request_init()
FileWrapper = <object><PyObject *>&FileWrapper_Type
Input = <object><PyObject *>&Input_Type


cdef extern from "glue.h":
    void fw_coverage_dump()


def _coverage_dump():
    """Write gcov's counters now (`make coverage` builds; elsewhere nothing):
    a process about to os._exit() calls it, as libgcov's exit handler does
    not run then."""
    fw_coverage_dump()


def _add_c_functions():
    """offload(), offload_setup() & co, defined in C (src/offload.c)."""
    import sys
    PyModule_AddFunctions(sys.modules[__name__], fw_offload_methods)


_add_c_functions()
del _add_c_functions
