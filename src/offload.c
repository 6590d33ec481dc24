/* offload: forkwsgi.offload(topic, value, key=None) and its set-up in a
 * worker. The record is framed and handed over by cserver/fw_offload.c in
 * one non-blocking sendmsg, with the GIL released: no pickling, no helper
 * thread. One producer per process (the module state below): a worker
 * process has one queue, shared by all its threads. */
#include "glue.h"
#include "fw_offload.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

typedef struct {
    fw_offload ofl;
    Py_buffer counters;          /* shared counters (fw_offload_counters), buf NULL if private */
    PyObject *on_drop;           /* called with the topic and errno of each dropped record (it logs) */
    int ready;                   /* read and written under the GIL */
    _Atomic int calls;           /* offload() calls inside fw_offload_send (without the GIL) */
} offload_state;

/* The process's producer: set up once in each worker, after fork. */
static offload_state g_offload;

/* Stop new calls, wait (without the GIL) for those already sending, then
 * free the producer: a thread in fw_offload_send must never find its
 * socket, mutex or counters gone. Called with the GIL. */
static void forget_producer(void)
{
    if (!g_offload.ready)
        return;
    g_offload.ready = 0;
    if (atomic_load(&g_offload.calls) > 0) {
        Py_BEGIN_ALLOW_THREADS
        struct timespec pause = { 0, 1000000 };
        while (atomic_load(&g_offload.calls) > 0)
            nanosleep(&pause, NULL);
        Py_END_ALLOW_THREADS
    }
    fw_offload_destroy(&g_offload.ofl);
    if (g_offload.counters.buf)
        PyBuffer_Release(&g_offload.counters);
    g_offload.counters.buf = NULL;
}

static PyObject *offload_setup(PyObject *mod, PyObject *args, PyObject *kwds)
{
    (void)mod;
    static char *kwlist[] = { "sock", "overflow", "block_ms", "max_record", "spill_dir", "spill_max",
                              "counters", "on_drop", NULL };
    int sock, overflow, block_ms;
    Py_ssize_t max_record;
    unsigned long long spill_max = UINT64_MAX;
    const char *spill_dir;
    PyObject *counters = Py_None, *on_drop = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiinz|KOO:offload_setup", kwlist, &sock, &overflow,
                                     &block_ms, &max_record, &spill_dir, &spill_max, &counters, &on_drop))
        return NULL;
    if (overflow < FW_OFL_BLOCK || overflow > FW_OFL_SPILL || max_record < (Py_ssize_t)sizeof(fw_offload_hdr) + 1) {
        PyErr_SetString(PyExc_ValueError, "bad offload settings");
        return NULL;
    }
    forget_producer();
    fw_offload_counters *shared = NULL;
    if (counters != Py_None) {
        if (PyObject_GetBuffer(counters, &g_offload.counters, PyBUF_WRITABLE) < 0)
            return NULL;
        if (g_offload.counters.len < (Py_ssize_t)sizeof(fw_offload_counters) ||
            ((uintptr_t)g_offload.counters.buf & 7)) {
            PyBuffer_Release(&g_offload.counters);
            g_offload.counters.buf = NULL;
            PyErr_SetString(PyExc_ValueError, "counters: a writable, 8-aligned buffer of 64 bytes");
            return NULL;
        }
        shared = g_offload.counters.buf;
    }
    if (fw_offload_init(&g_offload.ofl, sock, overflow, block_ms, (size_t)max_record, spill_dir,
                        (uint64_t)spill_max, shared) != 0) {
        if (g_offload.counters.buf)
            PyBuffer_Release(&g_offload.counters);
        g_offload.counters.buf = NULL;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_XSETREF(g_offload.on_drop, on_drop == Py_None ? NULL : Py_NewRef(on_drop));
    g_offload.ready = 1;
    Py_RETURN_NONE;
}

/* bytes as is; str as UTF-8. */
static int as_bytes(PyObject *o, const char *what, PyObject **keep, const char **p, Py_ssize_t *n)
{
    if (PyBytes_Check(o)) {
        *p = PyBytes_AS_STRING(o);
        *n = PyBytes_GET_SIZE(o);
        return 0;
    }
    if (PyUnicode_Check(o)) {
        *p = PyUnicode_AsUTF8AndSize(o, n);
        if (!*p)
            return -1;
        *keep = o;
        return 0;
    }
    if (PyByteArray_Check(o) || PyMemoryView_Check(o)) {
        *keep = PyBytes_FromObject(o);      /* a copy: the caller may change it meanwhile */
        if (!*keep)
            return -1;
        *p = PyBytes_AS_STRING(*keep);
        *n = PyBytes_GET_SIZE(*keep);
        return 1;
    }
    PyErr_Format(PyExc_TypeError, "offload(): %s must be bytes or str, not %.100s", what, Py_TYPE(o)->tp_name);
    return -1;
}

