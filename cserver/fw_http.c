/* fw_http: strict HTTP/1.1 request parsing. See fw_http.h.
 *
 * Strictness is the point: request smuggling lives in the gaps between
 * parsers that disagree, so anything RFC 9112 lets a server reject (obs-fold,
 * bare CR or LF, CTLs, whitespace before the colon, CL with TE, duplicate CL,
 * unknown codings) is rejected here rather than interpreted. */
#include "fw_http.h"

#include <string.h>

/* Character classes, one bit each (FW_HTTP_C_* in fw_http.h). */
#define C_TCHAR FW_HTTP_C_TCHAR
#define C_VCHAR 0x02   /* visible ASCII 0x21-0x7E */
#define C_FVAL  FW_HTTP_C_FVAL
#define C_HOST  0x08   /* allowed in a Host value / authority */
#define C_HEX   0x10
#define C_REG   0x20   /* a host name's or IPv4 address's: C_HOST but ':' '[' ']' */

/* Every byte's classes, fixed at compile time (read by every thread; the
 * response side reads it through fw_http_is_tchar). */
#define VF (C_VCHAR | C_FVAL)                    /* any visible ASCII character */
#define TVF (C_TCHAR | VF)
#define HR (C_HOST | C_REG)
#define cls fw_http_cls
const unsigned char fw_http_cls[256] = {
    ['\t'] = C_FVAL, [' '] = C_FVAL,
    ['0' ... '9'] = TVF | HR | C_HEX,
    ['A' ... 'F'] = TVF | HR | C_HEX, ['a' ... 'f'] = TVF | HR | C_HEX,
    ['G' ... 'Z'] = TVF | HR, ['g' ... 'z'] = TVF | HR,
    /* The other visible characters: token ones "!#$%&'*+-.^_`|~", and the
     * sub-delims, ':' '[' ']' '%' and unreserved marks allowed in a host. */
    ['!'] = TVF | HR, ['"'] = VF, ['#'] = TVF, ['$'] = TVF | HR, ['%'] = TVF | HR,
    ['&'] = TVF | HR, ['\''] = TVF | HR, ['('] = VF | HR, [')'] = VF | HR,
    ['*'] = TVF | HR, ['+'] = TVF | HR, [','] = VF | HR, ['-'] = TVF | HR,
    ['.'] = TVF | HR, ['/'] = VF, [':'] = VF | C_HOST, [';'] = VF | HR, ['<'] = VF,
    ['='] = VF | HR, ['>'] = VF, ['?'] = VF, ['@'] = VF, ['['] = VF | C_HOST, ['\\'] = VF,
    [']'] = VF | C_HOST, ['^'] = TVF, ['_'] = TVF | HR, ['`'] = TVF, ['{'] = VF, ['|'] = TVF,
    ['}'] = VF, ['~'] = TVF | HR,
    [0x80 ... 0xff] = C_FVAL,                  /* obs-text */
};

size_t fw_http_skip_crlf(const char *buf, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (buf[i] == '\n')
            i++;
        else if (buf[i] == '\r' && i + 1 < len && buf[i + 1] == '\n')
            i += 2;
        else
            break;
    }
    return i;
}

size_t fw_http_head_end(const char *buf, size_t len, size_t *scan)
{
    size_t i = *scan;
    /* A lone CR before a request may be half of an empty line whose LF is
     * still in flight: leave it unscanned so fw_http_skip_crlf sees the pair. */
    if (i == 0 && len == 1 && buf[0] == '\r')
        return 0;
    while (i < len) {
        const char *nl = memchr(buf + i, '\n', len - i);
        if (!nl)
            break;
        size_t k = (size_t)(nl - buf);
        /* An empty line: "\n\n" or "\n\r\n". */
        if ((k >= 1 && buf[k - 1] == '\n') || (k >= 2 && buf[k - 1] == '\r' && buf[k - 2] == '\n'))
            return k + 1;
        i = k + 1;
    }
    *scan = len;
    return 0;
}

/* Length of a request line without its line ending. */
static size_t line_len(const char *buf, size_t len, const char *nl)
{
    size_t n = nl ? (size_t)(nl - buf) : len;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    return n;
}

