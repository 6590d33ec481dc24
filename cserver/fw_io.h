/* fw_io: small I/O helpers shared by the core's files. */
#ifndef FW_IO_H
#define FW_IO_H

#include <errno.h>
#include <stddef.h>
#include <unistd.h>

/* Write all n bytes to a blocking fd (a file), retrying after EINTR and
 * short writes. Returns 0, or -1 with errno set (EIO if write wrote
 * nothing without saying why). */
static inline int fw_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

#endif
