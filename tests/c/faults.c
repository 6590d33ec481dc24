/* faults.c: an LD_PRELOAD shim that makes chosen libc calls fail, but only
 * calls made FROM the forkwsgi extension (the caller's return address lies
 * in a shared object whose path contains "_forkwsgi"): Python's and libc's
 * own calls are left alone. tests/test_faults.py drives the server's error
 * paths with it, in real server processes.
 *
 * Build:  cc -shared -fPIC -O1 -o libfwfault.so tests/c/faults.c -ldl
 * Use:    LD_PRELOAD=libfwfault.so FW_FAULT=calloc:3 python -m forkwsgi ...
 *
 * FW_FAULT: comma-separated rules, each  NAME:N[+|-M][=ERR]
 *   NAME   one of the functions below (malloc, calloc, eventfd, ...), or
 *          epoll_ctl_add / epoll_ctl_mod / epoll_ctl_del: epoll_ctl with that op,
 *          eventfd_write / eventfd_read: write() / read() on an eventfd
 *   N      fail the Nth call of NAME made from the extension (1-based)
 *   N+     fail the Nth call and every one after it
 *   N-M    fail calls N to M
 *   =ERR   the errno to fail with: a name (ENOMEM, EMFILE, ENFILE, ENOBUFS,
 *          EAGAIN, EIO, ENOSPC, EPERM, EINVAL, EBADF, EINTR) or a number.
 *          Default: ENOMEM (EMFILE for calls that make a descriptor,
 *          EAGAIN for pthread_create).
 *   e.g.  FW_FAULT="calloc:3"         the 3rd calloc fails with ENOMEM
 *         FW_FAULT="eventfd:1+"       every eventfd fails
 *         FW_FAULT="accept4:1-3=ENOBUFS,epoll_ctl:2"
 * Calls are counted per process and per rule: a forked child starts its
 * counts from zero (pthread_atfork), so "calloc:3" is the 3rd in each worker.
 * FW_FAULT_AFTER_FORK=1  count (and fail) only in forked children, never in
 *                        the process that loaded the shim (the master).
 * FW_FAULT_GATE=PATH     count (and fail) only while PATH exists: a test
 *                        starts the server cleanly, then opens the gate.
 * FW_FAULT_LOG=PATH      append "PID NAME N ERRNO" there for every call
 *                        made to fail (a test waits for it: the fault
 *                        happened, so an assertion cannot pass vacuously).
 *
 * malloc/calloc/realloc forward to glibc's __libc_* (no dlsym bootstrap
 * problem); the rest to dlsym(RTLD_NEXT). Test code: a few statics. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

#define MAX_RULES 16

typedef struct rule {
    char name[24];
    long from, to;          /* fail calls from..to (1-based, inclusive) */
    int err;
    long count;             /* calls seen (atomic) */
} rule;

static rule rules[MAX_RULES];
static int nrules;
static int after_fork_only;
static int in_child;
/* Copies: the process title (setproctitle) overwrites the environment. */
static char gate_buf[256], log_buf[256];
static const char *gate;
static const char *log_path;
static __thread int busy __attribute__((tls_model("initial-exec")));

static int err_of(const char *s, int dflt)
{
    static const struct { const char *n; int e; } names[] = {
        { "ENOMEM", ENOMEM }, { "EMFILE", EMFILE }, { "ENFILE", ENFILE }, { "ENOBUFS", ENOBUFS },
        { "EAGAIN", EAGAIN }, { "EIO", EIO }, { "ENOSPC", ENOSPC }, { "EPERM", EPERM },
        { "EINVAL", EINVAL }, { "EBADF", EBADF }, { "EINTR", EINTR },
        { "ECONNABORTED", ECONNABORTED },
    };
    if (!s || !*s)
        return dflt;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i].n) == 0)
            return names[i].e;
    return atoi(s) > 0 ? atoi(s) : dflt;
}

static int default_err(const char *name)
{
    static const char *const fd_makers[] = { "eventfd", "epoll_create1", "accept4", "socket", "open", "dup3" };
    for (size_t i = 0; i < sizeof(fd_makers) / sizeof(fd_makers[0]); i++)
        if (strcmp(name, fd_makers[i]) == 0)
            return EMFILE;
    return strcmp(name, "pthread_create") == 0 ? EAGAIN : ENOMEM;      /* pthread_create's own word */
}

