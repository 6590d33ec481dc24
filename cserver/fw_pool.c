/* fw_pool: see fw_pool.h. */
#include "fw_pool.h"
#include "fw_timer.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define POOL_OF_DONE(wp) ((fw_pool *)((char *)(wp) - offsetof(fw_pool, done_w)))

/* What one thread needs: its pool and its index (pthread_create's one arg). */
typedef struct pool_thread {
    fw_pool *pool;
    int index;
} pool_thread;

/* mu held: make sure the loop looks at the done and parked lists. */
static void wake_loop_locked(fw_pool *p)
{
    if (p->done_signalled)
        return;
    p->done_signalled = 1;
    uint64_t one = 1;
    /* A full counter (never, in practice) still reads as "wake up". */
    if (write(p->done_w.fd, &one, sizeof(one)) < 0 && errno != EAGAIN) {
        p->ops->error(p->ctx, "pool: eventfd write", errno);
        /* done_signalled stays set: no more writes until the loop has
         * looked, which it does at its next pass (fw_pool_recover). */
        atomic_store(&p->wake_lost, 1);
    }
}

/* Under p->mu: `job` joins the done list, and the loop is woken for it,
 * unless `may_stay_quiet` and its kept-alive response is out with its
 * socket armed (ops->ahead): the loop takes the job back when that
 * socket, or anything else, wakes it. Waking it now would cost a context
 * switch per request for nothing. */
static void done_locked(fw_pool *p, fw_pool_job *job, int may_stay_quiet)
{
    job->next = NULL;
    if (p->done_tail) p->done_tail->next = job; else p->done_head = job;
    p->done_tail = job;
    if (!(may_stay_quiet && p->quiet_ok && p->ops->ahead && p->ops->ahead(p->ctx, job)))
        wake_loop_locked(p);
}

static void *pool_main(void *arg)
{
    pool_thread self = *(pool_thread *)arg;
    free(arg);
    fw_pool *p = self.pool;
    if (p->ops->thread_start)
        p->ops->thread_start(p->ctx, self.index);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->work_head && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        fw_pool_job *job = p->work_head;
        if (!job)
            break;                            /* quit, nothing left */
        p->work_head = job->next;
        if (!p->work_head)
            p->work_tail = NULL;
        job->next = NULL;
        pthread_mutex_unlock(&p->mu);

        p->ops->run(p->ctx, self.index, job);

        pthread_mutex_lock(&p->mu);
        done_locked(p, job, 1);
    }
    pthread_mutex_unlock(&p->mu);
    if (p->ops->thread_stop)
        p->ops->thread_stop(p->ctx, self.index);
    return NULL;
}

/* Loop thread: take back the jobs the threads are done with. */
static void take_back(fw_pool *p)
{
    pthread_mutex_lock(&p->mu);
    fw_pool_job *job = p->done_head, *parked = p->parked_head;
    p->done_head = p->done_tail = NULL;
    p->parked_head = p->parked_tail = NULL;
    p->done_signalled = 0;
    pthread_mutex_unlock(&p->mu);
    while (parked) {
        fw_pool_job *next = parked->next;
        parked->next = NULL;
        p->ops->parked(p->ctx, parked);
        parked = next;
    }
    while (job) {
        fw_pool_job *next = job->next;
        job->next = NULL;
        p->busy--;
        p->ops->done(p->ctx, job);
        job = next;
    }
}

