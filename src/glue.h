/* glue: the WSGI layer between the C core (cserver/) and Python.
 *
 * Threading: the loop thread never holds the GIL except inside the app
 * callbacks below, and those release it around every syscall (writes, body
 * reads that may block). Objects handed to the app (start_response,
 * wsgi.input) point back at the request; the pointers are cleared when the
 * request ends, so an app that keeps them gets an exception, not a crash. */
#ifndef FW_GLUE_H
#define FW_GLUE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "fw_conn.h"
#include "fw_offload.h"
#include "fw_proxy.h"
#include "fw_server.h"

typedef struct fw_req fw_req;
typedef struct fw_logq fw_logq;

/* The keys an environ holds beyond its template's and those every request
 * sets (environ.c): its header fields' keys in order (a repeated field's
 * each time), then HTTP_HOST of an absolute-form target and wsgi.url_scheme
 * when the request set them. An environ is kept for the next request only
 * when that request's list is the same (fw_environ_done); that request
 * then leaves alone each value that has the bytes it would put (vals). */
#define FW_ENV_KEYS_MAX 24
enum { FW_EV_METHOD, FW_EV_RAW_URI, FW_EV_PROTO, FW_EV_ADDR, FW_EV_PORT, FW_EV_PATH, FW_EV_QUERY, FW_EV_LINE };
typedef struct fw_env_keys {
    int n;                      /* -1: the environ is never kept (uwsgi, more keys) */
    int lst;                    /* its listener, whose template it came from */
    PyObject *keys[FW_ENV_KEYS_MAX];  /* borrowed: from the environ, which holds them (a repeated
                                       * field's, the first's), or static (HTTP_HOST, ...) */
    PyObject *vals[FW_EV_LINE + FW_ENV_KEYS_MAX];  /* borrowed from the environ: the value it
                                       * holds under each entry the request sets: FW_EV_* first, then
                                       * keys[i]'s at FW_EV_LINE + i (a repeated field's, the joined
                                       * value at its first's index); only n of the latter are set */
} fw_env_keys;

/* One entry of secure_scheme_headers (gunicorn's setting): from a peer in
 * --forwarded-allow-ips, a header of this name makes wsgi.url_scheme
 * "https" when its value is exactly `value`, else "http". */
typedef struct fw_scheme_header {
    const char *name;           /* lower case */
    size_t name_len;
    const char *value;
    size_t value_len;
} fw_scheme_header;

/* One server's state as the request callbacks see it (the app_ops ctx).
 * It lives inside the Python Server object (src/_forkwsgi.pyx), which owns
 * the fw_server and holds the references the borrowed pointers point at. */
typedef struct fw_glue {
    fw_server *srv;             /* owned by the Server object */
    PyObject *app;              /* borrowed (the Server object's) */
    PyObject *logger;           /* borrowed */
    PyObject *thread_name;      /* borrowed str or NULL: app threads are named "<it> thread N" */
    PyObject *templates;        /* borrowed: list of dicts, one per listening fd: the constant
                                 * environ entries and the fd's SERVER_NAME and SERVER_PORT,
                                 * copied per request (fw_environ_template) */
    PyObject *pending_exc;      /* owned: BaseException raised by the app, re-raised by serve() */
    const fw_scheme_header *scheme_headers;   /* borrowed (the Server object's), n_scheme_headers */
    int n_scheme_headers;
    int forwarded_proto;        /* Forwarded's proto= says the scheme too (--forwarded-proto) */
    Py_buffer status;           /* optional shared slots for the master (--timeout), one per
                                 * app thread; buf NULL if none (released by the Server object) */
    PyThreadState *tstate;      /* the serving thread's state while serve() runs */
    int gil_kept;               /* inline: the loop thread still holds the GIL after its
                                 * last call into the app (request.c gil_leave) */
    fw_logq *logq;              /* owned while serve() runs: the core's log lines (logq.c) */
    int serving;
    PyObject *spare_env;        /* owned, or NULL: the environ of an ended request that the app
                                 * left untouched and unshared, for the next request with the
                                 * same keys (environ.c); the GIL guards it */
    fw_env_keys spare_keys;     /* its keys and values (borrowed from it) */
    Py_ssize_t spare_size;      /* its entry count */
    uint64_t spare_tag;         /* its version when kept: changed since (an app that found it
                                 * through gc), it is dropped, not reused */
} fw_glue;

