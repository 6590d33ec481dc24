/* fw_conn: one client connection and the request/response on it.
 *
 * fw_conn.c owns the connection: it alone reads and writes the socket,
 * waits, changes the state and decides to close. fw_body.c (request bodies)
 * and fw_resp.c (response framing) work on the buffers and return outcomes;
 * the app layer (the WSGI glue) asks for body bytes and hands response bytes
 * through the functions below, which never block a thread that runs the
 * event loop.
 *
 * States:
 *   READ_HEAD -> [READ_BODY] -> [QUEUED] -> APP -> [WRITE] -> READ_HEAD (kept alive)
 *                                                          -> LINGER / close
 *   READ_HEAD / READ_BODY -> [FLUSH] -> back (responses owed are written first)
 *
 * QUEUED: with app threads, a request that finds every thread busy waits
 * in the server's ready queue (fw_server.h), oldest first, unread when it
 * arrived on an idle connection (it may still be handed to another worker).
 *
 * Parked: with app threads, write() (the app's legacy imperative API) may
 * wait for a client that reads slowly (fw_conn_drain_wait). The connection
 * then goes back to the loop (WRITE, `parked` set) while the app's thread
 * sleeps; the loop writes under the write timeout and wakes the thread
 * when done or failed. A parked connection is never closed under its
 * thread: the thread is woken with the error; it closes once the app
 * returns. No thread ever waits for a request body: the loop reads every
 * body before the app runs.
 *
 * Pipelining: when a response is complete and the next request's bytes are
 * already in `in`, its write is deferred (fw_conn_may_batch): the request
 * ends, the next one is served, and the responses queue up in `out`. They
 * are written together, in order, when the connection would otherwise wait
 * for input (FLUSH), or when a response cannot join the batch (it closes
 * the connection, streams, sends a file, or the batch is full).
 *
 * Threads: only one thread touches a connection at a time: the loop thread,
 * or (with app threads) the pool thread it was submitted to, from
 * fw_pool_submit until the thread puts it back (fw_conn_app_done) or parks
 * it; `thr` says which thread's context is in use. The thread that owns it
 * may write without blocking (fw_conn_send, fw_conn_flush); only the loop
 * waits on the socket.
 *
 * Buffers, all in the request's state `x` (fw_exch) and owned there:
 * `in` (raw bytes from the socket; the parsed head points into it or into
 * head_copy), `out` (bytes queued for the socket: the current response,
 * after those of ended pipelined requests still unwritten), `body.mem` (a
 * pre-read body that is not a plain span of `in`), the header array. A
 * connection without a request (new and silent, or idle between
 * requests) has no `x`: only its record, 224 bytes. */
#ifndef FW_CONN_H
#define FW_CONN_H

#include <stdint.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "fw_buf.h"
#include "fw_http.h"
#include "fw_rc.h"
#include "fw_reqread.h"
#include "fw_server.h"
#include "fw_timer.h"

enum fw_conn_state {
    FW_C_READ_HEAD,
    FW_C_READ_BODY,     /* reading a body before the app runs */
    FW_C_QUEUED,        /* ready, waiting for a free app thread (srv->ready) */
    FW_C_APP,           /* the app layer owns the request */
    FW_C_WRITE,         /* waiting for the socket to drain `out` */
    FW_C_LINGER,        /* answered an error: discard input until EOF, then close */
    FW_C_FLUSH,         /* between requests, writing the batched responses of ended
                         * requests before waiting for input; then back to flush_then */
    FW_C_CLOSED
};


enum fw_body_src { FW_B_NONE, FW_B_MEM, FW_B_FILE };

/* The PROXY protocol header of a connection (--proxy-protocol). */
enum fw_conn_proxy {
    FW_PX_OFF = 0,      /* none expected */
    FW_PX_WAIT,         /* expected before the first request, not read yet */
    FW_PX_PLAIN_ONLY,   /* a peer not in --proxy-allow-from, in a mode that takes connections
                         * without one: it may send none (it is closed if it does) */
    FW_PX_READ,         /* read; it named no client (LOCAL, UNKNOWN): peer is the socket's */
    FW_PX_NAMED         /* read; peer is the client it named */
};

