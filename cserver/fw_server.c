/* fw_server: the loop around listeners and connections. See fw_server.h. */
#define _GNU_SOURCE
#include "fw_server.h"
#include "fw_conn.h"
#include "fw_internal.h"
#include "fw_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define PASS_RETRY_MS 10       /* while idle connections wait for a peer to take them */
#define QUIET_TAKE_BACK_MS 50  /* finished requests a thread left unannounced (fw_pool_quiet) */
#define OWN_OFF_MS 1000        /* after a call was taken over, how long every request goes to
                                * an app thread: an app whose calls block (a database, an HTTP
                                * call) pays a takeover a second, not one a request */
#define PASS_WAIT_MS 3000      /* how long a retiring worker waits for a first peer: the
                                * master starts a replacement when it sees it stop (well
                                * under a second), which then boots */
#define RELEASE_TAKE_MAX 65536 /* reuseport: at most this many queued connections taken per
                                * listener before its release (a kernel queue holds fewer) */

#define CONN_OF_ASIDE(tp) ((fw_conn *)((char *)(tp) - offsetof(fw_conn, aside)))
#define LISTENER_OF(wp) ((fw_listener *)((char *)(wp) - offsetof(fw_listener, w)))
#define SERVER_OF_STOP(wp) ((fw_server *)((char *)(wp) - offsetof(fw_server, stop_w)))
#define SERVER_OF_SIG(wp) ((fw_server *)((char *)(wp) - offsetof(fw_server, sig_w)))
#define CONN_OF_TIMER(tp) ((fw_conn *)((char *)(tp) - offsetof(fw_conn, timer)))

void fw_config_defaults(fw_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->limits.max_line = 8190;
    cfg->limits.max_head = 64 * 1024;
    cfg->limits.max_headers = 100;
    cfg->limits.max_body = 1024ull * 1024 * 1024;
    cfg->header_timeout_ms = 10000;
    cfg->body_timeout_ms = 30000;
    cfg->body_min_rate = 500;            /* mod_reqtimeout's; a slow mobile link does 5,000+ */
    cfg->keepalive_timeout_ms = 75000;   /* above proxies' upstream idle timeouts (docs/proxies.md) */
    cfg->write_timeout_ms = 30000;
    cfg->graceful_timeout_ms = 30000;
    cfg->spool_threshold = 1024 * 1024;
    cfg->spool_dir = NULL;
    cfg->max_connections = 10000;
    cfg->accept_batch = 64;
    cfg->write_coalesce_us = 1000;
    cfg->inline_first = 1;
}

void fw_server_log(fw_server *srv, int level, const char *fmt, ...)
{
    if (!srv->ops->log)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    srv->ops->log(srv->app, level, msg);
}

void fw_date_refresh(fw_date *d)
{
    static const char days[7][4] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
    static const char months[12][4] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };
    time_t now = time(NULL);
    if (now == d->sec && d->len)
        return;
    struct tm tm;
    if (!gmtime_r(&now, &tm))
        return;
    /* Formatted by hand: strftime would follow the process locale. */
    int n = snprintf(d->buf, sizeof(d->buf), "Date: %s, %02d %s %04d %02d:%02d:%02d GMT\r\n",
                     days[tm.tm_wday], tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900,
                     tm.tm_hour, tm.tm_min, tm.tm_sec);
    if (n > 0 && (size_t)n < sizeof(d->buf)) {
        d->len = (size_t)n;
        d->sec = now;
    }
}

/* Whether the loop lets the listeners be watched; fw_balance decides when
 * they actually are. */
static void set_accepting(fw_server *srv, int on)
{
    if (srv->accepting == on)
        return;
    srv->accepting = on;
    fw_balance_allow(&srv->bal, on);
}

/* At --max-connections a kept-alive connection idle this long may be
 * closed for a new client (evict_idle). Not sooner: a proxy reuses its
 * pooled upstream connections within milliseconds under load, and closing
 * one as it sends its next request answers that request with a 502. */
#define EVICT_MIN_IDLE_MS 2000

/* When the longest idle kept-alive connection may be evicted (ms), or
 * INT64_MAX with none. */
static int64_t evictable_at(const fw_server *srv)
{
    const fw_tnode *n = srv->t_idle.head;
    if (!n || srv->t_idle.timeout_ms <= 0)
        return INT64_MAX;
    return n->deadline - srv->t_idle.timeout_ms + EVICT_MIN_IDLE_MS;     /* idle since, plus the wait */
}

/* Is there room for one more connection? Below --max-connections, or at
 * it with a connection idle long enough to close for it (evict_idle). */
static int room_for_one(const fw_server *srv)
{
    return srv->nconns < srv->cfg.max_connections || evictable_at(srv) <= srv->now;
}

/* Resume accepting when nothing holds it back. */
static void maybe_accept_again(fw_server *srv)
{
    if (!srv->accepting && !srv->stopping && srv->now >= srv->accept_resume_at && room_for_one(srv))
        set_accepting(srv, 1);
}

void fw_server_conn_closed(fw_server *srv)
{
    srv->nconns--;
    if (srv->cfg.stats)
        fw_stats_conns(srv->cfg.stats, (uint64_t)srv->nconns, (uint64_t)srv->t_idle.count);
    maybe_accept_again(srv);
}

/* At --max-connections: close the idle kept-alive connections that waited
 * longest (nginx does the same), idle for EVICT_MIN_IDLE_MS at least, so
 * that a new client waits for that at most, not for the keep-alive
 * timeout. Returns 0 when one was closed, FW_AGAIN when none could be. */
static int evict_idle(fw_server *srv)
{
    for (int tries = 0; tries < 8 && evictable_at(srv) <= srv->now; tries++) {
        fw_conn *c = CONN_OF_TIMER(srv->t_idle.head);
        if (fw_conn_evict_idle(c) == 0) {
            srv->evictions++;
            unsigned long unsaid;
            if (fw_say_now(&srv->eviction_said, srv->now, &unsaid))
                fw_server_log(srv, FW_LOG_INFO, "--max-connections %d reached: closing the longest idle "
                              "kept-alive connections to make room (%llu so far)", srv->cfg.max_connections,
                              (unsigned long long)srv->evictions);
            return 0;
        }
        /* Its next request is waiting: it is not idle. Last in line, then. */
        fw_timer_start(&srv->t_idle, &c->timer, srv->now);
    }
    return FW_AGAIN;
}

