/* fw_resp: response framing. The server owns framing: the app says status,
 * headers and body bytes; this file decides Content-Length vs chunked vs
 * close-delimited and drops what must not be on the wire (bodies of
 * HEAD/1xx/204/304, hop-by-hop headers). It queues bytes in the
 * connection's `out`; fw_conn.c writes them. */
#define _GNU_SOURCE
#include "fw_conn.h"
#include "fw_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* What a response says it came from, unless the app says otherwise
 * (gunicorn sends its name too; no version: nothing for a scanner). */
static const char SERVER[] = "Server: forkwsgi\r\n";

static const char *reason(int status)
{
    switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default:  return "Error";
    }
}

/* Append s: 0, or -ENOMEM. */
static int append_str(fw_buf *b, const char *s)
{
    return fw_buf_append(b, s, strlen(s)) == 0 ? 0 : -ENOMEM;
}

/* The Date header of the thread writing this head (see fw_date): 0, or
 * -ENOMEM. */
static int append_date(fw_conn *c)
{
    fw_date *d = &c->x->thr->date;
    fw_date_refresh(d);
    return fw_buf_append(&c->x->out, d->buf, d->len) == 0 ? 0 : -ENOMEM;
}

void fw_resp_error_head(fw_conn *c, int status)
{
    char head[256];
    const char *r = reason(status);
    size_t blen = strlen(r) + 1;
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n", status, r, blen);
    /* A head the app began (start_response) and gave up goes, and with it
     * the headers the access log captured from it. */
    fw_resp_abort_head(c);
    /* What is queued before it (responses of pipelined requests) stays. */
    size_t mark = fw_buf_used(&c->x->out);
    if (fw_buf_append(&c->x->out, head, (size_t)n) != 0 ||
        fw_buf_append(&c->x->out, SERVER, sizeof(SERVER) - 1) != 0 ||
        append_date(c) != 0 ||
        append_str(&c->x->out, "\r\n") != 0 || append_str(&c->x->out, r) != 0 ||
        append_str(&c->x->out, "\n") != 0)
        c->x->out.len = c->x->out.off + mark;               /* out of memory: just close */
    if (c->x->req.is_head && c->x->out.len > c->x->out.off + mark)
        c->x->out.len -= blen;                           /* HEAD: no body */
    c->x->resp.started = 1;
    c->x->resp.status = status;
    c->x->resp.no_body = 1;
    c->x->resp.sent = c->x->req.is_head ? 0 : blen;
    c->x->resp.close = 1;
}

int fw_resp_begin(fw_conn *c, const char *status_line, size_t status_len)
{
    fw_resp *r = &c->x->resp;
    int code = 0;
    for (size_t i = 0; i < 3 && i < status_len; i++)
        code = code * 10 + (status_line[i] - '0');
    r->head_start = fw_buf_used(&c->x->out);
    r->head_open = 1;
    r->status = code;
    r->no_body = c->x->req.is_head || code < 200 || code == 204 || code == 304;
    r->fixed = r->chunked = r->app_close = r->app_date = r->app_server = r->close = 0;
    r->left = 0;
    if (fw_buf_append(&c->x->out, "HTTP/1.1 ", 9) != 0 ||
        fw_buf_append(&c->x->out, status_line, status_len) != 0 ||
        fw_buf_append(&c->x->out, "\r\n", 2) != 0)
        return -ENOMEM;
    return 0;
}

void fw_resp_abort_head(fw_conn *c)
{
    if (c->x->resp.head_open)
        c->x->out.len = c->x->out.off + c->x->resp.head_start;
    c->x->resp.head_open = 0;
    fw_buf_reset(&c->x->log_headers, 0);
}

/* What a response header name is to the server (an outcome: how
 * fw_resp_header_checked treats it). By length first: this runs for every
 * header of every response, and most names match none. */
enum hkind { H_PLAIN, H_CONTENT_LENGTH, H_CONNECTION, H_HOP, H_DATE, H_SERVER };