/* A request body (fw_body.c decodes; fw_conn.c reads the socket). */
typedef struct fw_body {
    int src;                 /* enum fw_body_src */
    const char *span;        /* decoded bytes ready for the reader (into in/mem/fbuf) */
    size_t span_len;
    fw_bodydec dec;          /* Content-Length or chunked: what is left to decode */
    int done;                /* every body byte has been decoded (pre-read complete) */
    int continue_wanted;     /* answer 100 Continue before waiting for the body */
    int continue_sent;
    int error;               /* reading the spool file failed (-errno, fw_body_peek): the
                              * connection closes */
    uint64_t total;          /* decoded size so far */
    int64_t started;         /* first wait for it (ms): the minimum rate counts from here */
    fw_buf mem;              /* owned: pre-read chunked/spilled body */
    int fd;                  /* owned: spool file, -1 if none */
    uint64_t file_size, file_pos;
    fw_buf fbuf;             /* owned: read window over the spool file */
    int inplace;             /* the body is a span of `in` right after the head */
} fw_body;

/* The response being framed (fw_resp.c). */
typedef struct fw_resp {
    int started;             /* status line and headers queued */
    int status;
    int no_body;             /* HEAD, 1xx, 204, 304 */
    int chunked;
    int fixed;               /* app gave Content-Length */
    uint64_t left;           /* fixed: bytes still owed */
    int close;               /* the response ends the connection: its head said so, or its
                              * body broke its framing (past or short of Content-Length) */
    int app_close;           /* app sent Connection: close */
    int app_date;            /* app sent Date: it goes out instead of ours */
    int app_server;          /* app sent Server: it goes out instead of ours */
    size_t head_start;       /* out length before the head, to roll back a bad head */
    int head_open;           /* a head is being queued (fw_resp_begin until end_head or
                              * abort_head): only then is there a head to roll back; what
                              * is in `out` before it (batched responses) always stays */
    int sf_fd;               /* sendfile source (not owned), -1 if none */
    uint64_t sf_off, sf_left;
    uint64_t sent;           /* body bytes framed for the wire (the access log's B) */
} fw_resp;

/* A connection's request in progress: its state, its buffers, its thread.
 * A connection takes one with a request's first bytes (conn_exch; or an
 * answer to send before any came) and gives it back, with the buffers and
 * header array, as soon as it is idle (nothing read, nothing owed): ten
 * thousand clients, silent or between requests, cost their connection
 * records alone. A connection without one reads as "nothing read, nothing
 * owed, no app" (fw_conn.c's in_used, out_used). Owner: the connection
 * (fw_conn.x); the blocks go round through the server's spare ones
 * (srv->spare_exch, fw_spare.h), so a kept-alive request takes and gives
 * back warm blocks, no malloc. */
