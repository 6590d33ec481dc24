/* libFuzzer target for the offload ring's reader (cserver/fw_ring.c) over
 * damaged ring files: what a new sibling finds after a crash, a bug, or a
 * disk that returned garbage.
 *
 * The input is a ring: its first 24 bytes give head, tail and freeing (made
 * 8-aligned and within a ring of each other), the rest is laid into the
 * data area from tail on (wrapping), over a ring of zeros (a new file). The target then does what the sibling does: recover,
 * read slot after slot, resync after a damaged one, skip busy slots (their
 * producer "died"), parse each record as fw_offload_parse does, free what it
 * read; and, whenever it finds nothing, claims and commits one record as a
 * producer would, and must then read exactly that record. Invariants: the
 * read position only moves forward and stays within a ring of tail + head;
 * a slot lies inside the data area; at most a bounded number of steps.
 * Any broken invariant prints what and where, then abort()s.
 *
 * Build: `make fuzz-ring` (libFuzzer) or `make fuzz-ring-smoke`. */
#define _GNU_SOURCE
#include "fw_offload.h"
#include "fw_ring.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHECK(cond, what)                                                                       \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "fuzz_ring: %s at position %llu\n", what, (unsigned long long)pos); \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

#define FILE_SIZE (FW_RING_META + FW_RING_MIN)

/* One memfd for the whole run, laid anew for each input. */
static int ring_fd = -1;

static int lay_out(const uint8_t *data, size_t size)
{
    if (ring_fd < 0) {
        ring_fd = memfd_create("fuzz_ring", MFD_CLOEXEC);
        if (ring_fd < 0 || ftruncate(ring_fd, FILE_SIZE) != 0)
            abort();
    }
    static unsigned char file[FILE_SIZE];
    memset(file, 0, sizeof(file));
    fw_ring_meta *m = (fw_ring_meta *)(void *)file;
    m->magic = FW_RING_MAGIC;
    m->version = FW_RING_VERSION;
    m->capacity = FW_RING_MIN;
    uint64_t f[3] = { 0, 0, 0 };
    memcpy(f, data, size < sizeof(f) ? size : sizeof(f));
    /* Positions the header check accepts (else most inputs would stop
     * there): 8-aligned, tail below 2^32, head and freeing within a ring of
     * it; head may lag behind tail (a stale hint). */
    uint64_t tail = f[1] & 0xfffffff8u;
    uint64_t ahead = (f[0] & 0x1fff8u) % (FW_RING_MIN + 8);
    uint64_t head = (f[0] >> 63) && ahead <= tail ? tail - ahead : tail + ahead;
    atomic_store(&m->head, head);
    atomic_store(&m->tail, tail);
    atomic_store(&m->freeing, tail + (f[2] & 0x1fff8u) % (FW_RING_MIN + 8));
    f[1] = tail;
    size_t skip = size < sizeof(f) ? size : sizeof(f);
    for (size_t i = skip; i < size && i - skip < FW_RING_MIN; i++)
        file[FW_RING_META + ((f[1] + (i - skip)) & (FW_RING_MIN - 1))] = data[i];
    return pwrite(ring_fd, file, sizeof(file), 0) == (ssize_t)sizeof(file) ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (lay_out(data, size) != 0)
        abort();
    fw_ring r;
    uint64_t pos = 0;
    if (fw_ring_map(&r, ring_fd) != 0)
        return 0;                      /* a header the reader refuses: fine */
    pos = fw_ring_recover(&r);
    uint64_t start = pos;
    int wrote = 0;
    for (int step = 0; step < 20000; step++) {
        fw_ring_slot s;
        int rc = fw_ring_peek(&r, pos, &s);
        if (rc == -EIO) {
            uint64_t next = fw_ring_resync(&r, pos);
            CHECK(next > pos, "resync did not move forward");
            pos = next;
            continue;
        }
        CHECK(rc == 0, "peek failed otherwise");
        if (s.kind == FW_RING_FREE) {
            fw_ring_release(&r, pos);
            if (wrote)
                break;
            /* A producer writes into whatever the reader left. */
            unsigned char *dst;
            const char topic[] = "t";
            size_t len = sizeof(fw_offload_hdr) + 1 + 3;
            int64_t at = fw_ring_claim(&r, len, 4242, &dst);
            if (at < 0)
                break;                 /* no room (head far ahead), or damage it refuses */
            fw_offload_hdr h = { FW_OFL_MAGIC, (uint32_t)len, 0, 1, 0, 3, 4242, 1, 0 };
            memcpy(dst, &h, sizeof(h));
            memcpy(dst + sizeof(h), topic, 1);
            memcpy(dst + sizeof(h) + 1, "abc", 3);
            fw_ring_commit(&r, at);
            wrote = 1;
            continue;
        }
        CHECK(s.next > pos, "a slot that does not move forward");
        CHECK((pos & ~(uint64_t)(FW_RING_MIN - 1)) == ((s.next - 1) & ~(uint64_t)(FW_RING_MIN - 1)),
              "a slot across the end of the data area");
        if (s.kind == FW_RING_DONE) {
            CHECK(s.data >= r.data && s.data + s.len <= r.data + r.cap, "record outside the data area");
            fw_offload_rec rec;
            long n = fw_offload_parse((const char *)s.data, s.len, &rec);
            if (n > 0)
                CHECK((size_t)n <= s.len, "record longer than its slot");
            if (wrote && n > 0 && rec.h.pid == 4242 && rec.h.value_len == 3)
                CHECK(memcmp(rec.value, "abc", 3) == 0, "the record written is not the one read");
        }
        pos = s.next;                  /* DONE, PAD, or BUSY taken as a dead producer's hole */
        if (pos - start > 4 * (uint64_t)FW_RING_MIN)
            break;
        fw_ring_release(&r, pos);
    }
    fw_ring_unmap(&r);
    return 0;
}
