/* openloop: a fixed-rate (open-loop) HTTP/1.1 load generator for
 * bench/run_offload.py.
 *
 *   openloop [-f] [-i IDLE] HOST PORT PATH RATE SECONDS MAXCONN OUTFILE
 *
 * Request i is due at t0 + i / RATE, for i < RATE * SECONDS, whatever
 * happened to the requests before it (open loop). At its due time it is
 * written on an idle kept-alive connection (the most recently freed one;
 * with -f the one free longest, so every one of the MAXCONN connections
 * sends in turn); if all MAXCONN connections are busy it waits in a FIFO
 * backlog until one is free. -i IDLE opens IDLE more connections before the
 * clock starts and keeps them open, silent (the many-connections benchmark:
 * a server holding thousands of idle kept-alive clients); the summary line
 * says how many of them the server closed by the end (idle_closed). Its latency is measured from the DUE time to the end of the
 * response, so a stall is charged to every request scheduled during it (no
 * coordinated omission), and the client's own lateness is counted too (it
 * is also reported apart: "lag" = actual write time - due time).
 *
 * Timing: the next due time is armed on a timerfd (absolute,
 * CLOCK_MONOTONIC, timer slack set to 1 ns), so sends start within a few
 * microseconds of their schedule rather than on epoll's millisecond ticks.
 * One thread, epoll, no allocation on the request path; a few microseconds
 * of client CPU per request.
 *
 * Bounded: it stops scheduling after SECONDS and waits at most 10 s more
 * for outstanding responses; those are counted as timeouts. Output: one
 * line per request to OUTFILE ("due_ns latency_ns lag_ns status", status 0
 * for a request that failed or timed out), and a summary line on stdout:
 * OPENLOOP sent=.. ok=.. non200=.. errors=.. timeouts=.. connects=.. maxconn_used=..
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONN 20000
#define BUF 8192
#define GRACE_NS 10000000000LL

typedef struct {
    int fd;
    int busy;         /* a request is in flight */
    long req;         /* its index */
    size_t got;
    char buf[BUF];
} conn_t;

static conn_t *conns;
static int nconn, epfd;
static int fifo;                 /* -f: the free connection taken is the one free longest */
static int *silent, nsilent;     /* -i: the idle connections' fds */
static struct sockaddr_in addr;
static char request[512];
static size_t reqlen;
static int64_t *due, *lat, *lag;
static int *status;
static long nreq;
/* The free connections: a ring of indexes into conns, [idle_head, +nidle);
 * a release appends at the tail; dispatch takes from the tail (LIFO) or,
 * with -f, from the head (FIFO). */
static int *idle, idle_head, nidle;
static long *backlog, bl_head, bl_tail;
static long connects, errors, non200, ok, maxbusy, busy_now;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int open_conn(conn_t *c)
{
    /* Reconnecting is for kept-alive connections the server closed; a server
     * that refuses connections would make it a busy loop: bounded. */
    if (connects > 2 * nreq + 2 * nconn + 100)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    c->fd = fd;
    c->busy = 0;
    c->got = 0;
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    connects++;
    return 0;
}

static void idle_push(int k)
{
    idle[(idle_head + nidle++) % nconn] = k;
}

static int idle_take(void)
{
    nidle--;
    if (!fifo)
        return idle[(idle_head + nidle) % nconn];
    int k = idle[idle_head];
    idle_head = (idle_head + 1) % nconn;
    return k;
}

/* Drop connection k from the free ring (the server closed it while free). */
static void idle_drop(int k)
{
    for (int j = 0; j < nidle; j++) {
        int *slot = &idle[(idle_head + j) % nconn];
        if (*slot == k) {
            for (; j < nidle - 1; j++)
                idle[(idle_head + j) % nconn] = idle[(idle_head + j + 1) % nconn];
            nidle--;
            return;
        }
    }
}

static void finish(long i, int st, int64_t t)
{
    lat[i] = t - due[i];
    status[i] = st;
    if (st == 200)
        ok++;
    else if (st > 0)
        non200++;
}

static void send_on(conn_t *c, long i)
{
    int64_t t = now_ns();
    lag[i] = t - due[i];
    c->busy = 1;
    c->req = i;
    c->got = 0;
    busy_now++;
    if (busy_now > maxbusy)
        maxbusy = busy_now;
    ssize_t n = send(c->fd, request, reqlen, MSG_NOSIGNAL);
    if (n != (ssize_t)reqlen) {
        /* A kept-alive connection the server closed, or a full socket buffer
         * (never for one small request): reconnect once and resend. */
        epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        if (open_conn(c) == 0 && send(c->fd, request, reqlen, MSG_NOSIGNAL) == (ssize_t)reqlen)
            return;
        errors++;
        finish(i, 0, now_ns());
        c->busy = 0;
        busy_now--;
        if (c->fd >= 0)
            idle_push((int)(c - conns));
    }
}