int fw_http_check_partial(const char *buf, size_t len, const fw_http_limits *lim)
{
    if (len == 1 && buf[0] == '\r')
        return FW_HTTP_INCOMPLETE;      /* see fw_http_head_end */
    const char *nl = memchr(buf, '\n', len);
    size_t line = line_len(buf, len, nl);
    if (line > lim->max_line)
        return 414;
    if (len > lim->max_head)
        return 431;
    /* Reject garbage (TLS on the plain port, binary junk) without waiting for
     * a head that will never end: the method must be a token followed by SP. */
    size_t raw = nl ? (size_t)(nl - buf) : len, i = 0;
    while (i < raw && (cls[(unsigned char)buf[i]] & C_TCHAR))
        i++;
    if (i < raw && (buf[i] != ' ' || i == 0))
        return 400;
    return FW_HTTP_INCOMPLETE;
}

/* ---- request line ---------------------------------------------------- */

static int parse_version(const char *p, const char *end, int *minor)
{
    /* "HTTP/" DIGIT "." DIGIT, case-sensitive (RFC 9112 2.3). */
    if (end - p != 8 || memcmp(p, "HTTP/", 5) != 0)
        return 400;
    if (p[5] < '0' || p[5] > '9' || p[6] != '.' || p[7] < '0' || p[7] > '9')
        return 400;
    if (p[5] != '1' || (p[7] != '0' && p[7] != '1'))
        return 505;
    *minor = p[7] - '0';
    return 0;
}

/* Split an origin-form (or the path of an absolute-form) target into path and
 * query; a fragment is not part of either (RFC 9112 3.2: clients must not
 * send one, but some do; it is dropped, never passed on). */
static void split_path(fw_request *r, const char *p, const char *end)
{
    const char *q = p;
    while (q < end && *q != '?' && *q != '#')
        q++;
    r->path = p;
    r->path_len = (size_t)(q - p);
    r->query = q;
    r->query_len = 0;
    if (q < end && *q == '?') {
        const char *f = ++q;
        while (f < end && *f != '#')
            f++;
        r->query = q;
        r->query_len = (size_t)(f - q);
    }
}

/* An authority as Host and request targets carry it (RFC 9112 3.2, RFC
 * 3986 3.2.2-3.2.3): a host, an IP literal in brackets or a reg-name/IPv4
 * of host characters other than ':' '[' ']', then, when a ':' follows, a
 * port of at most five digits up to 65535 (empty allowed, as the URI
 * grammar does, unless need_port). Anything else is a malformed Host:
 * "h.test:99999x" is one. */
static int valid_authority(const char *p, size_t n, int need_port)
{
    const char *end = p + n, *h = p;
    if (n == 0)
        return 0;
    if (*h == '[') {
        /* IPv6 (RFC 3986), a zone as %25 (RFC 6874), or IPvFuture: host
         * characters but brackets. */
        for (h++; h < end && *h != ']'; h++)
            if (!(cls[(unsigned char)*h] & C_HOST) || *h == '[')
                return 0;
        if (h == end || h == p + 1)
            return 0;
        h++;                        /* past ']' */
    } else {
        /* Up to the first byte that is not a host's; then only ':' and a
         * port may follow (checked below). */
        while (h < end && (cls[(unsigned char)*h] & C_REG))
            h++;
        if (h == p)
            return 0;
    }
    if (h == end)
        return !need_port;
    if (*h != ':')
        return 0;
    const char *d = h + 1;
    if (end - d > 5 || (need_port && d == end))
        return 0;
    unsigned port = 0;
    for (; d < end; d++) {
        if (*d < '0' || *d > '9')
            return 0;
        port = port * 10 + (unsigned)(*d - '0');
    }
    return port <= 65535;
}

