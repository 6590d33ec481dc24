/* fw_stats: one worker's counters and latency histograms, in memory the
 * master shares with it (one FW_STATS_SIZE block per worker slot).
 *
 * Written on the request path with no lock and no syscall: the fields of
 * the loop thread have one writer (a relaxed load and store), those of the
 * app threads are relaxed atomic adds. The master reads them at any time
 * (fw_stats_read); a reader may see one request's fields half updated,
 * never a torn value. The block is owned by whoever maps it (the master);
 * the worker only writes into it. */
#ifndef FW_STATS_H
#define FW_STATS_H

#include <stdatomic.h>
#include <stdint.h>

/* Histogram buckets by upper bound in microseconds, the last one open:
 * 0.1 ms to 30 s, fine enough below a millisecond for a p99 there. */
#define FW_STATS_NBUCKETS 18
/* Responses are also counted by status code, 100 to 599 (gunicorn's statsd
 * metrics name each code; python/forkwsgi/statsd.py). */
#define FW_STATS_CODE_MIN 100
#define FW_STATS_CODES 500
#define FW_STATS_SIZE 4608

typedef struct fw_stats {
    /* Loop thread. */
    _Atomic uint64_t requests;                 /* responses completed */
    _Atomic uint64_t bytes_out;                /* response body bytes */
    _Atomic uint64_t status[6];                /* [1..5]: 1xx..5xx, [0]: anything else */
    _Atomic uint64_t total_us;                 /* sum of request durations (head parsed to
                                                * response on the wire, or queued in a
                                                * pipelined batch: fw_conn.h) */
    _Atomic uint64_t total_hist[FW_STATS_NBUCKETS];
    _Atomic uint64_t conns_open;               /* gauge */
    _Atomic uint64_t conns_idle;               /* gauge: kept alive, waiting for a next request */
    /* App threads. */
    _Atomic uint64_t app_calls;                /* calls into the app (a request may make two) */
    _Atomic uint64_t app_us;                   /* time inside them */
    _Atomic uint64_t app_hist[FW_STATS_NBUCKETS];
    _Atomic uint64_t exceptions;               /* the app raised, or returned no valid response */
    /* Loop thread, after the rest: responses by status code, [code - 100]
     * for 100..599 (others are in status[0] only). */
    _Atomic uint64_t codes[FW_STATS_CODES];
} fw_stats;

_Static_assert(sizeof(fw_stats) <= FW_STATS_SIZE, "fw_stats outgrew its block");
_Static_assert(FW_STATS_NBUCKETS == 18, "src/_forkwsgi.pyx declares the histograms with 18 buckets");
_Static_assert(FW_STATS_CODES == 500, "src/_forkwsgi.pyx declares the status codes as 500 counts");

/* A plain copy for readers. */
typedef struct fw_stats_view {
    uint64_t requests, bytes_out, status[6], total_us, total_hist[FW_STATS_NBUCKETS], conns_open, conns_idle;
    uint64_t app_calls, app_us, app_hist[FW_STATS_NBUCKETS], exceptions;
    uint64_t codes[FW_STATS_CODES];
} fw_stats_view;

/* The bucket of a duration (0 .. FW_STATS_NBUCKETS-1). */
int fw_stats_bucket(uint64_t us);
/* Upper bound of bucket i in microseconds; UINT64_MAX for the last. */
uint64_t fw_stats_bound_us(int i);

/* Loop thread: a response is on the wire (or, pipelined, queued in a batch). */
void fw_stats_request_done(fw_stats *s, int status, uint64_t body_bytes, uint64_t us);
/* Loop thread: connections open now, and of them kept alive and idle. */
void fw_stats_conns(fw_stats *s, uint64_t open, uint64_t idle);
/* App threads: one call into the app took us. one_writer: this thread is
 * the only one that calls it (the app runs inline on the loop thread), so a
 * plain load and store do instead of locked adds. */
void fw_stats_app_call(fw_stats *s, uint64_t us, int one_writer);
/* App threads: the app raised, or returned no valid response. */
void fw_stats_exception(fw_stats *s);

void fw_stats_read(const fw_stats *s, fw_stats_view *out);

#endif
