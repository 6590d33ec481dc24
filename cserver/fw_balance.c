/* fw_balance: listener arming, the scoreboard and keep-alive hand-off.
 * See fw_balance.h for the modes and docs/accept-balancing.md for why. */
#define _GNU_SOURCE
#include "fw_balance.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BACKSTOP_MS 500
/* After the last accept at any worker, how long the workers arm by the
 * order (want_armed) and request starts and ends re-rank them
 * (rank_needed). Short: at saturation, ranking costs a listener change or
 * a kick per request, and with 1000 the 50 connects of a client pool made
 * a second of it, a backlog of ~100 ms at 4 x 4 and 56k req/s that took
 * another half second to drain. An arrival after a longer gap is placed
 * by load at its accept (fw_balance_handoff, from the server's accept). */
#define FW_RANK_LIVE_MS 100
#define PASS_BATCH 16        /* hand-offs received per wake-up */

#define BAL_OF_KICK(wp) ((fw_balance *)((char *)(wp) - offsetof(fw_balance, kick_w)))
#define BAL_OF_PASS(wp) ((fw_balance *)((char *)(wp) - offsetof(fw_balance, pass_w)))

_Static_assert(sizeof(fw_sb_slot) == FW_SB_SLOT_SIZE, "two cache lines per slot");

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

/* A peer that takes connections: alive and not paused (out of fds) or
 * stopping. Only those make the minimum, and only those are kicked: a
 * paused worker is asleep on purpose until a descriptor frees. */
static int is_open(const fw_sb_slot *s)
{
    return atomic_load(&s->state) == FW_SB_ALIVE && atomic_load(&s->open);
}

/* CLOCK_MONOTONIC in ms, low 32 bits (compared by unsigned difference, so
 * the wrap every 49 days does not matter); coarse: a vDSO read, 4 ms steps. */
static uint32_t coarse_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return 0;
    return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}

/* A worker's place in the order: requests running, requests handed to it
 * and not yet taken in, and connections it accepted within the last
 * FW_SILENT_GRACE_MS whose request has not arrived yet. These last steer
 * where the next connection goes (so a burst of connections spreads even
 * when their requests trail the accept) but never stop a worker from
 * accepting: capacity is checked on requests alone (want_armed). */
static uint32_t load_of(const fw_sb_slot *s)
{
    return atomic_load(&s->inflight) + atomic_load(&s->incoming) + atomic_load(&s->pending) +
           atomic_load(&s->waiting);
}

static uint32_t min_open_load(const fw_balance *b)
{
    uint32_t mn = UINT32_MAX;
    for (int j = 0; j < b->cfg.nslots; j++) {
        if (!is_open(&b->sb[j]))
            continue;
        uint32_t v = load_of(&b->sb[j]);
        if (v < mn)
            mn = v;
    }
    return mn;
}

/* Are connections arriving: did any worker accept one within
 * FW_RANK_LIVE_MS? Only then does the order decide anything: the
 * workers arm by it, the least loaded with a free thread, so that the
 * next connection goes there (a full one disarms at once). */
static int connections_arriving(const fw_balance *b)
{
    uint32_t now = coarse_ms();
    for (int j = 0; j < b->cfg.nslots; j++)
        if (now - atomic_load(&b->sb[j].accept_ms) < FW_RANK_LIVE_MS)
            return 1;
    return 0;
}

/* Should our listeners be in our epoll set (ordered: connections_arriving)?
 * While no connection arrives, every worker with a free thread stays armed
 * and a full one keeps what it has: under kept-alive saturation the
 * capacity flips and the least loaded changes at every request, and
 * following them was listener changes and kicks (2.4 per request at 4 x 4)
 * for connections that were not coming. The first one that comes may
 * reach a full worker: it is placed by load at its accept, before its
 * request is read (fw_balance_handoff), and its accept makes the order
 * exact again at once (fw_balance_accepted). */
