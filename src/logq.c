/* logq: the core's log lines, written by a thread of their own.
 *
 * The loop thread must never wait for the GIL: an app thread or a thread
 * the app started may hold it for long (a C extension that does not let it
 * go), and a loop stuck on it stops every connection of the worker and
 * looks frozen to the master (--heartbeat-timeout). So while serve() runs,
 * a line the core logs is copied into a bounded queue, and this thread takes
 * the GIL to hand the lines to the Python logger. A line that finds the
 * queue full is dropped, and counted in a line of its own later. Outside
 * serve(), lines are logged at once (the caller may take the GIL then).
 *
 * The thread starts with the first line, not with serve(): a worker with
 * one thread makes the kernel's file lookups cheaper (a socket's read, send
 * and epoll_wait take no reference on the file while no other thread
 * shares the descriptor table: about 0.7 % of a kept-alive hello request's
 * CPU here), and most workers log nothing while they serve. */
#include "glue.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

#define LOGQ_LINES 256
#define LOGQ_LINE 512

struct fw_logq {
    pthread_t tid;
    pthread_mutex_t mu;        /* guards everything below */
    pthread_cond_t cv;         /* a line came, or stop */
    int started;               /* 0: not yet (no line came), 1: tid runs, -1: could not start */
    int head, count, stop;
    unsigned long dropped;
    struct { int level; char text[LOGQ_LINE]; } lines[LOGQ_LINES];
};

/* Log one line through the Python logger (the GIL held). */
static void emit(fw_glue *s, int level, const char *msg)
{
    PyObject *x = PyObject_CallMethod(s->logger, "log", "is", level, msg);
    if (x)
        Py_DECREF(x);
    else
        PyErr_Clear();
}

static void *logq_main(void *arg)
{
    fw_glue *s = arg;
    fw_logq *q = s->logq;
    struct { int level; char text[LOGQ_LINE]; } batch[16];
    for (;;) {
        pthread_mutex_lock(&q->mu);
        while (!q->count && !q->dropped && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        int n = 0;
        while (q->count && n < 16) {
            batch[n].level = q->lines[q->head].level;
            memcpy(batch[n].text, q->lines[q->head].text, LOGQ_LINE);
            q->head = (q->head + 1) % LOGQ_LINES;
            q->count--;
            n++;
        }
        unsigned long dropped = q->dropped;
        q->dropped = 0;
        int done = q->stop && !q->count;
        pthread_mutex_unlock(&q->mu);
        if (n || dropped) {
            PyGILState_STATE g = PyGILState_Ensure();
            for (int i = 0; i < n; i++)
                emit(s, batch[i].level, batch[i].text);
            if (dropped) {
                char line[96];
                snprintf(line, sizeof(line), "%lu log line(s) dropped: the log thread did not keep up",
                         dropped);
                emit(s, FW_LOG_WARNING, line);
            }
            PyGILState_Release(g);
        }
        if (done)
            return NULL;
    }
}

int fw_logq_start(fw_glue *s)
{
    fw_logq *q = PyMem_RawCalloc(1, sizeof(*q));
    if (!q)
        return -1;
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        PyMem_RawFree(q);
        return -1;
    }
    if (pthread_cond_init(&q->cv, NULL) != 0) {
        pthread_mutex_destroy(&q->mu);
        PyMem_RawFree(q);
        return -1;
    }
    s->logq = q;
    return 0;
}

void fw_logq_stop(fw_glue *s)
{
    fw_logq *q = s->logq;
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    int started = q->started;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (started == 1) {
        Py_BEGIN_ALLOW_THREADS          /* it takes the GIL to write what is left */
        pthread_join(q->tid, NULL);
        Py_END_ALLOW_THREADS
    }
    s->logq = NULL;
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    PyMem_RawFree(q);
}

/* mu held: start the thread, with every signal blocked (they are the
 * loop's to take: the thread that logs first may be the loop thread, whose
 * mask the new one would inherit). 1, or -1 when it could not start. */
static int start_thread(fw_glue *s, fw_logq *q)
{
    sigset_t all, old;
    sigfillset(&all);
    if (pthread_sigmask(SIG_SETMASK, &all, &old) != 0)
        return -1;
    int rc = pthread_create(&q->tid, NULL, logq_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc == 0 ? 1 : -1;
}

static void emit_now(fw_glue *s, int level, const char *msg)
{
    PyGILState_STATE g = PyGILState_Ensure();
    emit(s, level, msg);
    PyGILState_Release(g);
}

void fw_logq_put(fw_glue *s, int level, const char *msg)
{
    fw_logq *q = s->logq;
    if (!q) {
        emit_now(s, level, msg);
        return;
    }
    pthread_mutex_lock(&q->mu);
    if (!q->started)
        q->started = start_thread(s, q);
    if (q->started < 0) {
        /* No thread (the thread limit): logged at once, as outside serve(). */
        pthread_mutex_unlock(&q->mu);
        emit_now(s, level, msg);
        return;
    }
    if (q->count == LOGQ_LINES) {
        q->dropped++;
    } else {
        int i = (q->head + q->count) % LOGQ_LINES;
        q->lines[i].level = level;
        snprintf(q->lines[i].text, LOGQ_LINE, "%s", msg);
        q->count++;
    }
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
