"""The offload journal and spill files on a small or full disk:
--offload-dir on a 2 MiB tmpfs the test mounts (root only). A full disk
must not stop the server, kill the sibling, lose or duplicate records;
delivered records must not keep taking room."""
import array
import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from httpraw import wait_for
from test_offload import get, lines, sibling_pid

APP_MODES = ("inline",)        # every server here sets its own --threads

TMPFS_BYTES = 2 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted for this test, unmounted after it."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk):
    """Take every free byte of `disk` with one file; returns its path."""
    path = disk / "filler"
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):          # ENOSPC: full
            while True:
                f.write(chunk)
    with open(path, "ab", buffering=0) as f:        # the last partial block
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 512)
    assert shutil.disk_usage(disk).free < 4096
    return path


RING_BYTES = 1 << 20            # the ring file takes this much of the disk from the start


def ctl_dirs(disk, tmp_path):
    """The directories of test_offload's controllable sink, the journal on `disk`."""
    d = {"journal": disk / "journal", "ctl": tmp_path / "ctl", "out": tmp_path / "out.jsonl"}
    d["ctl"].mkdir()
    return d


def start(make_server, disk, out, *args, workers="2", threads="2"):
    return make_server("apps:offloader", "--workers", workers, "--threads", threads,
                       "--offload-sink", f"jsonl:{out}", "--offload-dir", str(disk / "journal"),
                       "--offload-linger", "0.02", "--offload-queue-bytes", str(RING_BYTES), *args)


def emit(s, rounds, n, size, tag):
    """rounds requests of n records each; returns how many were accepted
    (queued or spilled: offload() returned True)."""
    accepted = 0
    for i in range(rounds):
        r = get(s, f"/emit?n={n}&size={size}&id={tag}{i}-")
        assert r.status == 200, r
        accepted += sum(json.loads(r.body)["results"])
    return accepted


def stats(s):
    return json.loads(get(s, "/stats").body)


def settled(s, n):
    """The sibling has delivered `n` records and holds none: the journal
    acknowledged them (in the same step), their room given back."""
    sib = stats(s)["sibling"]
    return sib["delivered"] == n and sib["pending"] == 0


def disk_lines(log):
    return [x for x in log.splitlines() if "offload" in x and ("No space left" in x or "ENOSPC" in x)]


def test_full_disk_keeps_serving_and_delivers_everything_once_space_returns(make_server, small_disk, tmp_path):
    """The journal's disk fills up under load: requests go on being answered,
    the sibling stays (no crash loop), the failure is counted and logged at
    most once a second, the sink gets the records all the same (straight
    from the queue), and once space returns the journal takes them again;
    every accepted record is delivered, each once. Before: the sibling died
    13 times a minute, each replacement sent the same batch again, nothing
    new was delivered (and until issue 24 item 7 records waited in the
    queue for room, none delivered while the disk was full)."""
    out = tmp_path / "out.jsonl"
    s = start(make_server, small_disk, out)
    assert emit(s, 2, 50, 200, "warm") == 100
    assert wait_for(lambda: len(lines(out)) == 100)
    assert wait_for(lambda: settled(s, 100), timeout=20)       # acknowledged too: their room given back
    sib = sibling_pid(s)
    filler = fill(small_disk)
    t0 = time.monotonic()
    accepted = emit(s, 30, 50, 500, "full")        # ~800 KiB: more than the disk, less than the queue
    assert wait_for(lambda: len(lines(out)) == 100 + accepted, timeout=30), (len(lines(out)), accepted, s.log())
    time.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))
    full_for = time.monotonic() - t0
    assert sibling_pid(s) == sib, s.log()
    st = stats(s)
    assert st["sibling"]["disk_errors"] > 0, st
    logged = disk_lines(s.log())
    assert 1 <= len(logged) <= full_for + 2, logged
    assert shutil.disk_usage(small_disk).free < 4096            # none of it went to the journal
    os.unlink(filler)
    assert emit(s, 2, 50, 500, "room") == 100
    assert wait_for(lambda: len(lines(out)) >= 200 + accepted, timeout=30), (len(lines(out)), accepted, s.log())
    time.sleep(0.5)
    values = [x["value"] for x in lines(out)]
    assert len(values) == len(set(values)) == 200 + accepted, "duplicates or losses"
    assert accepted + stats(s)["workers"]["dropped"] == 1500
    assert "writable again" in s.log()
    assert stats(s)["sibling"]["journaled"] >= 200            # the journal took them again
    assert sibling_pid(s) == sib
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    assert len(lines(out)) == 200 + accepted


