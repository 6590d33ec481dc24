/* request: running the app for one request and streaming its response.
 *
 * on_request calls the app and iterates the result; when the socket cannot
 * take more, it returns FW_APP_WAIT and the loop calls on_writable once the
 * client has read, so one slow reader never blocks the loop. For a list or
 * tuple (the common "return [body]") the whole body is known up front: it
 * gets a Content-Length and leaves with the head in one write. */
#include "glue.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define QUEUE_HIGH (256 * 1024)   /* list bodies: flush past this much queued */
#define LEND_MIN (64 * 1024)      /* list items this large are lent, not copied */

static PyObject *s_wsgi_input, *s_close, *s_fileno, *s_tell;

int fw_request_init(void)
{
    s_wsgi_input = PyUnicode_InternFromString("wsgi.input");
    s_close = PyUnicode_InternFromString("close");
    s_fileno = PyUnicode_InternFromString("fileno");
    s_tell = PyUnicode_InternFromString("tell");
    return s_wsgi_input && s_close && s_fileno && s_tell ? 0 : -1;
}

static char *status_slot(fw_glue *s, fw_conn *c)
{
    Py_ssize_t off = (Py_ssize_t)c->x->thr->index * FW_STATUS_SIZE;
    if (!s->status.buf || off + FW_STATUS_SIZE > s->status.len)
        return NULL;
    return (char *)s->status.buf + off;
}

uint64_t fw_status_enter(fw_glue *s, fw_conn *c, int first)
{
    char *slot = status_slot(s, c);
    if (!slot && !c->srv->cfg.stats)
        return 0;
    /* Inline, the first call into the app for a request without a pre-read
     * body follows its parse at once: the parse's clock reading serves (one
     * clock read less). A pre-read body may have taken long to come (a slow
     * upload, or owed responses flushed first): that is no time in the app,
     * which --timeout and the app counters measure; nor is the flush of
     * deferred responses (and the app code it runs for their connections)
     * before the call (parse_stale). */
    uint64_t ns = first && !c->srv->pool && c->x->began_ns && !c->x->parse_stale &&
                  c->x->body.src == FW_B_NONE ? c->x->began_ns : fw_now_ns();
    if (!slot)
        return ns;
    size_t room = FW_STATUS_SIZE - 16 - 1, n = 0;
    const fw_request *r = &c->x->req;
    /* This thread is the entry's only writer: plain stores, no locked
     * instruction. The line first, then the time, which is released after
     * it: the master reads the time first. */
    _Atomic uint64_t *calls = (_Atomic uint64_t *)(void *)(slot + 8);
    atomic_store_explicit(calls, atomic_load_explicit(calls, memory_order_relaxed) + 1, memory_order_relaxed);
    char *line = slot + 16;
    size_t m = r->method_len < room ? r->method_len : room;
    memcpy(line, r->method, m);
    n = m;
    if (n < room)
        line[n++] = ' ';
    size_t t = r->target_len < room - n ? r->target_len : room - n;
    memcpy(line + n, r->target, t);
    line[n + t] = 0;
    atomic_store_explicit((_Atomic uint64_t *)(void *)slot, ns ? ns : 1, memory_order_release);
    return ns;
}

void fw_status_leave(fw_glue *s, fw_conn *c, uint64_t began_ns)
{
    char *slot = status_slot(s, c);
    if (slot)
        atomic_store_explicit((_Atomic uint64_t *)(void *)slot, 0, memory_order_release);
    if (c->srv->cfg.stats && began_ns) {
        uint64_t now = fw_now_ns();
        uint64_t spent = now - began_ns;
        c->x->app_done_ns = now;           /* the core's "queued" time of a batched response */
        if (!c->srv->pool)
            c->srv->clock_ns = now;        /* inline: the loop's reading after the call (fw_conn.c) */
        fw_stats_app_call(c->srv->cfg.stats, (spent > c->x->app_waited_ns ? spent - c->x->app_waited_ns : 0) / 1000,
                          !c->srv->pool);
    }
    c->x->app_waited_ns = 0;
}

