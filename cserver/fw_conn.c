/* fw_conn: the per-connection state machine. See fw_conn.h.
 *
 * conn_drive() is the only place that moves a connection between states; the
 * event callbacks just feed it. Pipelined requests are served by the same
 * loop in order, without waiting for another EPOLLIN, and their responses
 * leave together (see fw_conn.h: the batch). */
#include "fw_conn.h"
#include "fw_internal.h"
#include "fw_pool.h"
#include "fw_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define READ_CHUNK (16 * 1024)
#define BODY_CHUNK (64 * 1024)
#define IDLE_KEEP_BYTES (16 * 1024)   /* an idle connection keeps at most this much buffer */

#define CONN_OF(wp) ((fw_conn *)((char *)(wp) - offsetof(fw_conn, w)))

static void conn_cb(fw_loop *loop, fw_watch *w, uint32_t events);
static void conn_drive(fw_conn *c);
static void app_unlock(fw_server *srv);
static int proxy_start(fw_conn *c, fw_pass_client client);

fw_conn *fw_conn_new(fw_server *srv, fw_listener *lst, int fd,
                     const struct sockaddr *sa, socklen_t salen, int kept_alive, fw_pass_client client)
{
    fw_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    /* Filled by the parser before any read: no need to zero it. */
    c->hdrs = malloc((srv->cfg.limits.max_headers ? srv->cfg.limits.max_headers : 1) * sizeof(fw_header));
    if (!c->hdrs) {
        free(c);
        return NULL;
    }
    c->w.fd = fd;
    c->w.cb = conn_cb;
    c->w.oneshot = srv->pool != NULL;
    c->srv = srv;
    c->lst = lst;
    c->thr = &srv->loop_thread;
    if (salen > sizeof(c->peer))
        salen = sizeof(c->peer);
    memcpy(&c->peer, sa, salen);
    c->peer_len = salen;
    c->fwd_allowed = fw_netlist_match(srv->cfg.forwarded_allow, sa, salen);
    c->body.fd = -1;
    c->resp.sf_fd = -1;
    c->state = FW_C_READ_HEAD;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    c->kept_alive = kept_alive;
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
    if (proxy_start(c, client) != 0) {
        fw_conn_close(c);
        return c;
    }
    /* The request is nearly always in the socket already: read it now, so
     * no epoll round trip is spent on it, and it is counted as it is
     * dispatched, in this same loop pass. A silent connection only steers
     * placement for a moment (fw_balance_silent). */
    if (fw_conn_read(c, READ_CHUNK) < 0) {
        fw_conn_close(c);       /* already gone; freed with the graveyard */
        return c;
    }
    if (fw_buf_used(&c->in) == 0) {
        if (srv->stopping) {
            fw_conn_start_stop(c);      /* handed over while we stop */
        } else if (srv->pool && !kept_alive) {
            fw_balance_silent(&srv->bal, &c->place);
            if (c->place.pending)
                fw_timer_start(&srv->t_grace, &c->grace, srv->now);
        }
    }
    conn_drive(c);
    return c;
}

void fw_conn_free(fw_conn *c)
{
    fw_buf_free(&c->in);
    fw_buf_free(&c->out);
    fw_buf_free(&c->log_headers);
    fw_body_release(c);
    free(c->head_copy);
    free(c->hdrs);
    free(c);
}

