/* libFuzzer target for the offload record parser (cserver/fw_offload.c),
 * which reads the journal and the workers' spill files.
 *
 * The input is read as a file of records, as the sibling does. For every
 * record the parser accepts: its length covers exactly its header and its
 * three fields, the spans lie inside the input, the topic is a valid Kafka
 * name, and a key is present exactly when the flag says so; re-framing the
 * parsed fields gives back the same bytes. A prefix of an accepted record
 * is "need more" (0), never an error or a different record. Any broken
 * invariant prints what and where, then abort()s.
 *
 * Build: `make fuzz-offload` (libFuzzer) or `make fuzz-offload-smoke`. */
#include "fw_offload.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, what)                                                         \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "fuzz_offload: %s at offset %zu\n", what, off);       \
            abort();                                                              \
        }                                                                         \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    size_t off = 0;
    while (off < size) {
        fw_offload_rec r;
        long n = fw_offload_parse(buf + off, size - off, &r);
        if (n <= 0)
            break;
        size_t len = (size_t)n;
        CHECK(len <= size - off, "record longer than the input");
        CHECK(len == sizeof(fw_offload_hdr) + r.h.topic_len + (size_t)r.h.key_len + r.h.value_len,
              "length does not add up");
        CHECK(r.topic == buf + off + sizeof(fw_offload_hdr), "topic not after the header");
        CHECK(fw_offload_topic_ok(r.topic, r.h.topic_len), "invalid topic accepted");
        CHECK((r.key != NULL) == ((r.h.flags & FW_OFL_KEY) != 0), "key presence");
        CHECK(r.value + r.h.value_len == buf + off + len, "value does not end the record");
        /* Re-frame and compare. */
        char *copy = malloc(len);
        CHECK(copy != NULL, "out of memory");
        memcpy(copy, &r.h, sizeof(r.h));
        memcpy(copy + sizeof(r.h), r.topic, r.h.topic_len);
        if (r.key)
            memcpy(copy + sizeof(r.h) + r.h.topic_len, r.key, r.h.key_len);
        memcpy(copy + sizeof(r.h) + r.h.topic_len + r.h.key_len, r.value, r.h.value_len);
        CHECK(memcmp(copy, buf + off, len) == 0, "re-framed record differs");
        /* Every proper prefix asks for more. */
        size_t cut = (size_t)data[off % size] % len;
        fw_offload_rec p;
        CHECK(fw_offload_parse(copy, cut, &p) == 0, "a prefix is not 'need more'");
        free(copy);
        off += len;
    }
    return 0;
}
