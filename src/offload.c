/* offload: forkwsgi.offload(topic, value, key=None) and its set-up in a
 * worker; and the sibling's reading of the ring. The record is framed
 * straight into the ring by cserver/fw_offload.c with the GIL held (a copy
 * costs less than giving the GIL up and taking it back): no pickling, no
 * helper thread, no syscall unless the sibling sleeps. Only when the ring
 * has no room for it (or it is too big for the ring) is the GIL released,
 * for the slow way: a spill file, a wait for room, or a drop. One producer
 * per process (the module state below): a worker process has one queue,
 * shared by all its threads; and one reader in the sibling. */
#include "glue.h"
#include "fw_offload.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    fw_offload ofl;
    Py_buffer counters;          /* shared counters (fw_offload_counters), buf NULL if private */
    PyObject *on_drop;           /* called with the topic and errno of each dropped record (it logs) */
    int ready;                   /* read and written under the GIL */
    _Atomic int calls;           /* offload() calls in fw_offload_send's slow way (without the GIL) */
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
    static char *kwlist[] = { "ring_fd", "overflow", "block_ms", "max_record", "spill_dir", "spill_max",
                              "counters", "on_drop", NULL };
    int ring_fd, overflow, block_ms;
    Py_ssize_t max_record;
    unsigned long long spill_max = UINT64_MAX;
    const char *spill_dir;
    PyObject *counters = Py_None, *on_drop = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiinz|KOO:offload_setup", kwlist, &ring_fd, &overflow,
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
    if (fw_offload_init(&g_offload.ofl, ring_fd, overflow, block_ms, (size_t)max_record, spill_dir,
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

/* offload(topic, value, key=None): parsed by hand (vectorcall): this is
 * the call a request makes, and argument parsing by format string would
 * cost about as much as the rest of it. */
static int offload_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **topic,
                        PyObject **value, PyObject **key)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *slots[3] = { NULL, NULL, Py_None };
    static const char *const names[3] = { "topic", "value", "key" };
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "offload() takes at most 3 arguments (%zd given)", nargs + nkw);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        slots[i] = args[i];
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int at = -1;
        for (int j = 0; j < 3; j++) {
            if (PyUnicode_CompareWithASCIIString(name, names[j]) == 0)
                at = j;
        }
        if (at < 0) {
            PyErr_Format(PyExc_TypeError, "offload() got an unexpected keyword argument '%U'", name);
            return -1;
        }
        if (at < nargs) {
            PyErr_Format(PyExc_TypeError, "offload() got multiple values for argument '%s'", names[at]);
            return -1;
        }
        slots[at] = args[nargs + i];
    }
    if (!slots[0] || !slots[1]) {
        PyErr_Format(PyExc_TypeError, "offload() missing required argument '%s'", names[slots[0] ? 1 : 0]);
        return -1;
    }
    if (!PyUnicode_Check(slots[0])) {
        PyErr_Format(PyExc_TypeError, "offload() argument 'topic' must be str, not %.100s",
                     Py_TYPE(slots[0])->tp_name);
        return -1;
    }
    *topic = slots[0];
    *value = slots[1];
    *key = slots[2];
    return 0;
}

/* The topic's UTF-8, checked as a Kafka topic name; NULL with an
 * exception set. */
static const char *topic_text(PyObject *topic, Py_ssize_t *tlen)
{
    const char *t = PyUnicode_AsUTF8AndSize(topic, tlen);
    if (!t)
        return NULL;
    if (!fw_offload_topic_ok(t, (size_t)*tlen)) {
        PyErr_Format(PyExc_ValueError, "offload(): %R is not a valid Kafka topic name "
                                       "(1 to 249 of A-Z a-z 0-9 . _ -, not . or ..)", topic);
        return NULL;
    }
    return t;
}

/* Send one record: with the GIL held when the ring has room, else the
 * slow way without it. Returns fw_offload_send's answer; *err its errno. */