static int parse_target(fw_request *r)
{
    const char *p = r->target, *end = p + r->target_len;
    int is_connect = r->method_len == 7 && memcmp(r->method, "CONNECT", 7) == 0;
    int is_options = r->method_len == 7 && memcmp(r->method, "OPTIONS", 7) == 0;

    r->authority = p;
    r->authority_len = 0;
    if (is_connect) {
        /* authority-form only: host:port */
        if (!valid_authority(p, r->target_len, 1))
            return 400;
        r->form = FW_TARGET_AUTHORITY;
        r->authority_len = r->target_len;
        r->path = p + r->target_len;
        r->path_len = 0;
        r->query = r->path;
        r->query_len = 0;
        return 0;
    }
    if (*p == '/') {
        r->form = FW_TARGET_ORIGIN;
        split_path(r, p, end);
        return 0;
    }
    if (r->target_len == 1 && *p == '*') {
        if (!is_options)
            return 400;
        r->form = FW_TARGET_ASTERISK;
        r->path = p;
        r->path_len = 1;
        r->query = end;
        r->query_len = 0;
        return 0;
    }
    /* absolute-form: http://authority[/path][?query] */
    size_t slen;
    if (r->target_len > 7 && fw_http_token_eq(p, 7, "http://"))
        slen = 7;
    else if (r->target_len > 8 && fw_http_token_eq(p, 8, "https://"))
        slen = 8;
    else
        return 400;
    const char *a = p + slen, *ae = a;
    while (ae < end && *ae != '/' && *ae != '?' && *ae != '#')
        ae++;
    if (!valid_authority(a, (size_t)(ae - a), 0) || memchr(a, '@', (size_t)(ae - a)))
        return 400;
    r->form = FW_TARGET_ABSOLUTE;
    r->authority = a;
    r->authority_len = (size_t)(ae - a);
    if (ae < end && *ae == '/') {
        split_path(r, ae, end);
    } else {
        split_path(r, ae, end);
        r->path = "/";              /* empty path means "/" (RFC 9112 3.2.2) */
        r->path_len = 1;
    }
    return 0;
}

/* ---- header fields --------------------------------------------------- */

struct framing {
    int cl_seen, te_seen, host_count;
    int te_chunked_count, te_last_chunked, te_other;
    int conn_close, conn_keep_alive;
    int expect_other;
};

/* Iterate the elements of a comma-separated list value; calls fn on each
 * non-empty, trimmed element. Returns 0, or 400 if an element is not a token. */
static int each_token(const char *v, size_t n, struct framing *f,
                      void (*fn)(struct framing *, const char *, size_t))
{
    size_t i = 0;
    while (i <= n) {
        size_t s = i;
        while (i < n && v[i] != ',')
            i++;
        size_t e = i;
        while (s < e && (v[s] == ' ' || v[s] == '\t'))
            s++;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t'))
            e--;
        for (size_t k = s; k < e; k++)
            if (!(cls[(unsigned char)v[k]] & C_TCHAR))
                return 400;
        if (e > s)
            fn(f, v + s, e - s);
        i++;
    }
    return 0;
}

static void te_token(struct framing *f, const char *t, size_t n)
{
    if (fw_http_token_eq(t, n, "chunked")) {
        f->te_chunked_count++;
        f->te_last_chunked = 1;
    } else {
        f->te_other++;
        f->te_last_chunked = 0;
    }
}

static void conn_token(struct framing *f, const char *t, size_t n)
{
    if (fw_http_token_eq(t, n, "close"))
        f->conn_close = 1;
    else if (fw_http_token_eq(t, n, "keep-alive"))
        f->conn_keep_alive = 1;
}

static int parse_content_length(const char *v, size_t n, uint64_t *out)
{
    uint64_t x = 0;
    if (n == 0 || n > 19)
        return 400;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return 400;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    *out = x;
    return 0;
}

static int frame_header(fw_request *r, struct framing *f, const fw_header *h)
{
    const char *nm = h->name;
    size_t nl = h->name_len;
    switch (nl) {
    case 4:
        if (fw_http_token_eq(nm, nl, "host")) {
            /* Empty is allowed: a target without an authority (RFC 9112 3.2). */
            f->host_count++;
            if (h->value_len > 0 && !valid_authority(h->value, h->value_len, 0))
                return 400;
        }
        break;
    case 6:
        if (fw_http_token_eq(nm, nl, "expect")) {
            if (fw_http_token_eq(h->value, h->value_len, "100-continue"))
                r->expect_continue = 1;
            else
                f->expect_other = 1;
        }
        break;
    case 10:
        if (fw_http_token_eq(nm, nl, "connection"))
            return each_token(h->value, h->value_len, f, conn_token);
        break;
    case 14:
        if (fw_http_token_eq(nm, nl, "content-length")) {
            if (f->cl_seen++)
                return 400;
            return parse_content_length(h->value, h->value_len, &r->content_length);
        }
        break;
    case 17:
        if (fw_http_token_eq(nm, nl, "transfer-encoding")) {
            f->te_seen = 1;
            return each_token(h->value, h->value_len, f, te_token);
        }
        break;
    }
    return 0;
}

