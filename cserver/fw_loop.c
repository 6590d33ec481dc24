/* fw_loop: see fw_loop.h. */
#include "fw_loop.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

int fw_loop_init(fw_loop *loop, int nevents)
{
    loop->nevents = nevents > 0 ? nevents : 256;
    loop->events = calloc((size_t)loop->nevents, sizeof(*loop->events));
    if (!loop->events)
        return -1;
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (loop->epfd < 0) {
        free(loop->events);
        loop->events = NULL;
        return -1;
    }
    return 0;
}

void fw_loop_destroy(fw_loop *loop)
{
    if (loop->epfd >= 0)
        close(loop->epfd);
    loop->epfd = -1;
    free(loop->events);
    loop->events = NULL;
}

int fw_loop_watch(fw_loop *loop, fw_watch *w, uint32_t mask)
{
    if (mask == w->mask)
        return 0;      /* includes a fired oneshot watch asked for nothing */
    int op;
    if (mask == 0)
        op = EPOLL_CTL_DEL;
    else if (!w->in_set)
        op = EPOLL_CTL_ADD;
    else
        op = EPOLL_CTL_MOD;
    struct epoll_event ev = { .events = mask | (w->oneshot ? EPOLLONESHOT : 0), .data = { .ptr = w } };
    if (epoll_ctl(loop->epfd, op, w->fd, &ev) != 0)
        return -1;
    w->mask = mask;
    w->in_set = mask != 0;
    return 0;
}

int fw_loop_unwatch(fw_loop *loop, fw_watch *w)
{
    int rc = 0;
    if (w->in_set)
        rc = epoll_ctl(loop->epfd, EPOLL_CTL_DEL, w->fd, NULL);
    fw_loop_forget(w);
    return rc;
}

int fw_loop_wait(fw_loop *loop, int timeout_ms)
{
    return epoll_wait(loop->epfd, loop->events, loop->nevents, timeout_ms);
}

/* Callbacks may close other watched objects; their owners must keep the
 * memory alive until the pass is over (see the server's graveyard). */
void fw_loop_dispatch(fw_loop *loop, int n)
{
    for (int i = 0; i < n; i++) {
        fw_watch *w = loop->events[i].data.ptr;
        if (w->oneshot)
            w->mask = 0;       /* the kernel disarmed it; it stays in the set */
        loop->left = n - i - 1;
        w->cb(loop, w, loop->events[i].events);
    }
    loop->left = 0;
}
