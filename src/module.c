/* module: forkwsgi._forkwsgi, the Server type and module setup.
 *
 * Server(app, fds, base_environ, listener_info, logger, **limits) wraps one
 * fw_server. serve() runs its loop on the calling thread with the GIL
 * released; stop() may be called from any thread or a signal handler. */
#include "glue.h"

#include <errno.h>
#include <string.h>

int fw_request_init(void);

void fw_glue_log_exception(ServerObject *s, const char *what, fw_conn *c)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v)
        PyException_SetTraceback(v, tb);
    PyObject *msg = NULL;
    if (c && c->head) {
        PyObject *m = PyUnicode_DecodeLatin1(c->req.method, (Py_ssize_t)c->req.method_len, NULL);
        PyObject *tg = PyUnicode_DecodeLatin1(c->req.target,
                                              (Py_ssize_t)(c->req.target_len > 200 ? 200 : c->req.target_len), NULL);
        if (m && tg)
            msg = PyUnicode_FromFormat("%s %U %U", what, m, tg);
        Py_XDECREF(m);
        Py_XDECREF(tg);
    }
    if (!msg) {
        PyErr_Clear();
        msg = PyUnicode_FromString(what);
    }
    PyObject *kw = Py_BuildValue("{s:O}", "exc_info", v ? v : Py_None);
    PyObject *meth = PyObject_GetAttrString(s->logger, "error");
    PyObject *args = msg ? PyTuple_Pack(1, msg) : NULL;
    PyObject *x = meth && args && kw ? PyObject_Call(meth, args, kw) : NULL;
    if (!x)
        PyErr_Clear();
    Py_XDECREF(x);
    Py_XDECREF(args);
    Py_XDECREF(meth);
    Py_XDECREF(kw);
    Py_XDECREF(msg);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

static int ms(double seconds)
{
    if (seconds <= 0)
        return 0;
    if (seconds > 86400 * 365)
        seconds = 86400 * 365;
    return (int)(seconds * 1000 + 0.5);
}

static int server_init(PyObject *self_, PyObject *args, PyObject *kwds)
{
    ServerObject *self = (ServerObject *)self_;
    static char *kwlist[] = {
        "app", "fds", "base_environ", "listener_info", "logger",
        "max_line", "max_head", "max_headers", "max_body",
        "header_timeout", "body_timeout", "keepalive_timeout", "write_timeout", "graceful_timeout",
        "spool_threshold", "spool_dir", "max_connections", "accept_batch", "max_requests", "status", NULL
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
    PyObject *status = Py_None;

    if (self->srv) {
        PyErr_SetString(PyExc_RuntimeError, "Server already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!O|$nnnKdddddnziiKO:Server", kwlist,
                                     &app, &fds, &PyDict_Type, &base, &PyList_Type, &info, &logger,
                                     &max_line, &max_head, &max_headers, &max_body,
                                     &th, &tb, &tk, &tw, &tg, &spool, &spool_dir, &max_conns, &batch,
                                     &max_requests, &status))
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
        if (self->status.len < FW_STATUS_SIZE || ((uintptr_t)self->status.buf & 7)) {
            PyBuffer_Release(&self->status);
            self->status.buf = NULL;
            PyErr_SetString(PyExc_ValueError, "status must be a writable, 8-aligned buffer of 256 bytes");
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
    return Py_BuildValue("{s:i,s:O}", "connections", self->srv->nconns,
                         "serving", self->serving ? Py_True : Py_False);
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

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_forkwsgi", "forkwsgi's C core: HTTP/1.1 server and WSGI glue", -1,
    NULL, NULL, NULL, NULL, NULL
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
    Py_INCREF(&Server_Type);
    Py_INCREF(&FileWrapper_Type);
    Py_INCREF(&Input_Type);
    if (PyModule_AddObject(m, "Server", (PyObject *)&Server_Type) < 0 ||
        PyModule_AddObject(m, "FileWrapper", (PyObject *)&FileWrapper_Type) < 0 ||
        PyModule_AddObject(m, "Input", (PyObject *)&Input_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
