/* fw_conn: the per-connection state machine. See fw_conn.h.
 *
 * conn_drive() moves a connection between states; socket events
 * (conn_cb), timeouts, the app threads' hand-backs and the server's ready
 * queue only feed it. This file alone reads and writes client sockets,
 * waits on them and closes them. Pipelined requests are served by the same
 * loop in order, without waiting for another EPOLLIN, and their responses
 * leave together (see fw_conn.h: the batch). */
#define _GNU_SOURCE
#include "fw_conn.h"
#include "fw_internal.h"
#include "fw_pool.h"
#include "fw_uwsgi.h"

#include <errno.h>
#include <linux/sockios.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define READ_CHUNK (16 * 1024)
#define FIRST_READ READ_CHUNK        /* a read with nothing waiting in `in` goes into the stack */

#define CONN_OF(wp) ((fw_conn *)((char *)(wp) - offsetof(fw_conn, w)))

static const char CONTINUE_100[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* An outcome (fw_rc.h): what the driver (conn_drive_steps) does after a
 * step. */
enum drive {
    DRIVE_WAIT = 0,     /* stop: c waits (for input, the socket, a thread) or closed */
    DRIVE_ON = 1        /* drive on: c's state has changed, or may move again */
};

static void conn_cb(fw_loop *loop, fw_watch *w, uint32_t events);
static void conn_drive(fw_conn *c);
static void read_and_drive(fw_conn *c);

/* Entries of a connection's header array (fw_exch.hdrs): the header
 * fields of an HTTP request, the variables of a uwsgi one (its CGI
 * variables beside the headers). */
static size_t max_vars(const fw_server *srv, const fw_listener *lst)
{
    size_t n = srv->cfg.limits.max_headers ? srv->cfg.limits.max_headers : 1;
    return lst->uwsgi ? n + FW_UWSGI_EXTRA_VARS : n;
}

/* The header array of c's request, made with its first bytes (c->x->hdrs
 * NULL before) and given back with the request state. Filled by the parser
 * before any read: not zeroed. 0, or -ENOMEM. */
static int conn_headers(fw_conn *c)
{
    /* An HTTP one is the size of the server's spare ones; a uwsgi one is larger. */
    c->x->hdrs = c->lst->uwsgi ? malloc(max_vars(c->srv, c->lst) * sizeof(fw_header))
                            : fw_spare_take(&c->srv->spare_hdrs);
    return c->x->hdrs ? 0 : -ENOMEM;
}

/* Loop thread: give c's header array back (NULL after). */
static void conn_headers_give(fw_conn *c)
{
    if (c->lst->uwsgi)
        free(c->x->hdrs);
    else
        fw_spare_give(&c->srv->spare_hdrs, c->x->hdrs);
    c->x->hdrs = NULL;
    c->x->req.headers = NULL;
}

/* ---- request state kept a few milliseconds --------------------------------
 *
 * An idle connection gives back its request state (fw_exch, its buffers
 * and header array) so that thousands of silent ones hold none. Given back
 * at once, a busy client's next request, there by the next loop pass, took
 * it again: a memset and four takes and gives a request, about 300
 * instructions. So an idle connection keeps it on srv->kept for FW_KEPT_MS
 * (given back at the end of the first pass after that: fw_conn_give_kept);
 * its next request, if it comes by then, takes it as it is (conn_exch).
 *
 * What is kept is bounded, so that bursts of connections cost the memory
 * they did: FW_KEPT_MAX states at most (as many as the spare stacks keep
 * of each kind), and only those whose buffers are of the spare sizes (a
 * buffer grown for a large body goes back at once). Beyond that, and for a
 * connection whose first bytes were no request (a CRLF, a PROXY header: a
 * load balancer's pre-opened connections, arriving by the thousand), the
 * state goes back at once, and the next connection of the same pass
 * reuses the same warm blocks. On a quiet worker the loop may sleep with
 * them until its next pass (at most a second: next_timeout). */

static void kept_unlink(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (!c->kept)
        return;
    if (c->kept_prev) c->kept_prev->kept_next = c->kept_next; else srv->kept_head = c->kept_next;
    if (c->kept_next) c->kept_next->kept_prev = c->kept_prev; else srv->kept_tail = c->kept_prev;
    c->kept_prev = c->kept_next = NULL;
    c->kept = 0;
    srv->nkept--;
}

static void kept_push(fw_conn *c)
{
    fw_server *srv = c->srv;
    kept_unlink(c);
    c->kept = 1;
    srv->nkept++;
    c->kept_ms = (uint16_t)srv->now;
    c->kept_next = NULL;
    c->kept_prev = srv->kept_tail;
    if (srv->kept_tail) srv->kept_tail->kept_next = c; else srv->kept_head = c;
    srv->kept_tail = c;
}

/* Loop thread: c's request state, made with a request's first bytes (or
 * an answer to send before any came: a timeout, a refusal) and kept until
 * the connection is idle again (fw_exch), or FW_KEPT_MS longer (see above).
 * 0, or -ENOMEM. */
static int conn_exch(fw_conn *c)
{
    if (c->x) {
        kept_unlink(c);     /* its next request came: the state is in use again */
        return 0;
    }
    fw_exch *x = fw_spare_take(&c->srv->spare_exch);
    if (!x)
        return -ENOMEM;
    memset(x, 0, sizeof(*x));
    x->conn = c;
    x->body.fd = -1;
    x->resp.sf_fd = -1;
    x->outq_mark = -1;
    x->thr = &c->srv->loop_thread;
    c->x = x;
    return 0;
}

/* Loop thread: an empty buffer of c's that has no memory takes a spare
 * block of the first size (FW_BUF_FIRST_CAP). 0, or -ENOMEM. */
static int conn_buf_take(fw_conn *c, fw_buf *b)
{
    if (b->data)
        return 0;
    b->data = fw_spare_take(&c->srv->spare_buf);
    if (!b->data)
        return -ENOMEM;
    b->cap = c->srv->spare_buf.size;
    b->off = b->len = 0;
    return 0;
}

/* The spare stack for blocks of `cap` bytes (the first size, or a write
 * buffer's size class), or NULL. */
static fw_spare *spare_of_size(fw_server *srv, size_t cap)
{
    if (cap == srv->spare_buf.size)
        return &srv->spare_buf;
    for (int i = 0; i < FW_SPARE_OUT_CLASSES; i++) {
        if (cap == srv->spare_out[i].size)
            return &srv->spare_out[i];
    }
    return NULL;
}

/* Loop thread: give b's memory back (a spare block when it is of the
 * first size or a size class, else to malloc); b is empty and has none
 * after. */
static void conn_buf_give(fw_conn *c, fw_buf *b)
{
    fw_spare *s = b->data ? spare_of_size(c->srv, b->cap) : NULL;
    if (s) {
        fw_spare_give(s, b->data);
        b->data = NULL;
    }
    fw_buf_free(b);
}

int fw_conn_out_room(fw_conn *c, size_t extra)
{
    fw_server *srv = c->srv;
    fw_buf *b = &c->x->out;
    /* It may fit once what was sent is dropped from the front (a slow
     * reader's buffer): no larger block for that. */
    if (fw_buf_room(b) >= extra || fw_buf_compact(b, extra))
        return 0;
    size_t used = fw_buf_used(b);
    /* Spare stacks are the loop thread's alone (an app thread grows the
     * buffer by realloc; the loop keeps the block as it gives it back). */
    fw_spare *to = NULL;
    if (c->x->thr == &srv->loop_thread && used <= srv->spare_out[FW_SPARE_OUT_CLASSES - 1].size &&
        extra <= srv->spare_out[FW_SPARE_OUT_CLASSES - 1].size - used) {
        for (int i = 0; i < FW_SPARE_OUT_CLASSES && !to; i++) {
            if (used + extra <= srv->spare_out[i].size && srv->spare_out[i].size > b->cap)
                to = &srv->spare_out[i];
        }
    }
    if (!to)
        return fw_buf_reserve(b, extra) == 0 ? 0 : -ENOMEM;
    char *nd = fw_spare_take(to);
    if (!nd)
        return -ENOMEM;
    if (used)
        memcpy(nd, fw_buf_head(b), used);
    conn_buf_give(c, b);
    b->data = nd;
    b->cap = to->size;
    b->off = 0;
    b->len = used;
    return 0;
}

static void uncharge(fw_conn *c, size_t still);

/* Loop thread: give back the request state with its read and write
 * buffers, the access log's capture and the header array (a closing or
 * idle connection: nothing of a request is left in them, request_end
 * reset it), and uncharge what write() had queued (0 with `out` empty, as
 * the flush leaves it; the count must not leave with the state). c->x is
 * NULL after. */
static void conn_give_buffers(fw_conn *c)
{
    fw_exch *x = c->x;
    kept_unlink(c);
    if (!x)
        return;
    uncharge(c, 0);
    conn_buf_give(c, &x->in);
    conn_buf_give(c, &x->out);
    conn_headers_give(c);
    fw_buf_free(&x->log_headers);
    fw_spare_give(&c->srv->spare_exch, x);
    c->x = NULL;
}

/* Bytes waiting in c's read (write) buffer: 0 without a request state. */
static size_t in_used(const fw_conn *c)
{
    return c->x ? fw_buf_used(&c->x->in) : 0;
}

static size_t out_used(const fw_conn *c)
{
    return c->x ? fw_buf_used(&c->x->out) : 0;
}

/* c is idle, nothing read and nothing owed: its request state is kept a
 * while, or given back now (above). */
static void conn_idle_state(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (c->kept)
        return;
    if (c->requests > 0 && srv->nkept < FW_KEPT_MAX && c->x->in.cap <= srv->spare_buf.size &&
        c->x->out.cap <= srv->spare_out[0].size)
        kept_push(c);
    else
        conn_give_buffers(c);
}

void fw_conn_give_kept(fw_server *srv)
{
    fw_conn *c;
    /* (Passes come at least every second: next_timeout. An age modulo 2^16
     * ms is the real one.) */
    while ((c = srv->kept_head) && (uint16_t)((uint16_t)srv->now - c->kept_ms) >= FW_KEPT_MS) {
        kept_unlink(c);
        /* Still idle (a closed one gives its state back when freed; one
         * whose request came unread, queued for a thread, has nothing in
         * it either). */
        if ((c->state == FW_C_READ_HEAD && !c->head_started) || (c->state == FW_C_QUEUED && c->unread)) {
            if (in_used(c) == 0 && out_used(c) == 0)
                conn_give_buffers(c);
        }
    }
}

fw_conn *fw_conn_new(fw_server *srv, fw_listener *lst, int fd,
                     const struct sockaddr *sa, socklen_t salen, int kept_alive, fw_pass_client client,
                     int64_t age_ms)
{
    fw_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->w.fd = fd;
    c->w.cb = conn_cb;
    c->w.oneshot = srv->pool != NULL;
    c->srv = srv;
    c->lst = lst;
    fw_peer_set(c, sa, salen);
    c->fwd_allowed = (uint8_t)fw_netlist_match(srv->cfg.forwarded_allow, sa, salen);
    c->state = FW_C_READ_HEAD;
    c->ready_at = srv->now - age_ms;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    c->kept_alive = kept_alive != 0;
    if (kept_alive) {
        /* Idle between requests, as it was in the worker that handed it. */
        fw_timer_start(&srv->t_idle, &c->timer, srv->now);
    } else {
        /* A fresh connection gets the header timeout from accept: a client
         * that connects and sends nothing is a slowloris too. */
        c->head_started = srv->now;
        fw_timer_start(&srv->t_head, &c->timer, srv->now);
    }
    if (srv->cfg.stats)
        fw_stats_conns(srv->cfg.stats, (uint64_t)srv->nconns, (uint64_t)srv->t_idle.count);
    if (fw_peer_start(c, client) != 0) {
        fw_conn_close(c);
        return c;
    }
    /* The request is nearly always in the socket already: read it now, so
     * no epoll round trip is spent on it, and it is counted as it is
     * dispatched, in this same loop pass. A silent connection only steers
     * placement for a moment (fw_balance_silent). */
    read_and_drive(c);
    if (c->state == FW_C_READ_HEAD && in_used(c) == 0) {
        if (srv->stopping) {
            fw_conn_start_stop(c);      /* handed over while we stop */
        } else if (srv->pool && !kept_alive) {
            fw_balance_silent(&srv->bal, &c->place);
            if (c->place.pending)
                fw_timer_start(&srv->t_grace, &c->aside, srv->now);
        }
    }
    return c;
}

void fw_conn_free(fw_conn *c)
{
    if (c->x) {
        fw_body_release(c);
        free(c->x->head_copy);
    }
    conn_give_buffers(c);
    free(c->peer_text);
    free(c);
}

static void unpark(fw_conn *c, int rc);

void fw_conn_close(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (c->state == FW_C_CLOSED)
        return;
    fw_exch *x = c->x;      /* NULL: no request (new and silent, or idle) */
    if (x && x->parked) {
        /* Never under its thread, which sleeps holding it: the thread is
         * told, and the connection closes when the app returns. */
        x->must_close = 1;
        unpark(c, -ECONNABORTED);
        return;
    }
    if (c->state == FW_C_QUEUED)
        fw_server_dequeue(srv, c);
    if (x && x->deferred)
        fw_server_undefer(srv, c);
    if (x && x->app_state && srv->ops->on_drop && srv->pool && !srv->closing && c->state != FW_C_APP) {
        /* The app still holds the request (a streamed response the client
         * dropped): its cleanup, the iterable's close(), is the app's code
         * and runs on an app thread, not here. The client is cut now; the
         * connection closes when that thread is done. */
        if (shutdown(c->w.fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
            fw_server_log(srv, FW_LOG_DEBUG, "shutdown(%d): %s", c->w.fd, strerror(errno));
        if (c->w.mask && fw_loop_watch(&srv->loop, &c->w, 0) != 0)
            fw_server_log(srv, FW_LOG_ERROR, "epoll_ctl(%d): %s", c->w.fd, strerror(errno));
        fw_timer_stop(&c->timer);
        fw_timer_stop(&c->aside);
        x->dropping = 1;
        c->state = FW_C_APP;
        fw_pool_submit(srv->pool, &x->job);
        return;
    }
    if (x && x->app_state && srv->ops->on_drop) {
        srv->ops->on_drop(srv->app, c);
        if (!srv->pool)
            srv->clock_ns = fw_now_ns();    /* app code ran on the loop thread (fw_clock_ns) */
    }
    if (x) {
        x->app_state = NULL;
        uncharge(c, 0);
    }
    fw_balance_end(&srv->bal, &c->place);     /* counted, but its request never ran */
    c->state = FW_C_CLOSED;
    fw_timer_stop(&c->timer);
    fw_timer_stop(&c->aside);
    /* Out of the epoll set first: close() takes it out only with the last
     * reference to the socket, and another process may hold one (a child
     * the app forked, or one the master forked while it held a stranded
     * hand-off). The registration would outlive c, and its next event
     * would reach c's freed memory. */
    if (fw_loop_unwatch(&srv->loop, &c->w) != 0)
        fw_server_log(srv, FW_LOG_DEBUG, "epoll_ctl(DEL %d): %s", c->w.fd, strerror(errno));
    if (close(c->w.fd) != 0 && errno != EINTR)
        fw_server_log(srv, FW_LOG_DEBUG, "close(%d): %s", c->w.fd, strerror(errno));
    c->w.fd = -1;
    if (c->prev) c->prev->next = c->next; else srv->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    /* Freed after the current loop pass: an event for it may still be pending. */
    c->next = srv->graveyard;
    c->prev = NULL;
    srv->graveyard = c;
    fw_server_conn_closed(srv);
}

/* For a hand-off: the index of the listener c came through (the same in
 * every worker), and whether a request was served on it before. */
static int listener_index(const fw_conn *c)
{
    return (int)(c->lst - c->srv->listeners);
}

static int served_before(const fw_conn *c)
{
    return c->requests > 0 || c->kept_alive;
}

void fw_conn_close_passed(fw_conn *c)
{
    if (fw_loop_unwatch(&c->srv->loop, &c->w) != 0)
        fw_server_log(c->srv, FW_LOG_ERROR, "epoll_ctl(DEL %d): %s", c->w.fd, strerror(errno));
    fw_conn_close(c);
}

/* Watch c's socket for mask (0: nothing). A failure closes c. */
static void conn_watch(fw_conn *c, uint32_t mask)
{
    if (fw_loop_watch(&c->srv->loop, &c->w, mask) != 0) {
        fw_server_log(c->srv, FW_LOG_ERROR, "epoll_ctl(%d): %s", c->w.fd, strerror(errno));
        fw_conn_close(c);
    }
}

/* Is the socket in some app thread's hands (submitted, or parked: the
 * thread sleeps, but the request is its own)? The loop then leaves the
 * request alone. */
static int owned_by_thread(const fw_conn *c)
{
    return (c->x && c->x->parked) || (c->state == FW_C_APP && c->srv->pool);
}

/* Stop reading and close after what is queued has been sent. */
static void conn_linger(fw_conn *c)
{
    fw_server *srv = c->srv;
    /* Half-close and drain, so unread request bytes do not make the kernel
     * send RST and destroy the response we just wrote. */
    if (shutdown(c->w.fd, SHUT_WR) != 0) {
        fw_conn_close(c);
        return;
    }
    c->state = FW_C_LINGER;
    fw_timer_start(&srv->t_linger, &c->timer, srv->now);
    conn_watch(c, EPOLLIN | EPOLLRDHUP);
}

void fw_conn_queue_error(fw_conn *c, int status)
{
    if (conn_exch(c) != 0)
        return;     /* out of memory: conn_refuse closes */
    c->x->must_close = 1;
    if (c->x->resp.started)
        return;     /* too late for a clean answer: the close says it */
    fw_resp_error_head(c, status);
}

/* One line per rejected request: the client, the status and why (the
 * parser's words when it said, else the status's), and the start of what
 * it sent. */
static void log_rejected(fw_conn *c, int status, const char *said)
{
    static const struct { int status; const char *why; } reasons[] = {
        { 400, "malformed request" },       { 408, "request timed out" },
        { 411, "length required" },         { 413, "body over --limit-request-body" },
        { 414, "request line too long" },   { 417, "unsupported Expect" },
        { 431, "header section too large" }, { 500, "server error" },
        { 501, "unsupported transfer coding or method" }, { 505, "unsupported HTTP version" },
    };
    const char *why = "rejected";
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (reasons[i].status == status)
            why = reasons[i].why;
    if (said)
        why = said;
    fw_peer_log(c, FW_LOG_INFO, 1, "%d %s", status, why);
}

/* Answer a protocol error and close; why: the log's words for it, or NULL. */
static void conn_refuse(fw_conn *c, int status, const char *why)
{
    log_rejected(c, status, why);
    if (conn_exch(c) != 0) {
        fw_conn_close(c);       /* out of memory: the close says it */
        return;
    }
    if (!c->x->head) {
        /* The head did not parse, so req says nothing: a HEAD request still
         * must not get a body (RFC 9110 9.3.2). */
        c->x->req.is_head = fw_buf_used(&c->x->in) >= 5 && memcmp(fw_buf_head(&c->x->in), "HEAD ", 5) == 0;
        c->x->req.minor = 1;
    }
    fw_conn_queue_error(c, status);
    c->x->app_active = 0;
    c->state = FW_C_WRITE;
}

static void conn_fail(fw_conn *c, int status)
{
    conn_refuse(c, status, NULL);
}

/* ---- the socket ------------------------------------------------------------ */

/* Read once from the socket into `in`. Returns 0 (bytes came), FW_AGAIN
 * (none yet: EAGAIN) or -errno: -ECONNRESET at EOF (the client closed),
 * read's errno, -ENOMEM (the caller decides how to close). */
static int conn_read(fw_conn *c, size_t want)
{
    /* Nothing waiting in `in` (a new connection, or a kept-alive one
     * between requests): read into the stack first and keep only what
     * came. A client that has sent nothing costs no read buffer (the read
     * at accept would otherwise give every one of thousands of silent
     * connections its READ_CHUNK: a page of RSS each, from malloc's header
     * alone), and one whose head fits takes a spare block of 4 KiB
     * rather than READ_CHUNK (16 KiB: for 1,000 active connections, 16
     * MiB). The cost: a copy of each request head's bytes. A body is read
     * straight into its buffer. */
    char first[FIRST_READ];
    int fresh = in_used(c) == 0 && c->state != FW_C_READ_BODY;
    if (!fresh && fw_buf_reserve(&c->x->in, want) != 0)     /* (a request: c->x is there) */
        return -ENOMEM;
    for (;;) {
        ssize_t n = fresh ? read(c->w.fd, first, sizeof first)
                          : read(c->w.fd, fw_buf_tail(&c->x->in), fw_buf_room(&c->x->in));
        if (n > 0 && fresh && (size_t)n == sizeof first) {
            /* The stack filled: more is likely waiting (a pipelined burst). The
             * connection gets the buffer it would have had (want), and
             * reads on into it now rather than after an epoll round trip.
             * What that read finds (EAGAIN, EOF) the next one sees. */
            if (conn_exch(c) != 0 || fw_buf_reserve(&c->x->in, want) != 0 ||
                fw_buf_append(&c->x->in, first, (size_t)n) != 0)
                return -ENOMEM;
            n = read(c->w.fd, fw_buf_tail(&c->x->in), fw_buf_room(&c->x->in));
            if (n > 0)
                c->x->in.len += (size_t)n;
            return 0;
        }
        if (n > 0) {
            /* A head that fits goes into a spare block (conn_buf_take). */
            if (fresh && (conn_exch(c) != 0 ||
                          ((size_t)n <= c->srv->spare_buf.size && conn_buf_take(c, &c->x->in) != 0) ||
                          fw_buf_append(&c->x->in, first, (size_t)n) != 0))
                return -ENOMEM;
            if (!fresh)
                c->x->in.len += (size_t)n;
            return 0;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return FW_AGAIN;
        return -errno;
    }
}

/* A send on c's socket failed with errno e: FW_AGAIN when the socket is
 * full, else -e (the client is gone: c must close). */
static int io_error(fw_conn *c, int e)
{
    if (e == EAGAIN || e == EWOULDBLOCK)
        return FW_AGAIN;
    c->x->must_close = 1;
    return -e;
}

/* Bytes the kernel still holds to send on c's socket (unsent, or sent and
 * not acknowledged), or -1 when it cannot say. */
static int kernel_outq(const fw_conn *c)
{
    int q;
    return ioctl(c->w.fd, SIOCOUTQ, &q) == 0 ? q : -1;
}

/* Bytes of the response still to leave: `out`, borrowed bytes, the file's rest. */
static uint64_t pending_out(const fw_conn *c)
{
    const fw_exch *x = c->x;
    if (!x)
        return 0;
    return fw_buf_used(&x->out) + x->ext_len + x->ext_tail_len + (x->resp.sf_fd >= 0 ? x->resp.sf_left : 0);
}

/* What write() queued and has left: no longer counted. */
static void uncharge(fw_conn *c, size_t still)
{
    if (c->x && c->x->write_charged > still) {
        c->srv->write_queued -= c->x->write_charged - still;
        c->x->write_charged = still;
    }
}

size_t fw_conn_charge_write(fw_conn *c)
{
    size_t used = fw_buf_used(&c->x->out);
    c->srv->write_queued += used - c->x->write_charged;     /* (used >= charged: only write() grows it) */
    c->x->write_charged = used;
    return c->srv->write_queued;
}

/* Send what iov[0..cnt) holds, empty entries skipped. When one buffer
 * holds it all, the usual case (a response queued whole in `out`), it is
 * send(): the kernel then copies no msghdr and imports no iovec, about a
 * tenth of a small response's system call here. MSG_NOSIGNAL: a client
 * gone is EPIPE, never SIGPIPE (the app may have set SIGPIPE back to its
 * default). sendmsg's return. */
static ssize_t send_iov(int fd, struct iovec *iov, size_t cnt)
{
    const struct iovec *one = NULL;
    size_t filled = 0;
    for (size_t i = 0; i < cnt; i++) {
        if (iov[i].iov_len) {
            one = &iov[i];
            filled++;
        }
    }
    if (filled == 1)
        return send(fd, one->iov_base, one->iov_len, MSG_NOSIGNAL);
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = cnt };
    return sendmsg(fd, &mh, MSG_NOSIGNAL);
}

int fw_conn_flush(fw_conn *c)
{
    if (!c->x)
        return 0;       /* no request: nothing to send */
    fw_resp *r = &c->x->resp;
    while (fw_buf_used(&c->x->out) + c->x->ext_len + c->x->ext_tail_len > 0) {
        struct iovec iov[3] = {
            { .iov_base = fw_buf_head(&c->x->out), .iov_len = fw_buf_used(&c->x->out) },
            { .iov_base = (void *)c->x->ext, .iov_len = c->x->ext_len },
            { .iov_base = c->x->ext_tail, .iov_len = c->x->ext_tail_len },
        };
        ssize_t n = send_iov(c->w.fd, iov, 3);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return io_error(c, errno);
        }
        size_t w = (size_t)n, k = w < fw_buf_used(&c->x->out) ? w : fw_buf_used(&c->x->out);
        fw_buf_consume(&c->x->out, k);
        w -= k;
        k = w < c->x->ext_len ? w : c->x->ext_len;
        c->x->ext += k;
        c->x->ext_len -= k;
        w -= k;
        if (w > 0) {                    /* (the usual response has no tail) */
            memmove(c->x->ext_tail, c->x->ext_tail + w, c->x->ext_tail_len - w);
            c->x->ext_tail_len -= w;
        }
        uncharge(c, fw_buf_used(&c->x->out));
    }
    while (r->sf_fd >= 0 && r->sf_left > 0) {
        off_t off = (off_t)r->sf_off;
        size_t want = r->sf_left > (1u << 30) ? (1u << 30) : (size_t)r->sf_left;
        ssize_t n = sendfile(c->w.fd, r->sf_fd, &off, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return io_error(c, errno);
        }
        if (n == 0) {
            c->x->must_close = 1;           /* the file shrank under us */
            return -ENODATA;
        }
        r->sf_off += (uint64_t)n;
        r->sf_left -= (uint64_t)n;
    }
    return 0;
}

/* fw_conn_send and fw_conn_send_borrowed (their returns): borrow says what
 * becomes of what the socket does not take. */
static int send_body(fw_conn *c, const char *data, size_t len, int borrow)
{
    const char *tail;
    size_t tail_len;
    len = fw_resp_frame(c, len, &tail, &tail_len);
    size_t queued = fw_buf_used(&c->x->out);
    struct iovec iov[3] = {
        { .iov_base = fw_buf_head(&c->x->out), .iov_len = queued },
        { .iov_base = (void *)data, .iov_len = len },
        { .iov_base = (void *)tail, .iov_len = tail_len },
    };
    ssize_t n;
    do {
        n = send_iov(c->w.fd, iov, 3);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        int rc = io_error(c, errno);
        if (rc < 0)
            return rc;
        n = 0;
    }
    /* What the socket did not take is copied behind what is queued, or
     * borrowed. */
    size_t w = (size_t)n;
    size_t from_out = w < queued ? w : queued;
    fw_buf_consume(&c->x->out, from_out);
    uncharge(c, fw_buf_used(&c->x->out));
    w -= from_out;
    size_t from_data = w < len ? w : len;
    w -= from_data;
    if (borrow && from_data < len) {
        c->x->ext = data + from_data;
        c->x->ext_len = len - from_data;
        memcpy(c->x->ext_tail, tail, tail_len);
        c->x->ext_tail_len = tail_len;
        return FW_AGAIN;
    }
    if (fw_buf_append(&c->x->out, data + from_data, len - from_data) != 0 ||
        fw_buf_append(&c->x->out, tail + w, tail_len - w) != 0) {
        c->x->must_close = 1;
        return -ENOMEM;
    }
    return fw_buf_used(&c->x->out) ? FW_AGAIN : 0;
}

int fw_conn_send(fw_conn *c, const char *data, size_t len)
{
    return send_body(c, data, len, 0);
}

int fw_conn_send_borrowed(fw_conn *c, const char *data, size_t len)
{
    return send_body(c, data, len, 1);
}

/* ---- app threads that wait for the loop ------------------------------------ */

/* Loop thread: give c back to its parked thread with rc (what
 * fw_conn_drain_wait returns there). From the moment
 * fw_pool_resume returns, the thread owns c: nothing after it touches c. */
static void unpark(fw_conn *c, int rc)
{
    fw_server *srv = c->srv;
    fw_timer_stop(&c->timer);
    /* No event may reach the loop while the thread holds it (a oneshot
     * watch that fired is disarmed already). */
    if (c->w.mask && fw_loop_watch(&srv->loop, &c->w, 0) != 0)
        fw_server_log(srv, FW_LOG_ERROR, "epoll_ctl(%d): %s", c->w.fd, strerror(errno));
    c->x->park_rc = rc;
    c->x->parked = 0;
    c->state = FW_C_APP;
    srv->nparked--;
    fw_balance_begin(&srv->bal, &c->place);     /* its thread runs again */
    fw_pool_resume(srv->pool, &c->x->job);
}

int fw_conn_drain_wait(fw_conn *c)
{
    int rc = fw_conn_flush(c);
    if (rc != FW_AGAIN || !c->srv->pool)
        return rc;      /* inline, the loop thread cannot wait for itself */
    /* Hand c to the loop and sleep until it is given back. Meanwhile this
     * thread holds no capacity: a spare runs requests in its place. */
    fw_balance_end(&c->srv->bal, &c->place);
    c->x->parked = 1;
    /* The main thread running it for the loop (inline first) cannot wait
     * for itself: the standby takes the loop now (it would at its next
     * tick anyway). */
    if (c->x->thr == c->srv->lead_thread)
        fw_lead_hand(&c->srv->lead);
    fw_pool_park(c->srv->pool, &c->x->job);
    return c->x->park_rc;
}

/* A body starts to arrive: under the body timeout (a pause) and the
 * minimum rate counted from now. */
static void body_start(fw_conn *c)
{
    fw_server *srv = c->srv;
    c->state = FW_C_READ_BODY;
    c->x->body.started = srv->now;
    fw_timer_start(&srv->t_body, &c->timer, srv->now);
}

void fw_conn_parked(fw_conn *c)
{
    fw_server *srv = c->srv;
    srv->nparked++;
    if (srv->closing) {
        fw_conn_close(c);       /* the server is gone: the thread is told */
        return;
    }
    c->state = FW_C_WRITE;
    fw_timer_start(&srv->t_write, &c->timer, srv->now);
    conn_drive(c);
}

/* The body could not be read: status (400, 408, 413, 500) is answered,
 * a -errno (the client is gone) closes. */
static void body_failed(fw_conn *c, int status)
{
    if (status < 0)
        fw_conn_close(c);
    else
        conn_fail(c, status);
}

/* The minimum rate of a body (--body-min-rate, bytes a second): after a
 * grace of one --body-timeout from its start (30 s with the body timeout
 * off), what has arrived must keep up with the rate over the time beyond
 * it (mod_reqtimeout's MinRate). A client that trickles a byte now and
 * then is cut at its next byte. */
#define MIN_RATE_GRACE_MS 30000

static int body_too_slow(const fw_conn *c)
{
    const fw_server *srv = c->srv;
    uint64_t rate = srv->cfg.body_min_rate;
    int grace = srv->cfg.body_timeout_ms > 0 ? srv->cfg.body_timeout_ms : MIN_RATE_GRACE_MS;
    int64_t beyond = srv->now - c->x->body.started - grace;
    if (rate == 0 || beyond <= 0)
        return 0;
    return fw_body_received(c) * 1000 < (uint64_t)beyond * rate;
}

/* ---- between requests -------------------------------------------------------- */

/* The access log line of the response just sent, while the request's head
 * is still in place; and, every so often, a word on lines it had to drop. */
static void log_access(fw_conn *c, int64_t micros)
{
    fw_server *srv = c->srv;
    fw_alog *al = srv->cfg.access_log;
    fw_alog_rec r = {
        .req = c->x->head ? &c->x->req : NULL,
        .status = c->x->resp.status,
        .body_bytes = c->x->resp.sent,
        .micros = micros,
        .captured = fw_buf_used(&c->x->log_headers) ? &c->x->log_headers : NULL,
    };
    fw_conn_peer_text(c, &r.host, &r.port);
    fw_alog_line(al, &r);
    char msg[256];
    if (fw_alog_report(al, srv->now, msg, sizeof(msg)))
        fw_server_log(srv, FW_LOG_WARNING, "%s", msg);
    fw_buf_reset(&c->x->log_headers, 1024);
}

/* The response is on the wire: count it, and log it. */
static void record_response(fw_conn *c)
{
    fw_server *srv = c->srv;
    /* A response still queued (a pipelined batch) was done when the app
     * returned: the app layer's clock reading then serves. */
    uint64_t now = c->x->written_ns ? c->x->written_ns     /* a deferred one, written then */
                 : c->x->app_done_ns && fw_buf_used(&c->x->out) > 0 ? c->x->app_done_ns : fw_clock_ns(srv);
    int64_t micros = c->x->began_ns && now > c->x->began_ns ? (int64_t)((now - c->x->began_ns) / 1000) : 0;
    c->x->began_ns = c->x->app_done_ns = c->x->written_ns = 0;
    if (srv->cfg.stats)
        fw_stats_request_done(srv->cfg.stats, c->x->resp.status, c->x->resp.sent, (uint64_t)micros);
    if (srv->cfg.access_log)
        log_access(c, micros);
}

/* Between two requests, kept alive: wait for the next one under the idle
 * timeout (its first byte starts the header timeout). With nothing read and
 * nothing owed, the connection is idle: its buffers, header array and
 * request state go back to the spare ones in FW_KEPT_MS unless its next
 * request has taken them by then (conn_idle_state), and a stopping server
 * applies its stop rule to it. */
static void conn_between(fw_conn *c)
{
    fw_server *srv = c->srv;
    c->state = FW_C_READ_HEAD;
    c->head_started = 0;
    c->ready_at = srv->now;             /* a pipelined next request is here by now */
    fw_timer_start(&srv->t_idle, &c->timer, srv->now);
    if (srv->cfg.stats)
        fw_stats_conns(srv->cfg.stats, (uint64_t)srv->nconns, (uint64_t)srv->t_idle.count);
    if (fw_buf_used(&c->x->in) == 0 && fw_buf_used(&c->x->out) == 0) {
        conn_idle_state(c);
        if (srv->stopping)
            fw_conn_start_stop(c);      /* idle now: hand it on while retiring */
    }
}

/* Does the connection close after the response at hand? request_end
 * closes (or lingers) on it; fw_conn_may_batch writes such a response at
 * once, with the batch before it. */
static int closes_after_response(const fw_conn *c)
{
    return c->x->must_close || c->x->resp.close || c->x->body.error || !c->x->keep_alive || c->srv->ending_keepalive;
}

/* The response is on the wire, or queued at the end of a batch (then
 * counted and logged as it is queued): recycle the connection for the next
 * request. */
static void request_end(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (srv->cfg.access_log || srv->cfg.stats)
        record_response(c);
    int closes = closes_after_response(c);
    if (c->x->body.fd >= 0)
        fw_server_app_unlock(srv);        /* the spool file's close frees its blocks */
    fw_body_release(c);
    memset(&c->x->body, 0, sizeof(c->x->body));
    c->x->body.fd = -1;
    if (c->x->head_copy)
        free(c->x->head_copy);
    c->x->head_copy = NULL;
    if (c->x->consume_at_end)
        fw_buf_consume(&c->x->in, c->x->consume_at_end);
    c->x->consume_at_end = 0;
    c->x->head = NULL;
    c->x->head_len = 0;
    c->x->head_scan = 0;
    memset(&c->x->resp, 0, sizeof(c->x->resp));
    c->x->resp.sf_fd = -1;
    c->x->ext = NULL;              /* written by now: the response is on the wire or in `out` */
    c->x->ext_len = c->x->ext_tail_len = 0;
    c->x->outq_mark = -1;          /* (the next request's writes have not stalled yet) */
    c->requests++;
    c->x->no_defer = 0;
    fw_server_request_done(srv);
    c->x->app_active = 0;
    c->x->app_state = NULL;

    /* fw_server_request_done may have ended keep-alive. */
    if (closes || srv->ending_keepalive) {
        if (fw_buf_used(&c->x->in) > 0)
            conn_linger(c);
        else
            fw_conn_close(c);
        return;
    }
    conn_between(c);
}

int fw_conn_may_batch(const fw_conn *c)
{
    /* A response after which the connection closes is written at once,
     * with the batch before it. */
    if (closes_after_response(c))
        return 0;
    if (c->x->resp.sf_left > 0)
        return 0;
    return fw_buf_used(&c->x->in) > c->x->consume_at_end && c->x->batched + 1 < FW_BATCH_MAX_RESPONSES &&
           fw_buf_used(&c->x->out) < FW_BATCH_MAX_BYTES;
}

/* c (READ_HEAD or READ_BODY) is about to wait for input. Batched responses
 * still owed are written first (FLUSH, under the write timeout), then c
 * comes back to this state: DRIVE_ON. With nothing owed, watches for
 * input: DRIVE_WAIT. */
static enum drive wait_for_input(fw_conn *c)
{
    if (out_used(c) == 0) {
        conn_watch(c, EPOLLIN);
        return DRIVE_WAIT;
    }
    c->x->flush_then = c->state;
    c->state = FW_C_FLUSH;
    fw_timer_start(&c->srv->t_write, &c->timer, c->srv->now);
    return DRIVE_ON;
}

/* A uwsgi packet at buf[0..len) into c->x->req. A protocol step (fw_rc.h):
 * 0 with *plen its length, FW_HTTP_INCOMPLETE for more bytes, or the HTTP
 * status to refuse it with (400, 413, 431), *why saying why. */
static int parse_uwsgi(fw_conn *c, const char *buf, size_t len, size_t *plen, const char **why)
{
    const fw_http_limits *lim = &c->srv->cfg.limits;
    fw_uwsgi_packet p = { .vars = c->x->hdrs, .max_vars = max_vars(c->srv, c->lst) };
    long n = fw_uwsgi_parse(buf, len, lim->max_head, &p);
    *plen = 0;
    *why = p.why;
    if (n == FW_UWSGI_INCOMPLETE)
        return FW_HTTP_INCOMPLETE;
    if (n < 0)
        return n == FW_UWSGI_TOO_LARGE ? 431 : 400;
    int rc = fw_uwsgi_request(&p, lim, &c->x->req, why);
    if (rc == 0)
        *plen = (size_t)n;
    return rc;
}

int fw_conn_parse_head(fw_conn *c)
{
    const char *why;
    size_t n;
    if (!c->x->hdrs && conn_headers(c) < 0)
        return 500;
    c->x->req.headers = c->x->hdrs;
    if (!c->lst->uwsgi)
        return fw_http_parse_head(c->x->head, c->x->head_len, &c->srv->cfg.limits, &c->x->req);
    return parse_uwsgi(c, c->x->head, c->x->head_len, &n, &why) == 0 && n == c->x->head_len ? 0 : 400;
}

/* A head of len bytes at the start of `in` is parsed into c->x->req: on to
 * its body, or to the app. */
static void head_parsed(fw_conn *c, const char *buf, size_t len)
{
    fw_server *srv = c->srv;
    c->x->head = buf;
    c->x->head_len = len;
    c->x->head_scan = 0;
    c->x->parse_stale = 0;
    if (srv->cfg.access_log || srv->cfg.stats) {
        /* A fresh reading: work done earlier in this pass (other
         * connections' writes, a signal's handler) is not this request's
         * time. Inline it is the loop's latest reading too. */
        c->x->began_ns = fw_now_ns();
        if (!srv->pool)
            srv->clock_ns = c->x->began_ns;
    }
    /* A 2xx to CONNECT turns the connection into a tunnel for a proxy in
     * front (RFC 9110 9.3.6); whatever the app answers, it is the last
     * response on this connection. */
    c->x->keep_alive = c->x->req.keep_alive && c->x->req.form != FW_TARGET_AUTHORITY &&
                    srv->cfg.keepalive_timeout_ms > 0 && !srv->ending_keepalive;
    enum fw_body_plan plan;
    if (fw_body_setup(c, &plan) < 0) {
        conn_fail(c, 500);
        return;
    }
    switch (plan) {
    case FW_BODY_NONE:
        c->state = FW_C_APP;
        c->x->app_active = 0;
        break;
    case FW_BODY_READ:
        body_start(c);
        break;
    }
}

/* READ_HEAD, HTTP: a head in the `used` bytes at buf? DRIVE_WAIT for more
 * bytes, else DRIVE_ON. */
static enum drive http_head(fw_conn *c, const char *buf, size_t used)
{
    size_t end;
    int stage;
    c->x->req.headers = c->x->hdrs;
    int rc = fw_reqread_head(buf, used, &c->x->head_scan, &c->srv->cfg.limits, &c->x->req, &end, &stage);
    if (rc == FW_HTTP_INCOMPLETE)
        return DRIVE_WAIT;
    if (rc != 0) {
        conn_fail(c, rc);
        return DRIVE_ON;
    }
    head_parsed(c, buf, end);
    return DRIVE_ON;
}

/* READ_HEAD, uwsgi: a packet in the `used` bytes at buf? DRIVE_WAIT for
 * more bytes, else DRIVE_ON. The packet names the client (REMOTE_ADDR) for the
 * log lines and the access log. */
static enum drive uwsgi_head(fw_conn *c, const char *buf, size_t used)
{
    const char *why;
    size_t n;
    int rc = parse_uwsgi(c, buf, used, &n, &why);
    if (rc == FW_HTTP_INCOMPLETE)
        return DRIVE_WAIT;
    if (rc != 0) {
        conn_refuse(c, rc, why);
        return DRIVE_ON;
    }
    fw_peer_from_uwsgi(c);
    head_parsed(c, buf, n);
    return DRIVE_ON;
}

/* READ_HEAD: try to parse a head from `in`, as the listener's protocol
 * says. DRIVE_WAIT for more bytes, else DRIVE_ON. */
static enum drive step_head(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (c->proxy == FW_PX_WAIT || c->proxy == FW_PX_PLAIN_ONLY) {
        int rc = fw_peer_read_proxy(c);
        if (rc < 0) {
            fw_conn_close(c);   /* said why */
            return DRIVE_ON;    /* closed: drive on to see it */
        }
        if (rc == 0)
            return DRIVE_WAIT;
    }
    size_t used = in_used(c);
    if (!c->lst->uwsgi && used > 0 && c->x->head_scan == 0) {
        size_t k = fw_http_skip_crlf(fw_buf_head(&c->x->in), used);
        fw_buf_consume(&c->x->in, k);
        used -= k;
    }
    if (used == 0) {
        /* What came was no request (a PROXY header, CRLFs): idle again, as
         * silent (a load balancer's pre-opened connections, thousands of
         * them, each sent its PROXY header and waits). */
        if (c->x && out_used(c) == 0)
            conn_idle_state(c);
        return DRIVE_WAIT;
    }
    if (!c->head_started) {
        /* First byte of a request on a kept-alive connection: the idle
         * timer gives way to the header timer. */
        c->head_started = srv->now;
        fw_timer_start(&srv->t_head, &c->timer, srv->now);
        if (srv->cfg.stats)
            fw_stats_conns(srv->cfg.stats, (uint64_t)srv->nconns, (uint64_t)srv->t_idle.count);
    }
    const char *buf = fw_buf_head(&c->x->in);
    /* Bytes came (c->x holds them). Its response will need a write buffer:
     * a spare one, taken here on the loop thread (an app thread frames the
     * response). */
    if ((!c->x->hdrs && conn_headers(c) < 0) || conn_buf_take(c, &c->x->out) != 0) {
        conn_fail(c, 500);
        return DRIVE_ON;
    }
    return c->lst->uwsgi ? uwsgi_head(c, buf, used) : http_head(c, buf, used);
}

/* ---- the app ------------------------------------------------------------------ */

/* A request waits for a free app thread, oldest first (fw_server.c). */
static void queue_ready(fw_conn *c, int unread)
{
    fw_timer_stop(&c->timer);
    c->state = FW_C_QUEUED;
    c->unread = unread;
    fw_server_enqueue(c->srv, c);
}

/* Hand c's request (or the rest of its response) to an app thread. */
static void submit(fw_conn *c)
{
    fw_server *srv = c->srv;
    c->state = FW_C_APP;
    fw_timer_stop(&c->timer);
    fw_timer_stop(&c->aside);
    /* Its oneshot watch has fired (or was never armed), so the loop hears
     * nothing of it while a thread owns it. */
    if (c->w.mask && fw_loop_watch(&srv->loop, &c->w, 0) != 0) {
        fw_server_log(srv, FW_LOG_ERROR, "epoll_ctl(%d): %s", c->w.fd, strerror(errno));
        fw_conn_close(c);
        return;
    }
    fw_balance_begin(&srv->bal, &c->place);
    fw_server_run_job(srv, &c->x->job);
}

void fw_conn_dispatch(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (!c->unread) {
        submit(c);
        return;
    }
    /* Its request arrived while every thread was busy and is read now. Its
     * timer stopped while it waited: a fresh connection's header timeout
     * starts again, a kept-alive one waits for its first byte. */
    c->unread = 0;
    c->state = FW_C_READ_HEAD;
    fw_timer_start(c->head_started ? &srv->t_head : &srv->t_idle, &c->timer, srv->now);
    read_and_drive(c);
}

/* Back from the app, inline or from a pool thread. DRIVE_WAIT if c closed,
 * else DRIVE_ON (to write the response). */
static enum drive app_returned(fw_conn *c, enum fw_app_rc rc)
{
    fw_server *srv = c->srv;
    if (c->state == FW_C_CLOSED)
        return DRIVE_WAIT;
    if (rc == FW_APP_CLOSE) {
        fw_conn_close(c);
        return DRIVE_WAIT;
    }
    c->x->app_active = rc == FW_APP_WAIT;
    if (!c->x->app_active)
        c->x->app_state = NULL;
    c->state = FW_C_WRITE;
    fw_timer_start(&srv->t_write, &c->timer, srv->now);
    return DRIVE_ON;
}

void fw_conn_app_returning(fw_conn *c, enum fw_app_rc rc)
{
    /* What it could not send, the loop sends; and the response of a
     * pipelined request waits there to leave with the next ones. */
    if (rc != FW_APP_CLOSE && c->state == FW_C_APP && !(rc == FW_APP_DONE && fw_conn_may_batch(c)))
        (void)fw_conn_flush(c);
}

int fw_conn_arm_ahead(fw_conn *c)
{
    fw_server *srv = c->srv;
    /* Exactly the case where the loop's next step (step_write, request_end,
     * conn_between, step_head) is wait_for_input with nothing to write and
     * nothing read ahead. The server may begin to stop meanwhile: the loop
     * then closes or hands on an armed socket, as any idle one. */
    if (c->x->pool_rc != FW_APP_DONE || c->state != FW_C_APP || c->x->dropping || fw_buf_used(&c->x->out) > 0 ||
        c->x->ext_len > 0 || c->x->resp.sf_left > 0 || closes_after_response(c) ||
        fw_buf_used(&c->x->in) > c->x->consume_at_end)
        return 0;
    if (srv->cfg.access_log || srv->cfg.stats)
        c->x->written_ns = fw_now_ns();
    if (fw_loop_watch(&srv->loop, &c->w, EPOLLIN) == 0)
        return 1;
    /* As a failed re-arm on the loop: the loop logs it and closes the
     * connection after its response, which is out whole. */
    c->x->arm_err = errno;
    return 0;
}

void fw_conn_app_done(fw_conn *c, enum fw_app_rc rc)
{
    c->x->thr = &c->srv->loop_thread;
    if (c->x->arm_err) {
        fw_server_log(c->srv, FW_LOG_ERROR, "epoll_ctl(%d): %s", c->w.fd, strerror(c->x->arm_err));
        c->x->arm_err = 0;
        c->x->must_close = 1;
    }
    if (app_returned(c, rc) == DRIVE_ON)
        conn_drive(c);
}

/* ---- the driver ---------------------------------------------------------------- */

/* READ_BODY: decode what arrived. DRIVE_WAIT when c waits for input, else
 * DRIVE_ON. */
static enum drive step_body(fw_conn *c)
{
    fw_body *b = &c->x->body;
    /* A body not read in place may be spooled to a file. */
    if (!b->inplace)
        fw_server_app_unlock(c->srv);
    int rc = fw_body_preread(c);
    if (rc == 0) {
        c->state = FW_C_APP;
        c->x->app_active = 0;
        return DRIVE_ON;
    }
    if (rc != FW_HTTP_INCOMPLETE) {
        body_failed(c, rc);
        return DRIVE_ON;
    }
    if (b->continue_wanted) {
        /* The client waits for it before sending the body; only while it
         * still does: once body bytes came, or the response began, it is
         * too late to matter. Queued behind any responses owed. */
        b->continue_wanted = 0;
        if (!fw_body_arrived(c) && !c->x->resp.started &&
            fw_buf_append(&c->x->out, CONTINUE_100, sizeof(CONTINUE_100) - 1) == 0)
            b->continue_sent = 1;
    }
    return wait_for_input(c);
}

int fw_conn_may_defer(const fw_conn *c)
{
    const fw_server *srv = c->srv;
    return srv->cfg.write_coalesce_us && !srv->pool && srv->loop.left > 0 && !c->x->no_defer &&
           srv->now >= srv->coalesce_off_until &&
           c->x->ext_len == 0 && c->x->resp.sf_left == 0 && fw_buf_used(&c->x->out) <= FW_DEFER_MAX_BYTES &&
           !closes_after_response(c) && !srv->stopping;
}

void fw_conn_write_deferred(fw_conn *c)
{
    c->x->no_defer = 1;
    conn_drive(c);
}

/* WRITE or FLUSH: write what is owed. DRIVE_WAIT when c waits for the
 * socket, closed or went to its parked thread, else DRIVE_ON. */
static enum drive step_write(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (c->state == FW_C_WRITE && !c->x->app_active && !c->x->parked && fw_conn_may_batch(c)) {
        /* The next request is already here: its response joins this one. */
        c->x->batched++;
        request_end(c);
        return DRIVE_ON;
    }
    if (c->state == FW_C_WRITE && !c->x->deferred && fw_buf_used(&c->x->out) > 0 && fw_conn_may_defer(c)) {
        fw_server_defer(srv, c);
        return DRIVE_WAIT;
    }
    if (c->x->resp.sf_left > 0 || srv->cfg.gil_each_write)
        fw_server_app_unlock(srv);        /* sendfile may wait for the disk; gil_each_write: before each write */
    uint64_t before = pending_out(c);
    int rc = fw_conn_flush(c);
    /* The write timeout is "no progress for that long": a reader that
     * takes bytes, however slowly, is kept. */
    if (pending_out(c) < before || c->timer.list != &srv->t_write)
        fw_timer_start(&srv->t_write, &c->timer, srv->now);
    if (rc == FW_AGAIN) {
        /* The socket is full. It turns writable again only once the kernel
         * has sent a good part of what it holds, which can be megabytes: a
         * slow reader may take longer than the write timeout to get there
         * while it reads all along. The timeout looks at this again. */
        c->x->outq_mark = kernel_outq(c);
        conn_watch(c, EPOLLOUT);
        return DRIVE_WAIT;
    }
    if (rc < 0) {
        fw_conn_close(c);
        return DRIVE_WAIT;
    }
    c->x->batched = 0;
    if (c->state == FW_C_WRITE && c->x->parked) {
        unpark(c, 0);               /* drained for write() */
        return DRIVE_WAIT;
    }
    if (c->state == FW_C_FLUSH) {
        /* Back to reading, its timeout starting now, as after any write. */
        if (c->x->flush_then == FW_C_READ_BODY) {
            c->state = FW_C_READ_BODY;
            fw_timer_start(&srv->t_body, &c->timer, srv->now);
        } else {
            conn_between(c);
        }
    } else if (c->x->app_active) {
        c->state = FW_C_APP;
    } else {
        request_end(c);
    }
    return DRIVE_ON;
}

/* APP: hand the request to the app: to a free thread, or to the ready
 * queue when there is none; inline, call it here. DRIVE_WAIT when c left
 * the loop's hands (or closed), DRIVE_ON after an inline call. */
static enum drive step_app(fw_conn *c)
{
    fw_server *srv = c->srv;
    fw_timer_stop(&c->timer);
    if (srv->pool) {
        if (fw_server_thread_free(srv)) {
            submit(c);
            return DRIVE_WAIT;
        }
        /* It waits for a thread: the responses owed before it (a pipelined
         * batch) must not wait with it. */
        if (fw_buf_used(&c->x->out) > 0) {
            fw_server_app_unlock(srv);
            int rc = fw_conn_flush(c);
            if (rc < 0) {
                fw_conn_close(c);
                return DRIVE_WAIT;
            }
            c->x->batched = 0;
            if (rc == FW_AGAIN)
                conn_watch(c, EPOLLOUT);
            if (c->state == FW_C_CLOSED)
                return DRIVE_WAIT;
        }
        queue_ready(c, 0);
        return DRIVE_WAIT;
    }
    /* Inline: no event for this fd can be dispatched while the app runs,
     * so the registration stays as it is, which saves an epoll_ctl pair
     * per kept-alive request (events that arrive for a connection in APP
     * state are ignored by conn_cb). */
    if (srv->defer_head && fw_server_defer_due(srv))
        c->x->parse_stale = 1;
    /* The loop's clock is read once after the call: the app layer's
     * reading when it took one (request.c, --stats), else here. */
    uint64_t t0 = srv->clock_ns;
    enum fw_app_rc rc = c->x->app_active ? srv->ops->on_writable(srv->app, c)
                                      : srv->ops->on_request(srv->app, c);
    if (srv->cfg.write_coalesce_us || srv->cfg.access_log || srv->cfg.stats) {
        if (srv->clock_ns == t0)
            srv->clock_ns = fw_now_ns();
        if (srv->cfg.write_coalesce_us)
            fw_server_app_took(srv, srv->clock_ns - t0);
    }
    return app_returned(c, rc);
}

static void conn_drive_steps(fw_conn *c)
{
    for (;;) {
        enum drive more;
        switch (c->state) {
        case FW_C_READ_HEAD:
            more = step_head(c) == DRIVE_ON ? DRIVE_ON : wait_for_input(c);
            break;
        case FW_C_READ_BODY:
            more = step_body(c);
            break;
        case FW_C_APP:
            more = step_app(c);
            break;
        case FW_C_WRITE:
        case FW_C_FLUSH:
            more = step_write(c);
            break;
        default:        /* QUEUED, LINGER, CLOSED */
            more = DRIVE_WAIT;
            break;
        }
        if (more == DRIVE_WAIT)
            return;
    }
}

/* (Inline, the GIL may be held when this returns: the next connection of
 * the pass may need it again. The loop lets it go before it sleeps;
 * fw_server_app_unlock says when else.) */
static void conn_drive(fw_conn *c)
{
    conn_drive_steps(c);
    if (c->srv->cfg.gil_each_write)
        fw_server_app_unlock(c->srv);
}

/* READ_HEAD or READ_BODY, the socket is readable: read, then drive. */
static void read_and_drive(fw_conn *c)
{
    fw_server *srv = c->srv;
    int body = c->state == FW_C_READ_BODY;
    int rc = conn_read(c, body ? fw_body_read_size(c) : READ_CHUNK);
    if (rc < 0) {
        /* EOF or reset: never answer a request that was not fully sent. */
        fw_conn_close(c);
        return;
    }
    if (body && rc == 0) {
        fw_timer_start(&srv->t_body, &c->timer, srv->now);
        if (body_too_slow(c)) {
            fw_peer_log(c, FW_LOG_INFO, 0, "request body below --body-min-rate: %llu bytes in %lld ms",
                        (unsigned long long)fw_body_received(c), (long long)(srv->now - c->x->body.started));
            body_failed(c, 408);
        }
    }
    conn_drive(c);
}

static void linger_read(fw_conn *c)
{
    char junk[4096];
    for (int i = 0; i < 16; i++) {
        ssize_t n = read(c->w.fd, junk, sizeof(junk));
        if (n > 0)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        fw_conn_close(c);
        return;
    }
}

static void conn_cb(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    fw_conn *c = CONN_OF(w);
    fw_server *srv = c->srv;
    switch (c->state) {
    case FW_C_READ_HEAD:
        if (!c->head_started)
            c->ready_at = srv->now;     /* its next request arrives: its place in line */
        if (srv->pool && in_used(c) == 0 && out_used(c) == 0 && !srv->stopping) {
            /* A request arriving on an idle connection (kept alive, or new
             * and silent until now) may be better served by another worker:
             * see fw_balance_handoff. It goes there unread. A silent new one
             * was placed at its accept too (accept_one), by the loads of
             * then: they have moved since, and its request is what counts. */
            if (fw_conn_may_move(c) &&
                fw_balance_handoff(&srv->bal, &c->place, c->w.fd, listener_index(c), served_before(c),
                                   fw_peer_passed(c))) {
                fw_conn_close_passed(c);    /* the socket lives on in the datagram, then in the peer */
                return;
            }
            /* Every thread here is busy: it waits its turn, unread. */
            if (!fw_server_thread_free(srv)) {
                queue_ready(c, 1);
                return;
            }
        }
        read_and_drive(c);
        return;
    case FW_C_READ_BODY:
        read_and_drive(c);
        return;
    case FW_C_WRITE:
    case FW_C_FLUSH:
        if (events & EPOLLERR) {
            fw_conn_close(c);
            return;
        }
        conn_drive(c);
        return;
    case FW_C_LINGER:
        linger_read(c);
        if (c->state == FW_C_LINGER)
            conn_watch(c, EPOLLIN | EPOLLRDHUP);
        return;
    case FW_C_QUEUED:
        /* Responses owed before the queued request (step_app) leave while
         * it waits for a thread. */
        if (!(events & EPOLLERR)) {
            int rc = fw_conn_flush(c);
            if (rc == FW_AGAIN)
                conn_watch(c, EPOLLOUT);
            if (rc >= 0)
                return;
        }
        fw_conn_close(c);
        return;
    default:
        return;
    }
}

void fw_conn_on_timeout(fw_conn *c)
{
    fw_server *srv = c->srv;
    switch (c->state) {
    case FW_C_READ_HEAD:
        /* Bytes of a request arrived but not a whole head: 408. A connection
         * that sent nothing (or is idle between requests) just closes. Part
         * of a PROXY header is no request: it closes, said why. */
        if ((c->proxy == FW_PX_WAIT || c->proxy == FW_PX_PLAIN_ONLY) && in_used(c) > 0) {
            fw_peer_log(c, FW_LOG_INFO, 1, "PROXY protocol: header not complete within --header-timeout: "
                        "connection closed");
            fw_conn_close(c);
        } else if (in_used(c) > 0 && c->head_started) {
            conn_fail(c, 408);
            conn_drive(c);
        } else {
            fw_conn_close(c);
        }
        return;
    case FW_C_READ_BODY:
        body_failed(c, 408);
        conn_drive(c);
        return;
    case FW_C_WRITE:
    case FW_C_FLUSH: {
        /* Progress the socket did not report (see step_write): bytes left
         * the kernel's queue since we last looked. */
        int q = kernel_outq(c);
        if (q >= 0 && c->x->outq_mark >= 0 && q < c->x->outq_mark) {
            c->x->outq_mark = q;
            fw_timer_start(&srv->t_write, &c->timer, srv->now);
            return;
        }
        /* Reset rather than close: a plain close would leave the kernel
         * trickling megabytes of queued response into a stalled window. */
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        fw_peer_log(c, FW_LOG_INFO, 0, "client stopped reading for --write-timeout: closing");
        if (setsockopt(c->w.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) != 0)
            fw_server_log(srv, FW_LOG_DEBUG, "SO_LINGER: %s", strerror(errno));
        if (c->x->parked) {
            c->x->must_close = 1;          /* closes (with a reset) once the app returns */
            unpark(c, -ETIMEDOUT);
        } else {
            fw_conn_close(c);
        }
        return;
    }
    default:
        fw_conn_close(c);
        return;
    }
}

/* Is the client's next request already waiting in the socket? A
 * connection with unread input is not idle: closing it would answer that
 * request with a reset. */
static int input_waiting(const fw_conn *c)
{
    char b;
    ssize_t n;
    do {
        n = recv(c->w.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n > 0;
}

/* Idle, or queued before its next request was read: while retiring, give it
 * unread to a worker that serves on. Returns 0 when handed over (closed
 * here), FW_AGAIN when it is to be tried again soon, -ESRCH when nobody
 * will take it (or the server is not handing on). */
static int pass_idle_on(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (!srv->handing_on)
        return -ESRCH;
    int rc = fw_balance_pass_on(&srv->bal, c->w.fd, listener_index(c), served_before(c), fw_peer_passed(c));
    if (rc == 0) {
        fw_conn_close_passed(c);
        return 0;
    }
    /* Again soon: their queues are full, or (early in the stop) the
     * replacement that made the master retire us is not up yet. */
    if (rc == FW_AGAIN || srv->now < srv->pass_wait_until) {
        srv->pass_waiting = 1;
        return FW_AGAIN;
    }
    return -ESRCH;
}

void fw_conn_pass_on_again(fw_conn *c)
{
    if ((c->state == FW_C_READ_HEAD && in_used(c) == 0) || (c->state == FW_C_QUEUED && c->unread))
        fw_conn_start_stop(c);
}

void fw_conn_start_stop(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (owned_by_thread(c))
        return;     /* its thread builds its head, asking fw_server_ends_keepalive */
    switch (c->state) {
    case FW_C_QUEUED:
        /* Its request is served (keep_alive was decided when it was parsed,
         * or will be, with the stop in view); an unread one may go to a
         * worker that serves on. */
        if (c->unread)
            (void)pass_idle_on(c);
        else if (srv->ending_keepalive)
            c->x->keep_alive = 0;
        return;
    case FW_C_READ_HEAD:
        if (in_used(c) > 0) {
            c->x->keep_alive = 0;  /* a request half received: serve it, then close */
            return;
        }
        /* Idle (kept alive, or new and silent). A retiring worker gives it,
         * unread, to a worker that serves on: the client never notices.
         * Handed over, or to be tried again soon: nothing more now. */
        if (pass_idle_on(c) >= 0)
            return;
        /* Nobody to give it to. A kept-alive connection with nothing
         * waiting is closed (clients retry those); with its next request
         * already waiting, that request is served, with Connection: close.
         * A fresh connection whose request has not arrived yet is a
         * request in flight: it is served within the graceful timeout. */
        if ((c->requests > 0 || c->kept_alive) && !input_waiting(c))
            fw_conn_close(c);
        /* Else its request is served: its head, parsed with the stop in
         * view, says whether it may keep the connection. */
        return;
    case FW_C_LINGER:
        fw_conn_close(c);
        return;
    default:
        /* Finish this response; then, unless handing on, close. */
        if (srv->ending_keepalive)
            c->x->keep_alive = 0;
        return;
    }
}

int fw_conn_may_move(const fw_conn *c)
{
    return !c->handed_in_at || c->srv->now - c->handed_in_at >= FW_HANDOFF_HOLD_MS;
}

int fw_conn_give_away(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (!c->unread || srv->stopping || !fw_conn_may_move(c) ||
        !fw_balance_give(&srv->bal, c->w.fd, listener_index(c), served_before(c), fw_peer_passed(c)))
        return FW_AGAIN;
    fw_conn_close_passed(c);        /* leaves the ready queue with it */
    return 0;
}

int fw_conn_evict_idle(fw_conn *c)
{
    if (c->state != FW_C_READ_HEAD || c->head_started || in_used(c) > 0 || out_used(c) > 0 ||
        input_waiting(c))
        return FW_AGAIN;
    fw_conn_close(c);
    return 0;
}
