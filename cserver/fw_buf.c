/* fw_buf: see fw_buf.h. */
#include "fw_buf.h"

#include <stdlib.h>
#include <string.h>

int fw_buf_compact(fw_buf *b, size_t extra)
{
    size_t used = b->len - b->off;
    if (b->off == 0 || b->cap - used < extra || used > b->cap / 2)
        return 0;
    memmove(b->data, b->data + b->off, used);
    b->off = 0;
    b->len = used;
    return 1;
}

int fw_buf_reserve(fw_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra || fw_buf_compact(b, extra))
        return 0;
    size_t used = b->len - b->off;
    if (extra > ((size_t)-1) / 2 || used > ((size_t)-1) / 2 - extra)
        return -1;
    size_t want = used + extra;
    size_t ncap = b->cap ? b->cap : FW_BUF_FIRST_CAP;
    while (ncap < want)
        ncap *= 2;
    char *nd;
    if (b->off == 0) {
        nd = realloc(b->data, ncap);
        if (!nd)
            return -1;
    } else {
        nd = malloc(ncap);
        if (!nd)
            return -1;
        memcpy(nd, b->data + b->off, used);
        free(b->data);
    }
    b->data = nd;
    b->cap = ncap;
    b->off = 0;
    b->len = used;
    return 0;
}

int fw_buf_append_grow(fw_buf *b, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (fw_buf_reserve(b, n) != 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void fw_buf_reset(fw_buf *b, size_t keep)
{
    b->off = b->len = 0;
    if (b->cap > keep) {
        free(b->data);
        b->data = NULL;
        b->cap = 0;
    }
}

void fw_buf_free(fw_buf *b)
{
    if (b->data)                        /* (most request bodies never had one: no call) */
        free(b->data);
    b->data = NULL;
    b->off = b->len = b->cap = 0;
}
