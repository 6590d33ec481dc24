"""The extension's offload functions (src/offload.c) as forkwsgi's own
Python calls them (offload/producer.py, queue.py, sibling.py, journal.py),
each case in a process of its own playing the worker or the sibling over
a real ring file: what a wrong call or a failure raises, and that a failed
call loses no record. The servers' tests (test_offload*.py) cover the paths
a request takes; these cover the contract of each function around them."""
import subprocess
import sys
import textwrap

import pytest

# Shared by every script: a ring of 64 KiB in argv[1], the journal beside it.
PRELUDE = """\
import errno, os, sys, threading, time
from forkwsgi import _forkwsgi as fw
from forkwsgi.offload.records import Record
D = sys.argv[1]
def open_ring(want=1 << 16):
    fd = os.open(os.path.join(D, "ring.fwr"), os.O_RDWR | os.O_CREAT, 0o600)
    fw.ring_prepare(fd, want)
    return fd
def raises(exc, text, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        assert text in str(e), (fn.__name__, str(e))
        return e
    raise AssertionError(f"{fn.__name__}{args} did not raise {exc.__name__}")
"""


def run(tmp_path, body, timeout=30):
    """Runs PRELUDE + body in a new interpreter; its stdout's last line."""
    code = PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_reader_calls_outside_the_sibling_say_there_is_no_reader(tmp_path):
    """Every reading call in a process that opened no reader (a worker, an
    app that found them) raises RuntimeError, and the ring is untouched."""
    out = run(tmp_path, """
        ring = open_ring()
        fw.offload_setup(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D)
        assert fw.offload("t", b"kept") is True
        calls = [(fw.ring_take, (-1, 10, 1 << 20, None, Record, None, 0)), (fw.ring_release, (0,)),
                 (fw.ring_wait, (0,)), (fw.ring_reader_stats, ()), (fw.ring_used, ()),
                 (fw.ring_has_data, ()), (fw.ring_watch, (1, 10, 0))]
        for fn, args in calls:
            raises(RuntimeError, "no ring reader in this process", fn, *args)
        used, cap = fw.ring_usage(ring)
        assert used > 0 and cap == 1 << 16, (used, cap)
        fw.ring_open_reader(ring)             # the record is still there for a reader
        entries, taken, state, _ = fw.ring_take(-1, 10, 1 << 20, None, Record, None, 0)
        assert [e[0].value for e in entries] == [b"kept"] and state == "empty", entries
        print("ok")
    """)
    assert out == "ok"


@pytest.mark.parametrize("name,args", [
    ("offload_setup", "('x', 1, 0, 4096, None)"), ("ring_prepare", "('fd', 1)"), ("ring_capacity", "('big',)"),
    ("ring_usage", "(None,)"), ("ring_open_reader", "(1.5,)"), ("ring_take", "(-1, 'ten', 1, None, None, None, 0)"),
    ("ring_release", "('x',)"), ("ring_wait", "('soon',)"), ("ring_watch", "(1, 2)"),
    ("offload_forget", "(0,)"), ("ring_watch_arm", "()"),
])
def test_wrong_argument_types_raise_typeerror(tmp_path, name, args):
    """A call with arguments of the wrong type or count raises TypeError
    naming the function (or OverflowError for a negative unsigned)."""
    out = run(tmp_path, f"""
        try:
            fw.{name}(*{args})
        except (TypeError, OverflowError) as e:
            print(type(e).__name__, e)
    """)
    assert out.startswith(("TypeError", "OverflowError")), out
    assert name in out or "integer" in out or "argument" in out, out


def test_offload_setup_rejects_settings_the_producer_cannot_work_with(tmp_path):
    """Wrong overflow policy, a max_record below a header, a counters
    buffer that is read-only, short or misaligned, a ring fd that is not a
    ring: each raises, and offload() then still says it has no producer."""
    out = run(tmp_path, """
        ring = open_ring()
        ok = dict(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D)
        raises(ValueError, "bad offload settings", fw.offload_setup, **dict(ok, overflow=3))
        raises(ValueError, "bad offload settings", fw.offload_setup, **dict(ok, overflow=-1))
        raises(ValueError, "bad offload settings", fw.offload_setup, **dict(ok, max_record=8))
        raises(BufferError, "not writable", fw.offload_setup, **dict(ok, counters=bytes(64)))
        raises(ValueError, "8-aligned buffer of 64 bytes", fw.offload_setup, **dict(ok, counters=bytearray(8)))
        raises(ValueError, "8-aligned buffer of 64 bytes", fw.offload_setup,
               **dict(ok, counters=memoryview(bytearray(80))[1:65]))
        plain = os.open(os.path.join(D, "plain"), os.O_RDWR | os.O_CREAT, 0o600)
        for counters in (None, bytearray(64)):
            raises(OSError, "", fw.offload_setup, **dict(ok, ring_fd=plain, counters=counters))
        raises(RuntimeError, "needs the offload sibling", fw.offload, "t", b"v")
        fw.offload_setup(**ok)                   # and a good set-up after all that works
        assert fw.offload("t", b"v") is True
        print("ok")
    """)
    assert out == "ok"


