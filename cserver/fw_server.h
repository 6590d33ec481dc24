/* fw_server: one event loop serving HTTP/1.1 (or, on the listeners that
 * say so, the uwsgi protocol) on a set of listening sockets.
 *
 * A server is "this loop, on these listening sockets, calling this app": the
 * application layer (the Python glue) plugs in through fw_app_ops and never
 * sees epoll. The server owns its loop, connections and timers; the caller
 * owns the listening fds (they are not closed by the server) and the config
 * strings. No globals: several servers may run in one process, each on its
 * own thread. */
#ifndef FW_SERVER_H
#define FW_SERVER_H

#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include "fw_alog.h"
#include "fw_backlog.h"
#include "fw_balance.h"
#include "fw_http.h"
#include "fw_lead.h"
#include "fw_loop.h"
#include "fw_netmask.h"
#include "fw_pool.h"
#include "fw_rc.h"
#include "fw_say.h"
#include "fw_spare.h"
#include "fw_stats.h"
#include "fw_timer.h"

typedef struct fw_conn fw_conn;
typedef struct fw_server fw_server;

/* Write buffers grown for a body go round in size classes (fw_server.
 * spare_out): 8, 16, 32, 64 and 128 KiB, a few of each kept. A body below
 * 64 KiB in a list is copied into the write buffer; grown by realloc and
 * freed with its response, a 4 KiB body cost a malloc, a realloc and a
 * free per request (7 % of its instructions). */
#define FW_SPARE_OUT_CLASSES 5
#define FW_SPARE_OUT_KEEP 8

/* "Date: ...\r\n" for the current second, one per thread that writes
 * response heads, so no thread reads a string another is rewriting. */
typedef struct fw_date {
    time_t sec;
    size_t len;
    char buf[40];
} fw_date;

void fw_date_refresh(fw_date *d);

/* A thread that runs the app: the loop thread (inline mode) or one of the
 * pool's. A connection points at the one that owns it (fw_conn.thr). */
typedef struct fw_thread {
    int index;                 /* 0..threads-1: the app layer's per-thread slot */
    void *app_ctx;             /* from ops->thread_start (the app layer's), or NULL */
    int per_call;              /* the loop thread running requests as an app thread does
                                * (fw_server.lead_thread): what the app layer holds for a call
                                * (the GIL) it takes and lets go per call, not kept between */
    fw_date date;
} fw_thread;

typedef struct fw_config {
    fw_http_limits limits;
    int header_timeout_ms;     /* first byte to end of head (slowloris): 408 */
    int body_timeout_ms;       /* longest pause while a body arrives: 408 */
    int body_min_rate;         /* bytes a second a body must keep up, after a grace of one
                                * body timeout (mod_reqtimeout's MinRate): 408; 0 = none */
    int keepalive_timeout_ms;  /* idle kept-alive connection; 0 disables keep-alive */
    int write_timeout_ms;      /* longest stall while the client does not read */
    int graceful_timeout_ms;   /* stop(): how long in-flight responses may take */
    size_t spool_threshold;    /* request bodies above this go to a temp file */
    const char *spool_dir;     /* directory for spool files; not owned */
    int max_connections;
    int accept_batch;          /* accepts per listener wake-up */
    int write_coalesce_us;     /* inline: how long a finished response may wait for the end of
                                * the loop pass, to leave with the others (fw_server_defer);
                                * 0: each is written at once */
    int gil_each_write;        /* inline: the app layer lets the GIL go before each response's
                                * write, not once a loop pass (fw_server_app_unlock), so that
                                * a Python thread of the server's own that works per response
                                * (access records: python/forkwsgi/accessrecords.py) keeps up */
    uint64_t max_requests;     /* stop gracefully after this many responses; 0 = never */
    int threads;               /* app threads; 1 = the app runs inline on the loop thread */
    int inline_first;          /* threads > 1: the loop thread runs the requests of a pass
                                * itself while they are quick (fw_lead.h); 0: every request
                                * goes to an app thread */
    int release_listeners;     /* on stop, drop this process's hold on the listening sockets
                                * at once (a worker: its master or peers keep them; a worker
                                * whose master died frees the port while it finishes) */
    fw_balance_cfg balance;    /* how this worker shares its listeners (fw_balance.h) */
    fw_alog *access_log;       /* a line per response (fw_alog.h); not owned (the app layer
                                * makes and frees it); NULL: no access log */
    fw_stats *stats;           /* this worker's counters (fw_stats.h), in memory the master
                                * owns; NULL: none */
    /* Behind a proxy. The lists are not owned (the caller's, like spool_dir);
     * NULL holds no IP address. Unix-socket peers are in every list. */
    const fw_netlist *forwarded_allow;  /* peers whose scheme headers count (--forwarded-allow-ips),
                                         * decided once per connection (fw_conn.fwd_allowed) */
    int proxy_protocol;        /* PROXY protocol versions each connection starts with (fw_proxy.h:
                                * FW_PROXY_V1 | FW_PROXY_V2); 0: off */
    const fw_netlist *proxy_allow;      /* peers that may send one (--proxy-allow-from); others are
                                         * closed at accept */
    uint64_t uwsgi_listeners;  /* bit i: the listener of fds[i] speaks the uwsgi protocol
                                * (fw_uwsgi.h, --uwsgi-socket), not HTTP */
    const fw_netlist *uwsgi_allow;      /* peers that may connect to those (--uwsgi-allow-from);
                                         * others are closed at accept */
} fw_config;