def test_a_healthy_sink_does_not_fill_a_small_disk(make_server, small_disk, tmp_path):
    """Four times the disk's size goes through the journal: delivered records
    do not keep their room (before: the journal kept up to 64 MiB of
    delivered data, and a 2 MiB disk filled with a healthy sink)."""
    out = tmp_path / "out.jsonl"
    s = start(make_server, small_disk, out, "--offload-batch", "100")
    for i in range(16):                  # 8,000 records of 1 KB (~8.3 MB), 1/4 of the disk at a time
        assert emit(s, 10, 50, 1000, f"h{i}-") == 500, s.log()
        assert wait_for(lambda: len(lines(out)) == 500 * (i + 1), timeout=30), (len(lines(out)), s.log())
    used = TMPFS_BYTES - shutil.disk_usage(small_disk).free - (RING_BYTES + 4096)
    assert used < 256 << 10, used
    assert not disk_lines(s.log()), s.log()
    assert stats(s)["workers"]["dropped"] == 0
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0


@pytest.mark.parametrize("workers", ["1", "0"], ids=["master", "no-master"])
def test_a_stop_on_a_full_disk_delivers_what_is_queued(make_server, small_disk, tmp_path, workers):
    """The disk is full and records wait in the ring (the journal cannot take
    them, a slow sink has taken few yet) when the server is stopped: the
    sibling sends them to the sink straight from the ring (a pod that is
    going away has no next start to deliver them), and frees them once
    delivered."""
    from test_offload import start as start_ctl
    dirs = ctl_dirs(small_disk, tmp_path)
    out = dirs["out"]
    s = start_ctl(make_server, dirs, "--offload-queue-bytes", str(RING_BYTES), "--offload-batch", "100",
                  workers=workers)
    assert emit(s, 1, 10, 100, "w") == 10
    assert wait_for(lambda: len(lines(out)) == 10)
    assert wait_for(lambda: settled(s, 10), timeout=20)        # acknowledged too: their room given back
    filler = fill(small_disk)
    (dirs["ctl"] / "slow").write_text("0.3")         # 10 batches: 3 s
    accepted = emit(s, 20, 50, 300, "q")
    assert accepted == 1000
    time.sleep(0.5)
    assert len(lines(out)) <= 10 + 500, len(lines(out))
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0, s.log()
    values = [x["value"] for x in lines(out)]
    assert len(values) == len(set(values)) == 1010, s.log()
    assert re.search(r"offload: \d+ record\(s\) sent straight from the queue", s.log()), s.log()
    os.unlink(filler)


def test_a_stop_on_a_full_disk_that_runs_out_of_time_leaves_the_rest_in_the_queue(make_server, small_disk,
                                                                                   tmp_path):
    """Records read straight from the queue (the disk is full) go to a slow
    sink, and the stop's graceful timeout ends before all are delivered:
    the ring frees only those delivered, the next start delivers the rest.
    Before: each record read straight carried the ring position after the
    last one read with it, so the first batch delivered freed them all and
    the rest were lost at the stop (650 of 1,000 in one run)."""
    from test_offload import start as start_ctl
    dirs = ctl_dirs(small_disk, tmp_path)
    args = ("--offload-queue-bytes", str(RING_BYTES), "--offload-batch", "50", "--graceful-timeout", "2")
    s = start_ctl(make_server, dirs, *args, workers="1")
    assert emit(s, 1, 10, 100, "w") == 10
    assert wait_for(lambda: len(lines(dirs["out"])) == 10)
    fill(small_disk)
    (dirs["ctl"] / "slow").write_text("0.5")         # 20 batches: 10 s, the stop has 2
    assert emit(s, 20, 50, 300, "q") == 1000
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0, s.log()
    assert len(lines(dirs["out"])) < 1010
    (dirs["ctl"] / "slow").unlink()
    s = start_ctl(make_server, dirs, *args, workers="1")
    assert wait_for(lambda: len({x["value"] for x in lines(dirs["out"])}) == 1010, timeout=30), \
        (len({x["value"] for x in lines(dirs["out"])}), s.log())


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_APPEND_FL = 0x80086601, 0x40086602, 0x20      # linux/fs.h


