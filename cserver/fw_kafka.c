/* fw_kafka: see fw_kafka.h. */
#include "fw_kafka.h"
#include "fw_rdkafka.h"

#include <dlfcn.h>                        /* dlclose */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fw_kafka {
    void *lib;                            /* dlopen handle */
    fw_rdk_api api;
    fw_rdk *rk;
    fw_kafka_batch *open;                 /* batches with records still waiting for a report */
    fw_kafka_batch *done_head, *done_tail;/* finished, not yet taken by the caller (FIFO) */
    fw_kafka_log logs[FW_KAFKA_LOGS];     /* kept since the last drain: [log_next, log_count) */
    unsigned log_count, log_next, log_dropped;
};

/* ---- batches ------------------------------------------------------------- */

static void list_unlink(fw_kafka_batch **head, fw_kafka_batch *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        *head = b->next;
    if (b->next)
        b->next->prev = b->prev;
    b->prev = b->next = NULL;
}

fw_kafka_batch *fw_kafka_batch_new(fw_kafka *k, uint64_t id, uint32_t n)
{
    if (n == 0) {
        errno = EINVAL;
        return NULL;
    }
    /* One block: the batch, refs[n], then room for n failures, so that a
     * delivery report never needs memory. */
    size_t refs = (size_t)n * sizeof(fw_kafka_batch *);
    fw_kafka_batch *b = malloc(sizeof *b + refs + (size_t)n * sizeof(fw_kafka_err));
    if (!b) {
        errno = ENOMEM;
        return NULL;
    }
    b->id = id;
    b->n = b->left = n;
    b->nerr = 0;
    b->errs = (fw_kafka_err *)((char *)b->refs + refs);
    for (uint32_t i = 0; i < n; i++)
        b->refs[i] = b;
    b->prev = NULL;
    b->next = k->open;
    if (k->open)
        k->open->prev = b;
    k->open = b;
    return b;
}

void fw_kafka_batch_free(fw_kafka_batch *b)
{
    free(b);
}

/* Record i of b has its outcome (err 0: delivered). The last one moves the
 * batch to the done list. */
static void batch_outcome(fw_kafka *k, fw_kafka_batch *b, uint32_t i, int err)
{
    if (b->left == 0)                     /* a second report for one record: librdkafka never sends one */
        return;
    if (err) {                            /* one outcome per record: nerr < n here */
        b->errs[b->nerr].index = i;
        b->errs[b->nerr].code = err;
        b->nerr++;
    }
    if (--b->left)
        return;
    list_unlink(&k->open, b);
    if (k->done_tail)
        k->done_tail->next = b;
    else
        k->done_head = b;
    b->prev = k->done_tail;
    k->done_tail = b;
}

fw_kafka_batch *fw_kafka_next_done(fw_kafka *k)
{
    fw_kafka_batch *b = k->done_head;
    if (!b)
        return NULL;
    k->done_head = b->next;
    if (k->done_head)
        k->done_head->prev = NULL;
    else
        k->done_tail = NULL;
    b->prev = b->next = NULL;
    return b;
}

/* ---- librdkafka's callbacks (on the thread that polls) -------------------- */

static void on_delivery(fw_rdk *rk, const fw_rdk_message *m, void *opaque)
{
    (void)rk;
    fw_kafka *k = opaque;
    fw_kafka_batch **ref = m->_private;
    fw_kafka_batch *b = *ref;
    batch_outcome(k, b, (uint32_t)(ref - b->refs), m->err);
}

static void keep_log(fw_kafka *k, int level, const char *fac, const char *text)
{
    if (k->log_count == FW_KAFKA_LOGS) {
        k->log_dropped++;
        return;
    }
    fw_kafka_log *l = &k->logs[k->log_count++];
    l->level = level;
    snprintf(l->fac, sizeof l->fac, "%s", fac ? fac : "");
    snprintf(l->text, sizeof l->text, "%s", text ? text : "");
}

/* The producer this thread is serving reports for, set around every call
 * into librdkafka that runs callbacks on it (rd_kafka_new, fw_kafka_poll,
 * _flush, _close): the log callback, unlike the others, gets no opaque of
 * ours. Logs reach it only there, as log.queue is set (fw_kafka_open); a
 * line logged on one of librdkafka's own threads before the log queue is
 * set finds it NULL and is not kept. */
static _Thread_local fw_kafka *serving;

static void on_log(const fw_rdk *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    if (serving)
        keep_log(serving, level, fac, buf);
}

/* Errors that librdkafka also logs (a broker down, a connection refused)
 * come through on_log; only a fatal one matters here, and it is logged. */
static void on_error(fw_rdk *rk, int err, const char *reason, void *opaque)
{
    (void)rk;
    if (err != FW_RDK_ERR_FATAL)
        return;
    fw_kafka *k = opaque;
    char text[240];
    snprintf(text, sizeof text, "fatal error: %s", reason ? reason : "");
    keep_log(k, 2, "ERROR", text);
}

/* ---- the producer -------------------------------------------------------- */