static void dispatch(long i)
{
    if (nidle > 0) {
        send_on(&conns[idle_take()], i);
        return;
    }
    backlog[bl_tail++] = i;
}

static void release(conn_t *c)
{
    c->busy = 0;
    busy_now--;
    if (bl_head < bl_tail)
        send_on(c, backlog[bl_head++]);
    else
        idle_push((int)(c - conns));
}

/* A whole response in c->buf? Returns its length (and *st), 0 if not yet, -1 if garbage. */
static long parse_response(conn_t *c, int *st, int *close_after)
{
    char *end = memmem(c->buf, c->got, "\r\n\r\n", 4);
    if (!end)
        return c->got >= BUF ? -1 : 0;
    size_t head = (size_t)(end - c->buf) + 4;
    if (c->got < 12 || memcmp(c->buf, "HTTP/1.", 7) != 0)
        return -1;
    *st = atoi(c->buf + 9);
    long clen = 0;
    *close_after = 0;
    for (char *p = c->buf; p < end;) {
        char *eol = memmem(p, (size_t)(end + 2 - p), "\r\n", 2);
        if (!eol)
            break;
        if (eol - p > 15 && strncasecmp(p, "content-length:", 15) == 0)
            clen = atol(p + 15);
        if (eol - p >= 17 && strncasecmp(p, "connection: close", 17) == 0)
            *close_after = 1;
        p = eol + 2;
    }
    if (head + (size_t)clen > BUF)
        return -1;
    return c->got >= head + (size_t)clen ? (long)(head + (size_t)clen) : 0;
}

static void on_readable(conn_t *c)
{
    for (;;) {
        ssize_t n = recv(c->fd, c->buf + c->got, BUF - c->got, 0);
        if (n > 0) {
            c->got += (size_t)n;
            if (!c->busy) {
                c->got = 0;          /* unexpected bytes on an idle connection */
                continue;
            }
            int st = 0, close_after = 0;
            long len = parse_response(c, &st, &close_after);
            if (len == 0)
                continue;
            int64_t t = now_ns();
            if (len < 0) {
                errors++;
                finish(c->req, 0, t);
                close_after = 1;
            } else {
                finish(c->req, st, t);
            }
            if (close_after) {
                epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->busy = 0;
                busy_now--;
                c->fd = -1;
                if (open_conn(c) < 0) {
                    errors++;
                    return;
                }
                busy_now++;
                c->busy = 1;
            }
            release(c);
            return;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        /* closed by the server or an error */
        epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        int was_busy = c->busy;
        long req = c->req;
        if (was_busy) {
            errors++;
            finish(req, 0, now_ns());
            busy_now--;
        } else {
            /* idle connection closed: drop it from the free ring */
            idle_drop((int)(c - conns));
        }
        c->busy = 0;
        if (open_conn(c) < 0)
            return;
        busy_now++;
        c->busy = 1;
        release(c);
        return;
    }
}

/* Opens the -i connections: blocking connects in order (a server whose
 * accept queue is full makes the kernel retry the SYN; the connect waits),
 * each one then left alone. Returns 0, or -1 with the error printed. */
static int open_silent(void)
{
    silent = calloc((size_t)nsilent + 1, sizeof *silent);
    if (!silent)
        return -1;
    for (int k = 0; k < nsilent; k++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
            fprintf(stderr, "openloop: idle connection %d: %s\n", k, strerror(errno));
            return -1;
        }
        silent[k] = fd;
    }
    return 0;
}