void fw_config_defaults(fw_config *cfg);

/* An outcome (fw_rc.h): what the app layer tells the loop when a call
 * (on_request, on_writable) returns. */
enum fw_app_rc {
    FW_APP_DONE = 0,    /* response complete (possibly still buffered in out) */
    FW_APP_WAIT = 1,    /* call on_writable once the out buffer has drained */
    FW_APP_CLOSE = 2    /* drop the connection now (response broken) */
};

enum fw_log_level { FW_LOG_DEBUG = 10, FW_LOG_INFO = 20, FW_LOG_WARNING = 30, FW_LOG_ERROR = 40 };

typedef struct fw_app_ops {
    /* A request head (and its body, unless it streams) is ready. */
    enum fw_app_rc (*on_request)(void *app, fw_conn *c);
    /* A response that returned FW_APP_WAIT may continue. */
    enum fw_app_rc (*on_writable)(void *app, fw_conn *c);
    /* The connection is going away while the app still holds request state
     * (client gone, write timeout, server stop): release it. */
    void (*on_drop)(void *app, fw_conn *c);
    /* epoll_wait was interrupted by a signal. A question: 1 stops the loop
     * now, 0 serves on. */
    int (*on_signal)(void *app);
    /* Inline, the loop is about to write, to read a body that may be
     * spooled, or to leave a connection's pipelined requests: the app
     * layer lets go of what it kept held between on_request calls (the
     * GIL). Optional. */
    void (*unlock)(void *app);
    /* A pool thread starts / ends (threads > 1): the app layer may keep
     * per-thread state in t->app_ctx. Optional. */
    void (*thread_start)(void *app, fw_thread *t);
    void (*thread_stop)(void *app, fw_thread *t);
    void (*log)(void *app, int level, const char *msg);
} fw_app_ops;

typedef struct fw_listener {
    fw_watch w;                /* fd owned by the caller */
    fw_server *srv;
    int family;                /* AF_INET, AF_INET6, AF_UNIX */
    int uwsgi;                 /* its connections speak the uwsgi protocol (fw_uwsgi.h), not HTTP */
    void *app_data;            /* for the app layer (e.g. cached SERVER_NAME) */
} fw_listener;

/* An outcome (fw_rc.h): why fw_server_run returned. */
enum fw_run_end {
    FW_RUN_FAILED = -1,     /* the loop failed (said in the log) */
    FW_RUN_STOPPED = 0,     /* a stop was requested (fw_server_stop) */
    FW_RUN_SIGNAL = 1       /* on_signal asked to stop */
};