/* Loop thread: the eventfd says threads are done with jobs. */
static void on_done(fw_loop *loop, fw_watch *w, uint32_t events)
{
    (void)loop;
    (void)events;
    fw_pool *p = POOL_OF_DONE(w);
    uint64_t v;
    if (read(w->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        p->ops->error(p->ctx, "pool: eventfd read", errno);
    take_back(p);
}

void fw_pool_collect(fw_pool *p)
{
    /* Nothing out, nothing to take back (busy is the loop's own count). */
    if (p->busy > 0)
        take_back(p);
}

void fw_pool_quiet(fw_pool *p, int ok)
{
    if (p->quiet_ok == ok)      /* only the loop writes it */
        return;
    pthread_mutex_lock(&p->mu);
    p->quiet_ok = ok;
    /* Jobs left unannounced while quiet was allowed are announced now:
     * the loop needs them back before it sleeps (a request it queued for
     * want of a thread may be waiting for one of theirs). */
    if (!ok && p->done_head)
        wake_loop_locked(p);
    pthread_mutex_unlock(&p->mu);
}

void fw_pool_recover(fw_pool *p)
{
    if (atomic_load_explicit(&p->wake_lost, memory_order_relaxed) && atomic_exchange(&p->wake_lost, 0))
        on_done(p->loop, &p->done_w, 0);
}

int fw_pool_max_threads(int nthreads)
{
    return nthreads + (nthreads > 4 ? nthreads : 4);
}

/* Start thread number p->started (the caller made sure it is below
 * max_threads). Returns 0, or -errno (-ENOMEM; pthread_create's). */
static int start_thread(fw_pool *p)
{
    pool_thread *arg = malloc(sizeof(*arg));
    if (!arg)
        return -ENOMEM;
    *arg = (pool_thread){ .pool = p, .index = p->started };
    int e = pthread_create(&p->tids[p->started], NULL, pool_main, arg);
    if (e != 0) {
        free(arg);
        return -e;
    }
    p->started++;
    return 0;
}

fw_pool *fw_pool_start(fw_loop *loop, int nthreads, int max_threads, const fw_pool_ops *ops, void *ctx)
{
    fw_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->loop = loop;
    p->ops = ops;
    p->ctx = ctx;
    p->nthreads = nthreads;
    p->max_threads = max_threads;
    p->done_w.fd = -1;
    p->tids = calloc((size_t)p->max_threads, sizeof(*p->tids));
    if (!p->tids)
        goto fail;
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto fail;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    if (pthread_cond_init(&p->resume_cv, NULL) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    p->done_w.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    p->done_w.cb = on_done;
    if (p->done_w.fd < 0 || fw_loop_watch(loop, &p->done_w, EPOLLIN) != 0)
        goto fail_sync;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < nthreads; i++) {
        int rc = start_thread(p);
        if (rc < 0) {
            pthread_mutex_unlock(&p->mu);
            ops->error(ctx, "pool: cannot start a thread", -rc);
            fw_pool_stop(p);        /* joins the ones that started */
            errno = -rc;
            return NULL;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return p;
fail_sync:
    pthread_cond_destroy(&p->resume_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
fail: {
        int e = errno;
        if (p->done_w.fd >= 0)
            close(p->done_w.fd);
        free(p->tids);
        free(p);
        errno = e;
        return NULL;
    }
}

void fw_pool_submit(fw_pool *p, fw_pool_job *job)
{
    p->busy++;
    fw_pool_submit_adopted(p, job);
}

void fw_pool_adopt(fw_pool *p)
{
    p->busy++;
}

void fw_pool_unadopt(fw_pool *p)
{
    p->busy--;
}

void fw_pool_hand_back(fw_pool *p, fw_pool_job *job)
{
    pthread_mutex_lock(&p->mu);
    done_locked(p, job, 0);     /* the loop's owner waits for it: always woken */
    pthread_mutex_unlock(&p->mu);
}

void fw_pool_submit_adopted(fw_pool *p, fw_pool_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->work_tail) p->work_tail->next = job; else p->work_head = job;
    p->work_tail = job;
    pthread_mutex_unlock(&p->mu);
    pthread_cond_signal(&p->cv);
}

void fw_pool_park(fw_pool *p, fw_pool_job *job)
{
    int rc = 0, say = 0;
    unsigned long more = 0;
    pthread_mutex_lock(&p->mu);
    job->parked = 1;
    job->next = NULL;
    if (p->parked_tail) p->parked_tail->next = job; else p->parked_head = job;
    p->parked_tail = job;
    p->parked++;
    /* This thread sleeps: a spare takes its place among the runnable ones
     * (none past max_threads: then not a failure). */
    if (p->started - p->parked < p->nthreads && p->started < p->max_threads && !p->quit)
        rc = start_thread(p);
    /* At the thread limit every park fails the same way: said at most
     * every 10 s, with the count of those in between. */
    if (rc < 0)
        say = fw_say_now(&p->spare_failed, fw_now_ms(), &more);
    wake_loop_locked(p);
    pthread_mutex_unlock(&p->mu);
    /* Said now, not once the client lets this thread go (that may be never).
     * pthread_create's EAGAIN is the thread limit: said too. */
    if (say) {
        char more_s[64] = "", what[128];
        if (more)
            snprintf(more_s, sizeof(more_s), " (%lu more since the last message)", more);
        snprintf(what, sizeof(what), "pool: cannot start a spare thread%s", more_s);
        p->ops->error(p->ctx, what, -rc);
    }
    pthread_mutex_lock(&p->mu);
    while (job->parked)
        pthread_cond_wait(&p->resume_cv, &p->mu);
    p->parked--;
    pthread_mutex_unlock(&p->mu);
}

void fw_pool_resume(fw_pool *p, fw_pool_job *job)
{
    pthread_mutex_lock(&p->mu);
    job->parked = 0;
    /* Few threads, rarely parked: waking them all to find the one is cheap. */
    pthread_cond_broadcast(&p->resume_cv);
    pthread_mutex_unlock(&p->mu);
}

fw_pool_job *fw_pool_cancel_queued(fw_pool *p)
{
    pthread_mutex_lock(&p->mu);
    fw_pool_job *list = p->work_head;
    p->work_head = p->work_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    for (fw_pool_job *j = list; j; j = j->next)
        p->busy--;
    return list;
}

int fw_pool_is_done_watch(const fw_pool *p, const fw_watch *w)
{
    return w == &p->done_w;
}

void fw_pool_stop(fw_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    int started = p->started;           /* none starts once quit is set */
    pthread_mutex_unlock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    for (int i = 0; i < started; i++)
        pthread_join(p->tids[i], NULL);
    if (fw_loop_watch(p->loop, &p->done_w, 0) != 0)
        p->ops->error(p->ctx, "pool: epoll_ctl", errno);
    close(p->done_w.fd);
    pthread_cond_destroy(&p->resume_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
}