void fw_conn_close(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (c->state == FW_C_CLOSED)
        return;
    if (c->app_state && srv->ops->on_drop)
        srv->ops->on_drop(srv->app, c);
    c->app_state = NULL;
    fw_balance_end(&srv->bal, &c->place);     /* counted, but its request never ran */
    c->state = FW_C_CLOSED;
    fw_timer_stop(&c->timer);
    fw_timer_stop(&c->grace);
    if (close(c->w.fd) != 0 && errno != EINTR)
        fw_server_log(srv, FW_LOG_DEBUG, "close(%d): %s", c->w.fd, strerror(errno));
    fw_loop_forget(&c->w);
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

static void conn_watch(fw_conn *c, uint32_t mask)
{
    if (fw_loop_watch(&c->srv->loop, &c->w, mask) != 0) {
        fw_server_log(c->srv, FW_LOG_ERROR, "epoll_ctl(%d): %s", c->w.fd, strerror(errno));
        fw_conn_close(c);
    }
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
    c->must_close = 1;
    if (c->resp.started)
        return;     /* too late for a clean answer: the close says it */
    fw_resp_error_head(c, status);
}

/* The start of what the client sent, escaped, into shown (80 characters
 * at most, then "..."), for log lines: it usually shows the fault. */
static void input_start(const fw_conn *c, char shown[85])
{
    size_t n = 0, i = 0;
    const unsigned char *p = (const unsigned char *)fw_buf_head(&c->in);
    size_t used = fw_buf_used(&c->in);
    for (; i < used && n + 4 < 81; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\')
            shown[n++] = (char)p[i];
        else
            n += (size_t)snprintf(shown + n, 81 - n, "\\x%02x", p[i]);
    }
    memcpy(shown + n, i < used ? "..." : "", i < used ? 4 : 1);
}

/* One line per rejected request: the client, the status and why, and the
 * start of what it sent. */
static void log_rejected(fw_conn *c, int status)
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
    const char *host, *port;
    fw_conn_peer_text(c, &host, &port);
    char shown[85];
    input_start(c, shown);
    fw_server_log(c->srv, FW_LOG_INFO, "%s%s%s: %d %s: \"%s\"", host, *port ? ":" : "", port, status,
                  why, shown);
}

/* ---- the PROXY protocol header (--proxy-protocol) ---------------------- */

static void set_peer(fw_conn *c, const struct sockaddr *sa, socklen_t len)
{
    if (len > sizeof(c->peer))
        len = sizeof(c->peer);
    memcpy(&c->peer, sa, len);
    c->peer_len = len;
    c->peer_text = 0;
}

/* No request on this connection: say why, with the socket's peer and the
 * start of what it sent, and close it. */
static void proxy_refuse(fw_conn *c, const char *why)
{
    const char *host, *port;
    fw_conn_peer_text(c, &host, &port);
    char shown[85];
    input_start(c, shown);
    fw_server_log(c->srv, FW_LOG_INFO, "%s%s%s: PROXY protocol: %s: connection closed: \"%s\"", host,
                  *port ? ":" : "", port, why, shown);
    fw_conn_close(c);
}

/* A new connection: a header is to come, from a peer in --proxy-allow-from
 * (unix-socket peers are). One handed over by another worker: the header
 * was read there, or (client.sa NULL) it is still to come. Returns 0, or
 * -1 when c must be closed (said why). */
static int proxy_start(fw_conn *c, fw_pass_client client)
{
    const fw_config *cfg = &c->srv->cfg;
    if (client.sa) {
        c->proxy = client.sa->sa_family == AF_UNSPEC ? FW_PX_READ : FW_PX_NAMED;
        if (c->proxy == FW_PX_NAMED)
            set_peer(c, client.sa, client.len);
        return 0;
    }
    if (!cfg->proxy_protocol)
        return 0;
    if (!fw_netlist_match(cfg->proxy_allow, (const struct sockaddr *)&c->peer, c->peer_len)) {
        const char *host, *port;
        fw_conn_peer_text(c, &host, &port);
        fw_server_log(c->srv, FW_LOG_INFO, "%s%s%s: PROXY protocol: peer not in --proxy-allow-from: "
                      "connection closed", host, *port ? ":" : "", port);
        return -1;
    }
    c->proxy = FW_PX_WAIT;
    return 0;
}

/* READ_HEAD before the first request: the header. Returns 1 once it is
 * read (the request may follow), 0 to wait for more bytes (under the
 * header timeout, running since accept), -1 when c was closed. */
