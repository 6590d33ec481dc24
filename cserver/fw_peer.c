/* fw_peer: who a connection's client is, for REMOTE_ADDR, log lines and
 * hand-offs: the socket's peer, or the client a PROXY protocol header
 * named (--proxy-protocol, from peers in --proxy-allow-from). The header is
 * read here from the connection's `in`; what happens to the connection
 * after is fw_conn.c's business. See fw_internal.h. */
#include "fw_internal.h"
#include "fw_proxy.h"
#include "fw_uwsgi.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#define PORT_TEXT_CAP 8         /* a port as text: "65535" and its NUL, with room */

/* The text of c's client, "host\0port\0", as fw_conn_peer_text gives it
 * (replacing any made before). 0, or -ENOMEM (c keeps none then). */
static int peer_text_set(fw_conn *c, const char *host, size_t hlen, const char *port, size_t plen)
{
    free(c->peer_text);
    c->peer_text = malloc(hlen + plen + 2);
    if (!c->peer_text)
        return -ENOMEM;
    memcpy(c->peer_text, host, hlen);
    c->peer_text[hlen] = 0;
    memcpy(c->peer_text + hlen + 1, port, plen);
    c->peer_text[hlen + 1 + plen] = 0;
    return 0;
}

void fw_peer_set(fw_conn *c, const struct sockaddr *sa, socklen_t len)
{
    free(c->peer_text);
    c->peer_text = NULL;
    memset(&c->peer, 0, sizeof(c->peer));
    if (sa->sa_family == AF_UNIX) {
        /* Its path is all it says (REMOTE_ADDR, log lines): kept as text
         * now, the address as its family alone. */
        const struct sockaddr_un *u = (const struct sockaddr_un *)sa;
        size_t off = offsetof(struct sockaddr_un, sun_path);
        size_t n = len > off ? strnlen(u->sun_path, len - off) : 0;
        c->peer.sa.sa_family = AF_UNIX;
        (void)peer_text_set(c, u->sun_path, n, "", 0);   /* none: made "" when asked */
        return;
    }
    if (len > sizeof(c->peer))
        len = sizeof(c->peer);
    memcpy(&c->peer, sa, len);
}

/* The length of c's client address, as a sockaddr. */
static socklen_t peer_len(const fw_conn *c)
{
    switch (c->peer.sa.sa_family) {
    case AF_INET:
        return sizeof(c->peer.in);
    case AF_INET6:
        return sizeof(c->peer.in6);
    default:
        return sizeof(sa_family_t);
    }
}

void fw_conn_peer_text(fw_conn *c, const char **host, const char **port)
{
    if (!c->peer_text) {
        char h[INET6_ADDRSTRLEN] = "", p[PORT_TEXT_CAP] = "";
        unsigned pn = 0;
        int ip = 1;
        if (c->peer.sa.sa_family == AF_INET) {
            if (!inet_ntop(AF_INET, &c->peer.in.sin_addr, h, sizeof(h)))
                h[0] = 0;
            pn = ntohs(c->peer.in.sin_port);
        } else if (c->peer.sa.sa_family == AF_INET6) {
            const struct in6_addr *a = &c->peer.in6.sin6_addr;
            int ok = IN6_IS_ADDR_V4MAPPED(a) ? inet_ntop(AF_INET, &a->s6_addr[12], h, sizeof(h)) != NULL
                                             : inet_ntop(AF_INET6, a, h, sizeof(h)) != NULL;
            if (!ok)
                h[0] = 0;
            pn = ntohs(c->peer.in6.sin6_port);
        } else {
            ip = 0;             /* AF_UNIX whose text could not be kept */
        }
        if (ip)
            snprintf(p, sizeof(p), "%u", pn);
        if (peer_text_set(c, h, strlen(h), p, strlen(p)) != 0) {
            *host = *port = "";     /* out of memory: the client goes unnamed */
            return;
        }
    }
    *host = c->peer_text;
    *port = c->peer_text + strlen(c->peer_text) + 1;
}

/* The start of what the client sent, escaped, into shown (80 characters
 * at most, then "..."): it usually shows the fault. */
static void input_start(const fw_conn *c, char shown[85])
{
    size_t n = 0, i = 0;
    const unsigned char *p = c->x ? (const unsigned char *)fw_buf_head(&c->x->in) : NULL;
    size_t used = c->x ? fw_buf_used(&c->x->in) : 0;
    for (; i < used && n + 4 < 81; i++) {
        if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\')
            shown[n++] = (char)p[i];
        else
            n += (size_t)snprintf(shown + n, 81 - n, "\\x%02x", p[i]);
    }
    memcpy(shown + n, i < used ? "..." : "", i < used ? 4 : 1);
}

