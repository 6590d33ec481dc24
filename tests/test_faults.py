"""The error paths users meet when a syscall or an allocation fails, in real
server processes over real sockets (issue 26).

tests/c/faults.c, preloaded into the server (LD_PRELOAD), makes chosen libc
calls fail, but only those the forkwsgi extension makes (Python's own and
libc's are left alone); see its top comment for FW_FAULT's rules. Each test
asserts what a user sees: the log line, the exit code, the connection that
is closed and the next one that is served. The shim writes every fault it
injects to a file: each test first waits for its fault to have happened, so
none can pass without the path being driven.
"""
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import HERE
from httpraw import Closed, Conn, non_readers, wait_for

# The tests choose --threads themselves.
APP_MODES = ("inline",)

GET = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture(scope="session")
def faultlib(tmp_path_factory):
    """The shim, built once a session."""
    out = tmp_path_factory.mktemp("faults") / "libfwfault.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), os.path.join(HERE, "c", "faults.c"), "-ldl"],
                   check=True)
    return str(out)


class Faults:
    """What a test needs to inject faults: the env for the server, the gate
    (faults count only while it is open) and the shim's record of them."""

    def __init__(self, lib, tmp_path, spec, gated=False, after_fork=True):
        self.gate = tmp_path / "gate"
        self.record = tmp_path / "faults.log"
        self.env = {"LD_PRELOAD": lib, "FW_FAULT": spec, "FW_FAULT_LOG": str(self.record)}
        if after_fork:
            self.env["FW_FAULT_AFTER_FORK"] = "1"
        if gated:
            self.env["FW_FAULT_GATE"] = str(self.gate)

    def open(self):
        self.gate.touch()

    def close(self):
        self.gate.unlink()

    def injected(self):
        """[(pid, call, n, errno)] of the faults injected so far."""
        try:
            text = self.record.read_text()
        except FileNotFoundError:
            return []
        return [(int(p), c, int(n), int(e)) for p, c, n, e in (line.split() for line in text.splitlines())]

    def wait(self, call, count=1, timeout=10.0):
        assert wait_for(lambda: sum(1 for f in self.injected() if f[1] == call) >= count, timeout), \
            f"no {call} fault injected: {self.injected()}"


@pytest.fixture
def faults(faultlib, tmp_path):
    def make(spec, **kw):
        return Faults(faultlib, tmp_path, spec, **kw)
    return make


def get_ok(s):
    """One GET on a new connection: the server answers it."""
    r = s.get()
    assert r.status == 200, r
    return r


def wait_log(s, pattern, timeout=10.0):
    assert wait_for(lambda: re.search(pattern, s.log()), timeout), s.log()


def closed_without_answer(c):
    """The server closed c without a response."""
    with pytest.raises((Closed, ConnectionResetError)):
        c.read_response()


def boot_fails(make_server, f, *args):
    """Start a server whose worker cannot boot: the master stops, exit 3."""
    s = make_server("apps:echo", "--workers", "1", *args, env=f.env, wait=False)
    s.proc.wait(20)
    return s


# ---- a worker that cannot boot -------------------------------------------------

