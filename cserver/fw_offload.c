/* fw_offload: framing and handing over records. See fw_offload.h. */
#define _GNU_SOURCE
#include "fw_offload.h"
#include "fw_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* spill_path for the current generation: spill-<pid>.fwo, then
 * spill-<pid>-<gen>.fwo. Returns 0, or -1 if it does not fit. */
static int spill_name(fw_offload *o)
{
    int n = o->spill_gen == 0
                ? snprintf(o->spill_path, sizeof(o->spill_path), "%s/spill-%u.fwo", o->spill_dir, o->pid)
                : snprintf(o->spill_path, sizeof(o->spill_path), "%s/spill-%u-%u.fwo", o->spill_dir, o->pid,
                           o->spill_gen);
    return n < 0 || (size_t)n >= sizeof(o->spill_path) ? -1 : 0;
}

int fw_offload_init(fw_offload *o, int ring_fd, int overflow, int block_ms, size_t max_record,
                    const char *spill_dir, uint64_t spill_max, fw_offload_counters *shared)
{
    memset(o, 0, sizeof(*o));
    o->overflow = overflow;
    o->block_ms = block_ms > 0 ? block_ms : 0;
    o->max_record = max_record;
    o->spill_fd = -1;
    o->spill_max = spill_max;
    o->pid = (uint32_t)getpid();
    o->ctr = shared ? shared : &o->own_ctr;
    int rc = fw_ring_map(&o->ring, ring_fd);
    if (rc != 0) {
        errno = -rc;
        return -1;
    }
    o->ring_max = fw_ring_max_record(&o->ring);
    int n = snprintf(o->spill_dir, sizeof(o->spill_dir), "%s", spill_dir && *spill_dir ? spill_dir : "/tmp");
    if (n < 0 || (size_t)n >= sizeof(o->spill_dir) || spill_name(o) != 0) {
        fw_ring_unmap(&o->ring);
        errno = ENAMETOOLONG;
        return -1;
    }
    if (pthread_mutex_init(&o->spill_mu, NULL) != 0) {
        int e = errno;
        fw_ring_unmap(&o->ring);
        errno = e;
        return -1;
    }
    return 0;
}

void fw_offload_destroy(fw_offload *o)
{
    if (o->spill_fd >= 0)
        close(o->spill_fd);
    o->spill_fd = -1;
    pthread_mutex_destroy(&o->spill_mu);
    fw_ring_unmap(&o->ring);
}

void fw_offload_counters_read(const fw_offload_counters *c, fw_offload_totals *out)
{
    fw_offload_counters *w = (fw_offload_counters *)c;     /* atomic_load takes a non-const pointer */
    out->queued = atomic_load(&w->queued);
    out->spilled = atomic_load(&w->spilled);
    out->dropped = atomic_load(&w->dropped);
    out->blocked_ns = atomic_load(&w->blocked_ns);
    out->bytes = atomic_load(&w->bytes);
}