void fw_status_pause(fw_glue *s, fw_conn *c, fw_pause *p)
{
    char *slot = status_slot(s, c);
    p->at = fw_now_ns();
    p->slot_began = 0;
    if (slot) {
        p->slot_began = atomic_load_explicit((_Atomic uint64_t *)(void *)slot, memory_order_relaxed);
        atomic_store_explicit((_Atomic uint64_t *)(void *)slot, 0, memory_order_release);
    }
}

void fw_status_resume(fw_glue *s, fw_conn *c, const fw_pause *p)
{
    char *slot = status_slot(s, c);
    uint64_t waited = fw_now_ns() - p->at;
    c->x->app_waited_ns += waited;
    /* The clock the master reads starts later by the wait. */
    if (slot && p->slot_began)
        atomic_store_explicit((_Atomic uint64_t *)(void *)slot, p->slot_began + waited, memory_order_release);
}

int fw_status_read(const void *entry, uint64_t *began, uint64_t *calls, char *line, size_t cap)
{
    /* The time first, then the line (written in the other order). */
    *calls = atomic_load((_Atomic uint64_t *)(void *)((const char *)entry + 8));
    *began = atomic_load((_Atomic uint64_t *)(void *)entry);
    if (!*began || cap == 0)
        return 0;
    size_t n = strnlen((const char *)entry + 16, FW_STATUS_SIZE - 16);
    if (n >= cap)
        n = cap - 1;
    memcpy(line, (const char *)entry + 16, n);
    line[n] = 0;
    return 1;
}

/* The Python thread state of the thread serving c: a pool thread's own
 * (made in thread_start), or the one serve() saved on the loop thread
 * (which also runs requests as a pool thread does: fw_thread.per_call). */
static PyThreadState *thread_state(fw_glue *s, fw_conn *c)
{
    return c->x->thr->app_ctx ? (PyThreadState *)c->x->thr->app_ctx : s->tstate;
}

/* Take the GIL for a call into the app. Inline (on the loop thread), it
 * may still be held from the previous request of a pipelined batch: the
 * core lets it go (on_unlock) before the batch's write, before a body that
 * may be spooled and when it leaves the connection, so between two
 * requests it is held only while the next is parsed from the buffer. A
 * pool thread takes and drops it per call. */
static void gil_take(fw_glue *s, fw_conn *c)
{
    if (c->x->thr->app_ctx || c->x->thr->per_call) {
        PyEval_RestoreThread(thread_state(s, c));     /* a pool thread, or as one */
        return;
    }
    if (!s->gil_kept)
        PyEval_RestoreThread(s->tstate);
    s->gil_kept = 0;            /* only the loop thread reads or writes it */
}

static void gil_leave(fw_glue *s, fw_conn *c)
{
    if (c->x->thr->app_ctx || c->x->thr->per_call)
        PyEval_SaveThread();
    else
        s->gil_kept = 1;
}

static void on_unlock(void *app)
{
    fw_glue *s = app;
    if (s->gil_kept) {
        s->gil_kept = 0;
        PyEval_SaveThread();
    }
}

/* Log the app's exception (with its traceback) at error, naming the
 * request. */
/* "what METHOD TARGET" (the target cut at 200 bytes), or just what. A new
 * reference; an error only when memory is out (then NULL, error set). */
static PyObject *request_text(const char *what, fw_conn *c)
{
    PyObject *msg = NULL;
    if (c && c->x && c->x->head) {
        PyObject *m = PyUnicode_DecodeLatin1(c->x->req.method, (Py_ssize_t)c->x->req.method_len, NULL);
        PyObject *tg = PyUnicode_DecodeLatin1(c->x->req.target,
                                              (Py_ssize_t)(c->x->req.target_len > 200 ? 200 : c->x->req.target_len), NULL);
        if (m && tg)
            msg = PyUnicode_FromFormat("%s %U %U", what, m, tg);
        Py_XDECREF(m);
        Py_XDECREF(tg);
    }
    if (!msg) {
        PyErr_Clear();
        msg = PyUnicode_FromString(what);
    }
    return msg;
}

