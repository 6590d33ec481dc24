/* fw_uwsgi: the uwsgi wire protocol (uWSGI's, nginx's uwsgi_pass), the
 * request side. https://uwsgi-docs.readthedocs.io/en/latest/Protocol.html
 *
 * A request is a packet: a 4-byte header (modifier1: u8, datasize: u16
 * little-endian, modifier2: u8), then datasize bytes of variables, each a
 * u16 LE key length, the key, a u16 LE value length, the value. They are
 * CGI variables (REQUEST_METHOD, REQUEST_URI, PATH_INFO, QUERY_STRING,
 * CONTENT_LENGTH, SERVER_PROTOCOL, REMOTE_ADDR, ...: nginx's uwsgi_params)
 * and the request's headers as HTTP_* variables. CONTENT_LENGTH bytes of
 * body follow the packet on the stream. The answer is a plain HTTP/1.x
 * response; the proxy reads it until the connection closes.
 *
 * fw_uwsgi_parse is a parser over caller-owned bytes in the picohttpparser
 * style: call it with the bytes that have arrived so far, and again with
 * the same bytes plus more while it answers FW_UWSGI_INCOMPLETE. It never
 * allocates and keeps no state between calls; every span it returns points
 * into the caller's buffer. A verdict never changes as more bytes arrive:
 * a bad or oversized packet is refused as soon as its header says so.
 *
 * Strict, deliberately:
 *   - modifier1 0 (a WSGI request) or 30 (the same, PATH_INFO given with
 *     SCRIPT_NAME in front: uWSGI takes it off, and so do we); modifier2 0.
 *     Other packet types are uWSGI's own (ping, RPC, other languages): bad.
 *   - datasize at most the caller's limit (--limit-request-head), variables
 *     at most the caller's array; every length lies within the packet, and
 *     the variables fill it exactly.
 *   - a key is 1 or more printable ASCII characters without a space; a
 *     value is any bytes (nginx passes PATH_INFO decoded, control
 *     characters included), except in the variables the server reads:
 *     REQUEST_METHOD a token, CONTENT_LENGTH digits (empty: none, as nginx
 *     sends it for a request without a body).
 *   - a repeated variable: the last one counts, as in uWSGI (a config that
 *     overrides a uwsgi_params entry sends both), except CONTENT_LENGTH,
 *     whose copies must agree (the body's framing is never ambiguous). */
#ifndef FW_UWSGI_H
#define FW_UWSGI_H

#include <stddef.h>

#include "fw_http.h"

#define FW_UWSGI_BAD (-1)
#define FW_UWSGI_INCOMPLETE (-2)
#define FW_UWSGI_TOO_LARGE (-3)      /* datasize over the limit, or more variables than room */

#define FW_UWSGI_HEADER 4
#define FW_UWSGI_MANAGE_PATH_INFO 30 /* modifier1: PATH_INFO starts with SCRIPT_NAME */

/* Room for the CGI variables a proxy sends beside the request's headers:
 * a uwsgi connection's variable array has --limit-request-fields plus this. */
#define FW_UWSGI_EXTRA_VARS 32

typedef struct fw_uwsgi_packet {
    int modifier1;
    fw_header *vars;       /* the caller's array of max_vars entries: name, value */
    size_t max_vars;
    size_t num_vars;       /* filled on success */
    const char *why;       /* BAD / TOO_LARGE: what is wrong (static text) */
} fw_uwsgi_packet;

/* Parse a packet at the start of buf[0..len) whose datasize is at most
 * max_size. Returns its length (header and variables; the body follows)
 * with p->vars filled, FW_UWSGI_INCOMPLETE, FW_UWSGI_BAD or
 * FW_UWSGI_TOO_LARGE (p->why says what). */
long fw_uwsgi_parse(const char *buf, size_t len, size_t max_size, fw_uwsgi_packet *p);

/* The request of a parsed packet, as fw_http_parse_head makes one for
 * HTTP: method, target (REQUEST_URI), path and query, framing (a
 * Content-Length body, never kept alive: the proxy reads the response
 * until the close). req->headers are the packet's variables (req->uwsgi
 * set). path: PATH_INFO as sent (req->path_decoded; minus SCRIPT_NAME with
 * modifier1 30), or else the path of REQUEST_URI, percent-encoded; query:
 * QUERY_STRING, or else that of REQUEST_URI. Returns 0, 400 (no or a bad
 * REQUEST_METHOD, a bad CONTENT_LENGTH) or 413 (CONTENT_LENGTH over
 * lim->max_body), with *why said for a refusal. */
int fw_uwsgi_request(const fw_uwsgi_packet *p, const fw_http_limits *lim, fw_request *req, const char **why);

/* The last variable named name (n bytes) among req's, or NULL. */
const fw_header *fw_uwsgi_var(const fw_request *req, const char *name, size_t n);

/* Question: is variable var (vlen bytes) the one a proxy passes header
 * `name` (nlen bytes, any case) in: HTTP_ and the name upper-cased with '-'
 * as '_', or CONTENT_TYPE / CONTENT_LENGTH for those two? */
int fw_uwsgi_is_header(const char *var, size_t vlen, const char *name, size_t nlen);

#endif
