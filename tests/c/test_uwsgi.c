/* Unit tests for the uwsgi packet parser and request builder
 * (cserver/fw_uwsgi.c). Build and run with `make ctest` (ASan + UBSan).
 *
 * Packets are built here from key/value lists (as nginx's uwsgi module
 * writes them). Every parse sees a heap copy of exactly the bytes that have
 * "arrived", so a read past them is an ASan error; good packets are also
 * fed one byte at a time (every proper prefix is incomplete), bad ones
 * checked to be refused as soon as the refusing byte is there and never
 * taken back. */
#include "fw_uwsgi.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_NAME "test_uwsgi.c"
#include "check.h"

static const fw_http_limits LIM = { .max_line = 8190, .max_head = 65536, .max_headers = 100,
                                    .max_body = 1 << 20 };

#define MAX_VARS 16
static fw_header VARS[MAX_VARS];
static fw_uwsgi_packet P;
static fw_request R;
static const char *WHY;

static char pkt[70000];

static void put16(char *p, size_t v)
{
    p[0] = (char)(v & 0xff);
    p[1] = (char)(v >> 8 & 0xff);
}

/* A packet into pkt: modifier1, modifier2, then key, value, ... NULL.
 * Returns its length; what follows it (a body) is appended by the caller. */
static size_t build(int m1, int m2, ...)
{
    va_list ap;
    size_t n = FW_UWSGI_HEADER;
    va_start(ap, m2);
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (!k)
            break;
        const char *v = va_arg(ap, const char *);
        put16(pkt + n, strlen(k));
        memcpy(pkt + n + 2, k, strlen(k));
        n += 2 + strlen(k);
        put16(pkt + n, strlen(v));
        memcpy(pkt + n + 2, v, strlen(v));
        n += 2 + strlen(v);
    }
    va_end(ap);
    pkt[0] = (char)m1;
    put16(pkt + 1, n - FW_UWSGI_HEADER);
    pkt[3] = (char)m2;
    return n;
}

/* Parse the first n bytes of s from an exact-size heap copy (kept alive
 * for the spans: freed at the next call). */
static long parse_n(const char *s, size_t n, size_t max_size, size_t max_vars)
{
    static char *b;
    free(b);
    b = malloc(n ? n : 1);
    if (!b)
        abort();
    memcpy(b, s, n);
    memset(VARS, 0x5a, sizeof(VARS));
    P = (fw_uwsgi_packet){ .vars = VARS, .max_vars = max_vars };
    return fw_uwsgi_parse(b, n, max_size, &P);
}

/* A good packet (and what follows it): every proper prefix incomplete,
 * then the whole; returns the length parse gave. */
static long parse_all(size_t n, size_t total)
{
    for (size_t k = 0; k < n; k++) {
        long rc = parse_n(pkt, k, LIM.max_head, MAX_VARS);
        if (rc != FW_UWSGI_INCOMPLETE) {
            printf("  (prefix of %zu bytes: %ld, %s)\n", k, rc, P.why ? P.why : "");
            return -100;
        }
    }
    return parse_n(pkt, total, LIM.max_head, MAX_VARS);
}

/* A bad packet: refused with rc from the first `at` bytes on (and
 * incomplete before), for good. */
static void refused_from(size_t n, size_t at, long rc, const char *why)
{
    for (size_t k = 0; k <= n; k++) {
        long got = parse_n(pkt, k, LIM.max_head, MAX_VARS);
        if (k < at)
            CHECK_INT(got, FW_UWSGI_INCOMPLETE);
        else {
            CHECK_INT(got, rc);
            CHECK(P.why && strstr(P.why, why));
        }
    }
}

static int request(void)
{
    return fw_uwsgi_request(&P, &LIM, &R, &WHY);
}