typedef struct fw_exch {
    fw_request req;
    const char *head;        /* where req's strings live: into in, or head_copy; NULL
                              * until the head parsed */
    size_t head_len;
    char *head_copy;         /* owned when the head had to leave `in` */
    size_t head_scan;        /* fw_http_head_end progress */
    size_t consume_at_end;   /* bytes of `in` to drop when the request ends */
    fw_body body;
    fw_resp resp;
    uint64_t written_ns;     /* when the flush wrote its whole response (CLOCK_MONOTONIC
                              * ns; with the access log or stats), 0 otherwise: the
                              * request ends later, once the connections written before
                              * it were driven on (or, fw_conn_arm_ahead, once the loop
                              * takes it back from its thread), but it is timed to here */
    /* For the access log and the counters (srv->cfg.access_log, .stats). */
    uint64_t began_ns;       /* the head parsed (CLOCK_MONOTONIC ns), 0 if not
                              * yet or neither stats nor access log want it */
    uint64_t app_done_ns;    /* set by the app layer: when its last call for this
                              * request returned (CLOCK_MONOTONIC ns), or 0 */
    uint64_t app_waited_ns;  /* set by the app layer: time its current call spent
                              * waiting for the client (not app time) */
    int parse_stale;         /* inline: deferred responses were written (their
                              * connections driven on, app code run) between the
                              * parse and the first app call: began_ns is not that
                              * call's start (fw_status_enter) */
    fw_buf log_headers;      /* owned: response headers the format shows (fw_alog_capture) */

    fw_conn *conn;           /* whose it is (for the pool's job, below) */
    fw_buf in;               /* owned: bytes read from the socket */
    fw_buf out;              /* owned: bytes queued for the socket */
    /* Body bytes of the app's that leave after `out` without being copied
     * (fw_conn_send_borrowed): not owned; the app layer keeps them alive
     * until its next on_writable or on_drop. Nothing is queued in `out`
     * while they wait. */
    const char *ext;
    size_t ext_len;
    size_t write_charged;    /* inline: bytes of `out` write() queued, counted in the
                              * worker's srv->write_queued (fw_conn_charge_write) */
    size_t ext_tail_len;
    char ext_tail[2];        /* what follows them: a chunk's CRLF */
    fw_header *hdrs;         /* owned, limits.max_headers entries (conn_headers) */
    unsigned batched;        /* responses in `out` whose requests have ended (their
                              * write deferred: pipelining); 0 once `out` is written */
    int flush_then;          /* FW_C_FLUSH: the state to go back to */
    int keep_alive;          /* this response may keep the connection */
    int must_close;          /* the connection cannot carry another request (an
                              * error answered, a write failed); fw_conn.c's alone */

    void *app_state;         /* owned by the app layer while it holds the request */
    int app_active;          /* on_writable wanted once out drains */
    fw_thread *thr;          /* the thread serving it (loop_thread or a pool thread's) */
    fw_pool_job job;         /* srv->pool's lists while a pool thread owns it */
    enum fw_app_rc pool_rc;  /* what the app call returned, for the loop */
    int arm_err;             /* errno of fw_conn_arm_ahead's failed epoll_ctl, for the
                              * loop to log and close on, 0 if none */
    int parked;              /* its app thread waits for the loop to drain `out` */
    int dropping;            /* closed while the app held its request: an app thread
                              * runs the app's cleanup (on_drop), then it closes */
    int outq_mark;           /* bytes the kernel held to send when the loop last
                              * waited for the socket to drain (SIOCOUTQ), -1: unknown */
    int park_rc;             /* what the loop tells the parked thread: fw_conn_drain_wait's
                              * return */

    /* Inline: its finished response waits in `out` for the end of the loop
     * pass (srv->defer_head's list), state WRITE. */
    fw_conn *defer_next;
    int deferred;
    int no_defer;            /* written now: flushing the deferred ones */
} fw_exch;

/* A client's address: IPv4 or IPv6 (28 bytes, not a sockaddr_storage's
 * 128: a connection record is most of what an idle client costs). */
typedef union fw_peer_addr {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
} fw_peer_addr;

/* A connection's record: what it needs while it has no request (new and
 * silent, or idle between requests), kept small (224 bytes): with ten
 * thousand clients it is most of what they cost. Everything a request
 * needs, buffers included, is in `x`. */
struct fw_conn {
    fw_watch w;                       /* the socket; owned, closed on close */
    fw_server *srv;
    fw_listener *lst;
    fw_conn *prev, *next;             /* srv->conns */
    fw_tnode timer;
    fw_tnode aside;                   /* srv->t_grace while a new connection's first request has
                                       * not come (ends place.pending) */

