/* fw_reqread: reading one request off a connection's bytes (fw_reqread.h). */
#include "fw_reqread.h"

#include <string.h>

int fw_reqread_head(const char *buf, size_t used, size_t *scan, const fw_http_limits *lim,
                    fw_request *req, size_t *head_len, int *stage)
{
    *head_len = 0;
    size_t end = fw_http_head_end(buf, used, scan);
    int rc;
    if (!end) {
        /* Not ended: a request line or head already past its limits, or
         * bytes no request starts with, is refused now, not at its end. */
        *stage = FW_HEAD_PARTIAL;
        return fw_http_check_partial(buf, used, lim);
    }
    if (end > lim->max_head) {
        /* The request line alone may be what is too long. */
        *stage = FW_HEAD_TOO_BIG;
        rc = fw_http_check_partial(buf, end, lim);
        return rc == 414 ? 414 : 431;
    }
    *stage = FW_HEAD_PARSE;
    rc = fw_http_parse_head(buf, end, lim, req);
    if (rc == 0)
        *head_len = end;
    return rc;
}

void fw_bodydec_init(fw_bodydec *d, const fw_request *r)
{
    memset(d, 0, sizeof(*d));
    d->chunked = r->chunked;
    d->cl_left = r->chunked ? 0 : r->content_length;
}

int fw_bodydec_next(fw_bodydec *d, const char *buf, size_t used, size_t *consumed,
                    const char **p, size_t *n, const fw_http_limits *lim)
{
    *consumed = 0;
    *p = NULL;
    *n = 0;
    if (d->chunked)
        return used == 0 ? FW_HTTP_INCOMPLETE : fw_chunked_feed(&d->ck, buf, used, consumed, p, n, lim);
    if (d->cl_left == 0)
        return FW_CHUNK_DONE;
    if (used == 0)
        return FW_HTTP_INCOMPLETE;
    size_t k = used < d->cl_left ? used : (size_t)d->cl_left;
    *p = buf;
    *n = k;
    *consumed = k;
    d->cl_left -= k;
    return FW_CHUNK_DATA;
}