typedef struct WriterObject WriterObject;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;  /* sr_vectorcall: start_response(status, headers) without an
                                 * argument tuple */
    fw_req *req;                /* NULL once the request ended */
    WriterObject *writer;       /* owned: the write() start_response returns, or NULL; kept
                                 * across requests through the free list */
    int called;
} StartResponseObject;

/* write(), as start_response returns it (start_response.c). */
struct WriterObject {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    StartResponseObject *sr;    /* borrowed; NULL once sr let it go */
};

typedef struct {
    PyObject_HEAD
    fw_conn *conn;              /* NULL once the request ended */
} InputObject;

typedef struct {
    PyObject_HEAD
    PyObject *filelike;
    Py_ssize_t blksize;
} FileWrapperObject;

/* Per-request state, owned by the glue (conn->app_state). */
struct fw_req {
    fw_glue *server;
    fw_conn *conn;
    PyObject *environ;
    StartResponseObject *sr;
    InputObject *input;
    PyObject *result;           /* what the app returned */
    PyObject *iter;             /* iterator, or NULL on the list/tuple fast path */
    PyObject *lent;             /* owned: the chunk whose rest the connection borrowed
                                 * (fw_conn_send_borrowed) until the loop has written it */
    Py_ssize_t index;           /* list/tuple fast path position */
    int headers_sent;
    int sendfile_pending;       /* the loop is sending the file; close it afterwards */
    uint64_t env_tag;           /* the environ's version once built (fw_environ_seal) */
    Py_ssize_t env_size;        /* ... and its entry count then */
    fw_env_keys env_keys;       /* ... and its keys and values (fw_environ_build); last: req_alloc
                                 * clears what comes before it, fw_environ_build fills it */
};

extern PyTypeObject StartResponse_Type;
extern PyTypeObject Writer_Type;
extern PyTypeObject Input_Type;
extern PyTypeObject FileWrapper_Type;

/* environ.c. fw_environ_build returns the environ, or NULL: with an
 * exception set, or with *status an HTTP status to answer instead (400:
 * scheme headers from an allowed proxy disagree), said in the log. It
 * fills *keys (above). Once the server's own entries are in (wsgi.input),
 * fw_environ_seal notes the environ's version; at the request's end
 * fw_environ_done drops r->environ, or keeps it for the next request when
 * no one else holds it and it is unchanged since (a new request then
 * replaces the values of the same keys that differ, instead of copying the
 * template and inserting them all).
 * fw_environ_forget drops the kept one. All with the GIL held. */
int fw_environ_init(void);
PyObject *fw_environ_build(fw_glue *s, fw_conn *c, int *status, fw_env_keys *keys);
void fw_environ_seal(fw_req *r);
void fw_environ_done(fw_glue *s, fw_req *r);
void fw_environ_forget(fw_glue *s);
/* The template of one listener's environs: a copy of base (the constant
 * entries) with SERVER_NAME and SERVER_PORT from info, a (name, port)
 * tuple; sized so that a request's environ, copied from it, takes the
 * request's entries without growing (new reference, or NULL). */
PyObject *fw_environ_template(PyObject *base, PyObject *info);

/* Free lists: objects made for every request (start_response, wsgi.input,
 * the request state) are kept when they die and handed to the next
 * requests, instead of being freed and allocated again. The GIL protects
 * them. push returns 0 when the list is full (then free p). */
#define FW_FREE_MAX 16
typedef struct fw_freelist {
    void *items[FW_FREE_MAX];
    int n;
} fw_freelist;

static inline void *fw_freelist_pop(fw_freelist *f)
{
    return f->n > 0 ? f->items[--f->n] : NULL;
}

static inline int fw_freelist_push(fw_freelist *f, void *p)
{
    if (f->n == FW_FREE_MAX)
        return 0;
    f->items[f->n++] = p;
    return 1;
}

/* A new object of type t (a type without GC, made by fw_freelist_new and
 * given back by fw_freelist_push in its tp_dealloc), from f when it has one.
 * NULL with MemoryError set. */
static inline PyObject *fw_freelist_new(fw_freelist *f, PyTypeObject *t)
{
    void *mem = fw_freelist_pop(f);
    if (!mem && !(mem = PyObject_Malloc((size_t)t->tp_basicsize)))
        return PyErr_NoMemory();
    return PyObject_Init((PyObject *)mem, t);
}