static int want_armed(const fw_balance *b, uint32_t mn, int ordered)
{
    if (!b->allowed || b->draining)
        return 0;
    if (!counting(b))
        return 1;
    if (!ordered)
        return b->inflight < b->threads || b->armed;
    return b->inflight < b->threads && load_of(&b->sb[b->cfg.me]) <= mn;   /* published under mu */
}

/* mu held. Fix our own registration, then kick every live peer whose
 * registration no longer fits the rule (in both directions: kicks that arm
 * are what keeps arrivals from waiting while a thread is free). The server
 * adds or removes its listeners (ops->set_listeners): EPOLL_CTL_MOD cannot
 * change an exclusive entry, so disarming is DEL and arming is ADD (which
 * also polls the socket: a connection already queued is picked up at once).
 * arriving: connections_arriving(b) if the caller looked already, else -1. */
static void reconcile_locked(fw_balance *b, int arriving)
{
    /* Published first, so peers deciding from now on see it. */
    atomic_store(&b->sb[b->cfg.me].open, (uint32_t)(b->allowed && !b->draining));
    int ordered = counting(b) && (arriving >= 0 ? arriving : connections_arriving(b));
    /* The least load: only the order needs it (one scan, again after a
     * listener change: the peers' loads moved during the syscall). */
    uint32_t mn = ordered ? min_open_load(b) : 0;
    for (int tries = 0; tries < 4; tries++) {
        int w = want_armed(b, mn, ordered);
        if (w == b->armed)
            break;
        if (b->ops->set_listeners(b->ctx, w, b->cfg.mode == FW_BAL_LEAST_BUSY) != 0)
            break;
        b->armed = w;
        atomic_store(&b->sb[b->cfg.me].armed, (uint32_t)w);
        atomic_fetch_add_explicit(&b->sb[b->cfg.me].arms, 1, memory_order_relaxed);
        if (ordered)
            mn = min_open_load(b);
    }
    if (!counting(b) || b->cfg.nslots < 2)
        return;
    /* With a thread free and nothing waiting here, requests that wait
     * unread in a peer's queue are better served here: kick the peer with
     * the most waiting to hand one over (on_kick, ops->offer). One peer:
     * we have a thread for one request, and at saturation, where every
     * worker has some waiting, kicking them all was two futile wake-ups
     * per request (our thread is taken again before their offer comes). */
    int can_help = b->inflight < b->threads && !atomic_load(&b->sb[b->cfg.me].waiting) &&
                   !atomic_load(&b->sb[b->cfg.me].retire) && b->allowed && !b->draining;
    int help = -1;
    uint32_t most = 0;
    for (int j = 0; j < b->cfg.nslots; j++) {
        if (j == b->cfg.me || !is_open(&b->sb[j]))
            continue;
        /* The rule of want_armed, as far as we can see it: unordered, a
         * full peer keeps whatever it has. */
        int full = atomic_load(&b->sb[j].inflight) >= b->threads;
        uint32_t wj = ordered ? !full && load_of(&b->sb[j]) <= mn : 1;
        uint32_t waiting = atomic_load(&b->sb[j].waiting);
        if ((ordered || !full) && wj != atomic_load(&b->sb[j].armed))
            kick(b, j);
        else if (can_help && waiting > most &&
                 atomic_load(&b->sb[j].image) <= atomic_load(&b->sb[b->cfg.me].image)) {
            most = waiting;
            help = j;
        }
    }
    if (help >= 0)
        kick(b, help);
}

