/* fw_loop: a thin epoll wrapper that remembers what each fd is registered for.
 *
 * Every watched fd is described by an fw_watch that the caller embeds in its
 * own object (connection, listener, eventfd) and owns. The loop keeps the
 * registered mask in the watch, so fw_loop_watch() can pick EPOLL_CTL_ADD,
 * MOD or DEL itself and never issues a redundant syscall. */
#ifndef FW_LOOP_H
#define FW_LOOP_H

#include <stdint.h>
#include <sys/epoll.h>

typedef struct fw_loop fw_loop;
typedef struct fw_watch fw_watch;

/* Called with the epoll events that fired for w. */
typedef void fw_watch_fn(fw_loop *loop, fw_watch *w, uint32_t events);

struct fw_watch {
    int fd;
    uint32_t mask;      /* events currently armed; 0 = none */
    int in_set;         /* registered in the epoll set (armed or, for oneshot, fired) */
    int oneshot;        /* set by the owner before the first watch: EPOLLONESHOT.
                         * A connection served by app threads uses it, so that
                         * once its event fired the loop gets nothing more for
                         * it until it re-arms, while a thread owns it. */
    fw_watch_fn *cb;
};

struct fw_loop {
    int epfd;
    int nevents;
    struct epoll_event *events;   /* owned, nevents long */
    int left;                     /* events of the pass being dispatched that are still to
                                   * come (0 outside fw_loop_dispatch) */
};

int fw_loop_init(fw_loop *loop, int nevents);
void fw_loop_destroy(fw_loop *loop);

/* Register w for `mask` (EPOLLIN, EPOLLOUT, ...; 0 removes it). A oneshot
 * watch whose event fired is disarmed but still in the set: watching it
 * again costs one EPOLL_CTL_MOD. Returns 0 or -1 with errno set. */
int fw_loop_watch(fw_loop *loop, fw_watch *w, uint32_t mask);

/* Forget w without a syscall: for an fd that is about to be closed when
 * this process holds the only reference to its file (the last close()
 * removes it from the epoll set). */
static inline void fw_loop_forget(fw_watch *w) { w->mask = 0; w->in_set = 0; }

/* Take w out of the epoll set for good (EPOLL_CTL_DEL), armed or a fired
 * oneshot. Needed before closing an fd whose file lives on elsewhere (a
 * socket passed to another process): the registration belongs to the open
 * file, so close() alone would leave it behind, and the same socket coming
 * back under the same fd number would then fail EPOLL_CTL_ADD with EEXIST.
 * Returns 0 or -1 with errno set (w is forgotten either way). */
int fw_loop_unwatch(fw_loop *loop, fw_watch *w);

/* Wait up to timeout_ms (-1: forever). Returns the number of ready events,
 * or -1 with errno (EINTR is returned to the caller so it can look at
 * signals). Split from dispatch so the caller can refresh its clock between. */
int fw_loop_wait(fw_loop *loop, int timeout_ms);
void fw_loop_dispatch(fw_loop *loop, int n);

#endif
