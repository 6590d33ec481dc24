/* fw_ring: the file-backed multi-producer ring of offload records. See
 * fw_ring.h for the layout and the invariants this code keeps. */
#define _GNU_SOURCE
#include "fw_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define UNITS_MASK 0x3fffffffu   /* bits 2..31 of a claimed word */
#define MAX_STEPS 4096           /* slots a producer walks over before it calls the ring busy */

/* ---- words ---------------------------------------------------------------- */

static inline uint64_t *word_at(const fw_ring *r, uint64_t pos)
{
    return (uint64_t *)(void *)(r->data + (pos & r->mask));
}

static inline uint64_t free_word(uint64_t lap)
{
    return lap << 2;
}

static inline uint64_t claim_word(unsigned kind, uint64_t bytes, uint32_t pid)
{
    return (uint64_t)pid << 32 | (bytes >> 3) << 2 | kind;
}

static inline unsigned word_kind(uint64_t w)
{
    return (unsigned)(w & 3);
}

static inline uint64_t word_bytes(uint64_t w)
{
    return ((w >> 2) & UNITS_MASK) << 3;
}

static inline uint32_t word_pid(uint64_t w)
{
    return (uint32_t)(w >> 32);
}

static inline uint64_t slot_bytes(size_t len)
{
    return (8 + (uint64_t)len + 7) & ~(uint64_t)7;
}

/* A claimed word that fits where it stands: a length of whole units that
 * does not cross the end of the lap. */
static int claim_fits(const fw_ring *r, uint64_t pos, uint64_t w)
{
    uint64_t bytes = word_bytes(w);
    return bytes >= 8 && bytes <= r->cap - (pos & r->mask);
}

/* ---- the file ------------------------------------------------------------- */

uint64_t fw_ring_capacity(uint64_t want)
{
    uint64_t cap = FW_RING_MIN;
    while (cap < want && cap < FW_RING_MAX)
        cap <<= 1;
    return cap;
}

/* The meta page says this is a ring of a size that fits a file of `size`. */
static int meta_ok(const fw_ring_meta *m, uint64_t size)
{
    uint64_t cap = m->capacity;
    if (m->magic != FW_RING_MAGIC || m->version != FW_RING_VERSION || cap < FW_RING_MIN || cap > FW_RING_MAX ||
        (cap & (cap - 1)) || size != FW_RING_META + cap)
        return 0;
    uint64_t tail = atomic_load(&m->tail), freeing = atomic_load(&m->freeing), head = atomic_load(&m->head);
    return (tail & 7) == 0 && (freeing & 7) == 0 && (head & 7) == 0 && freeing >= tail && freeing - tail <= cap &&
           (head < tail || head - tail <= cap);
}

int fw_ring_prepare(int fd, uint64_t *capacity)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (st.st_size > 0) {
        fw_ring_meta m;
        ssize_t got = pread(fd, &m, sizeof(m), 0);
        if (got < 0)
            return -errno;
        if ((size_t)got != sizeof(m) || !meta_ok(&m, (uint64_t)st.st_size))
            return -EINVAL;
        *capacity = m.capacity;
        return 0;
    }
    uint64_t cap = fw_ring_capacity(*capacity);
    /* Every block of the file is allocated now: a store into a mapped hole
     * on a full disk would be a SIGBUS in a worker, not an error. */
    int rc = posix_fallocate(fd, 0, (off_t)(FW_RING_META + cap));
    if (rc != 0)
        return -rc;
    fw_ring_meta m;
    memset(&m, 0, sizeof(m));
    m.magic = FW_RING_MAGIC;
    m.version = FW_RING_VERSION;
    m.capacity = cap;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m.created_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    ssize_t put = pwrite(fd, &m, sizeof(m), 0);
    if (put < 0)
        return -errno;
    if ((size_t)put != sizeof(m))
        return -EIO;
    *capacity = cap;
    return 0;
}

int fw_ring_map(fw_ring *r, int fd)
{
    memset(r, 0, sizeof(*r));
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (st.st_size < (off_t)(FW_RING_META + FW_RING_MIN))
        return -EINVAL;
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -errno;
    fw_ring_meta *m = p;
    if (!meta_ok(m, (uint64_t)st.st_size)) {
        munmap(p, (size_t)st.st_size);
        return -EINVAL;
    }
    r->meta = m;
    r->data = (unsigned char *)p + FW_RING_META;
    r->cap = m->capacity;
    r->mask = r->cap - 1;
    r->shift = (unsigned)__builtin_ctzll(r->cap);
    r->map_len = (size_t)st.st_size;
    return 0;
}

