/* fw_alog: the access log. See fw_alog.h for the model.
 *
 * Threads: fw_alog_line, fw_alog_report and the line scratch belong to the
 * loop thread; fw_alog_capture runs on whichever thread owns the request
 * (it only reads the items); the writer thread owns the back buffer and the
 * fd; the front buffer, its length and the flags are under `mu`. */
#define _GNU_SOURCE
#include "fw_alog.h"
#include "fw_uwsgi.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES (16 * 1024)   /* a line's room: long values are shortened to fit */
#define VALUE_MAX 4096               /* bytes one value shows at most, then "..." */
#define CAPTURE_MAX 1024             /* bytes kept of one response header value */
#define REPORT_EVERY_MS 10000
#define FREE_WAIT_S 2

struct fw_alog {
    fw_alog_item *items;      /* owned, with texts (owned, one block) */
    char *texts;
    size_t *after;            /* owned, per item: the least room the items after it take, so
                               * that a long value is shortened and the line stays whole */
    int nitems;
    int json;
    int nresp;                /* items that show a response header */
    char *path;               /* owned, NULL: never reopened */
    size_t pipe_chunk;        /* a pipe or socket: write at most PIPE_BUF, whole lines, at once */
    int flush_ms;
    char pid[24];

    /* Loop thread only. */
    char *line;               /* owned scratch of LINE_MAX_BYTES */
    time_t t_sec;             /* the second t_text shows */
    char t_text[48];
    size_t t_len;
    uint64_t rep_dropped, rep_errors;
    int64_t rep_at;

    /* Shared with the writer, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* CLOCK_MONOTONIC */
    char *front;              /* owned: lines being queued */
    size_t front_len;
    char *back;               /* owned: the writer's, while it writes */
    size_t cap;
    int stop, reopen;

    /* The writer's. */
    int fd;                   /* owned */
    pthread_t writer;
    int writer_started;

    _Atomic uint64_t lines, full, failed, write_errors;
    _Atomic int last_errno;
};

/* ---- the writer thread ------------------------------------------------------ */

static size_t count_lines(const char *p, size_t n)
{
    size_t k = 0;
    const char *end = p + n;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        k++;
        p++;
    }
    return k;
}

/* How much of p[0..n) to write at once to a pipe: whole lines, at most
 * max bytes (writes up to PIPE_BUF are atomic, so other workers' lines
 * never land inside ours), or the first line whole if it is longer. */
static size_t whole_lines(const char *p, size_t n, size_t max)
{
    if (n <= max)
        return n;
    size_t cut = max;
    while (cut > 0 && p[cut - 1] != '\n')
        cut--;
    if (cut > 0)
        return cut;
    while (cut < n && p[cut] != '\n')
        cut++;
    return cut < n ? cut + 1 : n;
}

/* Write buf[0..n), whole lines; a failed write drops the rest of the batch
 * (counted): a full disk must not grow the backlog without bound. */
static void write_batch(fw_alog *a, const char *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        size_t len = n - done;
        if (a->pipe_chunk)
            len = whole_lines(buf + done, len, a->pipe_chunk);
        ssize_t w = write(a->fd, buf + done, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            atomic_store(&a->last_errno, w < 0 ? errno : EIO);
            atomic_fetch_add(&a->write_errors, 1);
            atomic_fetch_add(&a->failed, count_lines(buf + done, n - done));
            return;
        }
        done += (size_t)w;
    }
}

static void reopen_file(fw_alog *a)
{
    if (!a->path)
        return;
    int fd = open(a->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        atomic_store(&a->last_errno, errno);
        atomic_fetch_add(&a->write_errors, 1);
        return;       /* the old file stays: lines go on somewhere */
    }
    if (close(a->fd) != 0 && errno != EINTR)
        atomic_store(&a->last_errno, errno);
    a->fd = fd;
}

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Sleep until there is something to do, then give lines a moment to
 * gather (a quarter of the buffer, or flush_ms) so a busy worker writes in
 * large batches, not a write() per request. */