def append_only(path, on):
    """chattr +a (on) or -a: the file takes appends, but ftruncate fails (EPERM)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | FS_APPEND_FL if on else flags[0] & ~FS_APPEND_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags)
    finally:
        os.close(fd)


def test_a_spill_append_that_cannot_be_taken_back_moves_the_worker_to_a_new_file(make_server, small_disk,
                                                                                     tmp_path):
    """A worker's append to its spill file stops at a full disk, and cutting
    the half record off fails too (the file is append-only here: ftruncate
    EPERM). That record was dropped (offload() returned False); the worker
    spills what comes next to a new file, the sibling delivers the whole
    records of the old one and deletes it. Before, the worker appended
    behind the half record: the sibling delivered the dropped record with
    the next records' first bytes as its rest, then took the rest of the
    file for damage and skipped it (every record spilled after it lost: 40
    in one run), and the drop was logged as EPERM, not as the full disk."""
    from test_offload import delivered_ids, start as start_ctl
    dirs = ctl_dirs(small_disk, tmp_path)
    (dirs["ctl"] / "fail").write_text("")            # the sink is down: records wait in the spill file
    s = start_ctl(make_server, dirs, "--offload-max-pending", "10", "--offload-queue-bytes", "65536",
                  workers="1", threads="1")
    r = json.loads(get(s, "/emit?n=80&size=1000&id=a").body)
    assert r["results"] == [True] * 80 and stats(s)["workers"]["spilled"] > 0
    [spill] = (dirs["journal"] / "spill").glob(f"spill-{r['pid']}*.fwo")
    try:
        append_only(spill, True)
    except OSError as e:
        pytest.skip(f"no append-only files on this tmpfs: {e}")
    size = spill.stat().st_size
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - 8192)    # a page or two: room for part of the next record
    try:
        assert json.loads(get(s, "/emit?n=1&size=20000&id=c").body)["results"] == [False]
        assert size < spill.stat().st_size < size + 20000, "not half a record"
    finally:
        append_only(spill, False)
        os.unlink(filler)
    assert json.loads(get(s, "/emit?n=50&size=1000&id=b").body)["results"] == [True] * 50
    assert len(list(spill.parent.iterdir())) == 2, "the worker still appends behind the half record"
    (dirs["ctl"] / "fail").unlink()
    want = {f"a{i}" for i in range(80)} | {f"b{i}" for i in range(50)}
    assert wait_for(lambda: delivered_ids(dirs) == want, timeout=30), sorted(want ^ delivered_ids(dirs))
    assert wait_for(lambda: list(spill.parent.iterdir()) == [], timeout=10), list(spill.parent.iterdir())
    assert "ends in half a record" in s.log() and "damaged" not in s.log(), s.log()[-2000:]
    assert "the spill file cannot be written (No space left on device)" in s.log()      # why it was dropped


# ---- a sink outage longer than the disk (issue 24, item 7) -----------------

class Load:
    """Clients that offload records of `size` bytes, `n` per request, until
    stopped: every id offload() returned True for (accepted), with when,
    and how many calls returned False."""

    def __init__(self, s, tag, clients=4, n=20, size=100, pause=0.0):
        self.s, self.tag, self.n, self.size, self.pause = s, tag, n, size, pause
        self.accepted = {}               # id -> monotonic time of the answer
        self.refused = 0
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(c,), daemon=True) for c in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, c):
        for r in itertools.count():
            if self.halt.is_set():
                return
            tag = f"{self.tag}{c}{r:07d}"           # delivered_ids() reads "<letters><digits>"
            try:
                r = get(self.s, f"/emit?n={self.n}&size={self.size}&id={tag}", timeout=5)
                results = json.loads(r.body)["results"]
            except (OSError, ValueError, KeyError):
                # The server stops under us: what was not answered was not acknowledged.
                time.sleep(0.05)
                continue
            now = time.monotonic()
            for i, ok in enumerate(results):
                if ok:
                    self.accepted[f"{tag}{i}"] = now
                else:
                    self.refused += 1
            time.sleep(self.pause)

    def stop(self):
        self.halt.set()
        for t in self.threads:
            t.join(30)
        return set(self.accepted)


def journal_bytes(journal):
    """The disk blocks the journal's segments hold."""
    return sum(p.stat().st_blocks * 512 for p in journal.glob("journal-*.fwo"))


def outage(make_server, dirs, *args):
    from test_offload import start as start_ctl
    return start_ctl(make_server, dirs, "--offload-queue-bytes", "256k", *args)


