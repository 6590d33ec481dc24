/* fw_backlog: see fw_backlog.h. */
#include "fw_backlog.h"

#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

void fw_backlog_init(fw_backlog *b)
{
    b->nlfd = -1;
    b->seq = 0;
}

void fw_backlog_close(fw_backlog *b)
{
    if (b->nlfd >= 0)
        close(b->nlfd);
    b->nlfd = -1;
}

/* A TCP listener keeps its accept queue's length in tcpi_unacked. */
static int tcp_backlog(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return -1;
    return (int)ti.tcpi_unacked;
}

/* A unix listener's queue, asked of the kernel by the socket's inode. The
 * answer is queued before send() returns: the receive does not wait. */
static int unix_backlog(fw_backlog *b, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    if (b->nlfd < 0) {
        b->nlfd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
        if (b->nlfd < 0)
            return -1;
    }
    struct {
        struct nlmsghdr nlh;
        struct unix_diag_req req;
    } ask;
    memset(&ask, 0, sizeof(ask));
    ask.nlh.nlmsg_len = sizeof(ask);
    ask.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    ask.nlh.nlmsg_flags = NLM_F_REQUEST;
    ask.nlh.nlmsg_seq = ++b->seq;
    ask.req.sdiag_family = AF_UNIX;
    ask.req.udiag_states = 1u << TCP_LISTEN;
    ask.req.udiag_ino = (uint32_t)st.st_ino;
    ask.req.udiag_show = UDIAG_SHOW_RQLEN;
    ask.req.udiag_cookie[0] = ask.req.udiag_cookie[1] = ~0u;
    ssize_t n;
    do {
        n = send(b->nlfd, &ask, sizeof(ask), 0);
    } while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof(ask))
        return -1;
    union {
        char buf[512];
        struct nlmsghdr align;
    } u;
    do {
        n = recv(b->nlfd, u.buf, sizeof(u.buf), MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -1;
    for (struct nlmsghdr *h = &u.align; NLMSG_OK(h, (unsigned)n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_seq != b->seq || h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
            h->nlmsg_len < NLMSG_LENGTH(sizeof(struct unix_diag_msg)))
            continue;
        struct unix_diag_msg *m = NLMSG_DATA(h);
        int len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
        for (struct rtattr *a = (struct rtattr *)(m + 1); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
            if (a->rta_type == UNIX_DIAG_RQLEN && RTA_PAYLOAD(a) >= sizeof(struct unix_diag_rqlen)) {
                struct unix_diag_rqlen q;
                memcpy(&q, RTA_DATA(a), sizeof(q));
                return (int)q.udiag_rqueue;
            }
        }
    }
    return -1;
}

int fw_backlog_len(fw_backlog *b, int fd, int family)
{
    if (family == AF_INET || family == AF_INET6)
        return tcp_backlog(fd);
    if (family == AF_UNIX)
        return unix_backlog(b, fd);
    return -1;
}