static int send_record(const char *t, Py_ssize_t tlen, PyObject *key, const char *k, Py_ssize_t klen,
                       PyObject *value, const char *v, Py_ssize_t vlen, int *err)
{
    /* The common case with the GIL held: a copy into the ring costs less
     * than giving the GIL up and taking it back. */
    *err = 0;
    int rc = fw_offload_send(&g_offload.ofl, t, (size_t)tlen, k, (size_t)klen, v, (size_t)vlen, 1);
    if (rc == FW_OFL_AGAIN) {
        /* The slow way (spill file, waiting for room): without the GIL.
         * str/bytes objects are immutable: their buffers stay put while
         * this call holds its references. */
        Py_INCREF(value);
        Py_XINCREF(key);
        atomic_fetch_add(&g_offload.calls, 1);       /* under the GIL: teardown waits for it */
        Py_BEGIN_ALLOW_THREADS
        rc = fw_offload_send(&g_offload.ofl, t, (size_t)tlen, k, (size_t)klen, v, (size_t)vlen, 0);
        *err = errno;
        Py_END_ALLOW_THREADS
        atomic_fetch_sub(&g_offload.calls, 1);
        Py_DECREF(value);
        Py_XDECREF(key);
    }
    return rc;
}

/* What offload() answers for fw_offload_send's rc: True (queued or
 * spilled), False (dropped, after the on_drop callback), or an exception. */
