/* fw_body: request bodies, as the app's wsgi.input sees them.
 *
 * Every body is read from the socket by the loop (fw_conn.c), never by the
 * app, so a body that trickles in ties up no thread. This file decodes what
 * the loop read, into one of two places chosen when the head is parsed:
 *  - in place: a Content-Length body up to spool_threshold stays in `in`
 *    behind the head; the app reads that span (no copy);
 *  - pre-read: chunked or larger bodies are decoded into memory, spilling
 *    into an unlinked temp file past spool_threshold, so a 512 MB upload
 *    costs bounded memory.
 * With "Expect: 100-continue" the loop answers 100 Continue (fw_conn.c)
 * and reads the body like any other, before the app runs. */
#define _GNU_SOURCE
#include "fw_conn.h"
#include "fw_io.h"
#include "fw_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FILE_WINDOW (64 * 1024)
#define BODY_CHUNK (64 * 1024)     /* socket reads while a body arrives */

/* Move the head out of `in` (so the body can stream through it) and re-parse
 * it from its new home. Returns 0, -ENOMEM, or -EPROTO when it no longer
 * parses (not expected: it parsed before). */
static int head_detach(fw_conn *c)
{
    c->x->head_copy = malloc(c->x->head_len);
    if (!c->x->head_copy)
        return -ENOMEM;
    memcpy(c->x->head_copy, c->x->head, c->x->head_len);
    fw_buf_consume(&c->x->in, c->x->head_len);
    c->x->head = c->x->head_copy;
    return fw_conn_parse_head(c) == 0 ? 0 : -EPROTO;
}

int fw_body_setup(fw_conn *c, enum fw_body_plan *plan)
{
    fw_body *b = &c->x->body;
    const fw_request *r = &c->x->req;
    memset(b, 0, sizeof(*b));
    b->fd = -1;
    if (!r->has_body) {
        b->src = FW_B_NONE;
        b->done = 1;
        c->x->consume_at_end = c->x->head_len;
        *plan = FW_BODY_NONE;
        return 0;
    }
    b->src = FW_B_MEM;
    fw_bodydec_init(&b->dec, r);
    /* Expect: 100-continue: 100 Continue at once and the body is read
     * before the app runs (PEP 3333's first way, gunicorn's), so no thread
     * ever waits for a client's body. */
    b->continue_wanted = r->expect_continue;
    if (!r->chunked && r->content_length <= c->srv->cfg.spool_threshold) {
        b->inplace = 1;
        c->x->consume_at_end = c->x->head_len + (size_t)r->content_length;
    } else {
        int rc = head_detach(c);
        if (rc < 0)
            return rc;
    }
    *plan = FW_BODY_READ;
    return 0;
}

size_t fw_body_read_size(const fw_conn *c)
{
    if (c->x->body.inplace) {
        size_t need = c->x->head_len + (size_t)c->x->req.content_length, used = fw_buf_used(&c->x->in);
        if (need > used && need - used > BODY_CHUNK)
            return need - used;
    }
    return BODY_CHUNK;
}

uint64_t fw_body_received(const fw_conn *c)
{
    if (c->x->body.inplace) {
        size_t used = fw_buf_used(&c->x->in);
        return used > c->x->head_len ? used - c->x->head_len : 0;
    }
    return c->x->body.total + fw_buf_used(&c->x->in);
}

int fw_body_arrived(const fw_conn *c)
{
    if (c->x->body.inplace)
        return fw_buf_used(&c->x->in) > c->x->head_len;
    return fw_buf_used(&c->x->in) > 0 || c->x->body.total > 0;
}

/* Next decoded span from `in` (consumed from `in`; the span stays valid
 * until the next read into `in`). A protocol step, as fw_bodydec_next:
 * FW_CHUNK_DATA, FW_CHUNK_DONE, FW_HTTP_INCOMPLETE, or an HTTP status. */
static int decode_step(fw_conn *c, const char **p, size_t *n)
{
    fw_body *b = &c->x->body;
    size_t u;
    int rc = fw_bodydec_next(&b->dec, fw_buf_head(&c->x->in), fw_buf_used(&c->x->in), &u, p, n, &c->srv->cfg.limits);
    fw_buf_consume(&c->x->in, u);
    if (rc == FW_CHUNK_DATA)
        b->total += *n;
    return rc;
}

/* An unlinked temp file for a body: its fd, or -errno. */
static int spool_open(fw_conn *c)
{
    const char *dir = c->srv->cfg.spool_dir ? c->srv->cfg.spool_dir : "/tmp";
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        /* Filesystems without O_TMPFILE: a named file, unlinked at once. */
        char path[4096];
        if (snprintf(path, sizeof(path), "%s/forkwsgi-body-XXXXXX", dir) >= (int)sizeof(path))
            return -ENAMETOOLONG;
        fd = mkostemp(path, O_CLOEXEC);
        if (fd < 0)
            return -errno;
        if (unlink(path) != 0) {
            int e = errno;
            close(fd);
            return -e;
        }
    }
    return fd;
}

