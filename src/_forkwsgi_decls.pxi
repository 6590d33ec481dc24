# Part of _forkwsgi.pyx, included there (one module, one namespace).

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
        int write_coalesce_us
        int gil_each_write
        int inline_first
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
        uint32_t state, inflight, incoming, pending, armed, open, retire, threads, gen, hold, image, waiting, why
        int32_t pid
        int64_t beat
        uint64_t accepted, handed_in, handed_out, kicks_sent, arms

    ctypedef struct fw_glue:
        fw_server *srv
        PyObject *thread_name
        PyObject *app
        PyObject *logger
        PyObject *templates
        PyObject *pending_exc
        const fw_scheme_header *scheme_headers
        int n_scheme_headers
        int forwarded_proto
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
        FW_PROXY_PLAIN

    object fw_environ_template(object base, object info)
    void fw_environ_forget(fw_glue *s)
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
    enum fw_run_end:
        FW_RUN_FAILED
        FW_RUN_STOPPED
        FW_RUN_SIGNAL
    fw_run_end fw_server_run(fw_server *srv)
    int fw_server_start_threads(fw_server *srv) nogil
    int fw_logq_start(fw_glue *s)
    int fw_pool_max_threads(int nthreads)
    void fw_logq_stop(fw_glue *s)
    void fw_server_stop(fw_server *srv, int graceful)
    void fw_server_retire(fw_server *srv)
    int fw_server_watch_signals(fw_server *srv, int fd)
    void fw_balance_view(const fw_balance *b, fw_sb_view *out)
    int fw_sb_view_of(const void *scoreboard, int nslots, int i, fw_sb_view *out)
    void fw_sb_spawn(void *scoreboard, int nslots, int i, const int *kick_fds, uint32_t image)
    void fw_sb_retire(void *scoreboard, int nslots, int i)
    void fw_sb_end(void *scoreboard, int nslots, int i)
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
    void fw_coverage_dump()
