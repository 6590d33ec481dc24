/* Unit tests for the request parser (cserver/fw_http.c) and fw_buf.
 *
 * No framework: CHECK* macros count passes and failures, the last line is
 * "N passed, N failed", and the exit status is non-zero on any failure.
 * Build and run with `make ctest` (ASan + UBSan).
 *
 * Every request string is copied into a heap block of exactly its size
 * before it is parsed, so a read past the end is an ASan error.
 *
 * Known issues in the code under test are checked with KNOWN_ISSUE(): they
 * print a line and are counted apart ("known"), not as failures, unless
 * FW_TEST_STRICT=1 is set in the environment. When one is fixed the check
 * prints "FIXED?" so the marker can be removed. */
#include "fw_buf.h"
#include "fw_http.h"
#include "http_sim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_NAME "test_http.c"
#include "check.h"

/* ---- parsing helpers --------------------------------------------------- */

#define MAX_H 128

static const fw_http_limits DEF = {
    .max_line = 8190, .max_head = 64 * 1024, .max_headers = 100, .max_body = 1024ull * 1024 * 1024,
};

static fw_request R;
static fw_header H[MAX_H];
static char *last_buf;          /* the copy R points into; freed by the next parse */
static size_t last_head_len;

static char *dup_exact(const char *s, size_t n)
{
    char *b = malloc(n ? n : 1);
    if (!b)
        abort();
    memcpy(b, s, n);
    return b;
}

/* Find the end of the head in s[0..n) and parse it into R.
 * Returns parse_head's result, or -2 if the head does not end in s. */
static int parse_lim(const char *s, size_t n, const fw_http_limits *lim)
{
    free(last_buf);
    last_buf = dup_exact(s, n);
    size_t scan = 0;
    size_t end = fw_http_head_end(last_buf, n, &scan);
    last_head_len = end;
    if (!end)
        return -2;
    memset(&R, 0x5a, sizeof(R));   /* parse_head must not depend on old contents */
    R.headers = H;
    return fw_http_parse_head(last_buf, end, lim, &R);
}

#define PARSE(lit) parse_lim((lit), sizeof(lit) - 1, &DEF)
#define PARSE_LIM(lit, lim) parse_lim((lit), sizeof(lit) - 1, (lim))

/* The value of the first header named `name` (exact case), or NULL. */
static const fw_header *hdr(const char *name)
{
    for (size_t i = 0; i < R.num_headers; i++)
        if (R.headers[i].name_len == strlen(name) && memcmp(R.headers[i].name, name, strlen(name)) == 0)
            return &R.headers[i];
    return NULL;
}

/* Decode a chunked body from s[0..n) fed in one piece, calling feed until it
 * stops; the decoded bytes go to out. Returns the final code (FW_CHUNK_DONE,
 * FW_HTTP_INCOMPLETE or a status); *consumed is the bytes used up.
 * The same bytes are then fed one at a time, and the result must agree. */
static int dechunk_lim(const char *s, size_t n, const fw_http_limits *lim,
                       char *out, size_t cap, size_t *out_len, size_t *consumed)
{
    char *b = dup_exact(s, n);
    fw_chunked d;
    memset(&d, 0, sizeof(d));
    size_t pos = 0, olen = 0;
    int rc;
    for (;;) {
        size_t u;
        const char *p;
        size_t pn;
        rc = fw_chunked_feed(&d, b + pos, n - pos, &u, &p, &pn, lim);
        CHECK(u <= n - pos);
        if (rc != FW_CHUNK_DATA && rc != FW_CHUNK_DONE && rc != FW_HTTP_INCOMPLETE)
            break;
        pos += u;
        if (rc != FW_CHUNK_DATA)
            break;
        CHECK(p >= b && pn > 0 && p + pn <= b + pos);
        if (olen + pn <= cap)
            memcpy(out + olen, p, pn);
        olen += pn;
    }
    free(b);
    *out_len = olen;
    *consumed = pos;

    /* One byte at a time. */
    memset(&d, 0, sizeof(d));
    size_t olen1 = 0, pos1 = 0;
    int rc1 = FW_HTTP_INCOMPLETE;
    int same_bytes = 1;
    for (size_t i = 0; i < n; i++) {
        char *one = dup_exact(s + i, 1);
        size_t u;
        const char *p;
        size_t pn;
        rc1 = fw_chunked_feed(&d, one, 1, &u, &p, &pn, lim);
        if (rc1 == FW_CHUNK_DATA) {
            if (pn != 1 || p != one || olen1 >= olen || out[olen1] != *p)
                same_bytes = 0;
            olen1++;
        }
        free(one);
        if (rc1 == FW_CHUNK_DATA || rc1 == FW_HTTP_INCOMPLETE) {
            pos1++;
            continue;
        }
        if (rc1 == FW_CHUNK_DONE)
            pos1++;
        break;
    }
    if (rc1 == FW_CHUNK_DATA)
        rc1 = FW_HTTP_INCOMPLETE;   /* ran out of input in the middle of data */
    CHECK_INT(rc1, rc);
    CHECK(same_bytes && olen1 == olen);
    if (rc == FW_CHUNK_DONE || rc == FW_HTTP_INCOMPLETE)
        CHECK_INT(pos1, pos);
    return rc;
}

static char OUT[1 << 16];
static size_t OUT_LEN, USED;

#define DECHUNK(lit) dechunk_lim((lit), sizeof(lit) - 1, &DEF, OUT, sizeof(OUT), &OUT_LEN, &USED)
#define DECHUNK_LIM(lit, lim) dechunk_lim((lit), sizeof(lit) - 1, (lim), OUT, sizeof(OUT), &OUT_LEN, &USED)

/* ---- valid requests ----------------------------------------------------- */

static void test_simple_get(void)
{
    ctx = "simple GET";
    CHECK_INT(PARSE("GET /index.html HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"), 0);
    CHECK_STR(R.method, R.method_len, "GET");
    CHECK_STR(R.target, R.target_len, "/index.html");
    CHECK_STR(R.path, R.path_len, "/index.html");
    CHECK_INT(R.query_len, 0);
    CHECK_INT(R.form, FW_TARGET_ORIGIN);
    CHECK_INT(R.minor, 1);
    CHECK_INT(R.num_headers, 2);
    CHECK_STR(R.headers[0].name, R.headers[0].name_len, "Host");
    CHECK_STR(R.headers[0].value, R.headers[0].value_len, "example.com");
    CHECK_STR(R.headers[1].name, R.headers[1].name_len, "Accept");
    CHECK_STR(R.headers[1].value, R.headers[1].value_len, "*/*");
    CHECK_INT(R.content_length, 0);
    CHECK_INT(R.has_body, 0);
    CHECK_INT(R.chunked, 0);
    CHECK_INT(R.keep_alive, 1);
    CHECK_INT(R.expect_continue, 0);
    CHECK_INT(R.is_head, 0);
    CHECK_INT(last_head_len, strlen("GET /index.html HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"));
    /* Pointers are into the caller's buffer. */
    CHECK(R.method == last_buf);
    CHECK(R.target == last_buf + 4);
}