/* ---- the ready queue -------------------------------------------------------- */

void fw_server_enqueue(fw_server *srv, fw_conn *c)
{
    /* Nearly always the newest: walk from the tail. A connection taken
     * from the accept queue may be older than some (take_waiting). */
    fw_conn *after = srv->ready_tail;
    while (after && after->ready_at > c->ready_at)
        after = after->rq_prev;
    c->rq_prev = after;
    c->rq_next = after ? after->rq_next : srv->ready_head;
    if (c->rq_next) c->rq_next->rq_prev = c; else srv->ready_tail = c;
    if (after) after->rq_next = c; else srv->ready_head = c;
    srv->nready++;
    if (c->unread)
        fw_balance_waiting(&srv->bal, (uint32_t)++srv->nready_unread);
}

void fw_server_dequeue(fw_server *srv, fw_conn *c)
{
    if (c->rq_prev) c->rq_prev->rq_next = c->rq_next; else srv->ready_head = c->rq_next;
    if (c->rq_next) c->rq_next->rq_prev = c->rq_prev; else srv->ready_tail = c->rq_prev;
    c->rq_prev = c->rq_next = NULL;
    srv->nready--;
    if (c->unread)
        fw_balance_waiting(&srv->bal, (uint32_t)--srv->nready_unread);
}

/* A peer has a free thread (it kicked us): hand it the requests that wait
 * here unread, oldest first, while it takes them. */
static void bal_offer(void *ctx)
{
    fw_server *srv = ctx;
    fw_conn *c = srv->ready_head;
    srv->reoffer_at = 0;
    while (c && srv->nready_unread > 0) {
        fw_conn *next = c->rq_next;
        /* One that came from a peer a moment ago stays: the next may go.
         * The kick that brought us here comes once: the peer that is free
         * now stays free and kicks no more, so the held one is offered
         * again when its hold ends (after_events), or it would wait
         * behind this worker's slow requests beside an idle peer. */
        if (c->unread && !fw_conn_may_move(c)) {
            int64_t at = c->handed_in_at + FW_HANDOFF_HOLD_MS;
            if (!srv->reoffer_at || at < srv->reoffer_at)
                srv->reoffer_at = at;
        } else if (c->unread && fw_conn_give_away(c) != 0) {
            return;
        }
        c = next;
    }
}

/* Threads free to run a request: a parked one (waiting for the loop to
 * write for write()) holds none; a spare runs in its place (fw_pool). */
static int threads_free(const fw_server *srv)
{
    return srv->pool->busy - srv->nparked < srv->cfg.threads;
}

int fw_server_thread_free(const fw_server *srv)
{
    return srv->pool && threads_free(srv) && !srv->ready_head;
}

void fw_server_request_done(fw_server *srv)
{
    srv->requests++;
    /* Past the limit, not only at it: while the master holds us (it cannot
     * replace us now), we serve on and retire once it lets go. */
    if (srv->cfg.max_requests && srv->requests >= srv->cfg.max_requests && !srv->stop_requested &&
        !srv->retiring && !fw_balance_held(&srv->bal)) {
        /* Retire: stop accepting, let in-flight requests finish, exit. */
        fw_server_log(srv, FW_LOG_INFO, "served %llu requests (max-requests): retiring",
                      (unsigned long long)srv->requests);
        srv->retiring = 1;
        fw_server_stop_for(srv, 1, FW_SB_WHY_MAX_REQUESTS);
    }
}

/* How long ago a connection just accepted from l came (ms), as far as the
 * kernel says: the last data it received (the request) or, before any, the
 * handshake. 0 when not known (unix sockets). */
static int64_t accepted_age(const fw_listener *l, int fd)
{
    if (l->family != AF_INET && l->family != AF_INET6)
        return 0;
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return 0;
    return ti.tcpi_last_data_recv;
}

/* An outcome (fw_rc.h): what accept_one did, and whether to go on. */
enum accepted {
    ACCEPT_STOP = -1,       /* stop accepting for now (full, or accept failed: said) */
    ACCEPT_EMPTY = 0,       /* the accept queue is empty */
    ACCEPT_ONE = 1          /* one was accepted (and served or queued) */
};

