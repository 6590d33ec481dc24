/* module: forkwsgi._forkwsgi, the Server type and module setup.
 *
 * Server(app, fds, base_environ, listener_info, logger, **limits) wraps one
 * fw_server. serve() runs its loop on the calling thread with the GIL
 * released; stop() may be called from any thread or a signal handler. */
#include "glue.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

int fw_request_init(void);

static int ms(double seconds)
{
    if (seconds <= 0)
        return 0;
    if (seconds > 86400 * 365)
        seconds = 86400 * 365;
    return (int)(seconds * 1000 + 0.5);
}

/* A sequence of n ints (fds, -1 for none) into out. */
static int int_list(PyObject *o, int *out, Py_ssize_t n, const char *what)
{
    PyObject *seq = PySequence_Fast(o, what);
    if (!seq)
        return -1;
    if (PySequence_Fast_GET_SIZE(seq) != n) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s: need one entry per scoreboard slot", what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        out[i] = v < 0 || v > 0x7fffffff ? -1 : (int)v;
    }
    Py_DECREF(seq);
    return 0;
}

/* The shared scoreboard buffer (writable, 64-aligned, one FW_SB_SLOT_SIZE slot per
 * worker), this worker's slot, and the per-slot fds made by the master. */
static int balance_setup(ServerObject *self, fw_balance_cfg *bc, PyObject *scoreboard, int slot,
                         PyObject *kick_fds, PyObject *pass_fds, int pass_recv_fd)
{
    if (PyObject_GetBuffer(scoreboard, &self->scoreboard, PyBUF_WRITABLE) < 0)
        return -1;
    Py_ssize_t nslots = self->scoreboard.len / FW_SB_SLOT_SIZE;
    if (nslots < 1 || nslots > 4096 || ((uintptr_t)self->scoreboard.buf & (FW_SB_SLOT_SIZE - 1)) ||
        slot < 0 || slot >= nslots) {
        PyErr_SetString(PyExc_ValueError, "scoreboard must be a writable, 64-aligned buffer "
                                          "of SB_SLOT_SIZE bytes per slot, and slot one of them");
        return -1;
    }
    self->balance_fds = PyMem_Malloc(2 * (size_t)nslots * sizeof(int));
    if (!self->balance_fds) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < 2 * nslots; i++)
        self->balance_fds[i] = -1;
    if (kick_fds != Py_None && int_list(kick_fds, self->balance_fds, nslots, "kick_fds") < 0)
        return -1;
    if (pass_fds != Py_None && int_list(pass_fds, self->balance_fds + nslots, nslots, "pass_fds") < 0)
        return -1;
    bc->scoreboard = self->scoreboard.buf;
    bc->nslots = (int)nslots;
    bc->me = slot;
    bc->kick_fds = self->balance_fds;
    bc->pass_fds = pass_fds != Py_None ? self->balance_fds + nslots : NULL;
    bc->pass_recv_fd = pass_recv_fd;
    return 0;
}