/* mu held, our count just changed as a request started or ended (was_full:
 * we were at our thread count before): must the workers be re-ranked?
 * *arriving: connections_arriving(b) when it was looked at, else -1 (for
 * reconcile_locked, which would look again).
 * Re-ranking can add or remove our listeners (epoll_ctl) and kick peers
 * (eventfd): under steady kept-alive traffic loads cross all the time and
 * that was 1.7 listener changes and kicks per request. The order among
 * workers with a free thread only matters to the next new connection, and
 * the first request of a new connection is placed by load anyway
 * (fw_balance_handoff). So re-rank only when it changes who can take one:
 * our capacity flipped, requests wait unread somewhere (a free thread here
 * should take them), hand-offs are on their way, or any worker accepted a
 * connection within FW_RANK_LIVE_MS (connections are arriving: keep the
 * order exact for them). A disarmed worker with a free thread also
 * re-checks on its own every backstop_ms (fw_balance_tick). */
static int rank_needed(const fw_balance *b, int was_full, int *arriving)
{
    *arriving = -1;
    if (was_full != (b->inflight >= b->threads))
        return 1;
    for (int j = 0; j < b->cfg.nslots; j++) {
        const fw_sb_slot *s = &b->sb[j];
        if (atomic_load(&s->waiting) || atomic_load(&s->incoming) || atomic_load(&s->pending))
            return 1;
    }
    *arriving = connections_arriving(b);
    return *arriving;
}

static void publish_locked(fw_balance *b)
{
    atomic_store(&b->sb[b->cfg.me].inflight, b->inflight);
    atomic_store(&b->sb[b->cfg.me].pending, b->pending);
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
    reconcile_locked(b, -1);
    pthread_mutex_unlock(&b->mu);
    if (atomic_load(&b->sb[b->cfg.me].waiting) && b->ops->offer)
        b->ops->offer(b->ctx);
}

/* One request handed to us is taken in; never below zero (the master
 * passes on stranded hand-offs, and a slot is reset at each spawn). */
static void take_incoming(fw_sb_slot *s)
{
    uint32_t v = atomic_load(&s->incoming);
    while (v > 0 && !atomic_compare_exchange_weak(&s->incoming, &v, v - 1))
        ;
}

/* Receive one hand-off datagram (fw_balance.h). Returns 0, 1 when it was
 * malformed (the fd, if any, is the caller's to close), -1 with errno. */
static int recv_pass(int sock, int *fd, unsigned char msg[FW_PASS_MSG_MAX], ssize_t *len)
{
    struct iovec iov = { .iov_base = msg, .iov_len = FW_PASS_MSG_MAX };
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
    *len = n;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(fd, CMSG_DATA(cm), sizeof(int));
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        return 1;
    if (n == 1 || (n == 2 && !(msg[1] & FW_PASS_CLIENT)))
        return 0;
    return n == FW_PASS_MSG_MAX && (msg[1] & FW_PASS_CLIENT) && (msg[2] == 0 || msg[2] == 4 || msg[2] == 6)
               ? 0 : 1;
}

/* The client record of a hand-off datagram (rec: msg + 2) into ss. */
static fw_pass_client client_of(const unsigned char *rec, struct sockaddr_storage *ss)
{
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    int v6 = rec[0] == 6;
    memset(ss, 0, sizeof(*ss));
    if (rec[0] != 4 && !v6) {
        ss->ss_family = AF_UNSPEC;
        return (fw_pass_client){ (struct sockaddr *)ss, sizeof(sa_family_t) };
    }
    ss->ss_family = v6 ? AF_INET6 : AF_INET;
    memcpy(v6 ? (void *)&a6->sin6_port : (void *)&a4->sin_port, rec + 1, 2);
    memcpy(v6 ? (void *)&a6->sin6_addr : (void *)&a4->sin_addr, rec + 3, v6 ? 16 : 4);
    return (fw_pass_client){ (struct sockaddr *)ss, v6 ? sizeof(*a6) : sizeof(*a4) };
}

/* The client record for a hand-off datagram into m[2..] (family 0 when it
 * names no IP client). Returns the datagram's length: FW_PASS_MSG_MAX, or
 * 2 when there is no record. */