BOOT_FAULTS = [
    # (FW_FAULT, --threads, the worker's error line)
    ("epoll_create1:1", "1", r"worker 1: cannot start the server: Too many open files"),
    ("eventfd:1", "1", r"worker 1: cannot start the server: Too many open files"),
    ("calloc:1+", "1", r"worker 1: cannot start the server: out of memory"),
    # fw_server_new: the server, the loop's events, the listeners; the
    # listener's address and TCP_NODELAY; the stop eventfd's and the
    # balancer's watches (ENOSPC: epoll's max_user_watches); its mutex.
    ("calloc:4", "1", r"worker 1: cannot start the server: Cannot allocate memory"),
    ("calloc:5", "1", r"worker 1: cannot start the server: Cannot allocate memory"),
    ("calloc:6", "1", r"worker 1: cannot start the server: Cannot allocate memory"),
    ("getsockname:1=EBADF", "1", r"worker 1: cannot start the server: Bad file descriptor"),
    ("setsockopt:1=EINVAL", "1", r"worker 1: cannot start the server: Invalid argument"),
    ("epoll_ctl:1=ENOSPC", "1", r"worker 1: cannot start the server: No space left on device"),
    ("epoll_ctl:2=ENOSPC", "1", r"worker 1: cannot start the server: No space left on device"),
    ("pthread_mutex_init:1=EAGAIN", "1", r"worker 1: cannot start the server: Resource temporarily unavailable"),
    # The app threads' pool (fw_pool_start): each of its resources.
    ("pthread_create:1", "3", r"pool: cannot start a thread: Resource temporarily unavailable"),
    ("pthread_create:2", "3", r"pool: cannot start a thread: Resource temporarily unavailable"),
    ("pthread_cond_init:1", "3", r"worker 1: cannot start the app threads: Cannot allocate memory"),
    ("pthread_cond_init:2", "3", r"worker 1: cannot start the app threads: Cannot allocate memory"),
    ("pthread_mutex_init:2", "3", r"worker 1: cannot start the app threads: Cannot allocate memory"),
    ("eventfd:2", "3", r"worker 1: cannot start the app threads: Too many open files"),
    ("epoll_ctl:4=ENOSPC", "3", r"worker 1: cannot start the app threads: No space left on device"),
    ("calloc:7", "3", r"worker 1: cannot start the app threads: Cannot allocate memory"),
    ("calloc:8", "3", r"worker 1: cannot start the app threads: Cannot allocate memory"),
    ("calloc:9", "3", r"worker 1: cannot start the app threads: Cannot allocate memory"),
    ("malloc:1", "3", r"pool: cannot start a thread: Cannot allocate memory"),
]


@pytest.mark.parametrize("spec,threads,line", BOOT_FAULTS, ids=[b[0] + "-t" + b[1] for b in BOOT_FAULTS])
def test_worker_that_cannot_make_its_server_fails_to_boot_once(make_server, faults, spec, threads, line):
    """Out of memory or descriptors while a worker makes its server, its
    event loop or its app threads: one error line says why (no traceback),
    the master says the worker failed to boot and stops with exit 3 instead
    of respawning it without end."""
    f = faults(spec)
    s = boot_fails(make_server, f, "--threads", threads)
    log = s.log()
    assert s.proc.returncode == 3, log
    assert re.search(line, log), log
    assert "worker 1 failed to boot: stopping" in log
    assert "Traceback" not in log
    assert log.count("Booted worker") == 1          # not respawned
    pids = {p for p, *_ in f.injected()}
    assert pids and s.pid not in pids               # the fault was the worker's


# ---- one connection out of memory ----------------------------------------------

@pytest.mark.parametrize("threads", ["1", "3"])
def test_connection_without_memory_is_closed_and_the_next_is_served(make_server, faults, threads):
    """calloc for a new connection fails: that connection is closed (the
    client sees it end with no answer), the log says so once, and the next
    connection is served normally."""
    f = faults("calloc:1", gated=True)
    s = make_server("apps:echo", "--workers", "1", "--threads", threads, env=f.env)
    get_ok(s)
    f.open()
    with s.conn() as c:
        c.send(GET)
        closed_without_answer(c)
    f.wait("calloc")
    f.close()
    wait_log(s, r"\[ERROR\] out of memory for a connection")
    get_ok(s)
    assert s.log().count("out of memory for a connection") == 1


def test_a_replacement_that_cannot_boot_after_the_server_served_is_retried(make_server, faults):
    """A worker that replaces one retired by --max-requests cannot make its
    server (the first eventfd of each new worker fails while the gate is
    open: descriptors or memory short for a while). The server has served:
    the replacement is retried after the back-off and serves once the
    shortage is over. Before, any boot failure stopped the whole server
    (exit 3), whenever it came."""
    f = faults("eventfd:1", gated=True)
    s = make_server("apps:echo", "--workers", "1", "--max-requests", "3", env=f.env)
    get_ok(s)
    f.open()
    get_ok(s)
    get_ok(s)                               # the third: the worker retires
    f.wait("eventfd")
    wait_log(s, r"\[ERROR\] worker 1: cannot start the server: ")
    f.close()
    get_ok(s)                               # a later replacement boots and serves
    assert s.alive(), s.log()
    assert "failed to boot: stopping" not in s.log()
    assert re.search(r"Worker 1 \(pid \d+\) died \(exit code 3\)", s.log()), s.log()


# ---- accept fails --------------------------------------------------------------

@pytest.mark.parametrize("err,text", [("EMFILE", "Too many open files"), ("ENFILE", "Too many open files in system"),
                                      ("ENOBUFS", "No buffer space available"),
                                      ("ENOMEM", "Cannot allocate memory")])