/* One rule from "NAME:N[+|-M][=ERR]" (len bytes of s). */
static void parse_rule(const char *s, size_t len)
{
    char buf[96];
    if (nrules >= MAX_RULES || len == 0 || len >= sizeof(buf))
        return;
    memcpy(buf, s, len);
    buf[len] = 0;
    char *colon = strchr(buf, ':');
    if (!colon)
        return;
    *colon = 0;
    char *eq = strchr(colon + 1, '=');
    if (eq)
        *eq++ = 0;
    rule *r = &rules[nrules];
    if (strlen(buf) >= sizeof(r->name))
        return;
    memcpy(r->name, buf, strlen(buf) + 1);
    char *end;
    r->from = strtol(colon + 1, &end, 10);
    if (r->from < 1)
        return;
    if (*end == '+')
        r->to = LONG_MAX;
    else if (*end == '-')
        r->to = strtol(end + 1, NULL, 10);
    else
        r->to = r->from;
    r->err = err_of(eq, default_err(r->name));
    nrules++;
}

static void child_after_fork(void)
{
    in_child = 1;
    for (int i = 0; i < nrules; i++)
        __atomic_store_n(&rules[i].count, 0, __ATOMIC_RELAXED);
}

static const char *copy_env(const char *name, char *buf, size_t size)
{
    const char *v = getenv(name);
    if (!v || !*v || strlen(v) >= size)
        return NULL;
    memcpy(buf, v, strlen(v) + 1);
    return buf;
}

__attribute__((constructor)) static void setup(void)
{
    const char *spec = getenv("FW_FAULT");
    if (!spec)
        return;
    while (*spec) {
        size_t n = strcspn(spec, ",");
        parse_rule(spec, n);
        spec += n;
        if (*spec == ',')
            spec++;
    }
    const char *af = getenv("FW_FAULT_AFTER_FORK");
    after_fork_only = af && *af && *af != '0';
    gate = copy_env("FW_FAULT_GATE", gate_buf, sizeof(gate_buf));
    log_path = copy_env("FW_FAULT_LOG", log_buf, sizeof(log_buf));
    pthread_atfork(NULL, NULL, child_after_fork);
}

static rule *rule_for(const char *name)
{
    for (int i = 0; i < nrules; i++)
        if (strcmp(rules[i].name, name) == 0)
            return &rules[i];
    return NULL;
}

static int from_extension(void *ret)
{
    Dl_info info;
    if (!dladdr(ret, &info) || !info.dli_fname)
        return 0;
    return strstr(info.dli_fname, "_forkwsgi") != NULL;
}

static void log_fault(const rule *r, long n)
{
    if (!log_path)
        return;
    char line[96];
    int len = snprintf(line, sizeof(line), "%ld %s %ld %d\n", (long)getpid(), r->name, n, r->err);
    int fd = (int)syscall(SYS_openat, AT_FDCWD, log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, line, (size_t)len);
    (void)w;
    close(fd);
}

/* Whether this call (to NAME, made from ret) is to fail; sets errno then. */
static int should_fail(const char *name, void *ret)
{
    if (nrules == 0 || busy)
        return 0;
    rule *r = rule_for(name);
    if (!r || (after_fork_only && !in_child))
        return 0;
    busy = 1;
    int fail = 0;
    if ((!gate || access(gate, F_OK) == 0) && from_extension(ret)) {
        long n = __atomic_add_fetch(&r->count, 1, __ATOMIC_RELAXED);
        if (n >= r->from && n <= r->to) {
            fail = 1;
            log_fault(r, n);
        }
    }
    busy = 0;
    if (fail)
        errno = r->err;
    return fail;
}

#define RET __builtin_return_address(0)
#define NEXT(fn) static __typeof__(&fn) real; if (!real) real = (__typeof__(&fn))dlsym(RTLD_NEXT, #fn)

/* ---- allocation ------------------------------------------------------------ */

void *malloc(size_t n)
{
    if (should_fail("malloc", RET))
        return NULL;
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (should_fail("calloc", RET))
        return NULL;
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    if (should_fail("realloc", RET))
        return NULL;
    return __libc_realloc(p, n);
}

