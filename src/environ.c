/* environ: building the PEP 3333 environ dict from a parsed request.
 *
 * Cost matters here (it runs for every request), so constant entries come
 * from a template dict copied in one go, and the strs a client repeats
 * (path, header values, its address; the environ keys of header names)
 * come from two caches (strcache.c) instead of being built each time.
 *
 * Behind a proxy: when the connection's peer is in --forwarded-allow-ips
 * (decided once per connection, fw_conn.fwd_allowed), the headers of
 * secure_scheme_headers and, with --forwarded-proto (glue.forwarded_proto),
 * the proto= of the last element of Forwarded (RFC 7239: the one the
 * nearest proxy added) set wsgi.url_scheme; when they disagree the request
 * is answered 400, as gunicorn refuses it.
 * REMOTE_ADDR stays the client the connection knows (the socket's peer,
 * or the one a PROXY protocol header named): X-Forwarded-For and
 * Forwarded's for= are left to the app, as gunicorn does.
 *
 * A uwsgi request (fw_uwsgi.h: nginx's uwsgi_pass) brings its environ with
 * it: its variables map straight to environ entries, as uWSGI makes them
 * (the proxy's REMOTE_ADDR, SERVER_NAME, HTTP_HOST ... over the server's),
 * except the server's own wsgi.* entries. PATH_INFO and QUERY_STRING are
 * the request's (fw_uwsgi_request: made from REQUEST_URI when the packet has
 * none). wsgi.url_scheme: UWSGI_SCHEME, else HTTPS (on or 1: https), else
 * REQUEST_SCHEME, else --url-scheme; the scheme headers of a proxy in
 * --forwarded-allow-ips (in their HTTP_* variables) still come first. */
#include "glue.h"
#include "fw_uwsgi.h"

#include <string.h>

static PyObject *k_method, *k_path, *k_query, *k_raw_uri, *k_proto, *k_server_name, *k_http_host,
    *k_server_port, *k_remote_addr, *k_remote_port, *k_ctype, *k_clen, *k_url_scheme, *v_http11,
    *v_http10, *v_empty, *v_http, *v_https, *s_comma, *k_http_prefix;

/* Environ keys by raw header name, and values by their bytes (strcache.c). */
static fw_strcache keys = { .env_keys = 1 }, values;

static struct { const char *name; size_t len; PyObject *value; } methods[] = {
    { "GET", 3, NULL }, { "POST", 4, NULL }, { "HEAD", 4, NULL }, { "PUT", 3, NULL },
    { "DELETE", 6, NULL }, { "OPTIONS", 7, NULL }, { "PATCH", 5, NULL },
};

#define NMETHODS (sizeof(methods) / sizeof(methods[0]))

int fw_environ_init(void)
{
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return -1
    INTERN(k_method, "REQUEST_METHOD");
    INTERN(k_path, "PATH_INFO");
    INTERN(k_query, "QUERY_STRING");
    INTERN(k_raw_uri, "RAW_URI");
    INTERN(k_proto, "SERVER_PROTOCOL");
    INTERN(k_server_name, "SERVER_NAME");
    INTERN(k_http_host, "HTTP_HOST");
    INTERN(k_server_port, "SERVER_PORT");
    INTERN(k_remote_addr, "REMOTE_ADDR");
    INTERN(k_remote_port, "REMOTE_PORT");
    INTERN(k_ctype, "CONTENT_TYPE");
    INTERN(k_clen, "CONTENT_LENGTH");
    INTERN(k_url_scheme, "wsgi.url_scheme");
    INTERN(v_http, "http");
    INTERN(v_https, "https");
    INTERN(v_http11, "HTTP/1.1");
    INTERN(v_http10, "HTTP/1.0");
    INTERN(v_empty, "");
    INTERN(s_comma, ", ");
    INTERN(k_http_prefix, "HTTP_");
    for (size_t i = 0; i < NMETHODS; i++)
        INTERN(methods[i].value, methods[i].name);
#undef INTERN
    return 0;
}

static PyObject *latin1(const char *p, size_t n)
{
    return PyUnicode_DecodeLatin1(p, (Py_ssize_t)n, NULL);
}

/* The str of p[0..n), shared with earlier requests when it repeats. */
static PyObject *cached(const char *p, size_t n)
{
    return fw_strcache_get(&values, p, n, latin1);
}