def test_offload_resumes_when_the_sink_returns_from_an_outage_longer_than_the_disk(make_server, small_disk,
                                                                                      tmp_path):
    """The sink is down for longer than the disk can hold (2 MiB tmpfs, 256
    KiB ring): the disk fills up and offload() returns False. Once the sink
    is back, offload() takes records again within seconds, the journal
    gives the room of what was delivered back, and every accepted record is
    delivered. Before: after the disk was full no record was accepted any
    more (the journal's state file, made at its first write, could not be
    allocated on the full disk: acknowledgements could not be saved, so no
    delivered byte was given back), 432 KiB of delivered records stayed in
    the journal and the records in the spill files were never collected."""
    from test_offload import delivered_ids
    dirs = ctl_dirs(small_disk, tmp_path)
    (dirs["ctl"] / "fail").write_text("")
    s = outage(make_server, dirs)
    load = Load(s, "a")
    assert wait_for(lambda: load.refused > 0, timeout=30), s.log()       # the disk is full
    time.sleep(2)
    (dirs["ctl"] / "fail").unlink()
    back = time.monotonic()
    # (Within the sink's longest back-off, 5 s.)
    assert wait_for(lambda: any(t > back + 0.5 for t in list(load.accepted.values())), timeout=8), \
        (load.refused, len(load.accepted), stats(s), s.log()[-3000:])
    first = min(t for t in load.accepted.values() if t > back) - back
    time.sleep(3)
    accepted = load.stop()
    took_again = sum(1 for t in load.accepted.values() if t > back)
    assert wait_for(lambda: delivered_ids(dirs) >= accepted, timeout=30), \
        (len(accepted - delivered_ids(dirs)), stats(s), s.log()[-3000:])
    assert wait_for(lambda: journal_bytes(dirs["journal"]) < 64 << 10, timeout=5), journal_bytes(dirs["journal"])
    assert wait_for(lambda: not list((dirs["journal"] / "spill").iterdir()), timeout=5)
    used = TMPFS_BYTES - shutil.disk_usage(small_disk).free
    assert used < (256 << 10) + (64 << 10) + (64 << 10), used      # the ring, the state, a little more
    print(f"accepted after the sink came back: {took_again}, the first after {first:.2f} s; "
          f"journal: {journal_bytes(dirs['journal'])} bytes")
    assert "Traceback" not in s.log(), s.log()
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0


def test_no_accepted_record_is_lost_across_stops_and_restarts_in_and_after_an_outage_longer_than_the_disk(
        make_server, small_disk, tmp_path):
    """Stops (SIGTERM under load) and restarts on the same directory during
    a sink outage that fills the disk, just after the sink came back, and
    after: every record offload() accepted is delivered, at least once, by
    the last start, and a stop with the sink up delivers everything. Before:
    the disk stayed full (no delivered byte given back), a restart on it
    crash-looped (the journal's state file could not be allocated), so
    the later starts accepted nothing and all 14,130 records of the first
    were lost."""
    from test_offload import delivered_ids
    dirs = ctl_dirs(small_disk, tmp_path)
    fail = dirs["ctl"] / "fail"
    fail.write_text("")
    accepted = {}
    failed = []                                    # logs of the starts that went wrong

    def phase(tag, seconds, until_full=False, sink_back_after=None, graceful="3"):
        s = outage(make_server, dirs, "--graceful-timeout", graceful)
        load = Load(s, tag)
        if until_full:
            assert wait_for(lambda: load.refused > 0, timeout=30), s.log()
        t0 = time.monotonic()
        if sink_back_after is not None:
            time.sleep(sink_back_after)
            size = dirs["out"].stat().st_size if dirs["out"].exists() else 0
            fail.unlink()
            # The stop comes once the sink takes records again (this start's
            # sibling backs off for at most ~1 s: the sink failed only
            # since it began), while it catches up. If it never does, the
            # checks at the end say what was lost.
            wait_for(lambda: dirs["out"].exists() and dirs["out"].stat().st_size > size, timeout=10)
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        s.signal(signal.SIGTERM)                  # under load
        code = s.proc.wait(30)
        accepted[tag] = load.stop()
        if code != 0 or "Traceback" in s.log():
            failed.append(s.log()[-3000:])

    # With the sink down a stop waits the whole --graceful-timeout, then
    # keeps what is left for the next start: 1 s is enough for that.
    phase("a", 1, until_full=True, graceful="1")   # the sink is down, the disk full
    phase("b", 3, graceful="1")                    # a start on the full disk, the sink still down
    phase("c", 3, sink_back_after=1)               # the sink comes back, the stop as it delivers again
    phase("d", 3, graceful="20")                   # after the episode
    want = set().union(*accepted.values())
    # With the sink up, that stop delivered everything (spill files too):
    # a pod that goes away has no next start.
    lost_at_stop = len(want - delivered_ids(dirs))
    s = outage(make_server, dirs)
    assert wait_for(lambda: delivered_ids(dirs) >= want, timeout=30), \
        ({tag: len(ids - delivered_ids(dirs)) for tag, ids in accepted.items()}, failed)
    assert not failed, failed
    assert lost_at_stop == 0, lost_at_stop
    print("accepted per start:", {tag: len(ids) for tag, ids in accepted.items()})
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
