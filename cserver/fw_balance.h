/* fw_balance: how the workers of one master share their listening sockets.
 *
 * Modes (--balance):
 *   least-busy  one shared listener, added to each worker's own epoll set
 *               with EPOLLEXCLUSIVE only while that worker has a free app
 *               thread and its in-flight count is the lowest among live
 *               workers. Each new connection then wakes exactly one worker,
 *               the least busy one; when every worker is full, connections
 *               wait in the kernel's accept queue and the first thread to
 *               free up takes the oldest. Kept-alive connections whose next
 *               request reaches a saturated worker are handed, unread, to a
 *               worker with a free thread (SCM_RIGHTS). While no connection
 *               arrives (none accepted for FW_RANK_LIVE_MS), the order is
 *               not followed: workers with a free thread stay armed and
 *               full ones keep what they have (want_armed, in the .c).
 *   reuseport   one SO_REUSEPORT socket per worker: the kernel spreads new
 *               connections by hash, blind to load.
 *   shared      every worker always watches the shared listener (the herd:
 *               what gunicorn does), kept for comparison.
 *
 * In every mode a worker that retires while others serve on (reload,
 * --max-requests, --max-rss, TTOU) hands its idle connections to them
 * instead of closing them, so a kept-alive client never sees the change.
 *
 * The scoreboard is shared memory made by the master before the first fork:
 * one slot per worker, each field with one writer (but `incoming`). Each side
 * publishes its own field (seq_cst) and then reads the others (seq_cst), so
 * of two concurrent changes at least one sees the other: either the changer
 * kicks the peer (an eventfd write) or the peer's own re-check corrects it.
 * A slow backstop timer covers lost kicks and crashed peers. The design and
 * its measurements: docs/accept-balancing.md.
 *
 * Threads: the loop thread and the app threads of the worker both change
 * the in-flight count and the listener registration, under `mu`.
 *
 * Layering: fw_balance knows the loop, the scoreboard and sockets, not the
 * server or its connections. The server watches and unwatches its listeners
 * and takes in handed-over sockets through fw_balance_ops; a connection
 * carries its place in the count as an fw_balance_place. */
#ifndef FW_BALANCE_H
#define FW_BALANCE_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "fw_loop.h"
#include "fw_rc.h"

enum fw_balance_mode { FW_BAL_SHARED = 0, FW_BAL_LEAST_BUSY = 1, FW_BAL_REUSEPORT = 2 };

/* A slot's `retire` word (the master writes it). */
enum fw_sb_retire_word { FW_SB_RETIRE_NO = 0, FW_SB_RETIRE_HAND_ON = 1, FW_SB_RETIRE_ALL = 2 };

enum fw_sb_state { FW_SB_FREE = 0, FW_SB_ALIVE = 1, FW_SB_DRAINING = 2 };
/* Why a worker drains, as it says in its slot (the master labels a worker
 * that retires by itself with it). */
enum fw_sb_why {
    FW_SB_WHY_NONE = 0,             /* not draining (or a worker of an older build) */
    FW_SB_WHY_ASKED = 1,            /* a stop signal or a caller: the master's, or from outside */
    FW_SB_WHY_MAX_REQUESTS = 2,     /* its own --max-requests */
    FW_SB_WHY_APP_EXIT = 3          /* the app raised SystemExit (or KeyboardInterrupt) */
};

/* One worker's slot: two cache lines, the first for what peers read to
 * decide, the second for statistics. Writers: the owner worker unless said. */
