/* fw_offload: side-effect records (a topic, an optional key, a value) handed
 * from request threads to the offload sibling process.
 *
 * The queue is one AF_UNIX SOCK_SEQPACKET socket pair made by the master
 * before it forks: every worker sends on one end, the sibling reads the
 * other. It is a pipe that keeps record boundaries: each record is one
 * sendmsg(), delivered whole, never split and never interleaved with other
 * writers' records (a pipe only guarantees that up to PIPE_BUF bytes), and a
 * full queue answers EAGAIN instead of blocking. The master keeps both ends
 * open, so records queued there outlive any worker or sibling that dies.
 *
 * When the queue is full (the sibling is behind, the sink is down) the
 * overflow policy decides: wait up to a bound, drop (counted), or spill to a
 * file of this worker's that the sibling collects. A record too large for
 * the socket always spills.
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
 * Wire and file format of one record (little-endian), fw_offload_hdr then
 * topic, key, value bytes:
 *   magic "FWO1", total length, flags (FW_OFL_KEY: a key is present),
 *   topic length, key length, value length, producer pid, sequence number
 *   (per producer), wall-clock time in ns.
 * The parser checks every length against the record's size. */
#ifndef FW_OFFLOAD_H
#define FW_OFFLOAD_H

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

/* One producer (a worker process); shared by its threads. fds not owned. */
typedef struct fw_offload {
    int sock;                         /* sending end of the queue */
    int overflow;                     /* fw_ofl_overflow */
    int block_ms;                     /* longest wait for room (block, and spill's own wait) */
    size_t max_record;                /* larger records are refused */
    size_t sock_max;                  /* larger records go to the spill file */
    char spill_dir[200];              /* where spill files go */
    char spill_path[256];             /* this producer's spill file: spill-<pid>[-<gen>].fwo */
    unsigned spill_gen;               /* files this producer had deleted under it (by the sibling) */
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
    FW_OFL_EIO = -3         /* internal: a spill that failed (errno set); fw_offload_send drops then */
};

/* The counters as plain numbers, each loaded atomically (for readers in
 * other processes: the master, offload_stats()). */
typedef struct fw_offload_totals {
    uint64_t queued, spilled, dropped, blocked_ns, bytes;
} fw_offload_totals;
void fw_offload_counters_read(const fw_offload_counters *c, fw_offload_totals *out);

int fw_offload_init(fw_offload *o, int sock, int overflow, int block_ms, size_t max_record,
                    const char *spill_dir, uint64_t spill_max, fw_offload_counters *shared);
void fw_offload_destroy(fw_offload *o);

/* A valid Kafka topic name: 1..249 of [A-Za-z0-9._-], not "." or "..". */
int fw_offload_topic_ok(const char *topic, size_t len);

/* Frame and hand over one record. Never blocks longer than block_ms; call
 * without holding an interpreter lock. key NULL: no key. */
int fw_offload_send(fw_offload *o, const char *topic, size_t tlen, const char *key, size_t klen,
                    const char *value, size_t vlen);

/* The sibling's side: move the record at the head of the queue into the
 * journal. It is peeked into buf (cap bytes, the caller's), appended whole
 * to journal_fd, and only then taken off the queue, so a sibling killed at
 * any point loses nothing. A record whose producer pid and sequence equal
 * skip[0], skip[1] (skip not NULL) is not appended again: the predecessor
 * journaled it and died before taking it off. *fresh says which (1: not
 * such a repeat). journal_fd -1: take records off without journaling them
 * (a stop on a full disk: sent straight to the sink, or lost with the
 * queue). A journal write that fails (ENOSPC, EIO) is taken back (the file
 * is truncated to where it was) and the record stays queued.
 * Returns the record's length (the record is in buf), or
 * FW_OFL_TAKE_EMPTY (nothing queued), FW_OFL_TAKE_EOF (every sending end
 * is closed), FW_OFL_TAKE_BAD (not a record: taken off and dropped), or
 * FW_OFL_TAKE_ERR (errno set; nothing was taken off). */
enum { FW_OFL_TAKE_EMPTY = 0, FW_OFL_TAKE_EOF = -1, FW_OFL_TAKE_BAD = -2, FW_OFL_TAKE_ERR = -3 };
long fw_offload_take(int sock, int journal_fd, char *buf, size_t cap, const uint32_t *skip, int *fresh);

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
