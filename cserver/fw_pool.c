/* fw_pool: see fw_pool.h. */
#include "fw_pool.h"
#include "fw_conn.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define POOL_OF_DONE(wp) ((fw_pool *)((char *)(wp) - offsetof(fw_pool, done_w)))

/* One request (or one resumed response) on a pool thread. */
static void pool_run(fw_pool *p, fw_thread *t, fw_conn *c)
{
    fw_server *srv = p->srv;
    c->thr = t;
    int rc = c->app_active ? srv->ops->on_writable(srv->app, c)
                           : srv->ops->on_request(srv->app, c);
    /* The thread is free from here on: say so before the response is
     * written, or the client's next connection can see a stale count. */
    fw_balance_end(srv, c);
    if (rc != FW_APP_CLOSE && c->state == FW_C_APP)
        (void)fw_conn_flush(c);   /* what it could not send, the loop sends */
    c->pool_rc = rc;
}

static void *pool_main(void *arg)
{
    fw_thread *t = arg;
    fw_pool *p = t->pool;
    fw_server *srv = p->srv;
    if (srv->ops->thread_start)
        srv->ops->thread_start(srv->app, t);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->work_head && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        fw_conn *c = p->work_head;
        if (!c)
            break;                            /* quit, nothing left */
        p->work_head = c->qnext;
        if (!p->work_head)
            p->work_tail = NULL;
        c->qnext = NULL;
        pthread_mutex_unlock(&p->mu);

        pool_run(p, t, c);

        pthread_mutex_lock(&p->mu);
        if (p->done_tail) p->done_tail->qnext = c; else p->done_head = c;
        p->done_tail = c;
        if (!p->done_signalled) {
            p->done_signalled = 1;
            uint64_t one = 1;
            /* A full counter (never, in practice) still reads as "wake up". */
            if (write(p->done_w.fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
                fw_server_log(srv, FW_LOG_ERROR, "pool: eventfd write: %s", strerror(errno));
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (srv->ops->thread_stop)
        srv->ops->thread_stop(srv->app, t);
    return NULL;
}

/* Loop thread: connections the threads are done with. */
static void on_done(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_pool *p = POOL_OF_DONE(w);
    uint64_t v;
    if (read(w->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        fw_server_log(p->srv, FW_LOG_ERROR, "pool: eventfd read: %s", strerror(errno));
    pthread_mutex_lock(&p->mu);
    fw_conn *c = p->done_head;
    p->done_head = p->done_tail = NULL;
    p->done_signalled = 0;
    pthread_mutex_unlock(&p->mu);
    while (c) {
        fw_conn *next = c->qnext;
        c->qnext = NULL;
        p->busy--;
        fw_conn_app_done(c, c->pool_rc);
        c = next;
    }
}

fw_pool *fw_pool_start(fw_server *srv, int nthreads)
{
    fw_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->srv = srv;
    p->nthreads = nthreads;
    p->done_w.fd = -1;
    p->threads = calloc((size_t)nthreads, sizeof(*p->threads));
    p->tids = calloc((size_t)nthreads, sizeof(*p->tids));
    if (!p->threads || !p->tids)
        goto fail;
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto fail;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    p->done_w.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->done_w.cb = on_done;
    if (p->done_w.fd < 0 || fw_loop_watch(&srv->loop, &p->done_w, EPOLLIN) != 0)
        goto fail_sync;
    for (int i = 0; i < nthreads; i++) {
        p->threads[i].index = i;
        p->threads[i].pool = p;
        int e = pthread_create(&p->tids[i], NULL, pool_main, &p->threads[i]);
        if (e != 0) {
            errno = e;
            fw_server_log(srv, FW_LOG_ERROR, "pool: cannot start thread %d: %s", i, strerror(e));
            fw_pool_stop(p);        /* joins the ones that started */
            errno = e;
            return NULL;
        }
        p->started++;
    }
    return p;
fail_sync:
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
fail: {
        int e = errno;
        if (p->done_w.fd >= 0)
            close(p->done_w.fd);
        free(p->threads);
        free(p->tids);
        free(p);
        errno = e;
        return NULL;
    }
}

void fw_pool_submit(fw_pool *p, fw_conn *c)
{
    p->busy++;
    c->qnext = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->work_tail) p->work_tail->qnext = c; else p->work_head = c;
    p->work_tail = c;
    pthread_mutex_unlock(&p->mu);
    pthread_cond_signal(&p->cv);
}

fw_conn *fw_pool_cancel_queued(fw_pool *p)
{
    pthread_mutex_lock(&p->mu);
    fw_conn *list = p->work_head;
    p->work_head = p->work_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    for (fw_conn *c = list; c; c = c->qnext)
        p->busy--;
    return list;
}

void fw_pool_stop(fw_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_mutex_unlock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    for (int i = 0; i < p->started; i++)
        pthread_join(p->tids[i], NULL);
    if (fw_loop_watch(&p->srv->loop, &p->done_w, 0) != 0)
        fw_server_log(p->srv, FW_LOG_DEBUG, "pool: epoll_ctl: %s", strerror(errno));
    close(p->done_w.fd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->tids);
    free(p);
}
