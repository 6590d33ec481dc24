/* start_response: the callable passed to the app (PEP 3333), and write().
 *
 * Status and headers are validated and queued here, when the app calls it,
 * so a bad value raises in the app's own frame; CR, LF and NUL can never
 * reach the wire (a split response). The head is ended (framing, Date,
 * Server), and so may be written, only when the first body bytes (or the
 * end of the body) are ready: until then a start_response with exc_info
 * replaces it (PEP 3333), and an error drops it for a 500. */
#include "glue.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

static int valid_status(const char *s, Py_ssize_t n)
{
    /* "NNN Reason": three digits, a space, then printable text. */
    if (n < 4 || s[3] != ' ')
        return 0;
    for (int i = 0; i < 3; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    if (s[0] < '1' || s[0] > '5')
        return 0;
    for (Py_ssize_t i = 4; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return 0;
    }
    return 1;
}

/* A token (RFC 9110 5.6.2). The classes of four bytes at a time are
 * AND-ed, with no branch a byte: names are short, and nearly always good. */
static int valid_name(const char *s, Py_ssize_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned char all = FW_HTTP_C_TCHAR;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        all &= fw_http_cls[u[i]] & fw_http_cls[u[i + 1]] & fw_http_cls[u[i + 2]] & fw_http_cls[u[i + 3]];
    for (; i < n; i++)
        all &= fw_http_cls[u[i]];
    return n > 0 && (all & FW_HTTP_C_TCHAR);
}

/* A header value: no control character but HTAB (so no CR, LF, NUL),
 * checked eight bytes at a time as the parser checks a request's
 * (fw_http_fval_span). Values are the bulk of what a response's headers
 * hold (cookies, content types). */
static int valid_value(const char *s, Py_ssize_t n)
{
    return fw_http_fval_span(s, (size_t)n) == (size_t)n;
}

/* latin1_view's errors, out of its way. */
static __attribute__((noinline, cold)) int latin1_error(PyObject *o, const char *what)
{
    if (!PyUnicode_Check(o))
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(o)->tp_name);
    else
        PyErr_Format(PyExc_ValueError, "%s is not latin-1: %R", what, o);
    return -1;
}

/* The characters of str o as latin-1 bytes, in place: a str whose
 * characters all fit in one byte stores them as those bytes (PEP 393), and
 * any other kind holds a character above U+00FF. 0, or -1 with TypeError
 * (not a str) or ValueError (not latin-1) set. Inline: it runs for the
 * status and each header's name and value. */
static inline int latin1_view(PyObject *o, const char *what, const char **p, Py_ssize_t *n)
{
    if (!PyUnicode_Check(o))
        return latin1_error(o, what);
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(o) < 0)
        return -1;
#endif
    if (PyUnicode_KIND(o) != PyUnicode_1BYTE_KIND)
        return latin1_error(o, what);
    *p = (const char *)PyUnicode_1BYTE_DATA(o);
    *n = PyUnicode_GET_LENGTH(o);
    return 0;
}

/* One of the app's headers: a (name, value) tuple of latin-1 strs, the
 * name a token, the value without control characters but HTAB; their
 * bytes in place. 0, or -1 with TypeError or ValueError set. */
static inline int header_item(PyObject *item, const char **k, Py_ssize_t *kn, const char **v, Py_ssize_t *vn)
{
    *k = *v = NULL;
    *kn = *vn = 0;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        PyErr_Format(PyExc_TypeError, "header must be a (name, value) tuple, not %R", item);
        return -1;
    }
    if (latin1_view(PyTuple_GET_ITEM(item, 0), "header name", k, kn) < 0 ||
        latin1_view(PyTuple_GET_ITEM(item, 1), "header value", v, vn) < 0)
        return -1;
    if (!valid_name(*k, *kn) || !valid_value(*v, *vn)) {
        PyErr_Format(PyExc_ValueError, "invalid header: %R", item);
        return -1;
    }
    return 0;
}

static PyObject *sr_write(PyObject *self_, PyObject *arg);
static WriterObject *writer_of(StartResponseObject *sr);

