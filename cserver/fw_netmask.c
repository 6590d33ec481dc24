/* fw_netmask: address lists for the proxy settings. See fw_netmask.h. */
#include "fw_netmask.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

static int blank(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* One entry, s[0..n) with no blanks around it: "*", ADDR or ADDR/BITS. */
static int parse_entry(const char *s, size_t n, fw_net *net, int *any)
{
    if (n == 1 && s[0] == '*') {
        *any = 1;
        return 0;
    }
    const char *slash = memchr(s, '/', n);
    size_t alen = slash ? (size_t)(slash - s) : n;
    char text[INET6_ADDRSTRLEN];
    if (alen == 0 || alen >= sizeof(text))
        return -EINVAL;
    memcpy(text, s, alen);
    text[alen] = 0;
    memset(net, 0, sizeof(*net));
    if (inet_pton(AF_INET, text, net->addr) == 1)
        net->v6 = 0;
    else if (inet_pton(AF_INET6, text, net->addr) == 1)
        net->v6 = 1;
    else
        return -EINVAL;
    unsigned max = net->v6 ? 128 : 32, bits = max;
    if (slash) {
        const char *d = slash + 1, *end = s + n;
        if (d == end || end - d > 3)
            return -EINVAL;
        bits = 0;
        for (; d < end; d++) {
            if (*d < '0' || *d > '9')
                return -EINVAL;
            bits = bits * 10 + (unsigned)(*d - '0');
        }
        if (bits > max)
            return -EINVAL;
    }
    net->bits = (unsigned char)bits;
    /* No bit may be set past the prefix. */
    for (unsigned i = bits; i < max; i++)
        if (net->addr[i / 8] & (0x80u >> (i % 8)))
            return -EINVAL;
    return 0;
}

int fw_netlist_parse(const char *spec, fw_netlist **out)
{
    size_t entries = 1;
    for (const char *p = spec; *p; p++)
        entries += *p == ',';
    fw_netlist *l = calloc(1, sizeof(*l) + entries * sizeof(fw_net));
    if (!l)
        return -ENOMEM;
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && blank(*a))
            a++;
        while (b > a && blank(b[-1]))
            b--;
        if (a < b) {
            int rc = parse_entry(a, (size_t)(b - a), &l->nets[l->n], &l->any);
            if (rc != 0) {
                free(l);
                return rc;
            }
            if (!(b - a == 1 && *a == '*'))
                l->n++;
        }
        if (!*end)
            break;
        p = end + 1;
    }
    *out = l;
    return 0;
}

void fw_netlist_free(fw_netlist *l)
{
    free(l);
}

static int in_net(const fw_net *net, int v6, const unsigned char *addr)
{
    if (net->v6 != v6)
        return 0;
    unsigned full = net->bits / 8, rest = net->bits % 8;
    if (memcmp(net->addr, addr, full) != 0)
        return 0;
    if (!rest)
        return 1;
    unsigned char mask = (unsigned char)(0xffu << (8 - rest));
    return (addr[full] & mask) == net->addr[full];
}

int fw_netlist_match(const fw_netlist *l, const struct sockaddr *sa, socklen_t len)
{
    const unsigned char *addr;
    int v6;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        addr = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
        v6 = 0;
    } else if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        v6 = !IN6_IS_ADDR_V4MAPPED(a6);
        addr = v6 ? a6->s6_addr : a6->s6_addr + 12;
    } else {
        return sa->sa_family == AF_UNIX;
    }
    if (!l)
        return 0;
    if (l->any)
        return 1;
    for (size_t i = 0; i < l->n; i++)
        if (in_net(&l->nets[i], v6, addr))
            return 1;
    return 0;
}
