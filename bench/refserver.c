/*
 * refserver: the benchmark's reference, a minimal HTTP/1.1 responder in C
 * with no Python, to measure what a WSGI server costs above the floor.
 *
 *     cc -O2 -Wall -Wextra -Werror -o refserver refserver.c
 *     ./refserver PORT [HOST]      (HOST defaults to 127.0.0.1; PORT 0 picks
 *                                   a free one; prints "listening on HOST:PORT")
 *
 * One process, one thread, non-blocking sockets, level-triggered epoll. It
 * answers what bench/apps.py's apps answer, byte for byte the same size as
 * forkwsgi's responses (Content-Type, Content-Length, Date):
 *
 *     GET /4k     -> 200, a 4096-byte body of 'x' (the body4k app)
 *     anything else (GET /, POST /post, ...) -> 200, "Hello, World!"
 *
 * What it does that a real server must do too, so that the comparison is fair:
 * it parses each request head (up to the blank line), reads and discards a
 * Content-Length body before answering, keeps connections alive, answers all
 * the requests found in one read with one write (pipelining), and honours
 * "Connection: close" (and HTTP/1.0) by closing after the response. What it
 * leaves out: chunked request bodies (answered 501), timeouts, anything but
 * the two canned responses. A malformed head gets 400 and the connection is
 * closed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IN_SIZE (16 * 1024)     /* a request head must fit (a larger one gets 400) */
#define OUT_SIZE (128 * 1024)   /* 16 pipelined 4 KiB responses fit in one write */
#define MAX_BODY (1024 * 1024)
#define MAX_EVENTS 256

enum { RESP_HELLO, RESP_4K, RESP_400, RESP_501, N_RESP };

/* The canned responses, rebuilt when the second (and so the Date) changes:
 * [kind][0] keeps the connection alive, [kind][1] carries Connection: close. */
static char resp[N_RESP][2][4096 + 256];
static size_t resp_len[N_RESP][2];
static time_t resp_second = -1;

struct conn {
    int fd;
    int close_after;           /* the request being answered ends the connection */
    int closing;               /* its response is queued: close once it is written */
    int body_kind;             /* response owed once the body is consumed, or -1 */
    size_t body_left;          /* Content-Length bytes still to read and discard */
    size_t in_len;             /* bytes in `in` not yet parsed */
    size_t out_len, out_sent;  /* `out` holds out_len bytes, out_sent of them written */
    struct conn *next_free;
    char in[IN_SIZE];
    char out[OUT_SIZE];
};

static struct conn *free_conns; /* closed connections, reused to spare malloc/free */

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static void build_responses(time_t now)
{
    static const struct { const char *status; const char *body; size_t body_len; } kinds[N_RESP] = {
        [RESP_HELLO] = { "200 OK", "Hello, World!", 13 },
        [RESP_4K] = { "200 OK", NULL, 4096 },
        [RESP_400] = { "400 Bad Request", "Bad Request", 11 },
        [RESP_501] = { "501 Not Implemented", "Not Implemented", 15 },
    };
    char date[64];
    struct tm tm;

    if (gmtime_r(&now, &tm) == NULL || strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm) == 0)
        die("date");
    for (int k = 0; k < N_RESP; k++) {
        for (int close = 0; close < 2; close++) {
            char *p = resp[k][close];
            int n = snprintf(p, sizeof(resp[k][close]),
                             "HTTP/1.1 %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                             "%sDate: %s\r\n\r\n",
                             kinds[k].status, kinds[k].body_len, close ? "Connection: close\r\n" : "", date);
            if (n < 0 || (size_t)n + kinds[k].body_len > sizeof(resp[k][close]))
                die("response too large");
            if (kinds[k].body != NULL)
                memcpy(p + n, kinds[k].body, kinds[k].body_len);
            else
                memset(p + n, 'x', kinds[k].body_len);
            resp_len[k][close] = (size_t)n + kinds[k].body_len;
        }
    }
    resp_second = now;
}