static void *writer_main(void *arg)
{
    fw_alog *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (a->front_len == 0 && !a->stop && !a->reopen)
            pthread_cond_wait(&a->cv, &a->mu);
        if (!a->stop && !a->reopen && a->front_len < a->cap / 4) {
            struct timespec until;
            deadline_in(&until, a->flush_ms);
            while (!a->stop && !a->reopen && a->front_len < a->cap / 4)
                if (pthread_cond_timedwait(&a->cv, &a->mu, &until) == ETIMEDOUT)
                    break;
        }
        char *batch = a->front;
        size_t n = a->front_len;
        int reopen = a->reopen, stop = a->stop;
        a->front = a->back;
        a->back = batch;
        a->front_len = 0;
        a->reopen = 0;
        pthread_mutex_unlock(&a->mu);
        if (n)
            write_batch(a, batch, n);
        if (reopen)
            reopen_file(a);
        if (stop)
            return NULL;      /* the loop has ended: nothing more comes */
        pthread_mutex_lock(&a->mu);
    }
}

/* ---- set-up ---------------------------------------------------------------- */

static size_t least_room(const fw_alog_item *it);

static void release(fw_alog *a)
{
    if (a->fd >= 0)
        close(a->fd);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a->items);
    free(a->after);
    free(a->texts);
    free(a->path);
    free(a->line);
    free(a->front);
    free(a->back);
    free(a);
}

/* Release a half-made log and fail with errno e. */
static fw_alog *give_up(fw_alog *a, int e)
{
    release(a);
    errno = e;
    return NULL;
}

/* A zeroed log with its mutex and its condition variable (on
 * CLOCK_MONOTONIC: the writer's flush_ms wait must not jump with the
 * wall clock), or NULL with errno set. */
static fw_alog *alloc_log(void)
{
    fw_alog *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->fd = -1;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_cond_init(&a->cv, &ca) != 0) {
        free(a);
        errno = ENOMEM;
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        pthread_cond_destroy(&a->cv);
        free(a);
        errno = ENOMEM;
        return NULL;
    }
    return a;
}

/* Check the items: known atoms, texts and names of at most 4096 bytes, a
 * name for each header item, at most 255 response headers (a captured
 * value's slot is one byte). *text_bytes: room for their texts (one
 * more); *nresp: the response header items. Returns 0 or -EINVAL. */
static int check_items(const fw_alog_cfg *cfg, size_t *text_bytes, int *nresp)
{
    *text_bytes = 1;
    for (int i = 0; i < cfg->nitems; i++) {
        const fw_alog_item *it = &cfg->items[i];
        if (it->atom < 0 || it->atom >= FW_AL_NATOMS || (it->arg_len && !it->arg) ||
            (it->arg_len == 0 && (it->atom == FW_AL_REQ_HEADER || it->atom == FW_AL_RESP_HEADER)) ||
            it->arg_len > 4096)
            return -EINVAL;
        *text_bytes += it->arg_len;
        *nresp += it->atom == FW_AL_RESP_HEADER;
    }
    return *nresp > 255 ? -EINVAL : 0;
}

/* The settings (defaults for 0), and the log's own memory: items, texts,
 * line scratch, both buffers, the path. Returns 0 or -ENOMEM. */
static int alloc_buffers(fw_alog *a, const fw_alog_cfg *cfg, size_t text_bytes)
{
    a->cap = cfg->buffer_bytes ? cfg->buffer_bytes : (1 << 20);
    if (a->cap < LINE_MAX_BYTES)
        a->cap = LINE_MAX_BYTES;
    a->flush_ms = cfg->flush_ms > 0 ? cfg->flush_ms : 100;
    a->json = cfg->json;
    a->nitems = cfg->nitems;
    a->items = calloc((size_t)(cfg->nitems ? cfg->nitems : 1), sizeof(fw_alog_item));
    a->after = calloc((size_t)(cfg->nitems ? cfg->nitems : 1), sizeof(size_t));
    a->texts = malloc(text_bytes);
    a->line = malloc(LINE_MAX_BYTES);
    a->front = malloc(a->cap);
    a->back = malloc(a->cap);
    a->path = cfg->path ? strdup(cfg->path) : NULL;
    if (!a->items || !a->after || !a->texts || !a->line || !a->front || !a->back || (cfg->path && !a->path))
        return -ENOMEM;
    return 0;
}