/* logger.error(msg, exc_info=exc); a failure to log is dropped. */
static void log_error(fw_glue *s, PyObject *msg, PyObject *exc)
{
    PyObject *kw = Py_BuildValue("{s:O}", "exc_info", exc ? exc : Py_None);
    PyObject *meth = PyObject_GetAttrString(s->logger, "error");
    PyObject *args = msg ? PyTuple_Pack(1, msg) : NULL;
    PyObject *x = meth && args && kw ? PyObject_Call(meth, args, kw) : NULL;
    if (!x)
        PyErr_Clear();
    Py_XDECREF(x);
    Py_XDECREF(args);
    Py_XDECREF(meth);
    Py_XDECREF(kw);
}

static void log_exception(fw_glue *s, const char *what, fw_conn *c)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v)
        PyException_SetTraceback(v, tb);
    PyObject *msg = request_text(what, c);
    log_error(s, msg, v);
    Py_XDECREF(msg);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
}

static fw_freelist req_free_list;    /* fw_req structs of ended requests */

static fw_req *req_alloc(void)
{
    fw_req *r = fw_freelist_pop(&req_free_list);
    if (r) {
        memset(r, 0, offsetof(fw_req, env_keys));     /* (fw_environ_build fills env_keys) */
        r->env_keys.n = -1;
        return r;
    }
    return PyMem_Calloc(1, sizeof(fw_req));
}

static void req_free(fw_req *r)
{
    if (!fw_freelist_push(&req_free_list, r))
        PyMem_Free(r);
}

/* End of the request for the app: call the iterable's close() (PEP 3333:
 * on every path), detach the objects the app may have kept, free. */
static void req_release(fw_req *r)
{
    if (r->result && !PyList_CheckExact(r->result) && !PyTuple_CheckExact(r->result)) {
        PyObject *close = PyObject_GetAttr(r->result, s_close);
        if (close) {
            PyObject *x = PyObject_CallNoArgs(close);
            Py_DECREF(close);
            if (x)
                Py_DECREF(x);
            else
                log_exception(r->server, "Error closing the response of", r->conn);
        } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
        } else {
            log_exception(r->server, "Error closing the response of", r->conn);
        }
    }
    Py_CLEAR(r->lent);
    Py_CLEAR(r->iter);
    Py_CLEAR(r->result);
    if (r->sr) {
        r->sr->req = NULL;
        Py_CLEAR(r->sr);
    }
    if (r->input) {
        r->input->conn = NULL;
        Py_CLEAR(r->input);
    }
    fw_environ_done(r->server, r);      /* drops it, or keeps it for the next request */
    r->conn->x->app_state = NULL;
    req_free(r);
}

/* The app raised (or returned garbage). Before the head is out: 500. After:
 * the response is broken, close the connection. Never fatal to the server.
 * Returns what to tell the loop (an outcome, fw_server.h). */
static enum fw_app_rc app_failed(fw_req *r, const char *what)
{
    fw_glue *s = r->server;
    fw_conn *c = r->conn;
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        /* SystemExit, KeyboardInterrupt: stop serving and re-raise from
         * serve() (a worker exits with SystemExit's code). sys.exit() in
         * the app is a request to end this process: the requests in flight
         * finish first, this one gets its 500. A KeyboardInterrupt is
         * Ctrl-C landing in the app's code: the server stops now. */
        int now = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        if (tb && v)
            PyException_SetTraceback(v, tb);
        PyObject *msg = request_text(now ? "KeyboardInterrupt in the app: this server stops now;"
                                         : "The app raised SystemExit: this server stops once the requests "
                                           "in flight are done;", c);
        log_error(s, msg, v);
        Py_XDECREF(msg);
        Py_XDECREF(t);
        Py_XDECREF(tb);
        Py_XSETREF(s->pending_exc, v);
        fw_server_stop_for(s->srv, now ? 0 : 1, FW_SB_WHY_APP_EXIT);
    } else {
        log_exception(s, what, c);
    }
    if (c->srv->cfg.stats)
        fw_stats_exception(c->srv->cfg.stats);
    int sent = r->headers_sent;
    req_release(r);
    if (sent)
        return FW_APP_CLOSE;
    fw_conn_queue_error(c, 500);
    return FW_APP_DONE;
}

