/* fw_http: a strict HTTP/1.1 request parser (RFC 9112) over caller-owned bytes.
 *
 * The parser never allocates and never copies: every string in fw_request
 * points into the buffer the caller passed, and stays valid as long as those
 * bytes do. It is incremental in the picohttpparser sense: call it again with
 * the same prefix plus new bytes; fw_http_head_end() finds the end of the head
 * cheaply, so the full parse runs once per request, which is also why a
 * request split at any byte boundary parses exactly as it does in one piece.
 *
 * Return convention of the parse functions: 0 = done, FW_HTTP_INCOMPLETE =
 * need more bytes, otherwise the HTTP status code to answer with (400, 413,
 * 414, 417, 431, 501, 505), after which the connection must be closed.
 *
 * One exception to "everything points into the buffer": an absolute-form
 * target with an empty path ("http://host") gets path = "/", a static
 * string (RFC 9112 3.2.2). */
#ifndef FW_HTTP_H
#define FW_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FW_HTTP_INCOMPLETE (-1)

typedef struct fw_http_limits {
    size_t max_line;       /* request line without CRLF, bytes (414 past it) */
    size_t max_head;       /* whole head incl. request line (431 past it) */
    size_t max_headers;    /* header field count (431 past it) */
    uint64_t max_body;     /* Content-Length / decoded chunked body (413) */
} fw_http_limits;

typedef struct fw_header {
    const char *name;
    size_t name_len;
    const char *value;     /* leading and trailing OWS removed */
    size_t value_len;
} fw_header;

enum fw_target_form {
    FW_TARGET_ORIGIN,      /* /path?query */
    FW_TARGET_ABSOLUTE,    /* http://host/path?query */
    FW_TARGET_AUTHORITY,   /* host:port, CONNECT only */
    FW_TARGET_ASTERISK     /* *, OPTIONS only */
};

typedef struct fw_request {
    const char *method;    size_t method_len;
    const char *target;    size_t target_len;   /* raw request-target */
    const char *path;      size_t path_len;     /* path part, not decoded */
    const char *query;     size_t query_len;    /* after '?', without it */
    const char *authority; size_t authority_len; /* host[:port] of an absolute-form target
                                                 * (or CONNECT's), else empty */
    int form;                                   /* enum fw_target_form */
    int minor;                                  /* HTTP/1.<minor>: 0 or 1 */

    fw_header *headers;    /* caller-owned array of limits->max_headers */
    size_t num_headers;

    /* Framing, decided by the parser from the headers. */
    uint64_t content_length;
    unsigned has_body : 1;         /* content_length > 0 or chunked */
    unsigned chunked : 1;
    unsigned keep_alive : 1;       /* by version and Connection tokens */
    unsigned expect_continue : 1;
    unsigned is_head : 1;

    /* A request from a uwsgi packet (fw_uwsgi.h): headers are its CGI
     * variables, by their environ names (HTTP_HOST, CONTENT_TYPE, ...). */
    unsigned uwsgi : 1;
    unsigned path_decoded : 1;     /* path is PATH_INFO as the proxy sent it: decoded already */
} fw_request;

/* Find the end of the head in buf[0..len): returns the head length including
 * the blank line, or 0 if not there yet. *scan carries the position already
 * searched between calls (start it at 0 for a new request).
 * Leading empty lines are the caller's business (fw_http_skip_crlf). */
size_t fw_http_head_end(const char *buf, size_t len, size_t *scan);

/* Number of leading CRLF / LF bytes to ignore before a request line (RFC 9112 2.2). */
size_t fw_http_skip_crlf(const char *buf, size_t len);

/* Classify a head that has not ended yet: FW_HTTP_INCOMPLETE, or 414/431
 * when it already broke a limit. */
int fw_http_check_partial(const char *buf, size_t len, const fw_http_limits *lim);

/* Parse a complete head of head_len bytes (from fw_http_head_end).
 * req->headers must point at limits->max_headers entries. */
int fw_http_parse_head(const char *buf, size_t head_len, const fw_http_limits *lim,
                       fw_request *req);

