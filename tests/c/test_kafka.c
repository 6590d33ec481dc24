/* tests/c/test_kafka.c: cserver/fw_kafka.c over the real librdkafka (the
 * shared library whose path is argv[1]: tests/test_c.py gives the one
 * confluent-kafka ships), without a broker: bootstrap.servers points at a
 * closed port on 127.0.0.1, so every record ends with an error, which is
 * what the batch accounting must get right (the delivered case is
 * tests/test_kafka.py's, against a real broker).
 *
 *   - a bad library path, a missing symbol's library, a bad setting: NULL
 *     and a reason;
 *   - librdkafka's queue full (5 messages): FW_KAFKA_QUEUE_FULL, then the
 *     same record again after a poll;
 *   - timed-out records: the batch is done once every record has its
 *     outcome, each index failed exactly once, with _MSG_TIMED_OUT;
 *   - purge: the reports come at the next poll, _PURGE_QUEUE;
 *   - fw_kafka_fail: a record the caller could not produce;
 *   - more log lines than are kept: the rest counted as dropped;
 *   - batches finish in the order their last record does; close frees
 *     what is still open (ASan's leak check). */
#define CHECK_NAME "test_kafka"
#include "check.h"

#include "fw_kafka.h"

#include <time.h>

#define ERR_MSG_TIMED_OUT (-192)
#define ERR_PURGE_QUEUE (-152)

static const char *lib;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static fw_kafka *open_producer(const char *max_messages)
{
    const char *conf[] = { "bootstrap.servers", "127.0.0.1:1", "message.timeout.ms", "300",
                           "queue.buffering.max.messages", max_messages, "linger.ms", "1",
                           "enable.idempotence", "true", "acks", "all", NULL };
    char err[256] = "";
    fw_kafka *k = fw_kafka_open(lib, conf, err, sizeof err);
    if (!k)
        printf("fw_kafka_open: %s\n", err);
    return k;
}

/* Poll until a batch is done (or 10 s). */
static fw_kafka_batch *wait_done(fw_kafka *k)
{
    double end = now() + 10.0;
    fw_kafka_batch *b;
    while (!(b = fw_kafka_next_done(k)) && now() < end)
        fw_kafka_poll(k, 50);
    return b;
}

static void test_open_failures(void)
{
    ctx = "open failures";
    char err[256] = "";
    const char *none[] = { NULL };
    CHECK(fw_kafka_open("/nonexistent/librdkafka.so.1", none, err, sizeof err) == NULL);
    CHECK(strstr(err, "cannot load /nonexistent/librdkafka.so.1") != NULL);

    err[0] = 0;
    CHECK(fw_kafka_open("libc.so.6", none, err, sizeof err) == NULL);     /* loads; no rd_kafka_* */
    CHECK(strstr(err, "has no rd_kafka_version") != NULL);

    err[0] = 0;
    const char *bad[] = { "no.such.setting", "1", NULL };
    CHECK(fw_kafka_open(lib, bad, err, sizeof err) == NULL);
    CHECK(strstr(err, "no.such.setting") != NULL);

    err[0] = 0;
    const char *bad_value[] = { "acks", "sometimes", NULL };
    CHECK(fw_kafka_open(lib, bad_value, err, sizeof err) == NULL);
    CHECK(err[0] != 0);
}

static fw_kafka_rec rec(const char *topic, const char *key, const char *value)
{
    fw_kafka_rec r = { topic, key, key ? strlen(key) : 0, value, strlen(value), 1700000000000LL };
    return r;
}

static void test_queue_full_and_timeouts(void)
{
    ctx = "queue full, timed out";
    fw_kafka *k = open_producer("5");
    CHECK(k != NULL);
    if (!k)
        return;
    CHECK(strlen(fw_kafka_version(k)) > 0);
    enum { N = 12 };
    fw_kafka_batch *b = fw_kafka_batch_new(k, 42, N);
    CHECK(b != NULL);
    int full = 0;
    for (uint32_t i = 0; i < N; i++) {
        fw_kafka_rec r = rec("t", i % 2 ? "key" : NULL, "value");
        int rc;
        double end = now() + 10.0;
        while ((rc = fw_kafka_produce(k, b, i, &r)) == FW_KAFKA_QUEUE_FULL && now() < end) {
            full++;
            fw_kafka_poll(k, 50);
        }
        CHECK_INT(rc, 0);
    }
    CHECK(full > 0);                      /* 12 records through a queue of 5 */
    fw_kafka_batch *done = wait_done(k);
    CHECK(done == b);
    if (done) {
        CHECK_INT(done->id, 42);
        CHECK_INT(done->left, 0);
        CHECK_INT(done->nerr, N);
        int seen[N] = { 0 };
        for (uint32_t e = 0; e < done->nerr && e < N; e++) {
            CHECK_INT(done->errs[e].code, ERR_MSG_TIMED_OUT);
            if (done->errs[e].index < N)
                seen[done->errs[e].index]++;
        }
        for (int i = 0; i < N; i++)
            CHECK_INT(seen[i], 1);
        fw_kafka_batch_free(done);
    }
    CHECK(fw_kafka_next_done(k) == NULL);
    CHECK(strcmp(fw_kafka_err_name(k, ERR_MSG_TIMED_OUT), "_MSG_TIMED_OUT") == 0);
    CHECK(strstr(fw_kafka_err_text(k, ERR_MSG_TIMED_OUT), "timed out") != NULL);

    /* librdkafka logged the refused connections; they were kept. */
    fw_kafka_log line;
    unsigned dropped = 0;
    int lines = 0;
    while (fw_kafka_next_log(k, &line, &dropped))
        lines++;
    CHECK(lines > 0);
    CHECK(fw_kafka_next_log(k, &line, &dropped) == 0);
    char why[128];
    CHECK_INT(fw_kafka_fatal(k, why, sizeof why), 0);
    fw_kafka_close(k);
}