/* env[key] = v (a new reference, taken; NULL: it could not be made), and
 * *held = v when held is not NULL (borrowed: the environ holds it). */
static int put(PyObject *env, PyObject *key, PyObject *v, PyObject **held)
{
    if (!v)
        return -1;
    int rc = PyDict_SetItem(env, key, v);
    if (held && rc == 0)
        *held = v;
    Py_DECREF(v);
    return rc;
}

/* Question (1 yes, 0 no): has o, the value a kept environ holds under an
 * entry (fw_env_keys.vals; NULL: not known), the bytes p[0..n)? */
static inline int holds(PyObject *o, const char *p, size_t n)
{
    return o && PyUnicode_KIND(o) == PyUnicode_1BYTE_KIND && (size_t)PyUnicode_GET_LENGTH(o) == n &&
           memcmp(PyUnicode_1BYTE_DATA(o), p, n) == 0;
}

/* Where an entry's value is noted: vals[i], or nowhere (vals NULL: an
 * environ that is never kept). */
#define HELD(vals, i) ((vals) ? &(vals)[i] : NULL)

/* The str of p[0..n) under key, noted in vals[i]; nothing when the environ
 * is a kept one (kept) whose value there has those bytes already. */
static int put_bytes(PyObject *env, PyObject *key, PyObject **vals, int i, int kept, const char *p, size_t n)
{
    if (kept && holds(vals[i], p, n))
        return 0;
    return put(env, key, cached(p, n), HELD(vals, i));
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* PATH_INFO: percent-decoded exactly once; an invalid escape stays literal. */
static PyObject *decode_path(const char *p, size_t n)
{
    if (!memchr(p, '%', n))
        return cached(p, n);
    char *out = PyMem_Malloc(n ? n : 1);
    if (!out)
        return PyErr_NoMemory();
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (p[i] == '%' && i + 2 < n && (hi = hexval(p[i + 1])) >= 0 &&
            (lo = hexval(p[i + 2])) >= 0) {
            out[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[o++] = p[i];
        }
    }
    PyObject *s = latin1(out, o);
    PyMem_Free(out);
    return s;
}

/* One character of a header name as PEP 3333 spells it in the environ key
 * (HTTP_ + the name upper-cased, '-' as '_'). */
static inline Py_UCS1 env_key_char(char ch)
{
    return (Py_UCS1)(ch == '-' ? '_' : ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
}

/* The environ key of a header name: CONTENT_TYPE, CONTENT_LENGTH, or
 * HTTP_ and the name upper-cased with '-' as '_' (PEP 3333). */
static PyObject *make_key(const char *name, size_t n)
{
    if (n == 12 && fw_http_token_eq(name, n, "content-type"))
        return Py_NewRef(k_ctype);
    if (n == 14 && fw_http_token_eq(name, n, "content-length"))
        return Py_NewRef(k_clen);
    PyObject *s = PyUnicode_New((Py_ssize_t)n + 5, 127);
    if (!s)
        return NULL;
    Py_UCS1 *key = PyUnicode_1BYTE_DATA(s);
    memcpy(key, "HTTP_", 5);
    for (size_t k = 0; k < n; k++)
        key[5 + k] = env_key_char(name[k]);
    return s;
}

/* A repeated field: its value joins the one its key holds (*held, which
 * then names the joined one), with ", " (RFC 9110 5.3). */
static int join_field(PyObject *env, PyObject *key, PyObject **held, const fw_header *h)
{
    PyObject *val = cached(h->value, h->value_len);
    if (!val)
        return -1;
    PyObject *tmp = PyUnicode_Concat(*held, s_comma);
    PyObject *joined = tmp ? PyUnicode_Concat(tmp, val) : NULL;
    Py_XDECREF(tmp);
    Py_DECREF(val);
    return put(env, key, joined, held);
}

/* Add one header's value under key, or join the one a field of the same
 * name set (join_field). */
static int add_header(PyObject *env, PyObject *key, const fw_header *h)
{
    PyObject *val = cached(h->value, h->value_len);
    if (!val)
        return -1;
    Py_ssize_t before = PyDict_GET_SIZE(env);
    PyObject *old = PyDict_SetDefault(env, key, val);       /* borrowed */
    Py_DECREF(val);
    if (!old || PyDict_GET_SIZE(env) != before)
        return old ? 0 : -1;            /* inserted (the dict holds val), or failed */
    return join_field(env, key, &old, h);
}

/* ---- the scheme a proxy says the client used ---------------------------- */

enum { SCHEME_NONE = 0, SCHEME_HTTP = 1, SCHEME_HTTPS = 2 };

/* Is h header `lname` (lower case, n bytes): the field itself, or in a
 * uwsgi request the variable it came in? */
static int header_is(const fw_request *r, const fw_header *h, const char *lname, size_t n)
{
    return r->uwsgi ? fw_uwsgi_is_header(h->name, h->name_len, lname, n)
                    : h->name_len == n && fw_http_token_eq(h->name, n, lname);
}

/* A header of secure_scheme_headers: what it says, or SCHEME_NONE. */
static int scheme_header(const fw_glue *s, const fw_request *r, const fw_header *h)
{
    for (int i = 0; i < s->n_scheme_headers; i++) {
        const fw_scheme_header *sh = &s->scheme_headers[i];
        if (header_is(r, h, sh->name, sh->name_len))
            return h->value_len == sh->value_len && memcmp(h->value, sh->value, h->value_len) == 0
                       ? SCHEME_HTTPS : SCHEME_HTTP;
    }
    return SCHEME_NONE;
}

/* Forwarded (RFC 7239): the proto= of its last element, or SCHEME_NONE.
 * Elements are separated by commas, pairs by semicolons; a value is a
 * token or a quoted string (commas inside one do not separate). */
static int forwarded_proto(const char *v, size_t n)
{
    size_t i = 0;
    int quoted = 0;
    for (size_t k = 0; k < n; k++) {
        if (quoted && v[k] == '\\')
            k++;
        else if (v[k] == '"')
            quoted = !quoted;
        else if (!quoted && v[k] == ',')
            i = k + 1;
    }
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ';'))
            i++;
        size_t key = i;
        while (i < n && v[i] != '=' && v[i] != ';')
            i++;
        size_t key_len = i - key;
        if (i >= n || v[i] != '=')
            continue;                 /* a pair without a value: passed over */
        size_t val = ++i, end;
        if (i < n && v[i] == '"') {
            val = ++i;
            while (i < n && v[i] != '"')
                i += v[i] == '\\' && i + 1 < n ? 2 : 1;
            end = i < n ? i : n;
            i = end + 1;
        } else {
            while (i < n && v[i] != ';' && v[i] != ' ' && v[i] != '\t')
                i++;
            end = i;
        }
        if (key_len == 5 && fw_http_token_eq(v + key, 5, "proto"))
            return end - val == 5 && fw_http_token_eq(v + val, 5, "https") ? SCHEME_HTTPS : SCHEME_HTTP;
    }
    return SCHEME_NONE;
}

