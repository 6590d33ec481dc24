/* fw_pool: a fixed set of threads that run jobs handed over by the loop
 * thread (the app threads of a server, --threads > 1).
 *
 * The loop thread submits a job and forgets it: from then on exactly one
 * pool thread owns it (ops->run) until the thread puts it on the done list
 * and wakes the loop through an eventfd watched in the loop; the loop then
 * gets it back (ops->done). A job whose next step is to wait for its socket
 * anyway (ops->ahead arms it) may go back unannounced while the loop allows
 * it (fw_pool_quiet): the loop takes it back at the top of its next pass
 * (fw_pool_collect), before the events that woke it, which spares a
 * wake-up of the loop per request. The pool knows nothing of what a job is: the
 * caller embeds an fw_pool_job in its own object (a connection) and finds
 * the object again from the job, the way libuv hands an fd to a callback.
 *
 * A thread may also park its job: hand it back to the loop (ops->parked)
 * while the thread sleeps, until the loop resumes it (fw_pool_resume); the
 * thread then carries on with the job where it stopped. The loop uses this
 * to do a job's waiting on sockets for the thread. A parked thread holds no
 * capacity: when it parks, a spare thread starts if the runnable ones fall
 * below nthreads, up to max_threads in all (fw_pool_max_threads).
 *
 * The queues are intrusive (fw_pool_job.next): submitting never allocates,
 * and they can never hold more jobs than the caller has objects. */
#ifndef FW_POOL_H
#define FW_POOL_H

#include <pthread.h>
#include <stdatomic.h>

#include "fw_loop.h"
#include "fw_rc.h"
#include "fw_say.h"

typedef struct fw_pool_job {
    struct fw_pool_job *next;      /* the pool's: work, done or parked list */
    int parked;                    /* under the pool's mu: its thread sleeps until resumed */
} fw_pool_job;

typedef struct fw_pool_ops {
    /* On a pool thread, before its first job / after its last (may be NULL). */
    void (*thread_start)(void *ctx, int index);
    void (*thread_stop)(void *ctx, int index);
    /* On pool thread `index`: run the job. */
    void (*run)(void *ctx, int index, fw_pool_job *job);
    /* On the loop thread: the job has run and is the caller's again. */
    void (*done)(void *ctx, fw_pool_job *job);
    /* On pool thread `index`, the pool's lock held, as a job that has run
     * goes back (may be NULL): 1 if the loop may take it back at its next
     * pass instead of being woken for it (the caller made sure the next
     * event that matters wakes the loop anyway: it armed the job's socket),
     * else 0. Runs under the lock so that the loop, woken by that socket,
     * finds the job back (fw_pool_collect) before it sees the event. At most
     * a cheap syscall. */
    int (*ahead)(void *ctx, fw_pool_job *job);
    /* On the loop thread: the job's thread parked it (fw_pool_park); the
     * caller's until it calls fw_pool_resume. */
    void (*parked)(void *ctx, fw_pool_job *job);
    /* A syscall of the pool failed (what: its name; err: errno). */
    void (*error)(void *ctx, const char *what, int err);
} fw_pool_ops;

typedef struct fw_pool {
    fw_loop *loop;                 /* not owned: the loop that gets jobs back */
    const fw_pool_ops *ops;        /* not owned */
    void *ctx;                     /* not owned: passed to every op */
    int nthreads;                  /* threads that run jobs: the capacity */
    int max_threads;               /* threads at most, spares for parked ones included */
    pthread_t *tids;               /* owned, max_threads */
    int started;                   /* threads running (under mu once the pool runs) */
    int parked;                    /* under mu: threads parked */

    pthread_mutex_t mu;            /* guards the lists, quit, done_signalled, jobs' parked */
    pthread_cond_t cv;             /* work arrived, or quit */
    pthread_cond_t resume_cv;      /* a parked job was resumed */
    fw_pool_job *work_head, *work_tail;
    fw_pool_job *done_head, *done_tail;
    fw_pool_job *parked_head, *parked_tail;
    int quit;
    int done_signalled;            /* an eventfd write is pending for the loop */
    int quiet_ok;                  /* the loop may go unwoken for jobs ops->ahead accepts
                                    * (fw_pool_quiet) */
    atomic_int wake_lost;          /* that write failed: the loop looks anyway (fw_pool_recover) */
    fw_say spare_failed;           /* under mu: "cannot start a spare thread", said at most
                                    * every 10 s (fw_say.h) */

    int busy;                      /* loop thread only: jobs the pool holds */
    fw_watch done_w;               /* eventfd, owned */
} fw_pool;

