/* Unit tests for the access log writer (cserver/fw_alog.c), under ASan and
 * UBSan (`make ctest`): formatting of every atom from a parsed request,
 * escaping (text and JSON), Basic-auth user names, captured response
 * headers, the cut of an over-long line, and a log whose pipe nobody reads
 * (lines dropped and counted, the caller never blocked).
 *
 * The log writes to a pipe the test reads back after fw_alog_free, which
 * writes everything queued. Last line: "N passed, N failed". */
#define _GNU_SOURCE
#include "fw_alog.h"
#include "fw_buf.h"
#include "fw_http.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int n_pass, n_fail;

#define CHECK(e) check_((e), #e, __LINE__)
static void check_(int ok, const char *expr, int line)
{
    if (ok) {
        n_pass++;
        return;
    }
    n_fail++;
    printf("FAIL test_alog.c:%d: %s\n", line, expr);
}

static void check_line(const char *got, const char *want, int line)
{
    if (strcmp(got, want) == 0) {
        n_pass++;
        return;
    }
    n_fail++;
    printf("FAIL test_alog.c:%d:\n  got  %s\n  want %s\n", line, got, want);
}
#define CHECK_LINE(g, w) check_line((g), (w), __LINE__)

/* A parsed request over a heap copy of `raw` (freed by the caller). */
static char *parse(const char *raw, fw_request *req, fw_header *hdrs)
{
    static const fw_http_limits lim = { 8190, 65536, 32, 1 << 20 };
    size_t n = strlen(raw), scan = 0;
    char *buf = malloc(n);
    memcpy(buf, raw, n);
    memset(req, 0, sizeof(*req));
    req->headers = hdrs;
    size_t end = fw_http_head_end(buf, n, &scan);
    if (!end || fw_http_parse_head(buf, end, &lim, req) != 0) {
        printf("FAIL: test request does not parse\n");
        n_fail++;
    }
    return buf;
}

/* Format each record with items, free the log, and return what it wrote. */
static char *run(const fw_alog_item *items, int nitems, int json, const fw_alog_rec *recs, int nrecs)
{
    int p[2];
    if (pipe(p) != 0)
        abort();
    fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
    fw_alog_cfg cfg = { .fd = p[1], .items = items, .nitems = nitems, .json = json };
    fw_alog *a = fw_alog_new(&cfg);
    CHECK(a != NULL);
    close(p[1]);              /* the log holds its own copy */
    if (!a)
        return strdup("");
    for (int i = 0; i < nrecs; i++)
        CHECK(fw_alog_line(a, &recs[i]) == 0);
    fw_alog_counts c;
    fw_alog_free(a, &c);
    CHECK(c.lines == (uint64_t)nrecs && c.full == 0 && c.failed == 0 && c.write_errors == 0);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap + 1);
    ssize_t r;
    while ((r = read(p[0], out + len, cap - len)) > 0)
        len += (size_t)r;
    out[len] = 0;
    close(p[0]);
    return out;
}

#define T(s) { FW_AL_TEXT, s, sizeof(s) - 1 }
#define A(atom) { atom, NULL, 0 }
#define H(atom, name) { atom, name, sizeof(name) - 1 }

