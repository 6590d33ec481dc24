/* test_pool.c: the app-thread pool (cserver/fw_pool.c) between a real loop
 * and real threads: a job comes back through the eventfd, or, when the
 * loop allows it and ops->ahead accepts the job, unannounced until the loop
 * collects it; turning quiet off announces the jobs left unannounced. */
#define _GNU_SOURCE
#define CHECK_NAME "test_pool"
#include "check.h"
#include "fw_pool.h"

#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

/* What the ops saw; one job at a time is out. */
typedef struct seen {
    atomic_int ran;          /* ops->run calls */
    atomic_int offered;      /* ops->ahead calls (the job is on the done list once set) */
    int ahead_says;          /* what ops->ahead answers */
    int done;                /* ops->done calls (loop thread) */
    int errors;
} seen;

static void op_run(void *ctx, int index, fw_pool_job *job)
{
    (void)index;
    (void)job;
    atomic_fetch_add(&((seen *)ctx)->ran, 1);
}

static void op_done(void *ctx, fw_pool_job *job)
{
    (void)job;
    ((seen *)ctx)->done++;
}

static int op_ahead(void *ctx, fw_pool_job *job)
{
    (void)job;
    seen *s = ctx;
    atomic_fetch_add(&s->offered, 1);
    return s->ahead_says;
}

static void op_parked(void *ctx, fw_pool_job *job)
{
    (void)ctx;
    (void)job;
}

static void op_error(void *ctx, const char *what, int err)
{
    printf("pool error: %s: %d\n", what, err);
    ((seen *)ctx)->errors++;
}

static const fw_pool_ops ops = {
    .run = op_run, .done = op_done, .ahead = op_ahead, .parked = op_parked, .error = op_error,
};

/* Wait (at most 5 s) until the pool has offered the job to ops->ahead:
 * it is on the done list by then, announced or not. */
static int wait_offered(seen *s, int n)
{
    for (int i = 0; i < 5000 && atomic_load(&s->offered) < n; i++) {
        struct timespec ms = { 0, 1000000 };
        nanosleep(&ms, NULL);
    }
    return atomic_load(&s->offered) >= n;
}

/* One loop pass with this timeout: the number of events dispatched. */
static int pass(fw_loop *loop, int timeout_ms)
{
    int n = fw_loop_wait(loop, timeout_ms);
    if (n > 0)
        fw_loop_dispatch(loop, n);
    return n;
}

int main(void)
{
    check_init();
    fw_loop loop;
    if (fw_loop_init(&loop, 16) != 0) {
        perror("fw_loop_init");
        return 1;
    }
    seen s = { .ahead_says = 1 };
    fw_pool *p = fw_pool_start(&loop, 1, fw_pool_max_threads(1), &ops, &s);
    CHECK(p != NULL);
    if (!p)
        return check_report();
    fw_pool_job job = { 0 };

    ctx = "announced (quiet not allowed: ops->ahead is not asked)";
    fw_pool_submit(p, &job);
    CHECK_INT(pass(&loop, 2000), 1);          /* the eventfd woke the loop */
    CHECK_INT(atomic_load(&s.offered), 0);
    CHECK_INT(s.done, 1);
    CHECK_INT(p->busy, 0);

    ctx = "unannounced (quiet allowed, ahead says yes)";
    fw_pool_quiet(p, 1);
    fw_pool_submit(p, &job);
    CHECK(wait_offered(&s, 1));
    CHECK_INT(pass(&loop, 100), 0);           /* nothing woke the loop */
    CHECK_INT(s.done, 1);
    CHECK_INT(p->busy, 1);
    fw_pool_collect(p);                       /* the top of the next pass */
    CHECK_INT(s.done, 2);
    CHECK_INT(p->busy, 0);

    ctx = "quiet turned off announces what was left";
    fw_pool_submit(p, &job);
    CHECK(wait_offered(&s, 2));
    CHECK_INT(pass(&loop, 100), 0);
    fw_pool_quiet(p, 0);
    CHECK_INT(pass(&loop, 2000), 1);
    CHECK_INT(s.done, 3);
    CHECK_INT(p->busy, 0);

    ctx = "quiet allowed, ahead says no";
    fw_pool_quiet(p, 1);
    s.ahead_says = 0;
    fw_pool_submit(p, &job);
    CHECK(wait_offered(&s, 3));
    CHECK_INT(pass(&loop, 2000), 1);
    CHECK_INT(s.done, 4);

    ctx = "collect with nothing out";
    fw_pool_collect(p);
    CHECK_INT(s.done, 4);
    CHECK_INT(atomic_load(&s.ran), 4);
    CHECK_INT(s.errors, 0);

    fw_pool_stop(p);
    fw_loop_destroy(&loop);
    return check_report();
}
