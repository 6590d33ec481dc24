/* Unit tests for the PROXY protocol parser (cserver/fw_proxy.c) and the
 * address lists of --forwarded-allow-ips / --proxy-allow-from
 * (cserver/fw_netmask.c). Build and run with `make ctest` (ASan + UBSan).
 *
 * Every header is copied into a heap block of exactly the bytes that have
 * "arrived" before it is parsed, so a read past them is an ASan error; each
 * valid header is also fed one byte at a time, as a slow proxy would. */
#include "fw_netmask.h"
#include "fw_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#define CHECK_NAME "test_proxy.c"
#include "check.h"

/* ---- fw_proxy ------------------------------------------------------------ */

static fw_proxy_hdr P;

/* Parse the first n bytes of s from an exact-size heap copy. */
static long parse_n(const char *s, size_t n, int versions)
{
    char *b = malloc(n ? n : 1);
    if (!b)
        abort();
    memcpy(b, s, n);
    memset(&P, 0x5a, sizeof(P));
    long rc = fw_proxy_parse(b, n, versions, &P);
    free(b);
    return rc;
}

/* A whole header: every proper prefix is incomplete, the whole is its
 * length (bytes after it are not consumed). */
static long parse_all(const char *s, size_t n, int versions)
{
    for (size_t k = 0; k < n; k++) {
        long rc = parse_n(s, k, versions);
        if (rc != FW_PROXY_INCOMPLETE) {
            printf("  (prefix of %zu bytes: %ld, %s)\n", k, rc, P.why ? P.why : "");
            return -100;
        }
    }
    return parse_n(s, n, versions);
}

#define PARSE1(lit) parse_all((lit), sizeof(lit) - 1, FW_PROXY_V1 | FW_PROXY_V2)

static const char *client_text(unsigned *port)
{
    static char text[INET6_ADDRSTRLEN];
    text[0] = 0;
    *port = 0;
    if (P.client.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&P.client;
        inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
        *port = ntohs(a->sin_port);
    } else if (P.client.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&P.client;
        inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
        *port = ntohs(a->sin6_port);
    }
    return text;
}

#define CHECK_CLIENT(addr, port)                                     \
    do {                                                             \
        unsigned p_;                                                 \
        const char *t_ = client_text(&p_);                           \
        CHECK(!P.local);                                             \
        CHECK_STR(t_, strlen(t_), addr);                             \
        CHECK_INT(p_, port);                                         \
    } while (0)