static int server_init(PyObject *self_, PyObject *args, PyObject *kwds)
{
    ServerObject *self = (ServerObject *)self_;
    static char *kwlist[] = {
        "app", "fds", "base_environ", "listener_info", "logger",
        "max_line", "max_head", "max_headers", "max_body",
        "header_timeout", "body_timeout", "keepalive_timeout", "write_timeout", "graceful_timeout",
        "spool_threshold", "spool_dir", "max_connections", "accept_batch", "max_requests", "status",
        "threads", "balance", "scoreboard", "slot", "kick_fds", "pass_fds", "pass_recv_fd",
        "release_listeners", NULL
    };
    PyObject *app, *fds, *base, *info, *logger;
    fw_config cfg;
    fw_config_defaults(&cfg);
    Py_ssize_t max_line = (Py_ssize_t)cfg.limits.max_line, max_head = (Py_ssize_t)cfg.limits.max_head,
               max_headers = (Py_ssize_t)cfg.limits.max_headers, spool = (Py_ssize_t)cfg.spool_threshold;
    unsigned long long max_body = cfg.limits.max_body;
    double th = cfg.header_timeout_ms / 1000.0, tb = cfg.body_timeout_ms / 1000.0,
           tk = cfg.keepalive_timeout_ms / 1000.0, tw = cfg.write_timeout_ms / 1000.0,
           tg = cfg.graceful_timeout_ms / 1000.0;
    const char *spool_dir = NULL;
    int max_conns = cfg.max_connections, batch = cfg.accept_batch;
    unsigned long long max_requests = 0;
    PyObject *status = Py_None, *scoreboard = Py_None, *kick_fds = Py_None, *pass_fds = Py_None;
    int threads = 1, balance = FW_BAL_LEAST_BUSY, slot = 0, pass_recv_fd = -1, release_listeners = 0;

    if (self->srv) {
        PyErr_SetString(PyExc_RuntimeError, "Server already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!O|$nnnKdddddnziiKOiiOiOOip:Server", kwlist,
                                     &app, &fds, &PyDict_Type, &base, &PyList_Type, &info, &logger,
                                     &max_line, &max_head, &max_headers, &max_body,
                                     &th, &tb, &tk, &tw, &tg, &spool, &spool_dir, &max_conns, &batch,
                                     &max_requests, &status, &threads, &balance, &scoreboard, &slot,
                                     &kick_fds, &pass_fds, &pass_recv_fd, &release_listeners))
        return -1;
    if (threads < 1 || threads > 1024) {
        PyErr_SetString(PyExc_ValueError, "threads must be 1 to 1024");
        return -1;
    }
    if (balance < FW_BAL_SHARED || balance > FW_BAL_REUSEPORT) {
        PyErr_SetString(PyExc_ValueError, "unknown balance mode");
        return -1;
    }
    cfg.threads = threads;
    cfg.release_listeners = release_listeners;
    cfg.balance.mode = balance;
    cfg.balance.pass_recv_fd = -1;
    if (scoreboard != Py_None && balance_setup(self, &cfg.balance, scoreboard, slot, kick_fds,
                                               pass_fds, pass_recv_fd) < 0)
        return -1;
    if (max_head < max_line)
        max_line = max_head;      /* the line is part of the head */
    if (max_line < 64 || max_headers < 1 || spool < 0 || max_conns < 1) {
        PyErr_SetString(PyExc_ValueError, "invalid limits");
        return -1;
    }
    cfg.limits.max_line = (size_t)max_line;
    cfg.limits.max_head = (size_t)max_head;
    cfg.limits.max_headers = (size_t)max_headers;
    cfg.limits.max_body = max_body;
    cfg.header_timeout_ms = ms(th);
    cfg.body_timeout_ms = ms(tb);
    cfg.keepalive_timeout_ms = ms(tk);
    cfg.write_timeout_ms = ms(tw);
    cfg.graceful_timeout_ms = ms(tg);
    cfg.spool_threshold = (size_t)spool;
    cfg.max_connections = max_conns;
    cfg.accept_batch = batch;
    cfg.max_requests = max_requests;
    if (status != Py_None) {
        /* A writable shared buffer of at least FW_STATUS_SIZE bytes, 8-aligned. */
        if (PyObject_GetBuffer(status, &self->status, PyBUF_WRITABLE) < 0)
            return -1;
        if (self->status.len < (Py_ssize_t)threads * FW_STATUS_SIZE || ((uintptr_t)self->status.buf & 7)) {
            PyBuffer_Release(&self->status);
            self->status.buf = NULL;
            PyErr_SetString(PyExc_ValueError,
                            "status must be a writable, 8-aligned buffer of 256 bytes per thread");
            return -1;
        }
    }

    PyObject *seq = PySequence_Fast(fds, "fds must be a sequence of file descriptors");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > 64 || PyList_GET_SIZE(info) != n) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "need 1 to 64 listening fds and one listener_info entry each");
        return -1;
    }
    int ifds[64];
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        PyObject *li = PyList_GET_ITEM(info, i);
        if (fd < 0 || fd > 0x7fffffff || !PyTuple_Check(li) || PyTuple_GET_SIZE(li) != 2) {
            Py_DECREF(seq);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "bad fd or listener_info entry");
            return -1;
        }
        ifds[i] = (int)fd;
    }
    Py_DECREF(seq);
    if (spool_dir) {
        self->spool_dir = PyMem_Malloc(strlen(spool_dir) + 1);
        if (!self->spool_dir) {
            PyErr_NoMemory();
            return -1;
        }
        strcpy(self->spool_dir, spool_dir);
        cfg.spool_dir = self->spool_dir;
    }
    self->cfg = cfg;
    self->srv = fw_server_new(&self->cfg, ifds, (int)n, &fw_glue_ops, self);
    if (!self->srv) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    Py_INCREF(app);
    Py_INCREF(base);
    Py_INCREF(info);
    Py_INCREF(logger);
    self->app = app;
    self->base_environ = base;
    self->listener_info = info;
    self->logger = logger;
    return 0;
}