static void test_nginx_get(void)
{
    ctx = "nginx GET";
    size_t n = build(0, 0, "QUERY_STRING", "x=1&y", "REQUEST_METHOD", "GET", "CONTENT_TYPE", "",
                     "CONTENT_LENGTH", "", "REQUEST_URI", "/a%20b?x=1&y", "PATH_INFO", "/a b",
                     "DOCUMENT_ROOT", "/usr/share/nginx/html", "SERVER_PROTOCOL", "HTTP/1.1",
                     "REQUEST_SCHEME", "http", "REMOTE_ADDR", "192.0.2.7", "REMOTE_PORT", "40000",
                     "SERVER_PORT", "80", "SERVER_NAME", "example.org", "HTTP_HOST", "example.org",
                     "HTTP_USER_AGENT", "curl/8", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(P.num_vars, 15);
    CHECK_INT(P.modifier1, 0);
    CHECK_STR(VARS[14].name, VARS[14].name_len, "HTTP_USER_AGENT");
    CHECK_STR(VARS[14].value, VARS[14].value_len, "curl/8");
    CHECK_INT(request(), 0);
    CHECK(R.uwsgi);
    CHECK_STR(R.method, R.method_len, "GET");
    CHECK_STR(R.target, R.target_len, "/a%20b?x=1&y");
    CHECK_STR(R.path, R.path_len, "/a b");
    CHECK(R.path_decoded);
    CHECK_STR(R.query, R.query_len, "x=1&y");
    CHECK_INT(R.content_length, 0);
    CHECK(!R.has_body && !R.chunked && !R.keep_alive && !R.is_head && !R.expect_continue);
    CHECK_INT(R.minor, 1);
    CHECK_INT(R.form, FW_TARGET_ORIGIN);
    CHECK(R.headers == VARS && R.num_headers == 15);

    ctx = "vars by name";
    const fw_header *v = fw_uwsgi_var(&R, "REMOTE_ADDR", 11);
    CHECK(v && v->value_len == 9 && memcmp(v->value, "192.0.2.7", 9) == 0);
    CHECK(fw_uwsgi_var(&R, "REMOTE", 6) == NULL);
    CHECK(fw_uwsgi_is_header("HTTP_USER_AGENT", 15, "User-Agent", 10));
    CHECK(fw_uwsgi_is_header("HTTP_USER_AGENT", 15, "user-agent", 10));
    CHECK(!fw_uwsgi_is_header("HTTP_USER_AGENT", 15, "user-agen", 9));
    CHECK(!fw_uwsgi_is_header("USER_AGENT", 10, "user-agent", 10));
    CHECK(fw_uwsgi_is_header("CONTENT_TYPE", 12, "Content-Type", 12));
    CHECK(!fw_uwsgi_is_header("HTTP_CONTENT_TYPE", 17, "content-type", 12));
    CHECK(fw_uwsgi_is_header("CONTENT_LENGTH", 14, "content-length", 14));
}

static void test_post_body(void)
{
    ctx = "POST with a body";
    size_t n = build(0, 0, "REQUEST_METHOD", "POST", "REQUEST_URI", "/up", "PATH_INFO", "/up",
                     "CONTENT_LENGTH", "5", "CONTENT_TYPE", "text/plain", (char *)NULL);
    memcpy(pkt + n, "hello", 5);
    CHECK_INT(parse_all(n, n + 5), (long)n);     /* the body is not the packet's */
    CHECK_INT(request(), 0);
    CHECK_INT(R.content_length, 5);
    CHECK(R.has_body && !R.chunked && !R.keep_alive);
    CHECK_STR(R.query, R.query_len, "");

    ctx = "CONTENT_LENGTH twice, the same";
    n = build(0, 0, "REQUEST_METHOD", "PUT", "CONTENT_LENGTH", "12", "CONTENT_LENGTH", "12", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_INT(R.content_length, 12);

    ctx = "CONTENT_LENGTH at the limit";
    n = build(0, 0, "REQUEST_METHOD", "PUT", "CONTENT_LENGTH", "1048576", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    n = build(0, 0, "REQUEST_METHOD", "PUT", "CONTENT_LENGTH", "1048577", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 413);
    CHECK(WHY && strstr(WHY, "limit-request-body"));
}

static void test_bad_content_length(void)
{
    static const char *bad[] = { "12a", "-1", " 5", "5 ", "+5", "0x10", "1.0", "99999999999999999999",
                                 "\xd9\xa3" /* an Arabic-Indic digit */ };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctx = bad[i];
        size_t n = build(0, 0, "REQUEST_METHOD", "POST", "CONTENT_LENGTH", bad[i], (char *)NULL);
        CHECK_INT(parse_all(n, n), (long)n);
        CHECK_INT(request(), 400);
        CHECK(WHY && strstr(WHY, "CONTENT_LENGTH"));
    }
    ctx = "CONTENT_LENGTH twice, differently";
    size_t n = build(0, 0, "REQUEST_METHOD", "POST", "CONTENT_LENGTH", "5", "CONTENT_LENGTH", "50", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 400);
    CHECK(WHY && strstr(WHY, "two different"));
    n = build(0, 0, "REQUEST_METHOD", "POST", "CONTENT_LENGTH", "5", "CONTENT_LENGTH", "", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 400);
}

static void test_method(void)
{
    ctx = "no REQUEST_METHOD";
    size_t n = build(0, 0, "REQUEST_URI", "/", "PATH_INFO", "/", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 400);
    CHECK(WHY && strstr(WHY, "uwsgi_params"));

    ctx = "an empty packet";
    n = build(0, 0, (char *)NULL);
    CHECK_INT(n, 4);
    CHECK_INT(parse_all(n, n), 4);
    CHECK_INT(P.num_vars, 0);
    CHECK_INT(request(), 400);

    static const char *bad[] = { "", "GE T", "GET\r\n", "G\x80T", "(GET)" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctx = "a bad REQUEST_METHOD";
        n = build(0, 0, "REQUEST_METHOD", bad[i], (char *)NULL);
        CHECK_INT(parse_all(n, n), (long)n);
        CHECK_INT(request(), 400);
    }

    ctx = "HEAD, HTTP/1.0";
    n = build(0, 0, "REQUEST_METHOD", "HEAD", "SERVER_PROTOCOL", "HTTP/1.0", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK(R.is_head);
    CHECK_INT(R.minor, 0);
    n = build(0, 0, "REQUEST_METHOD", "PROPFIND", "SERVER_PROTOCOL", "HTTP/2.0", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK(!R.is_head);
    CHECK_INT(R.minor, 1);
}

static void test_path(void)
{
    ctx = "PATH_INFO from REQUEST_URI";
    size_t n = build(0, 0, "REQUEST_METHOD", "GET", "REQUEST_URI", "/p%41th/?q=1?2", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "/p%41th/");
    CHECK(!R.path_decoded);                       /* the environ decodes it */
    CHECK_STR(R.query, R.query_len, "q=1?2");

    ctx = "absolute-form REQUEST_URI";
    n = build(0, 0, "REQUEST_METHOD", "GET", "REQUEST_URI", "http://h:1/x/y?z", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "/x/y");
    CHECK_STR(R.query, R.query_len, "z");
    n = build(0, 0, "REQUEST_METHOD", "GET", "REQUEST_URI", "http://h?z", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "");
    CHECK_STR(R.query, R.query_len, "z");
    n = build(0, 0, "REQUEST_METHOD", "OPTIONS", "REQUEST_URI", "*", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "");
    CHECK_STR(R.query, R.query_len, "");

    ctx = "neither";
    n = build(0, 0, "REQUEST_METHOD", "GET", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "");
    CHECK_STR(R.target, R.target_len, "");

    ctx = "the last of a repeated variable";
    n = build(0, 0, "REQUEST_METHOD", "GET", "PATH_INFO", "/first", "QUERY_STRING", "a", "PATH_INFO", "/second",
              "QUERY_STRING", "", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "/second");
    CHECK_STR(R.query, R.query_len, "");
    CHECK_STR(fw_uwsgi_var(&R, "PATH_INFO", 9)->value, fw_uwsgi_var(&R, "PATH_INFO", 9)->value_len, "/second");

    ctx = "modifier1 30";
    n = build(30, 0, "REQUEST_METHOD", "GET", "SCRIPT_NAME", "/app", "PATH_INFO", "/app/x", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(P.modifier1, 30);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "/x");
    n = build(30, 0, "REQUEST_METHOD", "GET", "SCRIPT_NAME", "/app", "PATH_INFO", "/other", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "/other");       /* not under it: left as it is */
    n = build(0, 0, "REQUEST_METHOD", "GET", "SCRIPT_NAME", "/app", "PATH_INFO", "/app/x", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_STR(R.path, R.path_len, "/app/x");       /* modifier1 0: PATH_INFO is PATH_INFO */

    ctx = "values of any bytes";
    n = build(0, 0, "REQUEST_METHOD", "GET", "PATH_INFO", "/a\nb\x01\xff", "HTTP_X", "", (char *)NULL);
    CHECK_INT(parse_all(n, n), (long)n);
    CHECK_INT(request(), 0);
    CHECK_INT(R.path_len, 6);
    CHECK_INT(VARS[2].value_len, 0);
}

static void test_header_refusals(void)
{
    size_t n = build(0, 0, "REQUEST_METHOD", "GET", (char *)NULL);

    ctx = "modifier1";
    static const int other[] = { 1, 5, 8, 17, 29, 31, 72, 100, 255 };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        pkt[0] = (char)other[i];
        refused_from(n, 1, FW_UWSGI_BAD, "modifier1");
    }
    pkt[0] = 0;

    ctx = "modifier2";
    pkt[3] = 1;
    refused_from(n, 4, FW_UWSGI_BAD, "modifier2");
    pkt[3] = 0;

    ctx = "datasize over the limit";
    CHECK_INT(parse_n(pkt, 3, n - 5, MAX_VARS), FW_UWSGI_TOO_LARGE);
    CHECK(P.why && strstr(P.why, "limit-request-head"));
    CHECK_INT(parse_n(pkt, 2, n - 5, MAX_VARS), FW_UWSGI_INCOMPLETE);
    CHECK_INT(parse_n(pkt, n, n - 4, MAX_VARS), (long)n);            /* exactly at it */
    /* The biggest datasize there is, against the default limit. */
    pkt[1] = pkt[2] = (char)0xff;
    CHECK_INT(parse_n(pkt, 3, 65535, MAX_VARS), FW_UWSGI_INCOMPLETE);
    CHECK_INT(parse_n(pkt, 3, 65534, MAX_VARS), FW_UWSGI_TOO_LARGE);
    /* ... and against the oversized limit, truncated: waits for it. */
    CHECK_INT(parse_n(pkt, n, 65535, MAX_VARS), FW_UWSGI_INCOMPLETE);
}

static void test_var_refusals(void)
{
    /* datasize says where the variables end: a length running past it is bad. */
    static const struct { const char *vars; size_t len; const char *why; } bad[] = {
        { "\x01", 1, "key length" },
        { "\x03\x00" "AB", 4, "key runs past" },
        { "\x02\x00" "AB", 4, "value length" },
        { "\x02\x00" "AB\x01", 5, "value length" },
        { "\x02\x00" "AB\x03\x00" "xy", 8, "value runs past" },
        { "\x00\x00\x01\x00" "x", 5, "key is empty" },
        { "\x02\x00" "A B\x00\x00", 6, "value runs past" },
        { "\x03\x00" "A B\x00\x00", 7, "not printable" },
        { "\x02\x00" "A\x80\x00\x00", 6, "not printable" },
        { "\x02\x00" "A\n\x00\x00", 6, "not printable" },
        { "\x02\x00" "AB\x00\x00\x01", 7, "key length" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctx = bad[i].why;
        memcpy(pkt + FW_UWSGI_HEADER, bad[i].vars, bad[i].len);
        pkt[0] = 0;
        put16(pkt + 1, bad[i].len);
        pkt[3] = 0;
        size_t n = FW_UWSGI_HEADER + bad[i].len;
        refused_from(n, n, FW_UWSGI_BAD, bad[i].why);
    }

    ctx = "more variables than room";
    size_t n = build(0, 0, "A", "1", "B", "2", "C", "3", (char *)NULL);
    CHECK_INT(parse_n(pkt, n, LIM.max_head, 3), (long)n);
    CHECK_INT(parse_n(pkt, n, LIM.max_head, 2), FW_UWSGI_TOO_LARGE);
    CHECK(P.why && strstr(P.why, "limit-request-fields"));
    CHECK_INT(parse_n(pkt, n - 1, LIM.max_head, 2), FW_UWSGI_INCOMPLETE);
}

static void test_big_packet(void)
{
    ctx = "the biggest packet";
    static char value[65535];
    memset(value, 'v', sizeof(value));
    /* 2 + 1 + 2 + v = 65535 */
    value[65535 - 5] = 0;
    size_t n = build(0, 0, "K", value, (char *)NULL);
    CHECK_INT(n, 4 + 65535);
    CHECK_INT(parse_n(pkt, n, 65535, MAX_VARS), (long)n);
    CHECK_INT(VARS[0].value_len, 65530);
    CHECK_INT(parse_n(pkt, n - 1, 65535, MAX_VARS), FW_UWSGI_INCOMPLETE);
}

int main(void)
{
    check_init();
    test_nginx_get();
    test_post_body();
    test_bad_content_length();
    test_method();
    test_path();
    test_header_refusals();
    test_var_refusals();
    test_big_packet();
    return check_report();
}