typedef struct fw_sb_slot {
    _Atomic uint32_t inflight;      /* requests dispatched to the app, not finished */
    _Atomic uint32_t incoming;      /* any sender: requests handed to this worker, not yet
                                     * taken in (counts as load, so that two quick hand-offs
                                     * do not both pick the same idle worker) */
    _Atomic uint32_t pending;       /* connections accepted, their request not arrived yet,
                                     * for at most FW_SILENT_GRACE_MS (see load_of) */
    _Atomic uint32_t armed;         /* the listener is in the owner's epoll set */
    _Atomic uint32_t state;         /* fw_sb_state; master: FREE, owner: ALIVE, DRAINING */
    _Atomic uint32_t open;          /* the owner may accept (not paused for fds, not stopping):
                                     * only open workers count for the minimum and get kicks */
    _Atomic uint32_t retire;        /* master, fw_sb_retire_word: HAND_ON, this worker is
                                     * retiring while others serve on (reload, --max-rss, TTOU):
                                     * hand idle connections over; ALL, the whole server stops */
    _Atomic uint32_t threads;       /* app threads of the owner */
    _Atomic uint32_t gen;           /* master: bumped at each spawn into the slot */
    _Atomic int32_t pid;            /* owner, when its loop starts; master zeroes it */
    _Atomic int64_t beat;           /* owner: its loop's last pass (CLOCK_MONOTONIC ms), 0 before
                                     * the first: the master's heartbeat check */
    _Atomic uint32_t hold;          /* master: do not retire by yourself (--max-requests): the
                                     * master cannot replace you now (no app loaded) */
    _Atomic uint32_t image;         /* master: which code the worker runs (each reload makes a
                                     * newer one): a connection never moves to older code */
    _Atomic uint32_t waiting;       /* requests waiting for a thread here, unread (the server's
                                     * ready queue): load, and a peer that frees a thread kicks us
                                     * to hand them over */
    _Atomic uint32_t accept_ms;     /* its last accept: CLOCK_MONOTONIC ms, low 32 bits (a
                                     * recent one anywhere keeps the order exact: rank_needed) */
    _Atomic uint64_t accepted __attribute__((aligned(64)));   /* statistics, owner */
    _Atomic uint64_t handed_in;
    _Atomic uint64_t handed_out;
    _Atomic uint64_t kicks_sent;
    _Atomic uint64_t arms;          /* listeners added to or removed from its epoll set */
    _Atomic uint32_t why;           /* owner, as it drains: fw_sb_why; master zeroes it */
} __attribute__((aligned(64))) fw_sb_slot;

#define FW_SB_SLOT_SIZE 128

/* How long a connection accepted without its request steers placement
 * (fw_balance_silent): long enough for any client that sends at once. */
#define FW_SILENT_GRACE_MS 30

/* What the worker is told (by the master, through the app layer). The fds
 * and the scoreboard memory are owned by the caller and outlive the server. */
typedef struct fw_balance_cfg {
    int mode;                       /* fw_balance_mode */
    void *scoreboard;               /* nslots * FW_SB_SLOT_SIZE bytes, 64-aligned; NULL: private */
    int nslots;
    int me;                         /* this worker's slot */
    const int *kick_fds;            /* nslots eventfds (-1: none); ours is watched */
    const int *pass_fds;            /* nslots sending ends of the hand-off sockets (-1: none) */
    int pass_recv_fd;               /* our receiving end, -1 if none */
    int backstop_ms;                /* re-check while disarmed with a free thread; 0 = 500 */
} fw_balance_cfg;

/* What a hand-off carries besides the socket: the client the connection's
 * PROXY protocol header named (AF_INET or AF_INET6, with its port), or a
 * sockaddr of family AF_UNSPEC when the header was read and named none
 * (LOCAL, UNKNOWN); sa NULL when no header was read (none is expected, or it
 * is still in the socket for the receiver to read). */
typedef struct fw_pass_client {
    const struct sockaddr *sa;
    socklen_t len;
} fw_pass_client;

/* What fw_balance asks of the server above it. ctx: the server's. */
typedef struct fw_balance_ops {
    /* Watch every listener (on: with EPOLLEXCLUSIVE when exclusive) or stop
     * watching them. Returns 0, or -1 (errno set; the callee said why). */
    int (*set_listeners)(void *ctx, int on, int exclusive);
    /* Serve a connection a peer handed us: fd is the callee's from now on;
     * listener: the index of the listener it came through; kept_alive: it
     * was served before (idle timeout, not header timeout); client: what
     * the sender knew of the client beyond the socket (above). */
    void (*take)(void *ctx, int listener, int fd, int kept_alive, fw_pass_client client);
    /* Something failed: what (the context), err (errno); error or warning. */
    void (*log)(void *ctx, int error, const char *what, int err);
    /* Requests wait here unread and a peer has a free thread (it kicked
     * us): hand what can go over (fw_balance_give), oldest first. */
    void (*offer)(void *ctx);
} fw_balance_ops;

/* One connection's place in this worker's count (the caller embeds it in
 * the connection; changed under the balancer's mu). */
typedef struct fw_balance_place {
    int counted;                    /* in the in-flight count */
    int pending;                    /* accepted silent: steers placement (fw_balance_silent) */
} fw_balance_place;

