/* fw_uwsgi: the uwsgi wire protocol's request packet. See fw_uwsgi.h. */
#define _GNU_SOURCE             /* memmem */
#include "fw_uwsgi.h"

#include <stdint.h>
#include <string.h>

static size_t u16le(const char *p)
{
    return (size_t)(unsigned char)p[0] | (size_t)(unsigned char)p[1] << 8;
}

static long refuse(fw_uwsgi_packet *p, long rc, const char *why)
{
    p->why = why;
    return rc;
}

/* A key: printable ASCII without a space (CGI names, and whatever an
 * operator's uwsgi_param spells), never empty (uWSGI refuses that too). */
static int key_ok(const char *k, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)k[i] <= 0x20 || (unsigned char)k[i] >= 0x7f)
            return 0;
    return 1;
}

long fw_uwsgi_parse(const char *buf, size_t len, size_t max_size, fw_uwsgi_packet *p)
{
    p->why = NULL;
    p->num_vars = 0;
    /* The header's fields in the order they arrive, each checked as soon
     * as it is there: a prefix refused stays refused, for the same reason. */
    if (len < 1)
        return FW_UWSGI_INCOMPLETE;
    p->modifier1 = (unsigned char)buf[0];
    if (p->modifier1 != 0 && p->modifier1 != FW_UWSGI_MANAGE_PATH_INFO)
        return refuse(p, FW_UWSGI_BAD, "modifier1 is not a WSGI request (0 or 30)");
    if (len < 3)
        return FW_UWSGI_INCOMPLETE;
    size_t size = u16le(buf + 1);
    if (size > max_size)
        return refuse(p, FW_UWSGI_TOO_LARGE, "datasize over --limit-request-head");
    if (len < FW_UWSGI_HEADER)
        return FW_UWSGI_INCOMPLETE;
    if (buf[3] != 0)
        return refuse(p, FW_UWSGI_BAD, "modifier2 is not 0");
    if (len - FW_UWSGI_HEADER < size)
        return FW_UWSGI_INCOMPLETE;

    const char *q = buf + FW_UWSGI_HEADER, *end = q + size;
    size_t n = 0;
    while (q < end) {
        if (end - q < 2)
            return refuse(p, FW_UWSGI_BAD, "a key length runs past datasize");
        size_t klen = u16le(q);
        q += 2;
        if (klen > (size_t)(end - q))
            return refuse(p, FW_UWSGI_BAD, "a key runs past datasize");
        const char *key = q;
        q += klen;
        if (end - q < 2)
            return refuse(p, FW_UWSGI_BAD, "a value length runs past datasize");
        size_t vlen = u16le(q);
        q += 2;
        if (vlen > (size_t)(end - q))
            return refuse(p, FW_UWSGI_BAD, "a value runs past datasize");
        if (!key_ok(key, klen))
            return refuse(p, FW_UWSGI_BAD, "a key is empty or not printable ASCII");
        if (n == p->max_vars)
            return refuse(p, FW_UWSGI_TOO_LARGE, "more variables than --limit-request-fields allows");
        p->vars[n++] = (fw_header){ .name = key, .name_len = klen, .value = q, .value_len = vlen };
        q += vlen;
    }
    p->num_vars = n;
    return (long)(FW_UWSGI_HEADER + size);
}

static int is(const fw_header *v, const char *name)
{
    size_t n = strlen(name);
    return v->name_len == n && memcmp(v->name, name, n) == 0;
}

static int same_value(const fw_header *a, const fw_header *b)
{
    return a->value_len == b->value_len && memcmp(a->value, b->value, a->value_len) == 0;
}

/* The path and query of a request-target (REQUEST_URI, as the client sent
 * it): origin-form "/p?q", absolute-form "http://host/p?q", or "*". */
static void uri_parts(const char *u, size_t n, fw_request *req)
{
    size_t start = 0;
    if (n && u[0] != '/') {
        const char *sep = n >= 3 ? memmem(u, n, "://", 3) : NULL;
        start = n;                                   /* "*": no path */
        if (sep) {
            const char *slash = memchr(sep + 3, '/', (size_t)(u + n - (sep + 3)));
            const char *qm = memchr(sep + 3, '?', (size_t)(u + n - (sep + 3)));
            start = slash && (!qm || slash < qm) ? (size_t)(slash - u) : qm ? (size_t)(qm - u) : n;
        }
    }
    const char *qm = memchr(u + start, '?', n - start);
    size_t end = qm ? (size_t)(qm - u) : n;
    req->path = u + start;
    req->path_len = end - start;
    req->query = qm ? qm + 1 : u + n;
    req->query_len = qm ? n - end - 1 : 0;
}

/* The variables fw_uwsgi_request reads, each the last of its name (NULL:
 * not sent); they point into the packet's array. */
typedef struct cgi_vars {
    const fw_header *method, *uri, *path, *query, *script, *proto, *clen;
} cgi_vars;

/* Pick out the variables the request is made of. Returns 0, or 400 for two
 * CONTENT_LENGTH that differ (the body's framing must not be ambiguous). */
static int find_vars(const fw_uwsgi_packet *p, cgi_vars *cv, const char **why)
{
    *cv = (cgi_vars){ 0 };
    for (size_t i = 0; i < p->num_vars; i++) {
        const fw_header *v = &p->vars[i];
        if (is(v, "REQUEST_METHOD"))
            cv->method = v;
        else if (is(v, "REQUEST_URI"))
            cv->uri = v;
        else if (is(v, "PATH_INFO"))
            cv->path = v;
        else if (is(v, "QUERY_STRING"))
            cv->query = v;
        else if (is(v, "SCRIPT_NAME"))
            cv->script = v;
        else if (is(v, "SERVER_PROTOCOL"))
            cv->proto = v;
        else if (is(v, "CONTENT_LENGTH")) {
            if (cv->clen && !same_value(cv->clen, v)) {
                *why = "two different CONTENT_LENGTH";
                return 400;
            }
            cv->clen = v;
        }
    }
    return 0;
}