/* Parse one field line at *pp (ending before `end`). On success stores it in
 * h and advances *pp past its CRLF. */
static int parse_field(const char **pp, const char *end, fw_header *h)
{
    const char *p = *pp;
    const char *n = p;
    while (p < end && (cls[(unsigned char)*p] & C_TCHAR))
        p++;
    if (p == n || p >= end || *p != ':')
        return 400;             /* empty name, whitespace before colon, bad char */
    h->name = n;
    h->name_len = (size_t)(p - n);
    p++;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    const char *v = p;
    p += fw_http_fval_span(p, (size_t)(end - p));
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n')
        return 400;             /* CTL, NUL, bare CR or bare LF */
    const char *ve = p;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    h->value = v;
    h->value_len = (size_t)(ve - v);
    *pp = p + 2;
    return 0;
}

/* The request line: method SP request-target SP HTTP-version CRLF.
 * 0 with *next at the first field line, or a status. */
static int parse_request_line(const char *buf, size_t head_len, const fw_http_limits *lim,
                              fw_request *r, const char **next)
{
    const char *p = buf;
    const char *eol = memchr(p, '\n', head_len);
    if (!eol)
        return 400;
    if (line_len(p, head_len, eol) > lim->max_line)
        return 414;
    if (eol == p || eol[-1] != '\r')
        return 400;
    const char *le = eol - 1;
    r->method = p;
    while (p < le && (cls[(unsigned char)*p] & C_TCHAR))
        p++;
    r->method_len = (size_t)(p - r->method);
    if (r->method_len == 0 || p >= le || *p != ' ')
        return 400;
    r->target = ++p;
    while (p < le && (cls[(unsigned char)*p] & C_VCHAR))
        p++;
    r->target_len = (size_t)(p - r->target);
    if (r->target_len == 0)
        return 400;
    if (p >= le)
        return 400;             /* HTTP/0.9: no version */
    if (*p != ' ')
        return 400;
    int rc = parse_version(p + 1, le, &r->minor);
    if (rc)
        return rc;
    rc = parse_target(r);
    if (rc)
        return rc;
    *next = eol + 1;
    return 0;
}

/* Message framing (RFC 9112 6.1-6.3), Host (3.2), keep-alive and Expect,
 * decided once every field line is read: 0 or a status. */
static int decide_framing(fw_request *r, const struct framing *f, const fw_http_limits *lim)
{
    if (r->minor == 1 ? f->host_count != 1 : f->host_count > 1)
        return 400;
    if (f->te_seen) {
        if (f->cl_seen || r->minor == 0)
            return 400;
        if (f->te_chunked_count != 1 || !f->te_last_chunked)
            return 400;
        if (f->te_other)
            return 501;         /* a coding we do not implement before chunked */
        r->chunked = 1;
        r->has_body = 1;
    } else if (r->content_length > 0) {
        r->has_body = 1;
    }
    if (r->content_length > lim->max_body)
        return 413;
    if (r->minor == 1) {
        r->keep_alive = !f->conn_close;
        if (f->expect_other)
            return 417;
    } else {
        r->keep_alive = f->conn_keep_alive && !f->conn_close;
        r->expect_continue = 0;   /* HTTP/1.0 has no 100 Continue */
    }
    return 0;
}

int fw_http_parse_head(const char *buf, size_t head_len, const fw_http_limits *lim,
                       fw_request *r)
{
    const char *p, *end = buf + head_len;
    struct framing f;
    memset(&f, 0, sizeof(f));
    fw_header *hdrs = r->headers;
    memset(r, 0, sizeof(*r));
    r->headers = hdrs;

    int rc = parse_request_line(buf, head_len, lim, r, &p);
    if (rc)
        return rc;

    /* field lines until the empty line */
    while (p < end) {
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
            p += 2;
            break;
        }
        if (*p == ' ' || *p == '\t')
            return 400;         /* obs-fold, or whitespace before the first field */
        if (r->num_headers >= lim->max_headers)
            return 431;
        fw_header *h = &r->headers[r->num_headers];
        rc = parse_field(&p, end, h);
        if (rc)
            return rc;
        r->num_headers++;
        rc = frame_header(r, &f, h);
        if (rc)
            return rc;
    }
    if (p != end)
        return 400;
    rc = decide_framing(r, &f, lim);
    if (rc)
        return rc;
    r->is_head = r->method_len == 4 && memcmp(r->method, "HEAD", 4) == 0;
    return 0;
}

