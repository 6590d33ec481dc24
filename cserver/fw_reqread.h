/* fw_reqread: reading one request off a connection's bytes, step by step.
 *
 * The steps the server takes on the bytes that have arrived so far: the
 * head (fw_conn.c), then the body (fw_body.c). They live here, apart from
 * the socket, so that the C tests and the fuzz targets replay the very
 * code the server runs (tests/c/http_sim.h) instead of a copy of it.
 *
 * Pure functions over caller-owned buffers: nothing here reads a socket or
 * allocates; what they return points into the buffer they were given.
 * Both steps are protocol steps (fw_rc.h): 0 done, FW_HTTP_INCOMPLETE for
 * more bytes, else the HTTP status to refuse with; the body's step answers
 * with fw_chunked_feed's outcomes (FW_CHUNK_DATA / FW_CHUNK_DONE) where the
 * head's answers 0. */
#ifndef FW_REQREAD_H
#define FW_REQREAD_H

#include "fw_http.h"
#include "fw_rc.h"

#include <stddef.h>
#include <stdint.h>

/* Which check refused a head (for the tests: the status alone says it). */
enum fw_head_stage {
    FW_HEAD_PARTIAL = 1,   /* a head not ended yet is already wrong or too long */
    FW_HEAD_TOO_BIG,       /* it ended past max_head */
    FW_HEAD_PARSE          /* the whole head did not parse */
};

/* Is there a whole head in buf[0..used)? Leading empty lines must have been
 * dropped (fw_http_skip_crlf) before a head's first byte. *scan is where the
 * search for its end resumes: 0 for a new head, kept by the caller across
 * arrivals. Returns 0 with req parsed (req->headers set by the caller) and
 * *head_len its length; FW_HTTP_INCOMPLETE to wait for more bytes; or the
 * status to refuse the request with, *stage saying which check did. */
int fw_reqread_head(const char *buf, size_t used, size_t *scan, const fw_http_limits *lim,
                    fw_request *req, size_t *head_len, int *stage);

/* A request body being decoded: Content-Length bytes, or chunked. */
typedef struct fw_bodydec {
    int chunked;
    uint64_t cl_left;      /* Content-Length: bytes not yet decoded */
    fw_chunked ck;         /* chunked: the decoder's state */
} fw_bodydec;

/* Start decoding the body of r (whose head says it has one). */
void fw_bodydec_init(fw_bodydec *d, const fw_request *r);

/* The next span of body bytes in buf[0..used). Sets *consumed to the bytes
 * of buf used up (always set; the caller drops them). Returns
 * FW_CHUNK_DATA with [*p, *p + *n) inside buf, FW_CHUNK_DONE at the body's
 * end, FW_HTTP_INCOMPLETE once buf is used up, or a status (400, 413, 431).
 * Call again on what is left until INCOMPLETE or DONE. */
int fw_bodydec_next(fw_bodydec *d, const char *buf, size_t used, size_t *consumed,
                    const char **p, size_t *n, const fw_http_limits *lim);

#endif
