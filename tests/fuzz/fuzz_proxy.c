/* libFuzzer target for the PROXY protocol parser (cserver/fw_proxy.c),
 * which reads the first bytes of every connection when --proxy-protocol is
 * on: bytes from the network, before any check.
 *
 * On every input, with each set of accepted versions, the result is checked
 * against the contract in fw_proxy.h:
 *   - documented results only: FW_PROXY_BAD (with a reason),
 *     FW_PROXY_INCOMPLETE, or a length within the input;
 *   - an accepted header: a v1 line ends in CRLF within 107 bytes and names
 *     TCP4/TCP6 clients the line spells (read back independently), a v2
 *     header is 16 bytes plus its stated length; a client is AF_INET or
 *     AF_INET6 with the matching length unless `local`;
 *   - incremental use: every proper prefix of an accepted header is
 *     incomplete, every prefix of a bad one is incomplete or bad and once
 *     bad stays bad, what follows a header changes nothing;
 *   - the versions: a header accepted by either is accepted the same by its
 *     own version alone and refused by the other.
 * Every call sees an exact-size heap copy, so ASan catches reads past it.
 * Any broken invariant prints what, then abort()s.
 *
 * Build: `make fuzz-proxy` (libFuzzer) or `make fuzz-smoke` (standalone). */
#include "fw_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, what)                                                         \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_proxy: %s (versions %d, %zu bytes)\n", what,    \
                    versions, n);                                                 \
            abort();                                                              \
        }                                                                         \
    } while (0)

static long parse_copy(const uint8_t *data, size_t n, int versions, fw_proxy_hdr *h)
{
    char *b = malloc(n ? n : 1);
    if (!b)
        abort();
    memcpy(b, data, n);
    memset(h, 0xa5, sizeof(*h));
    long rc = fw_proxy_parse(b, n, versions, h);
    free(b);
    return rc;
}

static int same_client(const fw_proxy_hdr *a, const fw_proxy_hdr *b)
{
    if (a->version != b->version || a->local != b->local)
        return 0;
    return a->local || (a->client_len == b->client_len && memcmp(&a->client, &b->client, a->client_len) == 0);
}

/* Read a v1 TCP4/TCP6 line again, independently: the client's address
 * and port are its third and fifth fields. */
static int v1_names(const uint8_t *line, size_t n, const fw_proxy_hdr *h)
{
    char text[128], src[64], dst[64], proto[8];
    unsigned sport, dport;
    if (n >= sizeof(text))
        return 0;
    memcpy(text, line, n);
    text[n] = 0;
    if (sscanf(text, "PROXY %7s %63s %63s %u %u", proto, src, dst, &sport, &dport) != 5)
        return 0;
    unsigned char want[16];
    int af = strcmp(proto, "TCP4") == 0 ? AF_INET : AF_INET6;
    if (inet_pton(af, src, want) != 1 || h->client.ss_family != af)
        return 0;
    if (af == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&h->client;
        return memcmp(&a->sin_addr, want, 4) == 0 && ntohs(a->sin_port) == sport;
    }
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&h->client;
    return memcmp(&a->sin6_addr, want, 16) == 0 && ntohs(a->sin6_port) == sport;
}

static void check_one(const uint8_t *data, size_t n, int versions)
{
    fw_proxy_hdr h, p;
    long rc = parse_copy(data, n, versions, &h);
    CHECK(rc == FW_PROXY_BAD || rc == FW_PROXY_INCOMPLETE || (rc > 0 && (size_t)rc <= n), "result out of range");
    CHECK(rc != FW_PROXY_BAD || h.why, "a refusal without a reason");
    if (rc > 0) {
        size_t len = (size_t)rc;
        CHECK(h.version == 1 || h.version == 2, "no version");
        CHECK(versions & h.version, "a version not asked for");
        if (h.version == 1) {
            CHECK(len <= FW_PROXY_V1_MAX && data[len - 2] == '\r' && data[len - 1] == '\n', "v1 line not ended by CRLF");
            CHECK(memcmp(data, "PROXY ", 6) == 0, "v1 without PROXY");
            CHECK(h.local || v1_names(data, len - 2, &h), "v1 client differs from the line");
        } else {
            CHECK(len >= 16 && len == 16 + ((size_t)data[14] << 8 | data[15]), "v2 length");
        }
        if (!h.local) {
            CHECK((h.client.ss_family == AF_INET && h.client_len == sizeof(struct sockaddr_in)) ||
                      (h.client.ss_family == AF_INET6 && h.client_len == sizeof(struct sockaddr_in6)),
                  "client family or length");
        }
        /* The other version alone refuses it; its own accepts it the same. */
        if (versions == (FW_PROXY_V1 | FW_PROXY_V2)) {
            CHECK(parse_copy(data, n, h.version, &p) == rc && same_client(&h, &p), "own version differs");
            CHECK(parse_copy(data, n, 3 - h.version, &p) == FW_PROXY_BAD, "other version accepts");
        }
    }
    /* Prefixes: all of them for short inputs, else a spread. */
    size_t step = n <= 300 ? 1 : n / 97 + 1;
    int was_bad = 0;
    for (size_t k = 0; k <= n; k += step) {
        long r = parse_copy(data, k, versions, &p);
        if (rc > 0 && k < (size_t)rc)
            CHECK(r == FW_PROXY_INCOMPLETE, "a prefix of a header is not incomplete");
        else if (rc > 0)
            CHECK(r == rc && same_client(&h, &p), "bytes after a header change it");
        else if (rc == FW_PROXY_INCOMPLETE)
            CHECK(r == FW_PROXY_INCOMPLETE, "a prefix of an incomplete header is not incomplete");
        else
            CHECK(r == FW_PROXY_BAD || (r == FW_PROXY_INCOMPLETE && !was_bad), "a bad prefix taken back");
        was_bad |= r == FW_PROXY_BAD;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int versions = 1; versions <= 3; versions++)
        check_one(data, size, versions);
    return 0;
}