static void test_v1(void)
{
    ctx = "v1 TCP4";
    static const char tcp4[] = "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n";
    CHECK_INT(parse_all(tcp4, 45, 3), 45);
    CHECK_INT(parse_n(tcp4, sizeof(tcp4) - 1, 3), 45);
    CHECK_INT(P.version, 1);
    CHECK_CLIENT("192.0.2.1", 56324);
    CHECK_INT(P.client_len, sizeof(struct sockaddr_in));
    CHECK_INT(parse_n(tcp4, 45, FW_PROXY_V1), 45);
    CHECK_INT(parse_n(tcp4, 45, FW_PROXY_V2), FW_PROXY_BAD);
    CHECK(P.why && strstr(P.why, "only v2"));

    ctx = "v1 TCP6";
    CHECK_INT(PARSE1("PROXY TCP6 2001:db8::1 2001:db8::2 65535 0\r\n"), 44);
    CHECK_CLIENT("2001:db8::1", 65535);
    CHECK_INT(P.client_len, sizeof(struct sockaddr_in6));
    CHECK_INT(PARSE1("PROXY TCP6 ::ffff:192.0.2.9 ::1 1 2\r\n"), 37);
    CHECK_CLIENT("::ffff:192.0.2.9", 1);

    ctx = "v1 UNKNOWN";
    CHECK_INT(PARSE1("PROXY UNKNOWN\r\n"), 15);
    CHECK(P.local);
    CHECK_INT(PARSE1("PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n"), 59);
    CHECK(P.local);

    ctx = "v1 longest";
    char longest[FW_PROXY_V1_MAX + 1];
    memset(longest, 'x', sizeof(longest));
    memcpy(longest, "PROXY UNKNOWN ", 14);
    memcpy(longest + FW_PROXY_V1_MAX - 2, "\r\n", 2);
    CHECK_INT(parse_all(longest, FW_PROXY_V1_MAX, 3), FW_PROXY_V1_MAX);
    memcpy(longest + FW_PROXY_V1_MAX - 2, "x\r\n", 3);
    CHECK_INT(parse_n(longest, FW_PROXY_V1_MAX + 1, 3), FW_PROXY_BAD);
    CHECK(P.why && strstr(P.why, "longer"));
    CHECK_INT(parse_n(longest, FW_PROXY_V1_MAX, 3), FW_PROXY_BAD);
    CHECK_INT(parse_n(longest, FW_PROXY_V1_MAX - 1, 3), FW_PROXY_INCOMPLETE);

    static const struct { const char *s; const char *why; } bad[] = {
        { "PROXY TCP4 192.0.2.1 198.51.100.2 56324\r\n", "five" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443 1\r\n", "five" },
        { "PROXY TCP4  192.0.2.1 198.51.100.2 56324 443\r\n", "five" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443 \r\n", "five" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 56324  443\r\n", "five" },
        { "PROXY TCP4 2001:db8::1 198.51.100.2 1 2\r\n", "address" },
        { "PROXY TCP6 192.0.2.1 2001:db8::2 1 2\r\n", "address" },
        { "PROXY TCP4 192.0.2.01 198.51.100.2 1 2\r\n", "address" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 65536 2\r\n", "port" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 080 2\r\n", "port" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 -1 2\r\n", "port" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 1 2x\r\n", "port" },
        { "PROXY UDP4 192.0.2.1 198.51.100.2 1 2\r\n", "protocol" },
        { "PROXY tcp4 192.0.2.1 198.51.100.2 1 2\r\n", "protocol" },
        { "PROXY \r\n", "protocol" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 1 2\n", "printable" },
        { "PROXY TCP4 192.0.2.1 198.51.100.2 1 2\rX", "CR" },
        { "PROXY TCP4 192.0.2.1\t198.51.100.2 1 2\r\n", "printable" },
        { "PROXY UNKNOWN \x80\r\n", "printable" },
        { "proxy TCP4 192.0.2.1 198.51.100.2 1 2\r\n", "no PROXY" },
        { "PROXYTCP4\r\n", "no PROXY" },
        { "GET / HTTP/1.1\r\n", "no PROXY" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctx = bad[i].s;
        CHECK_INT(parse_n(bad[i].s, strlen(bad[i].s), 3), FW_PROXY_BAD);
        CHECK(P.why && strstr(P.why, bad[i].why));
    }
    ctx = "v1: a bad start is said at once";
    CHECK_INT(parse_n("G", 1, 3), FW_PROXY_BAD);
    CHECK_INT(parse_n("PROXX", 5, 3), FW_PROXY_BAD);
    CHECK_INT(parse_n("PROXY TCP4 1\n", 13, 3), FW_PROXY_BAD);
}

/* A v2 header: signature, version/command, family/protocol, length, body. */
static size_t v2(char *out, unsigned ver_cmd, unsigned fam, const void *body, size_t n)
{
    static const char sig[12] = { '\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n' };
    memcpy(out, sig, 12);
    out[12] = (char)ver_cmd;
    out[13] = (char)fam;
    out[14] = (char)(n >> 8);
    out[15] = (char)(n & 0xff);
    memcpy(out + 16, body, n);
    return 16 + n;
}

static void test_v2(void)
{
    char h[16 + 300];
    unsigned char body[300];
    size_t n;

    ctx = "v2 PROXY TCP4";
    memset(body, 0, sizeof(body));
    inet_pton(AF_INET, "203.0.113.7", body);
    inet_pton(AF_INET, "10.0.0.1", body + 4);
    body[8] = 0xdb, body[9] = 0xea;           /* 56298 */
    body[10] = 0x01, body[11] = 0xbb;         /* 443 */
    n = v2(h, 0x21, 0x11, body, 12);
    CHECK_INT(parse_all(h, n, 3), 28);
    CHECK_INT(P.version, 2);
    CHECK_CLIENT("203.0.113.7", 56298);
    CHECK_INT(parse_n(h, n, FW_PROXY_V1), FW_PROXY_BAD);
    CHECK(P.why && strstr(P.why, "only v1"));

    ctx = "v2 PROXY TCP4 with TLVs (skipped)";
    memcpy(body + 12, "\x04\x00\x03" "abc" "\x20\x00\x01" "\x00", 10);
    n = v2(h, 0x21, 0x11, body, 22);
    CHECK_INT(parse_all(h, n, 3), 38);
    CHECK_CLIENT("203.0.113.7", 56298);

    ctx = "v2 PROXY TCP6";
    memset(body, 0, sizeof(body));
    inet_pton(AF_INET6, "2001:db8::7", body);
    inet_pton(AF_INET6, "2001:db8::1", body + 16);
    body[32] = 0x30, body[33] = 0x39;         /* 12345 */
    n = v2(h, 0x21, 0x21, body, 36);
    CHECK_INT(parse_all(h, n, 3), 52);
    CHECK_CLIENT("2001:db8::7", 12345);

    ctx = "v2 LOCAL (health checks): the socket's peer";
    n = v2(h, 0x20, 0x00, body, 0);
    CHECK_INT(parse_all(h, n, 3), 16);
    CHECK(P.local);
    n = v2(h, 0x20, 0x11, body, 12);          /* LOCAL with addresses: ignored */
    CHECK_INT(parse_all(h, n, 3), 28);
    CHECK(P.local);

    ctx = "v2 PROXY UNSPEC and UNIX: no IP client";
    n = v2(h, 0x21, 0x00, body, 0);
    CHECK_INT(parse_all(h, n, 3), 16);
    CHECK(P.local);
    n = v2(h, 0x21, 0x31, body, 216);
    CHECK_INT(parse_all(h, n, 3), 232);
    CHECK(P.local);

    ctx = "v2 followed by a request";
    n = v2(h, 0x21, 0x11, body, 12);
    memcpy(h + n, "GET /", 5);
    CHECK_INT(parse_n(h, n + 5, 3), 28);

    static const struct { unsigned vc, fam; size_t len; const char *why; } bad[] = {
        { 0x11, 0x11, 12, "version" },  { 0x31, 0x11, 12, "version" },
        { 0x22, 0x11, 12, "command" },  { 0x2f, 0x11, 12, "command" },
        { 0x21, 0x41, 12, "family" },   { 0x21, 0x12, 12, "STREAM" },
        { 0x21, 0x10, 12, "STREAM" },   { 0x21, 0x22, 36, "STREAM" },
        { 0x21, 0x11, 11, "longer" },   { 0x21, 0x21, 35, "longer" },
        { 0x21, 0x31, 215, "longer" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctx = bad[i].why;
        n = v2(h, bad[i].vc, bad[i].fam, body, bad[i].len);
        CHECK_INT(parse_n(h, n, 3), FW_PROXY_BAD);
        CHECK(P.why && strstr(P.why, bad[i].why));
        /* Said as soon as the bytes that are wrong have arrived. */
        CHECK_INT(parse_n(h, 16, 3), FW_PROXY_BAD);
    }
    ctx = "v2: a broken signature";
    n = v2(h, 0x21, 0x11, body, 12);
    h[7] = 'q';
    CHECK_INT(parse_n(h, 8, 3), FW_PROXY_BAD);
    CHECK_INT(parse_n(h, 7, 3), FW_PROXY_INCOMPLETE);
    CHECK_INT(parse_n("\r\n\r\n\r", 5, 3), FW_PROXY_BAD);
    ctx = "v2: an HTTP request after empty lines is no header";
    CHECK_INT(parse_n("\r\nGET / HTTP/1.1\r\n", 18, 3), FW_PROXY_BAD);
    ctx = "nothing yet";
    CHECK_INT(parse_n("", 0, 3), FW_PROXY_INCOMPLETE);
}

/* ---- fw_netmask ------------------------------------------------------------ */

static int match(const fw_netlist *l, const char *addr)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        return fw_netlist_match(l, (struct sockaddr *)&ss, sizeof(*a4));
    }
    if (inet_pton(AF_INET6, addr, &a6->sin6_addr) != 1)
        abort();
    a6->sin6_family = AF_INET6;
    return fw_netlist_match(l, (struct sockaddr *)&ss, sizeof(*a6));
}

static fw_netlist *parse_list(const char *spec)
{
    fw_netlist *l = NULL;
    int rc = fw_netlist_parse(spec, &l);
    CHECK_INT(rc, 0);
    return l;
}

/* fw_proxy_absent: a connection that can no longer start with a header
 * (detect mode serves it as it is); undecided while a prefix of one. */
static void test_absent(void)
{
    static const char v2[] = "\r\n\r\n\0\r\nQUIT\n";
    CHECK(!fw_proxy_absent("", 0));
    CHECK(fw_proxy_absent("G", 1));
    CHECK(fw_proxy_absent("GET / HTTP/1.1\r\n", 16));
    CHECK(!fw_proxy_absent("P", 1));
    CHECK(!fw_proxy_absent("PROXY ", 6));
    CHECK(!fw_proxy_absent("PROXY TCP4 1.2.3.4", 18));
    CHECK(fw_proxy_absent("POST / HTTP/1.1", 15));
    CHECK(fw_proxy_absent("PROXYX", 6));
    CHECK(!fw_proxy_absent("\r", 1));
    CHECK(!fw_proxy_absent("\r\n", 2));
    CHECK(!fw_proxy_absent(v2, 12));
    CHECK(fw_proxy_absent("\r\nGET", 5));          /* a CRLF before a request line: plain */
    CHECK(fw_proxy_absent("\r\n\r\nG", 5));
}

static void test_netmask(void)
{
    ctx = "gunicorn's default";
    fw_netlist *l = parse_list("127.0.0.1,::1");
    CHECK(match(l, "127.0.0.1"));
    CHECK(match(l, "::1"));
    CHECK(match(l, "::ffff:127.0.0.1"));        /* a dual-stack listener's IPv4 peer */
    CHECK(!match(l, "127.0.0.2"));
    CHECK(!match(l, "::2"));
    CHECK(!match(l, "::127.0.0.1"));
    fw_netlist_free(l);

    ctx = "networks";
    l = parse_list(" 10.0.0.0/8 , 192.168.1.128/25,,2001:db8::/32, 172.16.0.0/12 ");
    CHECK_INT(l->n, 4);
    CHECK(match(l, "10.255.1.2"));
    CHECK(!match(l, "11.0.0.1"));
    CHECK(match(l, "192.168.1.128"));
    CHECK(match(l, "192.168.1.255"));
    CHECK(!match(l, "192.168.1.127"));
    CHECK(match(l, "172.31.255.255"));
    CHECK(!match(l, "172.32.0.0"));
    CHECK(match(l, "2001:db8:ffff::1"));
    CHECK(!match(l, "2001:db9::1"));
    CHECK(match(l, "::ffff:10.1.2.3"));
    fw_netlist_free(l);

    ctx = "prefix 0 and full";
    l = parse_list("0.0.0.0/0");
    CHECK(match(l, "1.2.3.4"));
    CHECK(!match(l, "2001:db8::1"));
    fw_netlist_free(l);
    l = parse_list("::/0, 1.2.3.4/32");
    CHECK(match(l, "2001:db8::1"));
    CHECK(match(l, "1.2.3.4"));
    CHECK(!match(l, "1.2.3.5"));
    fw_netlist_free(l);

    ctx = "*";
    l = parse_list("10.0.0.1, *");
    CHECK(l->any);
    CHECK(match(l, "8.8.8.8"));
    CHECK(match(l, "2001:db8::1"));
    fw_netlist_free(l);

    ctx = "empty: no IP address, but unix peers";
    l = parse_list("");
    CHECK_INT(l->n, 0);
    CHECK(!match(l, "127.0.0.1"));
    struct sockaddr_un un = { .sun_family = AF_UNIX };
    CHECK(fw_netlist_match(l, (struct sockaddr *)&un, sizeof(sa_family_t)));
    CHECK(fw_netlist_match(NULL, (struct sockaddr *)&un, sizeof(sa_family_t)));
    CHECK(!match(NULL, "127.0.0.1"));
    fw_netlist_free(l);

    static const char *bad[] = {
        "10.0.0.1/8", "10.0.0.0/33", "::1/129", "10.0.0.0/", "/8", "10.0.0.0/8x", "10.0.0.0/+8",
        "10.0.0", "localhost", "1.2.3.4,nope", "**", "10.0.0.0/0008", "fe80::1%eth0",
        "1.2.3.4 5.6.7.8",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ctx = bad[i];
        fw_netlist *x = (fw_netlist *)&ctx;     /* must stay untouched */
        CHECK_INT(fw_netlist_parse(bad[i], &x), -EINVAL);
        CHECK(x == (fw_netlist *)&ctx);
    }
}

int main(void)
{
    check_init();
    test_v1();
    test_v2();
    test_absent();
    test_netmask();
    return check_report();
}