static void test_atoms(void)
{
    fw_request req;
    fw_header hdrs[32];
    char *buf = parse("GET /a/b?x=1 HTTP/1.1\r\nHost: h\r\nReferer: r\r\nUser-Agent: ua\r\n"
                      "Authorization: Basic YWxpY2U6c2VjcmV0\r\nX-Q: \"quoted\"\\\r\n\r\n", &req, hdrs);
    fw_buf cap = { 0 };
    fw_alog_item items[] = {
        A(FW_AL_REMOTE_ADDR), T(":"), A(FW_AL_REMOTE_PORT), T(" "), A(FW_AL_USER), T(" \""),
        A(FW_AL_REQUEST), T("\" "), A(FW_AL_METHOD), T(" "), A(FW_AL_PATH), T(" "), A(FW_AL_QUERY),
        T(" "), A(FW_AL_PROTOCOL), T(" "), A(FW_AL_STATUS), T(" "), A(FW_AL_BYTES), T(" "),
        A(FW_AL_SECONDS), T(" "), A(FW_AL_MILLIS), T(" "), A(FW_AL_MICROS),
        T(" "), A(FW_AL_DECIMAL), T(" "), H(FW_AL_REQ_HEADER, "referer"), T(" "),
        H(FW_AL_REQ_HEADER, "USER-AGENT"), T(" "), H(FW_AL_REQ_HEADER, "x-q"), T(" "),
        H(FW_AL_REQ_HEADER, "x-missing"), T(" "), H(FW_AL_RESP_HEADER, "x-r"), T(" "),
        H(FW_AL_RESP_HEADER, "x-none"), T(" "), A(FW_AL_URI),
    };
    fw_alog_cfg probe = { .fd = 1, .items = items, .nitems = (int)(sizeof(items) / sizeof(items[0])) };
    fw_alog *a = fw_alog_new(&probe);
    CHECK(a && fw_alog_wants_response_headers(a));
    fw_alog_capture(a, &cap, "Content-Type", 12, "text/plain", 10);
    fw_alog_capture(a, &cap, "X-R", 3, "first", 5);
    fw_alog_capture(a, &cap, "x-r", 3, "second", 6);
    fw_alog_free(a, NULL);
    fw_alog_rec recs[] = {
        { .host = "10.0.0.1", .port = "4242", .req = &req, .status = 200, .body_bytes = 1234,
          .micros = 2500001, .captured = &cap },
        { .host = "", .port = "", .req = NULL, .status = 400, .body_bytes = 0, .micros = 0 },
    };
    char *out = run(items, (int)(sizeof(items) / sizeof(items[0])), 0, recs, 2);
    char *second = strchr(out, '\n');
    CHECK(second != NULL);
    if (second) {
        *second++ = 0;
        CHECK_LINE(out, "10.0.0.1:4242 alice \"GET /a/b?x=1 HTTP/1.1\" GET /a/b x=1 HTTP/1.1 200 1234 "
                        "2 2500 2500001 2.500001 r ua \\\"quoted\\\"\\ - first - /a/b?x=1");
        CHECK_LINE(second, "-:- - \"-\" - -  - 400 0 0 0 0 0.000000 - - - - - - -\n");
    }
    free(out);
    fw_buf_free(&cap);
    free(buf);
}

static void test_json(void)
{
    fw_request req;
    fw_header hdrs[32];
    char *buf = parse("POST /p HTTP/1.0\r\nUser-Agent: a\"b\\c\td\xe9\r\n\r\n", &req, hdrs);
    fw_alog_item items[] = { T("{\"ua\": \""), H(FW_AL_REQ_HEADER, "user-agent"), T("\", \"s\": "),
                             A(FW_AL_STATUS), T(", \"h\": \""), A(FW_AL_PROTOCOL), T("\"}") };
    fw_alog_rec rec = { .host = "h", .port = "1", .req = &req, .status = 204 };
    char *out = run(items, 7, 1, &rec, 1);
    CHECK_LINE(out, "{\"ua\": \"a\\\"b\\\\c\\u0009d\\u00e9\", \"s\": 204, \"h\": \"HTTP/1.0\"}\n");
    free(out);
    free(buf);
}

static void test_basic_auth_users(void)
{
    static const struct { const char *auth, *want; } cases[] = {
        { "Basic Ym9iOg==", "bob\n" },            /* "bob:" */
        { "basic Ym9iOnB3", "bob\n" },            /* scheme is case-insensitive */
        { "Basic Ym9i", "-\n" },                  /* "bob": no colon, not shown */
        { "Basic !!!!", "-\n" },
        { "Bearer abc", "-\n" },
        { "Basic OnB3", "-\n" },                  /* ":pw": empty user */
        { "Basic IgA6", "\\\"\\x00\n" },         /* "\"\0:": escaped */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char raw[256];
        snprintf(raw, sizeof(raw), "GET / HTTP/1.1\r\nHost: h\r\nAuthorization: %s\r\n\r\n", cases[i].auth);
        fw_request req;
        fw_header hdrs[32];
        char *buf = parse(raw, &req, hdrs);
        fw_alog_item items[] = { A(FW_AL_USER) };
        fw_alog_rec rec = { .req = &req, .status = 200 };
        char *out = run(items, 1, 0, &rec, 1);
        CHECK_LINE(out, cases[i].want);
        free(out);
        free(buf);
    }
}

