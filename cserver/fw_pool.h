/* fw_pool: the app threads of one server (--threads > 1).
 *
 * The loop thread reads and parses requests; when one is ready it submits
 * the connection here and forgets it: from then on exactly one pool thread
 * owns it (calls the app, reads a streaming body, writes the response) until
 * the thread puts it on the done list and wakes the loop through an eventfd.
 * The connection's epoll watch is oneshot and already fired, so the loop
 * gets no event for it meanwhile; its timers are stopped.
 *
 * The work queue is intrusive (fw_conn.qnext): submitting never allocates,
 * and it can never hold more than the server's connections. Which requests
 * reach the queue at all is fw_balance's job (the listener is disarmed while
 * every thread is busy). */
#ifndef FW_POOL_H
#define FW_POOL_H

#include <pthread.h>

#include "fw_loop.h"
#include "fw_server.h"

struct fw_pool {
    fw_server *srv;
    int nthreads;
    fw_thread *threads;            /* owned, nthreads */
    pthread_t *tids;               /* owned, nthreads */
    int started;                   /* threads running */

    pthread_mutex_t mu;            /* guards the two lists, quit and done_signalled */
    pthread_cond_t cv;             /* work arrived, or quit */
    fw_conn *work_head, *work_tail;
    fw_conn *done_head, *done_tail;
    int quit;
    int done_signalled;            /* an eventfd write is pending for the loop */

    int busy;                      /* loop thread only: connections the pool owns */
    fw_watch done_w;               /* eventfd, owned */
};

/* Create the pool and start its threads; the done eventfd is watched in the
 * server's loop. Returns NULL (errno set) on failure, with nothing started. */
fw_pool *fw_pool_start(fw_server *srv, int nthreads);

/* Loop thread: hand c to a thread. */
void fw_pool_submit(fw_pool *p, fw_conn *c);

/* Loop thread: take back the connections no thread has started yet (for a
 * fast stop); returns them as a list linked by qnext. */
fw_conn *fw_pool_cancel_queued(fw_pool *p);

/* Loop thread: let the threads finish, join them, free the pool. Only when
 * busy == 0. */
void fw_pool_stop(fw_pool *p);

#endif
