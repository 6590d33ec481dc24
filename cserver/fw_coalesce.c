/* fw_coalesce: inline (--threads 1), the responses finished in one loop
 * pass leave together at its end (--write-coalesce).
 *
 * A response sent the moment it is ready wakes its client (an idle reader
 * on another CPU: an interrupt to that CPU, paid in the sender's system
 * call) once per response: measured on a small Flask app, about a tenth
 * of the worker's CPU. Written together, the client side wakes about once per
 * pass. A response waits at most cfg.write_coalesce_us and the app call
 * running then (the wait is checked before each app call), only while more
 * events of the pass are to come (fw_conn_may_defer), and not at all for a
 * while after a slow app call, since what waits behind a call waits all of
 * it. The list (srv->defer_head) holds connections in state WRITE whose
 * `out` holds the response; fw_server.c flushes it after each pass. */
#include "fw_conn.h"
#include "fw_server.h"
#include "fw_timer.h"

void fw_server_defer(fw_server *srv, fw_conn *c)
{
    c->x->deferred = 1;
    c->x->defer_next = NULL;
    if (srv->defer_tail) {
        srv->defer_tail->x->defer_next = c;
    } else {
        srv->defer_head = c;
        srv->defer_since_ns = srv->clock_ns;
    }
    srv->defer_tail = c;
}

void fw_server_undefer(fw_server *srv, fw_conn *c)
{
    fw_conn **p = &srv->defer_head, *prev = NULL;
    while (*p && *p != c) {
        prev = *p;
        p = &(*p)->x->defer_next;
    }
    if (*p)
        *p = c->x->defer_next;
    if (srv->defer_tail == c)
        srv->defer_tail = prev;
    c->x->deferred = 0;
}

/* Two rounds: the writes first, back to back (the point of the wait), then
 * each connection driven on (its app's iterable asked for the rest, its
 * next request taken up), which runs app code. A connection closed in the
 * second round stays readable until the pass ends (the graveyard). */
void fw_server_flush_deferred(fw_server *srv)
{
    fw_conn *list = srv->defer_head;
    if (!list)
        return;
    srv->defer_head = srv->defer_tail = NULL;
    /* (Inline, the GIL may be held over these non-blocking sends: see
     * fw_server_app_unlock.) */
    if (srv->cfg.gil_each_write)
        fw_server_app_unlock(srv);
    int timed = srv->cfg.access_log || srv->cfg.stats;
    for (fw_conn *c = list; c; c = c->x->defer_next) {
        c->x->deferred = 0;
        /* A failure is met again, and acted on, below. A response written
         * whole is timed now, not when its request ends below, after app
         * code of the connections before it (record_response): at the
         * loop's last clock reading, after the pass's last app call. */
        if (fw_conn_flush(c) == 0 && timed && !c->x->app_active)
            c->x->written_ns = srv->clock_ns;
    }
    for (fw_conn *c = list, *next; c; c = next) {
        next = c->x->defer_next;
        fw_conn_write_deferred(c);
    }
}

void fw_server_app_took(fw_server *srv, uint64_t ns)
{
    if (ns > (uint64_t)srv->cfg.write_coalesce_us * 1000u * FW_COALESCE_SLOW)
        srv->coalesce_off_until = (int64_t)(srv->clock_ns / 1000000u) + FW_COALESCE_PAUSE_MS;
}

int fw_server_defer_due(fw_server *srv)
{
    if (srv->clock_ns - srv->defer_since_ns < (uint64_t)srv->cfg.write_coalesce_us * 1000u)
        return 0;
    fw_server_flush_deferred(srv);
    return 1;
}
