/* http_sim.h: replay a byte stream through the steps the server's
 * connection loop takes, delivered in arbitrary pieces.
 *
 * Shared by tests/c/test_http.c and tests/fuzz/fuzz_http.c (header-only, all
 * functions static). The steps are the server's own (cserver/fw_reqread.c,
 * called by step_head() in fw_conn.c and decode_step() in fw_body.c); what
 * this file adds is only what the socket does there:
 *
 *   head:  (only before the first byte of a head was scanned) drop leading
 *          CRLF/LF with fw_http_skip_crlf; then fw_reqread_head with a scan
 *          position kept across arrivals.
 *   body:  fw_bodydec_next called repeatedly, consuming *consumed each time.
 *
 * Every time the simulated connection looks at its buffer, the unconsumed
 * bytes are copied into a fresh heap block of exactly that size, so ASan
 * reports any read past the bytes that have arrived. What the parser returns
 * is recorded as stream offsets (the buffers come and go), so two runs of
 * the same stream with different arrival patterns can be compared field by
 * field with sim_compare().
 *
 * API contract checks made on the way (a broken one is recorded in
 * sim_result.violation and the run stops): consumed counts within what was
 * passed, spans inside the buffer, return codes from the documented set. */
#ifndef HTTP_SIM_H
#define HTTP_SIM_H

#include "fw_http.h"
#include "fw_reqread.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SIM_MAX_REQS
#define SIM_MAX_REQS 32     /* requests recorded per stream; the run stops after that */
#endif
#ifndef SIM_MAX_HDRS
#define SIM_MAX_HDRS 128    /* header fields recorded per request (num_headers is exact) */
#endif

/* Every function is static; not every includer uses all of them. */
#define SIM_FN static __attribute__((unused))

/* A string the parser returned: an offset into the stream, or, for text that
 * is not in the buffer at all (the "/" of an absolute-form target with an
 * empty path), a pointer to it. */
typedef struct sim_span {
    size_t off, len;
    const char *ext;        /* non-NULL: points outside the buffer */
} sim_span;

typedef struct sim_req {
    size_t start;           /* stream offset of the request line */
    size_t head_len;
    size_t end;             /* stream offset just past the body */
    sim_span method, target, path, query;
    int form, minor;
    size_t num_headers;
    sim_span hname[SIM_MAX_HDRS], hvalue[SIM_MAX_HDRS];
    uint64_t content_length;
    unsigned has_body, chunked, keep_alive, expect_continue, is_head;
    char *body;             /* decoded body (malloc'd) */
    size_t body_len, body_cap;
} sim_req;

enum {
    SIM_END_CLEAN = 1,      /* everything consumed at a request boundary */
    SIM_END_PARTIAL_HEAD,   /* stream ended inside a head (or leading CRLF) */
    SIM_END_PARTIAL_BODY,   /* stream ended inside a body */
    SIM_END_TRUNCATED,      /* SIM_MAX_REQS requests parsed; the rest not looked at */
    SIM_END_ERROR           /* the connection was failed with `status` */
};

enum { SIM_STAGE_PARTIAL = 1, SIM_STAGE_TOO_BIG, SIM_STAGE_PARSE, SIM_STAGE_BODY };

typedef struct sim_result {
    size_t nreqs;
    int end;                /* SIM_END_* */
    int status;             /* with SIM_END_ERROR: the HTTP status */
    int stage;              /* with SIM_END_ERROR: SIM_STAGE_* */
    size_t fail_at;         /* with SIM_END_ERROR: stream offset of the unconsumed bytes */
    size_t off;             /* stream bytes consumed when the run ended */
    int lone_cr;            /* the error was check_partial() on a buffer whose first
                             * byte is a CR left over by skip_crlf (see test_http.c,
                             * "known issue: CRLF split before a request") */
    const char *violation;  /* non-NULL: an API contract was broken (then `why`) */
    char why[256];
    sim_req reqs[SIM_MAX_REQS];   /* last: only the first nreqs are initialised */
} sim_result;

