/* fw_alog: the access log, one line per response, off the request path.
 *
 * The loop thread formats each line (fw_alog_line) and appends it to the
 * front buffer; a writer thread of the log's own swaps the buffers and
 * writes the back one to the file in one batch. So a slow disk or a full
 * pipe stalls only that thread: when the front buffer has no room for a
 * line, the line is dropped and counted, never waited for. No Python, no GIL.
 *
 * The format is a list of items compiled by the caller (python/forkwsgi/
 * accesslog.py turns gunicorn's "%(h)s %(t)s ..." into them).
 *
 * Ownership: the log owns its buffers, its copies of the items' texts and of
 * the path, and its file descriptor (a dup of the one it is given). The
 * record passed to fw_alog_line is borrowed for the call. */
#ifndef FW_ALOG_H
#define FW_ALOG_H

#include <stddef.h>
#include <stdint.h>

#include "fw_buf.h"
#include "fw_http.h"

enum fw_alog_atom {
    FW_AL_TEXT = 0,      /* literal text: arg */
    FW_AL_REMOTE_ADDR,   /* h */
    FW_AL_REMOTE_PORT,   /* {REMOTE_PORT}e */
    FW_AL_USER,          /* u: the user of Basic authentication, else "-" */
    FW_AL_TIME,          /* t: [24/Nov/2026:22:21:27 +0000]; ISO 8601 in JSON */
    FW_AL_REQUEST,       /* r: "GET /p?q HTTP/1.1" */
    FW_AL_METHOD,        /* m */
    FW_AL_PATH,          /* U: the path, as sent (not decoded) */
    FW_AL_QUERY,         /* q */
    FW_AL_PROTOCOL,      /* H: HTTP/1.1 */
    FW_AL_STATUS,        /* s */
    FW_AL_BYTES,         /* B and b: body bytes sent (0 for none, as gunicorn's b) */
    FW_AL_SECONDS,       /* T */
    FW_AL_MILLIS,        /* M */
    FW_AL_MICROS,        /* D */
    FW_AL_DECIMAL,       /* L: seconds with 6 decimals */
    FW_AL_PID,           /* p: <pid> */
    FW_AL_REQ_HEADER,    /* {name}i, f (referer), a (user-agent): arg is the name */
    FW_AL_RESP_HEADER,   /* {name}o: arg is the name */
    FW_AL_URI,           /* {RAW_URI}e: the request target as sent */
    FW_AL_NATOMS
};

typedef struct fw_alog_item {
    int atom;                 /* enum fw_alog_atom */
    const char *arg;          /* TEXT: the text; headers: the name (any case) */
    size_t arg_len;
} fw_alog_item;

typedef struct fw_alog_cfg {
    int fd;                   /* where to write; duplicated, the caller keeps its own */
    const char *path;         /* reopened by fw_alog_reopen; NULL: never reopened (stdout) */
    const fw_alog_item *items;
    int nitems;
    int json;                 /* values JSON-escaped (the format is a JSON object) */
    size_t buffer_bytes;      /* each of the two buffers; 0: 1 MiB */
    int flush_ms;             /* longest wait of a line in the buffer; 0: 100 ms */
} fw_alog_cfg;

/* What the caller knows of one response; borrowed for the call. */
typedef struct fw_alog_rec {
    const char *host, *port;  /* the client */
    const fw_request *req;    /* NULL: the head did not parse (a 400 & co) */
    int status;
    uint64_t body_bytes;
    int64_t micros;           /* from the end of the head to the end of the response */
    const fw_buf *captured;   /* response headers kept by fw_alog_capture, or NULL */
} fw_alog_rec;

typedef struct fw_alog fw_alog;

typedef struct fw_alog_counts {
    uint64_t lines;           /* formatted and queued */
    uint64_t full;            /* dropped for want of room (not queued) */
    uint64_t failed;          /* queued, then lost to a failed write */
    uint64_t write_errors;    /* failed writes and reopens */
} fw_alog_counts;

/* A log writing to cfg->fd, with its writer thread started. Returns NULL
 * with errno set (EINVAL for a bad item). */
fw_alog *fw_alog_new(const fw_alog_cfg *cfg);
/* Write what is queued and end the writer (waits at most 2 s for a stuck
 * disk, then leaves the thread behind), then free. final (may be NULL)
 * gets the counts as they stand then (lines a stuck writer still holds
 * count as queued, not as failed). NULL is a no-op. */
void fw_alog_free(fw_alog *a, fw_alog_counts *final);

/* Loop thread: format one line and queue it. Returns 0, or -ENOBUFS when
 * it was dropped for want of room. */
int fw_alog_line(fw_alog *a, const fw_alog_rec *r);

/* A question: does the format show response headers? (Then the caller
 * passes each header the app sends to fw_alog_capture.) */
int fw_alog_wants_response_headers(const fw_alog *a);
/* Keep the value of response header name if the format shows it, in `into`
 * (the caller's per-request buffer, reset per request). */
void fw_alog_capture(const fw_alog *a, fw_buf *into, const char *name, size_t nlen,
                     const char *value, size_t vlen);

/* Any thread: reopen the file by its path (logrotate), done by the writer. */
void fw_alog_reopen(fw_alog *a);

void fw_alog_counts_read(const fw_alog *a, fw_alog_counts *out);

/* Loop thread: a line to log when lines were dropped or writes failed since
 * the last report, at most every 10 s. Returns 1 with msg filled, else 0. */
int fw_alog_report(fw_alog *a, int64_t now_ms, char *msg, size_t cap);

#endif