/* What the headers of an allowed proxy say of the scheme, as they are met. */
typedef struct scheme_seen {
    int scheme;                 /* SCHEME_*, from secure_scheme_headers */
    int conflict;               /* two of them disagree */
    const fw_header *forwarded; /* the last Forwarded line */
} scheme_seen;

static void see_scheme(const fw_glue *s, const fw_request *r, const fw_header *h, scheme_seen *seen)
{
    int said = scheme_header(s, r, h);
    if (said) {
        seen->conflict |= seen->scheme && said != seen->scheme;
        seen->scheme = said;
    } else if (s->forwarded_proto && header_is(r, h, "forwarded", 9)) {
        seen->forwarded = h;          /* the last line holds the last element */
    }
}

/* http or https, any case: SCHEME_HTTP or SCHEME_HTTPS; else SCHEME_NONE. */
static int scheme_word(const fw_header *v)
{
    if (!v)
        return SCHEME_NONE;
    if (fw_http_token_eq(v->value, v->value_len, "https"))
        return SCHEME_HTTPS;
    return fw_http_token_eq(v->value, v->value_len, "http") ? SCHEME_HTTP : SCHEME_NONE;
}

/* The scheme a uwsgi packet says the client used (see the top). */
static int uwsgi_scheme(const fw_request *r)
{
    int said = scheme_word(fw_uwsgi_var(r, "UWSGI_SCHEME", 12));
    const fw_header *https = fw_uwsgi_var(r, "HTTPS", 5);
    if (said)
        return said;
    if (https)
        return fw_http_token_eq(https->value, https->value_len, "on") ||
               (https->value_len == 1 && https->value[0] == '1') ? SCHEME_HTTPS : SCHEME_HTTP;
    return scheme_word(fw_uwsgi_var(r, "REQUEST_SCHEME", 14));
}