int fw_offload_topic_ok(const char *t, size_t n)
{
    if (n == 0 || n > FW_OFL_TOPIC_MAX || (n == 1 && t[0] == '.') ||
        (n == 2 && t[0] == '.' && t[1] == '.'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Leave the current spill file (closed: the sibling collects and deletes
 * it) for the next name. Returns 0, or -1 (ENAMETOOLONG). */
static int spill_next(fw_offload *o)
{
    if (o->spill_fd >= 0)
        close(o->spill_fd);
    o->spill_fd = -1;
    o->spill_gen++;
    if (spill_name(o) != 0) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

static int lock_file(int fd, int op)
{
    while (flock(fd, op) != 0) {
        if (errno != EINTR)
            return -1;
    }
    return 0;
}

/* Make a spill file of this process's own, under the first free name from
 * spill_path on. Never one that exists: it would be a previous process's
 * with the same pid (a reused pid, or the same pids in a restarted
 * container), and if that one was killed while appending, it ends in half
 * a record; a record appended behind it would be read as that one's rest
 * and the records after it as damage. The sibling collects and deletes
 * such a file on its own. Returns the fd, or -1 (errno set). */
static int spill_create(fw_offload *o)
{
    for (;;) {          /* each pass a new name: ends at the first one not in the directory */
        int fd = open(o->spill_path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
        if (spill_next(o) != 0)
            return -1;
    }
}

/* This producer's spill file, open and locked, with its size in *size; -1
 * (errno set) if it cannot be had. The sibling may have unlinked the file
 * after collecting all of it: then a new one is made. Called under spill_mu. */
static int spill_open_locked(fw_offload *o, off_t *size)
{
    for (int tries = 0; tries < 3; tries++) {
        if (o->spill_fd < 0)
            o->spill_fd = spill_create(o);
        if (o->spill_fd < 0 || lock_file(o->spill_fd, LOCK_EX) != 0)
            return -1;
        struct stat st;
        if (fstat(o->spill_fd, &st) != 0) {
            int e = errno;
            lock_file(o->spill_fd, LOCK_UN);
            errno = e;
            return -1;
        }
        if (st.st_nlink > 0) {
            *size = st.st_size;
            return 0;
        }
        if (spill_next(o) != 0)      /* collected and unlinked: start a new file */
            return -1;
    }
    errno = ESTALE;
    return -1;
}

/* Append the whole record to this process's spill file, or nothing. Returns
 * FW_OFL_SPILLED, or FW_OFL_EIO with errno set (EFBIG: the file is at
 * spill_max). */
static int spill(fw_offload *o, const struct iovec *iov, int iovcnt, size_t total)
{
    int rc = FW_OFL_SPILLED, torn = 0;
    pthread_mutex_lock(&o->spill_mu);
    off_t start;
    if (spill_open_locked(o, &start) != 0) {
        rc = FW_OFL_EIO;
        goto out;
    }
    if ((uint64_t)start + total > o->spill_max) {
        errno = EFBIG;
        rc = FW_OFL_EIO;
        goto unlock;
    }
    struct iovec v[4];
    memcpy(v, iov, (size_t)iovcnt * sizeof(*v));
    if (fw_writev_all(o->spill_fd, v, iovcnt, total) != 0) {
        /* Disk full or worse: take the half record back, so the file
         * stays a sequence of whole records. If that fails too, nothing
         * may follow the half record (the sibling would read the next
         * record's first bytes as its rest, and the rest as damage): the
         * next record goes to a new file, and the sibling deletes this one
         * after its whole records. */
        int e = errno;
        torn = ftruncate(o->spill_fd, start) != 0;
        errno = e;                   /* the write's error says why (ENOSPC) */
        rc = FW_OFL_EIO;
    }
unlock:;
    int e = errno;
    lock_file(o->spill_fd, LOCK_UN);
    if (torn)
        spill_next(o);               /* closed even if no name is left: nothing follows the half record */
    errno = e;
out:
    pthread_mutex_unlock(&o->spill_mu);
    if (rc == FW_OFL_SPILLED)
        atomic_fetch_add(&o->ctr->spilled, 1);
    return rc;
}

/* Copy the record into a slot of the ring and publish it. Returns 0, or
 * -EAGAIN (no room now), -EMSGSIZE (too large for the ring), -EIO (the ring
 * file is damaged). */
static int try_ring(fw_offload *o, const struct iovec *iov, int iovcnt, size_t total)
{
    unsigned char *dst;
    int64_t pos = fw_ring_claim(&o->ring, total, o->pid, &dst);
    if (pos < 0)
        return (int)pos;
    for (int i = 0; i < iovcnt; i++) {
        memcpy(dst, iov[i].iov_base, iov[i].iov_len);
        dst += iov[i].iov_len;
    }
    fw_ring_commit(&o->ring, pos);
    return 0;
}

/* Block policy: wait for room, never longer than block_ms in all. The
 * sibling frees room without telling anyone, so look every 200 us.
 * Returns 0 if queued, else the last try's answer. */
static int ring_within(fw_offload *o, const struct iovec *iov, int iovcnt, size_t total)
{
    uint64_t start = now_ns(CLOCK_MONOTONIC), limit = (uint64_t)o->block_ms * 1000000u;
    int rc = -EAGAIN;
    while (now_ns(CLOCK_MONOTONIC) - start < limit) {
        struct timespec pause = { 0, 200000 };
        nanosleep(&pause, NULL);
        rc = try_ring(o, iov, iovcnt, total);
        if (rc != -EAGAIN)
            break;
    }
    atomic_fetch_add(&o->ctr->blocked_ns, now_ns(CLOCK_MONOTONIC) - start);
    return rc;
}

int fw_offload_send(fw_offload *o, const char *topic, size_t tlen, const char *key, size_t klen,
                    const char *value, size_t vlen, int nowait)
{
    if (!fw_offload_topic_ok(topic, tlen) || (!key && klen) || (!value && vlen))
        return FW_OFL_EINVAL;
    size_t total = sizeof(fw_offload_hdr) + tlen + klen + vlen;
    if (klen > UINT32_MAX || vlen > UINT32_MAX || total > o->max_record || total > UINT32_MAX)
        return FW_OFL_ETOOBIG;
    fw_offload_hdr h = {
        .magic = FW_OFL_MAGIC, .total = (uint32_t)total, .flags = key ? FW_OFL_KEY : 0,
        .topic_len = (uint32_t)tlen, .key_len = (uint32_t)klen, .value_len = (uint32_t)vlen,
        .pid = o->pid, .seq = atomic_fetch_add(&o->seq, 1), .ts_ns = now_ns(CLOCK_REALTIME),
    };
    struct iovec iov[4] = {
        { .iov_base = &h, .iov_len = sizeof(h) },
        { .iov_base = (void *)topic, .iov_len = tlen },
        { .iov_base = (void *)(key ? key : ""), .iov_len = klen },
        { .iov_base = (void *)(value ? value : ""), .iov_len = vlen },
    };
    /* A spill that fails (the file is at spill_max, the disk is full) is a
     * counted drop: offload() never raises for what happens after the call. */
    int rc = total > o->ring_max ? -EMSGSIZE : try_ring(o, iov, 4, total);
    if (rc == 0)
        goto queued;
    if (nowait)
        return FW_OFL_AGAIN;       /* the caller comes back without its lock (a new seq: gaps are fine) */
    if (rc != -EAGAIN) {
        /* Too big for the ring, or a damaged ring file: keep it on disk. */
        if (spill(o, iov, 4, total) == FW_OFL_SPILLED)
            return FW_OFL_SPILLED;
        goto drop;
    }
    if (o->overflow == FW_OFL_DROP) {
        errno = EAGAIN;
        goto drop;
    }
    if (o->overflow == FW_OFL_SPILL) {
        if (spill(o, iov, 4, total) == FW_OFL_SPILLED)
            return FW_OFL_SPILLED;
        goto drop;
    }
    rc = ring_within(o, iov, 4, total);
    if (rc != 0) {
        errno = -rc;
        goto drop;
    }
queued:
    atomic_fetch_add(&o->ctr->queued, 1);
    atomic_fetch_add(&o->ctr->bytes, total);
    return FW_OFL_OK;
drop:
    atomic_fetch_add(&o->ctr->dropped, 1);
    return FW_OFL_DROPPED;
}

int fw_ofl_reader_open(fw_ofl_reader *rd, int ring_fd)
{
    memset(rd, 0, sizeof(*rd));
    int rc = fw_ring_map(&rd->ring, ring_fd);
    if (rc != 0)
        return rc;
    rd->pos = fw_ring_recover(&rd->ring);
    rd->busy_pos = UINT64_MAX;
    return 0;
}

void fw_ofl_reader_close(fw_ofl_reader *rd)
{
    fw_ring_unmap(&rd->ring);
}

int fw_ofl_reader_next(fw_ofl_reader *rd, uint64_t *at, fw_offload_rec *rec)
{
    for (;;) {
        fw_ring_slot s;
        if (fw_ring_peek(&rd->ring, *at, &s) != 0) {
            rd->bad++;
            *at = fw_ring_resync(&rd->ring, *at);
            continue;
        }
        switch (s.kind) {
        case FW_RING_FREE:
            return 0;
        case FW_RING_PAD:
            *at = s.next;
            continue;
        case FW_RING_BUSY:
            /* Being written, or its producer died mid-write: a hole once
             * that process is gone (the next look after the first). */
            if (rd->busy_pos != *at) {
                rd->busy_pos = *at;
                rd->busy_seen = now_ns(CLOCK_BOOTTIME);
                return 0;
            }
            if (!fw_ring_producer_gone(s.pid, rd->busy_seen))
                return 0;
            rd->holes++;
            *at = s.next;
            continue;
        default:
            break;
        }
        *at = s.next;
        long n = fw_offload_parse((const char *)s.data, s.len, rec);
        if (n <= 0 || s.len - (size_t)n >= 8) {
            rd->bad++;                          /* not the record its slot was made for */
            continue;
        }
        return 1;
    }
}

int fw_offload_journal_append(int journal_fd, const fw_offload_rec *recs, size_t n)
{
    if (n == 0)
        return 0;
    off_t start = lseek(journal_fd, 0, SEEK_END);
    if (start < 0)
        return -1;
    struct iovec v[64];
    size_t i = 0;
    while (i < n) {
        int cnt = 0;
        size_t want = 0;
        for (; i < n && cnt < 64; i++, cnt++) {
            v[cnt].iov_base = (void *)(recs[i].topic - sizeof(fw_offload_hdr));
            v[cnt].iov_len = recs[i].h.total;
            want += recs[i].h.total;
        }
        if (fw_writev_all(journal_fd, v, cnt, want) != 0) {
            int e = errno;                      /* take the half batch back: records stay in the ring */
            if (ftruncate(journal_fd, start) != 0)
                e = errno;
            errno = e;
            return -1;
        }
    }
    return 0;
}

int fw_offload_forget(int journal_fd, uint64_t upto)
{
    upto &= ~(uint64_t)4095;                 /* whole pages only: a partial one would be zeroed, not freed */
    if (upto == 0)
        return 0;
    if (fallocate(journal_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)upto) != 0)
        return -errno;
    return 0;
}

long fw_offload_parse(const char *buf, size_t n, fw_offload_rec *rec)
{
    if (n < sizeof(fw_offload_hdr))
        return 0;
    memcpy(&rec->h, buf, sizeof(rec->h));
    const fw_offload_hdr *h = &rec->h;
    uint64_t want = (uint64_t)sizeof(*h) + h->topic_len + (uint64_t)h->key_len + h->value_len;
    if (h->magic != FW_OFL_MAGIC || h->total != want || (h->flags & ~FW_OFL_KEY) ||
        (!(h->flags & FW_OFL_KEY) && h->key_len) || h->topic_len == 0 ||
        h->topic_len > FW_OFL_TOPIC_MAX)
        return -1;
    if (n < h->total)
        return 0;                /* rec->h.total says how much is needed */
    rec->topic = buf + sizeof(*h);
    if (!fw_offload_topic_ok(rec->topic, h->topic_len))
        return -1;
    rec->key = (h->flags & FW_OFL_KEY) ? rec->topic + h->topic_len : NULL;
    rec->value = rec->topic + h->topic_len + h->key_len;
    return (long)h->total;
}