SIM_FN int sim_status_ok(int rc, const int *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (rc == set[i])
            return 1;
    return 0;
}

SIM_FN int sim_head_status_ok(int rc)
{
    /* 417 (Expect) is returned by fw_http_parse_head although fw_http.h
     * lists only 400, 413, 414, 431, 501, 505. */
    static const int ok[] = {0, 400, 413, 414, 417, 431, 501, 505};
    return sim_status_ok(rc, ok, sizeof(ok) / sizeof(ok[0]));
}

SIM_FN int sim_partial_status_ok(int rc)
{
    static const int ok[] = {FW_HTTP_INCOMPLETE, 400, 414, 431};
    return sim_status_ok(rc, ok, sizeof(ok) / sizeof(ok[0]));
}

SIM_FN int sim_chunk_status_ok(int rc)
{
    /* 431 (trailer section too large) is returned by fw_chunked_feed
     * although fw_http.h documents only 400/413. */
    static const int ok[] = {FW_CHUNK_DATA, FW_CHUNK_DONE, FW_HTTP_INCOMPLETE, 400, 413, 431};
    return sim_status_ok(rc, ok, sizeof(ok) / sizeof(ok[0]));
}

SIM_FN void sim_violate(sim_result *res, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

SIM_FN void sim_violate(sim_result *res, const char *what, const char *fmt, ...)
{
    if (res->violation)
        return;
    res->violation = what;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->why, sizeof(res->why), fmt, ap);
    va_end(ap);
}

/* Record a span that should lie within buf[0..n] (an empty span may sit at n). */
SIM_FN sim_span sim_span_of(const char *p, size_t len, const char *buf, size_t n, size_t base)
{
    sim_span s = {0, len, NULL};
    if (p >= buf && p <= buf + n && len <= (size_t)(buf + n - p))
        s.off = base + (size_t)(p - buf);
    else
        s.ext = p;
    return s;
}

SIM_FN void sim_body_append(sim_req *q, const char *p, size_t n)
{
    if (q->body_len + n > q->body_cap) {
        size_t cap = q->body_cap ? q->body_cap : 64;
        while (cap < q->body_len + n)
            cap *= 2;
        char *nb = realloc(q->body, cap);
        if (!nb)
            abort();
        q->body = nb;
        q->body_cap = cap;
    }
    memcpy(q->body + q->body_len, p, n);
    q->body_len += n;
}

SIM_FN char *sim_copy(const char *in, size_t off, size_t n)
{
    char *b = malloc(n ? n : 1);
    if (!b)
        abort();
    memcpy(b, in + off, n);
    return b;
}

/* Snapshot a parsed request; checks that every span lies in the head. */
SIM_FN void sim_snapshot(sim_result *res, sim_req *q, const fw_request *r, const char *b,
                         size_t head_len, size_t base)
{
    q->method = sim_span_of(r->method, r->method_len, b, head_len, base);
    q->target = sim_span_of(r->target, r->target_len, b, head_len, base);
    q->path = sim_span_of(r->path, r->path_len, b, head_len, base);
    q->query = sim_span_of(r->query, r->query_len, b, head_len, base);
    q->form = r->form;
    q->minor = r->minor;
    q->num_headers = r->num_headers;
    for (size_t i = 0; i < r->num_headers && i < SIM_MAX_HDRS; i++) {
        q->hname[i] = sim_span_of(r->headers[i].name, r->headers[i].name_len, b, head_len, base);
        q->hvalue[i] = sim_span_of(r->headers[i].value, r->headers[i].value_len, b, head_len, base);
        if (q->hname[i].ext || q->hvalue[i].ext)
            sim_violate(res, "header span outside the head", "header %zu", i);
    }
    q->content_length = r->content_length;
    q->has_body = r->has_body;
    q->chunked = r->chunked;
    q->keep_alive = r->keep_alive;
    q->expect_continue = r->expect_continue;
    q->is_head = r->is_head;
    if (q->method.ext || q->target.ext)
        sim_violate(res, "method/target outside the head", "at %zu", base);
    /* path and query lie within the target, except the documented "/" for
     * an absolute-form target with an empty path. */
    if (q->path.ext && !(r->form == FW_TARGET_ABSOLUTE && r->path_len == 1 && r->path[0] == '/'))
        sim_violate(res, "path outside the head", "at %zu", base);
    if (!q->path.ext && (q->path.off < q->target.off ||
                         q->path.off + q->path.len > q->target.off + q->target.len))
        sim_violate(res, "path outside the target", "at %zu", base);
    if (q->query.ext || q->query.off < q->target.off ||
        q->query.off + q->query.len > q->target.off + q->target.len)
        sim_violate(res, "query outside the target", "at %zu", base);
}