    fw_peer_addr peer;                /* the client: the socket's peer, or the one a PROXY
                                       * protocol header named (proxy == FW_PX_NAMED); an
                                       * AF_UNIX one is its family alone, its path in peer_text */
    uint8_t state;                    /* enum fw_conn_state */
    uint8_t proxy;                    /* enum fw_conn_proxy */
    uint8_t fwd_allowed;              /* the socket's peer is in --forwarded-allow-ips: the app
                                       * layer may take the scheme from its headers */
    uint8_t kept_alive;               /* handed over idle after serving elsewhere: waits for its
                                       * next request under the idle timeout, not the header one */
    char *peer_text;                  /* owned: the client as text, "host\0port\0" (fw_conn_peer_text),
                                       * made when first asked; NULL before */

    fw_exch *x;                       /* owned: the request's state and buffers (fw_exch); NULL
                                       * while the connection has no request */
    int64_t head_started;             /* first byte of this request (ms) */
    int64_t handed_in_at;             /* srv->now when a peer handed it here, else 0: it is not
                                       * handed on again for FW_HANDOFF_HOLD_MS */
    fw_balance_place place;           /* its place in this worker's count (fw_balance) */
    unsigned requests;                /* served on this connection */
    uint8_t unread;                   /* QUEUED before anything of its request was read */
    uint8_t kept;                     /* on srv->kept: idle, its request state kept a while */
    uint16_t kept_ms;                 /* srv->now when it went there (ms, modulo 2^16) */
    fw_conn *kept_prev, *kept_next;   /* srv->kept_head/tail, while kept */

    /* The ready queue (srv->ready_head/tail), while QUEUED. */
    fw_conn *rq_prev, *rq_next;
    int64_t ready_at;                 /* when its request arrived (ms): the queue's order */
};

/* A socket accepted here, or handed over by another worker (kept_alive:
 * it had served requests there and is idle; client: what that worker knew
 * of the client, fw_balance.h). sa: the socket's peer. The connection owns
 * fd. With --proxy-protocol a new connection from a peer not in
 * --proxy-allow-from is closed at once (logged). age_ms: how long the
 * connection waited in the accept queue, when known (0 otherwise): a
 * request that must queue is placed by it. A constructor: returns the
 * connection (perhaps closed already: refused, or served and gone), or NULL
 * with errno set (ENOMEM). */
fw_conn *fw_conn_new(fw_server *srv, fw_listener *lst, int fd,
                     const struct sockaddr *sa, socklen_t salen, int kept_alive, fw_pass_client client,
                     int64_t age_ms);
/* Close c: out of the epoll set, then close(), whoever else may still hold
 * the socket. */
void fw_conn_close(fw_conn *c);
/* Close c whose socket now lives on in another process (handed over): the
 * same, with a failure to leave the epoll set logged as an error. */
void fw_conn_close_passed(fw_conn *c);
void fw_conn_free(fw_conn *c);
void fw_conn_on_timeout(fw_conn *c);
/* The server is stopping (or retiring, srv->handing_on): apply the stop
 * rule to c now. Called for every connection when the stop begins, and
 * again for one that becomes idle or arrives while stopping. */
void fw_conn_start_stop(fw_conn *c);
/* Retiring, after a hand-off had to wait (the peers' queues were full):
 * apply the stop rule again to c if it is one the rule passes on (idle,
 * nothing read; or an unread request waiting for a thread). */
void fw_conn_pass_on_again(fw_conn *c);
/* How long an idle connection keeps its request state (ms), and how many
 * connections keep theirs at most (see fw_conn.c). */
#define FW_KEPT_MS 2
#define FW_KEPT_MAX 64
/* Loop thread, at the end of each pass: the connections idle for
 * FW_KEPT_MS give back their request state (fw_server.kept_head). */
void fw_conn_give_kept(fw_server *srv);
/* Loop thread: a pool thread is done with c; rc is what the app call said. */
void fw_conn_app_done(fw_conn *c, enum fw_app_rc rc);
/* Loop thread: c's app thread parked it (c->parked says why). */
void fw_conn_parked(fw_conn *c);
/* Loop thread: a thread is free, c is the oldest request waiting for one
 * (taken off the ready queue by the server): serve it. */