/* Accept one connection from l. */
static enum accepted accept_one(fw_server *srv, fw_listener *l, int with_age)
{
    for (;;) {
        if (srv->nconns >= srv->cfg.max_connections && evict_idle(srv) != 0) {
            set_accepting(srv, 0);
            return ACCEPT_STOP;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(l->w.fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            switch (errno) {
            case EAGAIN:
#if EAGAIN != EWOULDBLOCK
            case EWOULDBLOCK:
#endif
                return ACCEPT_EMPTY;
            case EINTR:
            case ECONNABORTED:
            case EPROTO:
                continue;
            case EMFILE:
            case ENFILE:
            case ENOBUFS:
            case ENOMEM:
                /* Out of descriptors or memory: stop accepting for a moment
                 * instead of spinning on a listener that stays readable
                 * (said at most every 10 s while it lasts). */
                srv->accept_pauses++;
                unsigned long unsaid;
                if (fw_say_now(&srv->accept_pause_said, srv->now, &unsaid))
                    fw_server_log(srv, FW_LOG_ERROR, "accept: %s with %d connection(s) open; "
                                  "pausing for 1 s (%llu pause(s) so far)", strerror(errno), srv->nconns,
                                  (unsigned long long)srv->accept_pauses);
                srv->accept_resume_at = srv->now + 1000;
                set_accepting(srv, 0);
                return ACCEPT_STOP;
            default:
                fw_server_log(srv, FW_LOG_ERROR, "accept: %s", strerror(errno));
                return ACCEPT_STOP;
            }
        }
        fw_balance_accepted(&srv->bal);
        /* Placed by load before its request is read: while no connection
         * came for a while the workers do not arm by the order (want_armed
         * in fw_balance.c), so any worker with a free thread, or a full
         * one, may have taken it beside an idle peer. Read here, its
         * request would run here (a light one behind a heavy one). */
        if (srv->pool && !srv->stopping) {
            fw_balance_place fresh = { 0, 0 };
            if (fw_balance_handoff(&srv->bal, &fresh, fd, (int)(l - srv->listeners), 0,
                                   (fw_pass_client){ NULL, 0 })) {
                close(fd);          /* the peer's now: it lives on in the datagram */
                return ACCEPT_ONE;
            }
        }
        int64_t age = with_age ? accepted_age(l, fd) : 0;
        if (!fw_conn_new(srv, l, fd, (struct sockaddr *)&ss, len, 0, (fw_pass_client){ NULL, 0 }, age)) {
            fw_server_log(srv, FW_LOG_ERROR, "out of memory for a connection");
            close(fd);
        }
        if (!room_for_one(srv)) {
            set_accepting(srv, 0);
            return ACCEPT_STOP;
        }
        return ACCEPT_ONE;
    }
}

/* Inline, a loop pass serves the requests of its kept-alive connections
 * that came during the last pass, each as the pass reaches it; the accept
 * queue's share of the pass is the connections that were waiting in it
 * when the pass began, split between the workers that share it (those that
 * come meanwhile wait for the next pass, as kept-alive requests do). So
 * neither kind of client waits behind the other for more than a pass. */
static int inline_batch(fw_server *srv, const fw_listener *l)
{
    int batch = fw_balance_accept_batch(&srv->bal, srv->cfg.accept_batch);
    int queued = fw_backlog_len(&srv->backlog, l->w.fd, l->family);
    if (queued < 0)
        return batch;
    int sharing = fw_balance_sharing(&srv->bal);
    int share = (queued + sharing - 1) / sharing;
    if (share > srv->cfg.accept_batch)
        share = srv->cfg.accept_batch;
    return share > 1 ? share : 1;
}

static void on_accept(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_listener *l = LISTENER_OF(w);
    fw_server *srv = l->srv;
    int batch = srv->pool ? fw_balance_accept_batch(&srv->bal, srv->cfg.accept_batch) : inline_batch(srv, l);
    for (int i = 0; i < batch && srv->accepting; i++)
        if (accept_one(srv, l, srv->ready_head != NULL) != ACCEPT_ONE)
            return;
}

/* Requests wait here for a thread while the listeners are not watched
 * (least-busy leaves them while every thread is busy): connections may be
 * waiting in the accept queue too, unseen. With a thread free, take one in,
 * so that its request is placed among those waiting by its age: the work
 * that waits is served in arrival order, whichever queue it waits in. */
static void take_waiting(fw_server *srv)
{
    if (!srv->accepting || srv->nlisteners == 0)
        return;
    /* Armed, the loop hears of a waiting connection at its next poll,
     * unless the listeners are left again before it: the request about
     * to be dispatched takes the last free thread (ordered, a full worker
     * leaves them), and inline first the main thread's run goes on without
     * polling. Under kept-alive saturation with connections arriving, new
     * ones then waited seconds in the accept queue. So armed, try anyway,
     * at most once a millisecond (an accept that finds none is a syscall). */
    if (fw_balance_armed(&srv->bal)) {
        if (srv->take_tried_at == srv->now)
            return;
        srv->take_tried_at = srv->now;
    }
    for (int k = 0; k < srv->nlisteners; k++) {
        int i = (srv->take_next + k) % srv->nlisteners;
        if (accept_one(srv, &srv->listeners[i], 1) != ACCEPT_EMPTY) {
            srv->take_next = i + 1;
            return;
        }
    }
}

/* Hand the oldest waiting requests to the threads that are free. */
static void serve_ready(fw_server *srv)
{
    int took = 0;
    while (srv->ready_head && threads_free(srv)) {
        if (!took) {
            took = 1;
            take_waiting(srv);
        }
        fw_conn *c = srv->ready_head;
        fw_server_dequeue(srv, c);
        fw_conn_dispatch(c);
    }
}

static void on_stop(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    uint64_t v;
    while (read(w->fd, &v, sizeof(v)) > 0)
        ;
    (void)SERVER_OF_STOP(w);
}

static void on_signal_fd(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_server *srv = SERVER_OF_SIG(w);
    char junk[64];
    while (read(w->fd, junk, sizeof(junk)) > 0)
        ;
    if (srv->lead_on && !fw_lead_main_leads(&srv->lead)) {
        srv->sig_pending = 1;   /* the handlers run on the main thread, once it is back */
        return;
    }
    if (srv->ops->on_signal && srv->ops->on_signal(srv->app))
        srv->sig_stop = 1;
    fw_server_tick(srv);        /* the handlers are Python code: time passed (fw_clock_ns) */
}

int fw_server_watch_signals(fw_server *srv, int fd)
{
    if (srv->sig_w.fd >= 0 && fw_loop_watch(&srv->loop, &srv->sig_w, 0) != 0)
        return -errno;
    srv->sig_w.fd = fd;
    srv->sig_w.cb = on_signal_fd;
    if (fd >= 0 && fw_loop_watch(&srv->loop, &srv->sig_w, EPOLLIN) != 0)
        return -errno;
    return 0;
}

/* ---- what fw_balance asks of the server ---------------------------------- */

/* fw_balance_ops's convention: 0, or -1 with errno set (said in the log). */
static int bal_set_listeners(void *ctx, int on, int exclusive)
{
    fw_server *srv = ctx;
    uint32_t mask = on ? EPOLLIN | (exclusive ? EPOLLEXCLUSIVE : 0) : 0;
    for (int i = 0; i < srv->nlisteners; i++) {
        if (fw_loop_watch(&srv->loop, &srv->listeners[i].w, mask) != 0) {
            fw_server_log(srv, FW_LOG_ERROR, "epoll_ctl(listener %d): %s", srv->listeners[i].w.fd,
                          strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* A connection a peer handed us (the fd is ours). */
static void bal_take(void *ctx, int listener, int fd, int kept_alive, fw_pass_client client)
{
    fw_server *srv = ctx;
    struct sockaddr_storage ss;
    socklen_t salen = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &salen) != 0) {
        close(fd);             /* the client has gone meanwhile */
        return;
    }
    fw_conn *c = fw_conn_new(srv, &srv->listeners[listener], fd, (struct sockaddr *)&ss, salen, kept_alive,
                             client, 0);
    if (!c) {
        fw_server_log(srv, FW_LOG_ERROR, "out of memory for a connection");
        close(fd);
        return;
    }
    c->handed_in_at = srv->now;     /* (closed already, it is freed at the end of the pass) */
}

static void bal_log(void *ctx, int error, const char *what, int err)
{
    fw_server_log(ctx, error ? FW_LOG_ERROR : FW_LOG_WARNING, "%s: %s", what, strerror(err));
}

static const fw_balance_ops balance_ops = {
    .set_listeners = bal_set_listeners, .take = bal_take, .log = bal_log, .offer = bal_offer,
};

fw_server *fw_server_new(const fw_config *cfg, const int *fds, int nfds,
                         const fw_app_ops *ops, void *app)
{
    fw_server *srv = calloc(1, sizeof(*srv));
    if (!srv)
        return NULL;
    srv->cfg = *cfg;
    if (srv->cfg.limits.max_headers == 0)
        srv->cfg.limits.max_headers = 1;
    if (srv->cfg.accept_batch <= 0)
        srv->cfg.accept_batch = 1;
    if (srv->cfg.threads < 1)
        srv->cfg.threads = 1;
    srv->ops = ops;
    srv->app = app;
    srv->stop_w.fd = -1;
    srv->sig_w.fd = -1;
    srv->loop.epfd = -1;
    fw_backlog_init(&srv->backlog);
    if (fw_loop_init(&srv->loop, 512) != 0)
        goto fail;
    srv->listeners = calloc((size_t)(nfds > 0 ? nfds : 1), sizeof(fw_listener));
    if (!srv->listeners)
        goto fail;
    srv->nlisteners = nfds;
    for (int i = 0; i < nfds; i++) {
        fw_listener *l = &srv->listeners[i];
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        l->w.fd = fds[i];
        l->w.cb = on_accept;
        l->srv = srv;
        l->uwsgi = i < 64 && (cfg->uwsgi_listeners >> i & 1);
        if (getsockname(fds[i], (struct sockaddr *)&ss, &len) != 0)
            goto fail;
        l->family = ss.ss_family;
        if (l->family == AF_INET || l->family == AF_INET6) {
            /* Responses leave in one write; Nagle would only delay them.
             * Accepted sockets inherit TCP_NODELAY from the listener on
             * Linux, which saves a setsockopt per connection. */
            int one = 1;
            if (setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
                goto fail;
            /* A uwsgi proxy (nginx) writes its packet as soon as it has
             * connected, a new connection per request: accepted only once
             * the packet is there, a request costs the loop one wake-up,
             * not two (uWSGI does the same). A silent connection is
             * accepted after the header timeout, and then meets it. */
            int defer = (cfg->header_timeout_ms + 999) / 1000;
            if (l->uwsgi && setsockopt(fds[i], IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof(defer)) != 0)
                goto fail;
        }
    }
    srv->stop_w.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (srv->stop_w.fd < 0)
        goto fail;
    srv->stop_w.cb = on_stop;
    if (fw_loop_watch(&srv->loop, &srv->stop_w, EPOLLIN) != 0)
        goto fail;
    srv->t_head.timeout_ms = cfg->header_timeout_ms;
    srv->t_body.timeout_ms = cfg->body_timeout_ms;
    srv->t_idle.timeout_ms = cfg->keepalive_timeout_ms;
    srv->t_write.timeout_ms = cfg->write_timeout_ms;
    srv->t_linger.timeout_ms = 2000;
    srv->t_grace.timeout_ms = FW_SILENT_GRACE_MS;
    fw_spare_init(&srv->spare_buf, FW_BUF_FIRST_CAP, FW_SPARE_MAX);
    fw_spare_init(&srv->spare_hdrs, srv->cfg.limits.max_headers * sizeof(fw_header), FW_SPARE_MAX);
    fw_spare_init(&srv->spare_exch, sizeof(fw_exch), FW_SPARE_MAX);
    for (int i = 0; i < FW_SPARE_OUT_CLASSES; i++)
        fw_spare_init(&srv->spare_out[i], (size_t)FW_BUF_FIRST_CAP << (i + 1), FW_SPARE_OUT_KEEP);
    fw_server_tick(srv);
    if (fw_balance_init(&srv->bal, &cfg->balance, cfg->threads, srv->nlisteners, &srv->loop, &balance_ops,
                        srv) != 0)
        goto fail;
    return srv;
fail: {
        int e = errno;
        fw_server_free(srv);
        errno = e;
        return NULL;
    }
}

static void free_graveyard(fw_server *srv)
{
    while (srv->graveyard) {
        fw_conn *c = srv->graveyard;
        srv->graveyard = c->next;
        fw_conn_free(c);
    }
}

void fw_server_free(fw_server *srv)
{
    if (!srv)
        return;
    srv->closing = 1;
    while (srv->conns)
        fw_conn_close(srv->conns);
    free_graveyard(srv);
    fw_spare_destroy(&srv->spare_buf);
    fw_spare_destroy(&srv->spare_hdrs);
    fw_spare_destroy(&srv->spare_exch);
    for (int i = 0; i < FW_SPARE_OUT_CLASSES; i++)
        fw_spare_destroy(&srv->spare_out[i]);
    if (srv->stop_w.fd >= 0)
        close(srv->stop_w.fd);
    fw_balance_destroy(&srv->bal);
    fw_backlog_close(&srv->backlog);
    fw_loop_destroy(&srv->loop);
    free(srv->listeners);
    free(srv);
}

int fw_server_ends_keepalive(fw_server *srv)
{
    if (srv->stopping)
        return srv->ending_keepalive;
    int want = srv->stop_requested;
    return want == 2 || (want == 1 && !fw_balance_hands_on(&srv->bal, srv->retiring || srv->stop_retire));
}

void fw_server_stop(fw_server *srv, int graceful)
{
    fw_server_stop_for(srv, graceful, FW_SB_WHY_ASKED);
}

void fw_server_retire(fw_server *srv)
{
    srv->stop_retire = 1;       /* before the request: begin_stop reads it */
    fw_server_stop_for(srv, 1, FW_SB_WHY_ASKED);
}

void fw_server_stop_for(fw_server *srv, int graceful, int why)
{
    int none = FW_SB_WHY_NONE;
    atomic_compare_exchange_strong(&srv->stop_why, &none, why);
    int want = graceful ? 1 : 2;
    if (srv->stop_requested < want)
        srv->stop_requested = want;
    uint64_t one = 1;
    /* async-signal-safe; a full counter already means "wake up" */
    ssize_t n = write(srv->stop_w.fd, &one, sizeof(one));
    (void)n;
}

static void expire_list(fw_server *srv, fw_tlist *l)
{
    fw_tnode *n;
    while ((n = fw_timer_pop_due(l, srv->now)))
        fw_conn_on_timeout(CONN_OF_TIMER(n));
}

/* (Most passes expire nothing: the check alone stays inline.) */
static inline void expire(fw_server *srv, fw_tlist *l)
{
    if (fw_timer_due(l, srv->now))
        expire_list(srv, l);
}

/* A silent new connection whose request did not come within its grace
 * stops steering placement. */
static void expire_grace(fw_server *srv)
{
    fw_tnode *n;
    while ((n = fw_timer_pop_due(&srv->t_grace, srv->now)))
        fw_balance_end(&srv->bal, &CONN_OF_ASIDE(n)->place);
}

/* May app threads leave a finished kept-alive request for the loop to take
 * back at its next pass, unannounced (fw_pool_quiet)? Not when the loop
 * needs each thread back at once: requests or connections wait for a
 * thread, accepting paused at --max-connections (an idle connection makes
 * room), or the server stops. */
static int pool_may_be_quiet(const fw_server *srv)
{
    return threads_free(srv) && !srv->ready_head && srv->accepting && !srv->stopping && !srv->stop_requested &&
           !srv->retiring && !srv->closing;
}

static int next_timeout(fw_server *srv)
{
    int bs = fw_balance_tick(&srv->bal, srv->now);     /* every pass: it acts, not only tells */
    if (srv->own_head)
        return 0;               /* requests kept for the main thread wait (run_own) */
    int64_t next = srv->now + 1000;      /* at least once a second: date, resumes */
    next = fw_timer_earlier(&srv->t_head, next);
    next = fw_timer_earlier(&srv->t_body, next);
    next = fw_timer_earlier(&srv->t_idle, next);
    next = fw_timer_earlier(&srv->t_write, next);
    next = fw_timer_earlier(&srv->t_linger, next);
    next = fw_timer_earlier(&srv->t_grace, next);
    if (srv->stopping && srv->stop_deadline < next)
        next = srv->stop_deadline;
    if (srv->pass_waiting && srv->now + PASS_RETRY_MS < next)
        next = srv->now + PASS_RETRY_MS;
    if (!srv->accepting && !srv->stopping && evictable_at(srv) < next)
        next = evictable_at(srv);       /* at --max-connections: room comes then */
    /* Jobs a thread may have left on the done list unannounced
     * (pool_may_be_quiet) are taken back within this: the idle timers of
     * their connections start at most that late. */
    if (srv->pool && srv->pool->busy > 0 && srv->pool->quiet_ok && srv->now + QUIET_TAKE_BACK_MS < next)
        next = srv->now + QUIET_TAKE_BACK_MS;
    if (srv->reoffer_at && srv->reoffer_at < next)
        next = srv->reoffer_at;         /* a held connection may go then (bal_offer) */
    if (bs >= 0 && srv->now + bs < next)
        next = srv->now + bs;
    int64_t d = next - srv->now;
    return d < 0 ? 0 : (int)d;
}

/* Drop this process's hold on the listening sockets without closing fds
 * the caller owns: each is replaced (dup3, atomic) by a socket that was
 * never bound, which the caller closes in due course. Once every process
 * has let go, the kernel refuses new connections and the port is free. */
static void release_listeners(fw_server *srv)
{
    /* With --balance reuseport each listening socket is this worker's
     * own, and the release closes it: the connections in its accept queue
     * would be reset (unless net.ipv4.tcp_migrate_req moves them to the
     * group's other sockets). They are taken first, as requests in flight
     * (the stop rule then serves them, or hands them on). Those that come
     * between the last accept and the close are the kernel's to reset. */
    if (srv->bal.cfg.mode == FW_BAL_REUSEPORT) {
        for (int i = 0; i < srv->nlisteners; i++)
            for (int n = 0; n < RELEASE_TAKE_MAX && accept_one(srv, &srv->listeners[i], 0) == ACCEPT_ONE; n++)
                ;
    }
    int dead = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (dead < 0) {
        fw_server_log(srv, FW_LOG_WARNING, "releasing the listeners: socket: %s", strerror(errno));
        return;
    }
    for (int i = 0; i < srv->nlisteners; i++)
        if (dup3(dead, srv->listeners[i].w.fd, O_CLOEXEC) < 0)
            fw_server_log(srv, FW_LOG_WARNING, "releasing listener %d: %s", srv->listeners[i].w.fd,
                          strerror(errno));
    close(dead);
}

/* fn on every connection (fn may close it). */
static void each_conn(fw_server *srv, void (*fn)(fw_conn *c))
{
    fw_conn *c = srv->conns;
    while (c) {
        fw_conn *next = c->next;
        fn(c);
        c = next;
    }
}

/* The stop rule (fw_conn_start_stop), to every connection. One a pool
 * thread owns finishes there (the rule leaves it): its head is built after
 * `ending_keepalive` is set, so it says Connection: close unless we hand
 * on. */
static void apply_stop_rule(fw_server *srv)
{
    each_conn(srv, fw_conn_start_stop);
}

/* Handing on, the stop learns that the master stops every worker (a SIGTERM
 * to the whole process group reached this worker first): idle connections
 * close after all, and responses say close. */
static void stop_handing_on(fw_server *srv)
{
    fw_server_log(srv, FW_LOG_DEBUG, "stopping: the whole server stops, idle connections close");
    srv->handing_on = 0;
    srv->ending_keepalive = 1;
    srv->pass_waiting = 0;
    apply_stop_rule(srv);
}

/* Apply the stop rule again to the idle connections no peer could take at
 * the last try (their queues were full, or they were not up yet). */
static void pass_on_idle(fw_server *srv)
{
    srv->pass_waiting = 0;
    each_conn(srv, fw_conn_pass_on_again);
}

static void begin_stop(fw_server *srv)
{
    /* Retiring while other workers serve on (--max-requests, a SIGTERM sent
     * to this worker alone, or the master asked: reload, --max-rss, TTOU):
     * idle connections are handed to them and responses keep the
     * connection alive. On a stop of the whole server they close. */
    srv->handing_on = srv->stop_requested == 1 &&
                      fw_balance_hands_on(&srv->bal, srv->retiring || srv->stop_retire);
    srv->ending_keepalive = !srv->handing_on;
    srv->pass_wait_until = srv->now + PASS_WAIT_MS;
    srv->stopping = 1;
    srv->stop_deadline = srv->now + (srv->cfg.graceful_timeout_ms > 0 ? srv->cfg.graceful_timeout_ms : 0);
    srv->accepting = 0;
    fw_balance_drain(&srv->bal, (uint32_t)(srv->stop_why ? srv->stop_why : FW_SB_WHY_ASKED));
    if (srv->cfg.release_listeners)
        release_listeners(srv);
    apply_stop_rule(srv);
    fw_server_log(srv, FW_LOG_DEBUG, "stopping%s: %d connection(s) in flight",
                  srv->handing_on ? " (handing idle connections on)" : "", srv->nconns);
}

/* Close every connection except those a pool thread owns; a parked one is
 * given back to its thread, told the connection is gone. */
static void close_all(fw_server *srv)
{
    fw_conn *c = srv->conns;
    while (c) {
        fw_conn *next = c->next;
        if (!(srv->pool && c->state == FW_C_APP))
            fw_conn_close(c);
        c = next;
    }
    free_graveyard(srv);
}

/* ---- the app threads (fw_pool's callbacks) ---------------------------- */

#define CONN_OF_JOB(j) (((fw_exch *)((char *)(j) - offsetof(fw_exch, job)))->conn)

/* The context of pool thread `index`. Inline first, the main thread's is
 * threads[cfg.threads], right after the app threads' (its status entry is
 * shown beside theirs): the spares' come after it. */
static fw_thread *pool_thread(fw_server *srv, int index)
{
    return &srv->threads[srv->lead_on && index >= srv->cfg.threads ? index + 1 : index];
}

static void pool_thread_start(void *ctx, int index)
{
    fw_server *srv = ctx;
    if (srv->ops->thread_start)
        srv->ops->thread_start(srv->app, pool_thread(srv, index));
}

static void pool_thread_stop(void *ctx, int index)
{
    fw_server *srv = ctx;
    if (srv->ops->thread_stop)
        srv->ops->thread_stop(srv->app, pool_thread(srv, index));
}

/* One request (or one resumed response) on thread t: a pool thread, or
 * the main thread running it as one (lead_thread). */
static void run_job(fw_server *srv, fw_thread *t, fw_pool_job *job)
{
    fw_conn *c = CONN_OF_JOB(job);
    c->x->thr = t;
    if (c->x->dropping) {
        srv->ops->on_drop(srv->app, c);         /* then the loop closes it */
        c->x->pool_rc = FW_APP_CLOSE;
        return;
    }
    enum fw_app_rc rc = c->x->app_active ? srv->ops->on_writable(srv->app, c)
                                      : srv->ops->on_request(srv->app, c);
    /* The thread is free from here on: say so before the response is
     * written, or the client's next connection can see a stale count. */
    fw_balance_end(&srv->bal, &c->place);
    fw_conn_app_returning(c, rc);
    c->x->pool_rc = rc;
}

static void pool_run(void *ctx, int index, fw_pool_job *job)
{
    fw_server *srv = ctx;
    run_job(srv, pool_thread(srv, index), job);
}

static void pool_done(void *ctx, fw_pool_job *job)
{
    fw_server *srv = ctx;
    fw_conn *c = CONN_OF_JOB(job);
    fw_conn_app_done(c, c->x->pool_rc);
    /* A thread is free: the oldest request that waits for one gets it. */
    if (!srv->closing)
        serve_ready(srv);
}

static int pool_ahead(void *ctx, fw_pool_job *job)
{
    (void)ctx;
    return fw_conn_arm_ahead(CONN_OF_JOB(job));
}

static void pool_parked(void *ctx, fw_pool_job *job)
{
    (void)ctx;
    fw_conn_parked(CONN_OF_JOB(job));
}

static void pool_error(void *ctx, const char *what, int err)
{
    fw_server_log(ctx, FW_LOG_ERROR, "%s: %s", what, strerror(err));
}

static const fw_pool_ops pool_ops = {
    .thread_start = pool_thread_start, .thread_stop = pool_thread_stop,
    .run = pool_run, .done = pool_done, .ahead = pool_ahead, .parked = pool_parked, .error = pool_error,
};

/* ---- inline first: the loop thread runs requests itself (fw_lead.h) ------- */

/* Loop thread: may the request go to the loop thread itself? While the main
 * thread runs the loop, and no call was taken over lately. */
static int runs_own(fw_server *srv)
{
    return srv->lead_on && fw_lead_main_leads(&srv->lead) && srv->now >= srv->own_off_until &&
           !srv->closing;
}

void fw_server_run_job(fw_server *srv, fw_pool_job *job)
{
    if (!runs_own(srv)) {
        fw_pool_submit(srv->pool, job);
        return;
    }
    fw_pool_adopt(srv->pool);
    job->next = NULL;
    if (srv->own_tail) srv->own_tail->next = job; else srv->own_head = job;
    srv->own_tail = job;
}

/* Close the connections of a list of jobs no thread will run; `adopted`:
 * the loop thread's own, counted busy by fw_pool_adopt (the pool's
 * cancelled ones are uncounted by fw_pool_cancel_queued). */
static void close_jobs(fw_server *srv, fw_pool_job *job, int adopted)
{
    while (job) {
        fw_pool_job *next = job->next;
        job->next = NULL;
        if (adopted)
            fw_pool_unadopt(srv->pool);
        fw_conn_close(CONN_OF_JOB(job));
        job = next;
    }
}

/* The requests the loop thread kept go to the app threads (the standby
 * took the loop, or the run ends: then they close). */
static void own_give_up(fw_server *srv, int close)
{
    fw_pool_job *job = srv->own_head;
    srv->own_head = srv->own_tail = NULL;
    if (close) {
        close_jobs(srv, job, 1);
        return;
    }
    while (job) {
        fw_pool_job *next = job->next;
        job->next = NULL;
        fw_pool_submit_adopted(srv->pool, job);
        job = next;
    }
}

/* The main thread lost the loop in a call, and has handed the call's request
 * back: wait until the standby gives the loop back. Then the handlers of
 * signals that came meanwhile run. 1 if the run goes on, 0 if it ends
 * (*end says how). */
static int own_lost(fw_server *srv, fw_pool_job *job, enum fw_run_end *end)
{
    fw_lead_ask_back(&srv->lead);
    fw_pool_hand_back(srv->pool, job);          /* wakes the standby's loop */
    fw_lead_wait_back(&srv->lead);
    fw_server_tick(srv);
    if (srv->lead_ended) {
        srv->lead_ended = 0;
        *end = srv->lead_end;
        return 0;
    }
    if (srv->sig_pending) {
        srv->sig_pending = 0;
        if (srv->ops->on_signal && srv->ops->on_signal(srv->app)) {
            *end = FW_RUN_SIGNAL;
            return 0;
        }
        fw_server_tick(srv);
    }
    return 1;
}

/* End of a pass, the main thread: run the requests it kept, in order, as an
 * app thread would, and take each back at once. Those that come meanwhile
 * (the next of a pipelined batch, a queued one given the thread) wait for
 * the next pass, which does not sleep. 1 if the run goes on, 0 if it ends
 * (*end says how). */
static int run_own(fw_server *srv, enum fw_run_end *end)
{
    fw_pool_job *last = srv->own_tail;
    fw_server_app_unlock(srv);          /* per call from here (fw_thread.per_call) */
    fw_lead_run_begin(&srv->lead);      /* the standby times them as one */
    while (srv->own_head) {
        fw_pool_job *job = srv->own_head;
        srv->own_head = job->next;
        if (!srv->own_head)
            srv->own_tail = NULL;
        job->next = NULL;
        fw_lead_call_begin(&srv->lead);
        run_job(srv, srv->lead_thread, job);
        if (!fw_lead_call_end(&srv->lead))
            return own_lost(srv, job, end);
        fw_server_tick(srv);
        fw_pool_unadopt(srv->pool);
        pool_done(srv, job);
        if (job == last)
            break;
    }
    return 1;
}

static int run_pass(fw_server *srv, enum fw_run_end *end);
static void end_connections(fw_server *srv);
static void cut_pool(fw_server *srv);

/* The standby's run of the loop (fw_lead_ops.run): what the main thread kept
 * goes to the app threads, and so does every request for a while; passes
 * until the main thread wants the loop back, or the run ends. */
static void lead_run(void *ctx)
{
    fw_server *srv = ctx;
    fw_server_tick(srv);
    srv->own_off_until = srv->now + OWN_OFF_MS;
    own_give_up(srv, 0);
    while (!fw_lead_wanted(&srv->lead)) {
        enum fw_run_end end;
        if (!run_pass(srv, &end)) {
            /* The main thread ends the run once its call returns; the
             * clients are not kept waiting for that. */
            end_connections(srv);
            cut_pool(srv);
            srv->lead_ended = 1;
            srv->lead_end = end;
            return;
        }
    }
}

static const fw_lead_ops lead_ops = { .run = lead_run, .error = pool_error };

/* Start the app threads (threads > 1), and the standby with inline first.
 * Returns 0, or -errno. */
static int start_pool(fw_server *srv)
{
    int most = fw_pool_max_threads(srv->cfg.threads);       /* spares for parked threads too */
    srv->threads = calloc((size_t)most, sizeof(*srv->threads));
    if (!srv->threads)
        return -ENOMEM;
    for (int i = 0; i < most; i++)
        srv->threads[i].index = i;
    /* Inline first: the main thread has a context of its own for the
     * requests it runs (pool_thread), so the pool has one fewer. lead_on
     * is set before the pool's threads start: they map their index by it. */
    int own = srv->cfg.inline_first;
    srv->lead_on = own;
    srv->pool = fw_pool_start(&srv->loop, srv->cfg.threads, most - own, &pool_ops, srv);
    if (!srv->pool) {
        int e = errno;
        free(srv->threads);
        srv->threads = NULL;
        srv->lead_on = 0;
        return -e;
    }
    if (own) {
        srv->lead_thread = &srv->threads[srv->cfg.threads];
        srv->lead_thread->per_call = 1;
        srv->own_off_until = 0;
        srv->lead_ended = 0;
        srv->sig_pending = 0;
        int e = fw_lead_start(&srv->lead, &lead_ops, srv);
        if (e < 0) {
            fw_pool_stop(srv->pool);
            srv->pool = NULL;
            free(srv->threads);
            srv->threads = NULL;
            srv->lead_thread = NULL;
            srv->lead_on = 0;
            return e;
        }
    }
    return 0;
}

int fw_server_start_threads(fw_server *srv)
{
    if (srv->cfg.threads <= 1 || srv->pool)
        return 0;
    int err = start_pool(srv);
    if (err < 0)
        fw_server_log(srv, FW_LOG_ERROR, "cannot start %d app threads: %s", srv->cfg.threads,
                      strerror(-err));
    return err;
}

/* The run ends: what waits for a thread closes, and the clients of the
 * requests in the app are cut (their threads finish them). */
static void cut_pool(fw_server *srv)
{
    fw_pool *p = srv->pool;
    srv->closing = 1;           /* a thread that parks from now on is told at once */
    fw_pool_quiet(p, 0);        /* every thread done from now on wakes us */
    own_give_up(srv, 1);
    fw_pool_collect(p);
    close_jobs(srv, fw_pool_cancel_queued(p), 0);
    for (fw_conn *c = srv->conns; c; c = c->next)
        if (c->state == FW_C_APP && shutdown(c->w.fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
            fw_server_log(srv, FW_LOG_DEBUG, "shutdown(%d): %s", c->w.fd, strerror(errno));
    if (p->busy)
        fw_server_log(srv, FW_LOG_INFO, "waiting for %d request(s) still in the app", p->busy);
}

/* Then wait for the requests in the app, closing their connections. */
static void drain_pool(fw_server *srv)
{
    fw_pool *p = srv->pool;
    cut_pool(srv);
    while (p->busy > 0) {
        int n = fw_loop_wait(&srv->loop, 1000);
        fw_server_tick(srv);
        fw_balance_beat(&srv->bal, srv->now);
        if (n < 0 && errno != EINTR)
            break;
        /* Only the pool's completions matter now; they close at once. */
        for (int i = 0; i < n; i++) {
            fw_watch *w = srv->loop.events[i].data.ptr;
            if (fw_pool_is_done_watch(p, w))
                w->cb(&srv->loop, w, srv->loop.events[i].events);
        }
        fw_pool_recover(p);
        close_all(srv);
    }
}

/* Whether a stop under way has ended: a second stop, no connection left,
 * or the graceful timeout passed. */
static int stop_has_ended(fw_server *srv)
{
    if (srv->stop_requested == 2 || srv->nconns == 0)
        return 1;
    if (srv->now >= srv->stop_deadline) {
        fw_server_log(srv, FW_LOG_WARNING, "graceful timeout: closing %d connection(s)",
                      srv->nconns);
        return 1;
    }
    return 0;
}

/* What every loop pass does after dispatching its events: expire timers,
 * hand idle connections on during a stop, give queued requests to free app
 * threads, take back the request state of connections idle for
 * FW_KEPT_MS (fw_conn_give_kept), free closed connections, accept again if
 * it paused. */
static void after_events(fw_server *srv)
{
    expire(srv, &srv->t_head);
    expire(srv, &srv->t_body);
    expire(srv, &srv->t_idle);
    expire(srv, &srv->t_write);
    expire(srv, &srv->t_linger);
    if (fw_timer_due(&srv->t_grace, srv->now))
        expire_grace(srv);
    if (srv->stopping && srv->handing_on &&
        !fw_balance_hands_on(&srv->bal, srv->retiring || srv->stop_retire))
        stop_handing_on(srv);
    if (srv->stopping && srv->pass_waiting)
        pass_on_idle(srv);
    if (srv->pool) {
        fw_pool_recover(srv->pool);
        serve_ready(srv);
        if (srv->reoffer_at && srv->now >= srv->reoffer_at)
            bal_offer(srv);     /* (resets reoffer_at, or sets it anew) */
    }
    fw_conn_give_kept(srv);
    free_graveyard(srv);
    maybe_accept_again(srv);
}

/* The run ends: no more accepting, every connection closes (those in the
 * app once their threads are done with them). */
static void end_connections(fw_server *srv)
{
    srv->accepting = 0;
    srv->closing = 1;
    if (!srv->stopping)
        fw_balance_drain(&srv->bal, FW_SB_WHY_ASKED);     /* (begin_stop drained already) */
    srv->stopping = 1;          /* what comes back from the threads closes */
    srv->ending_keepalive = 1;
    srv->handing_on = 0;
    close_all(srv);
}

/* The end of a run: close every connection, let the app threads finish
 * what they hold and stop them, and leave the server ready to run again. */
static void end_run(fw_server *srv)
{
    end_connections(srv);
    if (srv->pool) {
        drain_pool(srv);
        if (srv->lead_on) {
            fw_lead_stop(&srv->lead);
            fw_server_log(srv, FW_LOG_DEBUG, "inline first: %llu call(s) taken over by the standby",
                          (unsigned long long)srv->lead.takeovers);
        }
        fw_pool_stop(srv->pool);
        srv->lead_on = 0;       /* (after the pool's threads, which map their index by it) */
        srv->lead_thread = NULL;
        srv->pool = NULL;
        free(srv->threads);
        srv->threads = NULL;
    }
    /* Ready to run again. stop_requested is cleared here, at the end of a
     * run and not at its start: a stop asked before a run (a signal that
     * came while the worker was starting) is kept for that run. */
    srv->stopping = 0;
    srv->ending_keepalive = 0;
    srv->stop_requested = 0;
    srv->stop_retire = 0;
    srv->stop_why = FW_SB_WHY_NONE;
    srv->closing = 0;
}

/* One pass of the loop, by the thread that runs it: sleep until events
 * (or a timer), dispatch them, expire timers. 1 if the run goes on, 0 if
 * it ends (*end says how). */
static int run_pass(fw_server *srv, enum fw_run_end *end)
{
    if (srv->stop_requested && !srv->stopping)
        begin_stop(srv);
    if (srv->stopping && stop_has_ended(srv)) {
        *end = FW_RUN_STOPPED;
        return 0;
    }
    if (srv->pool)
        fw_pool_quiet(srv->pool, pool_may_be_quiet(srv));
    /* The heartbeat (--heartbeat-timeout): the loop turns, before it
     * sleeps (at most a second: next_timeout) and when it wakes. */
    int wait_ms = next_timeout(srv);
    fw_balance_beat(&srv->bal, fw_now_ms());
    /* Inline, the pass's calls keep the GIL from one to the next (fw_server.h,
     * fw_server_app_unlock): never held while the loop sleeps. */
    fw_server_app_unlock(srv);
    int n = fw_loop_wait(&srv->loop, wait_ms);
    fw_server_tick(srv);
    fw_balance_beat(&srv->bal, srv->now);
    if (n < 0) {
        if (errno == EINTR) {
            /* (Only the main thread takes signals: the standby blocks them.) */
            if (srv->ops->on_signal && srv->ops->on_signal(srv->app)) {
                *end = FW_RUN_SIGNAL;
                return 0;
            }
            return 1;
        }
        fw_server_log(srv, FW_LOG_ERROR, "epoll_wait: %s", strerror(errno));
        *end = FW_RUN_FAILED;
        return 0;
    }
    if (srv->pool)
        fw_pool_collect(srv->pool);     /* before their sockets' events */
    fw_loop_dispatch(&srv->loop, n);
    fw_server_flush_deferred(srv);
    if (srv->sig_stop) {
        *end = FW_RUN_SIGNAL;
        return 0;
    }
    after_events(srv);
    return 1;
}

enum fw_run_end fw_server_run(fw_server *srv)
{
    enum fw_run_end rc = FW_RUN_STOPPED;
    fw_server_tick(srv);
    srv->stopping = 0;
    srv->ending_keepalive = 0;
    srv->handing_on = 0;
    srv->pass_waiting = 0;
    srv->retiring = 0;
    srv->sig_stop = 0;
    srv->closing = 0;
    if (fw_server_start_threads(srv) < 0)
        return FW_RUN_FAILED;
    srv->accepting = 1;
    fw_balance_start(&srv->bal, srv->now);
    while (run_pass(srv, &rc) && (!srv->own_head || run_own(srv, &rc)))
        ;
    end_run(srv);
    fw_server_app_unlock(srv);          /* the caller takes the GIL back itself */
    return rc;
}