static PyObject *send_result(int rc, PyObject *topic, int err)
{
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

static PyObject *offload_call(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    PyObject *topic, *value, *key;
    if (offload_args(args, nargs, kwnames, &topic, &value, &key) < 0)
        return NULL;
    if (!g_offload.ready) {
        PyErr_SetString(PyExc_RuntimeError,
                        "offload() needs the offload sibling: start forkwsgi with --offload-sink");
        return NULL;
    }
    Py_ssize_t tlen, vlen = 0, klen = 0;
    const char *t = topic_text(topic, &tlen);
    if (!t)
        return NULL;
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
    int err;
    int rc = send_record(t, tlen, key, k, klen, value, v, vlen, &err);
    if (vown > 0)
        Py_DECREF(vkeep);
    if (kown > 0)
        Py_DECREF(kkeep);
    return send_result(rc, topic, err);
}

static PyObject *offload_teardown(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    forget_producer();
    Py_CLEAR(g_offload.on_drop);
    Py_RETURN_NONE;
}

/* ---- the sibling's side: reading the ring ---------------------------------- */

/* The sibling's reader (one per process; only the sibling makes one). */
static fw_ofl_reader g_reader;
static int g_reader_open;

/* ring_prepare(fd, capacity) -> capacity: make the ring file (an empty
 * file) or check the one there (ValueError: not a ring or damaged). */
static PyObject *ring_prepare(PyObject *mod, PyObject *args)
{
    (void)mod;
    int fd;
    unsigned long long cap;
    if (!PyArg_ParseTuple(args, "iK:ring_prepare", &fd, &cap))
        return NULL;
    uint64_t c = cap;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fw_ring_prepare(fd, &c);
    Py_END_ALLOW_THREADS
    if (rc == -EINVAL) {
        PyErr_SetString(PyExc_ValueError, "not an offload ring file, or a damaged one");
        return NULL;
    }
    if (rc != 0) {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong(c);
}

/* ring_capacity(want) -> the data area a new ring gets for `want` bytes. */
static PyObject *ring_capacity(PyObject *mod, PyObject *args)
{
    (void)mod;
    unsigned long long want;
    if (!PyArg_ParseTuple(args, "K:ring_capacity", &want))
        return NULL;
    return PyLong_FromUnsignedLongLong(fw_ring_capacity(want));
}

/* ring_usage(fd) -> (bytes used, capacity): read from the file's header. */
static PyObject *ring_usage(PyObject *mod, PyObject *args)
{
    (void)mod;
    int fd;
    if (!PyArg_ParseTuple(args, "i:ring_usage", &fd))
        return NULL;
    fw_ring_meta m;
    ssize_t n = pread(fd, &m, sizeof(m), 0);
    if (n != (ssize_t)sizeof(m)) {
        if (n >= 0)
            errno = ENODATA;     /* shorter than a ring's header: pread set no errno */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    uint64_t head = atomic_load(&m.head), tail = atomic_load(&m.tail);
    return Py_BuildValue("(KK)", (unsigned long long)(head > tail ? head - tail : 0),
                         (unsigned long long)m.capacity);
}

static PyObject *ring_open_reader(PyObject *mod, PyObject *args)
{
    (void)mod;
    int fd;
    if (!PyArg_ParseTuple(args, "i:ring_open_reader", &fd))
        return NULL;
    if (g_reader_open && fw_ring_watch_tid() != 0) {
        PyErr_SetString(PyExc_RuntimeError, "ring_open_reader: the ring is watched (src/ring_watch.c)");
        return NULL;
    }
    if (g_reader_open)
        fw_ofl_reader_close(&g_reader);
    g_reader_open = 0;
    int rc = fw_ofl_reader_open(&g_reader, fd);
    if (rc != 0) {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    g_reader_open = 1;
#ifdef __GLIBC__
    /* The reader makes and frees thousands of 1 KiB values a second: keep
     * freed heap for the next batch instead of giving it back to the
     * kernel and taking it again as fresh zeroed pages. */
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
    Py_RETURN_NONE;
}

static int reader_ready(void)
{
    if (!g_reader_open)
        PyErr_SetString(PyExc_RuntimeError, "no ring reader in this process");
    return g_reader_open;
}

/* (pid, seq, ts_ns) of a record: what tells a record journaled by a
 * predecessor that died before it freed the ring. */
static PyObject *record_key(const fw_offload_rec *r)
{
    return Py_BuildValue("(IIK)", r->h.pid, r->h.seq, (unsigned long long)r->h.ts_ns);
}

/* A record as `type` (offload/records.py's Record, a namedtuple: topic,
 * key, value, ts, pid, seq), built as tuple.__new__ builds one. Records
 * of one batch mostly share a topic: *topic keeps the last one's str. */
static PyObject *new_record(PyTypeObject *type, const fw_offload_rec *r, PyObject **topic)
{
    if (!*topic || PyUnicode_GET_LENGTH(*topic) != r->h.topic_len
        || memcmp(PyUnicode_DATA(*topic), r->topic, r->h.topic_len) != 0) {
        Py_XDECREF(*topic);
        *topic = PyUnicode_DecodeASCII(r->topic, r->h.topic_len, "replace");
        if (!*topic)
            return NULL;
    }
    PyObject *o = type->tp_alloc(type, 6);
    if (!o)
        return NULL;
    PyObject *items[6] = {
        Py_NewRef(*topic),
        r->key ? PyBytes_FromStringAndSize(r->key, r->h.key_len) : Py_NewRef(Py_None),
        PyBytes_FromStringAndSize(r->value, r->h.value_len),
        PyFloat_FromDouble(r->h.ts_ns / 1e9),
        PyLong_FromUnsignedLong(r->h.pid),
        PyLong_FromUnsignedLong(r->h.seq),
    };
    int ok = 1;
    for (int i = 0; i < 6; i++) {
        ok = ok && items[i];
        PyTuple_SET_ITEM(o, i, items[i]);     /* NULLs too: tuple dealloc skips them */
    }
    if (!ok)
        Py_CLEAR(o);
    return o;
}

/* One ring_take call's batch. fresh: owned, the records read this time
 * that are new to the journal (their bytes are in the ring until it is
 * released); list: owned, the entries; topic: owned, the last record's
 * (new_record's); the rest borrowed from the arguments. */
typedef struct take_batch {
    int jfd;                     /* the journal segment, or -1: read only */
    PyObject *dups, *seg;        /* borrowed: ring_take's dups and segment */
    PyTypeObject *type;          /* borrowed: the record type */
    unsigned long long offset;   /* where the journal segment ends so far */
    fw_offload_rec *fresh;
    size_t nfresh;
    PyObject *list, *topic;
    uint64_t at;                 /* the ring position after the last record read */
    Py_ssize_t taken, bytes;
} take_batch;

/* rtype as the record type, if it is a namedtuple type (new_record
 * builds its instances as tuple.__new__ does); NULL with TypeError. */
static PyTypeObject *record_type(PyObject *rtype)
{
    PyTypeObject *type = (PyTypeObject *)rtype;
    if (!PyType_Check(rtype) || !PyType_IsSubtype(type, &PyTuple_Type)
        || type->tp_basicsize != PyTuple_Type.tp_basicsize || type->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "ring_take: record must be a namedtuple type");
        return NULL;
    }
    return type;
}

/* Question, with -1 for an exception: is the record among dups (a set,
 * or None), journaled by a predecessor that died before freeing it? */
static int journaled_before(PyObject *dups, const fw_offload_rec *rec)
{
    if (dups == Py_None)
        return 0;
    PyObject *k = record_key(rec);
    int dup = k ? PySet_Contains(dups, k) : -1;
    Py_XDECREF(k);
    return dup;
}

/* Append rec's entry (record, segment, end) to b->list and keep rec in
 * b->fresh. Returns 0, or -1 with an exception set. */
static int add_entry(take_batch *b, const fw_offload_rec *rec)
{
    b->offset += rec->h.total;
    PyObject *r = new_record(b->type, rec, &b->topic);
    /* Read straight from the ring, a record's end is its own ring
     * position: releasing it after its batch is delivered must never
     * free the records of the batches after it. */
    PyObject *e = r ? Py_BuildValue("(NOK)", r, b->jfd >= 0 ? b->seg : Py_None,
                                    b->jfd >= 0 ? b->offset : (unsigned long long)b->at)
                    : NULL;
    if (!e || PyList_Append(b->list, e) < 0) {
        Py_XDECREF(e);
        return -1;
    }
    Py_DECREF(e);
    b->fresh[b->nfresh++] = *rec;
    return 0;
}

/* Read up to limit records (about max_bytes) from the ring into b; *state:
 * "empty" when the ring ran out, else "more". Returns 0, or -1 with an
 * exception set. */
static int fill_batch(take_batch *b, Py_ssize_t limit, Py_ssize_t max_bytes, const char **state)
{
    *state = "more";
    while (b->taken < limit && b->bytes < max_bytes) {
        fw_offload_rec rec;
        if (!fw_ofl_reader_next(&g_reader, &b->at, &rec)) {
            *state = "empty";
            break;
        }
        b->taken++;
        b->bytes += rec.h.total;
        int dup = journaled_before(b->dups, &rec);
        if (dup < 0)
            return -1;
        if (dup)
            continue;
        if (add_entry(b, &rec) < 0)
            return -1;
    }
    return 0;
}

/* Write b's fresh records to the journal in one write (without the GIL),
 * then free their room in the ring. Returns 0, or -1 with OSError set:
 * then nothing is freed. */
static int journal_batch(take_batch *b)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fw_offload_journal_append(b->jfd, b->fresh, b->nfresh);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    fw_ring_release(&g_reader.ring, b->at);   /* journaled: the room goes back */
    return 0;
}

/* ring_take(journal_fd, limit, max_bytes, dups, record, segment, offset)
 *   -> (entries, taken, state, end)
 * Move up to `limit` records (at most about max_bytes) from the ring into
 * the journal in one write, then free their room. entries: (record,
 * segment, end offset) for each record appended now, in ring order: the
 * record as a `record` (a namedtuple type), the offset where it ends in
 * the journal segment, counted from `offset` (the segment's size before).
 * A record whose (pid, seq, ts_ns) is in `dups` (a set, or None) was
 * journaled by a predecessor that died before freeing it: it is taken
 * but not appended again (no entry). taken: how many records were taken.
 * state: "empty" (nothing more now) or "more". end: the ring position
 * after the last record.
 * journal_fd -1: read without journaling and without freeing (the
 * journal's disk is full: they go to the sink from memory): entries
 * (record, None, end), end the ring position after that record, and
 * ring_release(end) frees them once delivered. A journal write that fails
 * raises OSError: nothing is freed, the records stay in the ring. */
static PyObject *ring_take(PyObject *mod, PyObject *args)
{
    (void)mod;
    take_batch b = { 0 };
    Py_ssize_t limit, max_bytes;
    PyObject *rtype;
    if (!PyArg_ParseTuple(args, "innOOOK:ring_take", &b.jfd, &limit, &max_bytes, &b.dups, &rtype, &b.seg,
                          &b.offset))
        return NULL;
    if (!reader_ready())
        return NULL;
    b.type = record_type(rtype);
    if (!b.type)
        return NULL;
    if (limit < 1)
        limit = 1;
    if (limit > 4096)
        limit = 4096;
    b.fresh = PyMem_Malloc(sizeof(*b.fresh) * (size_t)limit);
    b.list = PyList_New(0);
    if (!b.fresh || !b.list) {
        PyMem_Free(b.fresh);
        Py_XDECREF(b.list);
        return PyErr_NoMemory();
    }
    b.at = g_reader.pos;
    const char *state;
    PyObject *res = NULL;
    /* The answer is built before the journal write: once the records are
     * journaled and their room freed, nothing may fail (a MemoryError then
     * left them in the journal without the caller knowing of them). */
    if (fill_batch(&b, limit, max_bytes, &state) == 0)
        res = Py_BuildValue("(OnsK)", b.list, b.taken, state, (unsigned long long)b.at);
    if (res && b.jfd >= 0 && journal_batch(&b) < 0)
        Py_CLEAR(res);
    if (res)
        g_reader.pos = b.at;
    PyMem_Free(b.fresh);
    Py_XDECREF(b.topic);
    Py_DECREF(b.list);
    return res;
}

/* ring_release(upto): free the ring up to a position ring_take gave. */
static PyObject *ring_release(PyObject *mod, PyObject *args)
{
    (void)mod;
    unsigned long long upto;
    if (!PyArg_ParseTuple(args, "K:ring_release", &upto))
        return NULL;
    if (!reader_ready())
        return NULL;
    if (upto > g_reader.pos) {
        PyErr_SetString(PyExc_ValueError, "ring_release: past what was read");
        return NULL;
    }
    fw_ring_release(&g_reader.ring, upto);
    Py_RETURN_NONE;
}

/* ring_wait(timeout_ms) -> bool: sleep (without the GIL) until a producer
 * publishes a record, the timeout passes or a signal arrives; True if a
 * record was there already. */
static PyObject *ring_wait(PyObject *mod, PyObject *args)
{
    (void)mod;
    int ms;
    if (!PyArg_ParseTuple(args, "i:ring_wait", &ms))
        return NULL;
    if (!reader_ready())
        return NULL;
    int ready;
    Py_BEGIN_ALLOW_THREADS
    ready = fw_ring_wait(&g_reader.ring, g_reader.pos, ms);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ready);
}

/* ring_reader_stats() -> dict: the reader's position and what it skipped. */
static PyObject *ring_reader_stats(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    if (!reader_ready())
        return NULL;
    return Py_BuildValue("{sKsKsKsKsKsK}", "pos", (unsigned long long)g_reader.pos, "holes",
                         (unsigned long long)g_reader.holes, "bad", (unsigned long long)g_reader.bad, "used",
                         (unsigned long long)fw_ring_used(&g_reader.ring), "capacity",
                         (unsigned long long)g_reader.ring.cap, "wakes",
                         (unsigned long long)atomic_load(&g_reader.ring.meta->wakes));
}

/* ring_used() -> bytes in the ring (ring_reader_stats()["used"], without
 * building the dict: the sibling asks on each turn of its loop). */
static PyObject *ring_used(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    if (!reader_ready())
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)fw_ring_used(&g_reader.ring));
}