static int step_proxy(fw_conn *c)
{
    fw_proxy_hdr h;
    long n = fw_proxy_parse(fw_buf_head(&c->in), fw_buf_used(&c->in), c->srv->cfg.proxy_protocol, &h);
    if (n == FW_PROXY_INCOMPLETE)
        return 0;
    if (n < 0) {
        proxy_refuse(c, h.why);
        return -1;
    }
    fw_buf_consume(&c->in, (size_t)n);
    c->proxy = h.local ? FW_PX_READ : FW_PX_NAMED;
    if (!h.local)
        set_peer(c, (const struct sockaddr *)&h.client, h.client_len);
    return 1;
}

/* For a hand-off: what the worker taking c must know of its client. */
static fw_pass_client passed_client(const fw_conn *c)
{
    static const struct sockaddr unspec = { .sa_family = AF_UNSPEC };
    if (c->proxy == FW_PX_NAMED)
        return (fw_pass_client){ (const struct sockaddr *)&c->peer, c->peer_len };
    if (c->proxy == FW_PX_READ)
        return (fw_pass_client){ &unspec, sizeof(unspec) };
    return (fw_pass_client){ NULL, 0 };
}

/* Answer a protocol error and close. */
static void conn_fail(fw_conn *c, int status)
{
    log_rejected(c, status);
    if (!c->head) {
        /* The head did not parse, so req says nothing: a HEAD request still
         * must not get a body (RFC 9110 9.3.2). */
        c->req.is_head = fw_buf_used(&c->in) >= 5 && memcmp(fw_buf_head(&c->in), "HEAD ", 5) == 0;
        c->req.minor = 1;
    }
    fw_conn_queue_error(c, status);
    c->app_active = 0;
    c->state = FW_C_WRITE;
}

/* The access log line of the response just sent, while the request's head
 * is still in place; and, every so often, a word on lines it had to drop. */
static void log_access(fw_conn *c, int64_t micros)
{
    fw_server *srv = c->srv;
    fw_alog *al = srv->cfg.access_log;
    fw_alog_rec r = {
        .req = c->head ? &c->req : NULL,
        .status = c->resp.status,
        .body_bytes = c->resp.sent,
        .micros = micros,
        .captured = fw_buf_used(&c->log_headers) ? &c->log_headers : NULL,
    };
    fw_conn_peer_text(c, &r.host, &r.port);
    fw_alog_line(al, &r);
    char msg[256];
    if (fw_alog_report(al, srv->now, msg, sizeof(msg)))
        fw_server_log(srv, FW_LOG_WARNING, "%s", msg);
    fw_buf_reset(&c->log_headers, 1024);
}

/* The response is on the wire: count it, and log it. */
static void record_response(fw_conn *c)
{
    fw_server *srv = c->srv;
    /* A response still queued (a pipelined batch) was done when the app
     * returned: the app layer's clock reading then serves. */
    uint64_t now = c->app_done_ns && fw_buf_used(&c->out) > 0 ? c->app_done_ns : fw_now_ns();
    int64_t micros = c->began_ns && now > c->began_ns ? (int64_t)((now - c->began_ns) / 1000) : 0;
    c->began_ns = c->app_done_ns = 0;
    if (srv->cfg.stats)
        fw_stats_request_done(srv->cfg.stats, c->resp.status, c->resp.sent, (uint64_t)micros);
    if (srv->cfg.access_log)
        log_access(c, micros);
}

/* Between two requests, kept alive: wait for the next one under the idle
 * timeout (its first byte starts the header timeout). With nothing read and
 * nothing owed, the connection is idle: its buffers shrink, and a stopping
 * server applies its stop rule to it. */
static void conn_between(fw_conn *c)
{
    fw_server *srv = c->srv;
    c->state = FW_C_READ_HEAD;
    c->head_started = 0;
    fw_timer_start(&srv->t_idle, &c->timer, srv->now);
    if (srv->cfg.stats)
        fw_stats_conns(srv->cfg.stats, (uint64_t)srv->nconns, (uint64_t)srv->t_idle.count);
    if (fw_buf_used(&c->in) == 0 && fw_buf_used(&c->out) == 0) {
        fw_buf_reset(&c->in, IDLE_KEEP_BYTES);
        fw_buf_reset(&c->out, IDLE_KEEP_BYTES);
        if (srv->stopping)
            fw_conn_start_stop(c);      /* idle now: hand it on while retiring */
    }
}