static PyObject *server_serve(PyObject *self_, PyObject *args)
{
    ServerObject *self = (ServerObject *)self_;
    int sigfd = -1;
    if (!PyArg_ParseTuple(args, "|i:serve", &sigfd))
        return NULL;
    if (!self->srv) {
        PyErr_SetString(PyExc_RuntimeError, "Server not initialised");
        return NULL;
    }
    if (self->serving) {
        PyErr_SetString(PyExc_RuntimeError, "Server is already serving");
        return NULL;
    }
    if (fw_server_watch_signals(self->srv, sigfd) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    self->serving = 1;
    Py_INCREF(self);
    self->tstate = PyEval_SaveThread();
    int rc = fw_server_run(self->srv);
    PyEval_RestoreThread(self->tstate);
    self->tstate = NULL;
    self->serving = 0;
    fw_server_watch_signals(self->srv, -1);
    PyObject *ret = NULL;
    if (self->pending_exc) {
        PyObject *e = self->pending_exc;
        self->pending_exc = NULL;
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    } else if (rc == 1 && PyErr_Occurred()) {
        /* a signal handler raised */
    } else if (rc < 0) {
        PyErr_SetString(PyExc_OSError, "the event loop failed (see the log)");
    } else {
        if (PyErr_Occurred())
            PyErr_Clear();
        ret = Py_None;
        Py_INCREF(ret);
    }
    Py_DECREF(self);
    return ret;
}

static PyObject *server_stop(PyObject *self_, PyObject *args, PyObject *kwds)
{
    ServerObject *self = (ServerObject *)self_;
    static char *kwlist[] = { "graceful", NULL };
    int graceful = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p:stop", kwlist, &graceful))
        return NULL;
    if (self->srv)
        fw_server_stop(self->srv, graceful);
    Py_RETURN_NONE;
}

static PyObject *server_stats(PyObject *self_, PyObject *unused)
{
    (void)unused;
    ServerObject *self = (ServerObject *)self_;
    if (!self->srv)
        Py_RETURN_NONE;
    fw_sb_slot *me = &self->srv->bal.sb[self->srv->bal.cfg.me];
    return Py_BuildValue("{s:i,s:O,s:K,s:I,s:K,s:K,s:K}", "connections", self->srv->nconns,
                         "serving", self->serving ? Py_True : Py_False,
                         "requests", (unsigned long long)self->srv->requests,
                         "inflight", (unsigned)atomic_load(&me->inflight),
                         "accepted", (unsigned long long)atomic_load(&me->accepted),
                         "handed_in", (unsigned long long)atomic_load(&me->handed_in),
                         "handed_out", (unsigned long long)atomic_load(&me->handed_out));
}

static void server_dealloc(PyObject *self_)
{
    ServerObject *self = (ServerObject *)self_;
    if (self->srv) {
        fw_server_free(self->srv);
        self->srv = NULL;
    }
    Py_XDECREF(self->app);
    Py_XDECREF(self->base_environ);
    Py_XDECREF(self->listener_info);
    Py_XDECREF(self->logger);
    Py_XDECREF(self->pending_exc);
    if (self->status.buf)
        PyBuffer_Release(&self->status);
    if (self->scoreboard.buf)
        PyBuffer_Release(&self->scoreboard);
    PyMem_Free(self->balance_fds);
    PyMem_Free(self->spool_dir);
    Py_TYPE(self_)->tp_free(self_);
}

static PyMethodDef server_methods[] = {
    { "serve", server_serve, METH_VARARGS,
      "serve(signal_fd=-1): run the loop until stop() (GIL released); signal_fd is a "
      "signal.set_wakeup_fd() pipe whose readability makes the loop run signal handlers" },
    { "stop", (PyCFunction)(void (*)(void))server_stop, METH_VARARGS | METH_KEYWORDS,
      "stop(graceful=True): ask the loop to stop; safe from any thread or signal handler" },
    { "stats", server_stats, METH_NOARGS, "stats() -> dict" },
    { NULL, NULL, 0, NULL },
};

static PyTypeObject Server_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkwsgi._forkwsgi.Server",
    .tp_basicsize = sizeof(ServerObject),
    .tp_dealloc = server_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = server_methods,
    .tp_init = server_init,
    .tp_new = PyType_GenericNew,
    .tp_doc = "the C HTTP/1.1 server loop over listening sockets",
};