SIM_FN void sim_fail(sim_result *res, int status, int stage, size_t at)
{
    res->end = SIM_END_ERROR;
    res->status = status;
    res->stage = stage;
    res->fail_at = at;
}

/* Run the stream in[0..n) delivered so that after arrival i the first
 * cuts[i] bytes have come (cuts ascending; n is always the last arrival).
 * The result must be released with sim_free(). */
SIM_FN void sim_run(const char *in, size_t n, const size_t *cuts, size_t ncuts,
                    const fw_http_limits *lim, sim_result *res)
{
    enum { HEAD, BODY, STOP } state = HEAD;
    size_t off = 0, avail = 0, scan = 0;
    fw_bodydec dec;
    sim_req *cur = NULL;
    size_t nh = lim->max_headers ? lim->max_headers : 1;
    fw_header *hdrs = malloc(nh * sizeof(*hdrs));
    if (!hdrs)
        abort();

    memset(res, 0, offsetof(sim_result, reqs));
    for (size_t ci = 0; ci <= ncuts && state != STOP; ci++) {
        size_t next = ci < ncuts ? cuts[ci] : n;
        if (next > n)
            next = n;
        if (next <= avail && !(ci == ncuts && avail == 0))
            continue;
        avail = next;

        /* Drive until the connection would wait for more bytes. */
        while (state != STOP) {
            size_t used = avail - off;
            if (state == HEAD) {
                if (res->nreqs == SIM_MAX_REQS && used > 0) {
                    res->end = SIM_END_TRUNCATED;
                    state = STOP;
                    break;
                }
                if (scan == 0 && used > 0) {
                    char *b = sim_copy(in, off, used);
                    size_t k = fw_http_skip_crlf(b, used);
                    free(b);
                    if (k > used) {
                        sim_violate(res, "skip_crlf past the end", "%zu > %zu", k, used);
                        state = STOP;
                        break;
                    }
                    off += k;
                    used -= k;
                }
                if (used == 0)
                    break;
                char *b = sim_copy(in, off, used);
                fw_request r;
                r.headers = hdrs;
                size_t end;
                int stage = 0;
                int rc = fw_reqread_head(b, used, &scan, lim, &r, &end, &stage);
                if (scan > used || end > used) {
                    sim_violate(res, "reqread_head past the end", "end %zu scan %zu len %zu", end, scan, used);
                    free(b);
                    state = STOP;
                    break;
                }
                if (rc == FW_HTTP_INCOMPLETE) {
                    free(b);
                    break;
                }
                if (rc != 0) {
                    int lone_cr = b[0] == '\r';
                    free(b);
                    if (stage == FW_HEAD_PARSE ? !sim_head_status_ok(rc) : !sim_partial_status_ok(rc)) {
                        sim_violate(res, "reqread_head status", "%d at stage %d", rc, stage);
                    } else {
                        sim_fail(res, rc, stage == FW_HEAD_PARTIAL ? SIM_STAGE_PARTIAL :
                                          stage == FW_HEAD_TOO_BIG ? SIM_STAGE_TOO_BIG : SIM_STAGE_PARSE, off);
                        res->lone_cr = stage == FW_HEAD_PARTIAL && lone_cr;
                    }
                    state = STOP;
                    break;
                }
                if (r.headers != hdrs || r.num_headers > nh)
                    sim_violate(res, "parse_head headers array", "%zu headers", r.num_headers);
                cur = &res->reqs[res->nreqs++];
                memset(cur, 0, sizeof(*cur));
                cur->start = off;
                cur->head_len = end;
                sim_snapshot(res, cur, &r, b, end, off);
                free(b);
                off += end;
                scan = 0;
                if (!r.has_body) {
                    cur->end = off;
                } else {
                    fw_bodydec_init(&dec, &r);
                    state = BODY;
                }
                if (res->violation)
                    state = STOP;
                continue;
            }
            if (used == 0)
                break;
            /* BODY: decode the whole buffer, call by call. */
            char *b = sim_copy(in, off, used);
            size_t pos = 0;
            int rc;
            do {
                size_t u = (size_t)-1;
                const char *d = NULL;
                size_t dl = 0;
                rc = fw_bodydec_next(&dec, b + pos, used - pos, &u, &d, &dl, lim);
                if (!sim_chunk_status_ok(rc)) {
                    sim_violate(res, "bodydec_next status", "%d", rc);
                } else if (u > used - pos) {
                    sim_violate(res, "bodydec_next used past the end", "%zu > %zu", u, used - pos);
                } else if (rc == FW_CHUNK_DATA &&
                           (dl == 0 || d < b + pos || d + dl > b + pos + u)) {
                    sim_violate(res, "bodydec_next data span", "len %zu", dl);
                } else if (rc == FW_HTTP_INCOMPLETE && u != used - pos) {
                    sim_violate(res, "bodydec_next INCOMPLETE left bytes", "%zu of %zu", u, used - pos);
                } else if (dec.ck.total > lim->max_body) {
                    sim_violate(res, "chunked body past max_body", "%llu", (unsigned long long)dec.ck.total);
                }
                if (res->violation) {
                    state = STOP;
                    break;
                }
                if (rc == FW_CHUNK_DATA)
                    sim_body_append(cur, d, dl);
                if (rc == FW_CHUNK_DATA || rc == FW_CHUNK_DONE || rc == FW_HTTP_INCOMPLETE)
                    pos += u;
            } while (rc == FW_CHUNK_DATA && pos < used);
            free(b);
            if (state == STOP)
                break;
            off += pos;
            if (rc == FW_CHUNK_DONE || (rc == FW_CHUNK_DATA && !dec.chunked && dec.cl_left == 0)) {
                cur->end = off;
                state = HEAD;
                continue;
            }
            if (rc != FW_CHUNK_DATA && rc != FW_HTTP_INCOMPLETE) {
                sim_fail(res, rc, SIM_STAGE_BODY, off);
                state = STOP;
            }
            break;
        }
    }
    if (!res->end) {
        if (state == HEAD)
            res->end = off == n ? SIM_END_CLEAN : SIM_END_PARTIAL_HEAD;
        else
            res->end = SIM_END_PARTIAL_BODY;
    }
    res->off = off;
    free(hdrs);
}

