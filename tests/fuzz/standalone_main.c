/* A main() for fuzz targets, for builds without libFuzzer (gcc + ASan in CI).
 *
 *   fuzz_standalone [-n COUNT] [-s SEED] [-t SECONDS] [-m MAXLEN] [-a PREFIX] [FILE|DIR ...]
 *
 * Runs LLVMFuzzerTestOneInput once on every FILE and every file in each DIR
 * (not recursive), then on COUNT pseudo-random inputs (default 10000): a
 * few HTTP fragments from a small dictionary strung together, or a corpus
 * file, then mutated at random (bytes changed, inserted, deleted, repeated,
 * fragments spliced in). The sequence depends only on SEED (default 1), so a
 * failure reproduces with the same arguments. -t stops the random phase after
 * SECONDS (default: no limit).
 *
 * When the target aborts or a sanitizer reports an error, the input is
 * written to PREFIX + "crash-<hash>" (default PREFIX: "./") and printed as a
 * Python bytes literal. */
#include "pyrepr.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Set by the sanitizer runtimes when they are linked in. */
extern void __sanitizer_set_death_callback(void (*cb)(void)) __attribute__((weak));

/* ---- the input being run, for crash reports ---------------------------- */

static const uint8_t *cur;
static size_t cur_len;
static const char *cur_name;
static const char *artifact_prefix = "./";

static void dump_current(void)
{
    static int dumped;
    if (!cur || dumped)
        return;
    dumped = 1;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < cur_len; i++)
        h = (h ^ cur[i]) * 1099511628211ull;
    char path[4096];
    snprintf(path, sizeof(path), "%scrash-%016llx", artifact_prefix, (unsigned long long)h);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(cur, 1, cur_len, f);
        fclose(f);
    }
    fprintf(stderr, "\n==standalone== crashing input (%s, %zu bytes) saved to %s\n==standalone== ",
            cur_name ? cur_name : "random", cur_len, f ? path : "(could not write)");
    pyrepr_bytes(stderr, (const unsigned char *)cur, cur_len);
}

static void on_abort(int sig)
{
    dump_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run_one(const uint8_t *d, size_t n, const char *name)
{
    /* An exact-size heap copy, so ASan sees reads past the end. */
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) {
        perror("malloc");
        exit(2);
    }
    memcpy(copy, d, n);
    cur = copy;
    cur_len = n;
    cur_name = name;
    LLVMFuzzerTestOneInput(copy, n);
    cur = NULL;
    free(copy);
}

/* ---- corpus files ------------------------------------------------------- */

struct blob {
    uint8_t *d;
    size_t n;
};
static struct blob *corpus;
static size_t ncorpus, corpus_cap;

