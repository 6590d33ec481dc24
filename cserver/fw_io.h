/* fw_io: small I/O helpers shared by the core's files. */
#ifndef FW_IO_H
#define FW_IO_H

#include <errno.h>
#include <stddef.h>
#include <sys/uio.h>
#include <unistd.h>

/* Write all `total` bytes of v[0..cnt) to a blocking fd (a file),
 * retrying after EINTR and short writes; v is changed as it goes. Returns
 * 0, or -1 with errno set (EIO if writev wrote nothing without saying why):
 * then part of it may have been written, and the caller takes it back. */
static inline int fw_writev_all(int fd, struct iovec *v, int cnt, size_t total)
{
    int first = 0;
    while (total > 0) {
        ssize_t w = writev(fd, v + first, cnt - first);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        total -= (size_t)w;
        while (first < cnt && (size_t)w >= v[first].iov_len) {
            w -= (ssize_t)v[first].iov_len;
            first++;
        }
        if (first < cnt) {
            v[first].iov_base = (char *)v[first].iov_base + w;
            v[first].iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* Write all n bytes to a blocking fd (a file), retrying after EINTR and
 * short writes. Returns 0, or -1 with errno set (EIO if write wrote
 * nothing without saying why). */
static inline int fw_write_all(int fd, const char *p, size_t n)
{
    struct iovec v = { (void *)p, n };
    return fw_writev_all(fd, &v, 1, n);
}

#endif
