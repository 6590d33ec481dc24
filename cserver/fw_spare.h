/* fw_spare: a bounded stack of equal-size memory blocks kept for reuse.
 *
 * A connection that goes idle gives its buffers, header array and request
 * state back (fw_conn.c, conn_between) and takes them again with its next
 * request: a few blocks per request. Kept here, the handful
 * of blocks the connections busy at any moment need go round, warm in the
 * cache, instead of through malloc and free (and the heap's top, trimmed
 * and grown again). Closed connections give theirs too, for the next new
 * ones.
 *
 * Owner: one thread (the server's loop). The stack owns the blocks it
 * holds; a block taken is the taker's, to give back or free(). */
#ifndef FW_SPARE_H
#define FW_SPARE_H

#include <stddef.h>

#define FW_SPARE_MAX 64         /* blocks kept at most: the rest are freed */

typedef struct fw_spare {
    size_t size;                /* bytes of every block */
    int max;                    /* blocks kept at most (<= FW_SPARE_MAX) */
    int n;                      /* blocks held */
    void *blocks[FW_SPARE_MAX]; /* owned */
} fw_spare;

/* An empty stack of blocks of `size` bytes that keeps `max` at most
 * (clamped to 1..FW_SPARE_MAX). */
void fw_spare_init(fw_spare *s, size_t size, int max);
/* A block of s->size bytes, uninitialised: a kept one, else malloc's.
 * NULL with errno ENOMEM. */
void *fw_spare_take(fw_spare *s);
/* Keep p (a block of s->size bytes from malloc) for reuse, or free it when
 * the stack is full. p may be NULL. */
void fw_spare_give(fw_spare *s, void *p);
/* Free every block held. */
void fw_spare_destroy(fw_spare *s);

#endif
