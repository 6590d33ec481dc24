/* fw_netmask: is a peer one of these networks? The check behind
 * --forwarded-allow-ips and --proxy-allow-from, made once per connection.
 *
 * A list is parsed once, from text: comma-separated IPv4 and IPv6
 * addresses and CIDR networks ("10.0.0.0/8, ::1"), blanks around entries
 * and empty entries ignored, "*" for any address; host bits set under the
 * prefix ("10.0.0.1/8") are an error, as in gunicorn. The list is one
 * allocation the caller owns (fw_netlist_free); matching allocates
 * nothing and never fails. */
#ifndef FW_NETMASK_H
#define FW_NETMASK_H

#include <stddef.h>
#include <sys/socket.h>

typedef struct fw_net {
    unsigned char v6;           /* 0: IPv4 (addr[0..4)), 1: IPv6 */
    unsigned char bits;         /* prefix length */
    unsigned char addr[16];     /* network address, host bits zero */
} fw_net;

typedef struct fw_netlist {
    int any;                    /* "*" was listed: every address */
    size_t n;
    fw_net nets[];
} fw_netlist;

/* Parse spec (NUL-terminated) into *out. Returns 0, -EINVAL when an entry
 * is no address or network (*out untouched), or -ENOMEM. */
int fw_netlist_parse(const char *spec, fw_netlist **out);
void fw_netlist_free(fw_netlist *l);

/* A question: is the peer sa (len bytes, as accept() gave it) in l? 1 or 0.
 * A v4-mapped IPv6 peer (a dual-stack listener) is matched as the IPv4
 * address it is. A peer with no IP address (AF_UNIX) is in every list, as
 * gunicorn treats it; in a NULL list no IP address is. */
int fw_netlist_match(const fw_netlist *l, const struct sockaddr *sa, socklen_t len);

#endif