static PyObject *sr_start(StartResponseObject *self, PyObject *status, PyObject *headers, PyObject *exc_info)
{
    if (!self->req) {
        PyErr_SetString(PyExc_RuntimeError, "start_response() called after the request ended");
        return NULL;
    }
    if (exc_info != Py_None) {
        if (self->req->headers_sent) {
            /* PEP 3333: too late to change the response; re-raise. */
            if (!PyTuple_Check(exc_info) || PyTuple_GET_SIZE(exc_info) != 3) {
                PyErr_SetString(PyExc_TypeError, "exc_info must be a 3-tuple");
                return NULL;
            }
            PyObject *t = PyTuple_GET_ITEM(exc_info, 0), *v = PyTuple_GET_ITEM(exc_info, 1),
                     *tb = PyTuple_GET_ITEM(exc_info, 2);
            Py_INCREF(t);
            Py_INCREF(v);
            Py_INCREF(tb);
            PyErr_Restore(t, v, tb == Py_None ? NULL : tb);
            if (tb == Py_None)
                Py_DECREF(tb);
            return NULL;
        }
    } else if (self->called) {
        PyErr_SetString(PyExc_AssertionError, "start_response() called twice without exc_info");
        return NULL;
    }

    const char *p = NULL;
    Py_ssize_t len = 0;
    if (latin1_view(status, "status", &p, &len) < 0)
        return NULL;
    if (!valid_status(p, len)) {
        PyErr_Format(PyExc_ValueError, "invalid status line: %R", status);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(headers, "headers must be a list of (name, value) tuples");
    if (!seq)
        return NULL;
    /* The head is queued now, checked as it goes; fw_req_send_head ends it
     * (framing, Date, Server) when the body's first bytes or its end are
     * ready, and the loop writes nothing of it before. So no copy of the
     * app's list is kept, and a bad value raises here, in the app's frame.
     *
     * A call with exc_info replaces a head an earlier call queued. Its
     * headers are all checked first: a bad one raises with the earlier head
     * still in place, as if this call had not been made (the app may catch
     * the error and answer with it). Only a bad or second Content-Length is
     * seen as the new head is queued; the earlier one is gone by then, so
     * that failure leaves no head at all (the app did not call
     * start_response, as far as the response goes: a 500). */
    fw_conn *c = self->req->conn;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const char *k, *v;
    Py_ssize_t kn, vn;
    if (c->x->resp.head_open) {
        for (Py_ssize_t i = 0; i < n; i++)
            if (header_item(PySequence_Fast_GET_ITEM(seq, i), &k, &kn, &v, &vn) < 0) {
                Py_DECREF(seq);
                return NULL;
            }
        fw_resp_abort_head(c);
        self->called = 0;
    }
    if (fw_resp_begin(c, p, (size_t)len) < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (header_item(item, &k, &kn, &v, &vn) < 0)
            goto fail;
        int rc = fw_resp_header_checked(c, k, (size_t)kn, v, (size_t)vn);
        if (rc == -ENOMEM) {
            PyErr_NoMemory();
            goto fail;
        }
        if (rc < 0) {
            PyErr_Format(PyExc_ValueError, "invalid or duplicate response header %R", item);
            goto fail;
        }
    }
    Py_DECREF(seq);
    self->called = 1;
    return (PyObject *)writer_of(self);
fail:
    fw_resp_abort_head(c);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *sr_call(PyObject *self_, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = { "status", "headers", "exc_info", NULL };
    PyObject *status, *headers, *exc_info = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O:start_response", kwlist, &status, &headers, &exc_info))
        return NULL;
    return sr_start((StartResponseObject *)self_, status, headers, exc_info);
}

/* The usual call, start_response(status, headers[, exc_info]) by position,
 * with no argument tuple; keywords go the tp_call way. */
static PyObject *sr_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!kwnames && (nargs == 2 || nargs == 3))
        return sr_start((StartResponseObject *)self_, args[0], args[1], nargs == 3 ? args[2] : Py_None);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *tuple = PyTuple_New(nargs), *kw = nkw ? PyDict_New() : NULL, *res = NULL;
    if (!tuple || (nkw && !kw))
        goto out;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(tuple, i, args[i]);
    }
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
            goto out;
    res = sr_call(self_, tuple, kw);
out:
    Py_XDECREF(tuple);
    Py_XDECREF(kw);
    return res;
}

/* write(data): the legacy imperative API. The bytes leave at once when the
 * socket takes them; what it does not take is queued, and the loop writes
 * it (after the app returns, if not before). Past WRITE_BUFFER queued, an
 * app thread waits while the loop writes (under the write timeout, which
 * counts no progress; no app time for --timeout; a spare thread serves in
 * its place meanwhile); inline, the loop thread must not wait for one
 * client, so it queues up to INLINE_WRITE_MAX for one connection and
 * INLINE_WRITE_BUDGET for all of them: past either, write() raises. */
#define WRITE_BUFFER ((size_t)1 << 20)
#define INLINE_WRITE_MAX ((size_t)64 << 20)
#define INLINE_WRITE_BUDGET ((size_t)128 << 20)

