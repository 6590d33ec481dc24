/* fw_timer: deadline lists with a fixed timeout each.
 *
 * Every timeout kind (header, body, idle, write, linger) has one constant
 * duration per server, so appending at the tail keeps a list sorted by
 * deadline: insert, remove, refresh and expiry are all O(1), no heap needed.
 * A node belongs to at most one list at a time; its owner embeds it. */
#ifndef FW_TIMER_H
#define FW_TIMER_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct fw_tnode {
    struct fw_tnode *prev, *next;
    struct fw_tlist *list;      /* NULL when not armed */
    int64_t deadline;           /* monotonic ms */
} fw_tnode;

typedef struct fw_tlist {
    fw_tnode *head, *tail;
    int64_t timeout_ms;         /* <= 0: never expires (nodes are still tracked) */
    int count;                  /* nodes on the list */
} fw_tlist;

static inline int64_t fw_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* CLOCK_MONOTONIC in nanoseconds: request and app-call durations (the core's
 * and the app layer's readings are compared with each other). */
static inline uint64_t fw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void fw_timer_stop(fw_tnode *n)
{
    fw_tlist *l = n->list;
    if (!l)
        return;
    if (n->prev) n->prev->next = n->next; else l->head = n->next;
    if (n->next) n->next->prev = n->prev; else l->tail = n->prev;
    l->count--;
    n->prev = n->next = NULL;
    n->list = NULL;
}

/* (Re)arm n on list l with deadline now + l->timeout_ms. */
static inline void fw_timer_start(fw_tlist *l, fw_tnode *n, int64_t now)
{
    fw_timer_stop(n);
    n->deadline = l->timeout_ms > 0 ? now + l->timeout_ms : INT64_MAX;
    n->list = l;
    n->next = NULL;
    n->prev = l->tail;
    if (l->tail) l->tail->next = n; else l->head = n;
    l->tail = n;
    l->count++;
}

/* Question (1 yes, 0 no): has the first deadline of l come (<= now)? */
static inline int fw_timer_due(const fw_tlist *l, int64_t now)
{
    return l->head && l->head->deadline <= now;
}

/* The earlier of `next` and the first deadline of l. */
static inline int64_t fw_timer_earlier(const fw_tlist *l, int64_t next)
{
    return l->head && l->head->deadline < next ? l->head->deadline : next;
}

/* The first node of l whose deadline has come (<= now), taken off the
 * list; NULL when none has. Expiry: while ((n = fw_timer_pop_due(l, now)))
 * act on n's owner. */
static inline fw_tnode *fw_timer_pop_due(fw_tlist *l, int64_t now)
{
    if (!fw_timer_due(l, now))
        return NULL;
    fw_tnode *n = l->head;
    fw_timer_stop(n);
    return n;
}

#endif