/* Copy the items with their texts into the log's block (the caller's may
 * go), and note the least room the items after each one take. */
static void copy_items(fw_alog *a, const fw_alog_cfg *cfg)
{
    char *t = a->texts;
    for (int i = 0; i < cfg->nitems; i++) {
        a->items[i] = cfg->items[i];
        if (cfg->items[i].arg_len)
            memcpy(t, cfg->items[i].arg, cfg->items[i].arg_len);
        a->items[i].arg = t;
        t += cfg->items[i].arg_len;
    }
    for (int i = cfg->nitems - 1; i > 0; i--)
        a->after[i - 1] = a->after[i] + least_room(&a->items[i]);
}

/* The log's own copy of fd (above 0-2, close-on-exec), and whether writes
 * must be cut at PIPE_BUF (a pipe or a socket). Returns 0 or -errno. */
static int take_fd(fw_alog *a, int fd)
{
    a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (a->fd < 0)
        return -errno;
    struct stat st;
    if (fstat(a->fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
        a->pipe_chunk = PIPE_BUF;
    return 0;
}

fw_alog *fw_alog_new(const fw_alog_cfg *cfg)
{
    if (cfg->nitems < 0 || cfg->nitems > 4096 || (cfg->nitems && !cfg->items) || cfg->fd < 0) {
        errno = EINVAL;
        return NULL;
    }
    fw_alog *a = alloc_log();
    if (!a)
        return NULL;
    size_t text_bytes;
    int rc = check_items(cfg, &text_bytes, &a->nresp);
    if (rc == 0)
        rc = alloc_buffers(a, cfg, text_bytes);
    if (rc != 0)
        return give_up(a, -rc);
    copy_items(a, cfg);
    snprintf(a->pid, sizeof(a->pid), "<%ld>", (long)getpid());
    a->t_sec = -1;
    rc = take_fd(a, cfg->fd);
    if (rc != 0)
        return give_up(a, -rc);
    rc = pthread_create(&a->writer, NULL, writer_main, a);
    if (rc != 0)
        return give_up(a, rc);
    a->writer_started = 1;
    return a;
}

void fw_alog_free(fw_alog *a, fw_alog_counts *final)
{
    if (final)
        memset(final, 0, sizeof(*final));
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FREE_WAIT_S;
    int joined = pthread_timedjoin_np(a->writer, NULL, &until) == 0;
    if (final)
        fw_alog_counts_read(a, final);
    if (!joined) {
        /* A write stuck on a dead disk or a pipe nobody reads: the thread
         * still uses the log, so it stays (the process is ending anyway). */
        pthread_detach(a->writer);
        return;
    }
    release(a);
}

void fw_alog_reopen(fw_alog *a)
{
    pthread_mutex_lock(&a->mu);
    a->reopen = 1;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

void fw_alog_counts_read(const fw_alog *a, fw_alog_counts *out)
{
    out->lines = atomic_load(&a->lines);
    out->full = atomic_load(&a->full);
    out->failed = atomic_load(&a->failed);
    out->write_errors = atomic_load(&a->write_errors);
}

int fw_alog_report(fw_alog *a, int64_t now_ms, char *msg, size_t cap)
{
    uint64_t dropped = atomic_load(&a->full) + atomic_load(&a->failed);
    uint64_t errors = atomic_load(&a->write_errors);
    if ((dropped == a->rep_dropped && errors == a->rep_errors) ||
        (a->rep_at && now_ms - a->rep_at < REPORT_EVERY_MS))
        return 0;
    int e = atomic_load(&a->last_errno);
    snprintf(msg, cap, "access log%s%s: %llu line(s) dropped, %llu write error(s)%s%s%s since the last report",
             a->path ? " " : "", a->path ? a->path : "", (unsigned long long)(dropped - a->rep_dropped),
             (unsigned long long)(errors - a->rep_errors), e ? " (last: " : "", e ? strerror(e) : "",
             e ? ")" : "");
    a->rep_dropped = dropped;
    a->rep_errors = errors;
    a->rep_at = now_ms ? now_ms : 1;
    return 1;
}

/* ---- formatting ------------------------------------------------------------- */

typedef struct out {
    char *p;
    size_t n, cap;            /* cap leaves room for the final newline */
    size_t limit;             /* where the value being written must end: the room of the
                               * items after it is kept (fw_alog.after) */
    int cut;
} out;

/* The least room an item takes: its text, a number's digits, or for a
 * value, room for "-" or the "..." of a value shortened to nothing. */
static size_t least_room(const fw_alog_item *it)
{
    switch (it->atom) {
    case FW_AL_TEXT:
        return it->arg_len;
    case FW_AL_REQUEST:
        return 3 + 1 + 3 + 9;       /* method, ' ', target, " HTTP/1.1" */
    case FW_AL_TIME:
        return 48;
    case FW_AL_STATUS:
    case FW_AL_BYTES:
    case FW_AL_SECONDS:
    case FW_AL_MILLIS:
    case FW_AL_MICROS:
    case FW_AL_DECIMAL:
    case FW_AL_PID:
        return 24;
    case FW_AL_PROTOCOL:
        return 8;
    default:
        return 3;
    }
}

static void put_raw(out *o, const char *s, size_t n)
{
    if (n > o->cap - o->n) {
        n = o->cap - o->n;
        o->cut = 1;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void put_str(out *o, const char *s)
{
    put_raw(o, s, strlen(s));
}

/* A value from the request or the app, written so that no client can forge
 * a line or end a field early. Text: the same bytes gunicorn writes: '"'
 * as \", a byte >= 0x80 as the UTF-8 of the Latin-1 character WSGI makes
 * of it, a tab as it is; a control character (none can come in a header;
 * a Basic user name can hold one) as \xHH. JSON: a string body, bytes >=
 * 0x80 as those Latin-1 characters. */
static void put_val(out *o, int json, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* Its room: up to VALUE_MAX, and what the items after it leave; less 3
     * for the "..." of a value that does not fit, so that every field and
     * the line's end are always there (valid JSON, every field in place). */
    size_t end = o->limit < o->cap ? o->limit : o->cap;
    if (end > o->n + VALUE_MAX)
        end = o->n + VALUE_MAX;
    if (end < o->n + 3) {
        put_raw(o, "...", 3);
        return;
    }
    end -= 3;
    size_t i = 0;
    while (i < n) {
        /* The common case: a run of bytes that need no escape, copied at once. */
        size_t run = i;
        while (run < n && (unsigned char)s[run] >= 0x20 && (unsigned char)s[run] < 0x7f &&
               s[run] != '"' && s[run] != '\\')
            run++;
        if (run > i) {
            size_t k = run - i;
            if (k > end - o->n) {
                memcpy(o->p + o->n, s + i, end - o->n);
                o->n = end;
                put_raw(o, "...", 3);
                return;
            }
            memcpy(o->p + o->n, s + i, k);
            o->n += k;
            i = run;
            continue;
        }
        unsigned char ch = (unsigned char)s[i++];
        char e[8];
        size_t k = 0;
        if (json && (ch == '"' || ch == '\\')) {
            e[k++] = '\\';
            e[k++] = (char)ch;
        } else if (json) {
            memcpy(e, "\\u00", 4);
            k = 4;
            e[k++] = hex[ch >> 4];
            e[k++] = hex[ch & 15];
        } else if (ch == '"') {
            e[k++] = '\\';
            e[k++] = '"';
        } else if (ch == '\\' || ch == '\t') {
            e[k++] = (char)ch;
        } else if (ch >= 0x80) {
            e[k++] = (char)(0xc0 | (ch >> 6));
            e[k++] = (char)(0x80 | (ch & 0x3f));
        } else {
            e[k++] = '\\';
            e[k++] = 'x';
            e[k++] = hex[ch >> 4];
            e[k++] = hex[ch & 15];
        }
        if (k > end - o->n) {
            put_raw(o, "...", 3);
            return;
        }
        memcpy(o->p + o->n, e, k);
        o->n += k;
    }
}

static void put_u64(out *o, uint64_t v)
{
    char d[24];
    size_t k = sizeof(d);
    do {
        d[--k] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put_raw(o, d + k, sizeof(d) - k);
}

static int name_eq(const char *a, size_t an, const char *b, size_t bn)
{
    if (an != bn)
        return 0;
    for (size_t i = 0; i < an; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z') x = (unsigned char)(x + 32);
        if (y >= 'A' && y <= 'Z') y = (unsigned char)(y + 32);
        if (x != y)
            return 0;
    }
    return 1;
}

/* A request header by name: the first field of an HTTP request, or in a
 * uwsgi one the variable it came in (HTTP_USER_AGENT), the last one (as
 * in the environ). */
static const fw_header *req_header(const fw_request *req, const char *name, size_t nlen)
{
    if (!req)
        return NULL;
    if (req->uwsgi) {
        for (size_t i = req->num_headers; i-- > 0;)
            if (fw_uwsgi_is_header(req->headers[i].name, req->headers[i].name_len, name, nlen))
                return &req->headers[i];
        return NULL;
    }
    for (size_t i = 0; i < req->num_headers; i++)
        if (name_eq(req->headers[i].name, req->headers[i].name_len, name, nlen))
            return &req->headers[i];
    return NULL;
}

static int b64(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+') return 62;
    if (ch == '/') return 63;
    return -1;
}

/* u: the user name of "Authorization: Basic base64(user:password)", or
 * "-". Only the part before ':' is decoded; the password never is. */
static void put_user(out *o, int json, const fw_request *req)
{
    const fw_header *h = req_header(req, "authorization", 13);
    char user[256];
    size_t n = 0;
    if (h && h->value_len > 6 && name_eq(h->value, 6, "basic ", 6)) {
        const char *s = h->value + 6;
        size_t len = h->value_len - 6;
        unsigned acc = 0;
        int bits = 0, colon = 0;
        for (size_t i = 0; i < len && !colon && n < sizeof(user); i++) {
            int v = b64((unsigned char)s[i]);
            if (v < 0)
                break;
            acc = (acc << 6) | (unsigned)v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                char ch = (char)((acc >> bits) & 0xff);
                if (ch == ':')
                    colon = 1;
                else
                    user[n++] = ch;
            }
        }
        if (!colon)
            n = 0;            /* not user:password: show nothing of it */
    }
    if (n)
        put_val(o, json, user, n);
    else
        put_raw(o, "-", 1);
}

static void refresh_time(fw_alog *a)
{
    static const char months[12][4] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);       /* a second's precision is all it shows */
    if (ts.tv_sec == a->t_sec)
        return;
    struct tm tm;
    if (!localtime_r(&ts.tv_sec, &tm))
        memset(&tm, 0, sizeof(tm));
    long off = tm.tm_gmtoff / 60;
    char sign = off < 0 ? '-' : '+';
    if (off < 0)
        off = -off;
    int n;
    if (a->json)
        n = snprintf(a->t_text, sizeof(a->t_text), "%04d-%02d-%02dT%02d:%02d:%02d%c%02ld:%02ld",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     sign, off / 60, off % 60);
    else
        n = snprintf(a->t_text, sizeof(a->t_text), "[%02d/%s/%04d:%02d:%02d:%02d %c%02ld%02ld]",
                     tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, sign, off / 60, off % 60);
    a->t_len = n > 0 && (size_t)n < sizeof(a->t_text) ? (size_t)n : 0;
    a->t_sec = ts.tv_sec;
}

static void put_dash_or(out *o, int json, const char *s, size_t n)
{
    if (s && n)
        put_val(o, json, s, n);
    else
        put_raw(o, "-", 1);
}

/* The value a response header item captured (first of its name), if any. */
static void put_captured(out *o, int json, const fw_buf *cap, int slot)
{
    if (cap) {
        const unsigned char *p = (const unsigned char *)fw_buf_head(cap);
        size_t n = fw_buf_used(cap), i = 0;
        while (i + 3 <= n) {
            size_t len = (size_t)p[i + 1] | (size_t)p[i + 2] << 8;
            if (p[i] == slot && i + 3 + len <= n) {
                put_dash_or(o, json, (const char *)p + i + 3, len);
                return;
            }
            i += 3 + len;
        }
    }
    put_raw(o, "-", 1);
}

/* r: "GET /p?q HTTP/1.1", or "-" for a head that did not parse. */
static void put_request_line(out *o, int json, const fw_request *q)
{
    if (!q) {
        put_raw(o, "-", 1);
        return;
    }
    put_val(o, json, q->method, q->method_len);
    put_raw(o, " ", 1);
    o->limit -= 9 < o->limit ? 9 : o->limit;      /* " HTTP/1.1" follows */
    put_val(o, json, q->target, q->target_len);
    put_str(o, q->minor ? " HTTP/1.1" : " HTTP/1.0");
}

/* An item the request says (q NULL: its head did not parse). */
static void put_request_item(out *o, int json, const fw_alog_item *it, const fw_request *q)
{
    switch (it->atom) {
    case FW_AL_USER:
        put_user(o, json, q);
        break;
    case FW_AL_REQUEST:
        put_request_line(o, json, q);
        break;
    case FW_AL_METHOD:
        put_dash_or(o, json, q ? q->method : NULL, q ? q->method_len : 0);
        break;
    case FW_AL_PATH:
        put_dash_or(o, json, q ? q->path : NULL, q ? q->path_len : 0);
        break;
    case FW_AL_QUERY:
        if (q && q->query_len)
            put_val(o, json, q->query, q->query_len);
        break;      /* empty, as gunicorn's QUERY_STRING */
    case FW_AL_URI:
        put_dash_or(o, json, q ? q->target : NULL, q ? q->target_len : 0);
        break;
    case FW_AL_PROTOCOL:
        put_str(o, !q ? "-" : q->minor ? "HTTP/1.1" : "HTTP/1.0");
        break;
    case FW_AL_REQ_HEADER: {
        const fw_header *h = req_header(q, it->arg, it->arg_len);
        put_dash_or(o, json, h ? h->value : NULL, h ? h->value_len : 0);
        break;
    }
    default:
        break;
    }
}

/* A number of the response: its status, its body's bytes, its time. */
static void put_number_item(out *o, int atom, const fw_alog_rec *r)
{
    uint64_t us = r->micros > 0 ? (uint64_t)r->micros : 0;
    switch (atom) {
    case FW_AL_STATUS:
        put_u64(o, r->status > 0 ? (uint64_t)r->status : 0);
        break;
    case FW_AL_BYTES:
        put_u64(o, r->body_bytes);
        break;
    case FW_AL_SECONDS:
        put_u64(o, us / 1000000);
        break;
    case FW_AL_MILLIS:
        put_u64(o, us / 1000);
        break;
    case FW_AL_MICROS:
        put_u64(o, us);
        break;
    case FW_AL_DECIMAL: {
        char d[40];
        int n = snprintf(d, sizeof(d), "%llu.%06llu", (unsigned long long)(us / 1000000),
                         (unsigned long long)(us % 1000000));
        put_raw(o, d, (size_t)n);
        break;
    }
    default:
        break;
    }
}

/* One item of the format: what the log itself knows (text, time, pid),
 * the client, the request, the numbers, or a captured response header. */
static void put_item(fw_alog *a, out *o, const fw_alog_item *it, int slot, const fw_alog_rec *r)
{
    int json = a->json;
    switch (it->atom) {
    case FW_AL_TEXT:
        put_raw(o, it->arg, it->arg_len);
        break;
    case FW_AL_REMOTE_ADDR:
        put_dash_or(o, json, r->host, r->host ? strlen(r->host) : 0);
        break;
    case FW_AL_REMOTE_PORT:
        put_dash_or(o, json, r->port, r->port ? strlen(r->port) : 0);
        break;
    case FW_AL_TIME:
        refresh_time(a);
        put_raw(o, a->t_text, a->t_len);
        break;
    case FW_AL_PID:
        put_str(o, a->pid);
        break;
    case FW_AL_RESP_HEADER:
        put_captured(o, json, r->captured, slot);
        break;
    case FW_AL_USER:
    case FW_AL_REQUEST:
    case FW_AL_METHOD:
    case FW_AL_PATH:
    case FW_AL_QUERY:
    case FW_AL_URI:
    case FW_AL_PROTOCOL:
    case FW_AL_REQ_HEADER:
        put_request_item(o, json, it, r->req);
        break;
    default:            /* the numbers; put_number_item writes nothing for any other atom */
        put_number_item(o, it->atom, r);
        break;
    }
}

int fw_alog_line(fw_alog *a, const fw_alog_rec *r)
{
    out o = { a->line, 0, LINE_MAX_BYTES - 4, 0, 0 };
    int slot = 0;
    for (int i = 0; i < a->nitems; i++) {
        const fw_alog_item *it = &a->items[i];
        o.limit = a->after[i] < o.cap ? o.cap - a->after[i] : 0;
        put_item(a, &o, it, slot, r);
        slot += it->atom == FW_AL_RESP_HEADER;
    }
    if (o.cut) {
        memcpy(o.p + o.n, "...", 3);
        o.n += 3;
    }
    o.p[o.n++] = '\n';

    pthread_mutex_lock(&a->mu);
    size_t had = a->front_len;
    int fits = o.n <= a->cap - had;
    if (fits) {
        memcpy(a->front + had, o.p, o.n);
        a->front_len = had + o.n;
        /* Wake the writer when it sleeps on an empty buffer, or when a
         * quarter is full (it then writes without waiting out flush_ms). */
        if (had == 0 || (had < a->cap / 4 && a->front_len >= a->cap / 4))
            pthread_cond_signal(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    if (!fits) {
        atomic_fetch_add(&a->full, 1);
        return -ENOBUFS;
    }
    /* Only this thread counts lines: a plain store, no locked add. */
    atomic_store_explicit(&a->lines, atomic_load_explicit(&a->lines, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    return 0;
}

int fw_alog_wants_response_headers(const fw_alog *a)
{
    return a->nresp > 0;
}

void fw_alog_capture(const fw_alog *a, fw_buf *into, const char *name, size_t nlen,
                     const char *value, size_t vlen)
{
    int slot = 0;
    for (int i = 0; i < a->nitems; i++) {
        const fw_alog_item *it = &a->items[i];
        if (it->atom != FW_AL_RESP_HEADER)
            continue;
        if (name_eq(it->arg, it->arg_len, name, nlen)) {
            size_t n = vlen < CAPTURE_MAX ? vlen : CAPTURE_MAX;
            unsigned char hdr[3] = { (unsigned char)slot, (unsigned char)(n & 0xff), (unsigned char)(n >> 8) };
            if (fw_buf_append(into, hdr, 3) == 0 && fw_buf_append(into, value, n) != 0)
                into->len -= 3;
        }
        slot++;
    }
}