static enum hkind header_kind(const char *n, size_t len)
{
    switch (len) {
    case 2:  return fw_http_token_is(n, len, "te") ? H_HOP : H_PLAIN;
    case 4:  return fw_http_token_is(n, len, "date") ? H_DATE : H_PLAIN;
    case 6:  return fw_http_token_is(n, len, "server") ? H_SERVER : H_PLAIN;
    case 7:  return fw_http_token_is(n, len, "trailer") || fw_http_token_is(n, len, "upgrade") ? H_HOP : H_PLAIN;
    case 10: return fw_http_token_is(n, len, "connection") ? H_CONNECTION
                 : fw_http_token_is(n, len, "keep-alive") ? H_HOP : H_PLAIN;
    case 14: return fw_http_token_is(n, len, "content-length") ? H_CONTENT_LENGTH : H_PLAIN;
    case 16: return fw_http_token_is(n, len, "proxy-connection") ? H_HOP : H_PLAIN;
    case 17: return fw_http_token_is(n, len, "transfer-encoding") ? H_HOP : H_PLAIN;
    default: return H_PLAIN;
    }
}

int fw_resp_header_checked(fw_conn *c, const char *name, size_t nlen, const char *value, size_t vlen)
{
    fw_resp *r = &c->x->resp;
    fw_alog *al = c->srv->cfg.access_log;
    if (al && fw_alog_wants_response_headers(al))
        fw_alog_capture(al, &c->x->log_headers, name, nlen, value, vlen);
    switch (header_kind(name, nlen)) {
    case H_CONTENT_LENGTH: {
        uint64_t v = 0;
        if (vlen == 0 || vlen > 19 || r->fixed)
            return -EINVAL;
        for (size_t i = 0; i < vlen; i++) {
            if (value[i] < '0' || value[i] > '9')
                return -EINVAL;
            v = v * 10 + (uint64_t)(value[i] - '0');
        }
        r->fixed = 1;
        r->left = v;
        if (r->status < 200 || r->status == 204)
            return 0;                    /* RFC 9110 8.6: never on 1xx/204 */
        break;
    }
    case H_CONNECTION:
        /* Hop-by-hop and ours to decide; "close" is honoured. */
        for (size_t i = 0; i + 5 <= vlen; i++)
            if (fw_http_token_eq(value + i, 5, "close"))
                r->app_close = 1;
        return 0;
    case H_HOP:
        return 0;                        /* PEP 3333: not the app's to send */
    case H_DATE:
        /* RFC 9110 6.6.1: one Date at most; the app's (Werkzeug sends one)
         * replaces ours, and only its first is sent. */
        if (r->app_date)
            return 0;
        r->app_date = 1;
        break;
    case H_SERVER:
        if (r->app_server)
            return 0;
        r->app_server = 1;
        break;
    default:
        break;
    }
    fw_buf *out = &c->x->out;
    size_t n = nlen + vlen + 4;
    if (out->cap - out->len < n && fw_buf_reserve(out, n) != 0)
        return -ENOMEM;
    char *w = out->data + out->len;     /* "name: value\r\n" in place */
    memcpy(w, name, nlen);
    w[nlen] = ':';
    w[nlen + 1] = ' ';
    memcpy(w + nlen + 2, value, vlen);
    w[nlen + 2 + vlen] = '\r';
    w[nlen + 3 + vlen] = '\n';
    out->len += n;
    return 0;
}

