/* fw_internal: functions shared between the cserver/ files that are not
 * part of the interface the app layer uses. */
#ifndef FW_INTERNAL_H
#define FW_INTERNAL_H

#include "fw_conn.h"
#include "fw_rc.h"

/* ---- fw_conn.c --------------------------------------------------------- */

/* Parse c->x->head[0..head_len) into c->x->req again, as the listener's protocol
 * says (HTTP, or a uwsgi packet): the head moved (fw_body.c), and req's
 * spans with it. A protocol step (fw_rc.h): 0, or an HTTP status (not
 * expected: it parsed before). */
int fw_conn_parse_head(fw_conn *c);

/* ---- fw_body.c: the body of a parsed request --------------------------- */

/* An outcome (fw_rc.h): how the body of the request just parsed is to be
 * read (fw_body_setup). */
enum fw_body_plan {
    FW_BODY_NONE = 0,       /* no body: the request is ready */
    FW_BODY_READ = 1        /* pre-read it (fw_body_preread) before the app runs */
};

/* Set up the body of c's parsed head. Returns 0 with *plan set, or -errno
 * (-ENOMEM; -EPROTO when the head, moved out of `in`, no longer parses). */
int fw_body_setup(fw_conn *c, enum fw_body_plan *plan);
/* Decode what `in` holds. A protocol step (fw_rc.h): returns 0 when the
 * whole body is in (memory or spool file), FW_HTTP_INCOMPLETE for more
 * input, or the HTTP status to answer (400, 413, 431 from the decoder; 500
 * when memory or the spool file fails). */
int fw_body_preread(fw_conn *c);
/* A value: bytes worth reading from the socket for this body now. */
size_t fw_body_read_size(const fw_conn *c);
/* A value: body bytes received so far, decoded or not (the minimum rate's
 * measure). */
uint64_t fw_body_received(const fw_conn *c);
/* Question (1 yes, 0 no): has any byte of the body arrived (then 100
 * Continue is too late)? */
int fw_body_arrived(const fw_conn *c);
void fw_body_release(fw_conn *c);

/* ---- fw_resp.c: response framing ----------------------------------------- */

/* Queue a complete server-generated error response (after what is queued). */
void fw_resp_error_head(fw_conn *c, int status);
/* Frame len body bytes about to be sent: queues what goes before them (a
 * chunk's size line), points *tail at what goes after them (a chunk's CRLF;
 * tail_len 0 otherwise) and returns how many of the len bytes go on the
 * wire (0 for bodiless responses; clamped to Content-Length). */
size_t fw_resp_frame(fw_conn *c, size_t len, const char **tail, size_t *tail_len);

/* ---- fw_peer.c: who the client is ------------------------------------------ */

/* c's client is sa (len bytes): an IP address, or an AF_UNIX socket's
 * path (kept as text). Any text made of the one before is dropped. */
void fw_peer_set(fw_conn *c, const struct sockaddr *sa, socklen_t len);
/* A new connection (client: what a handing worker knew, fw_balance.h):
 * decide whether a PROXY protocol header is to come (or, with
 * FW_PROXY_PLAIN, may). Returns 0, or -1 when the peer may not send one and
 * must (said in the log): close c. */
int fw_peer_start(fw_conn *c, fw_pass_client client);
/* The PROXY protocol header at the start of `in`: 1 when read (consumed;
 * the peer is now the client it named) or, with FW_PROXY_PLAIN, when the
 * connection starts without one (nothing consumed); 0 when incomplete, -1
 * when malformed or from a peer that may not send one (said in the log):
 * close c. */
int fw_peer_read_proxy(fw_conn *c);
/* A uwsgi request (c->x->req) names its client in REMOTE_ADDR and
 * REMOTE_PORT: when they are an IP address and a port, they become the
 * client of log lines and the access log, as a PROXY header's does. */
void fw_peer_from_uwsgi(fw_conn *c);
/* For a hand-off: what the worker taking c must know of its client. */
fw_pass_client fw_peer_passed(const fw_conn *c);
/* A log line about c: "host:port: " and the message, then, with
 * show_input, the escaped start of what the client sent. */
void fw_peer_log(fw_conn *c, int level, int show_input, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- fw_server.c: the connection's place in the server ------------------- */

/* The ready queue: c (a request, or an idle connection whose request
 * arrived unread) waits for a free app thread, ordered by c->ready_at. */
void fw_server_enqueue(fw_server *srv, fw_conn *c);
void fw_server_dequeue(fw_server *srv, fw_conn *c);
/* Question: may a request be handed to an app thread now (a thread is free
 * and no older request waits)? */
int fw_server_thread_free(const fw_server *srv);

#endif