struct fw_server {
    fw_config cfg;
    fw_loop loop;
    const fw_app_ops *ops;
    void *app;

    fw_listener *listeners;    /* owned array */
    int nlisteners;
    int accepting;             /* the loop allows accepting (fw_balance decides if armed) */
    int64_t accept_resume_at;  /* after EMFILE & co: pause accepting until then */
    uint64_t accept_pauses;    /* how often that happened */
    fw_say accept_pause_said;  /* its message, at most every 10 s (fw_say.h) */
    fw_balance bal;            /* listener arming, scoreboard slot, hand-off */
    fw_pool *pool;             /* app threads, NULL in inline mode (threads == 1) */
    fw_thread *threads;        /* owned: the pool threads' contexts (cfg.threads), NULL inline */
    fw_thread loop_thread;     /* the loop's own context (inline app calls, error heads) */
    /* Inline first (cfg.inline_first, threads > 1; fw_lead.h). */
    int lead_on;               /* the standby runs: the loop may run requests itself */
    fw_lead lead;              /* who runs the loop */
    fw_thread *lead_thread;    /* the main thread's context when it runs a request as an app
                                * thread would (threads[], an index the pool does not use) */
    fw_pool_job *own_head, *own_tail;  /* requests the loop thread runs itself at the end of
                                        * the pass (counted busy: fw_pool_adopt) */
    int64_t own_off_until;     /* ms: a call was taken over, every request goes to the app
                                * threads until then (FW_OWN_OFF_MS) */
    int sig_pending;           /* the signal fd fired while the standby ran the loop: the main
                                * thread runs the handlers when it has the loop back */
    int lead_ended;            /* the standby's run ended (lead_end says how); the main
                                * thread ends it when back */
    enum fw_run_end lead_end;

    fw_watch stop_w;           /* eventfd: stop requests from any thread or signal handler */
    fw_watch sig_w;            /* optional: a signal wakeup fd (not owned), -1 if none */
    int sig_stop;              /* on_signal asked to stop */
    _Atomic int stop_requested;    /* 1 graceful, 2 immediate; any thread, signal handlers */
    _Atomic int stop_why;          /* fw_sb_why of the first stop asked (the slot says it) */
    _Atomic int stopping;          /* written by the loop, read by app threads */
    _Atomic int ending_keepalive;  /* stopping and not handing on: responses say close */
    int64_t stop_deadline;
    _Atomic int retiring;      /* max-requests reached: others serve on (read by app threads) */
    _Atomic int stop_retire;   /* the graceful stop asked retires this worker while others
                                * serve on (fw_server_retire); any thread, signal handlers */
    int handing_on;            /* stopping while others serve on: idle connections go to them */
    int pass_waiting;          /* an idle connection waits for a peer to take it */
    int64_t pass_wait_until;   /* until then, having no peer at all is worth waiting out */

    /* Timeout lists; see fw_timer.h. t_grace: silent new connections that
     * steer placement (fw_conn.aside, fw_balance_silent). */
    fw_tlist t_head, t_body, t_idle, t_write, t_linger, t_grace;
    /* The loop's: blocks that idle and closed connections gave back, for
     * the next requests (fw_spare.h): read and write buffers of their
     * first size, HTTP header arrays (limits.max_headers entries), and
     * requests' states (fw_exch); and write buffers grown for a body
     * (spare_out[i]: FW_BUF_FIRST_CAP << (i + 1) bytes, fw_conn_out_room). */
    fw_spare spare_buf, spare_hdrs, spare_exch;
    fw_spare spare_out[FW_SPARE_OUT_CLASSES];

