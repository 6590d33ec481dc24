/* fw_kafka: the offload sibling's Kafka producer, driving librdkafka from C.
 *
 * Why: handing each record to confluent-kafka's Producer costs the sibling
 * about 2 µs of Python per record (the produce() call, a Message object and
 * a Python delivery callback). Here a batch of records goes to librdkafka in
 * one C loop and the delivery reports are counted in C, per batch.
 *
 * librdkafka is not linked: fw_kafka_open() loads it with dlopen from the
 * path it is given (the copy confluent-kafka already loaded in the process:
 * same library, same version; see offload/sinks.py), and looks up the
 * functions of fw_rdkafka.h. forkwsgi builds and runs without it.
 *
 * Batches. The caller makes a batch for n records (fw_kafka_batch_new, with
 * an id of its choosing), produces each record into it by index, and later
 * takes it back from fw_kafka_next_done() once every record has its outcome:
 * delivered, or failed with an error code (kept per record index). Delivery
 * reports are served by fw_kafka_poll() and fw_kafka_flush() on the
 * caller's thread; librdkafka's own threads never touch a batch.
 *
 * Ownership: fw_kafka owns every batch from fw_kafka_batch_new until
 * fw_kafka_next_done hands it back; the caller then frees it with
 * fw_kafka_batch_free. fw_kafka_close frees the batches it still owns.
 * Not thread-safe: one thread calls everything (the sibling's, under the
 * GIL or not).
 *
 * Error codes (a failed record's, fw_kafka_err_name) are librdkafka's:
 * negative for its own, positive for the broker's. Each function says what
 * it returns. */
#ifndef FW_KAFKA_H
#define FW_KAFKA_H

#include <stddef.h>
#include <stdint.h>

typedef struct fw_kafka fw_kafka;

/* One record's failure in a batch. */
typedef struct fw_kafka_err {
    uint32_t index;                       /* in the batch */
    int32_t code;                         /* librdkafka's error code */
} fw_kafka_err;

typedef struct fw_kafka_batch {
    uint64_t id;                          /* the caller's */
    uint32_t n;                           /* records */
    uint32_t left;                        /* records without an outcome yet */
    uint32_t nerr;                        /* failures so far, in errs */
    fw_kafka_err *errs;                   /* room for n, in the batch's own block */
    struct fw_kafka_batch *prev, *next;   /* in fw_kafka's open or done list */
    /* refs[i] == this batch: record i's per-message opaque is &refs[i], so a
     * delivery report finds its batch and its index without a lookup. */
    struct fw_kafka_batch *refs[];
} fw_kafka_batch;

/* A record to produce: pointers the caller keeps valid for the call only
 * (librdkafka copies them). */
typedef struct fw_kafka_rec {
    const char *topic;                    /* NUL-terminated */
    const void *key;                      /* NULL: no key */
    size_t key_len;
    const void *value;
    size_t value_len;
    int64_t ts_ms;                        /* the record's time, ms since the epoch */
} fw_kafka_rec;

/* A log line of librdkafka's (its log and error callbacks), kept for the
 * caller to log: syslog level (0-7), facility, text. */
typedef struct fw_kafka_log {
    int level;
    char fac[16];
    char text[240];
} fw_kafka_log;

#define FW_KAFKA_LOGS 64                  /* lines kept between two fw_kafka_next_log drains */

/* Load librdkafka from lib_path and make a producer with conf (name, value
 * pairs, NULL-terminated). On failure returns NULL and puts a one-line
 * reason into err. */
fw_kafka *fw_kafka_open(const char *lib_path, const char *const *conf, char *err, size_t errlen);

/* librdkafka's version string ("2.16.0"). */
const char *fw_kafka_version(const fw_kafka *k);

/* A new batch of n records (n >= 1) owned by k; NULL with errno ENOMEM. */
fw_kafka_batch *fw_kafka_batch_new(fw_kafka *k, uint64_t id, uint32_t n);

/* Produce record i of batch b. Returns 0 when librdkafka took it or refused
 * it for good (the refusal is the record's outcome), or
 * FW_KAFKA_QUEUE_FULL: librdkafka's queue is full; poll, then try the same
 * record again. */
int fw_kafka_produce(fw_kafka *k, fw_kafka_batch *b, uint32_t i, const fw_kafka_rec *r);
#define FW_KAFKA_QUEUE_FULL 1

/* Record i of batch b fails with code without being produced (the caller
 * could not produce it): it has its outcome. */
void fw_kafka_fail(fw_kafka *k, fw_kafka_batch *b, uint32_t i, int code);
#define FW_KAFKA_ERR_INVALID_ARG (-186)   /* RD_KAFKA_RESP_ERR__INVALID_ARG */

/* Serve delivery reports, logs and errors, waiting up to timeout_ms for the
 * first (blocks: call without the GIL); without waiting when a finished
 * batch is already there for fw_kafka_next_done. */
void fw_kafka_poll(fw_kafka *k, int timeout_ms);

/* Wait up to timeout_ms for every record to have its report (blocks);
 * returns how many records of the open batches are still without one. */
int fw_kafka_flush(fw_kafka *k, int timeout_ms);

/* Drop what librdkafka still holds, queued or in flight: each such record's
 * report comes with a purge error at the next poll. */
void fw_kafka_purge(fw_kafka *k);

/* The next batch whose every record has its outcome, in the order they
 * were finished; NULL if none. The caller owns it from now on. */
fw_kafka_batch *fw_kafka_next_done(fw_kafka *k);

void fw_kafka_batch_free(fw_kafka_batch *b);

/* The producer's fatal error (the idempotent producer cannot go on: it must
 * be replaced), written into buf; 0 if there is none. */
int fw_kafka_fatal(fw_kafka *k, char *buf, size_t len);

/* The next log line kept since the last drain (1), or 0 when none is left,
 * and then *dropped: the lines not kept for lack of room since the last
 * drain (FW_KAFKA_LOGS at most are kept between drains). */
int fw_kafka_next_log(fw_kafka *k, fw_kafka_log *out, unsigned *dropped);

const char *fw_kafka_err_name(const fw_kafka *k, int code);
const char *fw_kafka_err_text(const fw_kafka *k, int code);

/* Purge, serve the last reports, destroy the producer (blocks until its
 * threads end), free the batches still owned and unload the library. */
void fw_kafka_close(fw_kafka *k);

#endif
