/* libFuzzer target for the uwsgi packet parser (cserver/fw_uwsgi.c), which
 * reads the first bytes of every connection on a --uwsgi-socket: bytes
 * from the network, before any check.
 *
 * On every input, with each set of limits, the result is checked against
 * the contract in fw_uwsgi.h:
 *   - documented results only: FW_UWSGI_BAD or FW_UWSGI_TOO_LARGE (with a
 *     reason), FW_UWSGI_INCOMPLETE, or a length within the input;
 *   - an accepted packet: modifier1 0 or 30, modifier2 0, its length 4 +
 *     datasize within the limit; its variables (at most the room given)
 *     lie in the packet, keys non-empty printable ASCII, and written out
 *     again they are the packet's bytes exactly (nothing skipped, nothing
 *     read twice);
 *   - incremental use: every proper prefix of an accepted packet is
 *     incomplete, every prefix of a refused one incomplete or refused the
 *     same way, and once refused stays refused; what follows a packet
 *     changes nothing;
 *   - the request made of an accepted packet: 0, 400 or 413 (with a
 *     reason); on 0 a non-empty token method, spans inside the packet,
 *     the Content-Length CONTENT_LENGTH says (within the limit), never kept
 *     alive.
 * Every call sees an exact-size heap copy, so ASan catches reads past it.
 * Any broken invariant prints what, then abort()s.
 *
 * Build: `make fuzz-uwsgi` (libFuzzer) or `make fuzz-smoke` (standalone). */
#include "fw_uwsgi.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    size_t max_size, max_vars;
    uint64_t max_body;
} LIMITS[] = {
    { 65535, 132, 1 << 30 },
    { 64, 3, 10 },
};
#define NLIMITS (sizeof(LIMITS) / sizeof(LIMITS[0]))
#define MAX_VARS 132

static size_t cur_limits;

#define CHECK(cond, what)                                                                 \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fuzz_uwsgi: %s (limits %zu, %zu bytes)\n", what, cur_limits, n); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

static char *copy;      /* the exact-size copy of the last parse: the spans point into it */

static long parse_copy(const uint8_t *data, size_t n, fw_header *vars, fw_uwsgi_packet *p)
{
    free(copy);
    copy = malloc(n ? n : 1);
    if (!copy)
        abort();
    memcpy(copy, data, n);
    memset(vars, 0xa5, MAX_VARS * sizeof(*vars));
    *p = (fw_uwsgi_packet){ .vars = vars, .max_vars = LIMITS[cur_limits].max_vars };
    return fw_uwsgi_parse(copy, n, LIMITS[cur_limits].max_size, p);
}

static int inside(const char *s, size_t len, const char *base, size_t n)
{
    return s >= base && s + len <= base + n;
}

static int is_token(const char *s, size_t n)
{
    if (!n)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c && strchr("!#$%&'*+-.^_`|~", c))))
            return 0;
    }
    return 1;
}

/* The request of an accepted packet (in copy[0..len)). */
static void check_request(const fw_uwsgi_packet *p, size_t n, size_t len)
{
    fw_http_limits lim = { .max_line = 8190, .max_head = LIMITS[cur_limits].max_size,
                           .max_headers = 100, .max_body = LIMITS[cur_limits].max_body };
    fw_request r;
    const char *why;
    int rc = fw_uwsgi_request(p, &lim, &r, &why);
    CHECK(rc == 0 || rc == 400 || rc == 413, "request: undocumented result");
    if (rc) {
        CHECK(why != NULL, "request: a refusal without a reason");
        return;
    }
    CHECK(r.uwsgi && !r.keep_alive && !r.chunked && !r.expect_continue, "request: framing flags");
    CHECK(is_token(r.method, r.method_len) && inside(r.method, r.method_len, copy, len), "request: method");
    CHECK(r.path_len == 0 || inside(r.path, r.path_len, copy, len), "request: path outside the packet");
    CHECK(r.query_len == 0 || inside(r.query, r.query_len, copy, len), "request: query outside the packet");
    CHECK(r.target_len == 0 || inside(r.target, r.target_len, copy, len), "request: target outside the packet");
    CHECK(r.content_length <= lim.max_body && r.has_body == (r.content_length > 0), "request: content length");
    const fw_header *cl = fw_uwsgi_var(&r, "CONTENT_LENGTH", 14);
    uint64_t v = 0;
    for (size_t i = 0; cl && i < cl->value_len; i++)
        v = v * 10 + (uint64_t)(cl->value[i] - '0');
    CHECK(v == r.content_length, "request: Content-Length is not CONTENT_LENGTH");
    CHECK(r.headers == p->vars && r.num_headers == p->num_vars, "request: variables");
}