/* ring_has_data() -> bool: a record (or a slot being written) at the
 * reading position. */
static PyObject *ring_has_data(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    if (!reader_ready())
        return NULL;
    fw_ring_slot s;
    int rc = fw_ring_peek(&g_reader.ring, g_reader.pos, &s);
    return PyBool_FromLong(rc != 0 || s.kind != FW_RING_FREE);
}

/* ring_watch(threshold, interval_ms, nice) -> tid: start the priority
 * watch over the reader's ring (src/ring_watch.c); tid is its thread, which
 * must keep its policy. */
static PyObject *ring_watch(PyObject *mod, PyObject *args)
{
    (void)mod;
    unsigned long long threshold;
    int interval_ms, nice;
    if (!PyArg_ParseTuple(args, "Kii:ring_watch", &threshold, &interval_ms, &nice))
        return NULL;
    if (!reader_ready())
        return NULL;
    if (interval_ms < 1 || interval_ms > 1000) {
        PyErr_SetString(PyExc_ValueError, "ring_watch: interval_ms must be 1..1000");
        return NULL;
    }
    int rc = fw_ring_watch_start(&g_reader.ring, threshold, interval_ms, nice);
    if (rc != 0) {
        errno = -rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(fw_ring_watch_tid());
}

/* ring_watch_arm(armed) -> fired: arm (the sibling went idle) or disarm
 * the watch; fired counts the times it moved the sibling to SCHED_BATCH. */
static PyObject *ring_watch_arm(PyObject *mod, PyObject *args)
{
    (void)mod;
    int armed;
    if (!PyArg_ParseTuple(args, "p:ring_watch_arm", &armed))
        return NULL;
    fw_ring_watch_arm(armed);
    return PyLong_FromUnsignedLong(fw_ring_watch_fired());
}

/* ring_watch_fired() -> the times the watch moved the sibling to SCHED_BATCH. */
static PyObject *ring_watch_fired(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyLong_FromUnsignedLong(fw_ring_watch_fired());
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
      "offload_setup(ring_fd, overflow, block_ms, max_record, spill_dir, spill_max=2**64-1, counters=None, "
      "on_drop=None): "
      "this process's producer" },
    { "offload", (PyCFunction)(void (*)(void))offload_call, METH_FASTCALL | METH_KEYWORDS,
      "offload(topic, value, key=None) -> True if queued or spilled, False if dropped by the overflow policy" },
    { "ring_prepare", ring_prepare, METH_VARARGS, "ring_prepare(fd, capacity) -> capacity: make or check the ring file" },
    { "ring_capacity", ring_capacity, METH_VARARGS,
      "ring_capacity(want) -> the data area a new ring gets for want bytes" },
    { "ring_usage", ring_usage, METH_VARARGS, "ring_usage(fd) -> (bytes used, capacity)" },
    { "ring_open_reader", ring_open_reader, METH_VARARGS, "ring_open_reader(fd): this process reads the ring" },
    { "ring_take", ring_take, METH_VARARGS,
      "ring_take(journal_fd, limit, max_bytes, dups, record, segment, offset) -> (entries, taken, state, end): "
      "ring to journal" },
    { "ring_release", ring_release, METH_VARARGS, "ring_release(upto): free what was read up to a position" },
    { "ring_wait", ring_wait, METH_VARARGS, "ring_wait(timeout_ms) -> bool: sleep until a record comes" },
    { "ring_reader_stats", ring_reader_stats, METH_NOARGS, "ring_reader_stats() -> dict" },
    { "ring_used", ring_used, METH_NOARGS, "ring_used() -> bytes in the ring" },
    { "ring_has_data", ring_has_data, METH_NOARGS, "ring_has_data() -> bool" },
    { "ring_watch", ring_watch, METH_VARARGS,
      "ring_watch(threshold, interval_ms, nice) -> tid: leave SCHED_IDLE when the ring holds threshold bytes" },
    { "ring_watch_arm", ring_watch_arm, METH_VARARGS, "ring_watch_arm(armed) -> times fired" },
    { "ring_watch_fired", ring_watch_fired, METH_NOARGS, "ring_watch_fired() -> times fired" },
    { "offload_forget", offload_forget, METH_VARARGS,
      "offload_forget(journal_fd, upto) -> bool: give a segment's delivered bytes' blocks back "
      "(False: the file system cannot)" },
    { "offload_teardown", offload_teardown, METH_NOARGS,
      "forget this process's producer (offload() then raises until the next offload_setup)" },
    { NULL, NULL, 0, NULL },
};