void fw_conn_dispatch(fw_conn *c);
/* Question (1 yes, 0 no), inline: may c's finished response wait in `out`
 * for the end of the loop pass, to be written with the others of the pass
 * (fw_server_defer)? Yes while more events of the pass are to come, for a
 * small response on a connection that stays open. */
int fw_conn_may_defer(const fw_conn *c);
/* Write c's deferred response now (fw_server_flush_deferred), and drive on. */
void fw_conn_write_deferred(fw_conn *c);
/* May c's next request go to another worker (fw_balance_handoff,
 * fw_conn_give_away)? Not within FW_HANDOFF_HOLD_MS of its arrival from a
 * peer. */
int fw_conn_may_move(const fw_conn *c);
/* Loop thread: c waits in the ready queue unread: hand it to a peer with a
 * free thread. Returns 0 when handed over (c is closed here), FW_AGAIN when
 * none took it (or c may not go: read, or the server stops). */
int fw_conn_give_away(fw_conn *c);
/* Loop thread: idle kept-alive c may be closed to make room for a new
 * connection (--max-connections). Returns 0 when it was closed, FW_AGAIN
 * when it is not idle now (its request began or waits in the socket). */
int fw_conn_evict_idle(fw_conn *c);
/* Pool thread, after the app call: write what can leave at once. */
void fw_conn_app_returning(fw_conn *c, enum fw_app_rc rc);
/* Pool thread, the pool's lock held, as c goes back to the loop: when its
 * response is all out and the connection next waits for a request, arm
 * the socket for it now (what the loop would do first when it takes c
 * back; it then finds the watch armed and does nothing). Returns 1 if
 * armed: the loop need not be woken for c. */
int fw_conn_arm_ahead(fw_conn *c);

/* The client's address as text (REMOTE_ADDR, log lines), formatted once
 * per connection: the socket's peer or, once a PROXY protocol header named
 * one, that client. IPv4, IPv6 (v4-mapped shown as IPv4), or for unix
 * sockets the peer's path ("" if it bound none) and an empty port. The
 * strings live in the connection. */
void fw_conn_peer_text(fw_conn *c, const char **host, const char **port);

/* ---- for the app layer: request body (wsgi.input) ---------------------- */

/* Decoded body bytes, all read before the app ran: p and n span them (n==0
 * at the end). Returns 0, or -errno when the spool file cannot be read
 * (pread's errno; -EIO when it ends early; -ENOMEM), then and on every
 * later call. May read the spool file: call without an interpreter lock
 * unless fw_body_ready. */
int fw_body_peek(fw_conn *c, const char **p, size_t *n);
void fw_body_consume(fw_conn *c, size_t n);
/* Question (1 yes, 0 no): is the next peek a span in memory (no I/O)? */
int fw_body_ready(const fw_conn *c);

/* ---- for the app layer: response ---------------------------------------- */

/* Queue the status line and headers. status_line is "200 OK" (validated by
 * the caller); headers come in pairs. The caller has checked that the name
 * is a token and the value has no CTL (the WSGI layer does, in
 * start_response). fw_resp_begin returns 0 or -ENOMEM.
 * fw_resp_header_checked returns 0 (queued, or dropped: a hop-by-hop
 * header, a second Date or Server, a Content-Length on a 1xx or 204),
 * -EINVAL for a second or bad Content-Length, or -ENOMEM: nothing is
 * queued then. */
int fw_resp_begin(fw_conn *c, const char *status_line, size_t status_len);
int fw_resp_header_checked(fw_conn *c, const char *name, size_t nlen, const char *value, size_t vlen);
/* known_len >= 0: the whole body size is known (used when the app gave no
 * Content-Length), -1 otherwise. Returns 0, or -ENOMEM (then
 * fw_resp_abort_head). */
int fw_resp_end_head(fw_conn *c, int64_t known_len);
void fw_resp_abort_head(fw_conn *c);

/* Frame and queue body bytes without writing (for bodies known to be
 * ready). Returns 0, or -ENOMEM. */