def test_accept_out_of_resources_pauses_then_accepts(make_server, faults, err, text):
    """accept() out of descriptors or memory: the worker says so, pauses
    accepting for a second instead of spinning, and then serves the
    connection that waited."""
    f = faults(f"accept4:1={err}", gated=True)
    s = make_server("apps:echo", "--workers", "1", env=f.env)
    get_ok(s)
    f.open()
    with s.conn() as c:
        c.send(GET)
        f.wait("accept4")
        f.close()
        t0 = time.monotonic()
        r = c.read_response()
        assert r.status == 200
    assert time.monotonic() - t0 >= 0.5           # it paused (1 s from the failed accept)
    wait_log(s, rf"\[ERROR\] accept: {text} with \d+ connection\(s\) open; pausing for 1 s \(1 pause\(s\) so far\)")
    get_ok(s)


@pytest.mark.parametrize("err,line", [("EPERM", r"\[ERROR\] accept: Operation not permitted"),
                                      ("ECONNABORTED", None)])
def test_accept_other_errors_do_not_stop_accepting(make_server, faults, err, line):
    """An accept error the server has no rule for is logged; ECONNABORTED
    (a client gone before accept) is not. Either way the connection that
    waits is taken at once or at the next pass (the listener stays
    readable) and answered."""
    f = faults(f"accept4:1={err}", gated=True)
    s = make_server("apps:echo", "--workers", "1", env=f.env)
    f.open()
    with s.conn() as c:
        c.send(GET)
        f.wait("accept4")
        f.close()
        assert c.read_response().status == 200
    if line:
        wait_log(s, line)
    else:
        assert "accept:" not in s.log()


# ---- epoll_ctl fails for one connection -----------------------------------------

@pytest.mark.parametrize("threads", ["1", "3"])
def test_connection_that_cannot_be_watched_is_closed_others_unaffected(make_server, faults, threads):
    """A silent new connection must be watched for its request; epoll_ctl
    (ADD) fails: it is closed and logged, another connection open meanwhile
    is served on."""
    f = faults("epoll_ctl_add:1", gated=True)
    s = make_server("apps:echo", "--workers", "1", "--threads", threads, env=f.env)
    with s.conn() as other:
        # other is silent: accepted and watched before the probe that
        # follows it in the accept queue is answered (and closed: no
        # watch is armed for it after the gate opens).
        probe = s.request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert probe.status == 200
        f.open()
        with s.conn() as c:
            f.wait("epoll_ctl_add")
            f.close()
            with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
                c.send(GET)
                c.read_response()
        wait_log(s, r"\[ERROR\] epoll_ctl\(\d+\): Cannot allocate memory")
        other.send(GET)
        assert other.read_response().status == 200
    get_ok(s)


def test_kept_alive_connection_that_cannot_be_rearmed_is_closed_after_its_response(make_server, faults):
    """With app threads, a kept-alive connection's oneshot watch is armed
    again after each response; that epoll_ctl (MOD) fails: the response has
    gone out whole, then the connection is closed with the error logged,
    and the next connection is served."""
    f = faults("epoll_ctl_mod:1", gated=True)
    s = make_server("apps:echo", "--workers", "1", "--threads", "3", env=f.env)
    f.open()
    answered = 0
    with s.conn() as c:
        # Armed (ADD) after the first response, again (MOD) after a later
        # one (which one depends on whether the next request came before
        # the loop re-armed): the connection ends within a few requests,
        # each answered whole or not at all.
        with pytest.raises((Closed, ConnectionResetError, BrokenPipeError)):
            for _ in range(5):
                c.send(GET)
                assert c.read_response().status == 200
                answered += 1
    assert 1 <= answered < 5
    f.wait("epoll_ctl_mod")
    f.close()
    wait_log(s, r"\[ERROR\] epoll_ctl\(\d+\): Cannot allocate memory")
    get_ok(s)


# ---- app threads ----------------------------------------------------------------