/* The app did not read the whole (streamed) request body: where the next
 * request starts is not known. */
static int body_unread(const fw_conn *c)
{
    return c->body.src == FW_B_LIVE && !c->body.done;
}

/* Does the connection close after the response at hand? unread:
 * body_unread(c), asked while the body is still set up. request_end closes
 * (or lingers) on it; fw_conn_may_batch writes such a response at once,
 * with the batch before it. */
static int closes_after_response(const fw_conn *c, int unread)
{
    return c->must_close || !c->keep_alive || c->srv->ending_keepalive || unread;
}

/* The response is on the wire, or queued at the end of a batch (then
 * counted and logged as it is queued): recycle the connection for the next
 * request. */
static void request_end(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (srv->cfg.access_log || srv->cfg.stats)
        record_response(c);
    int unread = body_unread(c);
    if (c->body.fd >= 0)
        app_unlock(srv);        /* the spool file's close frees its blocks */
    fw_body_release(c);
    memset(&c->body, 0, sizeof(c->body));
    c->body.fd = -1;
    free(c->head_copy);
    c->head_copy = NULL;
    if (c->consume_at_end)
        fw_buf_consume(&c->in, c->consume_at_end);
    c->consume_at_end = 0;
    c->head = NULL;
    c->head_len = 0;
    c->head_scan = 0;
    memset(&c->resp, 0, sizeof(c->resp));
    c->resp.sf_fd = -1;
    c->requests++;
    fw_server_request_done(srv);
    c->app_active = 0;
    c->app_state = NULL;

    /* Asked after fw_server_request_done, which may end keep-alive. */
    if (closes_after_response(c, unread)) {
        if (unread || fw_buf_used(&c->in) > 0)
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
    if (closes_after_response(c, body_unread(c)))
        return 0;
    if (c->resp.sf_left > 0)
        return 0;
    return fw_buf_used(&c->in) > c->consume_at_end && c->batched + 1 < FW_BATCH_MAX_RESPONSES &&
           fw_buf_used(&c->out) < FW_BATCH_MAX_BYTES;
}

/* c (READ_HEAD or READ_BODY) is about to wait for input. Batched responses
 * still owed are written first (FLUSH, under the write timeout), then c
 * comes back to this state: returns 1 to keep driving. With nothing owed,
 * watches for input: returns 0 to wait. */
static int wait_for_input(fw_conn *c)
{
    if (fw_buf_used(&c->out) == 0) {
        conn_watch(c, EPOLLIN);
        return 0;
    }
    c->flush_then = c->state;
    c->state = FW_C_FLUSH;
    fw_timer_start(&c->srv->t_write, &c->timer, c->srv->now);
    return 1;
}

/* READ_HEAD: try to parse a head from `in`. Returns 1 to keep driving, 0 to wait. */
static int step_head(fw_conn *c)
{
    fw_server *srv = c->srv;
    if (c->proxy == FW_PX_WAIT) {
        int rc = step_proxy(c);
        if (rc <= 0)
            return rc < 0;      /* closed: drive on to see it */
    }
    size_t used = fw_buf_used(&c->in);
    if (c->head_scan == 0 && used > 0) {
        size_t k = fw_http_skip_crlf(fw_buf_head(&c->in), used);
        fw_buf_consume(&c->in, k);
        used -= k;
    }
    if (used == 0)
        return 0;
    if (!c->head_started) {
        /* First byte of a request on a kept-alive connection: the idle
         * timer gives way to the header timer. */
        c->head_started = srv->now;
        fw_timer_start(&srv->t_head, &c->timer, srv->now);
        if (srv->cfg.stats)
            fw_stats_conns(srv->cfg.stats, (uint64_t)srv->nconns, (uint64_t)srv->t_idle.count);
    }
    const char *buf = fw_buf_head(&c->in);
    size_t end = fw_http_head_end(buf, used, &c->head_scan);
    int rc;
    if (!end) {
        rc = fw_http_check_partial(buf, used, &srv->cfg.limits);
        if (rc == FW_HTTP_INCOMPLETE)
            return 0;
        conn_fail(c, rc);
        return 1;
    }
    if (end > srv->cfg.limits.max_head) {
        /* The request line alone may be what is too long. */
        rc = fw_http_check_partial(buf, end, &srv->cfg.limits);
        conn_fail(c, rc == 414 ? 414 : 431);
        return 1;
    }
    c->req.headers = c->hdrs;
    rc = fw_http_parse_head(buf, end, &srv->cfg.limits, &c->req);
    if (rc != 0) {
        conn_fail(c, rc);
        return 1;
    }
    c->head = buf;
    c->head_len = end;
    c->head_scan = 0;
    if (srv->cfg.access_log || srv->cfg.stats)
        c->began_ns = fw_now_ns();
    c->keep_alive = c->req.keep_alive && srv->cfg.keepalive_timeout_ms > 0 && !srv->ending_keepalive;
    if (fw_body_setup(c) != 0) {
        conn_fail(c, 500);
        return 1;
    }
    return 1;
}

/* Back from the app, inline or from a pool thread. Returns 0 if c closed. */
static int app_returned(fw_conn *c, int rc)
{
    fw_server *srv = c->srv;
    if (c->state == FW_C_CLOSED)
        return 0;
    if (rc == FW_APP_CLOSE) {
        fw_conn_close(c);
        return 0;
    }
    c->app_active = rc == FW_APP_WAIT;
    if (!c->app_active)
        c->app_state = NULL;
    c->state = FW_C_WRITE;
    fw_timer_start(&srv->t_write, &c->timer, srv->now);
    return 1;
}

void fw_conn_app_done(fw_conn *c, int rc)
{
    c->thr = &c->srv->loop_thread;
    if (app_returned(c, rc))
        conn_drive(c);
}

/* Inline, the app layer may keep the GIL from one request to the next of
 * a pipelined batch (parsing a request from the buffer takes no syscall);
 * it is let go before the batch's write, before a body that may be spooled
 * to a file, and when the connection is left (cheap syscalls such as a
 * socket's close or epoll_ctl may still run while it is held). */
static void app_unlock(fw_server *srv)
{
    if (srv->ops->unlock)
        srv->ops->unlock(srv->app);
}

static void conn_drive_steps(fw_conn *c);

static void conn_drive(fw_conn *c)
{
    conn_drive_steps(c);
    app_unlock(c->srv);
}

static void conn_drive_steps(fw_conn *c)
{
    fw_server *srv = c->srv;
    for (;;) {
        switch (c->state) {
        case FW_C_READ_HEAD:
            if (!step_head(c) && !wait_for_input(c))
                return;
            break;
        case FW_C_READ_BODY: {
            /* A body not read in place may be spooled to a file. */
            if (!c->body.inplace)
                app_unlock(srv);
            int rc = fw_body_preread(c);
            if (rc == FW_HTTP_INCOMPLETE) {
                if (!wait_for_input(c))
                    return;
            } else if (rc != 0) {
                conn_fail(c, rc);
            }
            break;
        }
        case FW_C_APP: {
            fw_timer_stop(&c->timer);
            if (srv->pool) {
                /* A thread owns it now. Its oneshot watch has fired (or was
                 * never armed), so the loop hears nothing of it meanwhile. */
                if (c->w.mask)
                    conn_watch(c, 0);
                fw_timer_stop(&c->grace);
                fw_balance_begin(&srv->bal, &c->place);
                fw_pool_submit(srv->pool, &c->job);
                return;
            }
            /* Inline: no event for this fd can be dispatched while the app
             * runs, so the registration stays as it is, which saves an
             * epoll_ctl pair per kept-alive request (events that arrive for
             * a connection in APP state are ignored by conn_cb). */
            int rc = c->app_active ? srv->ops->on_writable(srv->app, c)
                                   : srv->ops->on_request(srv->app, c);
            if (!app_returned(c, rc))
                return;
            break;
        }
        case FW_C_WRITE:
        case FW_C_FLUSH: {
            if (c->state == FW_C_WRITE && !c->app_active && fw_conn_may_batch(c)) {
                /* The next request is already here: its response joins this one. */
                c->batched++;
                request_end(c);
                break;
            }
            app_unlock(srv);
            int rc = fw_conn_flush(c);
            if (rc == FW_IO_AGAIN) {
                if (c->timer.list != &srv->t_write)
                    fw_timer_start(&srv->t_write, &c->timer, srv->now);
                conn_watch(c, EPOLLOUT);
                return;
            }
            if (rc != FW_IO_DONE) {
                fw_conn_close(c);
                return;
            }
            c->batched = 0;
            if (c->state == FW_C_FLUSH) {
                /* Back to reading, its timeout starting now, as after any write. */
                if (c->flush_then == FW_C_READ_BODY)
                    fw_conn_body_wait(c);
                else
                    conn_between(c);
            } else if (c->app_active) {
                c->state = FW_C_APP;
            } else {
                request_end(c);
            }
            break;
        }
        case FW_C_LINGER:
        case FW_C_CLOSED:
            return;
        }
    }
}

/* Read once from the socket into `in`. Returns 1 on data, 0 on EAGAIN, -1 on
 * EOF or error (the caller decides how to close). */
int fw_conn_read(fw_conn *c, size_t want)
{
    if (fw_buf_reserve(&c->in, want) != 0)
        return -1;
    for (;;) {
        ssize_t n = read(c->w.fd, fw_buf_tail(&c->in), fw_buf_room(&c->in));
        if (n > 0) {
            c->in.len += (size_t)n;
            return 1;
        }
        if (n == 0)
            return -1;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
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
    case FW_C_READ_BODY: {
        /* A request arriving on an idle connection (kept alive, or new and
         * silent until now) may be better served by another worker: see
         * fw_balance_handoff. It goes there unread. */
        if (c->state == FW_C_READ_HEAD && srv->pool && fw_buf_used(&c->in) == 0 &&
            fw_buf_used(&c->out) == 0 && !srv->stopping &&
            fw_balance_handoff(&srv->bal, &c->place, c->w.fd, listener_index(c), served_before(c),
                               passed_client(c))) {
            fw_conn_close_passed(c);    /* the socket lives on in the datagram, then in the peer */
            return;
        }
        size_t want = c->state == FW_C_READ_BODY ? BODY_CHUNK : READ_CHUNK;
        int rc = fw_conn_read(c, want);
        if (rc < 0) {
            /* EOF or reset: never answer a request that was not fully sent. */
            fw_conn_close(c);
            return;
        }
        if (rc == 0) {
            conn_watch(c, EPOLLIN);     /* re-arm a oneshot watch */
            return;
        }
        if (c->state == FW_C_READ_BODY)
            fw_timer_start(&srv->t_body, &c->timer, srv->now);
        conn_drive(c);
        return;
    }
    case FW_C_WRITE:
    case FW_C_FLUSH:
        if (events & (EPOLLERR)) {
            fw_conn_close(c);
            return;
        }
        fw_timer_start(&srv->t_write, &c->timer, srv->now);
        conn_drive(c);
        return;
    case FW_C_LINGER:
        linger_read(c);
        if (c->state == FW_C_LINGER)
            conn_watch(c, EPOLLIN | EPOLLRDHUP);
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
        if (c->proxy == FW_PX_WAIT && fw_buf_used(&c->in) > 0) {
            proxy_refuse(c, "header not complete within --header-timeout");
        } else if (fw_buf_used(&c->in) > 0 && c->head_started) {
            fw_server_log(srv, FW_LOG_DEBUG, "fd %d: header timeout", c->w.fd);
            conn_fail(c, 408);
            conn_drive(c);
        } else {
            fw_conn_close(c);
        }
        return;
    case FW_C_READ_BODY:
        fw_server_log(srv, FW_LOG_DEBUG, "fd %d: body timeout", c->w.fd);
        conn_fail(c, 408);
        conn_drive(c);
        return;
    case FW_C_WRITE:
    case FW_C_FLUSH: {
        /* Reset rather than close: a plain close would leave the kernel
         * trickling megabytes of queued response into a stalled window. */
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        fw_server_log(srv, FW_LOG_INFO, "fd %d: client stopped reading, closing", c->w.fd);
        if (setsockopt(c->w.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) != 0)
            fw_server_log(srv, FW_LOG_DEBUG, "SO_LINGER: %s", strerror(errno));
        fw_conn_close(c);
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

void fw_conn_start_stop(fw_conn *c)
{
    fw_server *srv = c->srv;
    switch (c->state) {
    case FW_C_READ_HEAD:
        if (fw_buf_used(&c->in) > 0) {
            c->keep_alive = 0;  /* a request half received: serve it, then close */
            return;
        }
        /* Idle (kept alive, or new and silent). A retiring worker gives it,
         * unread, to a worker that serves on: the client never notices. */
        if (srv->handing_on) {
            int rc = fw_balance_pass_on(&srv->bal, c->w.fd, listener_index(c), served_before(c),
                                        passed_client(c));
            if (rc == 0) {
                fw_conn_close_passed(c);
                return;
            }
            /* Again soon: their queues are full, or (early in the stop) the
             * replacement that made the master retire us is not up yet. */
            if (rc == FW_AGAIN || srv->now < srv->pass_wait_until) {
                srv->pass_waiting = 1;
                return;
            }
        }
        /* Nobody to give it to. A kept-alive connection with nothing
         * waiting is closed (clients retry those); with its next request
         * already waiting, that request is served, with Connection: close.
         * A fresh connection whose request has not arrived yet is a
         * request in flight: it is served within the graceful timeout. */
        if ((c->requests > 0 || c->kept_alive) && !input_waiting(c))
            fw_conn_close(c);
        else
            c->keep_alive = 0;
        return;
    case FW_C_LINGER:
        fw_conn_close(c);
        return;
    default:
        /* Finish this response; then, unless handing on, close. */
        if (srv->ending_keepalive)
            c->keep_alive = 0;
        return;
    }
}

void fw_conn_peer_text(fw_conn *c, const char **host, const char **port)
{
    if (!c->peer_text) {
        const struct sockaddr_storage *ss = &c->peer;
        unsigned p = 0;
        c->peer_host[0] = 0;
        c->peer_port[0] = 0;
        if (ss->ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
            if (!inet_ntop(AF_INET, &a->sin_addr, c->peer_host, sizeof(c->peer_host)))
                c->peer_host[0] = 0;
            p = ntohs(a->sin_port);
        } else if (ss->ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
            int ok = IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)
                         ? inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], c->peer_host, sizeof(c->peer_host)) != NULL
                         : inet_ntop(AF_INET6, &a->sin6_addr, c->peer_host, sizeof(c->peer_host)) != NULL;
            if (!ok)
                c->peer_host[0] = 0;
            p = ntohs(a->sin6_port);
        } else if (ss->ss_family == AF_UNIX) {
            const struct sockaddr_un *u = (const struct sockaddr_un *)ss;
            size_t off = offsetof(struct sockaddr_un, sun_path);
            size_t n = c->peer_len > off ? strnlen(u->sun_path, c->peer_len - off) : 0;
            if (n >= sizeof(c->peer_host))
                n = sizeof(c->peer_host) - 1;
            memcpy(c->peer_host, u->sun_path, n);
            c->peer_host[n] = 0;
        }
        if (ss->ss_family == AF_INET || ss->ss_family == AF_INET6)
            snprintf(c->peer_port, sizeof(c->peer_port), "%u", p);
        c->peer_text = 1;
    }
    *host = c->peer_host;
    *port = c->peer_port;
}

/* Used by fw_body.c when a pre-read body is complete. */
void fw_conn_body_ready(fw_conn *c)
{
    c->state = FW_C_APP;
    c->app_active = 0;
}

/* Used by fw_body.c to move to READ_BODY. */
void fw_conn_body_wait(fw_conn *c)
{
    c->state = FW_C_READ_BODY;
    fw_timer_start(&c->srv->t_body, &c->timer, c->srv->now);
}