/* Case-insensitive: does the header line [p, end) have this name? Sets *value. */
static int header_is(const char *p, const char *end, const char *name, const char **value)
{
    size_t n = strlen(name);
    if ((size_t)(end - p) <= n || p[n] != ':' || strncasecmp(p, name, n) != 0)
        return 0;
    p += n + 1;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    *value = p;
    return 1;
}

/* Does the comma-separated header value [v, end) contain `token`? */
static int has_token(const char *v, const char *end, const char *token)
{
    size_t n = strlen(token);
    for (const char *p = v; p + n <= end; p++)
        if (strncasecmp(p, token, n) == 0)
            return 1;
    return 0;
}

/*
 * Parse the head [head, head + len) (ending with the blank line's CRLF CRLF).
 * Returns the response kind; sets *body_len and *close.
 */
static int parse_head(const char *head, size_t len, size_t *body_len, int *close)
{
    const char *end = head + len;
    const char *eol = memmem(head, len, "\r\n", 2);
    const char *sp1 = memchr(head, ' ', (size_t)(eol - head));
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
    const char *v;
    int have_length = 0;

    *body_len = 0;
    *close = 0;
    if (sp1 == NULL || sp2 == NULL || sp1 == head || eol - sp2 != 9 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0)
        return RESP_400;
    if (sp2[8] == '0')
        *close = 1;             /* HTTP/1.0: no keep-alive (this server ignores "keep-alive") */
    for (const char *line = eol + 2; line < end - 2; line = eol + 2) {
        eol = memmem(line, (size_t)(end - line), "\r\n", 2);
        if (header_is(line, eol, "Content-Length", &v)) {
            size_t n = 0;
            if (v == eol || have_length)
                return RESP_400;
            for (; v < eol && *v != ' ' && *v != '\t'; v++) {
                if (*v < '0' || *v > '9' || n > MAX_BODY)
                    return RESP_400;
                n = n * 10 + (size_t)(*v - '0');
            }
            if (n > MAX_BODY)
                return RESP_400;
            *body_len = n;
            have_length = 1;
        } else if (header_is(line, eol, "Connection", &v)) {
            if (has_token(v, eol, "close"))
                *close = 1;
        } else if (header_is(line, eol, "Transfer-Encoding", &v)) {
            return RESP_501;
        }
    }
    return (size_t)(sp2 - sp1 - 1) == 3 && memcmp(sp1 + 1, "/4k", 3) == 0 ? RESP_4K : RESP_HELLO;
}

/* Append a response to the connection's output; 0 if it does not fit now. */
static int queue_response(struct conn *c, int kind)
{
    size_t n = resp_len[kind][c->close_after];
    if (c->out_len + n > OUT_SIZE)
        return 0;
    memcpy(c->out + c->out_len, resp[kind][c->close_after], n);
    c->out_len += n;
    if (c->close_after)
        c->closing = 1;
    return 1;
}

/*
 * Consume what `in` holds: discard body bytes, parse complete heads, queue
 * their responses. Stops at an incomplete head or body, after a response that
 * closes the connection, or when the output buffer is full: then it returns 1
 * (flush, and call again). Returns -1 for a head too large for `in`, else 0.
 */
static int process_input(struct conn *c)
{
    size_t pos = 0;
    int ret = 0;

    while (!c->closing) {
        if (c->body_left > 0) {
            size_t n = c->in_len - pos < c->body_left ? c->in_len - pos : c->body_left;
            pos += n;
            c->body_left -= n;
            if (c->body_left > 0)
                break;
        }
        if (c->body_kind >= 0) {
            if (!queue_response(c, c->body_kind)) {
                ret = 1;
                break;
            }
            c->body_kind = -1;
            continue;
        }
        const char *head = c->in + pos;
        const char *blank = memmem(head, c->in_len - pos, "\r\n\r\n", 4);
        if (blank == NULL) {
            if (c->in_len - pos == IN_SIZE)
                ret = -1;
            break;
        }
        size_t head_len = (size_t)(blank - head) + 4, body_len;
        int close;
        int kind = parse_head(head, head_len, &body_len, &close);
        pos += head_len;
        c->close_after = close || kind == RESP_400 || kind == RESP_501;
        c->body_left = kind == RESP_HELLO || kind == RESP_4K ? body_len : 0;
        c->body_kind = kind;    /* answered once the body is read */
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return ret;
}

/* close() also takes the socket out of the epoll set (it has no other descriptor). */
static void conn_close(struct conn *c)
{
    if (close(c->fd) != 0)
        perror("close");
    c->next_free = free_conns;
    free_conns = c;
}

static void set_events(int ep, struct conn *c, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.ptr = c };
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) != 0)
        die("epoll_ctl MOD");
}