SIM_FN void sim_free(sim_result *res)
{
    for (size_t i = 0; i < res->nreqs; i++)
        free(res->reqs[i].body);
    res->nreqs = 0;
}

/* Run with the stream in one piece / split once at k / one byte at a time. */
SIM_FN void sim_whole(const char *in, size_t n, const fw_http_limits *lim, sim_result *res)
{
    sim_run(in, n, NULL, 0, lim, res);
}

SIM_FN void sim_split(const char *in, size_t n, size_t k, const fw_http_limits *lim, sim_result *res)
{
    sim_run(in, n, &k, 1, lim, res);
}

SIM_FN void sim_bytewise(const char *in, size_t n, const fw_http_limits *lim, sim_result *res)
{
    size_t *cuts = malloc((n ? n : 1) * sizeof(*cuts));
    if (!cuts)
        abort();
    for (size_t i = 0; i < n; i++)
        cuts[i] = i + 1;
    sim_run(in, n, cuts, n, lim, res);
    free(cuts);
}

SIM_FN int sim_span_eq(sim_span a, sim_span b)
{
    if (a.len != b.len)
        return 0;
    if (!a.ext && !b.ext)
        return a.off == b.off;
    if (a.ext && b.ext)
        return memcmp(a.ext, b.ext, a.len) == 0;
    return 0;
}