/* Keep n decoded body bytes: in memory, spilling to a spool file past the
 * threshold. Returns 0, or -errno (-ENOMEM, or the file's: said in the
 * log). */
static int spool_append(fw_conn *c, const char *p, size_t n)
{
    fw_body *b = &c->x->body;
    if (b->fd < 0) {
        if (fw_buf_append(&b->mem, p, n) != 0)
            return -ENOMEM;
        if (fw_buf_used(&b->mem) <= c->srv->cfg.spool_threshold)
            return 0;
        int fd = spool_open(c);
        if (fd < 0) {
            fw_server_log(c->srv, FW_LOG_ERROR, "cannot create a spool file: %s", strerror(-fd));
            return fd;
        }
        b->fd = fd;
        if (fw_write_all(b->fd, fw_buf_head(&b->mem), fw_buf_used(&b->mem)) != 0)
            goto fail;
        fw_buf_free(&b->mem);
        return 0;
    }
    if (fw_write_all(b->fd, p, n) == 0)
        return 0;
fail: {
        int e = errno;      /* (the log line may change errno) */
        fw_server_log(c->srv, FW_LOG_ERROR, "cannot write a spool file: %s", strerror(e));
        return -e;
    }
}

int fw_body_preread(fw_conn *c)
{
    fw_body *b = &c->x->body;
    if (b->inplace) {
        size_t need = c->x->head_len + (size_t)c->x->req.content_length;
        size_t used = fw_buf_used(&c->x->in);
        if (used < need) {
            if (fw_buf_reserve(&c->x->in, need - used) != 0)
                return 500;
            return FW_HTTP_INCOMPLETE;
        }
        if (fw_buf_head(&c->x->in) != c->x->head) {
            /* `in` grew and moved: point the request at its new home. */
            c->x->head = fw_buf_head(&c->x->in);
            if (fw_conn_parse_head(c) != 0)
                return 500;
        }
        b->span = c->x->head + c->x->head_len;
        b->span_len = (size_t)c->x->req.content_length;
        b->total = c->x->req.content_length;
        b->done = 1;
        return 0;
    }
    for (;;) {
        const char *p;
        size_t n;
        int rc = decode_step(c, &p, &n);
        if (rc == FW_CHUNK_DATA) {
            if (spool_append(c, p, n) != 0)
                return 500;
            continue;
        }
        if (rc != FW_CHUNK_DONE)
            return rc;          /* INCOMPLETE, or 400/413 */
        b->done = 1;
        if (b->fd >= 0) {
            b->src = FW_B_FILE;
            b->file_size = b->total;
            b->file_pos = 0;
        } else {
            b->span = fw_buf_head(&b->mem);
            b->span_len = fw_buf_used(&b->mem);
        }
        return 0;
    }
}

void fw_body_release(fw_conn *c)
{
    fw_body *b = &c->x->body;
    if (b->fd >= 0 && close(b->fd) != 0)
        fw_server_log(c->srv, FW_LOG_DEBUG, "close(spool): %s", strerror(errno));
    b->fd = -1;
    fw_buf_free(&b->mem);
    fw_buf_free(&b->fbuf);
    b->span = NULL;
    b->span_len = 0;
}

int fw_body_ready(const fw_conn *c)
{
    const fw_body *b = &c->x->body;
    return b->span_len > 0 || b->error || b->src != FW_B_FILE;
}

int fw_body_peek(fw_conn *c, const char **p, size_t *n)
{
    fw_body *b = &c->x->body;
    *n = 0;
    *p = NULL;
    if (b->span_len > 0) {
        *p = b->span;
        *n = b->span_len;
        return 0;
    }
    if (b->error)
        return b->error;
    if (b->src != FW_B_FILE || b->file_pos >= b->file_size)
        return 0;
    uint64_t left = b->file_size - b->file_pos;
    size_t want = left < FILE_WINDOW ? (size_t)left : FILE_WINDOW;
    fw_buf_reset(&b->fbuf, FILE_WINDOW);
    if (fw_buf_reserve(&b->fbuf, want) != 0) {
        b->error = -ENOMEM;
        return b->error;
    }
    ssize_t k;
    do {
        k = pread(b->fd, b->fbuf.data, want, (off_t)b->file_pos);
    } while (k < 0 && errno == EINTR);
    if (k <= 0) {
        b->error = k < 0 ? -errno : -EIO;     /* (0: the file ended before its size) */
        return b->error;
    }
    b->file_pos += (uint64_t)k;
    b->span = b->fbuf.data;
    b->span_len = (size_t)k;
    *p = b->span;
    *n = b->span_len;
    return 0;
}

void fw_body_consume(fw_conn *c, size_t n)
{
    fw_body *b = &c->x->body;
    if (n > b->span_len)
        n = b->span_len;
    b->span += n;
    b->span_len -= n;
}