/* ---- descriptors ------------------------------------------------------------ */

int eventfd(unsigned int initval, int flags)
{
    if (should_fail("eventfd", RET))
        return -1;
    NEXT(eventfd);
    return real(initval, flags);
}

int epoll_create1(int flags)
{
    if (should_fail("epoll_create1", RET))
        return -1;
    NEXT(epoll_create1);
    return real(flags);
}

/* Rules for one operation too: epoll_ctl_add, epoll_ctl_mod, epoll_ctl_del. */
int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    const char *opname = op == EPOLL_CTL_ADD ? "epoll_ctl_add" : op == EPOLL_CTL_MOD ? "epoll_ctl_mod" : "epoll_ctl_del";
    if (should_fail("epoll_ctl", RET) || should_fail(opname, RET))
        return -1;
    NEXT(epoll_ctl);
    return real(epfd, op, fd, ev);
}

int epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout)
{
    if (should_fail("epoll_wait", RET))
        return -1;
    NEXT(epoll_wait);
    return real(epfd, evs, max, timeout);
}

int accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
    if (should_fail("accept4", RET))
        return -1;
    NEXT(accept4);
    return real(fd, sa, len, flags);
}

int socket(int domain, int type, int protocol)
{
    if (should_fail("socket", RET))
        return -1;
    NEXT(socket);
    return real(domain, type, protocol);
}

int dup3(int oldfd, int newfd, int flags)
{
    if (should_fail("dup3", RET))
        return -1;
    NEXT(dup3);
    return real(oldfd, newfd, flags);
}

int getsockname(int fd, struct sockaddr *sa, socklen_t *len)
{
    if (should_fail("getsockname", RET))
        return -1;
    NEXT(getsockname);
    return real(fd, sa, len);
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    if (should_fail("setsockopt", RET))
        return -1;
    NEXT(setsockopt);
    return real(fd, level, name, val, len);
}

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    if (should_fail("open", RET))
        return -1;
    NEXT(open);
    return real(path, flags, mode);
}

/* ---- files and mappings ---------------------------------------------------- */

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (should_fail("mmap", RET))
        return MAP_FAILED;
    NEXT(mmap);
    return real(addr, len, prot, flags, fd, off);
}

int ftruncate(int fd, off_t len)
{
    if (should_fail("ftruncate", RET))
        return -1;
    NEXT(ftruncate);
    return real(fd, len);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
    if (should_fail("fallocate", RET))
        return -1;
    NEXT(fallocate);
    return real(fd, mode, off, len);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
    if (should_fail("writev", RET))
        return -1;
    NEXT(writev);
    return real(fd, iov, iovcnt);
}

/* write() and read() on an eventfd only (rules eventfd_write, eventfd_read):
 * the extension's other writes and reads are the clients' traffic. */
static int is_eventfd(int fd)
{
    char path[64], target[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n < 0)
        return 0;
    target[n] = 0;
    return strcmp(target, "anon_inode:[eventfd]") == 0;
}

ssize_t write(int fd, const void *buf, size_t len)
{
    if (rule_for("eventfd_write") && !busy && is_eventfd(fd) && should_fail("eventfd_write", RET))
        return -1;
    NEXT(write);
    return real(fd, buf, len);
}

ssize_t read(int fd, void *buf, size_t len)
{
    if (rule_for("eventfd_read") && !busy && is_eventfd(fd) && should_fail("eventfd_read", RET))
        return -1;
    NEXT(read);
    return real(fd, buf, len);
}

/* posix_fallocate returns the error instead of setting errno. */
int posix_fallocate(int fd, off_t off, off_t len)
{
    if (should_fail("posix_fallocate", RET))
        return errno;
    NEXT(posix_fallocate);
    return real(fd, off, len);
}

/* ---- threads (these return the error number) --------------------------------- */

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    if (should_fail("pthread_create", RET))
        return errno;
    NEXT(pthread_create);
    return real(t, attr, fn, arg);
}

int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr)
{
    if (should_fail("pthread_mutex_init", RET))
        return errno;
    NEXT(pthread_mutex_init);
    return real(m, attr);
}

int pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *attr)
{
    if (should_fail("pthread_cond_init", RET))
        return errno;
    NEXT(pthread_cond_init);
    return real(c, attr);
}
