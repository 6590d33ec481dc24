/* fw_lead: which thread runs the loop, when the loop thread runs requests
 * itself (--threads > 1, inline first).
 *
 * Handing each request to an app thread costs two sleeps and two wake-ups
 * (the thread's, and the loop's or the client's): at saturation that was
 * half the CPU of a request (17.6 us against 7.7 us inline). So the loop
 * thread, the process's main thread, runs the requests of a pass itself,
 * one after the other, and the app threads stay asleep. A call that lasts
 * must not hold the loop, though, and neither must a run of calls: the
 * requests of one pass, run one after the other, are one run (one seq),
 * and a run of forty 1 ms sleeps holds the loop as one 40 ms sleep would,
 * while the app threads idle. A standby thread watches. When it finds the
 * same run in a call at two of its ticks (FW_LEAD_TICK_MS apart), with
 * the main thread asleep (blocked in I/O, a sleep, a lock, the GIL), it
 * takes the loop over and runs it as the loop thread did, handing requests
 * to the app threads (the rest of the run too). A main thread that runs,
 * or waits for a CPU (other workers share it: a call preempted for a few ms
 * is common), keeps the loop for FW_LEAD_RUNNING_TICKS: taken over then,
 * each request would cost the hand-offs this spares, with no CPU to gain.
 * The loop thread, once its call returns, gives its request back as an
 * app thread would (fw_pool_hand_back) and waits for the loop; the standby
 * gives it back at the end of its next pass. The loop thread gives the
 * loop away itself when its request must wait for the loop (a slow
 * reader: fw_lead_hand).
 *
 * The main thread leads whenever it can: Python runs signal handlers only
 * there. The standby blocks every signal.
 *
 * The state word (fw_lead.word) says who runs the loop: FW_LEAD_MAIN (the
 * loop thread, between calls), seq << 2 | FW_LEAD_CALL (the loop thread, in
 * a call of its run number seq), FW_LEAD_STANDBY (the standby). The loop
 * thread moves MAIN -> CALL -> MAIN; either thread moves CALL -> STANDBY with a
 * compare-and-swap, so a call ends either with the loop still the main
 * thread's, or taken, never both; the standby moves STANDBY -> MAIN when
 * asked (fw_lead_ask_back). Who runs the loop owns all of the loop's state;
 * the handover's compare-and-swap or mutex orders their writes. */
#ifndef FW_LEAD_H
#define FW_LEAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* fw_lead.word: who runs the loop. */
enum { FW_LEAD_MAIN = 0, FW_LEAD_CALL = 1, FW_LEAD_STANDBY = 2 };

#define FW_LEAD_TICK_MS 1           /* a run that sleeps is taken over after 1 to 2 ms */
#define FW_LEAD_RUNNING_TICKS 50    /* ...one that runs (or waits for the CPU), after 50 */
#define FW_LEAD_IDLE_TICKS 1000     /* ticks with no call seen: the standby sleeps until one */

typedef struct fw_lead_ops {
    /* On the standby, which has taken the loop over: run the loop until
     * fw_lead_wanted (checked between passes), or until the run ends. */
    void (*run)(void *ctx);
    /* A syscall failed (what: its name; err: errno). */
    void (*error)(void *ctx, const char *what, int err);
} fw_lead_ops;

typedef struct fw_lead {
    _Atomic uint64_t word;         /* who runs the loop (above) */
    _Atomic int watching;          /* the standby ticks; 0: it sleeps until a call begins */
    _Atomic int want_back;         /* the main thread waits for the loop */
    uint64_t seq;                  /* main thread only: its runs so far */
    uint64_t takeovers;            /* standby only, read after it stops: calls taken over */
    const fw_lead_ops *ops;        /* not owned */
    void *ctx;                     /* not owned: passed to the ops */
    pthread_mutex_t mu;            /* guards quit and the sleeps below */
    pthread_cond_t cv;             /* the standby's sleep (CLOCK_MONOTONIC) */
    pthread_cond_t back_cv;        /* the main thread's wait for the loop */
    int quit;
    pthread_t tid;
    int stat_fd;                   /* owned: /proc/self/task/<main thread>/stat, or -1 (then a
                                    * call is taken over after two ticks, whatever its state) */
} fw_lead;

/* Main thread: start the standby, the loop the main thread's. 0, or
 * -errno (nothing started). */
int fw_lead_start(fw_lead *l, const fw_lead_ops *ops, void *ctx);
/* Main thread, leading: stop the standby and join it. */
void fw_lead_stop(fw_lead *l);

/* Main thread, leading: a run of calls begins (the requests it kept for
 * the pass). */
void fw_lead_run_begin(fw_lead *l);
/* Main thread, leading: a call into the app (of the run) begins. */
void fw_lead_call_begin(fw_lead *l);
/* Main thread: the call ended. 1: the loop is still the main thread's; 0:
 * the standby runs it (the main thread then hands its request back like an
 * app thread, fw_lead_ask_back, and fw_lead_wait_back). */
int fw_lead_call_end(fw_lead *l);
/* Main thread, in a call that must wait for the loop: the standby takes
 * the loop now (fw_lead_call_end will say 0). */
void fw_lead_hand(fw_lead *l);

/* Main thread, the loop taken: ask for it back. Then wake the loop (the
 * standby may sleep in epoll_wait), then fw_lead_wait_back. */
void fw_lead_ask_back(fw_lead *l);
void fw_lead_wait_back(fw_lead *l);

/* The thread that runs the loop, a question (1 yes, 0 no): is it the main
 * thread? */
static inline int fw_lead_main_leads(fw_lead *l)
{
    return atomic_load_explicit(&l->word, memory_order_relaxed) != FW_LEAD_STANDBY;
}

/* Standby, in ops->run between passes, a question: does the main thread
 * want the loop back? */
static inline int fw_lead_wanted(fw_lead *l)
{
    return atomic_load(&l->want_back);
}

#endif
