/* fw_balance: listener arming, the scoreboard and keep-alive hand-off.
 * See fw_balance.h for the modes and docs/accept-balancing.md for why. */
#define _GNU_SOURCE
#include "fw_balance.h"
#include "fw_conn.h"
#include "fw_server.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BACKSTOP_MS 500
#define PASS_BATCH 16        /* hand-offs received per wake-up */

#define BAL_OF_KICK(wp) ((fw_balance *)((char *)(wp) - offsetof(fw_balance, kick_w)))
#define BAL_OF_PASS(wp) ((fw_balance *)((char *)(wp) - offsetof(fw_balance, pass_w)))
#define SERVER_OF_BAL(bp) ((fw_server *)((char *)(bp) - offsetof(fw_server, bal)))

_Static_assert(sizeof(fw_sb_slot) == FW_SB_SLOT_SIZE, "one cache line per slot");

/* The scoreboard rule applies: least-busy with app threads. In inline mode
 * (one thread) a worker is free exactly when its loop sleeps in epoll_wait,
 * which is the only waiter EPOLLEXCLUSIVE wakes: no counting is needed. */
static int counting(const fw_balance *b)
{
    return b->cfg.mode == FW_BAL_LEAST_BUSY && b->threads > 1;
}

static void kick(fw_balance *b, int j)
{
    if (!b->cfg.kick_fds || b->cfg.kick_fds[j] < 0)
        return;
    uint64_t one = 1;
    /* EAGAIN: the counter is full, the peer has a kick pending anyway. */
    if (write(b->cfg.kick_fds[j], &one, sizeof(one)) == sizeof(one))
        atomic_fetch_add(&b->sb[b->cfg.me].kicks_sent, 1);
}

static uint32_t min_alive_inflight(const fw_balance *b)
{
    uint32_t mn = UINT32_MAX;
    for (int j = 0; j < b->cfg.nslots; j++) {
        if (atomic_load(&b->sb[j].state) != FW_SB_ALIVE)
            continue;
        uint32_t v = atomic_load(&b->sb[j].inflight);
        if (v < mn)
            mn = v;
    }
    return mn;
}

static int want_armed(const fw_balance *b, uint32_t mn)
{
    if (!b->allowed || b->draining)
        return 0;
    if (!counting(b))
        return 1;
    return b->inflight < b->threads && b->inflight <= mn;
}

/* Add or remove every listener. EPOLL_CTL_MOD cannot change an exclusive
 * entry, so disarming is DEL and arming is ADD (which also polls the socket:
 * a connection already queued is picked up at once). */