fw_kafka *fw_kafka_open(const char *lib_path, const char *const *conf, char *err, size_t errlen)
{
    fw_kafka *k = calloc(1, sizeof *k);
    if (!k) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    k->lib = fw_rdk_load(&k->api, lib_path, err, errlen);
    if (!k->lib)
        goto fail;
    fw_rdk_conf *c = k->api.conf_new();
    char why[512];
    for (const char *const *kv = conf; kv && kv[0]; kv += 2) {
        if (k->api.conf_set(c, kv[0], kv[1], why, sizeof why) != FW_RDK_CONF_OK) {
            snprintf(err, errlen, "%s", why);
            k->api.conf_destroy(c);
            goto fail;
        }
    }
    /* Logs go to the main queue, served by fw_kafka_poll on our thread. */
    if (k->api.conf_set(c, "log.queue", "true", why, sizeof why) != FW_RDK_CONF_OK) {
        snprintf(err, errlen, "%s", why);
        k->api.conf_destroy(c);
        goto fail;
    }
    k->api.conf_set_opaque(c, k);
    k->api.conf_set_dr_msg_cb(c, on_delivery);
    k->api.conf_set_error_cb(c, on_error);
    k->api.conf_set_log_cb(c, on_log);
    serving = k;                          /* what rd_kafka_new logs on this thread (debug=conf) */
    k->rk = k->api.create(FW_RDK_PRODUCER, c, why, sizeof why);
    serving = NULL;
    if (!k->rk) {                         /* c is still ours on failure */
        snprintf(err, errlen, "%s", why);
        k->api.conf_destroy(c);
        goto fail;
    }
    fw_rdk_err e = k->api.set_log_queue(k->rk, NULL);
    if (e) {
        snprintf(err, errlen, "rd_kafka_set_log_queue: %s", k->api.err2str(e));
        goto fail;
    }
    return k;
fail:
    if (k->rk)
        k->api.destroy(k->rk);
    if (k->lib)
        dlclose(k->lib);
    free(k);
    return NULL;
}

const char *fw_kafka_version(const fw_kafka *k)
{
    return k->api.version_str();
}

int fw_kafka_produce(fw_kafka *k, fw_kafka_batch *b, uint32_t i, const fw_kafka_rec *r)
{
    fw_rdk_err err = k->api.producev(k->rk,
                                     FW_RDK_VTYPE_TOPIC, r->topic,
                                     FW_RDK_VTYPE_VALUE, (void *)r->value, r->value_len,
                                     FW_RDK_VTYPE_KEY, r->key, r->key_len,
                                     FW_RDK_VTYPE_TIMESTAMP, r->ts_ms,
                                     FW_RDK_VTYPE_MSGFLAGS, FW_RDK_MSG_F_COPY,
                                     FW_RDK_VTYPE_OPAQUE, (void *)&b->refs[i],
                                     FW_RDK_VTYPE_END);
    if (err == FW_RDK_ERR_QUEUE_FULL)
        return FW_KAFKA_QUEUE_FULL;
    if (err)
        batch_outcome(k, b, i, err);     /* refused now: no report will come */
    return 0;
}

void fw_kafka_fail(fw_kafka *k, fw_kafka_batch *b, uint32_t i, int code)
{
    batch_outcome(k, b, i, code);
}

void fw_kafka_poll(fw_kafka *k, int timeout_ms)
{
    if (k->done_head)                     /* finished batches wait: do not block */
        timeout_ms = 0;
    serving = k;
    k->api.poll(k->rk, timeout_ms);
    serving = NULL;
}

int fw_kafka_flush(fw_kafka *k, int timeout_ms)
{
    serving = k;
    k->api.flush(k->rk, timeout_ms);     /* RD_KAFKA_RESP_ERR__TIMED_OUT: some are left, counted below */
    serving = NULL;
    long left = 0;
    for (const fw_kafka_batch *b = k->open; b; b = b->next)
        left += b->left;
    return left > INT32_MAX ? INT32_MAX : (int)left;
}

void fw_kafka_purge(fw_kafka *k)
{
    k->api.purge(k->rk, FW_RDK_PURGE_F_QUEUE | FW_RDK_PURGE_F_INFLIGHT);
}

int fw_kafka_fatal(fw_kafka *k, char *buf, size_t len)
{
    return k->api.fatal_error(k->rk, buf, len);
}

int fw_kafka_next_log(fw_kafka *k, fw_kafka_log *out, unsigned *dropped)
{
    if (k->log_next == k->log_count) {
        *dropped = k->log_dropped;
        k->log_next = k->log_count = k->log_dropped = 0;
        return 0;
    }
    *out = k->logs[k->log_next++];
    return 1;
}

const char *fw_kafka_err_name(const fw_kafka *k, int code)
{
    return k->api.err2name(code);
}

const char *fw_kafka_err_text(const fw_kafka *k, int code)
{
    return k->api.err2str(code);
}

void fw_kafka_close(fw_kafka *k)
{
    if (!k)
        return;
    fw_kafka_purge(k);
    fw_kafka_poll(k, 0);                  /* the purged records' reports */
    k->api.destroy(k->rk);
    for (fw_kafka_batch *b = k->open, *next; b; b = next) {
        next = b->next;
        fw_kafka_batch_free(b);
    }
    for (fw_kafka_batch *b = k->done_head, *next; b; b = next) {
        next = b->next;
        fw_kafka_batch_free(b);
    }
    dlclose(k->lib);
    free(k);
}
