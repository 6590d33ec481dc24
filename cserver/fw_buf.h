/* fw_buf: a growable byte buffer with a consumed prefix.
 *
 * Valid bytes are data[off .. len). Consuming advances `off`; the prefix is
 * reclaimed lazily (when the buffer empties, or when space is needed), so
 * consuming one pipelined request from a large read costs no memmove.
 * The buffer owns `data` (malloc'd); fw_buf_free releases it. */
#ifndef FW_BUF_H
#define FW_BUF_H

#include <stddef.h>
#include <string.h>

#define FW_BUF_FIRST_CAP 4096     /* the first allocation; it doubles from there */

typedef struct fw_buf {
    char *data;   /* owned, NULL until the first reserve */
    size_t off;   /* first valid byte */
    size_t len;   /* one past the last valid byte */
    size_t cap;   /* allocated size */
} fw_buf;

static inline size_t fw_buf_used(const fw_buf *b) { return b->len - b->off; }
static inline char *fw_buf_head(const fw_buf *b) { return b->data + b->off; }
static inline char *fw_buf_tail(const fw_buf *b) { return b->data + b->len; }
static inline size_t fw_buf_room(const fw_buf *b) { return b->cap - b->len; }

/* Make room for at least `extra` bytes after len. 0 on success, -1 on ENOMEM. */
int fw_buf_reserve(fw_buf *b, size_t extra);
/* Make room for `extra` bytes in the block as it is, by dropping the
 * consumed front (moving what is left to the start), when that is enough
 * and moves at most half the block (so appends stay amortised O(1)). A
 * question: 1 done, 0 not (then the block must grow). */
int fw_buf_compact(fw_buf *b, size_t extra);
/* Append p[0..n): 0, or -1 on ENOMEM. Inline when there is room (response
 * heads are built of many small appends); fw_buf_append_grow otherwise. */
int fw_buf_append_grow(fw_buf *b, const void *p, size_t n);
static inline int fw_buf_append(fw_buf *b, const void *p, size_t n)
{
    if (n == 0 || b->cap - b->len < n)
        return fw_buf_append_grow(b, p, n);
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}
/* Consume n bytes from the front (n <= fw_buf_used). */
static inline void fw_buf_consume(fw_buf *b, size_t n)
{
    b->off += n;
    if (b->off >= b->len)
        b->off = b->len = 0;
}
/* Drop all contents; shrink the allocation back to `keep` bytes if it grew past it. */
void fw_buf_reset(fw_buf *b, size_t keep);
void fw_buf_free(fw_buf *b);

#endif