static size_t client_record(unsigned char *m, fw_pass_client client)
{
    if (!client.sa)
        return 2;
    memset(m + 2, 0, FW_PASS_MSG_MAX - 2);
    m[1] |= FW_PASS_CLIENT;
    const struct sockaddr_in *a4 = (const struct sockaddr_in *)client.sa;
    const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)client.sa;
    int v6 = client.sa->sa_family == AF_INET6 && client.len >= (socklen_t)sizeof(*a6);
    if (!v6 && !(client.sa->sa_family == AF_INET && client.len >= (socklen_t)sizeof(*a4)))
        return FW_PASS_MSG_MAX;
    m[2] = v6 ? 6 : 4;
    memcpy(m + 3, v6 ? (const void *)&a6->sin6_port : (const void *)&a4->sin_port, 2);
    memcpy(m + 5, v6 ? (const void *)&a6->sin6_addr : (const void *)&a4->sin_addr, v6 ? 16 : 4);
    return FW_PASS_MSG_MAX;
}

/* Serve a connection handed to us (the fd is ours to close). */
static void take_pass(fw_balance *b, int fd, const unsigned char msg[FW_PASS_MSG_MAX], int well_formed)
{
    if (!well_formed || msg[0] >= b->nlisteners) {
        if (close(fd) != 0 && errno != EINTR)
            b->ops->log(b->ctx, 0, "close of a malformed hand-off", errno);
        return;
    }
    struct sockaddr_storage ss;
    fw_pass_client client = { NULL, 0 };
    if (msg[1] & FW_PASS_CLIENT)
        client = client_of(msg + 2, &ss);
    atomic_fetch_add(&b->sb[b->cfg.me].handed_in, 1);
    b->ops->take(b->ctx, msg[0], fd, msg[1] & FW_PASS_KEPT_ALIVE, client);
}

static void on_pass(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_balance *b = BAL_OF_PASS(w);
    for (int i = 0; i < PASS_BATCH; i++) {
        int fd = -1;
        unsigned char msg[FW_PASS_MSG_MAX] = { 0 };
        ssize_t len = 0;
        int rc = recv_pass(w->fd, &fd, msg, &len);
        if (rc < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                b->ops->log(b->ctx, 1, "hand-off recvmsg", errno);
            return;
        }
        if (fd >= 0)
            take_pass(b, fd, msg, rc == 0);
        /* Its request is dispatched now (counted in inflight), or queued
         * here, or gone: it no longer counts as coming. */
        if (rc == 0 && (msg[1] & FW_PASS_REQUEST))
            take_incoming(&b->sb[b->cfg.me]);
    }
}

/* Send the socket fd, unread, to slot j's worker (request: one waits in
 * it, counted in the target's `incoming` until the target takes it in),
 * with what is known of its client. Returns 0 when sent (the caller closes
 * its side), or -1 with errno (EAGAIN: its queue is full; nothing sent). */
