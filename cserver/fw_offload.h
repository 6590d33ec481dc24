/* fw_offload: side-effect records (a topic, an optional key, a value) handed
 * from request threads to the offload sibling process.
 *
 * The queue is a ring in a file under --offload-dir (fw_ring.h) that every
 * worker and the sibling map shared: a record is framed straight into a
 * slot of it (one CAS to claim, a copy, one store to publish; no syscall),
 * and lives there, in the page cache, until the sibling has journaled it.
 * It survives the death of any process, every process at once included.
 *
 * When the ring is full (the sibling is behind, the sink is down) the
 * overflow policy decides: wait up to a bound, drop (counted), or spill to a
 * file of this worker's that the sibling collects. A record too large for
 * the ring (over half of it) always spills.
 *
 * The spill file is bounded: it holds at most spill_max bytes; past that a
 * record is dropped (counted). The sibling deletes a file it has collected
 * to the end, so the bound is on what waits uncollected. Both sides take
 * flock(LOCK_EX) on the file: the producer for each append, the sibling to
 * check that it has read everything before it unlinks. A producer that
 * finds its file unlinked (st_nlink 0) opens a new one under a new name
 * (a generation number), so the sibling's read offsets, kept by name, never
 * apply to a different file.
 *
 * Ring slot, journal and spill file format of one record (little-endian),
 * fw_offload_hdr then topic, key, value bytes:
 *   magic "FWO1", total length, flags (FW_OFL_KEY: a key is present),
 *   topic length, key length, value length, producer pid, sequence number
 *   (per producer), wall-clock time in ns.
 * The parser checks every length against the record's size. */
#ifndef FW_OFFLOAD_H
#define FW_OFFLOAD_H

#include "fw_ring.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define FW_OFL_MAGIC 0x314f5746u      /* "FWO1" little-endian */
#define FW_OFL_KEY 1u
#define FW_OFL_TOPIC_MAX 249          /* Kafka's limit for a topic name */

typedef struct fw_offload_hdr {
    uint32_t magic;
    uint32_t total;                   /* header + topic + key + value */
    uint32_t flags;
    uint32_t topic_len;
    uint32_t key_len;
    uint32_t value_len;
    uint32_t pid;
    uint32_t seq;
    uint64_t ts_ns;
} fw_offload_hdr;

_Static_assert(sizeof(fw_offload_hdr) == 40, "packed record header");

/* A parsed record: pointers into the caller's buffer. */
typedef struct fw_offload_rec {
    fw_offload_hdr h;
    const char *topic, *key, *value;  /* key NULL when absent */
} fw_offload_rec;

enum fw_ofl_overflow { FW_OFL_BLOCK = 0, FW_OFL_DROP = 1, FW_OFL_SPILL = 2 };

/* Counters of one producer process, in shared memory so the master and the
 * sibling can read them (writer: that process). */
typedef struct fw_offload_counters {
    _Atomic uint64_t queued;          /* records handed to the queue */
    _Atomic uint64_t spilled;         /* records written to the spill file */
    _Atomic uint64_t dropped;         /* records lost by policy (counted, logged) */
    _Atomic uint64_t blocked_ns;      /* time spent waiting for room (block policy) */
    _Atomic uint64_t bytes;
    uint64_t pad[3];
} fw_offload_counters;

/* One producer (a worker process); shared by its threads. The ring's
 * mapping is owned (made by fw_offload_init from the caller's fd). */
typedef struct fw_offload {
    fw_ring ring;                     /* the queue */
    int overflow;                     /* fw_ofl_overflow */
    int block_ms;                     /* longest wait for room (block, and spill's own wait) */
    size_t max_record;                /* larger records are refused */
    size_t ring_max;                  /* larger records go to the spill file */
    char spill_dir[200];              /* where spill files go */
    char spill_path[256];             /* this producer's spill file: spill-<pid>[-<gen>].fwo */
    unsigned spill_gen;               /* names passed: deleted under it (by the sibling), or taken */
    int spill_fd;                     /* opened on first use, -1 before */
    uint64_t spill_max;               /* bytes the file may hold uncollected; past it records drop */
    pthread_mutex_t spill_mu;         /* spill writes are whole records */
    _Atomic uint32_t seq;
    uint32_t pid;
    fw_offload_counters *ctr;         /* shared memory, or own_ctr */
    fw_offload_counters own_ctr;
} fw_offload;