/* Whole-body size of a list/tuple of bytes, or -1. */
static int64_t known_length(PyObject *seq)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(b))
            return -1;
        total += PyBytes_GET_SIZE(b);
    }
    return total;
}

/* Send the response's next pieces: FW_APP_DONE when all are out or queued,
 * FW_APP_WAIT when the socket is full (on_writable continues), FW_APP_CLOSE
 * when the client is gone or the response broke. */
static enum fw_app_rc iterate(fw_req *r)
{
    fw_conn *c = r->conn;
    if (r->sendfile_pending) {
        /* The loop has finished sending the file: now it may be closed. */
        req_release(r);
        return FW_APP_DONE;
    }
    Py_CLEAR(r->lent);          /* written by the loop before it called us again */
    for (;;) {
        PyObject *chunk;
        if (!r->iter) {
            if (r->index >= PySequence_Fast_GET_SIZE(r->result)) {
                chunk = NULL;
            } else {
                chunk = PySequence_Fast_GET_ITEM(r->result, r->index);
                r->index++;
                Py_INCREF(chunk);
            }
        } else {
            chunk = PyIter_Next(r->iter);
            if (!chunk && PyErr_Occurred())
                return app_failed(r, "Error iterating the response of");
        }
        if (!chunk) {
            if (!r->headers_sent && fw_req_send_head(r, 0) < 0)
                return app_failed(r, "Bad response to");
            fw_resp_finish(c);
            req_release(r);
            return FW_APP_DONE;
        }
        if (!PyBytes_Check(chunk)) {
            PyErr_Format(PyExc_TypeError, "the app must yield bytes, not %.100s", Py_TYPE(chunk)->tp_name);
            Py_DECREF(chunk);
            return app_failed(r, "Bad response to");
        }
        Py_ssize_t n = PyBytes_GET_SIZE(chunk);
        if (n == 0) {
            Py_DECREF(chunk);
            continue;
        }
        if (!r->headers_sent &&
            fw_req_send_head(r, r->iter ? -1 : known_length(r->result)) < 0) {
            Py_DECREF(chunk);
            return app_failed(r, "Bad response to");
        }
        int rc;
        if (!r->iter && n < LEND_MIN) {
            /* Everything is ready: small pieces are queued, and the loop
             * writes them in one go. */
            rc = fw_resp_queue(c, PyBytes_AS_STRING(chunk), (size_t)n);
            Py_DECREF(chunk);
            if (rc == 0 && fw_buf_used(&c->x->out) < QUEUE_HIGH)
                continue;
            if (rc == 0) {
                Py_BEGIN_ALLOW_THREADS
                rc = fw_conn_flush(c);
                Py_END_ALLOW_THREADS
            }
        } else if (r->iter && n < LEND_MIN && fw_resp_completes(c, (size_t)n) && fw_conn_may_defer(c)) {
            /* The body's last bytes (its Content-Length reached), inline,
             * with more of this loop pass to come: queued, to be written
             * with the responses finished after it at the end of the pass
             * (fw_server_defer). As after a full socket, the iterable is
             * asked for more, and closed, once they are written. */
            rc = fw_resp_queue(c, PyBytes_AS_STRING(chunk), (size_t)n);
            Py_DECREF(chunk);
            if (rc == 0)
                return FW_APP_WAIT;
        } else {
            /* PEP 3333: each yielded chunk goes out before the next is
             * asked for. What the socket does not take now is lent to the
             * connection, not copied: the chunk is kept until the loop has
             * written it, so a slow reader of a big body costs no copy. */
            Py_BEGIN_ALLOW_THREADS
            rc = fw_conn_send_borrowed(c, PyBytes_AS_STRING(chunk), (size_t)n);
            Py_END_ALLOW_THREADS
            if (rc == FW_AGAIN)
                r->lent = chunk;
            else
                Py_DECREF(chunk);
        }
        if (rc == FW_AGAIN)
            return FW_APP_WAIT;
        if (rc < 0) {
            req_release(r);     /* client gone: close() still runs */
            return FW_APP_CLOSE;
        }
    }
}