/* A value: the threads a pool of nthreads may run at most: nthreads, and
 * as many again (4 at least) to stand in for parked ones. A thread's index
 * (ops) is below this. */
int fw_pool_max_threads(int nthreads);

/* Create the pool and start its threads (max_threads at most, spares
 * included: fw_pool_max_threads, or fewer when the caller keeps an index
 * for itself); the done eventfd is watched in `loop`. A constructor: the
 * pool, or NULL with errno set, nothing started. */
fw_pool *fw_pool_start(fw_loop *loop, int nthreads, int max_threads, const fw_pool_ops *ops, void *ctx);

/* Loop thread: hand the job to a thread. */
void fw_pool_submit(fw_pool *p, fw_pool_job *job);

/* The loop thread may run a job itself, as a pool thread would (fw_lead.h).
 * Loop thread: count a job it keeps to run (busy, as if submitted)... */
void fw_pool_adopt(fw_pool *p);
/* ...and, once it ran it and took it back, uncount it. */
void fw_pool_unadopt(fw_pool *p);
/* Loop thread: hand an adopted job to a thread after all. */
void fw_pool_submit_adopted(fw_pool *p, fw_pool_job *job);
/* The thread that ran an adopted job but no longer runs the loop: put the
 * job on the done list, as a pool thread does, and wake the loop. */
void fw_pool_hand_back(fw_pool *p, fw_pool_job *job);

/* Pool thread, inside ops->run: hand the job to the loop (ops->parked) and
 * sleep until the loop calls fw_pool_resume on it. The job still counts
 * as busy (the caller counts parked jobs apart: they hold no capacity). */
void fw_pool_park(fw_pool *p, fw_pool_job *job);
/* Loop thread: wake the thread of a parked job; the job is that thread's
 * again from the moment this is called. */
void fw_pool_resume(fw_pool *p, fw_pool_job *job);

/* Loop thread: take back the jobs no thread has started yet (for a fast
 * stop); returns them as a list linked by next. */
fw_pool_job *fw_pool_cancel_queued(fw_pool *p);

/* Loop thread, a question (1 yes, 0 no): is w the done eventfd's watch? (The
 * loop dispatches it by itself; this is for a caller that waits on the
 * loop and dispatches only this watch.) */
int fw_pool_is_done_watch(const fw_pool *p, const fw_watch *w);

/* Loop thread, before it sleeps: may threads leave jobs that ops->ahead
 * accepts on the done list without waking it (1), or must every job wake
 * it (0: it needs each thread back at once, e.g. requests wait for one)?
 * Such jobs wait for fw_pool_collect; turning quiet off with some waiting
 * wakes the loop for them. */
void fw_pool_quiet(fw_pool *p, int ok);
/* Loop thread, at the top of every pass (before its events are
 * dispatched) and before the pool stops: take back the jobs the threads
 * are done with (ops->parked, ops->done), as the eventfd wake-up does. */
void fw_pool_collect(fw_pool *p);

/* Loop thread, at every pass (at least once a second): take back the
 * jobs whose eventfd wake-up was lost to a failed write, which would
 * otherwise wait for ever (their threads stay counted as busy). */
void fw_pool_recover(fw_pool *p);

/* Loop thread: let the threads finish, join them, free the pool. Only when
 * busy == 0. */
void fw_pool_stop(fw_pool *p);

#endif
