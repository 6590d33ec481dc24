/* fw_proxy: the PROXY protocol header. See fw_proxy.h. */
#include "fw_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

static const char V2_SIG[12] = { '\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n' };

static long bad(fw_proxy_hdr *out, const char *why)
{
    out->why = why;
    return FW_PROXY_BAD;
}

/* Does buf[0..len) start like lit[0..n) as far as it goes? */
static int prefix_of(const char *buf, size_t len, const char *lit, size_t n)
{
    return memcmp(buf, lit, len < n ? len : n) == 0;
}

/* A port: 1 to 5 digits, no leading zero but "0" itself, at most 65535. */
static int parse_port(const char *s, size_t n, unsigned *port)
{
    if (n == 0 || n > 5 || (n > 1 && s[0] == '0'))
        return -1;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > 65535)
        return -1;
    *port = v;
    return 0;
}

/* An address of family af, s[0..n), into addr (4 or 16 bytes). */
static int parse_addr(int af, const char *s, size_t n, void *addr)
{
    char text[INET6_ADDRSTRLEN];
    if (n == 0 || n >= sizeof(text))
        return -1;
    memcpy(text, s, n);
    text[n] = 0;
    return inet_pton(af, text, addr) == 1 ? 0 : -1;
}

static void set_client(fw_proxy_hdr *out, int af, const void *addr, unsigned port)
{
    memset(&out->client, 0, sizeof(out->client));
    if (af == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&out->client;
        a->sin_family = AF_INET;
        memcpy(&a->sin_addr, addr, 4);
        a->sin_port = htons((unsigned short)port);
        out->client_len = sizeof(*a);
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&out->client;
        a->sin6_family = AF_INET6;
        memcpy(&a->sin6_addr, addr, 16);
        a->sin6_port = htons((unsigned short)port);
        out->client_len = sizeof(*a);
    }
    out->local = 0;
}

/* v1: "PROXY " then one line of printable ASCII ended by CRLF. */
static long parse_v1(const char *buf, size_t len, fw_proxy_hdr *out)
{
    static const char PREFIX[] = "PROXY ";
    if (!prefix_of(buf, len, PREFIX, 6))
        return bad(out, "no PROXY header");
    size_t end = 0;                   /* the CR of the CRLF (after "PROXY ": never 0 once found) */
    for (size_t i = 0; i < len && i < FW_PROXY_V1_MAX; i++) {
        unsigned char ch = (unsigned char)buf[i];
        if (ch == '\r') {
            if (i + 2 > FW_PROXY_V1_MAX)
                break;                /* its LF would be byte 108 */
            if (i + 1 == len)
                return FW_PROXY_INCOMPLETE;
            if (buf[i + 1] != '\n')
                return bad(out, "v1 header: CR without LF");
            end = i;
            break;
        }
        if (ch < 0x20 || ch > 0x7e)
            return bad(out, "v1 header: a byte that is not printable ASCII");
    }
    if (!end)
        return len >= FW_PROXY_V1_MAX ? bad(out, "v1 header longer than 107 bytes") : FW_PROXY_INCOMPLETE;
    /* The fields after "PROXY ", separated by single spaces. */
    const char *f[6];
    size_t fl[6], nf = 0;
    const char *p = buf + 6, *e = buf + end;
    while (nf < 6) {
        const char *sp = memchr(p, ' ', (size_t)(e - p));
        const char *stop = sp ? sp : e;
        f[nf] = p;
        fl[nf++] = (size_t)(stop - p);
        if (!sp)
            break;
        p = sp + 1;
    }
    out->version = 1;
    if (fl[0] == 7 && memcmp(f[0], "UNKNOWN", 7) == 0) {
        out->local = 1;               /* the rest of the line is to be ignored */
        out->client_len = 0;
        return (long)end + 2;
    }
    int af;
    if (fl[0] == 4 && memcmp(f[0], "TCP4", 4) == 0)
        af = AF_INET;
    else if (fl[0] == 4 && memcmp(f[0], "TCP6", 4) == 0)
        af = AF_INET6;
    else
        return bad(out, "v1 header: protocol not TCP4, TCP6 or UNKNOWN");
    if (nf != 5)
        return bad(out, "v1 header: not five fields");
    unsigned char src[16], dst[16];
    unsigned sport, dport;
    if (parse_addr(af, f[1], fl[1], src) != 0 || parse_addr(af, f[2], fl[2], dst) != 0)
        return bad(out, "v1 header: bad address");
    if (parse_port(f[3], fl[3], &sport) != 0 || parse_port(f[4], fl[4], &dport) != 0)
        return bad(out, "v1 header: bad port");
    set_client(out, af, src, sport);
    return (long)end + 2;
}

/* v2: the 12-byte signature, version and command, family and protocol,
 * the length of what follows (big-endian), then the addresses and TLVs. */
static long parse_v2(const char *buf, size_t len, fw_proxy_hdr *out)
{
    const unsigned char *u = (const unsigned char *)buf;
    if (!prefix_of(buf, len, V2_SIG, sizeof(V2_SIG)))
        return bad(out, "no PROXY header");
    if (len > 12 && (u[12] >> 4) != 2)
        return bad(out, "v2 header: version not 2");
    if (len > 12 && (u[12] & 0xf) > 1)
        return bad(out, "v2 header: command not LOCAL or PROXY");
    if (len < 16)
        return FW_PROXY_INCOMPLETE;
    int local = (u[12] & 0xf) == 0;
    unsigned family = u[13] >> 4, proto = u[13] & 0xf;
    size_t body = (size_t)u[14] << 8 | u[15], need = 0;
    if (!local) {
        if (family > 3)
            return bad(out, "v2 header: unknown address family");
        if (family != 0 && proto != 1)
            return bad(out, "v2 header: transport not STREAM");
        need = family == 1 ? 12 : family == 2 ? 36 : family == 3 ? 216 : 0;
        if (body < need)
            return bad(out, "v2 header: addresses longer than the header");
    }
    if (len < 16 + body)
        return FW_PROXY_INCOMPLETE;
    out->version = 2;
    if (local || family == 0 || family == 3) {
        out->local = 1;
        out->client_len = 0;
    } else if (family == 1) {
        set_client(out, AF_INET, u + 16, (unsigned)u[24] << 8 | u[25]);
    } else {
        set_client(out, AF_INET6, u + 16, (unsigned)u[48] << 8 | u[49]);
    }
    return (long)(16 + body);
}

long fw_proxy_parse(const char *buf, size_t len, int versions, fw_proxy_hdr *out)
{
    out->why = NULL;
    if (len == 0)
        return FW_PROXY_INCOMPLETE;
    if (buf[0] == 'P' && (versions & FW_PROXY_V1))
        return parse_v1(buf, len, out);
    if (buf[0] == '\r' && (versions & FW_PROXY_V2))
        return parse_v2(buf, len, out);
    if (buf[0] == 'P' && prefix_of(buf, len, "PROXY ", 6))
        return bad(out, "a PROXY v1 header, but only v2 is accepted");
    if (buf[0] == '\r' && prefix_of(buf, len, V2_SIG, sizeof(V2_SIG)))
        return bad(out, "a PROXY v2 header, but only v1 is accepted");
    return bad(out, "no PROXY header");
}

int fw_proxy_absent(const char *buf, size_t len)
{
    return len > 0 && !prefix_of(buf, len, "PROXY ", 6) && !prefix_of(buf, len, V2_SIG, sizeof(V2_SIG));
}