typedef struct fw_balance {
    fw_balance_cfg cfg;             /* fd arrays not owned (see above) */
    fw_loop *loop;                  /* not owned: the server's */
    const fw_balance_ops *ops;      /* not owned */
    void *ctx;                      /* not owned: passed to ops */
    int nlisteners;                 /* listener indexes a hand-off may carry */
    fw_sb_slot *sb;                 /* the scoreboard (cfg's, or own_sb) */
    fw_sb_slot own_sb;              /* a private one-slot scoreboard for a lone server */
    pthread_mutex_t mu;             /* guards everything below and listener epoll_ctl */
    uint32_t threads;               /* capacity: app threads */
    uint32_t inflight;              /* our count (the slot's copy is for the others) */
    uint32_t pending;               /* our silent new connections (likewise) */
    int allowed;                    /* the loop allows accepting (not stopping, fds left) */
    int armed;                      /* listeners are in our epoll set */
    int draining;
    int pass_next;                  /* loop thread: the slot that took the last pass_on */
    int64_t backstop_at;            /* loop thread: next re-check while disarmed */
    fw_watch kick_w;                /* our kick eventfd (cfg.kick_fds[me]), not owned */
    fw_watch pass_w;                /* our hand-off socket (cfg.pass_recv_fd), not owned */
} fw_balance;

/* Set up b for a server with `threads` app threads (1: inline) and
 * `nlisteners` listeners, on `loop` (kick and hand-off fds are watched
 * there). Returns 0 or -errno (errno set too). */
int fw_balance_init(fw_balance *b, const fw_balance_cfg *cfg, int threads, int nlisteners, fw_loop *loop,
                    const fw_balance_ops *ops, void *ctx);
void fw_balance_destroy(fw_balance *b);

/* Loop thread, when the loop starts (now: monotonic ms): join the
 * scoreboard (ALIVE) and arm. */
void fw_balance_start(fw_balance *b, int64_t now);

/* Loop thread: may the listeners be watched at all (not stopping, below
 * max-connections, not paused after EMFILE)? Arms or disarms as the mode
 * and the scoreboard say. */
void fw_balance_allow(fw_balance *b, int on);
/* Accept at most this many connections per listener wake-up (batch: the
 * configured most). */
int fw_balance_accept_batch(const fw_balance *b, int batch);
/* Question, any thread: are the listeners in this worker's epoll set? */
int fw_balance_armed(const fw_balance *b);
/* How many workers take connections from this worker's listeners now
 * (itself included; 1 with reuseport or alone). */
int fw_balance_sharing(const fw_balance *b);
/* One connection accepted: statistics, and its time (connections are
 * arriving: request starts and ends keep the order exact for a while). */
void fw_balance_accepted(fw_balance *b);

/* Loop thread: c was accepted and its request is not in the socket yet.
 * For FW_SILENT_GRACE_MS (the caller's timer ends it with fw_balance_end)
 * or until its request arrives, it weighs in the choice of the worker for
 * the next connection, but it never holds capacity: a thousand silent
 * connections do not stop a worker from accepting. */
void fw_balance_silent(fw_balance *b, fw_balance_place *p);
/* A request is about to be handed to an app thread: it counts as busy until
 * the app call returns. A request that arrives after its connection is
 * placed then (fw_balance_handoff). */
void fw_balance_begin(fw_balance *b, fw_balance_place *p);
/* The app call for the connection returned (any thread; before the
 * response is written), or it closed while counted, or its silent grace
 * ran out. Both publish the count at once; they re-rank the workers (arm,
 * disarm, kick) only when that can change who takes the next connection
 * (fw_balance.c: rank_needed). */
void fw_balance_end(fw_balance *b, fw_balance_place *p);

/* Loop thread, a request is arriving on an idle connection (socket fd,
 * through listener `listener`; nothing of it read yet; served: kept alive
 * after a request, else new and silent until now): hand it, unread, to a
 * less busy worker with a free thread when this one is saturated (kept
 * alive) or not the least busy (a fresh connection's first request).
 * A question: 1 if handed off (the caller closes its side of it), 0 to
 * serve it here. Not while stopping. */
int fw_balance_handoff(fw_balance *b, fw_balance_place *p, int fd, int listener, int served,
                       fw_pass_client client);

