/* fw_stats: per-worker counters in shared memory. See fw_stats.h. */
#include "fw_stats.h"

static const uint64_t bounds_us[FW_STATS_NBUCKETS - 1] = {
    100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000, 30000000,
};

int fw_stats_bucket(uint64_t us)
{
    int i = 0;
    while (i < FW_STATS_NBUCKETS - 1 && us > bounds_us[i])
        i++;
    return i;
}

uint64_t fw_stats_bound_us(int i)
{
    return i >= 0 && i < FW_STATS_NBUCKETS - 1 ? bounds_us[i] : UINT64_MAX;
}

/* One writer: no locked instruction needed, only no torn value. */
static inline void bump(_Atomic uint64_t *v, uint64_t by)
{
    atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + by, memory_order_relaxed);
}

void fw_stats_request_done(fw_stats *s, int status, uint64_t body_bytes, uint64_t us)
{
    bump(&s->requests, 1);
    bump(&s->bytes_out, body_bytes);
    bump(&s->status[status >= 100 && status < 600 ? status / 100 : 0], 1);
    if (status >= FW_STATS_CODE_MIN && status < FW_STATS_CODE_MIN + FW_STATS_CODES)
        bump(&s->codes[status - FW_STATS_CODE_MIN], 1);
    bump(&s->total_us, us);
    bump(&s->total_hist[fw_stats_bucket(us)], 1);
}

void fw_stats_conns(fw_stats *s, uint64_t open, uint64_t idle)
{
    atomic_store_explicit(&s->conns_open, open, memory_order_relaxed);
    atomic_store_explicit(&s->conns_idle, idle, memory_order_relaxed);
}

void fw_stats_app_call(fw_stats *s, uint64_t us, int one_writer)
{
    if (one_writer) {
        bump(&s->app_calls, 1);
        bump(&s->app_us, us);
        bump(&s->app_hist[fw_stats_bucket(us)], 1);
        return;
    }
    atomic_fetch_add_explicit(&s->app_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->app_us, us, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->app_hist[fw_stats_bucket(us)], 1, memory_order_relaxed);
}

void fw_stats_exception(fw_stats *s)
{
    atomic_fetch_add_explicit(&s->exceptions, 1, memory_order_relaxed);
}

void fw_stats_read(const fw_stats *s, fw_stats_view *out)
{
    out->requests = atomic_load(&s->requests);
    out->bytes_out = atomic_load(&s->bytes_out);
    for (int i = 0; i < 6; i++)
        out->status[i] = atomic_load(&s->status[i]);
    out->total_us = atomic_load(&s->total_us);
    out->conns_open = atomic_load(&s->conns_open);
    out->conns_idle = atomic_load(&s->conns_idle);
    out->app_calls = atomic_load(&s->app_calls);
    out->app_us = atomic_load(&s->app_us);
    out->exceptions = atomic_load(&s->exceptions);
    for (int i = 0; i < FW_STATS_NBUCKETS; i++) {
        out->total_hist[i] = atomic_load(&s->total_hist[i]);
        out->app_hist[i] = atomic_load(&s->app_hist[i]);
    }
    for (int i = 0; i < FW_STATS_CODES; i++)
        out->codes[i] = atomic_load_explicit(&s->codes[i], memory_order_relaxed);
}