/* ---- the master's side of the scoreboard ---------------------------------- */

typedef struct {
    Py_buffer buf;
    int nslots;
    int *kicks;         /* PyMem, nslots */
} sb_args;

static void sb_args_release(sb_args *a)
{
    if (a->buf.buf)
        PyBuffer_Release(&a->buf);
    PyMem_Free(a->kicks);
}

static int sb_args_get(sb_args *a, PyObject *buf, PyObject *kicks)
{
    memset(a, 0, sizeof(*a));
    if (PyObject_GetBuffer(buf, &a->buf, PyBUF_WRITABLE) < 0)
        return -1;
    a->nslots = (int)(a->buf.len / FW_SB_SLOT_SIZE);
    if (((uintptr_t)a->buf.buf & (FW_SB_SLOT_SIZE - 1)) || a->nslots < 1) {
        PyErr_SetString(PyExc_ValueError, "bad scoreboard buffer");
        return -1;
    }
    if (kicks == Py_None)
        return 0;
    a->kicks = PyMem_Malloc((size_t)a->nslots * sizeof(int));
    if (!a->kicks) {
        PyErr_NoMemory();
        return -1;
    }
    return int_list(kicks, a->kicks, a->nslots, "kick_fds");
}

/* (scoreboard, slot, kick_fds) -> fn(scoreboard, nslots, slot, kicks) */
static PyObject *sb_slot_call(PyObject *args, const char *fmt,
                              void (*fn)(void *, int, int, const int *))
{
    PyObject *buf, *kicks;
    int i;
    sb_args a;
    if (!PyArg_ParseTuple(args, fmt, &buf, &i, &kicks))
        return NULL;
    if (sb_args_get(&a, buf, kicks) < 0) {
        sb_args_release(&a);
        return NULL;
    }
    fn(a.buf.buf, a.nslots, i, a.kicks);
    sb_args_release(&a);
    Py_RETURN_NONE;
}

static PyObject *sb_spawn(PyObject *mod, PyObject *args)
{
    (void)mod;
    return sb_slot_call(args, "OiO:sb_spawn", fw_sb_spawn);
}

static PyObject *sb_release(PyObject *mod, PyObject *args)
{
    (void)mod;
    return sb_slot_call(args, "OiO:sb_release", fw_sb_release);
}

