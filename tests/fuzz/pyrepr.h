/* pyrepr: print bytes as a Python bytes literal, so a failing input can be
 * pasted straight into a test. Shared by the fuzz target and its driver. */
#ifndef FW_PYREPR_H
#define FW_PYREPR_H

#include <stdio.h>

static inline void pyrepr_bytes(FILE *f, const unsigned char *p, size_t n)
{
    fputs("b\"", f);
    for (size_t i = 0; i < n; i++) {
        unsigned c = p[i];
        if (c == '\\' || c == '"')
            fprintf(f, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f)
            fputc((int)c, f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\n')
            fputs("\\n", f);
        else
            fprintf(f, "\\x%02x", c);
    }
    fputs("\"\n", f);
}

#endif
