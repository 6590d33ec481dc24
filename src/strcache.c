/* strcache: the short strings the environ repeats from request to request.
 *
 * A kept-alive client sends the same Host, User-Agent and Accept on every
 * request, asks for the same few paths, and keeps its address and port; the
 * environ keys of its header names are the same too. Building each of them
 * as a new str costs an allocation, a copy and a free per request. Here a
 * hit costs a hash and a memcmp, and the request shares the cached str
 * (strs are immutable, so sharing them is safe).
 *
 * Direct-mapped: a slot holds the last string whose bytes hashed to it, and
 * a miss replaces it. A value's slot keeps no copy of the bytes: they are
 * compared with the cached str itself, which the request touches next
 * anyway. A header name's environ key is not its bytes (HTTP_, upper case,
 * '_' for '-'), so that cache keeps the name's bytes beside it: comparing
 * them is two loads where converting each byte was a loop. Memory is
 * bounded (FW_STRCACHE_SLOTS strings of at most FW_STRCACHE_MAX bytes);
 * colliding or ever-changing values (cookies) only miss, costing one hash
 * more than no cache. The caller holds the GIL, which protects the slots. */
#include "glue.h"

#include <string.h>

/* A hash of the bytes, good enough to spread slots; not a defence (a
 * crafted collision only makes lookups miss). Short strings, the usual
 * case, take two overlapping loads. */
static inline uint64_t load8(const char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static inline uint64_t sc_hash(const char *p, size_t n)
{
    uint64_t a, b;
    if (n >= 8) {
        a = load8(p);
        b = load8(p + n - 8);
        for (size_t i = 8; i + 8 < n; i += 8)
            a = (a ^ load8(p + i)) * 0x9E3779B97F4A7C15ull;
    } else if (n >= 4) {
        uint32_t x, y;
        memcpy(&x, p, 4);
        memcpy(&y, p + n - 4, 4);
        a = x;
        b = y;
    } else {
        a = n ? (unsigned char)p[0] | (unsigned char)p[n / 2] << 8 | (unsigned)(unsigned char)p[n - 1] << 16
              : 0;
        b = 0;
    }
    uint64_t h = (a * 0xff51afd7ed558ccdull) ^ (b * 0xc4ceb9fe1a85ec53ull) ^ n;
    return h ^ (h >> 31);
}

/* Are n bytes at a and b the same? Inline for the usual lengths (two
 * overlapping loads each side), memcmp beyond. */
static inline int bytes_eq(const char *a, const char *b, size_t n)
{
    if (n >= 8 && n <= 16)
        return load8(a) == load8(b) && load8(a + n - 8) == load8(b + n - 8);
    if (n >= 4 && n < 8) {
        uint32_t a0, a1, b0, b1;
        memcpy(&a0, a, 4);
        memcpy(&b0, b, 4);
        memcpy(&a1, a + n - 4, 4);
        memcpy(&b1, b + n - 4, 4);
        return a0 == b0 && a1 == b1;
    }
    if (n < 4) {                        /* (a path of "/", short values): no call */
        for (size_t k = 0; k < n; k++)
            if (a[k] != b[k])
                return 0;
        return 1;
    }
    return memcmp(a, b, n) == 0;
}

/* A miss: make the str and keep it in slot i. Apart from the hit path so
 * that the hit, the usual case, saves and restores few registers. */
static __attribute__((noinline)) PyObject *sc_fill(fw_strcache *sc, size_t i, uint64_t h, const char *p, size_t n,
                                                   PyObject *(*make)(const char *p, size_t n))
{
    fw_strcache_slot *e = &sc->slots[i];
    PyObject *v = make(p, n);
    if (!v)
        return NULL;
    /* Where the bytes start in the str: an environ key of n name bytes is
     * HTTP_ and those, or (CONTENT_TYPE, CONTENT_LENGTH) just them. */
    Py_ssize_t off = PyUnicode_GET_LENGTH(v) - (Py_ssize_t)n;
    if (PyUnicode_KIND(v) != PyUnicode_1BYTE_KIND || off < 0)
        return v;                       /* not cacheable (make's choice): return as is */
    Py_XSETREF(e->value, Py_NewRef(v));
    if (sc->env_keys)
        memcpy(sc->raw[i], p, n);
    e->hash = h;
    e->off = (size_t)off;
    e->len = n;
    return v;
}

PyObject *fw_strcache_get(fw_strcache *sc, const char *p, size_t n,
                          PyObject *(*make)(const char *p, size_t n))
{
    if (n > FW_STRCACHE_MAX)
        return make(p, n);
    uint64_t h = sc_hash(p, n);
    size_t i = h & (FW_STRCACHE_SLOTS - 1);
    const fw_strcache_slot *e = &sc->slots[i];
    if (e->hash == h && e->value && e->len == n) {
        const char *have = sc->env_keys ? sc->raw[i] : (const char *)PyUnicode_1BYTE_DATA(e->value) + e->off;
        if (bytes_eq(have, p, n)) {
            Py_INCREF(e->value);
            return e->value;
        }
    }
    return sc_fill(sc, i, h, p, n, make);
}