/* ---- chunked body ---------------------------------------------------- */

enum {
    CK_SIZE = 0,     /* hex digits */
    CK_SIZE_WS,      /* BWS after the size, before ';' */
    CK_EXT_NAME0,    /* after ';': BWS, then the first char of a name */
    CK_EXT_NAME,     /* inside a chunk-ext-name */
    CK_EXT_NAME_WS,  /* BWS after a name */
    CK_EXT_VAL0,     /* after '=': BWS, then a token or a quoted-string */
    CK_EXT_TOKEN,    /* inside a token value */
    CK_EXT_QUOTED,   /* inside a quoted-string value */
    CK_EXT_ESC,      /* after a backslash in a quoted-string */
    CK_EXT_END,      /* after a value: BWS, then ';' or CR */
    CK_SIZE_LF,      /* LF after the size line's CR */
    CK_DATA,
    CK_DATA_CR,
    CK_DATA_LF,
    CK_TRAILER,      /* at the start of a trailer line */
    CK_TRAILER_LINE, /* inside a trailer field line */
    CK_TRAILER_LF,   /* LF of a trailer field line */
    CK_END_LF,       /* LF of the final empty line */
    CK_DONE
};

#define CK_MAX_LINE 4096

/* One byte of a chunk extension; 0 or -1 for a grammar error. */
static int chunk_ext_step(fw_chunked *d, unsigned char c)
{
    int ws = c == ' ' || c == '\t';
    int tchar = cls[c] & C_TCHAR;
    switch (d->state) {
    case CK_EXT_NAME0:
        if (tchar)
            d->state = CK_EXT_NAME;
        else if (!ws)
            return -1;
        return 0;
    case CK_EXT_NAME:
    case CK_EXT_TOKEN:
        if (tchar)
            return 0;
        /* fall through: a name or a token value ends like this */
        __attribute__((fallthrough));
    case CK_EXT_END:
        if (ws)
            d->state = d->state == CK_EXT_NAME ? CK_EXT_NAME_WS : CK_EXT_END;
        else if (c == ';')
            d->state = CK_EXT_NAME0;
        else if (c == '\r')
            d->state = CK_SIZE_LF;
        else if (c == '=' && d->state == CK_EXT_NAME)
            d->state = CK_EXT_VAL0;
        else
            return -1;
        return 0;
    case CK_EXT_NAME_WS:
        if (c == '=')
            d->state = CK_EXT_VAL0;
        else if (c == ';')
            d->state = CK_EXT_NAME0;
        else if (c == '\r')
            d->state = CK_SIZE_LF;
        else if (!ws)
            return -1;
        return 0;
    case CK_EXT_VAL0:
        if (tchar)
            d->state = CK_EXT_TOKEN;
        else if (c == '"')
            d->state = CK_EXT_QUOTED;
        else if (!ws)
            return -1;
        return 0;
    case CK_EXT_QUOTED:
        if (c == '"')
            d->state = CK_EXT_END;
        else if (c == '\\')
            d->state = CK_EXT_ESC;
        else if (!(cls[c] & C_FVAL))
            return -1;
        return 0;
    case CK_EXT_ESC:
        if (!(cls[c] & C_FVAL))
            return -1;
        d->state = CK_EXT_QUOTED;
        return 0;
    default:
        return -1;
    }
}

/* One byte of a size line: the hex size, BWS, extensions, the LF after its
 * CR. 0, or the status (400, 413) that ends the body. */