def test_spare_thread_that_cannot_start_is_logged_and_requests_answered(make_server, faults):
    """An app thread waits for a slow client (it parks): a spare should take
    its place. pthread_create fails (EAGAIN, the thread limit): the log says
    so, and requests are still answered by the threads there are."""
    f = faults("pthread_create:1", gated=True)
    s = make_server("apps:writes", "--workers", "1", "--threads", "2", env=f.env)
    get_ok_big = s.request(b"GET /?mb=0 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert get_ok_big.status == 200
    f.open()
    slow = non_readers(s.port, "/?mb=8", 1)
    try:
        f.wait("pthread_create")
        f.close()
        wait_log(s, r"\[ERROR\] pool: cannot start a spare thread: Resource temporarily unavailable")
        r = s.request(b"GET /?mb=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert r.status == 200
    finally:
        for sk in slow:
            sk.close()


def test_spare_threads_that_cannot_start_are_said_once_not_at_every_park(make_server, faults):
    """At the thread limit every park fails to start its spare the same
    way: each one logged an ERROR line (a log filled by slow clients). Said
    once, then at most every 10 s with the count of those in between."""
    f = faults("pthread_create:1+", gated=True)
    s = make_server("apps:writes", "--workers", "1", "--threads", "4", env=f.env)
    assert s.request(b"GET /?mb=0 HTTP/1.1\r\nHost: t\r\n\r\n").status == 200
    f.open()
    slow = []
    try:
        for n in range(1, 4):         # one at a time: each parks a thread, each spare fails
            slow += non_readers(s.port, "/?mb=8", 1)
            f.wait("pthread_create", count=n)
        f.close()
        wait_log(s, r"\[ERROR\] pool: cannot start a spare thread: Resource temporarily unavailable")
        r = s.request(b"GET /?mb=0 HTTP/1.1\r\nHost: t\r\n\r\n")       # the 4th thread serves
        assert r.status == 200
        assert s.log().count("cannot start a spare thread") == 1, s.log()
    finally:
        for sk in slow:
            sk.close()


def test_lost_pool_wake_up_does_not_wedge_the_worker(make_server, faults):
    """Every write to the pool's done eventfd fails: the loop is never woken
    for finished requests. Each failure is logged, and the loop takes the
    finished jobs back at its next pass anyway: more requests than there
    are threads are all answered (before the fix, the threads stayed
    counted busy for ever and the 4th request waited for ever)."""
    f = faults("eventfd_write:1+=EIO", gated=True)
    # (--inline-first off: every request goes through the pool's hand-off.)
    s = make_server("apps:echo", "--workers", "1", "--threads", "3", "--inline-first", "off", env=f.env)
    get_ok(s)
    f.open()
    for _ in range(6):
        r = s.request(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", timeout=5)
        assert r.status == 200
    f.wait("eventfd_write")
    f.close()
    wait_log(s, r"\[ERROR\] pool: eventfd write: Input/output error")
    get_ok(s)


def test_failed_pool_eventfd_read_is_logged_and_requests_answered(make_server, faults):
    """Reading the pool's done eventfd fails: logged, the finished jobs are
    taken back all the same. (A request whose connection closes after it
    is announced through the eventfd; a kept-alive one may be left for the
    loop unannounced: fw_pool_quiet.)"""
    f = faults("eventfd_read:1=EIO", gated=True)
    # (--inline-first off: every request goes through the pool's hand-off.)
    s = make_server("apps:echo", "--workers", "1", "--threads", "3", "--inline-first", "off", env=f.env)
    get_ok(s)
    f.open()
    assert s.get(headers=b"Connection: close\r\n").status == 200
    f.wait("eventfd_read")
    f.close()
    wait_log(s, r"\[ERROR\] pool: eventfd read: Input/output error")
    for _ in range(4):
        get_ok(s)


# ---- the event loop fails ------------------------------------------------------

def test_event_loop_failure_ends_the_worker_and_it_is_replaced(make_server, faults):
    """epoll_wait fails (not EINTR): the worker logs it, ends, and the
    master replaces it; requests are answered by the new one."""
    f = faults("epoll_wait:1=EBADF", gated=True)
    s = make_server("apps:echo", "--workers", "1", env=f.env)
    first = s.worker_pids()
    f.open()
    f.wait("epoll_wait")
    f.close()
    wait_log(s, r"\[ERROR\] epoll_wait: Bad file descriptor")
    assert wait_for(lambda: s.worker_pids() and s.worker_pids() != first)
    wait_log(s, r"Booted worker 1 \(pid")
    get_ok(s)
    assert s.alive()


def test_worker_whose_loop_cannot_watch_its_signals_is_replaced(make_server, faults):
    """serve() cannot watch the worker's signal pipe (the 3rd epoll_ctl of
    an inline worker: after the stop eventfd and the listener): the worker
    says it failed and exits; it had booted, so the master replaces it, and
    the new one serves."""
    f = faults("epoll_ctl:3=ENOSPC", gated=True)
    f.open()
    s = make_server("apps:echo", "--workers", "1", env=f.env)
    f.wait("epoll_ctl")
    f.close()
    wait_log(s, r"\[ERROR\] worker 1 failed")
    assert "OSError: [Errno 28] No space left on device" in s.log()
    # (a worker booted before the gate closed fails the same way)
    assert wait_for(lambda: s.log().count("Booted worker 1") >= 2), s.log()
    assert wait_for(lambda: s.get().status == 200), s.log()
    assert s.alive()


# ---- stopping ------------------------------------------------------------------

@pytest.mark.parametrize("spec,line", [
    ("socket:1", r"\[WARNING\] releasing the listeners: socket: Too many open files"),
    ("dup3:1", r"\[WARNING\] releasing listener \d+: Too many open files"),
])
def test_stop_that_cannot_release_the_listeners_still_stops(make_server, faults, spec, line):
    """At a stop, a worker lets go of the listening sockets; a failure to
    do so is a warning, and the server stops as asked (exit 0)."""
    f = faults(spec, gated=True)
    s = make_server("apps:echo", "--workers", "1", env=f.env)
    get_ok(s)
    f.open()
    s.signal(signal.SIGTERM)
    s.proc.wait(20)
    assert s.proc.returncode == 0, s.log()
    assert re.search(line, s.log()), s.log()


def test_stop_with_failing_epoll_ctl_still_stops(make_server, faults):
    """Every epoll_ctl fails during a stop (the listeners' and the app
    threads' own watch): each is logged, the server still stops (exit 0)."""
    f = faults("epoll_ctl:1+", gated=True)
    s = make_server("apps:echo", "--workers", "1", "--threads", "3", env=f.env)
    get_ok(s)
    f.open()
    s.signal(signal.SIGTERM)
    s.proc.wait(20)
    log = s.log()
    assert s.proc.returncode == 0, log
    assert re.search(r"\[ERROR\] epoll_ctl\(listener \d+\): Cannot allocate memory", log), log
    assert re.search(r"\[ERROR\] pool: epoll_ctl: Cannot allocate memory", log), log


# ---- offload -------------------------------------------------------------------

def offload_server(make_server, tmp_path, f, *args, wait=True):
    """apps:offloader, one worker, records to a JSON-lines file."""
    out = tmp_path / "out.jsonl"
    return make_server("apps:offloader", "--workers", "1", "--threads", "1", "--offload-sink", f"jsonl:{out}",
                       "--offload-dir", str(tmp_path / "journal"), "--offload-linger", "0.02", *args,
                       env=f.env, wait=wait), out


def test_master_that_cannot_make_the_offload_ring_says_why(make_server, faults, tmp_path):
    """The master cannot allocate the ring file's blocks (a full disk): one
    line says so and what to do, exit 2, no worker started."""
    f = faults("posix_fallocate:1=ENOSPC", after_fork=False)
    s, _ = offload_server(make_server, tmp_path, f, wait=False)
    s.proc.wait(20)
    log = s.log()
    assert s.proc.returncode == 2, log
    assert re.search(r"forkwsgi: error: --offload-dir \S+: cannot make the offload ring of \d+ bytes "
                     r"\(No space left on device\): free some space", log), log
    assert "Traceback" not in log and "Booted worker" not in log
    f.wait("posix_fallocate")


def test_worker_that_cannot_map_the_offload_ring_fails_to_boot_once(make_server, faults, tmp_path):
    """A worker cannot map the ring (out of memory or address space): one
    line says so, the master says it failed to boot and stops (exit 3)."""
    f = faults("mmap:1")
    s, _ = offload_server(make_server, tmp_path, f, wait=False)
    s.proc.wait(20)
    log = s.log()
    assert s.proc.returncode == 3, log
    assert "worker 1: cannot open the offload ring: Cannot allocate memory" in log
    assert "worker 1 failed to boot: stopping" in log
    assert not re.search(r"\[\d+\] \[ERROR\] worker 1 failed\n", log)       # no traceback from the worker
    assert log.count("Booted worker") == 1


def test_sibling_that_cannot_map_the_ring_is_replaced_and_nothing_is_lost(make_server, faults, tmp_path):
    """The offload sibling cannot map the ring when it (re)starts: it says
    so and exits, the master starts another after a back-off; the records
    offloaded meanwhile wait in the ring and reach the sink once one can
    read it."""
    from test_offload import sibling_pid
    f = faults("mmap:1", gated=True)
    s, out = offload_server(make_server, tmp_path, f)
    # The worker and the sibling have mapped the ring: a record went through.
    assert s.get("/emit?n=1&id=a").status == 200
    assert wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 1, 20), s.log()
    first = sibling_pid(s)
    f.open()
    os.kill(first, signal.SIGKILL)
    f.wait("mmap")
    f.close()
    wait_log(s, r"\[ERROR\] the offload sibling failed")
    assert "OSError: [Errno 12] Cannot allocate memory" in s.log()
    r = s.get("/emit?n=5&id=x")
    assert r.status == 200
    # Every record arrives; one may come twice (delivered, but the sibling
    # was SIGKILLed before it noted so: at least once).
    assert wait_for(lambda: len(delivered(out)) == 6, 20), s.log()
    assert sibling_pid(s) not in (None, first)


def delivered(out):
    """The distinct record values in the sink's file."""
    try:
        return {json.loads(x)["value"] for x in out.read_text().splitlines() if x.endswith("}")}
    except FileNotFoundError:
        return set()


def emit_through_the_fault(make_server, tmp_path, f, call):
    """An offload server whose first record is delivered before the gated
    fault f opens; then 100 records more, and the fault in `call` waited
    for. The server and the sink's output file."""
    s, out = offload_server(make_server, tmp_path, f)
    assert s.get("/emit?n=1&id=a").status == 200
    assert wait_for(lambda: len(delivered(out)) == 1, 20), s.log()
    f.open()
    for i in range(5):
        assert s.get(f"/emit?n=20&id=b{i}").status == 200
    f.wait(call)
    return s, out


@pytest.mark.parametrize("spec,line", [
    # Appending to the journal (a full disk).
    ("writev:1+=ENOSPC", r"\[ERROR\] offload: cannot write the journal in \S+ \(No space left on device\): "
                         r"\d+ failed write\(s\); records go to the sink straight from the queue"),
    # Punching out a segment's delivered bytes.
    ("fallocate:1+=EIO", r"\[ERROR\] offload: cannot write the journal state in \S+ \(Input/output error\)"),
], ids=["append", "punch"])
def test_journal_that_cannot_be_written_sends_records_straight_to_the_sink(make_server, faults, tmp_path, spec,
                                                                         line):
    """The sibling cannot write the journal: it says so once, and records
    go to the sink straight from the ring; none is lost."""
    f = faults(spec, gated=True)
    s, out = emit_through_the_fault(make_server, tmp_path, f, spec.split(":")[0])
    wait_log(s, line)
    assert wait_for(lambda: len(delivered(out)) == 101, 20), s.log()
    f.close()


def test_journal_on_a_file_system_without_holes_is_no_error(make_server, faults, tmp_path):
    """A file system that cannot punch holes (fallocate EOPNOTSUPP, as on
    some network and older file systems) is not a write error: delivered
    segments are then dropped whole; no error is logged and every record
    arrives."""
    f = faults("fallocate:1+=95", gated=True)        # 95: EOPNOTSUPP
    s, out = emit_through_the_fault(make_server, tmp_path, f, "fallocate")
    assert wait_for(lambda: len(delivered(out)) == 101, 20), s.log()
    assert "[ERROR]" not in s.log() and "Traceback" not in s.log(), s.log()[-3000:]
    f.close()


def test_sibling_that_cannot_start_its_ring_watch_is_replaced(make_server, faults, tmp_path):
    """The sibling's ring watch thread cannot start (pthread_create EAGAIN):
    it fails and is replaced after a back-off; once a sibling starts, every
    record offloaded meanwhile is delivered."""
    from test_offload import sibling_pid
    f = faults("pthread_create:1", gated=True)
    s, out = offload_server(make_server, tmp_path, f)
    assert s.get("/emit?n=1&id=a").status == 200
    assert wait_for(lambda: len(delivered(out)) == 1, 20), s.log()
    first = sibling_pid(s)
    f.open()
    os.kill(first, signal.SIGKILL)
    f.wait("pthread_create")
    assert s.get("/emit?n=5&id=x").status == 200
    wait_log(s, r"\[ERROR\] the offload sibling failed")
    assert "BlockingIOError: [Errno 11] Resource temporarily unavailable" in s.log()
    f.close()
    assert wait_for(lambda: len(delivered(out)) == 6, 20), s.log()