static void test_methods(void)
{
    static const char *methods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "TRACE",
                                    "PROPFIND", "M-SEARCH", "X_CUSTOM.1", "get", "!#$%&'*+-.^_`|~"};
    char req[256];
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        ctx = methods[i];
        int n = snprintf(req, sizeof(req), "%s /x HTTP/1.1\r\nHost: a\r\n\r\n", methods[i]);
        CHECK_INT(parse_lim(req, (size_t)n, &DEF), 0);
        CHECK_STR(R.method, R.method_len, methods[i]);
        CHECK_INT(R.is_head, strcmp(methods[i], "HEAD") == 0);
    }
    ctx = "HEAD is case-sensitive";
    CHECK_INT(PARSE("head / HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_INT(R.is_head, 0);
}

static void test_target_forms(void)
{
    ctx = "origin-form with query";
    CHECK_INT(PARSE("GET /a/b%20c?x=1&y=2 HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/a/b%20c");
    CHECK_STR(R.query, R.query_len, "x=1&y=2");
    CHECK_STR(R.target, R.target_len, "/a/b%20c?x=1&y=2");

    ctx = "empty query";
    CHECK_INT(PARSE("GET /a? HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/a");
    CHECK_INT(R.query_len, 0);

    ctx = "second ? belongs to the query";
    CHECK_INT(PARSE("GET /a?b?c=d HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/a");
    CHECK_STR(R.query, R.query_len, "b?c=d");

    ctx = "fragment stripped from path";
    CHECK_INT(PARSE("GET /a/b#frag HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/a/b");
    CHECK_INT(R.query_len, 0);
    CHECK_STR(R.target, R.target_len, "/a/b#frag");

    ctx = "fragment stripped from query";
    CHECK_INT(PARSE("GET /a?q=1#frag HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/a");
    CHECK_STR(R.query, R.query_len, "q=1");

    ctx = "? after # is fragment";
    CHECK_INT(PARSE("GET /a#f?q=1 HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/a");
    CHECK_INT(R.query_len, 0);

    ctx = "absolute-form";
    CHECK_INT(PARSE("GET http://example.com:8080/p/q?x=y#f HTTP/1.1\r\nHost: example.com:8080\r\n\r\n"), 0);
    CHECK_INT(R.form, FW_TARGET_ABSOLUTE);
    CHECK_STR(R.path, R.path_len, "/p/q");
    CHECK_STR(R.query, R.query_len, "x=y");
    CHECK_STR(R.target, R.target_len, "http://example.com:8080/p/q?x=y#f");

    ctx = "absolute-form https, scheme case-insensitive";
    CHECK_INT(PARSE("GET HTTPS://Example.COM/ HTTP/1.1\r\nHost: example.com\r\n\r\n"), 0);
    CHECK_INT(R.form, FW_TARGET_ABSOLUTE);
    CHECK_STR(R.path, R.path_len, "/");

    ctx = "absolute-form, empty path is /";
    CHECK_INT(PARSE("GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/");
    CHECK_INT(R.query_len, 0);
    CHECK_INT(PARSE("GET http://example.com?a=b HTTP/1.1\r\nHost: example.com\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/");
    CHECK_STR(R.query, R.query_len, "a=b");

    ctx = "absolute-form, IPv6 literal";
    CHECK_INT(PARSE("GET http://[::1]:8080/x HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"), 0);
    CHECK_STR(R.path, R.path_len, "/x");

    ctx = "authority-form (CONNECT)";
    CHECK_INT(PARSE("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"), 0);
    CHECK_INT(R.form, FW_TARGET_AUTHORITY);
    CHECK_STR(R.target, R.target_len, "example.com:443");
    CHECK_INT(R.path_len, 0);
    CHECK_INT(R.query_len, 0);
    CHECK_INT(PARSE("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    CHECK_INT(R.form, FW_TARGET_AUTHORITY);

    ctx = "asterisk-form (OPTIONS)";
    CHECK_INT(PARSE("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_INT(R.form, FW_TARGET_ASTERISK);
    CHECK_STR(R.target, R.target_len, "*");
    CHECK_STR(R.path, R.path_len, "*");
    CHECK_INT(R.query_len, 0);

    ctx = "OPTIONS with origin-form";
    CHECK_INT(PARSE("OPTIONS /x HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_INT(R.form, FW_TARGET_ORIGIN);
}

static void test_headers(void)
{
    ctx = "OWS trimmed, inner whitespace kept";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nX-A: \t  one  two \t \r\nX-B:x\r\nX-Empty:\r\nX-Sp:   \r\n\r\n"), 0);
    CHECK_INT(R.num_headers, 5);
    CHECK_STR(hdr("X-A")->value, hdr("X-A")->value_len, "one  two");
    CHECK_STR(hdr("X-B")->value, hdr("X-B")->value_len, "x");
    CHECK_INT(hdr("X-Empty")->value_len, 0);
    CHECK_INT(hdr("X-Sp")->value_len, 0);

    ctx = "names keep their case, order kept, duplicates kept";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nhOsT: a\r\nX-Dup: 1\r\nx-dup: 2\r\n\r\n"), 0);
    CHECK_INT(R.num_headers, 3);
    CHECK_STR(R.headers[0].name, R.headers[0].name_len, "hOsT");
    CHECK_STR(R.headers[1].value, R.headers[1].value_len, "1");
    CHECK_STR(R.headers[2].name, R.headers[2].name_len, "x-dup");
    CHECK_STR(R.headers[2].value, R.headers[2].value_len, "2");

    ctx = "obs-text in values";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nX-Latin: caf\xe9 \xff\x80\r\n\r\n"), 0);
    CHECK_STR(hdr("X-Latin")->value, hdr("X-Latin")->value_len, "caf\xe9 \xff\x80");

    ctx = "names as long as the framing ones";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nAccept-Charset: chunked\r\nIf-Modified-Since: 1\r\n"
                    "Content-Lengtx: x\r\nTransfer-Encodinx: gzip\r\nHosts: a\r\nExpects: x\r\n\r\n"), 0);
    CHECK_INT(R.num_headers, 7);
    CHECK_INT(R.chunked, 0);
    CHECK_INT(R.content_length, 0);

    ctx = "every tchar in a name";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\n!#$%&'*+-.^_`|~09azAZ: v\r\n\r\n"), 0);
    CHECK_INT(R.num_headers, 2);

    ctx = "empty Host is allowed (origin-form)";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost:\r\n\r\n"), 0);
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"), 0);
    ctx = "Host authorities that are fine";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: h.test:65535\r\n\r\n"), 0);
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: h.test:\r\n\r\n"), 0);
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: 10.0.0.1:8080\r\n\r\n"), 0);
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n"), 0);
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]:8080\r\n\r\n"), 0);    /* RFC 6874 zone */
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: [v1.fe80::a+en1]\r\n\r\n"), 0);         /* IPvFuture */
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: xn--bcher-kva.example\r\n\r\n"), 0);
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a%20b.test\r\n\r\n"), 0);

    ctx = "HTTP/1.0 without Host";
    CHECK_INT(PARSE("GET / HTTP/1.0\r\n\r\n"), 0);
    CHECK_INT(R.minor, 0);
    CHECK_INT(R.num_headers, 0);
}

static void test_keep_alive(void)
{
    ctx = "1.1 default keep-alive";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 1);
    ctx = "1.1 Connection: close";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.1 Connection: CLOSE (case-insensitive)";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: CLOSE\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.1 close in a token list";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, close , TE\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.1 close in a second Connection header";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nconnection: close\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.1 close and keep-alive: close wins";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.1 'closed' is not 'close'";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: closed, xclose\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 1);
    ctx = "1.1 empty list elements";
    CHECK_INT(PARSE("GET / HTTP/1.1\r\nHost: a\r\nConnection: ,, close,\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.0 default close";
    CHECK_INT(PARSE("GET / HTTP/1.0\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.0 Connection: keep-alive";
    CHECK_INT(PARSE("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 1);
    ctx = "1.0 keep-alive in a list";
    CHECK_INT(PARSE("GET / HTTP/1.0\r\nConnection: foo, keep-alive\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 1);
    ctx = "1.0 keep-alive and close";
    CHECK_INT(PARSE("GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
    ctx = "1.0 other token only";
    CHECK_INT(PARSE("GET / HTTP/1.0\r\nConnection: upgrade\r\n\r\n"), 0);
    CHECK_INT(R.keep_alive, 0);
}

static void test_expect(void)
{
    ctx = "Expect: 100-continue";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"), 0);
    CHECK_INT(R.expect_continue, 1);
    CHECK_INT(R.has_body, 1);
    ctx = "Expect: 100-Continue (case-insensitive)";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nexpect: 100-CONTINUE\r\n\r\n"), 0);
    CHECK_INT(R.expect_continue, 1);
    ctx = "Expect: other -> 417";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n"), 417);
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue, foo\r\n\r\n"), 417);
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nExpect:\r\n\r\n"), 417);
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nExpect: x\r\n\r\n"), 417);
    ctx = "HTTP/1.0 has no 100 Continue";
    CHECK_INT(PARSE("POST / HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"), 0);
    CHECK_INT(R.expect_continue, 0);
    CHECK_INT(PARSE("POST / HTTP/1.0\r\nExpect: something\r\n\r\n"), 0);
    CHECK_INT(R.expect_continue, 0);
    ctx = "no Expect";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n"), 0);
    CHECK_INT(R.expect_continue, 0);
}

static void test_framing_valid(void)
{
    ctx = "Content-Length";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 42\r\n\r\n"), 0);
    CHECK_INT(R.content_length, 42);
    CHECK_INT(R.has_body, 1);
    CHECK_INT(R.chunked, 0);
    ctx = "Content-Length: 0";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"), 0);
    CHECK_INT(R.content_length, 0);
    CHECK_INT(R.has_body, 0);
    ctx = "Content-Length leading zeros, OWS";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\ncontent-length: \t007 \r\n\r\n"), 0);
    CHECK_INT(R.content_length, 7);
    ctx = "Content-Length: 19 digits under max_body";
    {
        fw_http_limits big = DEF;
        big.max_body = UINT64_MAX;
        CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n", &big), 0);
        CHECK(R.content_length == 9999999999999999999ull);
    }
    ctx = "Content-Length on HTTP/1.0";
    CHECK_INT(PARSE("POST / HTTP/1.0\r\nContent-Length: 5\r\n\r\n"), 0);
    CHECK_INT(R.content_length, 5);
    CHECK_INT(R.has_body, 1);

    ctx = "Transfer-Encoding: chunked";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"), 0);
    CHECK_INT(R.chunked, 1);
    CHECK_INT(R.has_body, 1);
    CHECK_INT(R.content_length, 0);
    ctx = "TE case-insensitive";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: ChUnKeD\r\n\r\n"), 0);
    CHECK_INT(R.chunked, 1);
    ctx = "TE with OWS and empty list elements";
    CHECK_INT(PARSE("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked ,\r\n\r\n"), 0);
    CHECK_INT(R.chunked, 1);
}

/* ---- rejections --------------------------------------------------------- */

struct bad {
    int status;
    const char *req;
    size_t len;
    const char *why;
};
#define BAD(st, lit, why) {(st), (lit), sizeof(lit) - 1, (why)}

static const struct bad BADS[] = {
    /* framing */
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "CL + TE"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "TE + CL"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", "duplicate CL, same value"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\ncontent-length: 4\r\n\r\n", "duplicate CL"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n", "CL list"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n", "CL sign"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", "CL negative"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", "CL hex"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 0\r\n\r\n", "CL inner space"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", "CL empty"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3a\r\n\r\n", "CL trailing junk"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", "CL 2^64"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", "CL overflow"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 00000000000000000001\r\n\r\n", "CL 20 digits"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "TE last not chunked"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", "TE gzip only"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", "TE identity"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", "TE empty"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", "TE headers, last gzip"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", "chunked twice"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "chunked twice, two headers"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunk\r\n\r\n", "TE chunk"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chun ked\r\n\r\n", "TE inner space"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", "TE parameter"),
    BAD(400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", "TE quoted"),
    BAD(501, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "gzip, chunked"),
    BAD(501, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", "gzip / chunked, two headers"),
    BAD(400, "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "TE on HTTP/1.0"),
    /* field syntax */
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", "obs-fold SP"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n\tc\r\n\r\n", "obs-fold HTAB"),
    BAD(400, "GET / HTTP/1.1\r\n Host: a\r\n\r\n", "SP before the first field"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", "bare CR in value"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\r\n\r\n", "CR CR LF"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A\r: b\r\n\r\n", "bare CR in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", "bare LF after a field"),
    BAD(400, "GET / HTTP/1.1\nHost: a\r\n\r\n", "bare LF after the request line"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\n\n", "bare LF head end"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\n\r\n", "LF CR LF head end"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\n\n", "CRLF LF head end"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n", "NUL in value"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x01\r\n\r\n", "CTL in value"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x7f\r\n\r\n", "DEL in value"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: \x1b[0m\r\n\r\n", "ESC in value"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A : b\r\n\r\n", "SP before colon"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX-A\t: b\r\n\r\n", "HTAB before colon"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n", "SP in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n", "( in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX\"A: b\r\n\r\n", "quote in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX/A: b\r\n\r\n", "/ in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX\xe9: b\r\n\r\n", "obs-text in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nX\x00: b\r\n\r\n", "NUL in name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", "empty name"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", "no colon"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close;x\r\n\r\n", "Connection element not a token"),
    /* request line */
    BAD(400, "G(T / HTTP/1.1\r\nHost: a\r\n\r\n", "( in method"),
    BAD(400, "G\x00T / HTTP/1.1\r\nHost: a\r\n\r\n", "NUL in method"),
    BAD(400, "G\xc3\x89T / HTTP/1.1\r\nHost: a\r\n\r\n", "UTF-8 in method"),
    BAD(400, " GET / HTTP/1.1\r\nHost: a\r\n\r\n", "SP before method"),
    BAD(400, "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", "HTAB separator"),
    BAD(400, "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", "two SP after method"),
    BAD(400, "GET /  HTTP/1.1\r\nHost: a\r\n\r\n", "two SP before version"),
    BAD(400, "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", "SP after version"),
    BAD(400, "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", "SP in target"),
    BAD(400, "GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n", "obs-text in target"),
    BAD(400, "GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", "CTL in target"),
    BAD(400, "GET /\r HTTP/1.1\r\nHost: a\r\n\r\n", "CR in target"),
    BAD(400, "GET / http/1.1\r\nHost: a\r\n\r\n", "lowercase version"),
    BAD(400, "GET / HTTP/1.10\r\nHost: a\r\n\r\n", "version 1.10"),
    BAD(400, "GET / HTTP/1\r\nHost: a\r\n\r\n", "version 1"),
    BAD(400, "GET / HTTP/a.1\r\nHost: a\r\n\r\n", "version letter"),
    BAD(400, "GET / HTTPS/1.1\r\nHost: a\r\n\r\n", "HTTPS/1.1"),
    BAD(505, "GET / HTTP/2.0\r\nHost: a\r\n\r\n", "HTTP/2.0"),
    BAD(505, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2 preface"),
    BAD(505, "GET / HTTP/3.0\r\nHost: a\r\n\r\n", "HTTP/3.0"),
    BAD(505, "GET / HTTP/0.9\r\nHost: a\r\n\r\n", "HTTP/0.9 version"),
    BAD(505, "GET / HTTP/1.2\r\nHost: a\r\n\r\n", "HTTP/1.2"),
    BAD(400, "GET /\r\n\r\n", "HTTP/0.9 request line"),
    BAD(400, "GET / \r\n\r\n", "empty version"),
    BAD(400, "GET\r\n\r\n", "method only"),
    /* Host */
    BAD(400, "GET / HTTP/1.1\r\n\r\n", "1.1 without Host"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", "two Host"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", "two Host, case"),
    BAD(400, "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", "two Host on 1.0"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "SP in Host"),
    /* RFC 9112 3.2: a Host that is no authority (issue 23, item 11). */
    BAD(400, "GET / HTTP/1.1\r\nHost: h.test:99999x\r\n\r\n", "Host port not digits"),
    BAD(400, "GET / HTTP/1.1\r\nHost: h.test:99999\r\n\r\n", "Host port over 65535"),
    BAD(400, "GET / HTTP/1.1\r\nHost: h.test:000080\r\n\r\n", "Host port over five digits"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n", "Host with two colons"),
    BAD(400, "GET / HTTP/1.1\r\nHost: :80\r\n\r\n", "Host port without a host"),
    BAD(400, "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", "Host IP literal not closed"),
    BAD(400, "GET / HTTP/1.1\r\nHost: []\r\n\r\n", "Host empty IP literal"),
    BAD(400, "GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n", "Host junk after an IP literal"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a]b\r\n\r\n", "Host bracket in a reg-name"),
    BAD(400, "GET http://h.test:8x/ HTTP/1.1\r\nHost: h.test\r\n\r\n", "absolute-form port not digits"),
    BAD(400, "CONNECT h.test:70000 HTTP/1.1\r\nHost: h.test\r\n\r\n", "CONNECT port over 65535"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", "/ in Host"),
    BAD(400, "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", "userinfo in Host"),
    BAD(400, "GET / HTTP/1.1\r\nHost: a\"b\r\n\r\n", "quote in Host"),
    BAD(400, "GET / HTTP/1.1\r\nHost: caf\xe9\r\n\r\n", "obs-text in Host"),
    /* targets */
    BAD(400, "GET http://u:p@a/ HTTP/1.1\r\nHost: a\r\n\r\n", "userinfo in absolute-form"),
    BAD(400, "GET http://@a/ HTTP/1.1\r\nHost: a\r\n\r\n", "empty userinfo"),
    BAD(400, "GET http:/// HTTP/1.1\r\nHost: a\r\n\r\n", "absolute-form, empty authority"),
    BAD(400, "GET http:// HTTP/1.1\r\nHost: a\r\n\r\n", "absolute-form, nothing after scheme"),
    BAD(400, "GET http://a\"b/ HTTP/1.1\r\nHost: a\r\n\r\n", "absolute-form, bad authority char"),
    BAD(400, "GET http://a{b}/ HTTP/1.1\r\nHost: a\r\n\r\n", "absolute-form, brace in authority"),
    BAD(400, "GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "ftp scheme"),
    BAD(400, "GET http:a/ HTTP/1.1\r\nHost: a\r\n\r\n", "http: without //"),
    BAD(400, "GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", "relative target"),
    BAD(400, "GET example.com:80 HTTP/1.1\r\nHost: a\r\n\r\n", "authority-form with GET"),
    BAD(400, "GET * HTTP/1.1\r\nHost: a\r\n\r\n", "* with GET"),
    BAD(400, "POST * HTTP/1.1\r\nHost: a\r\n\r\n", "* with POST"),
    BAD(400, "options * HTTP/1.1\r\nHost: a\r\n\r\n", "* with lowercase options"),
    BAD(400, "OPTIONS ** HTTP/1.1\r\nHost: a\r\n\r\n", "OPTIONS **"),
    BAD(400, "CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT with origin-form"),
    BAD(400, "CONNECT http://a:80/ HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT with absolute-form"),
    BAD(400, "CONNECT * HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT *"),
    BAD(400, "CONNECT example.com HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT without port"),
    BAD(400, "CONNECT example.com: HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT empty port"),
    BAD(400, "CONNECT :443 HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT empty host"),
    BAD(400, "CONNECT a:44x HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT port not digits"),
    BAD(400, "CONNECT u@a:443 HTTP/1.1\r\nHost: a\r\n\r\n", "CONNECT userinfo"),
};

static void test_rejections(void)
{
    for (size_t i = 0; i < sizeof(BADS) / sizeof(BADS[0]); i++) {
        ctx = BADS[i].why;
        CHECK_INT(parse_lim(BADS[i].req, BADS[i].len, &DEF), BADS[i].status);
    }
}

/* ---- limits ------------------------------------------------------------- */

static char *make_request(size_t target_len, size_t nheaders, size_t value_len, size_t *out_len)
{
    size_t cap = target_len + nheaders * (value_len + 32) + 128;
    char *s = malloc(cap);
    size_t n = 0;
    n += (size_t)sprintf(s + n, "GET /");
    memset(s + n, 'a', target_len - 1);
    n += target_len - 1;
    n += (size_t)sprintf(s + n, " HTTP/1.1\r\nHost: a\r\n");
    for (size_t i = 0; i < nheaders; i++) {
        n += (size_t)sprintf(s + n, "X-%zu: ", i);
        memset(s + n, 'v', value_len);
        n += value_len;
        n += (size_t)sprintf(s + n, "\r\n");
    }
    n += (size_t)sprintf(s + n, "\r\n");
    *out_len = n;
    return s;
}

static void test_limits(void)
{
    fw_http_limits lim = DEF;
    size_t n;
    char *s;

    /* max_line counts the request line without its CRLF: with
     * "GET /aaa HTTP/1.1" being 4 + T + 9 bytes. */
    lim.max_line = 100;
    ctx = "request line at max_line";
    s = make_request(100 - 13, 0, 0, &n);            /* 4 + 87 + 9 = 100 */
    CHECK_INT(parse_lim(s, n, &lim), 0);
    CHECK_INT(fw_http_check_partial(s, n, &lim), FW_HTTP_INCOMPLETE);
    free(s);
    ctx = "request line one past max_line -> 414";
    s = make_request(100 - 12, 0, 0, &n);
    CHECK_INT(parse_lim(s, n, &lim), 414);
    CHECK_INT(fw_http_check_partial(s, n, &lim), 414);
    free(s);
    ctx = "unfinished request line past max_line -> 414";
    s = make_request(200, 0, 0, &n);
    CHECK_INT(fw_http_check_partial(s, 101, &lim), 414);
    CHECK_INT(fw_http_check_partial(s, 100, &lim), FW_HTTP_INCOMPLETE);
    free(s);

    ctx = "header count at max_headers";
    lim = DEF;
    lim.max_headers = 5;
    s = make_request(2, 4, 3, &n);                   /* Host + 4 = 5 fields */
    CHECK_INT(parse_lim(s, n, &lim), 0);
    CHECK_INT(R.num_headers, 5);
    free(s);
    ctx = "header count past max_headers -> 431";
    s = make_request(2, 5, 3, &n);
    CHECK_INT(parse_lim(s, n, &lim), 431);
    free(s);
    ctx = "max_headers = 1";
    lim.max_headers = 1;
    CHECK_INT(PARSE_LIM("GET / HTTP/1.1\r\nHost: a\r\n\r\n", &lim), 0);
    CHECK_INT(PARSE_LIM("GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\n", &lim), 431);
    ctx = "default max_headers (100) in the parser, 101 -> 431";
    s = make_request(2, 99, 1, &n);
    CHECK_INT(parse_lim(s, n, &DEF), 0);
    free(s);
    s = make_request(2, 100, 1, &n);
    CHECK_INT(parse_lim(s, n, &DEF), 431);
    free(s);

    ctx = "head size past max_head -> 431 (check_partial and connection model)";
    lim = DEF;
    lim.max_head = 300;
    s = make_request(2, 10, 40, &n);                 /* well over 300 bytes */
    CHECK(n > 300);
    CHECK_INT(fw_http_check_partial(s, 300, &lim), FW_HTTP_INCOMPLETE);
    CHECK_INT(fw_http_check_partial(s, 301, &lim), 431);
    {
        sim_result *res = malloc(sizeof(*res));
        sim_whole(s, n, &lim, res);
        CHECK_INT(res->end, SIM_END_ERROR);
        CHECK_INT(res->status, 431);
        CHECK_INT(res->stage, SIM_STAGE_TOO_BIG);
        sim_free(res);
        sim_bytewise(s, n, &lim, res);
        CHECK_INT(res->end, SIM_END_ERROR);
        CHECK_INT(res->status, 431);
        CHECK_INT(res->stage, SIM_STAGE_PARTIAL);
        sim_free(res);
        /* a head of exactly max_head bytes is fine */
        free(s);
        s = make_request(2, 0, 0, &n);
        lim.max_head = n;
        sim_whole(s, n, &lim, res);
        CHECK_INT(res->end, SIM_END_CLEAN);
        CHECK_INT(res->nreqs, 1);
        sim_free(res);
        lim.max_head = n - 1;
        sim_whole(s, n, &lim, res);
        CHECK_INT(res->status, 431);
        sim_free(res);
        free(res);
    }
    free(s);

    ctx = "long line inside a too-big head is 414";
    lim = DEF;
    lim.max_line = 50;
    lim.max_head = 60;
    s = make_request(80, 0, 0, &n);
    {
        sim_result *res = malloc(sizeof(*res));
        sim_whole(s, n, &lim, res);
        CHECK_INT(res->status, 414);
        sim_free(res);
        free(res);
    }
    free(s);

    ctx = "Content-Length over max_body -> 413";
    lim = DEF;
    lim.max_body = 1000;
    CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n", &lim), 0);
    CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n", &lim), 413);
    CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n", &lim), 413);
    ctx = "413 takes precedence over Expect: 100-continue";
    CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1001\r\n\r\n", &lim), 413);
    ctx = "max_body = 0";
    lim.max_body = 0;
    CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", &lim), 0);
    CHECK_INT(PARSE_LIM("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n", &lim), 413);
}

/* ---- the helpers: skip_crlf, head_end, check_partial --------------------- */

static void test_skip_crlf(void)
{
    ctx = "skip_crlf";
    CHECK_INT(fw_http_skip_crlf("GET", 3), 0);
    CHECK_INT(fw_http_skip_crlf("\r\nGET", 5), 2);
    CHECK_INT(fw_http_skip_crlf("\nGET", 4), 1);
    CHECK_INT(fw_http_skip_crlf("\r\n\n\r\n\r\nGET", 10), 7);
    CHECK_INT(fw_http_skip_crlf("\r\n\r", 3), 2);     /* a lone CR may still get its LF */
    CHECK_INT(fw_http_skip_crlf("\r\r\n", 3), 0);
    CHECK_INT(fw_http_skip_crlf("\rX", 2), 0);
    CHECK_INT(fw_http_skip_crlf(" \r\n", 3), 0);
    CHECK_INT(fw_http_skip_crlf("\r\n", 2), 2);
    CHECK_INT(fw_http_skip_crlf("", 0), 0);
}

/* fw_http_token_is against fw_http_token_eq on every token character in
 * every position of every literal the server compares names with. */
static void test_token_is(void)
{
    ctx = "token_is";
    static const char *lits[] = { "te", "date", "host", "server", "trailer", "upgrade", "connection",
                                  "keep-alive", "content-length", "proxy-connection", "transfer-encoding" };
    CHECK_INT(fw_http_token_is("Content-Length", 14, "content-length"), 1);
    CHECK_INT(fw_http_token_is("CONTENT-LENGTH", 14, "content-length"), 1);
    CHECK_INT(fw_http_token_is("Content_Length", 14, "content-length"), 0);
    CHECK_INT(fw_http_token_is("HOST", 4, "host"), 1);
    CHECK_INT(fw_http_token_is("Hos7", 4, "host"), 0);
    for (size_t k = 0; k < sizeof(lits) / sizeof(lits[0]); k++) {
        size_t n = strlen(lits[k]);
        char name[32];
        for (size_t pos = 0; pos < n; pos++)
            for (int ch = 0; ch < 256; ch++) {
                if (!fw_http_is_tchar((unsigned char)ch))
                    continue;
                memcpy(name, lits[k], n);
                name[pos] = (char)ch;
                CHECK_INT(fw_http_token_is(name, n, lits[k]), fw_http_token_eq(name, n, lits[k]));
            }
    }
}

static void test_head_end(void)
{
    size_t scan;
    ctx = "head_end CRLFCRLF";
    scan = 0;
    CHECK_INT(fw_http_head_end("GET / HTTP/1.1\r\nHost: a\r\n\r\nBODY", 31, &scan), 27);
    ctx = "head_end LF LF / LF CRLF";
    scan = 0;
    CHECK_INT(fw_http_head_end("A\n\nB", 4, &scan), 3);
    scan = 0;
    CHECK_INT(fw_http_head_end("A\n\r\nB", 5, &scan), 4);
    ctx = "head_end: CR CR LF is not a blank line";
    scan = 0;
    CHECK_INT(fw_http_head_end("A\r\n\r\r\nB", 7, &scan), 0);
    CHECK_INT(scan, 7);
    ctx = "head_end: not yet";
    scan = 0;
    CHECK_INT(fw_http_head_end("GET / HTTP/1.1\r\nHost: a\r\n\r", 26, &scan), 0);
    CHECK_INT(scan, 26);
    CHECK_INT(fw_http_head_end("GET / HTTP/1.1\r\nHost: a\r\n\r\n", 27, &scan), 27);
    ctx = "head_end: empty input";
    scan = 0;
    CHECK_INT(fw_http_head_end("", 0, &scan), 0);

    ctx = "head_end incremental == one piece, at every length";
    static const char *heads[] = {
        "GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\ntrailing",
        "A\n\nB", "A\n\r\nB", "AB\r\n\r\r\n\r\n", "\n\nX", "x\r\n\r\n\r\n",
    };
    for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
        size_t n = strlen(heads[h]);
        size_t whole_scan = 0;
        size_t whole = fw_http_head_end(heads[h], n, &whole_scan);
        size_t inc = 0, at = 0;
        scan = 0;
        for (size_t k = 1; k <= n && !inc; k++) {
            char *b = dup_exact(heads[h], k);
            inc = fw_http_head_end(b, k, &scan);
            at = k;
            free(b);
        }
        CHECK_INT(inc, whole);
        if (whole)
            CHECK_INT(at, whole);   /* found as soon as its last byte arrived */
    }
}

static void test_parse_head_direct(void)
{
    /* Lengths that head_end() would not produce. */
    fw_request r;
    r.headers = H;
    ctx = "parse_head without a line end";
    char *b = dup_exact("GET / HTTP/1.1", 14);
    CHECK_INT(fw_http_parse_head(b, 14, &DEF, &r), 400);
    free(b);
    ctx = "parse_head with bytes after the empty line";
    b = dup_exact("GET / HTTP/1.1\r\nHost: a\r\n\r\nX", 28);
    CHECK_INT(fw_http_parse_head(b, 28, &DEF, &r), 400);
    free(b);
    ctx = "parse_head: a head cut after a field line (no empty line) is accepted";
    b = dup_exact("GET / HTTP/1.1\r\nHost: a\r\n", 25);
    CHECK_INT(fw_http_parse_head(b, 25, &DEF, &r), 0);   /* see the report: harmless, head_end() decides */
    free(b);
}

static void test_check_partial(void)
{
    ctx = "check_partial";
    CHECK_INT(fw_http_check_partial("", 0, &DEF), FW_HTTP_INCOMPLETE);
    CHECK_INT(fw_http_check_partial("G", 1, &DEF), FW_HTTP_INCOMPLETE);
    CHECK_INT(fw_http_check_partial("GET", 3, &DEF), FW_HTTP_INCOMPLETE);
    CHECK_INT(fw_http_check_partial("GET /x HTTP/1.1\r\nHost", 21, &DEF), FW_HTTP_INCOMPLETE);
    CHECK_INT(fw_http_check_partial("GET /x HTTP/1.1\r\nHo st \x01", 24, &DEF), FW_HTTP_INCOMPLETE);
    ctx = "check_partial rejects junk early";
    CHECK_INT(fw_http_check_partial("\x16\x03\x01\x02\x00", 5, &DEF), 400);   /* TLS ClientHello */
    CHECK_INT(fw_http_check_partial(" GET", 4, &DEF), 400);
    CHECK_INT(fw_http_check_partial("GET\t", 4, &DEF), 400);
    CHECK_INT(fw_http_check_partial("G(T", 3, &DEF), 400);
    CHECK_INT(fw_http_check_partial("GET\r", 4, &DEF), 400);
    CHECK_INT(fw_http_check_partial("\x00", 1, &DEF), 400);
}

/* ---- chunked decoder ---------------------------------------------------- */

static void test_chunked(void)
{
    fw_http_limits lim = DEF;
    char *s;

    ctx = "chunked: one chunk";
    CHECK_INT(DECHUNK("5\r\nhello\r\n0\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_STR(OUT, OUT_LEN, "hello");
    CHECK_INT(USED, 15);

    ctx = "chunked: no data";
    CHECK_INT(DECHUNK("0\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_INT(OUT_LEN, 0);
    CHECK_INT(USED, 5);

    ctx = "chunked: hex sizes, upper/lower/mixed, leading zeros";
    CHECK_INT(DECHUNK("A\r\n0123456789\r\nb\r\nabcdefghijk\r\n0010\r\n0123456789ABCDEF\r\n1f\r\n"
                      "0123456789012345678901234567890\r\n000\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_INT(OUT_LEN, 10 + 11 + 16 + 31);
    CHECK_STR(OUT, 21, "0123456789abcdefghijk");

    ctx = "chunked: extensions";
    CHECK_INT(DECHUNK("5;a=b\r\nhello\r\n6 ; name = \"v; x\" ;flag\r\n world\r\n0;last\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_STR(OUT, OUT_LEN, "hello world");
    CHECK_INT(DECHUNK("3\t;x\r\nabc\r\n0\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_STR(OUT, OUT_LEN, "abc");
    CHECK_INT(DECHUNK("3;x=\"\xe9 \\\" \\\xe9\"\r\nabc\r\n0\r\n\r\n"), FW_CHUNK_DONE); /* quoted, obs-text, quoted-pairs */
    CHECK_INT(DECHUNK("3;a;b=1;c = \"\" ; d\t=\tx \r\nabc\r\n0;z\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_STR(OUT, OUT_LEN, "abc");
    CHECK_INT(DECHUNK("3;!#$%&'*+-.^_`|~=!#$%&'*+-.^_`|~\r\nabc\r\n0\r\n\r\n"), FW_CHUNK_DONE);

    ctx = "chunked: bad extensions (RFC 9112 7.1.1 grammar)";
    CHECK_INT(DECHUNK("3;\r\nabc\r\n0\r\n\r\n"), 400);            /* empty name */
    CHECK_INT(DECHUNK("3;;a\r\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;=b\r\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;a=\r\nabc\r\n0\r\n\r\n"), 400);          /* empty value */
    CHECK_INT(DECHUNK("3;a=b=c\r\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;a b\r\nabc\r\n0\r\n\r\n"), 400);          /* two names */
    CHECK_INT(DECHUNK("3;a=b c\r\nabc\r\n0\r\n\r\n"), 400);        /* two values */
    CHECK_INT(DECHUNK("3;a=\"b\"c\r\nabc\r\n0\r\n\r\n"), 400);  /* junk after quoted */
    CHECK_INT(DECHUNK("3;a=b\"c\"\r\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;a=\"b\r\nabc\r\n0\r\n\r\n"), 400);      /* unterminated */
    CHECK_INT(DECHUNK("3;a=\"b\\\r\nabc\r\n0\r\n\r\n"), 400);  /* quoted-pair of CR */
    CHECK_INT(DECHUNK("3;a=\"\x01\"\r\nabc\r\n0\r\n\r\n"), 400); /* CTL in quoted */
    CHECK_INT(DECHUNK("3;a=\xe9\r\nabc\r\n0\r\n\r\n"), 400);     /* obs-text in a token */
    CHECK_INT(DECHUNK("3;a(b)\r\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;a,b\r\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;a\n\nabc\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0;a=\"x\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3;a ;b \r\nabc\r\n0\r\n\r\n"), FW_CHUNK_DONE);   /* BWS after names */
    CHECK_INT(DECHUNK("3;a=\"\" ;b=c ;d\r\nabc\r\n0\r\n\r\n"), FW_CHUNK_DONE);

    ctx = "chunked: size line length limit (4096 bytes after the size)";
    {
        /* BWS before ';': the SP right after the size is not counted, the
         * other SPs, ';', the name and the CR are: k SPs make k + 2. */
        static const size_t ks[] = {4094, 4095, 4098};
        for (size_t j = 0; j < 3; j++) {
            size_t k = ks[j], n = 1 + k + 2 + 10;
            s = malloc(n);
            s[0] = '1';
            memset(s + 1, ' ', k);
            memcpy(s + 1 + k, ";e", 2);
            memcpy(s + 1 + k + 2, "\r\nx\r\n0\r\n\r\n", 10);
            CHECK_INT(dechunk_lim(s, n, &DEF, OUT, sizeof(OUT), &OUT_LEN, &USED), k == 4094 ? FW_CHUNK_DONE : 400);
            free(s);
        }
    }
    for (size_t len = 4095; len <= 4097; len++) {
        /* "1;" then a name so that the tail after ';' is len bytes incl. CR */
        size_t n = 2 + (len - 1) + 10;
        s = malloc(n);
        memcpy(s, "1;", 2);
        memset(s + 2, 'e', len - 1);
        memcpy(s + 2 + len - 1, "\r\nx\r\n0\r\n\r\n", 10);
        CHECK_INT(dechunk_lim(s, n, &DEF, OUT, sizeof(OUT), &OUT_LEN, &USED),
                  len <= 4096 ? FW_CHUNK_DONE : 400);
        free(s);
    }

    ctx = "chunked: trailers are consumed, not returned";
    CHECK_INT(DECHUNK("3\r\nabc\r\n0\r\nX-Sum: 1234\r\nX-Other:a b\r\nX-E:\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_STR(OUT, OUT_LEN, "abc");
    CHECK_INT(USED, strlen("3\r\nabc\r\n0\r\nX-Sum: 1234\r\nX-Other:a b\r\nX-E:\r\n\r\n"));

    ctx = "chunked: stops at the end, the next request stays";
    CHECK_INT(DECHUNK("2\r\nhi\r\n0\r\n\r\nGET / HTTP/1.1\r\n"), FW_CHUNK_DONE);
    CHECK_INT(USED, 12);
    {
        fw_chunked d;
        memset(&d, 0, sizeof(d));
        size_t u;
        const char *p;
        size_t pn;
        CHECK_INT(fw_chunked_feed(&d, "0\r\n\r\nXYZ", 8, &u, &p, &pn, &DEF), FW_CHUNK_DONE);
        CHECK_INT(u, 5);
        CHECK_INT(fw_chunked_feed(&d, "XYZ", 3, &u, &p, &pn, &DEF), FW_CHUNK_DONE);
        CHECK_INT(u, 0);
        CHECK_INT(fw_chunked_feed(&d, "", 0, &u, &p, &pn, &DEF), FW_CHUNK_DONE);
    }

    ctx = "chunked: incomplete";
    CHECK_INT(DECHUNK("5\r\nhel"), FW_HTTP_INCOMPLETE);
    CHECK_STR(OUT, OUT_LEN, "hel");
    CHECK_INT(USED, 6);
    CHECK_INT(DECHUNK("5\r\nhello\r\n0\r\n"), FW_HTTP_INCOMPLETE);
    CHECK_INT(DECHUNK("5\r\nhello\r\n0\r\nX: y\r\n"), FW_HTTP_INCOMPLETE);
    CHECK_INT(DECHUNK(""), FW_HTTP_INCOMPLETE);

    ctx = "chunked: bad size";
    CHECK_INT(DECHUNK("\r\n"), 400);                  /* no digits */
    CHECK_INT(DECHUNK("g\r\n"), 400);
    CHECK_INT(DECHUNK("-1\r\n"), 400);
    CHECK_INT(DECHUNK("+1\r\nx\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0x5\r\nhello\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK(" 5\r\nhello\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5 \r\nhello\r\n0\r\n\r\n"), 400);     /* BWS only before ';' */
    CHECK_INT(DECHUNK("5\n\nhello\r\n0\r\n\r\n"), 400);      /* bare LF */
    CHECK_INT(DECHUNK("5\rxhello\r\n0\r\n\r\n"), 400);       /* bare CR */
    CHECK_INT(DECHUNK("5;a\x01\r\nhello\r\n0\r\n\r\n"), 400); /* CTL in ext */
    CHECK_INT(DECHUNK("5 \t ;a\r\nhello\r\n0\r\n\r\n"), FW_CHUNK_DONE);
    CHECK_INT(DECHUNK("5 x\r\nhello\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5;a\nhello\r\n0\r\n\r\n"), 400);      /* LF in ext */
    CHECK_INT(DECHUNK("5x\r\nhello\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5\x00\r\nhello\r\n0\r\n\r\n"), 400);

    ctx = "chunked: size overflow";
    lim.max_body = UINT64_MAX;
    CHECK_INT(DECHUNK_LIM("FFFFFFFFFFFFFFFF\r\nab", &lim), FW_HTTP_INCOMPLETE);  /* 16 digits fit */
    CHECK_INT(DECHUNK_LIM("10000000000000000\r\n", &lim), 400);                 /* 17 digits */
    CHECK_INT(DECHUNK_LIM("00000000000000001\r\nx\r\n0\r\n\r\n", &lim), 400);  /* 17 digits, small */
    CHECK_INT(DECHUNK("FFFFFFFFFFFFFFFFFFFFFFFF\r\n"), 413);  /* over max_body long before overflow */

    ctx = "chunked: missing CRLF after data";
    CHECK_INT(DECHUNK("5\r\nhelloX\r\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5\r\nhello\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5\r\nhello\r0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5\r\nhello0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("5\r\nhelloX\n0\r\n\r\n"), 400);    /* X where the CR goes */
    CHECK_INT(DECHUNK("5\r\nhello\rX0\r\n\r\n"), 400);    /* X where the LF goes */
    CHECK_INT(DECHUNK("5\r\nhello\n\n0\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("3\r\nhello\r\n0\r\n\r\n"), 400);     /* size smaller than data */

    ctx = "chunked: bad trailers";
    CHECK_INT(DECHUNK("0\r\nNoColon\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0\r\nX : y\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0\r\n: y\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0\r\nX: y\r\n z\r\n\r\n"), 400);        /* obs-fold */
    CHECK_INT(DECHUNK("0\r\n X: y\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0\r\nX: y\n\r\n"), 400);                /* bare LF */
    CHECK_INT(DECHUNK("0\r\nX: y\rz\r\n\r\n"), 400);           /* bare CR */
    CHECK_INT(DECHUNK("0\r\nX: \x00\r\n\r\n"), 400);
    CHECK_INT(DECHUNK("0\r\n\n"), 400);                        /* bare LF end */
    CHECK_INT(DECHUNK("0\r\n\rX"), 400);

    ctx = "chunked: max_body -> 413";
    lim = DEF;
    lim.max_body = 10;
    CHECK_INT(DECHUNK_LIM("5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n", &lim), FW_CHUNK_DONE);
    CHECK_INT(OUT_LEN, 10);
    CHECK_INT(DECHUNK_LIM("5\r\nhello\r\n6\r\nworld!\r\n0\r\n\r\n", &lim), 413);
    CHECK_STR(OUT, OUT_LEN, "hello");     /* refused on the size line, before its data */
    CHECK_INT(DECHUNK_LIM("b\r\n", &lim), 413);
    CHECK_INT(DECHUNK_LIM("0000000000b\r\n", &lim), 413);
    lim.max_body = 0;
    CHECK_INT(DECHUNK_LIM("0\r\n\r\n", &lim), FW_CHUNK_DONE);
    CHECK_INT(DECHUNK_LIM("1\r\n", &lim), 413);

    ctx = "chunked: trailer size -> 431";
    {
        /* one trailer line longer than 4096 bytes */
        size_t n = 3 + 4 + 5000 + 4;
        s = malloc(n);
        memcpy(s, "0\r\nX: ", 6);
        memset(s + 6, 'v', n - 6 - 4);
        memcpy(s + n - 4, "\r\n\r\n", 4);
        CHECK_INT(dechunk_lim(s, n, &DEF, OUT, sizeof(OUT), &OUT_LEN, &USED), 431);
        free(s);
        /* many short lines adding up to more than max_head */
        lim = DEF;
        lim.max_head = 100;
        CHECK_INT(DECHUNK_LIM("0\r\nA: 0123456789\r\nB: 0123456789\r\nC: 0123456789\r\nD: 0123456789\r\n"
                              "E: 0123456789\r\nF: 0123456789\r\nG: 0123456789\r\n\r\n", &lim), 431);
        CHECK_INT(DECHUNK_LIM("0\r\nA: 0123456789\r\nB: 0123456789\r\n\r\n", &lim), FW_CHUNK_DONE);
        /* the trailer section counts each line with its CRLF */
        lim.max_head = 15;
        CHECK_INT(DECHUNK_LIM("0\r\nA: 0123456789\r\n\r\n", &lim), FW_CHUNK_DONE);
        lim.max_head = 14;
        CHECK_INT(DECHUNK_LIM("0\r\nA: 0123456789\r\n\r\n", &lim), 431);
        /* a trailer line of 4095 bytes before its CRLF is fine, 4096 is not */
        for (size_t len = 4095; len <= 4096; len++) {
            size_t n = 3 + len + 4;
            s = malloc(n);
            memcpy(s, "0\r\nX:", 5);
            memset(s + 5, 'v', len - 2);
            memcpy(s + 3 + len, "\r\n\r\n", 4);
            CHECK_INT(dechunk_lim(s, n, &DEF, OUT, sizeof(OUT), &OUT_LEN, &USED), len == 4095 ? FW_CHUNK_DONE : 431);
            free(s);
        }
    }
}

/* ---- split equivalence and pipelining ----------------------------------- */

struct stream {
    const char *name;
    const char *bytes;
    size_t len;
    size_t nreqs;       /* requests it holds */
    int known_cr;       /* has a CRLF before a request: see test_known_issues() */
};
#define STREAM(name, lit, nreqs, k) {(name), (lit), sizeof(lit) - 1, (nreqs), (k)}

#define REQ_GET "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
#define REQ_CL "POST /submit?a=b HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nhello world"
#define REQ_CHUNKED                                                             \
    "POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"    \
    "5;name=value\r\nhello\r\n1A ; a=1 ; b=\"x y\"\r\nabcdefghijklmnopqrstuvwxyz\r\n" \
    "0\r\nX-Checksum: 1234\r\nX-Other: a b\r\n\r\n"

static const struct stream STREAMS[] = {
    STREAM("simple GET", REQ_GET, 1, 0),
    STREAM("path/query/fragment, many headers",
           "GET /p/a/t/h;p?x=1&y=%20#frag HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: split-test/1.0\r\n"
           "Accept: */*\r\nX-Empty:\r\nX-Pad: \t v a l \t\r\n\r\n", 1, 0),
    STREAM("Content-Length body", REQ_CL, 1, 0),
    STREAM("chunked with extensions and trailers", REQ_CHUNKED, 1, 0),
    STREAM("HTTP/1.0 keep-alive", "GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1, 0),
    STREAM("OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", 1, 0),
    STREAM("CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 1, 0),
    STREAM("absolute-form", "GET http://example.com/x?y=1 HTTP/1.1\r\nHost: example.com\r\n\r\n", 1, 0),
    STREAM("absolute-form, empty path", "GET http://example.com?q HTTP/1.1\r\nHost: example.com\r\n\r\n", 1, 0),
    STREAM("Expect: 100-continue", "PUT /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody", 1, 0),
    STREAM("CHUNKED upper case, hex upper/lower",
           "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\nConnection: close\r\n\r\n"
           "A\r\n0123456789\r\na\r\n0123456789\r\n00\r\n\r\n", 1, 0),
    STREAM("obs-text value", "GET / HTTP/1.1\r\nHost: a\r\nX-Latin: caf\xe9\r\n\r\n", 1, 0),
    STREAM("leading LF", "\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 1, 0),
    STREAM("pipelined GET, chunked, CL, HEAD",
           REQ_GET REQ_CHUNKED REQ_CL "HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n", 4, 0),
    STREAM("pipelined chunked x2", REQ_CHUNKED REQ_CHUNKED, 2, 0),
    STREAM("leading CRLF", "\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 1, 1),
    STREAM("CRLF after a body, then a request", REQ_CL "\r\n" REQ_GET, 2, 1),
};

/* Whole vs. split at every boundary vs. one byte at a time. */
static void test_split_equivalence(void)
{
    sim_result *whole = malloc(sizeof(*whole)), *part = malloc(sizeof(*part));
    char why[256];
    for (size_t si = 0; si < sizeof(STREAMS) / sizeof(STREAMS[0]); si++) {
        const struct stream *st = &STREAMS[si];
        ctx = st->name;
        char *in = dup_exact(st->bytes, st->len);
        sim_whole(in, st->len, &DEF, whole);
        CHECK(whole->violation == NULL);
        if (whole->violation)
            printf("  violation: %s (%s)\n", whole->violation, whole->why);
        CHECK_INT(whole->end, SIM_END_CLEAN);
        CHECK_INT(whole->nreqs, st->nreqs);
        CHECK_INT(whole->off, st->len);

        size_t bad = 0, first_bad = 0, known = 0;
        char first_why[256] = "";
        for (size_t k = 1; k < st->len; k++) {
            sim_split(in, st->len, k, &DEF, part);
            int same = part->violation == NULL && sim_compare(whole, part, 1, why, sizeof(why));
            if (!same && st->known_cr && part->lone_cr && part->end == SIM_END_ERROR && part->status == 400) {
                known++;
            } else if (!same) {
                if (!bad++) {
                    first_bad = k;
                    snprintf(first_why, sizeof(first_why), "%s", part->violation ? part->why : why);
                }
            }
            sim_free(part);
        }
        CHECK_INT(bad, 0);
        if (bad)
            printf("  %zu split points differ, first at %zu: %s\n", bad, first_bad, first_why);
        CHECK_INT(known, 0);

        sim_bytewise(in, st->len, &DEF, part);
        int same = part->violation == NULL && sim_compare(whole, part, 1, why, sizeof(why));
        {
            CHECK(same);
            if (!same)
                printf("  bytewise: %s\n", part->violation ? part->why : why);
        }
        sim_free(part);
        sim_free(whole);
        free(in);
    }
    free(whole);
    free(part);
}

static void test_split_contents(void)
{
    /* The whole-run results hold what the requests say. */
    sim_result *res = malloc(sizeof(*res));
    const char *s = REQ_GET REQ_CHUNKED REQ_CL "HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n";
    size_t n = strlen(s);
    ctx = "pipelined: offsets and bodies";
    sim_whole(s, n, &DEF, res);
    CHECK_INT(res->nreqs, 4);
    size_t a = strlen(REQ_GET), b = strlen(REQ_CHUNKED), c = strlen(REQ_CL);
    size_t chunked_head = strlen("POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    size_t cl_head = c - 11;
    CHECK_INT(res->reqs[0].start, 0);
    CHECK_INT(res->reqs[0].head_len, a);
    CHECK_INT(res->reqs[0].end, a);
    CHECK_INT(res->reqs[1].start, a);
    CHECK_INT(res->reqs[1].head_len, chunked_head);
    CHECK_INT(res->reqs[1].end, a + b);
    CHECK_INT(res->reqs[1].chunked, 1);
    CHECK_STR(res->reqs[1].body, res->reqs[1].body_len, "helloabcdefghijklmnopqrstuvwxyz");
    CHECK_INT(res->reqs[2].start, a + b);
    CHECK_INT(res->reqs[2].head_len, cl_head);
    CHECK_INT(res->reqs[2].end, a + b + c);
    CHECK_INT(res->reqs[2].content_length, 11);
    CHECK_STR(res->reqs[2].body, res->reqs[2].body_len, "hello world");
    CHECK_STR(s + res->reqs[2].query.off, res->reqs[2].query.len, "a=b");
    CHECK_INT(res->reqs[3].start, a + b + c);
    CHECK_INT(res->reqs[3].is_head, 1);
    CHECK_STR(s + res->reqs[3].path.off, res->reqs[3].path.len, "/h");
    CHECK_INT(res->reqs[3].end, n);
    CHECK_INT(res->end, SIM_END_CLEAN);
    sim_free(res);

    ctx = "pipelined: raw parse_head calls, consumed lengths";
    {
        char *buf = dup_exact(s, n);
        size_t off = 0;
        const size_t heads[4] = {a, chunked_head, cl_head, n - a - b - c};
        for (int i = 0; i < 4; i++) {
            size_t scan = 0;
            size_t end = fw_http_head_end(buf + off, n - off, &scan);
            CHECK_INT(end, heads[i]);
            R.headers = H;
            CHECK_INT(fw_http_parse_head(buf + off, end, &DEF, &R), 0);
            CHECK(R.method == buf + off);
            off += end;
            if (R.chunked) {
                fw_chunked d;
                memset(&d, 0, sizeof(d));
                int rc;
                size_t u;
                const char *p;
                size_t pn;
                while ((rc = fw_chunked_feed(&d, buf + off, n - off, &u, &p, &pn, &DEF)) == FW_CHUNK_DATA)
                    off += u;
                CHECK_INT(rc, FW_CHUNK_DONE);
                off += u;
            } else {
                off += (size_t)R.content_length;
            }
        }
        CHECK_INT(off, n);
        free(buf);
    }

    ctx = "pipelined: an error in the second request";
    {
        const char *t = REQ_GET "GET / HTTP/1.1\r\nHost: a\r\nX : y\r\n\r\n" REQ_GET;
        sim_whole(t, strlen(t), &DEF, res);
        CHECK_INT(res->nreqs, 1);
        CHECK_INT(res->end, SIM_END_ERROR);
        CHECK_INT(res->status, 400);
        CHECK_INT(res->fail_at, a);
        sim_free(res);
    }

    ctx = "partial streams";
    sim_whole("GET / HTTP/1.1\r\nHost: a\r\n", 25, &DEF, res);
    CHECK_INT(res->end, SIM_END_PARTIAL_HEAD);
    sim_free(res);
    sim_whole(REQ_CL, strlen(REQ_CL) - 1, &DEF, res);
    CHECK_INT(res->end, SIM_END_PARTIAL_BODY);
    CHECK_INT(res->reqs[0].body_len, 10);
    sim_free(res);
    free(res);
}

/* ---- fixed issues, kept as regression tests ------------------------------ */

static void test_known_issues(void)
{
    /* RFC 9112 2.2 lets a server ignore empty lines before a request line
     * (old clients send CRLF after a POST body). fw_http_skip_crlf() cannot
     * drop a CR whose LF has not arrived yet, and fw_http_check_partial()
     * then treats that lone CR as a bad method: a CRLF that a TCP segment
     * boundary splits is answered 400, where the same bytes in one piece
     * parse. (And step_head() only calls skip_crlf while head_scan == 0,
     * so the LF would not be skipped on the next read either.) */
    ctx = "known issue: CRLF split before a request";
    CHECK_INT(fw_http_check_partial("\r", 1, &DEF), FW_HTTP_INCOMPLETE);
}

/* ---- fw_buf ------------------------------------------------------------- */

/* fw_buf_reserve(extra) on a small buffer, in a child with a time limit:
 * 1 if it returned -1, 0 if it returned anything else or did not return. */
static int reserve_terminates(size_t extra)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        fw_buf b = {0};
        alarm(2);
        if (fw_buf_append(&b, "0123456789", 10) != 0)
            _exit(2);
        _exit(fw_buf_reserve(&b, extra) == -1 ? 0 : 1);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_buf(void)
{
    fw_buf b = {0};
    ctx = "fw_buf";
    CHECK_INT(fw_buf_used(&b), 0);
    CHECK_INT(fw_buf_append(&b, "", 0), 0);
    CHECK(b.data == NULL);
    CHECK_INT(fw_buf_append(&b, "hello", 5), 0);
    CHECK_INT(fw_buf_used(&b), 5);
    CHECK(b.cap >= 5);
    CHECK(memcmp(fw_buf_head(&b), "hello", 5) == 0);
    fw_buf_consume(&b, 2);
    CHECK_INT(fw_buf_used(&b), 3);
    CHECK(memcmp(fw_buf_head(&b), "llo", 3) == 0);
    CHECK(fw_buf_head(&b) == b.data + 2);            /* no memmove on consume */
    fw_buf_consume(&b, 3);
    CHECK_INT(b.off, 0);                             /* emptied: reset to the start */
    CHECK_INT(b.len, 0);

    ctx = "fw_buf growth keeps contents";
    char big[10000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)('a' + i % 26);
    CHECK_INT(fw_buf_append(&b, "xyz", 3), 0);
    fw_buf_consume(&b, 1);
    CHECK_INT(fw_buf_append(&b, big, sizeof(big)), 0);
    CHECK_INT(fw_buf_used(&b), 2 + sizeof(big));
    CHECK(memcmp(fw_buf_head(&b), "yz", 2) == 0);
    CHECK(memcmp(fw_buf_head(&b) + 2, big, sizeof(big)) == 0);
    CHECK(fw_buf_room(&b) == b.cap - b.len);

    ctx = "fw_buf reclaims the consumed prefix";
    size_t cap = b.cap;
    fw_buf_consume(&b, fw_buf_used(&b) - 10);
    CHECK_INT(fw_buf_reserve(&b, cap - 20), 0);
    CHECK_INT(b.cap, cap);                           /* moved down, not grown */
    CHECK_INT(b.off, 0);
    CHECK(memcmp(fw_buf_head(&b), big + sizeof(big) - 10, 10) == 0);

    ctx = "fw_buf reserve: a size that cannot be had";
    CHECK_INT(fw_buf_reserve(&b, SIZE_MAX / 2), -1);
    CHECK_INT(fw_buf_reserve(&b, SIZE_MAX), -1);
    CHECK(reserve_terminates((size_t)1 << 63));
    CHECK_INT(fw_buf_used(&b), 10);
    CHECK(memcmp(fw_buf_head(&b), big + sizeof(big) - 10, 10) == 0);

    ctx = "fw_buf reset";
    fw_buf_reset(&b, 1 << 20);                       /* keeps a small allocation */
    CHECK(b.data != NULL);
    CHECK_INT(fw_buf_used(&b), 0);
    fw_buf_reset(&b, 16);                            /* frees a larger one */
    CHECK(b.data == NULL);
    CHECK_INT(b.cap, 0);
    CHECK_INT(fw_buf_append(&b, "a", 1), 0);
    fw_buf_free(&b);
    CHECK(b.data == NULL);
    CHECK_INT(b.cap, 0);
}

/* ---- helpers shared with the response side ------------------------------ */

static void test_token_helpers(void)
{
    ctx = "fw_http_token_eq";
    CHECK(fw_http_token_eq("Chunked", 7, "chunked"));
    CHECK(fw_http_token_eq("CHUNKED", 7, "chunked"));
    CHECK(!fw_http_token_eq("chunke", 6, "chunked"));
    CHECK(!fw_http_token_eq("chunkedx", 8, "chunked"));
    CHECK(fw_http_token_eq("", 0, ""));
    CHECK(!fw_http_token_eq("a", 1, ""));
    ctx = "fw_http_is_tchar";
    int count = 0;
    for (int c = 0; c < 256; c++)
        count += fw_http_is_tchar((unsigned char)c) != 0;
    CHECK_INT(count, 10 + 26 + 26 + 15);
    CHECK(!fw_http_is_tchar(' '));
    CHECK(!fw_http_is_tchar(':'));
    CHECK(!fw_http_is_tchar(0));
    CHECK(!fw_http_is_tchar(0xe9));
}

int main(void)
{
    check_init();

    test_simple_get();
    test_methods();
    test_target_forms();
    test_headers();
    test_keep_alive();
    test_expect();
    test_framing_valid();
    test_rejections();
    test_limits();
    test_skip_crlf();
    test_token_is();
    test_head_end();
    test_parse_head_direct();
    test_check_partial();
    test_chunked();
    test_split_equivalence();
    test_split_contents();
    test_known_issues();
    test_buf();
    test_token_helpers();

    free(last_buf);
    return check_report();
}
