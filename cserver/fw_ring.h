/* fw_ring: the offload queue as a ring in a file that every worker and the
 * sibling map shared. A record written there lives in the page cache, not in
 * a process, so it survives the death of every forkwsgi process at once
 * (only a machine crash loses what is not yet on disk).
 *
 * Many producers (the threads of every worker), one consumer (the sibling).
 * A producer claims a slot with one compare-and-swap on the slot's header
 * word, copies the record in, and publishes it with one store: no lock, no
 * syscall (unless the consumer sleeps and must be woken).
 *
 * Positions are byte counts since the ring was made (64 bits: they never
 * wrap); a position's place in the data area is pos & (capacity - 1), its
 * lap is pos / capacity. Slots are 8-byte aligned: an 8-byte header word,
 * then the record (a framed fw_offload record), padded to 8 bytes. A slot
 * never crosses the end of the data area: a producer that would cross it
 * first claims the rest of the lap as padding.
 *
 * The header word (little-endian uint64) says, in its low 2 bits:
 *   FREE  the slot is unclaimed in lap (word >> 2). The consumer marks every
 *         word it frees as FREE for the lap in which that place comes round
 *         again, so a word is claimable only by a producer in that lap (no
 *         ABA), and a file of zeros is an empty ring in lap 0.
 *   BUSY  claimed, being written: bits 2..31 the slot's length in 8-byte
 *         units, bits 32..63 the producer's pid. A producer killed here
 *         leaves a hole the consumer skips once that pid is gone.
 *   DONE  as BUSY, and the record is complete (a release store).
 *   PAD   as BUSY: the rest of a lap, skipped.
 *
 * Invariants: the consumer frees only what it has read (positions below
 * tail are free); a producer claims only below tail + capacity; every slot
 * boundary between tail and head is claimed (head is advanced only after a
 * claim).
 *
 * The consumer frees in two steps, so a consumer killed in the middle leaves
 * no half-freed region: it stores the target in `freeing`, marks the words,
 * then stores `tail`. fw_ring_recover finishes a release that was cut off.
 *
 * Owners: the mapping belongs to the fw_ring that made it (fw_ring_map /
 * fw_ring_unmap); the file descriptor stays the caller's. */
#ifndef FW_RING_H
#define FW_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FW_RING_MAGIC 0x31525746u          /* "FWR1" little-endian */
#define FW_RING_VERSION 1u
#define FW_RING_META 4096u                 /* bytes before the data area */
#define FW_RING_MIN (64u << 10)            /* smallest data area */
#define FW_RING_MAX (1ull << 32)           /* largest data area */

enum { FW_RING_FREE = 0, FW_RING_BUSY = 1, FW_RING_DONE = 2, FW_RING_PAD = 3 };

/* The first page of the file. Each field a producer or the consumer writes
 * often has a cache line of its own. */
typedef struct fw_ring_meta {
    uint32_t magic;
    uint32_t version;
    uint64_t capacity;                     /* bytes of the data area: a power of two */
    uint64_t created_ns;                   /* wall-clock time the file was made */
    uint8_t pad0[40];
    _Atomic uint64_t head;                 /* producers: a slot boundary at or before the first unclaimed byte */
    uint8_t pad1[56];
    _Atomic uint64_t tail;                 /* consumer: every byte before it is free */
    _Atomic uint64_t freeing;              /* consumer: a release in progress up to here (>= tail) */
    uint8_t pad2[48];
    _Atomic uint32_t sleeping;             /* futex word: 1 while the consumer sleeps and wants a wake-up */
    uint32_t pad3;
    _Atomic uint64_t wakes;                /* wake-ups producers made (each one futex syscall) */
    uint8_t pad4[48];
} fw_ring_meta;

_Static_assert(sizeof(fw_ring_meta) == 256, "ring meta layout");

/* One process's view of a ring file. */
typedef struct fw_ring {
    fw_ring_meta *meta;                    /* start of the mapping (owned) */
    unsigned char *data;                   /* the data area, inside the mapping */
    uint64_t cap, mask;
    unsigned shift;                        /* log2(cap) */
    size_t map_len;
} fw_ring;

/* What the consumer finds at a position (fw_ring_peek). */
typedef struct fw_ring_slot {
    int kind;                              /* FW_RING_FREE (nothing yet), BUSY, DONE, PAD */
    uint64_t next;                         /* position after the slot (BUSY, DONE, PAD) */
    uint32_t pid;                          /* producer (BUSY, DONE) */
    const unsigned char *data;             /* DONE: the record, len bytes (padding included) */
    size_t len;
} fw_ring_slot;

/* Make the ring file (fd: empty, open read-write) with a data area of
 * `capacity` bytes (rounded up to a power of two within MIN..MAX), or check
 * one that exists. An existing ring keeps its capacity: *capacity is set to
 * it. Returns 0, -EINVAL (not a ring file, or a damaged header), or -errno. */
int fw_ring_prepare(int fd, uint64_t *capacity);

/* The data area a new ring gets for `want` bytes: the next power of two
 * within MIN..MAX. */
uint64_t fw_ring_capacity(uint64_t want);

/* Map a prepared ring file. Returns 0 or -errno (-EINVAL: not a ring). */
int fw_ring_map(fw_ring *r, int fd);
void fw_ring_unmap(fw_ring *r);

/* The largest record a slot can hold: a record larger than half the ring
 * is refused (the producer spills it), so one record never takes it all. */
size_t fw_ring_max_record(const fw_ring *r);

/* Producer: claim a slot for a record of `len` bytes. Returns its position
 * (>= 0, and *dst where the record goes), or -EAGAIN (no room now),
 * -EMSGSIZE (over fw_ring_max_record), -EIO (the ring's words make no
 * sense: a damaged file). Every claim must be followed by fw_ring_commit. */
int64_t fw_ring_claim(fw_ring *r, size_t len, uint32_t pid, unsigned char **dst);

/* Producer: publish the record at pos, and wake the consumer if it sleeps. */
void fw_ring_commit(fw_ring *r, int64_t pos);

/* Consumer: what is at pos (a slot boundary at or after tail). Returns 0,
 * or -EIO when pos holds no slot (a damaged file; see fw_ring_resync). A
 * position a whole ring past tail reads as FREE: release what was read to
 * go on. */
int fw_ring_peek(const fw_ring *r, uint64_t pos, fw_ring_slot *out);

/* Consumer, after -EIO at pos: the first position after it that holds a
 * plausible slot, or head. What lies between is lost. */
uint64_t fw_ring_resync(const fw_ring *r, uint64_t pos);

/* Consumer: free everything before upto (read and kept elsewhere). */
void fw_ring_release(fw_ring *r, uint64_t upto);

/* Consumer, at start: finish a release a killed predecessor began.
 * Returns the position to read from (tail). */
uint64_t fw_ring_recover(fw_ring *r);

/* Consumer: sleep until a producer commits at or after pos, or timeout_ms
 * passes, or a signal arrives. Returns 1 if a slot at pos is ready (DONE or
 * PAD) without sleeping, else 0. */
int fw_ring_wait(fw_ring *r, uint64_t pos, int timeout_ms);

/* Is the producer `pid`, whose slot the consumer first found BUSY at
 * boot-clock time `seen_ns` (CLOCK_BOOTTIME), gone? 1: gone (no such
 * process, or one started after seen_ns: the pid was reused), 0: alive. */
int fw_ring_producer_gone(uint32_t pid, uint64_t seen_ns);

/* Bytes claimed and not yet freed (approximate: head - tail). */
uint64_t fw_ring_used(const fw_ring *r);

#endif