static int set_listeners(fw_server *srv, int on)
{
    uint32_t mask = 0;
    if (on)
        mask = EPOLLIN | (srv->bal.cfg.mode == FW_BAL_LEAST_BUSY ? EPOLLEXCLUSIVE : 0);
    for (int i = 0; i < srv->nlisteners; i++) {
        if (fw_loop_watch(&srv->loop, &srv->listeners[i].w, mask) != 0) {
            fw_server_log(srv, FW_LOG_ERROR, "epoll_ctl(listener %d): %s",
                          srv->listeners[i].w.fd, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* mu held. Fix our own registration, then kick every live peer whose
 * registration no longer fits the rule (in both directions: kicks that arm
 * are what keeps arrivals from waiting while a thread is free). */
static void reconcile_locked(fw_server *srv)
{
    fw_balance *b = &srv->bal;
    for (int tries = 0; tries < 4; tries++) {
        uint32_t mn = counting(b) ? min_alive_inflight(b) : 0;
        int w = want_armed(b, mn);
        if (w == b->armed)
            break;
        if (set_listeners(srv, w) != 0)
            break;
        b->armed = w;
        atomic_store(&b->sb[b->cfg.me].armed, (uint32_t)w);
    }
    if (!counting(b) || b->cfg.nslots < 2)
        return;
    uint32_t mn = min_alive_inflight(b);
    for (int j = 0; j < b->cfg.nslots; j++) {
        if (j == b->cfg.me || atomic_load(&b->sb[j].state) != FW_SB_ALIVE)
            continue;
        uint32_t lj = atomic_load(&b->sb[j].inflight);
        uint32_t wj = lj < b->threads && lj <= mn;
        if (wj != atomic_load(&b->sb[j].armed))
            kick(b, j);
    }
}

static void publish_locked(fw_balance *b)
{
    atomic_store(&b->sb[b->cfg.me].inflight, b->inflight);
}

/* ---- receiving kicks and hand-offs (loop thread) ------------------------- */

static void on_kick(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_balance *b = BAL_OF_KICK(w);
    uint64_t v;
    if (read(w->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        return;
    pthread_mutex_lock(&b->mu);
    reconcile_locked(SERVER_OF_BAL(b));
    pthread_mutex_unlock(&b->mu);
}

/* One hand-off datagram: one byte (the listener's index, the same in every
 * worker) and the connection's fd. */
static int recv_pass(int sock, int *fd, unsigned char *lindex)
{
    struct iovec iov = { .iov_base = lindex, .iov_len = 1 };
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof(u.buf) };
    ssize_t n;
    do {
        n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    *fd = -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(fd, CMSG_DATA(cm), sizeof(int));
    return n == 1 ? 0 : 1;   /* 1: malformed (fd closed by the caller if any) */
}

static void on_pass(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_balance *b = BAL_OF_PASS(w);
    fw_server *srv = SERVER_OF_BAL(b);
    for (int i = 0; i < PASS_BATCH; i++) {
        int fd = -1;
        unsigned char li = 0;
        int rc = recv_pass(w->fd, &fd, &li);
        if (rc < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                fw_server_log(srv, FW_LOG_ERROR, "hand-off recvmsg: %s", strerror(errno));
            return;
        }
        if (fd < 0)
            continue;
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        if (rc != 0 || li >= srv->nlisteners ||
            getpeername(fd, (struct sockaddr *)&ss, &len) != 0) {
            close(fd);         /* malformed, or the client has gone meanwhile */
            continue;
        }
        atomic_fetch_add(&b->sb[b->cfg.me].handed_in, 1);
        if (!fw_conn_new(srv, &srv->listeners[li], fd, (struct sockaddr *)&ss, len)) {
            fw_server_log(srv, FW_LOG_ERROR, "out of memory for a connection");
            close(fd);
        }
    }
}

/* ---- the interface --------------------------------------------------------- */

int fw_balance_init(fw_server *srv)
{
    fw_balance *b = &srv->bal;
    b->cfg = srv->cfg.balance;
    b->threads = srv->cfg.threads > 1 ? (uint32_t)srv->cfg.threads : 1;
    b->kick_w.fd = -1;
    b->pass_w.fd = -1;
    if (!b->cfg.scoreboard || b->cfg.nslots < 1 || b->cfg.me < 0 || b->cfg.me >= b->cfg.nslots ||
        ((uintptr_t)b->cfg.scoreboard & (FW_SB_SLOT_SIZE - 1))) {
        /* A lone server: its own slot, no peers. */
        memset(&b->own_sb, 0, sizeof(b->own_sb));
        atomic_store(&b->own_sb.state, FW_SB_ALIVE);
        b->sb = &b->own_sb;
        b->cfg.scoreboard = NULL;
        b->cfg.nslots = 1;
        b->cfg.me = 0;
        b->cfg.kick_fds = NULL;
        b->cfg.pass_fds = NULL;
        b->cfg.pass_recv_fd = -1;
    } else {
        b->sb = b->cfg.scoreboard;
    }
    atomic_store(&b->sb[b->cfg.me].threads, b->threads);
    if (pthread_mutex_init(&b->mu, NULL) != 0)
        return -1;
    if (b->cfg.kick_fds && b->cfg.kick_fds[b->cfg.me] >= 0) {
        b->kick_w.fd = b->cfg.kick_fds[b->cfg.me];
        b->kick_w.cb = on_kick;
        if (fw_loop_watch(&srv->loop, &b->kick_w, EPOLLIN) != 0)
            return -1;
    }
    if (counting(b) && b->cfg.pass_recv_fd >= 0) {
        b->pass_w.fd = b->cfg.pass_recv_fd;
        b->pass_w.cb = on_pass;
        if (fw_loop_watch(&srv->loop, &b->pass_w, EPOLLIN) != 0)
            return -1;
    }
    return 0;
}

void fw_balance_destroy(fw_server *srv)
{
    fw_balance *b = &srv->bal;
    /* The fds are not ours: just leave the epoll set (closed with the loop). */
    if (b->sb)
        pthread_mutex_destroy(&b->mu);
    b->sb = NULL;
}

void fw_balance_start(fw_server *srv)
{
    fw_balance *b = &srv->bal;
    pthread_mutex_lock(&b->mu);
    b->draining = 0;
    b->allowed = 1;
    b->backstop_at = srv->now;
    atomic_store(&b->sb[b->cfg.me].pid, (int32_t)getpid());
    atomic_store(&b->sb[b->cfg.me].state, FW_SB_ALIVE);
    reconcile_locked(srv);
    pthread_mutex_unlock(&b->mu);
}

void fw_balance_allow(fw_server *srv, int on)
{
    fw_balance *b = &srv->bal;
    pthread_mutex_lock(&b->mu);
    b->allowed = on;
    reconcile_locked(srv);
    pthread_mutex_unlock(&b->mu);
}

int fw_balance_accept_batch(const fw_server *srv)
{
    /* Looping accept() until EAGAIN would let one worker swallow a burst
     * beyond its free threads, or (inline) beyond its one free loop while
     * peers idle: least-busy takes one and re-decides. A lone inline
     * server has nobody to leave connections to. */
    const fw_balance *b = &srv->bal;
    if (counting(b) || (b->cfg.mode == FW_BAL_LEAST_BUSY && b->cfg.nslots >= 2))
        return 1;
    return srv->cfg.accept_batch;
}

void fw_balance_begin(fw_server *srv, fw_conn *c)
{
    fw_balance *b = &srv->bal;
    if (!counting(b) || c->counted)
        return;
    pthread_mutex_lock(&b->mu);
    c->counted = 1;
    b->inflight++;
    publish_locked(b);
    reconcile_locked(srv);
    pthread_mutex_unlock(&b->mu);
}

void fw_balance_end(fw_server *srv, fw_conn *c)
{
    fw_balance *b = &srv->bal;
    if (!c->counted)
        return;
    pthread_mutex_lock(&b->mu);
    c->counted = 0;
    b->inflight--;
    publish_locked(b);
    reconcile_locked(srv);
    pthread_mutex_unlock(&b->mu);
}

int fw_balance_handoff(fw_server *srv, fw_conn *c)
{
    fw_balance *b = &srv->bal;
    if (!counting(b) || !b->cfg.pass_fds || b->cfg.nslots < 2 || srv->stopping)
        return 0;
    pthread_mutex_lock(&b->mu);
    int full = b->inflight - (c->counted ? 1u : 0u) >= b->threads;   /* c's own place aside */
    pthread_mutex_unlock(&b->mu);
    if (!full)
        return 0;
    /* The live worker with the fewest requests and a free thread. */
    int best = -1;
    uint32_t best_n = b->threads;
    for (int j = 0; j < b->cfg.nslots; j++) {
        if (j == b->cfg.me || b->cfg.pass_fds[j] < 0 || atomic_load(&b->sb[j].state) != FW_SB_ALIVE)
            continue;
        uint32_t n = atomic_load(&b->sb[j].inflight);
        if (n < best_n) {
            best_n = n;
            best = j;
        }
    }
    if (best < 0)
        return 0;            /* everybody is full: it waits here as it would anywhere */
    unsigned char li = (unsigned char)(c->lst - srv->listeners);
    struct iovec iov = { .iov_base = &li, .iov_len = 1 };
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                         .msg_controllen = sizeof(u.buf) };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &c->w.fd, sizeof(int));
    ssize_t n;
    do {
        n = sendmsg(b->cfg.pass_fds[best], &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n != 1)
        return 0;            /* its queue is full or it is gone: serve it here */
    atomic_fetch_add(&b->sb[b->cfg.me].handed_out, 1);
    fw_conn_close(c);        /* the socket lives on in the datagram and then in the peer */
    return 1;
}

int fw_balance_tick(fw_server *srv)
{
    fw_balance *b = &srv->bal;
    if (!counting(b) || b->cfg.nslots < 2)
        return -1;
    pthread_mutex_lock(&b->mu);
    int need = !b->armed && b->allowed && !b->draining && b->inflight < b->threads;
    if (need && srv->now >= b->backstop_at) {
        reconcile_locked(srv);
        b->backstop_at = srv->now + (b->cfg.backstop_ms > 0 ? b->cfg.backstop_ms : BACKSTOP_MS);
    }
    int64_t left = b->backstop_at - srv->now;
    pthread_mutex_unlock(&b->mu);
    if (!need)
        return -1;
    return left < 0 ? 0 : (int)left;
}

void fw_balance_drain(fw_server *srv)
{
    fw_balance *b = &srv->bal;
    pthread_mutex_lock(&b->mu);
    b->draining = 1;
    b->allowed = 0;
    /* Out of the minimum first, so the kicks below see the new one. */
    atomic_store(&b->sb[b->cfg.me].state, FW_SB_DRAINING);
    reconcile_locked(srv);
    pthread_mutex_unlock(&b->mu);
}

/* ---- master side --------------------------------------------------------- */

void fw_sb_spawn(void *scoreboard, int nslots, int i, const int *kick_fds)
{
    fw_sb_slot *sb = scoreboard;
    if (i < 0 || i >= nslots)
        return;
    if (kick_fds && kick_fds[i] >= 0) {
        uint64_t v;
        while (read(kick_fds[i], &v, sizeof(v)) > 0)     /* stale kicks of the last owner */
            ;
    }
    atomic_store(&sb[i].inflight, 0);
    atomic_store(&sb[i].armed, 0);
    atomic_store(&sb[i].accepted, 0);
    atomic_store(&sb[i].handed_in, 0);
    atomic_store(&sb[i].handed_out, 0);
    atomic_store(&sb[i].kicks_sent, 0);
    atomic_fetch_add(&sb[i].gen, 1);
    atomic_store(&sb[i].pid, 0);
    /* FREE until the worker's loop runs (fw_balance_start): a worker still
     * importing the app must not count as the idlest one. */
    atomic_store(&sb[i].state, FW_SB_FREE);
}

void fw_sb_release(void *scoreboard, int nslots, int i, const int *kick_fds)
{
    fw_sb_slot *sb = scoreboard;
    if (i < 0 || i >= nslots)
        return;
    /* A stale low count would cap every live worker: leave the minimum,
     * then make the others re-decide. */
    atomic_store(&sb[i].state, FW_SB_FREE);
    atomic_store(&sb[i].inflight, 0);
    atomic_store(&sb[i].armed, 0);
    atomic_store(&sb[i].pid, 0);
    for (int j = 0; j < nslots; j++) {
        if (j == i || atomic_load(&sb[j].state) != FW_SB_ALIVE || !kick_fds || kick_fds[j] < 0)
            continue;
        uint64_t one = 1;
        if (write(kick_fds[j], &one, sizeof(one)) < 0 && errno != EAGAIN)
            break;
    }
}