enum {
    FW_OFL_OK = 0,          /* queued */
    FW_OFL_SPILLED = 1,     /* written to the spill file */
    FW_OFL_DROPPED = 2,     /* lost by policy, counted; errno says why: EAGAIN (no room in the
                               queue), EFBIG (the spill file is at spill_max), or the spill
                               file's own error (ENOSPC, EIO, ...) */
    FW_OFL_EINVAL = -1,     /* bad arguments (nothing was written) */
    FW_OFL_ETOOBIG = -2,    /* over max_record (nothing was written) */
    FW_OFL_EIO = -3,        /* internal: a spill that failed (errno set); fw_offload_send drops then */
    FW_OFL_AGAIN = -4       /* nowait: the record needs the slow way (nothing was written) */
};

/* The counters as plain numbers, each loaded atomically (for readers in
 * other processes: the master, offload_stats()). */
typedef struct fw_offload_totals {
    uint64_t queued, spilled, dropped, blocked_ns, bytes;
} fw_offload_totals;
void fw_offload_counters_read(const fw_offload_counters *c, fw_offload_totals *out);

/* ring_fd: the ring file (fw_ring_prepare'd by the master), mapped here.
 * Returns 0, or -1 with errno set. */
int fw_offload_init(fw_offload *o, int ring_fd, int overflow, int block_ms, size_t max_record,
                    const char *spill_dir, uint64_t spill_max, fw_offload_counters *shared);
void fw_offload_destroy(fw_offload *o);

/* A valid Kafka topic name: 1..249 of [A-Za-z0-9._-], not "." or "..". */
int fw_offload_topic_ok(const char *topic, size_t len);

/* Frame and hand over one record. Never blocks longer than block_ms; call
 * without holding an interpreter lock unless nowait. key NULL: no key.
 * nowait: only try the ring (a memcpy and a few atomics: fine under a
 * lock); FW_OFL_AGAIN, with nothing written or counted, when the record
 * needs the slow way (no room, too big for the ring, a damaged ring):
 * call again without nowait and without the lock. */
int fw_offload_send(fw_offload *o, const char *topic, size_t tlen, const char *key, size_t klen,
                    const char *value, size_t vlen, int nowait);

/* The sibling's side: its reading position in the ring, and the busy slot
 * it waits at (a producer writing, or one killed mid-write). The ring's
 * mapping is owned. */
typedef struct fw_ofl_reader {
    fw_ring ring;
    uint64_t pos;                     /* the next slot to read */
    uint64_t busy_pos;                /* a busy slot seen at busy_pos ... */
    uint64_t busy_seen;               /* ... first at this CLOCK_BOOTTIME ns */
    uint64_t holes;                   /* slots of producers that died mid-write, skipped */
    uint64_t bad;                     /* damaged slots or records, skipped */
} fw_ofl_reader;

/* Map the ring file (the sibling opens it itself), finish a release a
 * killed predecessor began, and start reading at tail. 0 or -errno. */
int fw_ofl_reader_open(fw_ofl_reader *rd, int ring_fd);
void fw_ofl_reader_close(fw_ofl_reader *rd);

/* The next record at or after *at (a position from rd->pos on: the caller
 * may read ahead of what it frees). Skips padding, holes of dead producers
 * and damage (counted). Returns 1 (the record in rec, pointing into the
 * ring; *at after it), or 0 (nothing complete at *at yet). */
int fw_ofl_reader_next(fw_ofl_reader *rd, uint64_t *at, fw_offload_rec *rec);

/* Append n records (pointing into the ring) to the journal in as few
 * writes as it takes, all or none: a write that fails (ENOSPC, EIO) is
 * taken back (the file is cut to where it was). 0, or -1 with errno set. */
int fw_offload_journal_append(int journal_fd, const fw_offload_rec *recs, size_t n);

/* Give the disk blocks of a journal segment's first `upto` bytes back to
 * the file system (delivered records: fallocate's PUNCH_HOLE, the size and
 * offsets stay). Returns 0, or -errno (-EOPNOTSUPP: the file system
 * cannot; the segment is then deleted whole once delivered). */
int fw_offload_forget(int journal_fd, uint64_t upto);

/* Parse the record at buf (n bytes available). Returns its total length, 0
 * if more bytes are needed (a record split across reads of a file; once the
 * header is there, rec->h.total says how many), or -1 if the bytes are not
 * a record. */
long fw_offload_parse(const char *buf, size_t n, fw_offload_rec *rec);

#endif