int fw_resp_queue(fw_conn *c, const char *data, size_t len);
/* Question (1 yes, 0 no): do len body bytes end the response (they reach
 * the app's Content-Length)? */
int fw_resp_completes(const fw_conn *c, size_t len);
/* Send from a file with sendfile() after what is queued. */
void fw_resp_sendfile(fw_conn *c, int fd, uint64_t off, uint64_t count);
/* The app has no more body: queue the chunked terminator, check lengths. */
void fw_resp_finish(fw_conn *c);

/* Frame and send body bytes: `out` and data leave together (writev)
 * without copying data when the socket takes it; what it does not take is
 * copied into `out`. Never blocks. Returns 0 (all on the wire), FW_AGAIN
 * (some queued: wait for the socket to drain) or -errno (the client is
 * gone: sendmsg's errno, -EPIPE, -ECONNRESET ...; or -ENOMEM); then the
 * connection must close (must_close is set). */
int fw_conn_send(fw_conn *c, const char *data, size_t len);
/* The same, but what the socket does not take of data stays where it is,
 * borrowed (fw_conn.ext): the caller keeps data alive and returns
 * FW_APP_WAIT, so the loop writes it and calls on_writable after. For
 * large bodies the app holds anyway: a slow reader costs no copy. */
int fw_conn_send_borrowed(fw_conn *c, const char *data, size_t len);
/* Inline (the loop thread): what write() left queued counts towards the
 * worker's total of such bytes (srv->write_queued), until it is sent or the
 * connection closes. Returns that total. */
size_t fw_conn_charge_write(fw_conn *c);
/* Write what is queued without blocking. Returns 0 (all written), FW_AGAIN
 * (wait for the socket to drain) or -errno (the client is gone: sendmsg's
 * or sendfile's errno; -ENODATA when the file to send shrank), as
 * fw_conn_send. */
int fw_conn_flush(fw_conn *c);
/* Make room in c's write buffer for `extra` more bytes, from the server's
 * spare blocks of the next size that holds them when that size is a
 * spare class (fw_server.spare_out) and the caller is the loop thread;
 * else the buffer grows as any (realloc). 0, or -ENOMEM. */
int fw_conn_out_room(fw_conn *c, size_t extra);
/* App thread (never inline): wait while the loop writes what is queued,
 * under the write timeout. Returns 0 (all written), -ETIMEDOUT (the client
 * read nothing for the write timeout) or -errno (the client is gone, as
 * fw_conn_flush; -ECONNABORTED when the loop closed the connection while
 * this thread waited). Call without an interpreter lock. */
int fw_conn_drain_wait(fw_conn *c);

/* A pipelined batch: at most this many responses, and no response joins it
 * once `out` holds this many bytes (fairness towards the loop's other
 * connections, latency of the first response, memory). */
#define FW_BATCH_MAX_RESPONSES 64
#define FW_BATCH_MAX_BYTES (64 * 1024)
/* A connection a peer handed over stays at least this long before a
 * request of it may be handed on again (fw_balance_handoff). Loads that
 * flicker around a worker's thread count (every worker near saturation)
 * made connections travel to and fro on most requests, each trip a
 * sendmsg, a recvmsg and a wake-up on both sides; a worker that stays
 * saturated still passes a connection on after the hold. */
#define FW_HANDOFF_HOLD_MS 100
/* A finished response larger than this is written at once, not deferred to
 * the end of the loop pass (fw_server_defer). */
#define FW_DEFER_MAX_BYTES (64 * 1024)

/* Question (1 yes, 0 no): may the write of c's complete response wait, to
 * leave with the responses of the pipelined requests after it? Yes when
 * the connection stays open after it, bytes of a next request are already
 * read, nothing of it is to come from a file, and the batch has room. Asked
 * by the thread that owns c, when the app is done with the response. */
int fw_conn_may_batch(const fw_conn *c);

/* Queue a complete server-generated error response; the connection closes
 * after it. */
void fw_conn_queue_error(fw_conn *c, int status);

#endif
