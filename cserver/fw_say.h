/* fw_say: a message that an event could repeat at every occurrence (an
 * accept that fails for want of descriptors, an idle connection closed at
 * --max-connections, a spare thread that cannot start at the thread limit)
 * is said at most once every FW_SAY_EVERY_MS,
 * with the count of occurrences left unsaid since the last one: while the
 * cause lasts the log gets one line every 10 s, not one per event.
 *
 * The caller owns the fw_say and serialises calls on it (its thread, or a
 * lock it holds). */
#ifndef FW_SAY_H
#define FW_SAY_H

#include <stdint.h>

#define FW_SAY_EVERY_MS 10000

typedef struct fw_say {
    int64_t said_at;            /* monotonic ms of the last message; 0: never said */
    unsigned long unsaid;       /* occurrences since then, not said */
} fw_say;

/* An occurrence at now_ms (monotonic). Returns 1 if it is to be said now,
 * with *unsaid set to the occurrences left unsaid before it; 0 if not
 * (it is counted for the next message). */
static inline int fw_say_now(fw_say *s, int64_t now_ms, unsigned long *unsaid)
{
    if (s->said_at && now_ms - s->said_at < FW_SAY_EVERY_MS) {
        s->unsaid++;
        return 0;
    }
    *unsaid = s->unsaid;
    s->unsaid = 0;
    s->said_at = now_ms ? now_ms : 1;
    return 1;
}

#endif