/* The entries of a uwsgi packet's variables (see the top). */
static int add_vars(fw_glue *s, fw_conn *c, PyObject *env, scheme_seen *seen)
{
    const fw_request *r = &c->x->req;
    for (size_t i = 0; i < r->num_headers; i++) {
        const fw_header *v = &r->headers[i];
        if ((v->name_len >= 5 && memcmp(v->name, "wsgi.", 5) == 0) ||
            (v->name_len >= 9 && memcmp(v->name, "forkwsgi.", 9) == 0))
            continue;                 /* the server's own entries */
        if (c->fwd_allowed)
            see_scheme(s, r, v, seen);
        PyObject *key = cached(v->name, v->name_len);
        if (!key)
            return -1;
        int rc = put(env, key, cached(v->value, v->value_len), NULL);
        Py_DECREF(key);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* The lengths of the header names see_scheme looks for (secure_scheme_headers
 * and Forwarded), as bits: a header of another length is none of them, and
 * most are (Host, User-Agent, Accept) without a name compared. Names of 64
 * bytes or more share bit 63. */
static uint64_t scheme_name_lengths(const fw_glue *s)
{
    uint64_t bits = s->forwarded_proto ? UINT64_C(1) << 9 : 0;     /* "forwarded" */
    for (int i = 0; i < s->n_scheme_headers; i++)
        bits |= UINT64_C(1) << (s->scheme_headers[i].name_len < 63 ? s->scheme_headers[i].name_len : 63);
    return bits;
}

/* The environ key of header field h: 0 with *key a new reference, or NULL
 * for a field left out; -1 on error. A name with '_' is left out:
 * X_Forwarded_For must never pose as X-Forwarded-For (both map to
 * HTTP_X_FORWARDED_FOR). A scheme header is noted in seen (scheme_lengths:
 * scheme_name_lengths, or 0 when the peer may not set the scheme). */
static int header_key(const fw_glue *s, const fw_request *r, const fw_header *h, uint64_t scheme_lengths,
                      scheme_seen *seen, PyObject **key)
{
    *key = NULL;
    if (memchr(h->name, '_', h->name_len))
        return 0;
    if (scheme_lengths >> (h->name_len < 63 ? h->name_len : 63) & 1)
        see_scheme(s, r, h, seen);
    /* Host, in every HTTP/1.1 request, without the cache's lookup. */
    *key = h->name_len == 4 && fw_http_token_is(h->name, 4, "host") ? Py_NewRef(k_http_host)
                                                                   : fw_strcache_get(&keys, h->name, h->name_len,
                                                                                     make_key);
    return *key ? 0 : -1;
}

/* The entries of an HTTP request's header fields (one of more fields than
 * fw_env_keys holds: build_keyed does the others). */
static int add_headers(fw_glue *s, fw_conn *c, PyObject *env, scheme_seen *seen)
{
    const fw_request *r = &c->x->req;
    uint64_t scheme_lengths = c->fwd_allowed ? scheme_name_lengths(s) : 0;
    for (size_t i = 0; i < r->num_headers; i++) {
        PyObject *key;
        if (header_key(s, r, &r->headers[i], scheme_lengths, seen, &key) < 0)
            return -1;
        if (!key)
            continue;
        int rc = add_header(env, key, &r->headers[i]);
        Py_DECREF(key);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* Two of the scheme headers disagree: the answer is 400, as in gunicorn. */
static void log_scheme_conflict(fw_glue *s, fw_conn *c)
{
    const char *host, *port;
    fw_conn_peer_text(c, &host, &port);
    fw_server_log(s->srv, FW_LOG_INFO, "%s%s%s: 400 scheme headers disagree (secure_scheme_headers, "
                  "Forwarded proto=)", host, *port ? ":" : "", port);
}

/* Room in the template for the entries a request adds (its own, about ten,
 * and its headers): PyDict_Copy clones the template's table as it is, so
 * the environ then takes them without a resize per request. The clone's
 * cost grows with the table: ENV_SIZE entries (a 64-slot table) hold a
 * request with twenty-odd headers; one with more grows its own copy. */
#define ENV_ROOM 20
#define ENV_SIZE 42

PyObject *fw_environ_template(PyObject *base, PyObject *info)
{
    if (!PyDict_Check(base) || !PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 2) {
        PyErr_SetString(PyExc_TypeError, "base_environ must be a dict, listener_info (name, port) tuples");
        return NULL;
    }
    Py_ssize_t want = PyDict_GET_SIZE(base) + 2 + ENV_ROOM;
    PyObject *t = _PyDict_NewPresized(want > ENV_SIZE ? want : ENV_SIZE);
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (t && PyDict_Next(base, &pos, &k, &v)) {
        /* A request's header fields have these keys to themselves: an
         * environ kept for the next request (below) holds only its own. */
        if (PyUnicode_Check(k) && (PyUnicode_CompareWithASCIIString(k, "CONTENT_TYPE") == 0 ||
                                   PyUnicode_CompareWithASCIIString(k, "CONTENT_LENGTH") == 0 ||
                                   PyUnicode_Tailmatch(k, k_http_prefix, 0, PY_SSIZE_T_MAX, -1) == 1)) {
            PyErr_Format(PyExc_ValueError, "base_environ must not hold a header's key: %R", k);
            Py_CLEAR(t);
        } else if (PyDict_SetItem(t, k, v) < 0) {
            Py_CLEAR(t);
        }
    }
    if (t && (PyDict_SetItem(t, k_server_name, PyTuple_GET_ITEM(info, 0)) < 0 ||
              PyDict_SetItem(t, k_server_port, PyTuple_GET_ITEM(info, 1)) < 0))
        Py_CLEAR(t);
    return t;
}

/* ---- keeping an environ for the next request ------------------------------
 *
 * Copying the template (a 64-slot table: a malloc of 1,104 bytes, past
 * glibc's per-thread cache), inserting a request's entries into the copy
 * and freeing it all at the end was most of the environ's cost. An app
 * that neither keeps the environ nor changes it (a plain WSGI app; not
 * Flask, which stores its request object in it, nor Django, which rewrites
 * PATH_INFO) leaves a dict that already holds the next request's keys when
 * that request's header fields have the same names: it is kept, and the
 * next request replaces its values, or rather those that differ: the str
 * under each entry is noted as it is put (fw_env_keys.vals), and one that
 * already has the bytes the request would put stays (a kept-alive client,
 * or a proxy's pooled connection, repeats its Host, method, protocol,
 * address and most fields: no dict store and no cache lookup for those).
 * "Unchanged" is the dict's version tag (every insert, delete or replace
 * gives it a new one) against the tag noted once the server's own entries
 * were in (fw_environ_seal), and again when the next request takes it (an
 * app could reach it meanwhile, through gc); "unshared" is a reference
 * count of one. CPython 3.14 dropped the tag: there, and in a build
 * without the GIL, nothing is kept. */
#if PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define ENV_KEEP 1
static uint64_t dict_tag(PyObject *d)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    return ((PyDictObject *)d)->ma_version_tag;
#pragma GCC diagnostic pop
}
#endif

/* The kept environ if it has exactly the keys *k lists and is unchanged
 * since it was kept (a new reference the caller owns: the glue keeps it no
 * longer), else NULL; *size: its entry count, k->vals: its values. */
static PyObject *take_kept(fw_glue *s, fw_env_keys *k, Py_ssize_t *size)
{
    const fw_env_keys *had = &s->spare_keys;
    if (!s->spare_env || had->lst != k->lst || had->n != k->n ||
        memcmp(had->keys, k->keys, (size_t)k->n * sizeof(k->keys[0])) != 0)
        return NULL;
#ifdef ENV_KEEP
    if (dict_tag(s->spare_env) != s->spare_tag) {
        Py_CLEAR(s->spare_env);         /* changed while it waited: its vals may name freed strs */
        return NULL;
    }
#endif
    PyObject *env = s->spare_env;
    s->spare_env = NULL;
    *size = s->spare_size;
    memcpy(k->vals, had->vals, (size_t)(FW_EV_LINE + k->n) * sizeof(k->vals[0]));
    return env;
}

void fw_environ_seal(fw_req *r)
{
#ifdef ENV_KEEP
    r->env_tag = dict_tag(r->environ);
    r->env_size = PyDict_GET_SIZE(r->environ);
#else
    (void)r;
#endif
}

void fw_environ_done(fw_glue *s, fw_req *r)
{
#ifdef ENV_KEEP
    PyObject *env = r->environ;
    if (env && r->env_keys.n >= 0 && Py_REFCNT(env) == 1 && dict_tag(env) == r->env_tag) {
        PyObject *old = s->spare_env;
        const fw_env_keys *k = &r->env_keys;
        s->spare_env = env;
        s->spare_keys.n = k->n;
        s->spare_keys.lst = k->lst;
        memcpy(s->spare_keys.keys, k->keys, (size_t)k->n * sizeof(k->keys[0]));
        memcpy(s->spare_keys.vals, k->vals, (size_t)(FW_EV_LINE + k->n) * sizeof(k->vals[0]));
        s->spare_size = r->env_size;
        s->spare_tag = r->env_tag;
        r->environ = NULL;
        Py_XDECREF(old);        /* (app threads: another request's, kept meanwhile) */
        return;
    }
#endif
    Py_CLEAR(r->environ);
}

void fw_environ_forget(fw_glue *s)
{
    Py_CLEAR(s->spare_env);
}

/* wsgi.url_scheme as the request says it (SCHEME_*, SCHEME_NONE: the
 * template's stays), or -1 with *status 400: two of the scheme headers of
 * an allowed proxy disagree (said in the log). */
static int request_scheme(fw_glue *s, fw_conn *c, const scheme_seen *seen, int *status)
{
    const fw_request *r = &c->x->req;
    int scheme = seen->scheme, conflict = seen->conflict;
    if (seen->forwarded) {
        int said = forwarded_proto(seen->forwarded->value, seen->forwarded->value_len);
        conflict |= scheme && said && said != scheme;
        scheme = said ? said : scheme;
    }
    if (conflict) {
        log_scheme_conflict(s, c);
        *status = 400;
        return -1;
    }
    if (!scheme && r->uwsgi)
        scheme = uwsgi_scheme(r);
    return scheme;
}

/* Question (1 yes, 0 no): are two environ keys (ASCII strs) the same? The
 * same str, or equal ones: the key cache has a str per spelling of a
 * name, so "Accept" and "accept" give two HTTP_ACCEPT. */
static int same_key(PyObject *a, PyObject *b)
{
    return a == b || (PyUnicode_GET_LENGTH(a) == PyUnicode_GET_LENGTH(b) &&
                      memcmp(PyUnicode_1BYTE_DATA(a), PyUnicode_1BYTE_DATA(b), (size_t)PyUnicode_GET_LENGTH(a)) == 0);
}

/* Header field i under key, noted in vals[i]: a repeated field (first:
 * the index of its name's first field, below i: build_keyed) joins the
 * value this request set there; a first one (first == i) replaces the
 * value a kept environ holds unless that has its bytes. */
static int put_field(PyObject *env, PyObject *key, PyObject **vals, int i, int first, const fw_header *h, int kept)
{
    if (first < i)
        return join_field(env, key, &vals[first], h);
    return put_bytes(env, key, vals, i, kept, h->value, h->value_len);
}

/* The entries below are noted in vals (FW_EV_*: the request line's and the
 * peer's; NULL: nowhere), and left alone in a kept environ (kept) whose
 * value has the bytes already: put_bytes. */

/* The request line's entries and the peer's, in the environ's order:
 * REQUEST_METHOD, RAW_URI, SERVER_PROTOCOL, REMOTE_ADDR, REMOTE_PORT (then
 * the header fields, then add_path). *path: PATH_INFO's str when it is the
 * RAW_URI str, for add_path (a new reference, or NULL). */
static int add_request_line(fw_conn *c, PyObject *env, PyObject **path, PyObject **vals, int kept)
{
    const fw_request *r = &c->x->req;
    *path = NULL;
    if (!kept || !holds(vals[FW_EV_METHOD], r->method, r->method_len)) {
        PyObject *m = NULL;
        for (size_t i = 0; i < NMETHODS && !m; i++)
            if (methods[i].len == r->method_len && !memcmp(methods[i].name, r->method, r->method_len))
                m = Py_NewRef(methods[i].value);
        if (put(env, k_method, m ? m : latin1(r->method, r->method_len), HELD(vals, FW_EV_METHOD)) < 0)
            return -1;
    }
    /* A target that is all path (no query, nothing to decode: the usual
     * "/" or "/user/7") gives PATH_INFO the RAW_URI str (the cache would
     * find the same one), and no query the empty str: two lookups fewer. */
    if (!kept || !holds(vals[FW_EV_RAW_URI], r->target, r->target_len)) {
        PyObject *raw = cached(r->target, r->target_len);
        if (raw && !r->path_decoded && r->path == r->target && r->path_len == r->target_len &&
            !memchr(r->path, '%', r->path_len))
            *path = Py_NewRef(raw);
        if (put(env, k_raw_uri, raw, HELD(vals, FW_EV_RAW_URI)) < 0)
            goto fail;
    }
    PyObject *proto = r->minor ? v_http11 : v_http10;
    if ((!kept || vals[FW_EV_PROTO] != proto) && put(env, k_proto, Py_NewRef(proto), HELD(vals, FW_EV_PROTO)) < 0)
        goto fail;
    const char *host, *port;
    fw_conn_peer_text(c, &host, &port);
    if (put_bytes(env, k_remote_addr, vals, FW_EV_ADDR, kept, host, strlen(host)) < 0 ||
        put_bytes(env, k_remote_port, vals, FW_EV_PORT, kept, port, strlen(port)) < 0)
        goto fail;
    return 0;
fail:
    Py_CLEAR(*path);
    return -1;
}

/* PATH_INFO (path: add_request_line's, taken, or NULL) and QUERY_STRING. */
static int add_path(fw_conn *c, PyObject *env, PyObject *path, PyObject **vals, int kept)
{
    const fw_request *r = &c->x->req;
    int rc;
    if (path)
        rc = put(env, k_path, path, HELD(vals, FW_EV_PATH));
    else if (r->path_decoded || !memchr(r->path, '%', r->path_len))
        rc = put_bytes(env, k_path, vals, FW_EV_PATH, kept, r->path, r->path_len);
    else
        rc = put(env, k_path, decode_path(r->path, r->path_len), HELD(vals, FW_EV_PATH));
    if (rc < 0 || (kept && holds(vals[FW_EV_QUERY], r->query, r->query_len)))
        return rc;
    return put(env, k_query, r->query_len ? cached(r->query, r->query_len) : Py_NewRef(v_empty),
               HELD(vals, FW_EV_QUERY));
}

/* The host of an absolute-form target (noted in vals[i]): a Host field
 * says nothing more (RFC 9112 3.2.2: the origin server ignores it). */
static int add_authority(fw_conn *c, PyObject *env, PyObject **vals, int i)
{
    const fw_request *r = &c->x->req;
    return r->form == FW_TARGET_ABSOLUTE ? put(env, k_http_host, cached(r->authority, r->authority_len), HELD(vals, i))
                                         : 0;
}

/* wsgi.url_scheme when the request says it (noted in vals[i]). */
static int add_scheme(PyObject *env, int scheme, PyObject **vals, int i, int kept)
{
    PyObject *v = scheme == SCHEME_HTTPS ? v_https : v_http;
    if (!scheme || (kept && vals[i] == v))
        return 0;
    return put(env, k_url_scheme, Py_NewRef(v), HELD(vals, i));
}

/* A request of FW_ENV_KEYS_MAX - 2 header fields at most: the fields' keys
 * are looked up first, and say whether the kept environ fits it. */
static PyObject *build_keyed(fw_glue *s, fw_conn *c, int *status, fw_env_keys *k)
{
    const fw_request *r = &c->x->req;
    PyObject *hkeys[FW_ENV_KEYS_MAX];          /* owned: the fields' keys */
    const fw_header *fields[FW_ENV_KEYS_MAX];
    int first[FW_ENV_KEYS_MAX];                /* the index of field i's name's first field (i, or below) */
    int n = 0;
    PyObject *env = NULL, *path = NULL;
    scheme_seen seen = { SCHEME_NONE, 0, NULL };
    uint64_t scheme_lengths = c->fwd_allowed ? scheme_name_lengths(s) : 0;
    for (size_t i = 0; i < r->num_headers; i++) {
        PyObject *key;
        if (header_key(s, r, &r->headers[i], scheme_lengths, &seen, &key) < 0)
            goto out;
        if (!key)
            continue;
        /* One str per key: a repeated field's name spelled otherwise
         * ("Accept", "ACCEPT") has a str of its own in the key cache, which
         * the environ does not hold (its entry keeps the first one's), and
         * which the cache may free; fw_env_keys names the first. */
        first[n] = n;
        for (int j = 0; j < n; j++)
            if (same_key(hkeys[j], key)) {
                Py_SETREF(key, Py_NewRef(hkeys[j]));
                first[n] = j;
                break;
            }
        hkeys[n] = key;
        fields[n++] = &r->headers[i];
    }
    int scheme = request_scheme(s, c, &seen, status);
    if (scheme < 0)
        goto out;
    memcpy(k->keys, hkeys, (size_t)n * sizeof(hkeys[0]));
    k->n = n;
    int host_at = FW_EV_LINE + k->n, scheme_at;     /* their indices in k->vals */
    if (r->form == FW_TARGET_ABSOLUTE)
        k->keys[k->n++] = k_http_host;
    scheme_at = FW_EV_LINE + k->n;
    if (scheme)
        k->keys[k->n++] = k_url_scheme;
    Py_ssize_t kept_size = -1;
    env = take_kept(s, k, &kept_size);          /* (and k->vals, its values) */
    int kept = env != NULL;
    if (!env && !(env = PyDict_Copy(PyList_GET_ITEM(s->templates, k->lst))))
        goto out;
    int rc = add_request_line(c, env, &path, k->vals, kept);
    for (int i = 0; i < n && rc == 0; i++)
        rc = put_field(env, hkeys[i], k->vals + FW_EV_LINE, i, first[i], fields[i], kept);
    /* An absolute-form target's host replaces a Host field's value: that
     * one's index in vals names nothing then (the str may be gone), and
     * the host is put each time (kept or not: the field may have replaced
     * it since). */
    if (rc == 0 && r->form == FW_TARGET_ABSOLUTE) {
        rc = add_authority(c, env, k->vals, host_at);
        for (int i = 0; i < n; i++)
            if (hkeys[i] == k_http_host)
                k->vals[FW_EV_LINE + i] = NULL;
    }
    if (rc == 0) {
        rc = add_path(c, env, path, k->vals, kept);
        path = NULL;            /* add_path took it */
    }
    if (rc == 0)
        rc = add_scheme(env, scheme, k->vals, scheme_at, kept);
    /* A kept environ has every key the request sets: it does not grow. */
    if (rc < 0 || (kept_size >= 0 && PyDict_GET_SIZE(env) != kept_size)) {
        if (rc == 0)
            PyErr_SetString(PyExc_SystemError, "a kept environ took a key it should have held");
        Py_CLEAR(env);
    }
out:
    Py_XDECREF(path);
    for (int i = 0; i < n; i++)
        Py_DECREF(hkeys[i]);
    return env;
}

PyObject *fw_environ_build(fw_glue *s, fw_conn *c, int *status, fw_env_keys *k)
{
    const fw_request *r = &c->x->req;
    *status = 0;
    k->n = -1;
    k->lst = (int)(c->lst - s->srv->listeners);
    if (!r->uwsgi && r->num_headers <= FW_ENV_KEYS_MAX - 2)
        return build_keyed(s, c, status, k);
    /* A uwsgi request, or one of many fields: never kept. */
    PyObject *env = PyDict_Copy(PyList_GET_ITEM(s->templates, k->lst)), *path = NULL;
    if (!env)
        return NULL;
    scheme_seen seen = { SCHEME_NONE, 0, NULL };
    int rc = add_request_line(c, env, &path, NULL, 0);
    if (rc == 0)
        rc = r->uwsgi ? add_vars(s, c, env, &seen) : add_headers(s, c, env, &seen);
    if (rc == 0 && !r->uwsgi)
        rc = add_authority(c, env, NULL, 0);
    if (rc == 0) {
        rc = add_path(c, env, path, NULL, 0);
        path = NULL;            /* add_path took it */
    }
    int scheme = rc == 0 ? request_scheme(s, c, &seen, status) : -1;
    if (scheme < 0 || add_scheme(env, scheme, NULL, 0, 0) < 0) {
        Py_XDECREF(path);
        Py_DECREF(env);
        return NULL;
    }
    return env;
}