static int pass_to(fw_balance *b, int fd, int listener, int served, fw_pass_client client, int j, int request)
{
    unsigned char msg[FW_PASS_MSG_MAX] = { (unsigned char)listener,
                             (unsigned char)((served ? FW_PASS_KEPT_ALIVE : 0) | (request ? FW_PASS_REQUEST : 0)) };
    size_t mlen = client_record(msg, client);
    struct iovec iov = { .iov_base = msg, .iov_len = mlen };
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
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    if (request)            /* before the send: the target may take it in at once */
        atomic_fetch_add(&b->sb[j].incoming, 1);
    ssize_t n;
    do {
        n = sendmsg(b->cfg.pass_fds[j], &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n != (ssize_t)mlen) {
        int e = errno;
        if (request)
            take_incoming(&b->sb[j]);
        errno = n < 0 ? e : EMSGSIZE;
        return -1;
    }
    atomic_fetch_add(&b->sb[b->cfg.me].handed_out, 1);
    return 0;
}

/* May slot j take connections from us (alive, accepting, not retiring,
 * running our code or newer: during a rolling reload a kept-alive client
 * that met the new code never goes back to the old)? */
static int can_take(const fw_balance *b, int j)
{
    return j != b->cfg.me && b->cfg.pass_fds && b->cfg.pass_fds[j] >= 0 && is_open(&b->sb[j]) &&
           !atomic_load(&b->sb[j].retire) &&
           atomic_load(&b->sb[j].image) >= atomic_load(&b->sb[b->cfg.me].image);
}

/* ---- the interface --------------------------------------------------------- */

int fw_balance_init(fw_balance *b, const fw_balance_cfg *cfg, int threads, int nlisteners, fw_loop *loop,
                    const fw_balance_ops *ops, void *ctx)
{
    b->cfg = *cfg;
    b->loop = loop;
    b->ops = ops;
    b->ctx = ctx;
    b->nlisteners = nlisteners;
    b->threads = threads > 1 ? (uint32_t)threads : 1;
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
    int e = pthread_mutex_init(&b->mu, NULL);
    if (e != 0) {
        errno = e;
        return -e;
    }
    if (b->cfg.kick_fds && b->cfg.kick_fds[b->cfg.me] >= 0) {
        b->kick_w.fd = b->cfg.kick_fds[b->cfg.me];
        b->kick_w.cb = on_kick;
        if (fw_loop_watch(loop, &b->kick_w, EPOLLIN) != 0)
            return -errno;
    }
    /* Hand-offs arrive in every mode: a retiring peer passes its idle
     * connections on (with threads, a saturated one passes new requests). */
    if (b->cfg.pass_recv_fd >= 0) {
        b->pass_w.fd = b->cfg.pass_recv_fd;
        b->pass_w.cb = on_pass;
        if (fw_loop_watch(loop, &b->pass_w, EPOLLIN) != 0)
            return -errno;
    }
    return 0;
}

void fw_balance_destroy(fw_balance *b)
{
    /* The fds are not ours: just leave the epoll set (closed with the loop). */
    if (b->sb)
        pthread_mutex_destroy(&b->mu);
    b->sb = NULL;
}

void fw_balance_start(fw_balance *b, int64_t now)
{
    pthread_mutex_lock(&b->mu);
    b->draining = 0;
    b->allowed = 1;
    b->backstop_at = now;
    atomic_store(&b->sb[b->cfg.me].pid, (int32_t)getpid());
    atomic_store(&b->sb[b->cfg.me].why, FW_SB_WHY_NONE);
    atomic_store(&b->sb[b->cfg.me].state, FW_SB_ALIVE);
    reconcile_locked(b, -1);
    pthread_mutex_unlock(&b->mu);
}

void fw_balance_allow(fw_balance *b, int on)
{
    pthread_mutex_lock(&b->mu);
    b->allowed = on;
    reconcile_locked(b, -1);
    pthread_mutex_unlock(&b->mu);
}

int fw_balance_armed(const fw_balance *b)
{
    return (int)atomic_load(&b->sb[b->cfg.me].armed);
}

int fw_balance_sharing(const fw_balance *b)
{
    if (b->cfg.mode == FW_BAL_REUSEPORT)
        return 1;
    int n = 0;
    for (int j = 0; j < b->cfg.nslots; j++)
        n += is_open(&b->sb[j]);
    return n > 0 ? n : 1;
}

void fw_balance_accepted(fw_balance *b)
{
    atomic_fetch_add(&b->sb[b->cfg.me].accepted, 1);
    if (!counting(b))
        return;
    /* The first connection after a quiet time: the workers arm by the
     * order from now on (want_armed), starting here (a full worker that
     * kept its listeners steps aside) and with kicks to the others. */
    int was_ordered = connections_arriving(b);
    atomic_store(&b->sb[b->cfg.me].accept_ms, coarse_ms());
    if (!was_ordered) {
        pthread_mutex_lock(&b->mu);
        reconcile_locked(b, 1);
        pthread_mutex_unlock(&b->mu);
    }
}

int fw_balance_accept_batch(const fw_balance *b, int batch)
{
    /* Looping accept() until EAGAIN would let one worker swallow a burst
     * beyond its free threads, or (inline) beyond its one free loop while
     * peers idle: least-busy takes one and re-decides. A lone inline
     * server has nobody to leave connections to. */
    if (counting(b) || (b->cfg.mode == FW_BAL_LEAST_BUSY && b->cfg.nslots >= 2))
        return 1;
    return batch;
}

void fw_balance_silent(fw_balance *b, fw_balance_place *p)
{
    if (!counting(b) || p->pending)
        return;
    pthread_mutex_lock(&b->mu);
    p->pending = 1;
    b->pending++;
    publish_locked(b);
    reconcile_locked(b, -1);
    pthread_mutex_unlock(&b->mu);
}

/* mu held: the request arrived (or the connection closed, or its grace ran out). */
static void unpend_locked(fw_balance *b, fw_balance_place *p)
{
    if (p->pending) {
        p->pending = 0;
        b->pending--;
    }
}

void fw_balance_begin(fw_balance *b, fw_balance_place *p)
{
    if (!counting(b) || (p->counted && !p->pending))
        return;
    pthread_mutex_lock(&b->mu);
    int was_full = b->inflight >= b->threads;
    unpend_locked(b, p);
    if (!p->counted) {
        p->counted = 1;
        b->inflight++;
    }
    publish_locked(b);
    int arriving;
    if (rank_needed(b, was_full, &arriving))
        reconcile_locked(b, arriving);
    pthread_mutex_unlock(&b->mu);
}

void fw_balance_end(fw_balance *b, fw_balance_place *p)
{
    if (!p->counted && !p->pending)
        return;
    pthread_mutex_lock(&b->mu);
    int was_full = b->inflight >= b->threads;
    unpend_locked(b, p);
    if (p->counted) {
        p->counted = 0;
        b->inflight--;
    }
    publish_locked(b);
    int arriving;
    if (rank_needed(b, was_full, &arriving))
        reconcile_locked(b, arriving);
    pthread_mutex_unlock(&b->mu);
}

/* The live peer that can take a request with the least load, if it has a
 * free thread: its slot (its load in *load), or -1. */
static int least_busy_peer(const fw_balance *b, uint32_t *load)
{
    int best = -1;
    uint32_t best_n = b->threads;
    for (int j = 0; j < b->cfg.nslots; j++) {
        if (!can_take(b, j))
            continue;
        uint32_t n = load_of(&b->sb[j]);
        if (n < best_n) {
            best_n = n;
            best = j;
        }
    }
    *load = best_n;
    return best;
}

int fw_balance_handoff(fw_balance *b, fw_balance_place *p, int fd, int listener, int served,
                       fw_pass_client client)
{
    if (!counting(b) || !b->cfg.pass_fds || b->cfg.nslots < 2)
        return 0;
    /* Our load, the connection's own pending place aside (it is not
     * counted yet: it is still waiting for its request). */
    uint32_t mine = load_of(&b->sb[b->cfg.me]) - (p->pending ? 1u : 0u);
    /* A fresh connection's first request is placed as if it had come with
     * the connection: at the least loaded worker (load_of; its own pending
     * place here aside). A kept-alive one stays
     * while this worker has a free thread: moving costs a syscall on each
     * side, and only a saturated worker makes its request wait. */
    if (served && mine < b->threads)
        return 0;
    uint32_t best_n;
    int best = least_busy_peer(b, &best_n);
    if (best < 0 || best_n >= mine)
        return 0;            /* nobody is less busy: it is served here */
    return pass_to(b, fd, listener, served, client, best, 1) == 0;   /* its queue is full or it is gone: here */
}

void fw_balance_waiting(fw_balance *b, uint32_t n)
{
    atomic_store(&b->sb[b->cfg.me].waiting, n);
}

int fw_balance_give(fw_balance *b, int fd, int listener, int served, fw_pass_client client)
{
    if (!counting(b) || !b->cfg.pass_fds || b->cfg.nslots < 2)
        return 0;
    uint32_t best_n;
    int best = least_busy_peer(b, &best_n);
    return best >= 0 && pass_to(b, fd, listener, served, client, best, 1) == 0;
}

int fw_balance_pass_on(fw_balance *b, int fd, int listener, int served, fw_pass_client client)
{
    /* Round robin over the peers that can take it, so a retiring worker's
     * idle connections spread instead of piling onto one worker (they count
     * for nothing in the scoreboard until a request arrives). */
    int n = b->cfg.nslots, any = 0;
    for (int k = 1; k <= n; k++) {
        int j = (b->pass_next + k) % n;
        if (!can_take(b, j))
            continue;
        any = 1;
        if (pass_to(b, fd, listener, served, client, j, 0) == 0) {
            b->pass_next = j;
            return 0;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) {
            int e = errno;
            char what[48];
            snprintf(what, sizeof(what), "hand-off to worker slot %d", j);
            b->ops->log(b->ctx, 0, what, e);
        }
    }
    return any ? FW_AGAIN : -ESRCH;
}

int fw_balance_hands_on(const fw_balance *b, int retiring)
{
    uint32_t said = atomic_load(&b->sb[b->cfg.me].retire);
    return b->cfg.pass_fds && b->cfg.nslots > 1 && said != FW_SB_RETIRE_ALL &&
           (retiring || said == FW_SB_RETIRE_HAND_ON);
}

int fw_balance_tick(fw_balance *b, int64_t now)
{
    if (!counting(b) || b->cfg.nslots < 2)
        return -1;
    pthread_mutex_lock(&b->mu);
    int need = !b->armed && b->allowed && !b->draining && b->inflight < b->threads;
    if (need && now >= b->backstop_at) {
        reconcile_locked(b, -1);
        b->backstop_at = now + (b->cfg.backstop_ms > 0 ? b->cfg.backstop_ms : BACKSTOP_MS);
    }
    int64_t left = b->backstop_at - now;
    pthread_mutex_unlock(&b->mu);
    if (!need)
        return -1;
    return left < 0 ? 0 : (int)left;
}

int fw_balance_held(const fw_balance *b)
{
    return (int)atomic_load_explicit(&b->sb[b->cfg.me].hold, memory_order_relaxed);
}

void fw_balance_beat(fw_balance *b, int64_t now)
{
    atomic_store_explicit(&b->sb[b->cfg.me].beat, now, memory_order_relaxed);
}

void fw_balance_drain(fw_balance *b, uint32_t why)
{
    pthread_mutex_lock(&b->mu);
    b->draining = 1;
    b->allowed = 0;
    atomic_store(&b->sb[b->cfg.me].why, why);     /* before the state the master looks at */
    /* Out of the minimum first, so the kicks below see the new one. */
    atomic_store(&b->sb[b->cfg.me].state, FW_SB_DRAINING);
    reconcile_locked(b, -1);
    pthread_mutex_unlock(&b->mu);
}

/* ---- master side --------------------------------------------------------- */

void fw_sb_spawn(void *scoreboard, int nslots, int i, const int *kick_fds, uint32_t image)
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
    atomic_store(&sb[i].incoming, 0);
    atomic_store(&sb[i].pending, 0);
    atomic_store(&sb[i].armed, 0);
    atomic_store(&sb[i].open, 0);
    atomic_store(&sb[i].retire, 0);
    atomic_store(&sb[i].accepted, 0);
    atomic_store(&sb[i].handed_in, 0);
    atomic_store(&sb[i].handed_out, 0);
    atomic_store(&sb[i].kicks_sent, 0);
    atomic_store(&sb[i].arms, 0);
    atomic_store(&sb[i].accept_ms, 0);
    atomic_store(&sb[i].beat, 0);
    atomic_store(&sb[i].hold, 0);
    atomic_store(&sb[i].image, image);
    atomic_store(&sb[i].waiting, 0);
    atomic_store(&sb[i].why, FW_SB_WHY_NONE);
    atomic_fetch_add(&sb[i].gen, 1);
    atomic_store(&sb[i].pid, 0);
    /* FREE until the worker's loop runs (fw_balance_start): a worker still
     * importing the app must not count as the idlest one. */
    atomic_store(&sb[i].state, FW_SB_FREE);
}