def test_a_full_ring_drops_without_a_callback_and_a_raising_callback_propagates(tmp_path):
    """--offload-overflow drop: with no on_drop the record is dropped
    (False); an on_drop that raises makes offload() raise its exception;
    after teardown without a callback offload() raises RuntimeError."""
    out = run(tmp_path, """
        ring = open_ring()
        fw.offload_setup(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D)
        results = [fw.offload("t", b"x" * 1000) for _ in range(100)]
        assert results[0] is True and results[-1] is False, results
        def on_drop(topic, err):
            raise KeyError(topic, err)
        fw.offload_setup(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D, on_drop=on_drop)
        e = raises(KeyError, "", fw.offload, "full", b"x")
        assert e.args == ("full", errno.EAGAIN), e.args
        fw.offload_teardown()
        fw.offload_teardown()                    # twice: nothing to forget
        raises(RuntimeError, "needs the offload sibling", fw.offload, "t", b"v")
        print("ok")
    """)
    assert out == "ok"


def test_teardown_waits_for_a_call_blocked_on_a_full_ring(tmp_path):
    """--offload-overflow block: a thread waiting (without the GIL) for
    room when the worker forgets its producer is waited for; it returns
    False once its wait is over (dropped), never touching a freed producer;
    later calls raise."""
    out = run(tmp_path, """
        ring = open_ring()
        counters = bytearray(64)
        drops = []
        fw.offload_setup(ring_fd=ring, overflow=0, block_ms=600, max_record=4096, spill_dir=D,
                         counters=counters, on_drop=lambda t, e: drops.append((t, e)))
        n = 0
        while fw.ring_usage(ring)[0] + 1100 < 1 << 16 and n < 1000:
            assert fw.offload("fill", b"x" * 1000) is True
            n += 1
        got = []
        t = threading.Thread(target=lambda: got.append(fw.offload("late", b"y" * 1000)))
        t.start()
        # The thread waits for room, without the GIL: in the ring's wait
        # (nanosleep between looks; it makes no other sleeping call).
        wchan = "/proc/self/task/%d/wchan" % t.native_id
        end = time.monotonic() + 20
        while "nanosleep" not in open(wchan).read() and time.monotonic() < end:
            time.sleep(0.001)
        t0 = time.monotonic()
        fw.offload_teardown()
        waited = time.monotonic() - t0
        t.join(10)
        assert got == [False] and waited > 0.2, (got, waited)
        # Its drop is logged if it took the GIL back before the teardown
        # went on (else the callback had gone with the producer).
        assert drops in ([], [("late", errno.EAGAIN)]), drops
        raises(RuntimeError, "needs the offload sibling", fw.offload, "t", b"v")
        print("ok")
    """)
    assert out == "ok"


def test_ring_prepare_and_usage_refuse_files_that_are_not_rings(tmp_path):
    """A file of other bytes is not taken for a ring (ValueError: the
    server sets it aside); a file too short for the header cannot be read
    for its usage (OSError ENODATA)."""
    out = run(tmp_path, """
        bad = os.open(os.path.join(D, "bad.fwr"), os.O_RDWR | os.O_CREAT, 0o600)
        os.write(bad, b"not a ring" * 1000)
        raises(ValueError, "not an offload ring file", fw.ring_prepare, bad, 1 << 16)
        short = os.open(os.path.join(D, "short.fwr"), os.O_RDWR | os.O_CREAT, 0o600)
        os.write(short, b"x" * 10)
        e = raises(OSError, "", fw.ring_usage, short)
        assert e.errno == errno.ENODATA, e           # not errno 0 ("[Errno 0] Error")
        print("ok")
    """)
    assert out == "ok"