/* Returns 0, or 400 for a REQUEST_METHOD missing, empty or not a token. */
static int check_method(const fw_header *method, const char **why)
{
    if (!method || method->value_len == 0) {
        *why = "no REQUEST_METHOD (is uwsgi_params included?)";
        return 400;
    }
    for (size_t i = 0; i < method->value_len; i++)
        if (!fw_http_is_tchar((unsigned char)method->value[i])) {
            *why = "REQUEST_METHOD is not a token";
            return 400;
        }
    return 0;
}

/* *cl: CONTENT_LENGTH's value (0 when not sent or empty, as nginx sends it
 * for a request without a body). At most 19 digits, so it cannot overflow
 * 64 bits. Returns 0, 400 (not digits) or 413 (over lim->max_body). */
static int content_length(const fw_header *clen, const fw_http_limits *lim, uint64_t *cl, const char **why)
{
    *cl = 0;
    if (!clen || !clen->value_len)
        return 0;
    if (clen->value_len > 19) {
        *why = "CONTENT_LENGTH is not a number";
        return 400;
    }
    for (size_t i = 0; i < clen->value_len; i++) {
        char c = clen->value[i];
        if (c < '0' || c > '9') {
            *why = "CONTENT_LENGTH is not a number";
            return 400;
        }
        *cl = *cl * 10 + (uint64_t)(c - '0');
    }
    if (*cl > lim->max_body) {
        *why = "CONTENT_LENGTH over --limit-request-body";
        return 413;
    }
    return 0;
}

/* Question: does PATH_INFO start with SCRIPT_NAME as whole path segments
 * (/app in /app/x, never in /application)? Only then does modifier1 30
 * take it off, as uWSGI's UWSGI_MODIFIER_MANAGE_PATH_INFO does. */
static int script_leads_path(const fw_header *script, const fw_header *path)
{
    return script->value_len <= path->value_len &&
           memcmp(path->value, script->value, script->value_len) == 0 &&
           (script->value_len == path->value_len || path->value[script->value_len] == '/' ||
            (script->value_len > 0 && script->value[script->value_len - 1] == '/'));
}

/* The target, path and query: REQUEST_URI's, then PATH_INFO and
 * QUERY_STRING over them where they were sent. */
static void set_target(const fw_uwsgi_packet *p, const cgi_vars *cv, fw_request *req)
{
    if (cv->uri) {
        req->target = cv->uri->value;
        req->target_len = cv->uri->value_len;
        uri_parts(cv->uri->value, cv->uri->value_len, req);
    } else {
        req->target = cv->path ? cv->path->value : "";
        req->target_len = cv->path ? cv->path->value_len : 0;
        req->path = req->query = "";
    }
    if (cv->path) {
        req->path = cv->path->value;
        req->path_len = cv->path->value_len;
        req->path_decoded = 1;
        if (p->modifier1 == FW_UWSGI_MANAGE_PATH_INFO && cv->script && script_leads_path(cv->script, cv->path)) {
            req->path += cv->script->value_len;
            req->path_len -= cv->script->value_len;
        }
    }
    if (cv->query) {
        req->query = cv->query->value;
        req->query_len = cv->query->value_len;
    }
}

int fw_uwsgi_request(const fw_uwsgi_packet *p, const fw_http_limits *lim, fw_request *req, const char **why)
{
    cgi_vars cv;
    uint64_t cl = 0;
    memset(req, 0, sizeof(*req));
    *why = NULL;
    int status = find_vars(p, &cv, why);
    if (!status)
        status = check_method(cv.method, why);
    if (!status)
        status = content_length(cv.clen, lim, &cl, why);
    if (status)
        return status;

    req->uwsgi = 1;
    req->headers = p->vars;
    req->num_headers = p->num_vars;
    req->method = cv.method->value;
    req->method_len = cv.method->value_len;
    req->is_head = cv.method->value_len == 4 && memcmp(cv.method->value, "HEAD", 4) == 0;
    req->form = FW_TARGET_ORIGIN;
    req->authority = "";
    req->minor = !(cv.proto && cv.proto->value_len == 8 && memcmp(cv.proto->value, "HTTP/1.0", 8) == 0);
    req->content_length = cl;
    req->has_body = cl > 0;
    req->keep_alive = 0;        /* nginx reads the response until the close */
    set_target(p, &cv, req);
    return 0;
}

const fw_header *fw_uwsgi_var(const fw_request *req, const char *name, size_t n)
{
    for (size_t i = req->num_headers; i-- > 0;) {
        const fw_header *v = &req->headers[i];
        if (v->name_len == n && memcmp(v->name, name, n) == 0)
            return v;
    }
    return NULL;
}

int fw_uwsgi_is_header(const char *var, size_t vlen, const char *name, size_t nlen)
{
    if (fw_http_token_eq(name, nlen, "content-type"))
        return vlen == 12 && memcmp(var, "CONTENT_TYPE", 12) == 0;
    if (fw_http_token_eq(name, nlen, "content-length"))
        return vlen == 14 && memcmp(var, "CONTENT_LENGTH", 14) == 0;
    if (vlen != nlen + 5 || memcmp(var, "HTTP_", 5) != 0)
        return 0;
    for (size_t k = 0; k < nlen; k++) {
        char c = name[k] == '-' ? '_' : name[k] >= 'a' && name[k] <= 'z' ? (char)(name[k] - 32) : name[k];
        if (var[5 + k] != c)
            return 0;
    }
    return 1;
}