int fw_sb_view_of(const void *scoreboard, int nslots, int i, fw_sb_view *out)
{
    if (i < 0 || i >= nslots)
        return -EINVAL;
    /* The loads are atomic, not the copy: each field is what it was at
     * some moment, which is all a reader of statistics needs. */
    fw_sb_slot *s = (fw_sb_slot *)scoreboard + i;
    *out = (fw_sb_view){
        .state = atomic_load(&s->state), .inflight = atomic_load(&s->inflight),
        .incoming = atomic_load(&s->incoming), .pending = atomic_load(&s->pending),
        .armed = atomic_load(&s->armed), .open = atomic_load(&s->open), .retire = atomic_load(&s->retire),
        .threads = atomic_load(&s->threads), .gen = atomic_load(&s->gen), .pid = atomic_load(&s->pid),
        .beat = atomic_load(&s->beat), .hold = atomic_load(&s->hold), .image = atomic_load(&s->image),
        .waiting = atomic_load(&s->waiting),
        .accepted = atomic_load(&s->accepted), .handed_in = atomic_load(&s->handed_in),
        .handed_out = atomic_load(&s->handed_out), .kicks_sent = atomic_load(&s->kicks_sent),
        .arms = atomic_load(&s->arms), .why = atomic_load(&s->why),
    };
    return 0;
}