/* How many -i connections the server has closed (reads EOF or an error). */
static long count_silent_closed(void)
{
    long closed = 0;
    for (int k = 0; k < nsilent; k++) {
        char c;
        ssize_t n = recv(silent[k], &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            closed++;
    }
    return closed;
}

int main(int argc, char **argv)
{
    int opt;
    while ((opt = getopt(argc, argv, "fi:")) != -1) {
        if (opt == 'f')
            fifo = 1;
        else if (opt == 'i')
            nsilent = atoi(optarg);
        else
            return 2;
    }
    argc -= optind - 1;
    argv += optind - 1;
    if (argc != 8) {
        fprintf(stderr, "usage: openloop [-f] [-i IDLE] HOST PORT PATH RATE SECONDS MAXCONN OUTFILE\n");
        return 2;
    }
    double rate = atof(argv[4]), seconds = atof(argv[5]);
    nconn = atoi(argv[6]);
    if (rate <= 0 || seconds <= 0 || rate * seconds > 5e6 || nconn < 1 || nconn > MAX_CONN ||
        nsilent < 0 || nsilent > 100000) {
        fprintf(stderr, "openloop: bad RATE/SECONDS/MAXCONN/IDLE\n");
        return 2;
    }
    conns = calloc((size_t)nconn, sizeof *conns);
    idle = calloc((size_t)nconn, sizeof *idle);
    if (!conns || !idle)
        return 3;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
        fprintf(stderr, "openloop: HOST must be an IPv4 address\n");
        return 2;
    }
    reqlen = (size_t)snprintf(request, sizeof request, "GET %s HTTP/1.1\r\nHost: %s:%s\r\n\r\n",
                              argv[3], argv[1], argv[2]);
    nreq = (long)(rate * seconds);
    due = calloc((size_t)nreq, sizeof *due);
    lat = calloc((size_t)nreq, sizeof *lat);
    lag = calloc((size_t)nreq, sizeof *lag);
    status = calloc((size_t)nreq, sizeof *status);
    backlog = calloc((size_t)nreq, sizeof *backlog);
    if (!due || !lat || !lag || !status || !backlog)
        return 3;
    for (long i = 0; i < nreq; i++)
        lat[i] = -1;

    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (nsilent > 0 && open_silent() < 0)
        return 1;
    for (int k = 0; k < nconn; k++) {
        if (open_conn(&conns[k]) < 0) {
            perror("openloop: connect");
            return 1;
        }
    }
    /* Let the connects complete before the clock starts (loopback: at once,
     * unless the server's accept queue is full and the SYN is retried). */
    for (int k = 0; k < nconn; k++) {
        int err = 0;
        socklen_t len = sizeof err;
        struct pollfd pfd = { .fd = conns[k].fd, .events = POLLOUT };
        if (poll(&pfd, 1, 10000) != 1 ||
            getsockopt(conns[k].fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
            fprintf(stderr, "openloop: connect: %s\n", strerror(err ? err : errno));
            return 1;
        }
    }
    for (int k = nconn - 1; k >= 0; k--)
        idle_push(k);

    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event tev = { .events = EPOLLIN, .data.ptr = NULL };
    epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &tev);

    /* Connected: say so (a caller measuring the server from here on). */
    printf("OPENLOOP-READY\n");
    fflush(stdout);
    int64_t t0 = now_ns() + 1000000;
    double interval = 1e9 / rate;
    for (long i = 0; i < nreq; i++)
        due[i] = t0 + (int64_t)(i * interval);
    int64_t end_ns = due[nreq - 1] + GRACE_NS;
    long next = 0;
    struct epoll_event evs[64];

    for (;;) {
        int64_t t = now_ns();
        while (next < nreq && due[next] <= t)
            dispatch(next++);
        if (next >= nreq && busy_now == 0 && bl_head == bl_tail)
            break;
        if (t >= end_ns)
            break;
        if (next < nreq) {
            struct itimerspec its = { 0 };
            its.it_value.tv_sec = due[next] / 1000000000LL;
            its.it_value.tv_nsec = due[next] % 1000000000LL;
            timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        }
        int timeout_ms = next < nreq ? -1 : (int)((end_ns - t) / 1000000 + 1);
        int n = epoll_wait(epfd, evs, 64, timeout_ms);
        for (int k = 0; k < n; k++) {
            if (evs[k].data.ptr == NULL) {
                uint64_t x;
                ssize_t r = read(tfd, &x, sizeof x);
                (void)r;
                continue;
            }
            conn_t *c = evs[k].data.ptr;
            if (c->fd >= 0)
                on_readable(c);
        }
    }

    long timeouts = 0, sent = next;
    FILE *f = fopen(argv[7], "w");
    if (!f) {
        perror("openloop: OUTFILE");
        return 1;
    }
    for (long i = 0; i < nreq; i++) {
        if (i >= sent)
            break;
        if (lat[i] < 0) {
            timeouts++;
            fprintf(f, "%lld -1 %lld 0\n", (long long)(due[i] - t0), (long long)lag[i]);
        } else {
            fprintf(f, "%lld %lld %lld %d\n", (long long)(due[i] - t0), (long long)lat[i],
                    (long long)lag[i], status[i]);
        }
    }
    fclose(f);
    printf("OPENLOOP sent=%ld ok=%ld non200=%ld errors=%ld timeouts=%ld connects=%ld maxconn_used=%ld "
           "backlogged=%ld idle_closed=%ld\n", sent, ok, non200, errors, timeouts, connects, maxbusy, bl_tail,
           count_silent_closed());
    return 0;
}
