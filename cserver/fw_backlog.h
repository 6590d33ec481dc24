/* fw_backlog: how many connections wait in a listening socket's accept
 * queue, as the kernel says: TCP_INFO for TCP (tcpi_unacked of a listener),
 * sock_diag over netlink for unix sockets (UNIX_DIAG_RQLEN). The loop uses
 * it to take its share of what waited there when a pass began (fw_server.c:
 * inline_batch). */
#ifndef FW_BACKLOG_H
#define FW_BACKLOG_H

#include <stdint.h>

typedef struct fw_backlog {
    int nlfd;          /* owned: the netlink socket for unix listeners, -1 until first needed */
    uint32_t seq;
} fw_backlog;

void fw_backlog_init(fw_backlog *b);
void fw_backlog_close(fw_backlog *b);

/* Connections waiting in the accept queue of listening socket fd (of
 * family AF_INET, AF_INET6 or AF_UNIX), or -1 when the kernel does not
 * say. */
int fw_backlog_len(fw_backlog *b, int fd, int family);

#endif