static void sb_retire_call(void *sb, int nslots, int i, const int *kicks)
{
    (void)kicks;
    fw_sb_retire(sb, nslots, i);
}

static PyObject *sb_retire(PyObject *mod, PyObject *args)
{
    (void)mod;
    return sb_slot_call(args, "OiO:sb_retire", sb_retire_call);
}

static PyObject *sb_read(PyObject *mod, PyObject *arg)
{
    (void)mod;
    static const char *const states[] = { "free", "alive", "draining" };
    sb_args a;
    if (sb_args_get(&a, arg, Py_None) < 0) {
        sb_args_release(&a);
        return NULL;
    }
    fw_sb_slot *sb = a.buf.buf;
    PyObject *list = PyList_New(a.nslots);
    for (int i = 0; list && i < a.nslots; i++) {
        uint32_t st = atomic_load(&sb[i].state);
        PyObject *d = Py_BuildValue(
            "{s:s,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:K,s:K,s:K,s:K}", "state", st < 3 ? states[st] : "?",
            "pid", (int)atomic_load(&sb[i].pid), "gen", (unsigned)atomic_load(&sb[i].gen),
            "inflight", (unsigned)atomic_load(&sb[i].inflight), "armed", (unsigned)atomic_load(&sb[i].armed),
            "threads", (unsigned)atomic_load(&sb[i].threads),
            "open", (unsigned)atomic_load(&sb[i].open), "retire", (unsigned)atomic_load(&sb[i].retire),
            "accepted", (unsigned long long)atomic_load(&sb[i].accepted),
            "handed_in", (unsigned long long)atomic_load(&sb[i].handed_in),
            "handed_out", (unsigned long long)atomic_load(&sb[i].handed_out),
            "kicks_sent", (unsigned long long)atomic_load(&sb[i].kicks_sent));
        if (!d) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, d);
    }
    sb_args_release(&a);
    return list;
}

static PyMethodDef module_methods[] = {
    { "sb_spawn", sb_spawn, METH_VARARGS,
      "sb_spawn(scoreboard, slot, kick_fds): reset a slot for a new worker (before fork)" },
    { "sb_release", sb_release, METH_VARARGS,
      "sb_release(scoreboard, slot, kick_fds): free a dead worker's slot and kick the others" },
    { "sb_retire", sb_retire, METH_VARARGS,
      "sb_retire(scoreboard, slot, None): mark a worker as retiring while others serve on "
      "(it hands its idle connections to them), before the SIGTERM that retires it" },
    { "sb_read", sb_read, METH_O, "sb_read(scoreboard) -> a dict per slot" },
    { NULL, NULL, 0, NULL },
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_forkwsgi", "forkwsgi's C core: HTTP/1.1 server and WSGI glue", -1,
    module_methods, NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__forkwsgi(void)
{
    if (PyType_Ready(&Server_Type) < 0 || PyType_Ready(&StartResponse_Type) < 0 ||
        PyType_Ready(&Input_Type) < 0 || PyType_Ready(&FileWrapper_Type) < 0)
        return NULL;
    if (fw_environ_init() < 0 || fw_request_init() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    if (PyModule_AddFunctions(m, fw_offload_methods) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&Server_Type);
    Py_INCREF(&FileWrapper_Type);
    Py_INCREF(&Input_Type);
    if (PyModule_AddIntConstant(m, "SB_SLOT_SIZE", FW_SB_SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "STATUS_SIZE", FW_STATUS_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_SHARED", FW_BAL_SHARED) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_LEAST_BUSY", FW_BAL_LEAST_BUSY) < 0 ||
        PyModule_AddIntConstant(m, "BALANCE_REUSEPORT", FW_BAL_REUSEPORT) < 0 ||
        PyModule_AddObject(m, "Server", (PyObject *)&Server_Type) < 0 ||
        PyModule_AddObject(m, "FileWrapper", (PyObject *)&FileWrapper_Type) < 0 ||
        PyModule_AddObject(m, "Input", (PyObject *)&Input_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