/* An outcome: what try_sendfile did with a wsgi.file_wrapper. */
enum sendfile_plan {
    SENDFILE_FAILED = -1,   /* the head could not be sent (a Python error is set) */
    SENDFILE_ITERATE = 0,   /* not a real regular file: iterate it instead */
    SENDFILE_SET = 1        /* the head is queued and the file follows by sendfile */
};

/* wsgi.file_wrapper over a real regular file: sendfile from its current
 * position. */
static enum sendfile_plan try_sendfile(fw_req *r)
{
    FileWrapperObject *fwo = (FileWrapperObject *)r->result;
    if (!fwo->filelike)
        return SENDFILE_ITERATE;
    PyObject *fo = PyObject_CallMethodNoArgs(fwo->filelike, s_fileno);
    if (!fo) {
        PyErr_Clear();
        return SENDFILE_ITERATE;
    }
    long fd = PyLong_AsLong(fo);
    Py_DECREF(fo);
    if (fd < 0) {
        PyErr_Clear();
        return SENDFILE_ITERATE;
    }
    struct stat st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fstat((int)fd, &st);
    Py_END_ALLOW_THREADS
    /* procfs and sysfs files say size 0: only real regular files qualify. */
    if (rc != 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
        return SENDFILE_ITERATE;
    /* The file object's position, not the fd's: a buffered reader may have
     * read ahead. */
    long long pos = -1;
    PyObject *t = PyObject_CallMethodNoArgs(fwo->filelike, s_tell);
    if (t) {
        pos = PyLong_AsLongLong(t);
        Py_DECREF(t);
    }
    if (pos < 0) {
        PyErr_Clear();
        Py_BEGIN_ALLOW_THREADS
        pos = lseek((int)fd, 0, SEEK_CUR);
        Py_END_ALLOW_THREADS
        if (pos < 0)
            return SENDFILE_ITERATE;
    }
    uint64_t count = st.st_size > pos ? (uint64_t)(st.st_size - pos) : 0;
    if (fw_req_send_head(r, (int64_t)count) < 0)
        return SENDFILE_FAILED;
    fw_resp_sendfile(r->conn, (int)fd, (uint64_t)pos, count);
    fw_resp_finish(r->conn);
    r->sendfile_pending = 1;
    return SENDFILE_SET;
}

static enum fw_app_rc on_request(void *app, fw_conn *c)
{
    fw_glue *s = app;
    uint64_t began = fw_status_enter(s, c, 1);
    gil_take(s, c);
    enum fw_app_rc rc;
    fw_req *r = req_alloc();
    if (!r) {
        fw_conn_queue_error(c, 500);
        rc = FW_APP_DONE;
        goto out;
    }
    r->server = s;
    r->conn = c;
    c->x->app_state = r;
    r->sr = fw_start_response_new(r);
    r->input = fw_input_new(c);
    int status = 0;
    r->environ = r->sr && r->input ? fw_environ_build(s, c, &status, &r->env_keys) : NULL;
    if (status) {
        req_release(r);         /* said in the log */
        fw_conn_queue_error(c, status);
        rc = FW_APP_DONE;
        goto out;
    }
    if (!r->environ || PyDict_SetItem(r->environ, s_wsgi_input, (PyObject *)r->input) < 0) {
        rc = app_failed(r, "Cannot build the environ for");
        goto out;
    }
    fw_environ_seal(r);
    PyObject *args[2] = { r->environ, (PyObject *)r->sr };
    r->result = PyObject_Vectorcall(s->app, args, 2, NULL);
    if (!r->result) {
        rc = app_failed(r, "Error handling request");
        goto out;
    }
    if (Py_IS_TYPE(r->result, &FileWrapper_Type)) {
        enum sendfile_plan k = try_sendfile(r);
        if (k == SENDFILE_FAILED) {
            rc = app_failed(r, "Bad response to");
            goto out;
        }
        if (k == SENDFILE_SET) {
            rc = FW_APP_WAIT;
            goto out;
        }
    }
    if (!PyList_CheckExact(r->result) && !PyTuple_CheckExact(r->result)) {
        r->iter = PyObject_GetIter(r->result);
        if (!r->iter) {
            rc = app_failed(r, "The app returned a non-iterable for");
            goto out;
        }
    }
    rc = iterate(r);
out:
    gil_leave(s, c);
    fw_status_leave(s, c, began);
    return rc;
}

static enum fw_app_rc on_writable(void *app, fw_conn *c)
{
    fw_glue *s = app;
    uint64_t began = fw_status_enter(s, c, 0);
    gil_take(s, c);
    enum fw_app_rc rc = iterate(c->x->app_state);
    gil_leave(s, c);
    fw_status_leave(s, c, began);
    return rc;
}

/* The connection goes while the app holds its request: the iterable's
 * close() (PEP 3333) is the app's code and its time, on the thread that
 * runs the app (a pool thread, or inline the loop thread). */
static void on_drop(void *app, fw_conn *c)
{
    fw_glue *s = app;
    uint64_t began = fw_status_enter(s, c, 0);
    PyGILState_STATE g = PyGILState_Ensure();     /* (inline, it may be held already: a batch's) */
    req_release(c->x->app_state);
    PyGILState_Release(g);
    fw_status_leave(s, c, began);
}

static int on_signal(void *app)
{
    fw_glue *s = app;
    on_unlock(s);               /* (never kept here: the loop is between connections) */
    PyEval_RestoreThread(s->tstate);
    int stop = PyErr_CheckSignals() < 0;
    PyEval_SaveThread();
    return stop;
}

static void on_log(void *app, int level, const char *msg)
{
    fw_logq_put(app, level, msg);
}

/* A pool thread gets a Python thread state for its whole life (threading
 * locals and the like persist across requests); it holds the GIL only
 * inside the calls above. A new thread's PyGILState_Ensure is always
 * PyGILState_UNLOCKED, so that is what thread_stop releases. */
static void thread_start(void *app, fw_thread *t)
{
    fw_glue *s = app;
    PyGILState_Ensure();
    if (s->thread_name) {
        /* threading sees a C thread as "Dummy-N": give it a name that says
         * whose it is, for log records and stack dumps. */
        PyObject *threading = PyImport_ImportModule("threading");
        PyObject *me = threading ? PyObject_CallMethod(threading, "current_thread", NULL) : NULL;
        PyObject *name = PyUnicode_FromFormat("%U thread %d", s->thread_name, t->index + 1);
        if (!me || !name || PyObject_SetAttrString(me, "name", name) < 0)
            PyErr_Clear();
        Py_XDECREF(name);
        Py_XDECREF(me);
        Py_XDECREF(threading);
    }
    t->app_ctx = PyEval_SaveThread();
}

static void thread_stop(void *app, fw_thread *t)
{
    (void)app;
    PyEval_RestoreThread(t->app_ctx);
    t->app_ctx = NULL;
    PyGILState_Release(PyGILState_UNLOCKED);
}

const fw_app_ops fw_glue_ops = {
    .on_request = on_request,
    .on_writable = on_writable,
    .on_drop = on_drop,
    .on_signal = on_signal,
    .unlock = on_unlock,
    .thread_start = thread_start,
    .thread_stop = thread_stop,
    .log = on_log,
};
