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
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

static void set_peer(fw_conn *c, const struct sockaddr *sa, socklen_t len)
{
    if (len > sizeof(c->peer))
        len = sizeof(c->peer);
    memcpy(&c->peer, sa, len);
    c->peer_len = len;
    c->peer_text = 0;
}

void fw_conn_peer_text(fw_conn *c, const char **host, const char **port)
{
    if (!c->peer_text) {
        const struct sockaddr_storage *ss = &c->peer;
        unsigned p = 0;
        c->peer_host[0] = 0;
        c->peer_port[0] = 0;
        if (ss->ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
            if (!inet_ntop(AF_INET, &a->sin_addr, c->peer_host, sizeof(c->peer_host)))
                c->peer_host[0] = 0;
            p = ntohs(a->sin_port);
        } else if (ss->ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
            int ok = IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)
                         ? inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], c->peer_host, sizeof(c->peer_host)) != NULL
                         : inet_ntop(AF_INET6, &a->sin6_addr, c->peer_host, sizeof(c->peer_host)) != NULL;
            if (!ok)
                c->peer_host[0] = 0;
            p = ntohs(a->sin6_port);
        } else if (ss->ss_family == AF_UNIX) {
            const struct sockaddr_un *u = (const struct sockaddr_un *)ss;
            size_t off = offsetof(struct sockaddr_un, sun_path);
            size_t n = c->peer_len > off ? strnlen(u->sun_path, c->peer_len - off) : 0;
            if (n >= sizeof(c->peer_host))
                n = sizeof(c->peer_host) - 1;
            memcpy(c->peer_host, u->sun_path, n);
            c->peer_host[n] = 0;
        }
        if (ss->ss_family == AF_INET || ss->ss_family == AF_INET6)
            snprintf(c->peer_port, sizeof(c->peer_port), "%u", p);
        c->peer_text = 1;
    }
    *host = c->peer_host;
    *port = c->peer_port;
}

/* The start of what the client sent, escaped, into shown (80 characters
 * at most, then "..."): it usually shows the fault. */
static void input_start(const fw_conn *c, char shown[85])
{
    size_t n = 0, i = 0;
    const unsigned char *p = (const unsigned char *)fw_buf_head(&c->in);
    size_t used = fw_buf_used(&c->in);
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
            set_peer(c, client.sa, client.len);
        return 0;
    }
    /* A uwsgi packet says who the client is and how it came (REMOTE_ADDR,
     * HTTPS): only the proxies allowed to say so may connect. */
    if (c->lst->uwsgi && !fw_netlist_match(cfg->uwsgi_allow, (const struct sockaddr *)&c->peer, c->peer_len)) {
        fw_peer_log(c, FW_LOG_WARNING, 0, "uwsgi: peer not in --uwsgi-allow-from: connection closed");
        return -1;
    }
    if (!cfg->proxy_protocol)
        return 0;
    if (!fw_netlist_match(cfg->proxy_allow, (const struct sockaddr *)&c->peer, c->peer_len)) {
        fw_peer_log(c, FW_LOG_INFO, 0, "PROXY protocol: peer not in --proxy-allow-from: connection closed");
        return -1;
    }
    c->proxy = FW_PX_WAIT;
    return 0;
}

int fw_peer_read_proxy(fw_conn *c)
{
    fw_proxy_hdr h;
    long n = fw_proxy_parse(fw_buf_head(&c->in), fw_buf_used(&c->in), c->srv->cfg.proxy_protocol, &h);
    if (n == FW_PROXY_INCOMPLETE)
        return 0;
    if (n < 0) {
        fw_peer_log(c, FW_LOG_INFO, 1, "PROXY protocol: %s: connection closed", h.why);
        return -1;
    }
    fw_buf_consume(&c->in, (size_t)n);
    c->proxy = h.local ? FW_PX_READ : FW_PX_NAMED;
    if (!h.local)
        set_peer(c, (const struct sockaddr *)&h.client, h.client_len);
    return 1;
}

void fw_peer_from_uwsgi(fw_conn *c)
{
    const fw_header *addr = fw_uwsgi_var(&c->req, "REMOTE_ADDR", 11);
    const fw_header *port = fw_uwsgi_var(&c->req, "REMOTE_PORT", 11);
    char host[INET6_ADDRSTRLEN];
    unsigned char bin[sizeof(struct in6_addr)];
    if (!addr || addr->value_len == 0 || addr->value_len >= sizeof(host))
        return;
    memcpy(host, addr->value, addr->value_len);
    host[addr->value_len] = 0;
    /* Text that is no IP address (it would go into log lines) is not taken. */
    if (inet_pton(AF_INET, host, bin) != 1 && inet_pton(AF_INET6, host, bin) != 1)
        return;
    size_t plen = port && port->value_len < sizeof(c->peer_port) ? port->value_len : 0;
    for (size_t i = 0; i < plen; i++)
        if (port->value[i] < '0' || port->value[i] > '9')
            plen = 0;
    memcpy(c->peer_host, host, addr->value_len + 1);
    memcpy(c->peer_port, plen ? port->value : "", plen);
    c->peer_port[plen] = 0;
    c->peer_text = 1;
}

fw_pass_client fw_peer_passed(const fw_conn *c)
{
    static const struct sockaddr unspec = { .sa_family = AF_UNSPEC };
    if (c->proxy == FW_PX_NAMED)
        return (fw_pass_client){ (const struct sockaddr *)&c->peer, c->peer_len };
    if (c->proxy == FW_PX_READ)
        return (fw_pass_client){ &unspec, sizeof(unspec) };
    return (fw_pass_client){ NULL, 0 };
}