/* A value longer than VALUE_MAX (4096) is shortened, marked "...", and
 * the fields after it stay: the line is whole (issue 24, item 8: a 60 KB
 * User-Agent cut the line, and JSON with it). */
static void test_long_value_is_shortened_and_the_line_stays_whole(void)
{
    size_t n = 40000;
    char *big = malloc(n);
    memset(big, 'z', n);
    fw_alog_item items[] = { T("<"), { FW_AL_TEXT, "", 0 }, A(FW_AL_REMOTE_ADDR), T(">") };
    char *host = malloc(n + 1);
    memcpy(host, big, n);
    host[n] = 0;
    fw_alog_rec rec = { .host = host, .status = 200 };
    char *out = run(items, 4, 0, &rec, 1);
    size_t len = strlen(out);
    CHECK(len == 1 + 4093 + 3 + 1 + 1);
    CHECK(len > 5 && strcmp(out + len - 5, "...>\n") == 0);
    CHECK(out[0] == '<' && out[1] == 'z');
    free(out);
    free(host);
    free(big);
}

static void test_bad_items(void)
{
    fw_alog_item bad_atom[] = { { 999, NULL, 0 } };
    fw_alog_item nameless[] = { { FW_AL_REQ_HEADER, NULL, 0 } };
    fw_alog_cfg c1 = { .fd = 1, .items = bad_atom, .nitems = 1 };
    fw_alog_cfg c2 = { .fd = 1, .items = nameless, .nitems = 1 };
    fw_alog_cfg c3 = { .fd = -1, .items = NULL, .nitems = 0 };
    errno = 0;
    CHECK(fw_alog_new(&c1) == NULL && errno == EINVAL);
    CHECK(fw_alog_new(&c2) == NULL && errno == EINVAL);
    CHECK(fw_alog_new(&c3) == NULL && errno == EINVAL);
}

/* A pipe nobody reads: the writer blocks, the buffer fills, fw_alog_line
 * drops and counts lines without blocking; once the pipe is drained the
 * writer catches up and every line is either read or counted. */
static void test_stuck_pipe(void)
{
    int p[2];
    if (pipe(p) != 0)
        abort();
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    char line[1000];
    memset(line, 'q', sizeof(line) - 1);
    line[sizeof(line) - 1] = 0;
    fw_alog_item items[] = { A(FW_AL_STATUS), T(" "), A(FW_AL_REMOTE_ADDR) };
    fw_alog_cfg cfg = { .fd = p[1], .items = items, .nitems = 3, .buffer_bytes = 1 };   /* the minimum */
    fw_alog *a = fw_alog_new(&cfg);
    close(p[1]);
    CHECK(a != NULL);
    if (!a)
        return;
    int total = 400, dropped = 0;
    for (int i = 0; i < total; i++) {
        fw_alog_rec rec = { .host = line, .status = 200 };
        int rc = fw_alog_line(a, &rec);
        CHECK(rc == 0 || rc == -ENOBUFS);
        dropped += rc == -ENOBUFS;
    }
    CHECK(dropped > 0);
    /* Drain while the log ends: fw_alog_free writes what it queued. */
    size_t got = 0;
    char chunk[65536];
    fw_alog_counts c;
    for (int rounds = 0; rounds < 200; rounds++) {
        ssize_t r = read(p[0], chunk, sizeof(chunk));
        if (r > 0) {
            for (ssize_t k = 0; k < r; k++)
                got += chunk[k] == '\n';
            rounds = 0;
        } else {
            usleep(5000);
        }
        if (rounds > 40)
            break;
    }
    fw_alog_free(a, &c);
    ssize_t r;
    while ((r = read(p[0], chunk, sizeof(chunk))) > 0)
        for (ssize_t k = 0; k < r; k++)
            got += chunk[k] == '\n';
    close(p[0]);
    CHECK(c.full == (uint64_t)dropped);
    CHECK(c.lines + c.full == (uint64_t)total);
    CHECK(got == c.lines);
}

int main(void)
{
    test_atoms();
    test_json();
    test_basic_auth_users();
    test_long_value_is_shortened_and_the_line_stays_whole();
    test_bad_items();
    test_stuck_pipe();
    printf("test_alog: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