static void check_one(const uint8_t *data, size_t n)
{
    fw_header vars[MAX_VARS], pv[MAX_VARS];
    fw_uwsgi_packet p, q;
    long rc = parse_copy(data, n, vars, &p);
    CHECK(rc == FW_UWSGI_BAD || rc == FW_UWSGI_TOO_LARGE || rc == FW_UWSGI_INCOMPLETE ||
              (rc >= FW_UWSGI_HEADER && (size_t)rc <= n), "result out of range");
    CHECK((rc != FW_UWSGI_BAD && rc != FW_UWSGI_TOO_LARGE) || p.why, "a refusal without a reason");
    if (rc > 0) {
        size_t len = (size_t)rc, size = (size_t)data[1] | (size_t)data[2] << 8;
        CHECK(data[0] == 0 || data[0] == 30, "modifier1");
        CHECK(data[3] == 0, "modifier2");
        CHECK(len == FW_UWSGI_HEADER + size && size <= LIMITS[cur_limits].max_size, "length is not 4 + datasize");
        CHECK(p.num_vars <= LIMITS[cur_limits].max_vars, "more variables than room");
        /* Written out again, the variables are the packet. */
        size_t at = FW_UWSGI_HEADER;
        for (size_t i = 0; i < p.num_vars; i++) {
            const fw_header *v = &p.vars[i];
            CHECK(v->name == copy + at + 2 && v->name_len == ((size_t)data[at] | (size_t)data[at + 1] << 8),
                  "a key is not where its length says");
            at += 2 + v->name_len;
            CHECK(v->value == copy + at + 2 && v->value_len == ((size_t)data[at] | (size_t)data[at + 1] << 8),
                  "a value is not where its length says");
            at += 2 + v->value_len;
            CHECK(v->name_len > 0, "an empty key");
            for (size_t k = 0; k < v->name_len; k++)
                CHECK(v->name[k] > 0x20 && v->name[k] < 0x7f, "a key not printable ASCII");
        }
        CHECK(at == len, "the variables do not fill datasize");
        check_request(&p, n, len);
    }
    /* Prefixes: all of them for short inputs, else a spread; then the
     * packet alone when more followed it. */
    size_t step = n <= 300 ? 1 : n / 97 + 1;
    long refused = 0;
    for (size_t k = 0; k <= n; k += step) {
        long r = parse_copy(data, k, pv, &q);
        if (rc > 0 && k < (size_t)rc)
            CHECK(r == FW_UWSGI_INCOMPLETE, "a prefix of a packet is not incomplete");
        else if (rc > 0)
            CHECK(r == rc && q.num_vars == p.num_vars, "bytes after a packet change it");
        else if (rc == FW_UWSGI_INCOMPLETE)
            CHECK(r == FW_UWSGI_INCOMPLETE, "a prefix of an incomplete packet is not incomplete");
        else
            CHECK(r == rc || (r == FW_UWSGI_INCOMPLETE && !refused), "a refusal taken back, or changed");
        if (r == FW_UWSGI_BAD || r == FW_UWSGI_TOO_LARGE)
            refused = r;
    }
    if (rc > 0 && (size_t)rc < n)
        CHECK(parse_copy(data, (size_t)rc, pv, &q) == rc && q.num_vars == p.num_vars, "the packet alone differs");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (cur_limits = 0; cur_limits < NLIMITS; cur_limits++)
        check_one(data, size);
    return 0;
}
