/* wsgi.input: a stream over the request body, de-chunked.
 *
 * Reads come from the core's body reader (fw_body_peek/consume): a span of
 * the connection buffer or of a spool file. The loop has read the whole
 * body from the client before the app runs: reading it here never waits
 * for a client. */
#include "glue.h"

#include <string.h>

static int check(InputObject *self)
{
    if (!self->conn) {
        PyErr_SetString(PyExc_ValueError, "wsgi.input used after the request ended");
        return -1;
    }
    return 0;
}

/* Peek at the next span: with the GIL held for a span in memory, without
 * it when the spool file is read. */
static int peek(InputObject *self, const char **p, size_t *n)
{
    fw_conn *c = self->conn;
    int rc;
    if (fw_body_ready(c)) {
        rc = fw_body_peek(c, p, n);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = fw_body_peek(c, p, n);
        Py_END_ALLOW_THREADS
    }
    if (rc < 0) {
        PyErr_SetString(PyExc_OSError, "cannot read the request body's spool file");
        return -1;
    }
    return 0;
}

static int size_arg(PyObject *arg, Py_ssize_t *size)
{
    *size = -1;
    if (arg == NULL || arg == Py_None)
        return 0;
    *size = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (*size == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

/* Read up to `size` bytes (all when < 0), stopping after a newline if
 * `line`. */
static PyObject *read_impl(InputObject *self, Py_ssize_t size, int line)
{
    if (check(self) < 0)
        return NULL;
    const char *p;
    size_t n;
    if (size == 0)
        return PyBytes_FromStringAndSize(NULL, 0);
    if (peek(self, &p, &n) < 0)
        return NULL;
    /* Fast path: the answer is within one span (always, for in-memory bodies). */
    if (n == 0)
        return PyBytes_FromStringAndSize(NULL, 0);
    size_t take = size < 0 ? n : ((size_t)size < n ? (size_t)size : n);
    int complete = (size >= 0 && (size_t)size == take) || self->conn->x->body.src == FW_B_MEM;
    if (line) {
        const char *nl = memchr(p, '\n', take);
        if (nl) {
            take = (size_t)(nl - p) + 1;
            complete = 1;
        }
    }
    if (complete) {
        PyObject *b = PyBytes_FromStringAndSize(p, (Py_ssize_t)take);
        if (b)
            fw_body_consume(self->conn, take);
        return b;
    }
    /* General case: gather spans. */
    PyObject *acc = PyByteArray_FromStringAndSize(NULL, 0);
    if (!acc)
        return NULL;
    for (;;) {
        if (peek(self, &p, &n) < 0)
            goto fail;
        if (n == 0)
            break;
        Py_ssize_t have = PyByteArray_GET_SIZE(acc);
        size_t want = size < 0 ? n : (size_t)(size - have);
        size_t take = want < n ? want : n;
        int done = 0;
        if (line) {
            const char *nl = memchr(p, '\n', take);
            if (nl) {
                take = (size_t)(nl - p) + 1;
                done = 1;
            }
        }
        if (PyByteArray_Resize(acc, have + (Py_ssize_t)take) < 0)
            goto fail;
        memcpy(PyByteArray_AS_STRING(acc) + have, p, take);
        fw_body_consume(self->conn, take);
        if (done || (size >= 0 && PyByteArray_GET_SIZE(acc) >= size))
            break;
    }
    PyObject *b = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(acc), PyByteArray_GET_SIZE(acc));
    Py_DECREF(acc);
    return b;
fail:
    Py_DECREF(acc);
    return NULL;
}

static PyObject *in_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t size;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "read() takes at most 1 argument");
        return NULL;
    }
    if (size_arg(nargs ? args[0] : NULL, &size) < 0)
        return NULL;
    return read_impl((InputObject *)self, size, 0);
}

static PyObject *in_readline(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t size;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "readline() takes at most 1 argument");
        return NULL;
    }
    if (size_arg(nargs ? args[0] : NULL, &size) < 0)
        return NULL;
    return read_impl((InputObject *)self, size, 1);
}

static PyObject *in_readlines(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t hint;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "readlines() takes at most 1 argument");
        return NULL;
    }
    if (size_arg(nargs ? args[0] : NULL, &hint) < 0)
        return NULL;
    PyObject *lines = PyList_New(0);
    if (!lines)
        return NULL;
    Py_ssize_t total = 0;
    for (;;) {
        PyObject *l = read_impl((InputObject *)self, -1, 1);
        if (!l)
            goto fail;
        Py_ssize_t n = PyBytes_GET_SIZE(l);
        if (n == 0) {
            Py_DECREF(l);
            break;
        }
        int rc = PyList_Append(lines, l);
        Py_DECREF(l);
        if (rc < 0)
            goto fail;
        total += n;
        if (hint > 0 && total >= hint)
            break;
    }
    return lines;
fail:
    Py_DECREF(lines);
    return NULL;
}

static PyObject *in_iter(PyObject *self)
{
    Py_INCREF(self);
    return self;
}

static PyObject *in_next(PyObject *self)
{
    PyObject *l = read_impl((InputObject *)self, -1, 1);
    if (l && PyBytes_GET_SIZE(l) == 0) {
        Py_DECREF(l);
        return NULL;
    }
    return l;
}

static fw_freelist in_free;          /* dead Input objects (one per request) */

static void in_dealloc(PyObject *self)
{
    if (!fw_freelist_push(&in_free, self))
        PyObject_Free(self);
}

static PyMethodDef in_methods[] = {
    { "read", (PyCFunction)(void (*)(void))in_read, METH_FASTCALL, "read([size]) -> bytes" },
    { "readline", (PyCFunction)(void (*)(void))in_readline, METH_FASTCALL, "readline([size]) -> bytes" },
    { "readlines", (PyCFunction)(void (*)(void))in_readlines, METH_FASTCALL, "readlines([hint]) -> list" },
    { NULL, NULL, 0, NULL },
};

PyTypeObject Input_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkwsgi._forkwsgi.Input",
    .tp_basicsize = sizeof(InputObject),
    .tp_dealloc = in_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = in_iter,
    .tp_iternext = in_next,
    .tp_methods = in_methods,
    .tp_doc = "wsgi.input: the request body stream",
};

InputObject *fw_input_new(fw_conn *c)
{
    InputObject *in = (InputObject *)fw_freelist_new(&in_free, &Input_Type);
    if (in)
        in->conn = c;
    return in;
}