int fw_resp_end_head(fw_conn *c, int64_t known_len)
{
    fw_resp *r = &c->x->resp;
    fw_server *srv = c->srv;
    char line[64];
    int keep = c->x->keep_alive && !r->app_close && !c->x->must_close && !c->x->body.error &&
               !fw_server_ends_keepalive(srv);

    if (r->status < 200)
        keep = 0;       /* a 1xx as the final answer leaves the client waiting: end it */
    if (r->no_body) {
        /* HEAD: a length only from a body the app gave in full. An empty one
         * says nothing, since frameworks answer HEAD with no body (Werkzeug:
         * an empty iterable) even when the GET streams. */
        if (!r->fixed && known_len > 0 && c->x->req.is_head && r->status != 204 && r->status >= 200) {
            int n = snprintf(line, sizeof(line), "Content-Length: %lld\r\n", (long long)known_len);
            if (fw_buf_append(&c->x->out, line, (size_t)n) != 0)
                return -ENOMEM;
        }
    } else if (r->fixed) {
        /* the app's Content-Length, already queued */
    } else if (known_len >= 0) {
        int n = snprintf(line, sizeof(line), "Content-Length: %lld\r\n", (long long)known_len);
        if (fw_buf_append(&c->x->out, line, (size_t)n) != 0)
            return -ENOMEM;
        r->fixed = 1;
        r->left = (uint64_t)known_len;
    } else if (c->x->req.minor == 1 && !c->x->req.uwsgi) {
        /* (A uwsgi proxy reads the body until the close, as from HTTP/1.0.) */
        if (append_str(&c->x->out, "Transfer-Encoding: chunked\r\n") != 0)
            return -ENOMEM;
        r->chunked = 1;
    } else {
        keep = 0;       /* HTTP/1.0 without a length: the close ends the body */
    }
    const char *conn = keep ? (c->x->req.minor == 0 ? "Connection: keep-alive\r\n" : "")
                            : "Connection: close\r\n";
    if (append_str(&c->x->out, conn) != 0 ||
        /* Behind uwsgi_pass nginx passes an upstream's Server on, and
         * server_tokens would no longer decide: none, as uWSGI sends. */
        (!r->app_server && !c->x->req.uwsgi && fw_buf_append(&c->x->out, SERVER, sizeof(SERVER) - 1) != 0) ||
        (!r->app_date && append_date(c) != 0) ||
        fw_buf_append(&c->x->out, "\r\n", 2) != 0)
        return -ENOMEM;
    if (!keep)
        r->close = 1;
    r->started = 1;
    r->head_open = 0;
    return 0;
}

size_t fw_resp_frame(fw_conn *c, size_t len, const char **tail, size_t *tail_len)
{
    fw_resp *r = &c->x->resp;
    *tail = "";
    *tail_len = 0;
    if (r->no_body || len == 0)
        return 0;
    if (r->fixed) {
        if (len > r->left) {
            len = (size_t)r->left;
            r->close = 1;                /* the app wrote past its Content-Length */
        }
        r->left -= len;
        r->sent += len;
        return len;
    }
    if (r->chunked) {
        /* A chunk leaves whole, its CRLF included, when the app yields it:
         * a client may wait for that CRLF before it hands the chunk on. */
        char hdr[24];
        int n = snprintf(hdr, sizeof(hdr), "%zx\r\n", len);
        if (fw_buf_append(&c->x->out, hdr, (size_t)n) != 0) {
            r->close = 1;
            return 0;
        }
        *tail = "\r\n";
        *tail_len = 2;
    }
    r->sent += len;
    return len;
}

int fw_resp_queue(fw_conn *c, const char *data, size_t len)
{
    const char *tail;
    size_t tail_len;
    len = fw_resp_frame(c, len, &tail, &tail_len);
    if (len && (fw_conn_out_room(c, len + tail_len) != 0 || fw_buf_append(&c->x->out, data, len) != 0 ||
                fw_buf_append(&c->x->out, tail, tail_len) != 0))
        return -ENOMEM;
    return 0;
}

int fw_resp_completes(const fw_conn *c, size_t len)
{
    return c->x->resp.fixed && !c->x->resp.no_body && (uint64_t)len == c->x->resp.left;
}

void fw_resp_sendfile(fw_conn *c, int fd, uint64_t off, uint64_t count)
{
    fw_resp *r = &c->x->resp;
    if (r->no_body || count == 0)
        return;
    if (r->fixed) {
        if (count > r->left)
            count = r->left;      /* the app's Content-Length says how much to send */
        r->left -= count;
    }
    r->sent += count;
    r->sf_fd = fd;
    r->sf_off = off;
    r->sf_left = count;
}

void fw_resp_finish(fw_conn *c)
{
    fw_resp *r = &c->x->resp;
    if (r->no_body)
        return;
    if (r->chunked) {
        if (append_str(&c->x->out, "0\r\n\r\n") != 0)
            r->close = 1;
    } else if (r->fixed && r->left > 0) {
        r->close = 1;                    /* shorter than its Content-Length */
    }
}