static int read_file(const char *path, struct blob *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 4096, n = 0;
    uint8_t *d = malloc(cap);
    size_t k;
    while ((k = fread(d + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap)
            d = realloc(d, cap *= 2);
    }
    fclose(f);
    out->d = d;
    out->n = n;
    return 0;
}

static void add_file(const char *path)
{
    struct blob b;
    if (read_file(path, &b) != 0) {
        fprintf(stderr, "standalone: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    run_one(b.d, b.n, path);
    if (ncorpus == corpus_cap) {
        corpus_cap = corpus_cap ? corpus_cap * 2 : 64;
        corpus = realloc(corpus, corpus_cap * sizeof(*corpus));
    }
    corpus[ncorpus++] = b;
}

static int not_hidden(const struct dirent *e)
{
    return e->d_name[0] != '.';
}

static void add_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "standalone: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        add_file(path);
        return;
    }
    struct dirent **names;
    int k = scandir(path, &names, not_hidden, alphasort);
    if (k < 0) {
        fprintf(stderr, "standalone: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    for (int i = 0; i < k; i++) {
        char full[4096];
        snprintf(full, sizeof(full), "%s/%s", path, names[i]->d_name);
        if (stat(full, &st) == 0 && S_ISREG(st.st_mode))
            add_file(full);
        free(names[i]);
    }
    free(names);
}

/* ---- random inputs ------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

struct frag {
    const char *s;
    size_t n;
};
#define F(lit) {(lit), sizeof(lit) - 1}

static const struct frag FRAGMENTS[] = {
    F("GET "), F("POST "), F("HEAD "), F("PUT "), F("OPTIONS "), F("CONNECT "), F("DELETE "), F("G(T "),
    F("get "), F("/"), F("/a/b?c=d"), F("/p?q#f"), F("*"), F("http://h/x"), F("https://h:443"), F("h:80"),
    F("[::1]:8080"), F("http://u@h/"), F(" HTTP/1.1\r\n"), F(" HTTP/1.0\r\n"), F(" HTTP/2.0\r\n"),
    F(" HTTP/1.1\n"), F(" http/1.1\r\n"), F("\r\n"), F("\n"), F("\r"), F("Host: a\r\n"), F("Host:\r\n"),
    F("host: h:1\r\n"), F("Host: a b\r\n"), F("Content-Length: 5\r\n"), F("Content-Length: 0\r\n"),
    F("content-length: 00\r\n"), F("Content-Length: 18446744073709551616\r\n"),
    F("Content-Length: 1,1\r\n"), F("Transfer-Encoding: chunked\r\n"), F("transfer-encoding: CHUNKED\r\n"),
    F("Transfer-Encoding: gzip, chunked\r\n"), F("Transfer-Encoding: chunked, gzip\r\n"),
    F("Transfer-Encoding: identity\r\n"), F("Connection: close\r\n"), F("Connection: keep-alive\r\n"),
    F("Connection: a, close ,\r\n"), F("Expect: 100-continue\r\n"), F("Expect: x\r\n"), F("X-A: b\r\n"),
    F("X-A:\t b \t\r\n"), F(" folded\r\n"), F("X-A : b\r\n"), F("X-\x00: b\r\n"),
    F("X: \x01\x7f\x80\xff\r\n"), F("5\r\nhello\r\n"), F("0\r\n\r\n"), F("0\r\n"),
    F("A;ext=1\r\n0123456789\r\n"), F("1 ; a=\"b\"\r\nx\r\n"), F("ffffffffffffffff\r\n"),
    F("00000000000000001\r\n"), F("X-Trailer: v\r\n"), F("abc"), F("hello world"),
};
#define NFRAG (sizeof(FRAGMENTS) / sizeof(FRAGMENTS[0]))

static const uint8_t SPECIAL[] = {'\r', '\n', ' ', '\t', 0, ':', ';', ',', '"', 0x7f, 0x80, 0xff, '0', 'f', 'F', '/', '?', '#', '@', '*'};

static size_t append(uint8_t *buf, size_t n, size_t max, const void *p, size_t k)
{
    if (n + k > max)
        k = max - n;
    memcpy(buf + n, p, k);
    return n + k;
}

static size_t generate(uint8_t *buf, size_t max)
{
    size_t n = 0;
    if (ncorpus && below(3) == 0) {
        const struct blob *b = &corpus[below(ncorpus)];
        n = append(buf, 0, max, b->d, b->n);
    } else {
        size_t parts = 1 + below(14);
        for (size_t i = 0; i < parts; i++) {
            const struct frag *f = &FRAGMENTS[below(NFRAG)];
            n = append(buf, n, max, f->s, f->n);
        }
    }
    size_t muts = below(5);
    for (size_t m = 0; m < muts; m++) {
        size_t at = below(n + 1);
        switch (below(7)) {
        case 0:                                     /* change a byte */
            if (n)
                buf[below(n)] = (uint8_t)rnd();
            break;
        case 1:                                     /* insert a special byte */
            if (n < max) {
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = SPECIAL[below(sizeof(SPECIAL))];
                n++;
            }
            break;
        case 2: {                                   /* delete a range */
            size_t k = below(n - at + 1);
            if (k > 8)
                k = 1 + below(8);
            memmove(buf + at, buf + at + k, n - at - k);
            n -= k;
            break;
        }
        case 3: {                                   /* repeat a range */
            size_t k = below(n - at + 1);
            if (k > 64)
                k = 64;
            size_t times = 1 + below(4);
            for (size_t t = 0; t < times && n + k <= max; t++) {
                memmove(buf + at + k, buf + at, n - at);
                n += k;
            }
            break;
        }
        case 4: {                                   /* splice in a fragment */
            const struct frag *f = &FRAGMENTS[below(NFRAG)];
            size_t k = f->n;
            if (n + k <= max) {
                memmove(buf + at + k, buf + at, n - at);
                memcpy(buf + at, f->s, k);
                n += k;
            }
            break;
        }
        case 5:                                     /* truncate */
            n = at;
            break;
        default: {                                  /* swap CRLF and LF, or drop a CR */
            for (size_t i = at; i < n; i++) {
                if (buf[i] == '\r') {
                    memmove(buf + i, buf + i + 1, n - i - 1);
                    n--;
                    break;
                }
            }
            break;
        }
        }
    }
    return n;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    unsigned long long count = 10000, seed = 1;
    double seconds = 0;
    size_t maxlen = 1024;
    int opt;
    while ((opt = getopt(argc, argv, "n:s:t:m:a:h")) != -1) {
        switch (opt) {
        case 'n': count = strtoull(optarg, NULL, 10); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 't': seconds = atof(optarg); break;
        case 'm': maxlen = (size_t)strtoull(optarg, NULL, 10); break;
        case 'a': artifact_prefix = optarg; break;
        default:
            fprintf(stderr, "usage: %s [-n COUNT] [-s SEED] [-t SECONDS] [-m MAXLEN] [-a PREFIX] [FILE|DIR ...]\n",
                    argv[0]);
            return opt == 'h' ? 0 : 2;
        }
    }
    if (maxlen < 1)
        maxlen = 1;
    signal(SIGABRT, on_abort);
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(dump_current);

    double t0 = now();
    for (int i = optind; i < argc; i++)
        add_path(argv[i]);
    size_t nfiles = ncorpus;

    rng_state = seed;
    uint8_t *buf = malloc(maxlen);
    unsigned long long ran = 0;
    for (; ran < count; ran++) {
        if (seconds > 0 && (ran & 255) == 0 && now() - t0 > seconds)
            break;
        size_t n = generate(buf, maxlen);
        run_one(buf, n, NULL);
    }
    free(buf);
    for (size_t i = 0; i < ncorpus; i++)
        free(corpus[i].d);
    free(corpus);
    printf("standalone: %zu files and %llu random inputs (seed %llu) in %.1f s, no crash\n", nfiles, ran, seed,
           now() - t0);
    return 0;
}