    fw_conn *conns;            /* all open connections (doubly linked) */
    int nconns;
    fw_conn *graveyard;        /* closed during this loop pass, freed after it */
    /* Idle connections still holding their request state, oldest first:
     * given back once idle for FW_KEPT_MS, unless their next request took
     * it (fw_conn_give_kept). */
    fw_conn *kept_head, *kept_tail;
    int nkept;                 /* on it: FW_KEPT_MAX at most */
    /* With app threads: requests (and idle connections whose request came,
     * unread) waiting for a free thread, oldest first (fw_conn.ready_at). */
    fw_conn *ready_head, *ready_tail;
    int nready;
    int nready_unread;         /* of them, arrived on an idle connection and not read yet */
    int64_t reoffer_at;        /* ms, 0 if none: an offer (bal_offer) skipped a connection
                                * still held (FW_HANDOFF_HOLD_MS); offer again then */
    int nparked;               /* requests whose app thread waits for the loop (fw_conn.parked) */
    /* Inline: finished responses whose write waits for the end of the loop
     * pass (fw_conn.defer_next), oldest first; see fw_server_defer. */
    fw_conn *defer_head, *defer_tail;
    uint64_t defer_since_ns;   /* when the oldest of them was deferred */
    int64_t coalesce_off_until;    /* ms: an app call was slow, nothing waits until then */
    size_t write_queued;       /* inline: bytes write() queued in all connections, unsent */
    int take_next;             /* the listener take_waiting tries first */
    int64_t take_tried_at;     /* ms: take_waiting's last try with the listeners armed */
    fw_backlog backlog;        /* asks the kernel how many connections wait to be accepted */
    uint64_t evictions;        /* idle connections closed at --max-connections */
    fw_say eviction_said;      /* its message, at most every 10 s (fw_say.h) */
    int closing;               /* the loop is over: what a thread hands back closes */

    int64_t now;               /* monotonic ms, refreshed each pass */
    uint64_t clock_ns;         /* the loop thread's latest CLOCK_MONOTONIC reading: at each
                                * wake and, inline, as heads parse and after app calls
                                * (fw_clock_ns) */

    uint64_t requests;         /* responses completed */
    int exit_code;             /* 0, or -1 when the loop failed */
};

/* Create a server over the given listening fds. A constructor: returns the
 * server, or NULL with errno set. The fds must be non-blocking listening
 * sockets. */
fw_server *fw_server_new(const fw_config *cfg, const int *fds, int nfds,
                         const fw_app_ops *ops, void *app);
void fw_server_free(fw_server *srv);


/* Inline (--threads 1), the app layer keeps the GIL from one call to the
 * next of a loop pass: from one request to the next of a pipelined batch,
 * and from one connection to the next. Taking and dropping it costs about
 * 400 instructions: once a pass instead of once a request at saturation.
 * Dropped between two requests, it also lets a thread of the app's own
 * (a producer's) take it, and the next request waits until that thread
 * gives it back, up to the switch interval (5 ms). It is let go before
 * anything that may wait: before the loop sleeps (fw_server.c, run_pass),
 * before a body that may be spooled to a file, before a file is sent (the
 * disk).
 * Meanwhile it is held over non-blocking socket calls only (read, send,
 * accept, close, epoll_ctl), a few microseconds each; and a thread that
 * waits for it 5 ms gets it in the next app call, as from any thread.
 * With cfg.gil_each_write it goes before each write too, and at the end of
 * each connection's turn, as it did before the loop kept it a pass: the
 * access records' reader thread, which needs it for each response, then
 * gets it between two, and keeps up at saturation. */
static inline void fw_server_app_unlock(fw_server *srv)
{
    if (srv->ops->unlock)
        srv->ops->unlock(srv->app);
}


/* ---- the loop's clock ---- */

/* Read the clock for the loop thread: srv->clock_ns and srv->now. */
static inline void fw_server_tick(fw_server *srv)
{
    srv->clock_ns = fw_now_ns();
    srv->now = (int64_t)(srv->clock_ns / 1000000u);
}

/* A request timing taken on the thread that runs c's code. Inline, that is
 * the loop thread, whose clock is read at each wake, as each request's
 * head parses, after each app call (fw_conn.c, request.c) and after signal
 * handlers: its latest reading misses only the write work done since in
 * this pass, microseconds, and saves a clock read (tens of ns here, a few
 * per request). With app threads, a fresh one. */