static void test_purge_fail_and_order(void)
{
    ctx = "purge, fail, order";
    fw_kafka *k = open_producer("1000");
    CHECK(k != NULL);
    if (!k)
        return;
    fw_kafka_batch *a = fw_kafka_batch_new(k, 1, 3);
    fw_kafka_batch *b = fw_kafka_batch_new(k, 2, 2);
    fw_kafka_batch *c = fw_kafka_batch_new(k, 3, 2);
    CHECK(a && b && c);
    if (!a || !b || !c)
        return;
    fw_kafka_rec r = rec("t", NULL, "v");
    /* b: one record the caller could not produce, then one produced. */
    fw_kafka_fail(k, b, 0, FW_KAFKA_ERR_INVALID_ARG);
    CHECK(fw_kafka_next_done(k) == NULL);                /* record 1 still open */
    for (uint32_t i = 0; i < 3; i++)
        CHECK_INT(fw_kafka_produce(k, a, i, &r), 0);
    CHECK_INT(fw_kafka_produce(k, b, 1, &r), 0);
    CHECK_INT(fw_kafka_produce(k, c, 0, &r), 0);         /* c's record 1 never produced */
    fw_kafka_purge(k);
    fw_kafka_poll(k, 100);
    fw_kafka_batch *first = fw_kafka_next_done(k), *second = fw_kafka_next_done(k);
    CHECK(first == a && second == b);
    CHECK(fw_kafka_next_done(k) == NULL);                /* c waits for its record 1 */
    CHECK_INT(fw_kafka_flush(k, 0), 1);                  /* ... the one record without an outcome */
    if (first == a) {
        CHECK_INT(a->nerr, 3);
        for (uint32_t e = 0; e < a->nerr; e++)
            CHECK_INT(a->errs[e].code, ERR_PURGE_QUEUE);
    }
    if (second == b) {
        CHECK_INT(b->nerr, 2);
        CHECK_INT(b->errs[0].index, 0);
        CHECK_INT(b->errs[0].code, FW_KAFKA_ERR_INVALID_ARG);
        CHECK_INT(b->errs[1].index, 1);
        CHECK_INT(b->errs[1].code, ERR_PURGE_QUEUE);
    }
    fw_kafka_batch_free(first);
    fw_kafka_batch_free(second);
    CHECK(fw_kafka_batch_new(k, 4, 0) == NULL);
    fw_kafka_close(k);                                   /* frees c */
}

/* librdkafka's debug=all output, with 2,000 records timing out, is more
 * than FW_KAFKA_LOGS lines in its first second (~100 here, quiet): those
 * kept come out, and the rest are counted as dropped, told once, by the
 * drain's last call. On a busy machine librdkafka's threads may spread that
 * output over more time, so the drains come after 1, 2, 4 and 8 s (~230
 * lines in 10 s here), until one overflowed; every drain must keep the
 * rules. */
static void test_log_overflow(void)
{
    ctx = "log overflow";
    const char *conf[] = { "bootstrap.servers", "127.0.0.1:1", "debug", "all", "message.timeout.ms", "50",
                           "linger.ms", "0", NULL };
    char err[256] = "";
    fw_kafka *k = fw_kafka_open(lib, conf, err, sizeof err);
    CHECK(k != NULL);
    if (!k)
        return;
    enum { N = 2000 };
    fw_kafka_batch *b = fw_kafka_batch_new(k, 1, N);
    fw_kafka_rec r = rec("t", NULL, "v");
    for (uint32_t i = 0; b && i < N; i++)
        while (fw_kafka_produce(k, b, i, &r) == FW_KAFKA_QUEUE_FULL)
            fw_kafka_poll(k, 10);
    int overflowed = 0;
    for (int window = 1; window <= 8 && !overflowed; window *= 2) {
        for (int i = 0; i < 10 * window; i++)
            fw_kafka_poll(k, 100);
        fw_kafka_log line;
        unsigned dropped = 12345;
        int lines = 0, told_early = 0;
        while (fw_kafka_next_log(k, &line, &dropped)) {
            told_early |= dropped != 12345;   /* told only by the call that ends the drain */
            lines++;
        }
        CHECK(!told_early);
        CHECK(lines <= FW_KAFKA_LOGS);
        CHECK(dropped == 0 || lines == FW_KAFKA_LOGS);
        overflowed = dropped > 0;
        dropped = 12345;
        CHECK(fw_kafka_next_log(k, &line, &dropped) == 0);
        CHECK_INT(dropped, 0);                /* counted anew after a drain */
    }
    CHECK(overflowed);
    fw_kafka_batch_free(fw_kafka_next_done(k));
    fw_kafka_close(k);
}

int main(int argc, char **argv)
{
    check_init();
    if (argc != 2) {
        fprintf(stderr, "usage: test_kafka LIBRDKAFKA_SO\n");
        return 2;
    }
    lib = argv[1];
    test_open_failures();
    test_queue_full_and_timeouts();
    test_purge_fail_and_order();
    test_log_overflow();
    return check_report();
}