static PyObject *offload_call(PyObject *mod, PyObject *args, PyObject *kwds)
{
    (void)mod;
    static char *kwlist[] = { "topic", "value", "key", NULL };
    PyObject *topic, *value, *key = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UO|O:offload", kwlist, &topic, &value, &key))
        return NULL;
    if (!g_offload.ready) {
        PyErr_SetString(PyExc_RuntimeError,
                        "offload() needs the offload sibling: start forkwsgi with --offload-sink");
        return NULL;
    }
    Py_ssize_t tlen, vlen = 0, klen = 0;
    const char *t = PyUnicode_AsUTF8AndSize(topic, &tlen);
    if (!t)
        return NULL;
    if (!fw_offload_topic_ok(t, (size_t)tlen)) {
        PyErr_Format(PyExc_ValueError, "offload(): %R is not a valid Kafka topic name "
                                       "(1 to 249 of A-Z a-z 0-9 . _ -, not . or ..)", topic);
        return NULL;
    }
    PyObject *vkeep = NULL, *kkeep = NULL;
    const char *v, *k = NULL;
    int vown = as_bytes(value, "value", &vkeep, &v, &vlen);
    if (vown < 0)
        return NULL;
    int kown = 0;
    if (key != Py_None) {
        kown = as_bytes(key, "key", &kkeep, &k, &klen);
        if (kown < 0) {
            if (vown > 0)
                Py_DECREF(vkeep);
            return NULL;
        }
    }
    /* str/bytes objects are immutable: their buffers stay put without the GIL
     * while this call holds its references. */
    Py_INCREF(value);
    Py_XINCREF(key);
    int rc, err;
    atomic_fetch_add(&g_offload.calls, 1);       /* under the GIL: teardown waits for it */
    Py_BEGIN_ALLOW_THREADS
    rc = fw_offload_send(&g_offload.ofl, t, (size_t)tlen, k, (size_t)klen, v, (size_t)vlen);
    err = errno;
    Py_END_ALLOW_THREADS
    atomic_fetch_sub(&g_offload.calls, 1);
    Py_DECREF(value);
    Py_XDECREF(key);
    if (vown > 0)
        Py_DECREF(vkeep);
    if (kown > 0)
        Py_DECREF(kkeep);
    switch (rc) {
    case FW_OFL_OK:
    case FW_OFL_SPILLED:
        Py_RETURN_TRUE;
    case FW_OFL_DROPPED:
        /* Counted in C; never silent: the callback logs (rate-limited). */
        if (g_offload.on_drop) {
            PyObject *x = PyObject_CallFunction(g_offload.on_drop, "Oi", topic, err);
            if (!x)
                return NULL;
            Py_DECREF(x);
        }
        Py_RETURN_FALSE;
    case FW_OFL_ETOOBIG:
        PyErr_Format(PyExc_ValueError, "offload(): the record is larger than --offload-max-record (%zu bytes)",
                     g_offload.ofl.max_record);
        return NULL;
    case FW_OFL_EINVAL:
        PyErr_SetString(PyExc_ValueError, "offload(): invalid record");
        return NULL;
    default:
        return PyErr_SetFromErrno(PyExc_OSError);
    }
}

static PyObject *offload_teardown(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    forget_producer();
    Py_CLEAR(g_offload.on_drop);
    Py_RETURN_NONE;
}

/* offload_take(sock, journal_fd, buf, limit, max_bytes, skip) -> (records, state, bad)
 * The sibling's reading loop (fw_offload_take) without a Python round
 * trip per syscall. records: (topic, key, value, ts, pid, seq, size,
 * fresh) tuples in queue order (fresh: not the predecessor's last, which
 * it journaled); state: "empty", "eof" or "more"; bad: malformed records
 * dropped. journal_fd -1: take records off without journaling them. skip:
 * None or the (pid, seq) journaled last by a predecessor. An error with
 * records taken ends the call early ("more"); with none it raises OSError
 * (the record that failed stays queued). */
