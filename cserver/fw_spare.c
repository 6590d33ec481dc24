/* fw_spare: see fw_spare.h. */
#include "fw_spare.h"

#include <stdlib.h>

void fw_spare_init(fw_spare *s, size_t size, int max)
{
    s->size = size;
    s->max = max < 1 ? 1 : max > FW_SPARE_MAX ? FW_SPARE_MAX : max;
    s->n = 0;
}

void *fw_spare_take(fw_spare *s)
{
    if (s->n > 0)
        return s->blocks[--s->n];
    return malloc(s->size);     /* sets errno (ENOMEM) when it fails */
}

void fw_spare_give(fw_spare *s, void *p)
{
    if (!p)
        return;
    if (s->n < s->max) {
        s->blocks[s->n++] = p;
        return;
    }
    free(p);
}

void fw_spare_destroy(fw_spare *s)
{
    while (s->n > 0)
        free(s->blocks[--s->n]);
}