/* Compare two runs of the same stream. With strict_status, failed runs must
 * fail with the same status at the same stage; otherwise two failures at the
 * same request are equal (a head that grows past a limit while a later byte
 * is bad may fairly be refused as 400 in pieces and as 431 in one piece).
 * Returns 1 if equal, else 0 with a description in why. */
SIM_FN int sim_compare(const sim_result *a, const sim_result *b, int strict_status,
                       char *why, size_t whylen)
{
#define SIM_DIFF(...) do { snprintf(why, whylen, __VA_ARGS__); return 0; } while (0)
    if (a->nreqs != b->nreqs)
        SIM_DIFF("request count %zu vs %zu", a->nreqs, b->nreqs);
    for (size_t i = 0; i < a->nreqs; i++) {
        const sim_req *x = &a->reqs[i], *y = &b->reqs[i];
        if (x->start != y->start || x->head_len != y->head_len)
            SIM_DIFF("req %zu: head at %zu+%zu vs %zu+%zu", i, x->start, x->head_len, y->start, y->head_len);
        if (!sim_span_eq(x->method, y->method))
            SIM_DIFF("req %zu: method", i);
        if (!sim_span_eq(x->target, y->target))
            SIM_DIFF("req %zu: target", i);
        if (!sim_span_eq(x->path, y->path))
            SIM_DIFF("req %zu: path", i);
        if (!sim_span_eq(x->query, y->query))
            SIM_DIFF("req %zu: query", i);
        if (x->form != y->form || x->minor != y->minor)
            SIM_DIFF("req %zu: form/minor %d/%d vs %d/%d", i, x->form, x->minor, y->form, y->minor);
        if (x->num_headers != y->num_headers)
            SIM_DIFF("req %zu: %zu vs %zu headers", i, x->num_headers, y->num_headers);
        for (size_t h = 0; h < x->num_headers && h < SIM_MAX_HDRS; h++)
            if (!sim_span_eq(x->hname[h], y->hname[h]) || !sim_span_eq(x->hvalue[h], y->hvalue[h]))
                SIM_DIFF("req %zu: header %zu", i, h);
        if (x->content_length != y->content_length || x->has_body != y->has_body ||
            x->chunked != y->chunked || x->keep_alive != y->keep_alive ||
            x->expect_continue != y->expect_continue || x->is_head != y->is_head)
            SIM_DIFF("req %zu: framing flags", i);
        if (x->end != y->end)
            SIM_DIFF("req %zu: ends at %zu vs %zu", i, x->end, y->end);
        if (x->body_len != y->body_len || (x->body_len && memcmp(x->body, y->body, x->body_len) != 0))
            SIM_DIFF("req %zu: body (%zu vs %zu bytes)", i, x->body_len, y->body_len);
    }
    if (a->end != b->end)
        SIM_DIFF("end %d vs %d (status %d vs %d)", a->end, b->end, a->status, b->status);
    if (a->end == SIM_END_ERROR) {
        /* In a body, where the decoder stopped depends on the pieces. */
        if ((a->stage == SIM_STAGE_BODY) != (b->stage == SIM_STAGE_BODY))
            SIM_DIFF("failed in stage %d vs %d", a->stage, b->stage);
        if (a->stage != SIM_STAGE_BODY && a->fail_at != b->fail_at)
            SIM_DIFF("failed at %zu vs %zu", a->fail_at, b->fail_at);
        if (strict_status && (a->status != b->status || a->stage != b->stage))
            SIM_DIFF("status %d (stage %d) vs %d (stage %d)", a->status, a->stage, b->status, b->stage);
    } else if (a->off != b->off) {
        SIM_DIFF("consumed %zu vs %zu", a->off, b->off);
    }
    return 1;
#undef SIM_DIFF
}

#endif