/* Loop thread: n requests wait here for a thread, unread (published for
 * the peers' choices; one that frees a thread kicks us). */
void fw_balance_waiting(fw_balance *b, uint32_t n);
/* Loop thread: hand a request that waits here, unread, to a peer with a
 * free thread. 1 if handed (the caller closes its side), 0 if no peer can
 * take it now. */
int fw_balance_give(fw_balance *b, int fd, int listener, int served, fw_pass_client client);

/* Loop thread, while retiring: give an idle connection (nothing of its next
 * request read) to a live worker that serves on, unread. Returns 0 when
 * handed over (the caller closes its side), FW_AGAIN when no peer could
 * take it just now (their queues are full: try again soon), -ESRCH when no
 * peer will take it (close it the usual way). */
int fw_balance_pass_on(fw_balance *b, int fd, int listener, int served, fw_pass_client client);

/* A stopping worker: may it hand its idle connections to others that serve
 * on? Yes when it has peers and it retires by itself (retiring:
 * --max-requests, or a SIGTERM sent to it alone) or the master asked it to
 * (reload, --max-rss, TTOU); never once the master stops them all (asked
 * again each pass of the stop: a SIGTERM to the whole process group may
 * reach the worker before the master says so). */
int fw_balance_hands_on(const fw_balance *b, int retiring);

/* One hand-off datagram, with the connection's fd in SCM_RIGHTS: the
 * listener's index (the same in every worker) and flags; with
 * FW_PASS_CLIENT, the client record follows: its family (0: none named,
 * 4: IPv4, 6: IPv6), its port (2 bytes, network order) and its address
 * (16 bytes, IPv4 in the first 4). The master forwards a stranded
 * datagram whole, with FW_PASS_REQUEST cleared (slots.py). */
enum {
    FW_PASS_KEPT_ALIVE = 1,         /* served before: idle timeout, not header timeout */
    FW_PASS_REQUEST = 2,            /* a request waits in it: counted in the target's `incoming` */
    FW_PASS_CLIENT = 4              /* its PROXY header was read: the client record follows */
};
#define FW_PASS_MSG_MAX 21          /* listener, flags, family, port, address */

/* Loop thread, each pass (now: monotonic ms): the backstop re-check.
 * Returns the ms until it is next due, or -1 when none is needed. */
int fw_balance_tick(fw_balance *b, int64_t now);

/* Question, any thread: has the master asked this worker not to retire by
 * itself (fw_sb_hold)? */
int fw_balance_held(const fw_balance *b);

/* Loop thread, each pass: the loop turns (now: monotonic ms). */
void fw_balance_beat(fw_balance *b, int64_t now);

/* Graceful stop: leave the minimum (DRAINING, saying why: fw_sb_why),
 * disarm, kick the others. */
void fw_balance_drain(fw_balance *b, uint32_t why);

/* For the master (through the app layer): reset slot i for a new worker
 * (it turns ALIVE itself when its loop runs); mark it retiring (before the
 * SIGTERM that retires it); or mark it free after the worker ended, kicking
 * the live workers so none stays throttled by a stale count. */
void fw_sb_spawn(void *scoreboard, int nslots, int i, const int *kick_fds, uint32_t image);
/* A copy of slot i, each field loaded atomically (for stats and the master).
 * Returns 0, or -EINVAL if i is not a slot. */
typedef struct fw_sb_view {
    uint32_t state, inflight, incoming, pending, armed, open, retire, threads, gen, hold, image, waiting, why;
    int32_t pid;
    int64_t beat;
    uint64_t accepted, handed_in, handed_out, kicks_sent, arms;
} fw_sb_view;
int fw_sb_view_of(const void *scoreboard, int nslots, int i, fw_sb_view *out);
/* This worker's own slot. */
void fw_balance_view(const fw_balance *b, fw_sb_view *out);
void fw_sb_retire(void *scoreboard, int nslots, int i);
/* The master stops the whole server (before its SIGTERM to worker i): the
 * worker closes its idle connections, even if it was retiring. */
void fw_sb_end(void *scoreboard, int nslots, int i);
/* Ask worker i not to retire by itself (--max-requests) while on: the
 * master could not replace it. */
void fw_sb_hold(void *scoreboard, int nslots, int i, int on);
void fw_sb_release(void *scoreboard, int nslots, int i, const int *kick_fds);

#endif
