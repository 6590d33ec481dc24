/* fw_proxy: the PROXY protocol header (HAProxy's, v1 text and v2 binary)
 * that a proxy or load balancer (HAProxy send-proxy / send-proxy-v2, AWS
 * NLB, stunnel) writes before the first byte of a connection, naming the
 * client it stands for. https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt
 *
 * A parser over caller-owned bytes in the picohttpparser style: call it
 * with the bytes that have arrived so far, and again with the same bytes
 * plus more while it answers FW_PROXY_INCOMPLETE. It never allocates and
 * keeps no state between calls. A prefix that can no longer become a
 * header is answered FW_PROXY_BAD at once, and a verdict never changes
 * as more bytes arrive.
 *
 * Accepted: v1 "PROXY TCP4|TCP6 SRC DST SPORT DPORT\r\n" and
 * "PROXY UNKNOWN ...\r\n" (at most 107 bytes); v2 with the LOCAL or PROXY
 * command, families UNSPEC, INET and INET6 (and UNIX, whose addresses are
 * not IP ones) over STREAM, any TLVs after the addresses skipped. v1
 * UNKNOWN, v2 LOCAL, UNSPEC and UNIX name no IP client: the receiver keeps
 * the socket's own peer (`local`), as the specification says. */
#ifndef FW_PROXY_H
#define FW_PROXY_H

#include <stddef.h>
#include <sys/socket.h>

/* The versions a receiver accepts (a mask; 3: either), and FW_PROXY_PLAIN:
 * a connection may also start with no header at all (gunicorn's
 * proxy_protocol, which detects one). */
enum { FW_PROXY_V1 = 1, FW_PROXY_V2 = 2, FW_PROXY_PLAIN = 4 };

#define FW_PROXY_BAD (-1)
#define FW_PROXY_INCOMPLETE (-2)
#define FW_PROXY_V1_MAX 107           /* the longest v1 line, CRLF included */

typedef struct fw_proxy_hdr {
    int version;                      /* 1 or 2 */
    int local;                        /* no IP client named: keep the socket's peer */
    struct sockaddr_storage client;   /* !local: the client, AF_INET or AF_INET6, with its port */
    socklen_t client_len;
    const char *why;                  /* FW_PROXY_BAD: what is wrong (static text) */
} fw_proxy_hdr;

/* Parse a header at the start of buf[0..len), of a version in `versions`.
 * Returns its length in bytes (> 0: the first request follows it) with
 * *out filled, FW_PROXY_INCOMPLETE (a proper prefix of what may still be a
 * header: read more), or FW_PROXY_BAD (not a header of an accepted
 * version, or a malformed one: out->why says which). */
long fw_proxy_parse(const char *buf, size_t len, int versions, fw_proxy_hdr *out);

/* Question (1 yes, 0 no): can buf[0..len) no longer become a header of
 * either version (so the connection starts without one)? 0 for no bytes. */
int fw_proxy_absent(const char *buf, size_t len);

#endif