static int chunk_size_step(fw_chunked *d, unsigned char c, const fw_http_limits *lim)
{
    switch (d->state) {
    case CK_SIZE:
        if (cls[c] & C_HEX) {
            if (++d->hex_digits > 16)
                return 400;
            unsigned v = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
            d->left = d->left * 16 + v;
            if (d->left > lim->max_body || d->total + d->left > lim->max_body)
                return 413;
            return 0;
        }
        if (d->hex_digits == 0)
            return 400;
        if (c == ' ' || c == '\t')
            d->state = CK_SIZE_WS;
        else if (c == ';')
            d->state = CK_EXT_NAME0;
        else if (c == '\r')
            d->state = CK_SIZE_LF;
        else
            return 400;
        d->line_len = 0;
        return 0;
    case CK_SIZE_WS:
        if (c == ';')
            d->state = CK_EXT_NAME0;
        else if (c != ' ' && c != '\t')
            return 400;     /* only BWS ";" may follow the size */
        return ++d->line_len > CK_MAX_LINE ? 400 : 0;
    case CK_SIZE_LF:
        if (c != '\n')
            return 400;
        d->hex_digits = 0;
        d->state = d->left == 0 ? CK_TRAILER : CK_DATA;
        return 0;
    default:
        /* chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )
         * (RFC 9112 7.1.1): validated, then ignored. */
        if (++d->line_len > CK_MAX_LINE)
            return 400;
        return chunk_ext_step(d, c) != 0 ? 400 : 0;
    }
}

/* One byte of the trailer section. Trailer fields are validated like header
 * fields and then discarded: they never reach the application. 0, or the
 * status (400, 431) that ends the body. */
static int chunk_trailer_step(fw_chunked *d, unsigned char c, const fw_http_limits *lim)
{
    switch (d->state) {
    case CK_TRAILER:
        if (c == '\r') {
            d->state = CK_END_LF;
        } else if (cls[c] & C_TCHAR) {
            d->state = CK_TRAILER_LINE;
            d->line_has_data = 0;
        } else {
            return 400;     /* obs-fold, bare LF, junk */
        }
        d->line_len = 1;
        return 0;
    case CK_TRAILER_LINE:
        if (!d->line_has_data) {
            if (c == ':')
                d->line_has_data = 1;
            else if (!(cls[c] & C_TCHAR))
                return 400;
        } else if (c == '\r') {
            d->state = CK_TRAILER_LF;
        } else if (!(cls[c] & C_FVAL)) {
            return 400;
        }
        return ++d->line_len > CK_MAX_LINE ? 431 : 0;
    case CK_TRAILER_LF:
        if (c != '\n')
            return 400;
        d->trailer_len += d->line_len + 1;
        if (d->trailer_len > lim->max_head)
            return 431;
        d->state = CK_TRAILER;
        return 0;
    case CK_END_LF:
        if (c != '\n')
            return 400;
        d->state = CK_DONE;
        return 0;
    default:
        return 400;
    }
}

/* One byte outside chunk data: 0, or the status that ends the body. */
static int chunk_step(fw_chunked *d, unsigned char c, const fw_http_limits *lim)
{
    if (d->state < CK_DATA)
        return chunk_size_step(d, c, lim);
    if (d->state == CK_DATA_CR || d->state == CK_DATA_LF) {
        int cr = d->state == CK_DATA_CR;
        if (c != (cr ? '\r' : '\n'))
            return 400;
        d->state = cr ? CK_DATA_LF : CK_SIZE;
        return 0;
    }
    return chunk_trailer_step(d, c, lim);
}

int fw_chunked_feed(fw_chunked *d, const char *src, size_t len, size_t *used,
                    const char **data, size_t *data_len, const fw_http_limits *lim)
{
    size_t i = 0;
    *used = 0;
    while (i < len && d->state != CK_DONE) {
        if (d->state == CK_DATA) {
            /* Data is handed out as a span of src, never copied. */
            size_t n = len - i;
            if (n > d->left)
                n = (size_t)d->left;
            d->left -= n;
            d->total += n;
            if (d->left == 0)
                d->state = CK_DATA_CR;
            *data = src + i;
            *data_len = n;
            *used = i + n;
            return FW_CHUNK_DATA;
        }
        int rc = chunk_step(d, (unsigned char)src[i], lim);
        if (rc != 0)
            return rc;
        i++;
    }
    *used = i;
    return d->state == CK_DONE ? FW_CHUNK_DONE : FW_HTTP_INCOMPLETE;
}