void fw_balance_view(const fw_balance *b, fw_sb_view *out)
{
    fw_sb_view_of(b->sb, b->cfg.nslots, b->cfg.me, out);
}

void fw_sb_retire(void *scoreboard, int nslots, int i)
{
    fw_sb_slot *sb = scoreboard;
    if (i >= 0 && i < nslots)
        atomic_store(&sb[i].retire, FW_SB_RETIRE_HAND_ON);
}

void fw_sb_end(void *scoreboard, int nslots, int i)
{
    fw_sb_slot *sb = scoreboard;
    if (i >= 0 && i < nslots)
        atomic_store(&sb[i].retire, FW_SB_RETIRE_ALL);
}

void fw_sb_hold(void *scoreboard, int nslots, int i, int on)
{
    fw_sb_slot *sb = scoreboard;
    if (i >= 0 && i < nslots)
        atomic_store(&sb[i].hold, (uint32_t)(on != 0));
}

void fw_sb_release(void *scoreboard, int nslots, int i, const int *kick_fds)
{
    fw_sb_slot *sb = scoreboard;
    if (i < 0 || i >= nslots)
        return;
    /* A stale low count would cap every live worker: leave the minimum,
     * then make the others re-decide. */
    atomic_store(&sb[i].state, FW_SB_FREE);
    atomic_store(&sb[i].open, 0);
    atomic_store(&sb[i].inflight, 0);
    atomic_store(&sb[i].incoming, 0);
    atomic_store(&sb[i].pending, 0);
    atomic_store(&sb[i].waiting, 0);
    atomic_store(&sb[i].armed, 0);
    atomic_store(&sb[i].pid, 0);
    for (int j = 0; j < nslots; j++) {
        if (j == i || !is_open(&sb[j]) || !kick_fds || kick_fds[j] < 0)
            continue;
        uint64_t one = 1;
        if (write(kick_fds[j], &one, sizeof(one)) < 0 && errno != EAGAIN)
            break;
    }
}