static PyObject *offload_take(PyObject *mod, PyObject *args)
{
    (void)mod;
    int sock, jfd;
    Py_buffer buf;
    Py_ssize_t limit, max_bytes;
    PyObject *skip_obj;
    if (!PyArg_ParseTuple(args, "iiw*nnO:offload_take", &sock, &jfd, &buf, &limit, &max_bytes, &skip_obj))
        return NULL;
    uint32_t skip[2];
    int have_skip = 0;
    if (skip_obj != Py_None) {
        unsigned long pid, seq;
        if (!PyArg_ParseTuple(skip_obj, "kk:skip", &pid, &seq)) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        skip[0] = (uint32_t)pid;
        skip[1] = (uint32_t)seq;
        have_skip = 1;
    }
    PyObject *list = PyList_New(0);
    const char *state = "more";
    long bad = 0;
    Py_ssize_t bytes = 0;
    while (list && PyList_GET_SIZE(list) < limit && bytes < max_bytes) {
        int fresh;
        long r = fw_offload_take(sock, jfd, buf.buf, (size_t)buf.len, have_skip ? skip : NULL, &fresh);
        if (r == FW_OFL_TAKE_EMPTY || r == FW_OFL_TAKE_EOF) {
            state = r == FW_OFL_TAKE_EMPTY ? "empty" : "eof";
            break;
        }
        if (r == FW_OFL_TAKE_BAD) {
            bad++;
            continue;
        }
        if (r == FW_OFL_TAKE_ERR) {
            if (PyList_GET_SIZE(list) == 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                Py_CLEAR(list);
            }
            break;
        }
        have_skip = 0;                          /* only the head of the queue can be a repeat */
        fw_offload_rec rec;
        fw_offload_parse(buf.buf, (size_t)r, &rec);
        PyObject *key = rec.key ? PyBytes_FromStringAndSize(rec.key, rec.h.key_len) : Py_NewRef(Py_None);
        PyObject *t = key ? Py_BuildValue("(s#Ny#dIIlO)", rec.topic, (Py_ssize_t)rec.h.topic_len, key,
                                          rec.value, (Py_ssize_t)rec.h.value_len, rec.h.ts_ns / 1e9,
                                          rec.h.pid, rec.h.seq, r, fresh ? Py_True : Py_False)
                          : NULL;
        if (!t || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(list);               /* taken off and journaled: the journal still has it */
            break;
        }
        Py_DECREF(t);
        bytes += r;
    }
    PyBuffer_Release(&buf);
    if (!list)
        return NULL;
    return Py_BuildValue("(Nsl)", list, state, bad);
}

/* offload_forget(journal_fd, upto): free the disk blocks of a journal
 * segment's delivered first bytes; False if the file system cannot. */
static PyObject *offload_forget(PyObject *mod, PyObject *args)
{
    (void)mod;
    int fd;
    unsigned long long upto;
    if (!PyArg_ParseTuple(args, "iK:offload_forget", &fd, &upto))
        return NULL;
    int rc = fw_offload_forget(fd, upto);
    if (rc == 0)
        Py_RETURN_TRUE;
    if (rc == -EOPNOTSUPP)
        Py_RETURN_FALSE;
    errno = -rc;
    return PyErr_SetFromErrno(PyExc_OSError);
}

PyMethodDef fw_offload_methods[] = {
    { "offload_setup", (PyCFunction)(void (*)(void))offload_setup, METH_VARARGS | METH_KEYWORDS,
      "offload_setup(sock, overflow, block_ms, max_record, spill_dir, spill_max=2**64-1, counters=None, "
      "on_drop=None): "
      "this process's producer" },
    { "offload", (PyCFunction)(void (*)(void))offload_call, METH_VARARGS | METH_KEYWORDS,
      "offload(topic, value, key=None) -> True if queued or spilled, False if dropped by the overflow policy" },
    { "offload_take", offload_take, METH_VARARGS,
      "offload_take(sock, journal_fd, buf, limit, max_bytes, skip) -> (records, state, bad): "
      "the sibling's peek-journal-dequeue loop" },
    { "offload_forget", offload_forget, METH_VARARGS,
      "offload_forget(journal_fd, upto) -> bool: give a segment's delivered bytes' blocks back "
      "(False: the file system cannot)" },
    { "offload_teardown", offload_teardown, METH_NOARGS,
      "forget this process's producer (offload() then raises until the next offload_setup)" },
    { NULL, NULL, 0, NULL },
};