void fw_ring_unmap(fw_ring *r)
{
    if (r->meta)
        munmap(r->meta, r->map_len);
    memset(r, 0, sizeof(*r));
}

size_t fw_ring_max_record(const fw_ring *r)
{
    return (size_t)(r->cap / 2 - 8);
}

uint64_t fw_ring_used(const fw_ring *r)
{
    uint64_t tail = atomic_load_explicit(&r->meta->tail, memory_order_acquire);
    uint64_t head = atomic_load_explicit(&r->meta->head, memory_order_acquire);
    return head > tail ? head - tail : 0;
}

/* ---- producers ------------------------------------------------------------ */

/* head = max(head, to): a hint, so a lost race costs nothing. */
static void advance_head(fw_ring_meta *m, uint64_t to)
{
    uint64_t cur = atomic_load_explicit(&m->head, memory_order_relaxed);
    while (cur < to && !atomic_compare_exchange_weak_explicit(&m->head, &cur, to, memory_order_release,
                                                              memory_order_relaxed))
        ;
}

int64_t fw_ring_claim(fw_ring *r, size_t len, uint32_t pid, unsigned char **dst)
{
    if (len == 0 || len > fw_ring_max_record(r))
        return -EMSGSIZE;
    fw_ring_meta *m = r->meta;
    uint64_t need = slot_bytes(len);
    uint64_t h = atomic_load_explicit(&m->head, memory_order_acquire);
    for (int step = 0; step < MAX_STEPS; step++) {
        uint64_t t = atomic_load_explicit(&m->tail, memory_order_acquire);
        if (h < t)
            h = t;                              /* a stale hint: the consumer is past it */
        uint64_t to_end = r->cap - (h & r->mask);
        uint64_t take = need <= to_end ? need : to_end;
        if (h + take > t + r->cap)
            return -EAGAIN;
        uint64_t *wp = word_at(r, h);
        uint64_t w = __atomic_load_n(wp, __ATOMIC_ACQUIRE);
        /* Freed meanwhile? Then that place may already hold a later lap's
         * bytes, not a word of this lap: look again from tail. */
        uint64_t t2 = atomic_load_explicit(&m->tail, memory_order_acquire);
        if (t2 > h) {
            h = t2;
            continue;
        }
        if (word_kind(w) != FW_RING_FREE) {     /* claimed: walk over it */
            if (!claim_fits(r, h, w))
                return -EIO;
            h += word_bytes(w);
            continue;
        }
        uint64_t lap = h >> r->shift;
        if ((w >> 2) != lap) {
            if ((w >> 2) < lap)                 /* below tail + cap, yet not freed: damaged */
                return -EIO;
            h = atomic_load_explicit(&m->head, memory_order_acquire);   /* freed for a later lap: h is stale */
            continue;
        }
        uint64_t mine = claim_word(take == need ? FW_RING_BUSY : FW_RING_PAD, take, pid);
        if (!__atomic_compare_exchange_n(wp, &w, mine, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;                           /* another producer got it: look again */
        advance_head(m, h + take);
        if (take != need) {                     /* padded to the end of the lap: go on at its start */
            h += take;
            continue;
        }
        *dst = (unsigned char *)wp + 8;
        return (int64_t)h;
    }
    return -EAGAIN;
}

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *timeout)
{
    return syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

void fw_ring_commit(fw_ring *r, int64_t pos)
{
    uint64_t *wp = word_at(r, (uint64_t)pos);
    uint64_t w = __atomic_load_n(wp, __ATOMIC_RELAXED);
    __atomic_store_n(wp, (w & ~(uint64_t)3) | FW_RING_DONE, __ATOMIC_RELEASE);
    /* Dekker with fw_ring_wait: publish, then look at `sleeping`; the
     * consumer sets `sleeping`, then looks at the slot. One of the two sees
     * the other's store. */
    atomic_thread_fence(memory_order_seq_cst);
    fw_ring_meta *m = r->meta;
    if (atomic_load_explicit(&m->sleeping, memory_order_relaxed) &&
        atomic_exchange_explicit(&m->sleeping, 0, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&m->wakes, 1, memory_order_relaxed);
        futex(&m->sleeping, FUTEX_WAKE, 1, NULL);
    }
}

/* ---- the consumer --------------------------------------------------------- */

int fw_ring_peek(const fw_ring *r, uint64_t pos, fw_ring_slot *out)
{
    memset(out, 0, sizeof(*out));
    if (pos & 7)
        return -EIO;
    /* head first: every slot boundary below it is claimed. */
    uint64_t head = atomic_load_explicit(&r->meta->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->meta->tail, memory_order_relaxed);
    if (pos < tail)
        return -EIO;
    if (pos - tail >= r->cap) {
        /* A lap ahead of what was freed: that place still holds the slot
         * read a lap ago. Nothing can be claimed here before a release. */
        out->kind = FW_RING_FREE;
        return 0;
    }
    uint64_t w = __atomic_load_n(word_at(r, pos), __ATOMIC_ACQUIRE);
    unsigned kind = word_kind(w);
    if (kind == FW_RING_FREE) {
        if ((w >> 2) != pos >> r->shift || head > pos)
            return -EIO;                        /* not where a slot could start */
        out->kind = FW_RING_FREE;
        return 0;
    }
    if (!claim_fits(r, pos, w))
        return -EIO;
    out->kind = (int)kind;
    out->next = pos + word_bytes(w);
    out->pid = word_pid(w);
    if (kind == FW_RING_DONE) {
        out->data = (const unsigned char *)word_at(r, pos) + 8;
        out->len = (size_t)(word_bytes(w) - 8);
    }
    return 0;
}

uint64_t fw_ring_resync(const fw_ring *r, uint64_t pos)
{
    uint64_t head = atomic_load_explicit(&r->meta->head, memory_order_acquire);
    uint64_t p = (pos + 8) & ~(uint64_t)7;
    for (; p < head; p += 8) {
        if ((p & r->mask) == 0)
            return p;                           /* a lap always starts with a slot */
        uint64_t w = __atomic_load_n(word_at(r, p), __ATOMIC_ACQUIRE);
        if (word_kind(w) != FW_RING_FREE && claim_fits(r, p, w) && word_pid(w) != 0)
            return p;
    }
    return p > head ? p : head;
}

void fw_ring_release(fw_ring *r, uint64_t upto)
{
    fw_ring_meta *m = r->meta;
    uint64_t t = atomic_load_explicit(&m->tail, memory_order_relaxed);
    if (upto <= t)
        return;
    atomic_store_explicit(&m->freeing, upto, memory_order_relaxed);
    for (uint64_t p = t; p < upto; p += 8)      /* free for the lap in which each place comes round again */
        __atomic_store_n(word_at(r, p), free_word((p >> r->shift) + 1), __ATOMIC_RELAXED);
    atomic_store_explicit(&m->tail, upto, memory_order_release);
}

uint64_t fw_ring_recover(fw_ring *r)
{
    fw_ring_meta *m = r->meta;
    uint64_t t = atomic_load(&m->tail), f = atomic_load(&m->freeing);
    if (f > t)
        fw_ring_release(r, f);                  /* marking twice is harmless */
    else if (f < t)
        atomic_store(&m->freeing, t);
    return atomic_load(&m->tail);
}

int fw_ring_wait(fw_ring *r, uint64_t pos, int timeout_ms)
{
    fw_ring_meta *m = r->meta;
    atomic_store_explicit(&m->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t w = __atomic_load_n(word_at(r, pos), __ATOMIC_ACQUIRE);
    unsigned kind = word_kind(w);
    if (kind == FW_RING_DONE || kind == FW_RING_PAD) {
        atomic_store_explicit(&m->sleeping, 0, memory_order_relaxed);
        return 1;
    }
    struct timespec ts = { timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L };
    futex(&m->sleeping, FUTEX_WAIT, 1, &ts);    /* woken, timed out, interrupted: the caller looks */
    atomic_store_explicit(&m->sleeping, 0, memory_order_relaxed);
    return 0;
}

/* ---- producers that died mid-write ------------------------------------------- */

/* Start time of a process in ns of CLOCK_BOOTTIME (/proc/PID/stat field
 * 22, in clock ticks), or 0 if it cannot be read. */
static uint64_t process_start_ns(uint32_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');        /* the command name may hold spaces and parentheses */
    if (!p)
        return 0;
    /* After ") " come fields 3, 4, ...: skip to field 22. */
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    unsigned long long ticks;
    if (field != 22 || sscanf(p, "%llu", &ticks) != 1)
        return 0;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? ticks * (1000000000ull / (uint64_t)hz) : 0;
}

int fw_ring_producer_gone(uint32_t pid, uint64_t seen_ns)
{
    if (pid == 0 || pid > 0x7fffffffu)
        return 1;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 1;
    uint64_t start = process_start_ns(pid);
    return start > seen_ns;     /* started after its slot was seen busy: not its producer */
}