/* strcache.c: short latin-1 strs kept from one request to the next (see
 * there). fw_strcache_get returns a new reference to the str of p[0..n):
 * the cached one when the bytes match, else make(p, n), cached when n <=
 * FW_STRCACHE_MAX. The caller holds the GIL. */
#define FW_STRCACHE_SLOTS 128
#define FW_STRCACHE_MAX 64
typedef struct fw_strcache_slot {
    uint64_t hash;              /* of the len bytes value was made from */
    PyObject *value;            /* owned, or NULL; a one-byte-kind str */
    size_t off;                 /* where the len characters made from those bytes start */
    size_t len;
} fw_strcache_slot;
typedef struct fw_strcache {
    fw_strcache_slot slots[FW_STRCACHE_SLOTS];
    int env_keys;               /* 0: value is the bytes as latin-1; 1: value is the environ
                                 * key of a header name (upper case, '-' as '_') */
    /* env_keys: the name bytes each slot's key was made from, compared as
     * they are (the key differs from them). Static storage: the values
     * cache never touches its pages. */
    char raw[FW_STRCACHE_SLOTS][FW_STRCACHE_MAX];
} fw_strcache;
PyObject *fw_strcache_get(fw_strcache *sc, const char *p, size_t n,
                          PyObject *(*make)(const char *p, size_t n));

/* request.c: the fw_app_ops callbacks (ctx: the fw_glue), and their
 * module-level set-up (interned strings; 0, or -1 with an exception). */
extern const fw_app_ops fw_glue_ops;
int fw_request_init(void);

/* input.c */
InputObject *fw_input_new(fw_conn *c);

/* start_response.c */
StartResponseObject *fw_start_response_new(fw_req *r);
/* Queue status line + headers from start_response. known_len as in fw_resp_end_head.
 * Returns 0, or -1 with a Python exception set. */
int fw_req_send_head(fw_req *r, int64_t known_len);

/* request.c: the status slots, one per app thread (fw_thread.index). Layout
 * of one (FW_STATUS_SIZE bytes): a uint64 of CLOCK_MONOTONIC nanoseconds when
 * the thread's current call into the app began (0 = not in the app), a
 * uint64 count of the thread's calls into the app, then the request line
 * "METHOD TARGET", NUL-terminated. */
#define FW_STATUS_SIZE 256
/* A call into the app begins / ends: the master's status slot (--timeout)
 * and the app time of the counters. enter returns the time (ns) for leave;
 * first: the request's first call (on_request, not on_writable). */
uint64_t fw_status_enter(fw_glue *s, fw_conn *c, int first);
void fw_status_leave(fw_glue *s, fw_conn *c, uint64_t began_ns);
/* The app's current call waits for the client (wsgi.input while the loop
 * reads the body, write() while the loop writes): that is no app time, for
 * --timeout (the master sees "not in the app") nor for the counters. */
typedef struct fw_pause {
    uint64_t at;                /* when the wait began (ns) */
    uint64_t slot_began;        /* the status slot's start time before it */
} fw_pause;
void fw_status_pause(fw_glue *s, fw_conn *c, fw_pause *p);
void fw_status_resume(fw_glue *s, fw_conn *c, const fw_pause *p);
/* For the master: one entry's start time (0: not in the app), its count of
 * calls and, when in the app, its request line (into line, cap bytes,
 * NUL-terminated). A question: 1 if the thread is in the app. */
int fw_status_read(const void *entry, uint64_t *began, uint64_t *calls, char *line, size_t cap);

/* logq.c: while serve() runs, the core's log lines go through a thread of
 * their own (started by the first line), so the loop never waits for the
 * GIL to log. start and stop with the GIL held (0, or -1: lines are then
 * logged at once); put from any thread, without the GIL. */
int fw_logq_start(fw_glue *s);
void fw_logq_stop(fw_glue *s);
void fw_logq_put(fw_glue *s, int level, const char *msg);

/* offload.c: forkwsgi.offload() and its set-up, added to the module. */
extern PyMethodDef fw_offload_methods[];

/* ring_watch.c: the sibling's way out of SCHED_IDLE when the ring fills. */
int fw_ring_watch_start(const fw_ring *ring, uint64_t threshold, int interval_ms, int nice);
int fw_ring_watch_tid(void);
void fw_ring_watch_arm(int armed);
unsigned fw_ring_watch_fired(void);

/* coverage.c: gcov's counters written now (coverage builds; a no-op otherwise). */
void fw_coverage_dump(void);

#endif