/* Incremental chunked-body decoder. Zero it to start. */
typedef struct fw_chunked {
    int state;
    uint64_t left;         /* bytes left in the current chunk */
    uint64_t total;        /* decoded bytes so far */
    size_t line_len;       /* bytes of the current size/trailer line */
    size_t trailer_len;    /* bytes of trailer section */
    unsigned hex_digits;
    unsigned line_has_data : 1;
} fw_chunked;

enum {
    FW_CHUNK_DATA = 1,     /* data and data_len hold a span of body bytes */
    FW_CHUNK_DONE = 2      /* the last chunk and the trailers were consumed */
};

/* Feed src[0..len). Sets *used to the bytes consumed (always set). Returns
 * FW_CHUNK_DATA with a span pointing into src, FW_CHUNK_DONE, or
 * FW_HTTP_INCOMPLETE (everything consumed, need more), or 400/413, or 431
 * for a trailer section larger than max_head.
 * Call repeatedly, advancing src by *used, until it returns INCOMPLETE or DONE. */
int fw_chunked_feed(fw_chunked *d, const char *src, size_t len, size_t *used,
                    const char **data, size_t *data_len, const fw_http_limits *lim);

/* Helpers shared with the response side, inline: they run per byte of
 * every response header. The class table is constant (fw_http.c). */
#define FW_HTTP_C_TCHAR 0x01   /* token characters (RFC 9110 5.6.2) */
#define FW_HTTP_C_FVAL  0x04   /* allowed inside a field value: VCHAR, SP, HTAB, obs-text */
extern const unsigned char fw_http_cls[256];

static inline int fw_http_is_tchar(unsigned char c)
{
    return fw_http_cls[c] & FW_HTTP_C_TCHAR;
}

/* Does the word hold a byte below 0x20 or 0x7f (DEL)? Exact as to whether
 * one does (the borrow of the subtraction can only flag bytes above a
 * flagged one); bytes from 0x80 are never flagged (~w clears their bit).
 * A word without one is eight field-value bytes (VCHAR, SP, obs-text); one
 * with one (HTAB too) is for a byte-by-byte look. */
static inline int fw_http_word_may_hold_ctl(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t del = w ^ (0x7f * ones);
    return (((w - 0x20 * ones) & ~w) | ((del - ones) & ~del)) & highs ? 1 : 0;
}

/* How many bytes of p[0..n) lead as field-value bytes (FW_HTTP_C_FVAL:
 * VCHAR, SP, HTAB, obs-text): n when all do. Eight at a time: a word with
 * no control character passes in a few instructions; one with one (a tab,
 * or the CR that ends a request's line) is looked at byte by byte. Used
 * for request header values (fw_http.c) and the app's response header
 * values (start_response.c). */
static inline size_t fw_http_fval_span(const char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (fw_http_word_may_hold_ctl(w))
            for (size_t k = 0; k < 8; k++)
                if (!(fw_http_cls[(unsigned char)p[i + k]] & FW_HTTP_C_FVAL))
                    return i + k;
    }
    while (i < n && (fw_http_cls[(unsigned char)p[i]] & FW_HTTP_C_FVAL))
        i++;
    return i;
}

/* s[0..n) is lit, a literal of n lower-case letters and '-', ASCII case
 * aside, where s holds token characters only (a parsed header name, or a
 * response header name start_response checked). Among those, c | 0x20 is
 * a lower-case letter only for that letter or its upper case, and '-' only
 * for '-': so OR-ing 0x20 compares exactly, eight bytes at a time. */
static inline int fw_http_token_is(const char *s, size_t n, const char *lit)
{
    const uint64_t lower = 0x2020202020202020ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t a, b;
        memcpy(&a, s + i, 8);
        memcpy(&b, lit + i, 8);
        if ((a | lower) != b)
            return 0;
    }
    for (; i < n; i++)
        if (((unsigned char)s[i] | 0x20) != (unsigned char)lit[i])
            return 0;
    return 1;
}

/* s[0..n) equals the lower-case literal lit, ASCII case-insensitive. */
static inline int fw_http_token_eq(const char *s, size_t n, const char *lit)
{
    size_t i = 0;
    for (; i < n; i++) {
        unsigned char a = (unsigned char)s[i], b = (unsigned char)lit[i];
        if (b == 0)
            return 0;
        if (a >= 'A' && a <= 'Z')
            a = (unsigned char)(a + 32);
        if (a != b)
            return 0;
    }
    return lit[i] == 0;
}

#endif
