/* fw_lead: see fw_lead.h. */
#define _GNU_SOURCE
#include "fw_lead.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The word of the main thread's calls in its current run. */
static uint64_t call_word(const fw_lead *l)
{
    return (l->seq << 2) | FW_LEAD_CALL;
}

/* A question (1 yes, 0 no): does the main thread run, or wait for a CPU
 * ("R" in its stat)? Unknown (no stat file, a failed read) says no. */
static int main_runs(fw_lead *l)
{
    char buf[512];
    if (l->stat_fd < 0)
        return 0;
    ssize_t n = pread(l->stat_fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')');     /* the name, in parentheses, may hold anything */
    return paren && paren[1] == ' ' && paren[2] == 'R';
}

/* mu held: sleep one tick (or until signalled). */
static void tick_wait(fw_lead *l)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += FW_LEAD_TICK_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int e = pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    if (e != 0 && e != ETIMEDOUT)
        l->ops->error(l->ctx, "lead: pthread_cond_timedwait", e);
}

/* mu held: the standby leads (it took the loop, or was handed it). Run the
 * loop, then give it back once the main thread asks. */
static void lead(fw_lead *l)
{
    pthread_mutex_unlock(&l->mu);
    l->ops->run(l->ctx);
    pthread_mutex_lock(&l->mu);
    /* The run may have ended with the main thread still in its call: the
     * main thread ends the run, once it is back. */
    while (!atomic_load(&l->want_back) && !l->quit)
        pthread_cond_wait(&l->cv, &l->mu);
    atomic_store(&l->want_back, 0);
    atomic_store(&l->word, FW_LEAD_MAIN);
    pthread_cond_broadcast(&l->back_cv);
}

static void *standby_main(void *arg)
{
    fw_lead *l = arg;
    uint64_t last_call = FW_LEAD_MAIN;  /* the last call's word seen (its run) */
    int idle = 0, held = 0;
    pthread_mutex_lock(&l->mu);
    while (!l->quit) {
        uint64_t w = atomic_load(&l->word);
        if (w == FW_LEAD_STANDBY) {
            lead(l);
            last_call = FW_LEAD_MAIN;
            continue;
        }
        if ((w & 3) == FW_LEAD_CALL) {
            idle = 0;
            /* The same run as a tick ago (perhaps another of its calls: a
             * tick that finds the main thread between two calls counts
             * neither way): it has lasted a tick at least. Asleep, it is
             * taken over; running, after a while. */
            held = w == last_call ? held + 1 : 0;
            last_call = w;
            if (held > 0 && (held >= FW_LEAD_RUNNING_TICKS || !main_runs(l)) &&
                atomic_compare_exchange_strong(&l->word, &w, FW_LEAD_STANDBY)) {
                l->takeovers++;
                held = 0;
                continue;
            }
        } else if (++idle >= FW_LEAD_IDLE_TICKS) {
            /* No call for a while: sleep until one begins. The main thread
             * stores its call's word, then reads watching; this stores
             * watching, then reads the word: one of the two sees the
             * other's store, so no call goes unwatched. */
            idle = 0;
            atomic_store(&l->watching, 0);
            if ((atomic_load(&l->word) & 3) == FW_LEAD_CALL)
                atomic_store(&l->watching, 1);
        }
        if (atomic_load(&l->watching)) {
            tick_wait(l);
        } else {
            pthread_cond_wait(&l->cv, &l->mu);
            last_call = FW_LEAD_MAIN;   /* a new run needs two ticks from now */
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

int fw_lead_start(fw_lead *l, const fw_lead_ops *ops, void *ctx)
{
    memset(l, 0, sizeof(*l));
    l->ops = ops;
    l->ctx = ctx;
    /* The main thread's state, read when a call lasts (main_runs). Without
     * it (no /proc), calls are taken over by time alone. */
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/stat", (long)syscall(SYS_gettid));
    l->stat_fd = open(path, O_RDONLY | O_CLOEXEC);
    atomic_store(&l->watching, 1);
    pthread_condattr_t ca;
    int e = pthread_condattr_init(&ca);
    if (e != 0)
        return -e;
    e = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (e == 0 && (e = pthread_mutex_init(&l->mu, NULL)) == 0) {
        if ((e = pthread_cond_init(&l->cv, &ca)) != 0) {
            pthread_mutex_destroy(&l->mu);
        } else if ((e = pthread_cond_init(&l->back_cv, NULL)) != 0) {
            pthread_cond_destroy(&l->cv);
            pthread_mutex_destroy(&l->mu);
        }
    }
    pthread_condattr_destroy(&ca);
    if (e != 0) {
        if (l->stat_fd >= 0)
            close(l->stat_fd);
        return -e;
    }
    /* Signals go to the main thread (Python's handlers run there): the
     * standby starts with all of them blocked. */
    sigset_t all, old;
    sigfillset(&all);
    e = pthread_sigmask(SIG_SETMASK, &all, &old);
    if (e == 0) {
        e = pthread_create(&l->tid, NULL, standby_main, l);
        int e2 = pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e2 != 0)
            ops->error(ctx, "lead: pthread_sigmask", e2);
    }
    if (e != 0) {
        pthread_cond_destroy(&l->back_cv);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        if (l->stat_fd >= 0)
            close(l->stat_fd);
        return -e;
    }
    return 0;
}

void fw_lead_stop(fw_lead *l)
{
    pthread_mutex_lock(&l->mu);
    l->quit = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->tid, NULL);
    if (l->stat_fd >= 0)
        close(l->stat_fd);
    pthread_cond_destroy(&l->back_cv);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
}

void fw_lead_run_begin(fw_lead *l)
{
    l->seq++;
}

void fw_lead_call_begin(fw_lead *l)
{
    atomic_store(&l->word, call_word(l));
    if (!atomic_load(&l->watching)) {
        pthread_mutex_lock(&l->mu);
        atomic_store(&l->watching, 1);
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
}

int fw_lead_call_end(fw_lead *l)
{
    uint64_t w = call_word(l);
    return atomic_compare_exchange_strong(&l->word, &w, FW_LEAD_MAIN);
}

void fw_lead_hand(fw_lead *l)
{
    uint64_t w = call_word(l);
    if (!atomic_compare_exchange_strong(&l->word, &w, FW_LEAD_STANDBY))
        return;                 /* taken already */
    pthread_mutex_lock(&l->mu);
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void fw_lead_ask_back(fw_lead *l)
{
    pthread_mutex_lock(&l->mu);
    atomic_store(&l->want_back, 1);
    pthread_cond_signal(&l->cv);        /* a standby whose run ended waits for this */
    pthread_mutex_unlock(&l->mu);
}

void fw_lead_wait_back(fw_lead *l)
{
    pthread_mutex_lock(&l->mu);
    while (atomic_load(&l->word) == FW_LEAD_STANDBY)
        pthread_cond_wait(&l->back_cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
}