def test_ring_take_checks_its_record_type_and_bounds_its_batch(tmp_path):
    """ring_take refuses a record type that is not a namedtuple; a limit
    below 1 takes one record, above 4096 takes 4096; ring_release past what
    was read raises; nothing is lost across them."""
    out = run(tmp_path, """
        import collections
        ring = open_ring(1 << 20)
        fw.ring_open_reader(ring)
        fw.ring_open_reader(ring)                # again: the reader is made anew at the same place
        fw.offload_setup(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D)
        for i in range(5000):
            assert fw.offload("t", b"%d" % i) is True
        class Wide(tuple):               # a tuple with a __dict__: not built as a namedtuple
            pass
        for rtype in (dict, int, Wide, collections.namedtuple("R", "a")(1)):
            raises(TypeError, "record must be a namedtuple type", fw.ring_take, -1, 10, 1 << 30, None, rtype, None, 0)
        seen = []
        entries, taken, state, end = fw.ring_take(-1, 0, 1 << 30, None, Record, None, 0)
        assert taken == 1 and state == "more", (taken, state)
        seen += entries
        raises(ValueError, "past what was read", fw.ring_release, end + 1)
        entries, taken, state, end = fw.ring_take(-1, 10**6, 1 << 30, None, Record, None, 0)
        assert taken == 4096 and state == "more", (taken, state)
        seen += entries
        entries, taken, state, end = fw.ring_take(-1, 10**6, 1 << 30, None, Record, None, 0)
        assert state == "empty", state
        seen += entries
        assert [e[0].value for e in seen] == [b"%d" % i for i in range(5000)]
        fw.ring_release(end)
        assert fw.ring_used() == 0 and not fw.ring_has_data()
        print("ok")
    """)
    assert out == "ok"


def test_ring_take_skips_records_journaled_by_a_dead_predecessor(tmp_path):
    """A record whose (pid, seq, ts_ns) is in dups (journaled by a sibling
    that died before it freed the ring) is taken but not journaled again;
    the others are."""
    out = run(tmp_path, """
        from forkwsgi.offload.records import key, length
        ring = open_ring()
        fw.ring_open_reader(ring)
        fw.offload_setup(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D)
        for i in range(4):
            fw.offload("t", b"v%d" % i)
        # The keys of the first two, read from the ring file (cserver/fw_ring.h:
        # the data area after a 4 KiB meta page, 8-byte slot words, records
        # padded to 8 bytes): what the dead sibling had journaled.
        data, off, dups = os.pread(ring, 1 << 16, 4096), 0, set()
        for _ in range(2):
            dups.add(key(data, off + 8))
            off += 8 + (length(data, off + 8) + 7) // 8 * 8
        journal = os.open(os.path.join(D, "journal"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        entries, taken, state, _ = fw.ring_take(journal, 10, 1 << 30, dups, Record, 3, 0)
        assert taken == 4 and [e[0].value for e in entries] == [b"v2", b"v3"], (taken, entries)
        assert os.fstat(journal).st_size == entries[-1][2] and fw.ring_used() == 0
        print("ok")
    """)
    assert out == "ok"


def test_ring_take_out_of_memory_loses_nothing(tmp_path):
    """ring_take that runs out of memory at any of its allocations (its
    batch, the list, a record's fields, an entry) raises MemoryError, frees
    nothing and journals nothing: the next call takes every record."""
    pytest.importorskip("_testcapi")
    out = run(tmp_path, """
        import _testcapi
        sys.settrace(None)        # under make coverage: its tracer must not take the failing allocation
        ring = open_ring()
        fw.ring_open_reader(ring)
        fw.offload_setup(ring_fd=ring, overflow=1, block_ms=0, max_record=4096, spill_dir=D)
        for i in range(3):
            fw.offload("t%d" % i, b"v%d" % i, key=b"k" if i else None)
        journal = os.open(os.path.join(D, "journal"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        dups = {(1, 2, 3)}
        failed = 0
        for n in range(60):
            _testcapi.set_nomemory(n, n + 1)
            try:
                entries, taken, state, end = fw.ring_take(journal, 10, 1 << 30, dups, Record, 3, 0)
            except MemoryError:
                _testcapi.remove_mem_hooks()
                failed += 1
                assert os.fstat(journal).st_size == 0 and fw.ring_used() > 0
                continue
            _testcapi.remove_mem_hooks()
            break
        assert failed >= 5 and [e[0].value for e in entries] == [b"v0", b"v1", b"v2"], (failed, entries)
        assert os.fstat(journal).st_size == entries[-1][2] and fw.ring_used() == 0
        print("ok", failed)
    """)
    assert out.startswith("ok"), out


def test_ring_watch_refuses_a_bad_interval_and_a_new_reader_under_it(tmp_path):
    """The watch takes 1..1000 ms; once it watches the reader's ring, the
    reader cannot be made anew under it (RuntimeError)."""
    out = run(tmp_path, """
        ring = open_ring()
        fw.ring_open_reader(ring)
        for ms in (0, 1001):
            raises(ValueError, "interval_ms must be 1..1000", fw.ring_watch, 1, ms, 0)
        tid = fw.ring_watch(1 << 10, 10, 0)
        assert tid > 0
        raises(RuntimeError, "the ring is watched", fw.ring_open_reader, ring)
        assert fw.ring_watch_arm(True) == 0 and fw.ring_watch_fired() == 0
        print("ok")
    """)
    assert out == "ok"