static inline uint64_t fw_clock_ns(fw_server *srv)
{
    return srv->pool ? fw_now_ns() : srv->clock_ns;
}

/* ---- coalesced writes (fw_coalesce.c) ---- */

/* Inline: c's finished response (in c->x->out, state WRITE) is written at the
 * end of this loop pass, with the others of the pass, or before the next app
 * call once the oldest has waited cfg.write_coalesce_us. */
void fw_server_defer(fw_server *srv, fw_conn *c);
/* Write the deferred responses now (each connection is driven on). */
void fw_server_flush_deferred(fw_server *srv);
/* Before an inline app call (with responses deferred): flush them if the
 * oldest has waited cfg.write_coalesce_us. Question (1 yes, 0 no): were
 * they flushed? */
int fw_server_defer_due(fw_server *srv);
/* An inline app call took ns: after a slow one (FW_COALESCE_SLOW times
 * cfg.write_coalesce_us), responses are written at once for
 * FW_COALESCE_PAUSE_MS, since what waits behind a call waits all of it.
 * Twice the setting: a fast response finished before such a call waits
 * for it whole, so an app whose endpoints take a few ms stops coalescing
 * after the first (framework calls of 0.1-0.3 ms coalesce). A second: a
 * rare slow call (a GC pass, a cold cache) costs little of the saving. */
void fw_server_app_took(fw_server *srv, uint64_t ns);
#define FW_COALESCE_SLOW 2
#define FW_COALESCE_PAUSE_MS 1000
/* c closes: out of the deferred list. */
void fw_server_undefer(fw_server *srv, fw_conn *c);

/* Run until stopped. */
enum fw_run_end fw_server_run(fw_server *srv);
/* Start the app threads (--threads > 1) before fw_server_run, so that a
 * worker says it is ready only once it has them (a worker that cannot start
 * them failed to boot; it must not be respawned in a loop). A no-op when
 * they run already or there are none; fw_server_run starts them if not.
 * Call without the GIL (a thread's start may take it). Returns 0, or
 * -errno (logged). */
int fw_server_start_threads(fw_server *srv);

/* Watch fd (a signal wakeup pipe the caller owns; -1 for none): when it is
 * readable the loop drains it and calls on_signal, so signals that arrive
 * while the loop is busy are seen as promptly as those that interrupt
 * epoll_wait. Call before fw_server_run. Returns 0, or -errno (epoll_ctl's). */
int fw_server_watch_signals(fw_server *srv, int fd);

/* Ask the loop to stop. Safe from any thread and from a signal handler.
 * graceful: stop accepting, close idle connections, let in-flight responses
 * finish (within graceful_timeout_ms). */
void fw_server_stop(fw_server *srv, int graceful);
/* The same, saying why (enum fw_sb_why): the first reason given is the one
 * the worker's slot tells the master. fw_server_stop gives FW_SB_WHY_ASKED. */
void fw_server_stop_for(fw_server *srv, int graceful, int why);
/* A graceful stop that retires this worker while its peers serve on (a
 * SIGTERM sent to it alone, its master alive): its idle connections go to
 * them, as at --max-requests, unless the master stops them all
 * (fw_balance_hands_on). Safe from any thread and from a signal handler. */
void fw_server_retire(fw_server *srv);

void fw_server_log(fw_server *srv, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A question (1 yes, 0 no), from any thread: must a response head built
 * now close its connection, because the server stops for good? No while it
 * runs, and no when it retires handing its connections on (a reload):
 * asked before the loop has begun a stop that was just requested, it
 * answers as the stop will, so a response finished in that moment does
 * not close for nothing. */
int fw_server_ends_keepalive(fw_server *srv);

/* Internal to cserver/: connection bookkeeping used by fw_conn.c. */
/* Loop thread: a request (its connection's job) for an app thread: the
 * main thread runs it itself at the end of the pass while it may (inline
 * first, fw_lead.h), else a pool thread. */
void fw_server_run_job(fw_server *srv, fw_pool_job *job);
void fw_server_conn_closed(fw_server *srv);
void fw_server_request_done(fw_server *srv);

#endif