void fw_peer_log(fw_conn *c, int level, int show_input, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *host, *port;
    fw_conn_peer_text(c, &host, &port);
    char shown[85] = "";
    if (show_input)
        input_start(c, shown);
    fw_server_log(c->srv, level, "%s%s%s: %s%s%s%s", host, *port ? ":" : "", port, msg,
                  show_input ? ": \"" : "", shown, show_input ? "\"" : "");
}

int fw_peer_start(fw_conn *c, fw_pass_client client)
{
    const fw_config *cfg = &c->srv->cfg;
    if (client.sa) {
        c->proxy = client.sa->sa_family == AF_UNSPEC ? FW_PX_READ : FW_PX_NAMED;
        if (c->proxy == FW_PX_NAMED)
            fw_peer_set(c, client.sa, client.len);
        return 0;
    }
    /* A uwsgi packet says who the client is and how it came (REMOTE_ADDR,
     * HTTPS): only the proxies allowed to say so may connect. */
    if (c->lst->uwsgi && !fw_netlist_match(cfg->uwsgi_allow, &c->peer.sa, peer_len(c))) {
        fw_peer_log(c, FW_LOG_WARNING, 0, "uwsgi: peer not in --uwsgi-allow-from: connection closed");
        return -1;
    }
    if (!cfg->proxy_protocol)
        return 0;
    if (!fw_netlist_match(cfg->proxy_allow, &c->peer.sa, peer_len(c))) {
        if (cfg->proxy_protocol & FW_PROXY_PLAIN) {
            c->proxy = FW_PX_PLAIN_ONLY;
            return 0;
        }
        fw_peer_log(c, FW_LOG_INFO, 0, "PROXY protocol: peer not in --proxy-allow-from: connection closed");
        return -1;
    }
    c->proxy = FW_PX_WAIT;
    return 0;
}

int fw_peer_read_proxy(fw_conn *c)
{
    fw_proxy_hdr h;
    if (!c->x)
        return 0;       /* nothing read yet */
    const char *buf = fw_buf_head(&c->x->in);
    size_t len = fw_buf_used(&c->x->in);
    if ((c->srv->cfg.proxy_protocol & FW_PROXY_PLAIN) && fw_proxy_absent(buf, len)) {
        c->proxy = FW_PX_OFF;   /* a plain request: its client is the socket's peer */
        return 1;
    }
    long n = fw_proxy_parse(buf, len, c->srv->cfg.proxy_protocol, &h);
    if (n == FW_PROXY_INCOMPLETE)
        return 0;
    if (c->proxy == FW_PX_PLAIN_ONLY) {
        fw_peer_log(c, FW_LOG_INFO, 0, "PROXY protocol: header from a peer not in --proxy-allow-from: "
                    "connection closed");
        return -1;
    }
    if (n < 0) {
        fw_peer_log(c, FW_LOG_INFO, 1, "PROXY protocol: %s: connection closed", h.why);
        return -1;
    }
    fw_buf_consume(&c->x->in, (size_t)n);
    c->proxy = h.local ? FW_PX_READ : FW_PX_NAMED;
    if (!h.local)
        fw_peer_set(c, (const struct sockaddr *)&h.client, h.client_len);
    return 1;
}

void fw_peer_from_uwsgi(fw_conn *c)
{
    const fw_header *addr = fw_uwsgi_var(&c->x->req, "REMOTE_ADDR", 11);
    const fw_header *port = fw_uwsgi_var(&c->x->req, "REMOTE_PORT", 11);
    char host[INET6_ADDRSTRLEN];
    unsigned char bin[sizeof(struct in6_addr)];
    if (!addr || addr->value_len == 0 || addr->value_len >= sizeof(host))
        return;
    memcpy(host, addr->value, addr->value_len);
    host[addr->value_len] = 0;
    /* Text that is no IP address (it would go into log lines) is not taken. */
    if (inet_pton(AF_INET, host, bin) != 1 && inet_pton(AF_INET6, host, bin) != 1)
        return;
    size_t plen = port && port->value_len < PORT_TEXT_CAP ? port->value_len : 0;
    for (size_t i = 0; i < plen; i++)
        if (port->value[i] < '0' || port->value[i] > '9')
            plen = 0;
    (void)peer_text_set(c, host, addr->value_len, plen ? port->value : "", plen);  /* ENOMEM: unnamed */
}

fw_pass_client fw_peer_passed(const fw_conn *c)
{
    static const struct sockaddr unspec = { .sa_family = AF_UNSPEC };
    if (c->proxy == FW_PX_NAMED)
        return (fw_pass_client){ &c->peer.sa, peer_len(c) };
    /* Read, or none came in detect mode (FW_PROXY_PLAIN): the receiver
     * keeps the socket's peer and waits for no header mid-connection. */
    if (c->proxy == FW_PX_READ || (c->proxy == FW_PX_OFF && c->srv->cfg.proxy_protocol))
        return (fw_pass_client){ &unspec, sizeof(unspec) };
    return (fw_pass_client){ NULL, 0 };
}