static PyObject *sr_write(PyObject *self_, PyObject *arg)
{
    StartResponseObject *self = (StartResponseObject *)self_;
    fw_req *r = self->req;
    if (!r) {
        PyErr_SetString(PyExc_RuntimeError, "write() called after the request ended");
        return NULL;
    }
    if (!self->called) {
        PyErr_SetString(PyExc_AssertionError, "write() called before start_response()");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (!r->headers_sent && fw_req_send_head(r, -1) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    fw_conn *c = r->conn;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fw_conn_send(c, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc == FW_AGAIN && c->srv->pool && fw_buf_used(&c->x->out) > WRITE_BUFFER) {
        fw_pause pause;
        fw_status_pause(r->server, c, &pause);
        Py_BEGIN_ALLOW_THREADS
        rc = fw_conn_drain_wait(c);
        Py_END_ALLOW_THREADS
        fw_status_resume(r->server, c, &pause);
    } else if (rc == FW_AGAIN) {
        size_t all = c->srv->pool ? 0 : fw_conn_charge_write(c);
        if (!c->srv->pool && (fw_buf_used(&c->x->out) > INLINE_WRITE_MAX || all > INLINE_WRITE_BUDGET)) {
            PyErr_Format(PyExc_OSError, "clients are not reading: %zu MiB of write() output queued for this "
                         "one, %zu MiB for all (with --threads 1 the loop cannot wait for a client; with app "
                         "threads write() waits)", fw_buf_used(&c->x->out) >> 20, all >> 20);
            return NULL;
        }
        rc = 0;
    }
    if (rc < 0) {
        PyErr_SetString(PyExc_OSError, rc == -ETIMEDOUT ? "client stopped reading (write timeout)"
                                                           : "client disconnected");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- write(), the callable start_response returns ------------------------
 *
 * One per StartResponse, made at its first start_response and kept with it
 * across requests (see the free list below). It points back at its
 * StartResponse without a reference (a reference each way would be a
 * cycle); the StartResponse clears that pointer when it lets the writer go,
 * so a writer the app kept raises instead of writing. */

static PyObject *wr_vectorcall(PyObject *self_, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    WriterObject *self = (WriterObject *)self_;
    if (kwnames || PyVectorcall_NARGS(nargsf) != 1) {
        PyErr_SetString(PyExc_TypeError, "write() takes exactly one argument (the bytes to send)");
        return NULL;
    }
    if (!self->sr) {
        PyErr_SetString(PyExc_RuntimeError, "write() called after the request ended");
        return NULL;
    }
    /* sr_write releases the GIL: hold sr for the call. */
    PyObject *sr = Py_NewRef((PyObject *)self->sr);
    PyObject *res = sr_write(sr, args[0]);
    Py_DECREF(sr);
    return res;
}

static void wr_dealloc(PyObject *self)
{
    PyObject_Free(self);
}

PyTypeObject Writer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkwsgi._forkwsgi.Writer",
    .tp_basicsize = sizeof(WriterObject),
    .tp_dealloc = wr_dealloc,
    .tp_vectorcall_offset = offsetof(WriterObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "write(data): send body bytes now (PEP 3333 legacy API)",
};

/* sr's writer (a new reference), made on first use. */
static WriterObject *writer_of(StartResponseObject *sr)
{
    if (!sr->writer) {
        WriterObject *w = PyObject_New(WriterObject, &Writer_Type);
        if (!w)
            return NULL;
        w->vectorcall = wr_vectorcall;
        w->sr = sr;
        sr->writer = w;
    }
    Py_INCREF(sr->writer);
    return sr->writer;
}

/* A StartResponse is made for every request; most die with it. The dead
 * ones go to a free list with their writer (when the app kept no reference
 * to it), so the next request allocates neither. */
static fw_freelist sr_free;

static void sr_dealloc(PyObject *self_)
{
    StartResponseObject *self = (StartResponseObject *)self_;
    if (self->writer && Py_REFCNT(self->writer) > 1) {
        self->writer->sr = NULL;       /* kept by the app: it raises from now on */
        Py_CLEAR(self->writer);
    }
    if (fw_freelist_push(&sr_free, self))
        return;
    if (self->writer) {
        self->writer->sr = NULL;
        Py_CLEAR(self->writer);
    }
    PyObject_Free(self);
}

static PyMethodDef sr_methods[] = {
    { "write", sr_write, METH_O, "write(data): send body bytes now (PEP 3333 legacy API)" },
    { NULL, NULL, 0, NULL },
};

PyTypeObject StartResponse_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkwsgi._forkwsgi.StartResponse",
    .tp_basicsize = sizeof(StartResponseObject),
    .tp_dealloc = sr_dealloc,
    .tp_vectorcall_offset = offsetof(StartResponseObject, vectorcall),
    .tp_call = sr_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_methods = sr_methods,
    .tp_doc = "start_response(status, headers, exc_info=None) for one request",
};

StartResponseObject *fw_start_response_new(fw_req *r)
{
    int reused = sr_free.n > 0;
    StartResponseObject *sr = (StartResponseObject *)fw_freelist_new(&sr_free, &StartResponse_Type);
    if (!sr)
        return NULL;
    if (!reused)
        sr->writer = NULL;
    sr->vectorcall = sr_vectorcall;
    sr->req = r;
    sr->called = 0;
    return sr;
}

int fw_req_send_head(fw_req *r, int64_t known_len)
{
    if (!r->sr->called) {
        PyErr_SetString(PyExc_RuntimeError, "the app did not call start_response()");
        return -1;
    }
    /* The status line and the app's headers are queued (sr_start). */
    fw_conn *c = r->conn;
    if (fw_resp_end_head(c, known_len) < 0) {
        fw_resp_abort_head(c);
        PyErr_NoMemory();
        return -1;
    }
    r->headers_sent = 1;
    return 0;
}
