/* ring_watch: the offload sibling's way out of SCHED_IDLE.
 *
 * While the sibling keeps up, every thread of it runs SCHED_IDLE
 * (python/forkwsgi/offload/sibling.py, Priority): a request thread that
 * wakes up preempts it at once. The price: on a CPU that request threads
 * keep busy (a saturated server) it gets no time at all, not even enough to
 * notice that the ring fills up, and records overflow into spill files.
 *
 * This thread is the one exception. It stays SCHED_OTHER, looks at how full
 * the ring is every few milliseconds (two loads from the ring's first page,
 * no syscall), and once that passes the threshold moves every other thread
 * of the process to SCHED_BATCH at the sibling's nice level: the sibling
 * takes its fair share of the CPU before the ring overflows. Python moves
 * them back to SCHED_IDLE once it has caught up, and arms the watch again.
 *
 * It is a C thread because a Python thread would first need the GIL, which
 * an idle-priority thread that gets no CPU may be holding. One watch per
 * process (only the sibling starts one); it lives until the process exits. */
#include "glue.h"
#include "fw_ring.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const fw_ring *ring;         /* borrowed: the sibling's reader's ring, mapped until the process exits */
    uint64_t threshold;          /* bytes in use that call for a share of the CPU */
    long interval_ns;
    int nice;                    /* the sibling's nice level in SCHED_BATCH */
    _Atomic int tid;             /* the watch thread's own id: it is never moved */
    _Atomic int armed;           /* 1: the sibling is idle, watch the ring */
    _Atomic unsigned fired;      /* times the watch moved the sibling to SCHED_BATCH */
    int started;                 /* under the GIL */
} ring_watch;

static ring_watch g_watch;

/* Every thread of the process but the watch itself to SCHED_BATCH at
 * w->nice. A thread that exits meanwhile is skipped (ESRCH). Returns 0, or
 * -errno of the first other failure (the sibling then stays as it is). */
static int share_cpu(const ring_watch *w)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -errno;
    int rc = 0;
    struct sched_param p = { .sched_priority = 0 };
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int tid = atoi(e->d_name);
        if (tid <= 0 || tid == atomic_load(&w->tid))
            continue;
        if (sched_setscheduler(tid, SCHED_BATCH, &p) != 0 || setpriority(PRIO_PROCESS, (id_t)tid, w->nice) != 0) {
            if (errno != ESRCH && rc == 0)
                rc = -errno;
        }
    }
    closedir(d);
    return rc;
}

static void *watch_main(void *arg)
{
    ring_watch *w = arg;
    /* A new thread inherits its creator's policy, and the sibling's threads
     * are SCHED_IDLE by now: this one must not be (the sibling is allowed
     * to leave SCHED_IDLE, or it would not start a watch). */
    struct sched_param p = { .sched_priority = 0 };
    if (sched_setscheduler(0, SCHED_OTHER, &p) != 0 || setpriority(PRIO_PROCESS, 0, 0) != 0)
        return NULL;             /* tid stays 0: fw_ring_watch_start reports it */
    if (prctl(PR_SET_NAME, "fw-ring-watch", 0, 0, 0) != 0)
        return NULL;
    atomic_store(&w->tid, (int)syscall(SYS_gettid));
    struct timespec pause = { 0, w->interval_ns };
    for (;;) {
        if (nanosleep(&pause, NULL) != 0 && errno != EINTR)
            return NULL;
        if (!atomic_load(&w->armed) || fw_ring_used(w->ring) < w->threshold)
            continue;
        /* Disarmed first: Python arms it again when it goes back to idle,
         * and must not find it armed while the threads are being moved. */
        atomic_store(&w->armed, 0);
        if (share_cpu(w) == 0)
            atomic_fetch_add(&w->fired, 1);
    }
    return NULL;
}

/* Start the watch (once per process). Returns 0 or -errno. */
int fw_ring_watch_start(const fw_ring *ring, uint64_t threshold, int interval_ms, int nice)
{
    ring_watch *w = &g_watch;
    if (w->started)
        return -EALREADY;
    w->ring = ring;
    w->threshold = threshold;
    w->interval_ns = (long)interval_ms * 1000000L;
    w->nice = nice;
    /* The thread takes no signal: Python's handlers run in the main thread. */
    sigset_t all, old;
    sigfillset(&all);
    int rc = pthread_sigmask(SIG_SETMASK, &all, &old);
    if (rc != 0)
        return -rc;
    pthread_t t;
    rc = pthread_create(&t, NULL, watch_main, w);
    int rc2 = pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -rc;
    if (rc2 != 0)
        return -rc2;
    rc = pthread_detach(t);
    if (rc != 0)
        return -rc;
    /* Its id, before Python moves threads around (it must skip this one). */
    struct timespec tick = { 0, 100000 };
    for (int i = 0; i < 10000 && atomic_load(&w->tid) == 0; i++)
        nanosleep(&tick, NULL);
    w->started = 1;
    return atomic_load(&w->tid) ? 0 : -EAGAIN;
}

int fw_ring_watch_tid(void)
{
    return atomic_load(&g_watch.tid);
}

void fw_ring_watch_arm(int armed)
{
    atomic_store(&g_watch.armed, armed);
}

unsigned fw_ring_watch_fired(void)
{
    return atomic_load(&g_watch.fired);
}