/* Write what `out` holds. Returns 1 when all of it is written, 0 on EAGAIN, -1 on error. */
static int flush_output(struct conn *c)
{
    while (c->out_sent < c->out_len) {
        ssize_t n = write(c->fd, c->out + c->out_sent, c->out_len - c->out_sent);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : -1;
        }
        c->out_sent += (size_t)n;
    }
    c->out_len = c->out_sent = 0;
    return 1;
}

/* Answer what `in` holds, write the responses. Returns -1 when the
 * connection is to be closed, else 0. */
static int answer(int ep, struct conn *c)
{
    for (;;) {
        int more = process_input(c);
        if (more < 0) {
            c->close_after = 1;
            if (!queue_response(c, RESP_400))
                return -1;
        }
        int r = flush_output(c);
        if (r < 0 || (r > 0 && c->closing))
            return -1;
        if (r == 0) {
            set_events(ep, c, EPOLLOUT);    /* stop reading until the output drains */
            return 0;
        }
        if (more <= 0)
            return 0;
    }
}

/* The connection's socket is readable or writable: read once, answer, write once. */
static void on_conn(int ep, struct conn *c, uint32_t events)
{
    if (events & EPOLLOUT) {
        int r = flush_output(c);
        if (r == 0)
            return;
        if (r < 0 || c->closing) {
            conn_close(c);
            return;
        }
        set_events(ep, c, EPOLLIN);
    } else {
        ssize_t n = read(c->fd, c->in + c->in_len, IN_SIZE - c->in_len);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return;
        if (n <= 0) {
            conn_close(c);                  /* peer closed, or reset */
            return;
        }
        c->in_len += (size_t)n;
    }
    if (answer(ep, c) < 0)
        conn_close(c);
}

static void on_accept(int ep, int lfd)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                perror("accept4");
            return;
        }
        struct conn *c = free_conns;
        if (c != NULL)
            free_conns = c->next_free;
        else if ((c = malloc(sizeof(*c))) == NULL)
            die("malloc");
        c->fd = fd;
        c->close_after = c->closing = 0;
        c->body_kind = -1;
        c->body_left = c->in_len = c->out_len = c->out_sent = 0;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
            die("epoll_ctl ADD");
    }
}

static int listen_on(const char *host, int port)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    socklen_t len = sizeof(sa);
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0)
        die("socket");
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "refserver: not an IPv4 address: %s\n", host);
        exit(2);
    }
    /* Accepted sockets inherit TCP_NODELAY from the listener (as forkwsgi does). */
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        die("setsockopt");
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        die("bind");
    if (listen(fd, 1024) != 0)
        die("listen");
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        die("getsockname");
    printf("listening on %s:%d\n", host, ntohs(sa.sin_port));
    fflush(stdout);
    return fd;
}

int main(int argc, char **argv)
{
    static struct epoll_event events[MAX_EVENTS];
    char *end;
    long port;

    if (argc < 2 || argc > 3 || (port = strtol(argv[1], &end, 10), *end != '\0') || port < 0 || port > 65535) {
        fprintf(stderr, "usage: %s PORT [HOST]\n", argv[0]);
        return 2;
    }
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        die("signal");
    int lfd = listen_on(argc == 3 ? argv[2] : "127.0.0.1", (int)port);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };   /* NULL: the listener */
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) != 0)
        die("epoll_ctl ADD listener");
    for (;;) {
        int n = epoll_wait(ep, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        time_t now = time(NULL);
        if (now != resp_second)
            build_responses(now);
        for (int i = 0; i < n; i++) {
            if (events[i].data.ptr == NULL)
                on_accept(ep, lfd);
            else
                on_conn(ep, events[i].data.ptr, events[i].events);
        }
    }
}
