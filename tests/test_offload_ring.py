"""The offload ring (cserver/fw_ring.c): records live in a file under
--offload-dir, not in a process, so they survive every forkwsgi process
being SIGKILLed at once (Kubernetes at the end of the grace period, the
OOM killer of a cgroup, systemd's final SIGKILL); and one directory holds
one server."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from httpraw import group_members, proc_gone, request, stop_and_wait, wait_for
from test_offload import LineTail, dirs, get, lines, sibling_pid, start  # noqa: F401 - dirs is a fixture

APP_MODES = ("inline",)        # every server here sets its own --threads


def keepalive_load(s, tag, seconds, acked, errors, topic=None):
    """Requests of 20 records each (to `topic`, else the app's default) on
    one kept-alive connection for `seconds`; the values of records whose
    request was answered 200 with offload() True go into `acked`. The
    connection dying (the kill) ends it."""
    import socket
    deadline = time.monotonic() + seconds
    try:
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    except OSError as e:
        errors.append(e)
        return
    f = c.makefile("rb")
    i = 0
    try:
        while time.monotonic() < deadline and i < 100000:
            to = f"&topic={topic}" if topic else ""
            c.sendall(f"GET /emit?n=20{to}&id={tag}-{i}- HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            status = f.readline()
            length = 0
            while True:
                line = f.readline()
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = f.read(length)
            if not status.startswith(b"HTTP/1.1 200") or len(body) != length:
                break
            doc = json.loads(body)
            acked.update(f"{doc['pid']}-{tag}-{i}-{j}-" for j, ok in enumerate(doc["results"]) if ok)
            i += 1
    except (OSError, ValueError):
        pass                          # killed mid-request: that one was never answered
    finally:
        c.close()


def load_then_kill_group(s, tag, seconds, acked, topic=None):
    """4 kept-alive clients (keepalive_load) for `seconds`, then SIGKILL to
    the server's whole process group (it runs in a session of its own):
    every process dies at once, mid-request. Returns how many records the
    clients saw acknowledged."""
    before = len(acked)
    errors = []
    clients = [threading.Thread(target=keepalive_load, args=(s, f"{tag}c{k}", seconds + 0.3, acked, errors, topic))
               for k in range(4)]
    for c in clients:
        c.start()
    time.sleep(seconds)
    os.killpg(s.pid, signal.SIGKILL)
    for c in clients:
        c.join(30)
    assert not errors, errors
    wait_group_killed(s)
    return len(acked) - before


def wait_group_killed(s):
    """After SIGKILL to the server's process group: every process is gone."""
    assert s.proc.wait(10) == -signal.SIGKILL
    assert group_gone(s.pid), "processes of the killed server still run"


def group_gone(pgid, timeout=10):
    """No process of the group runs any more (a zombie counts as gone:
    httpraw.proc_gone)."""
    return wait_for(lambda: not group_members(pgid), timeout=timeout)


def test_sigkill_of_every_process_under_load_loses_no_acknowledged_record(make_server, dirs):
    """Three times in a row: load from 4 kept-alive clients on 2 workers x 2
    threads, then SIGKILL to the whole process group, then a start on the
    same directory. Rounds 1 and 3 have the sink down (records pile up in
    the ring, the sibling holding only --offload-max-pending), round 2 a
    healthy sink (records everywhere: ring, journal, batches in flight).
    At the end every record whose request was answered is delivered. With
    the kernel queue of before, each such kill lost the records in its
    socket buffer (68, 126 and 177 in three tries)."""
    acked = set()
    in_ring = []
    for rnd in range(3):
        down = rnd != 1
        if down:
            (dirs["ctl"] / "fail").write_text("")
        elif (dirs["ctl"] / "fail").exists():
            (dirs["ctl"] / "fail").unlink()
        s = start(make_server, dirs, "--offload-max-pending", "10", "--offload-linger", "0.3",
                  "--offload-queue-bytes", "4M", workers="2", threads="2", new_session=True)
        if rnd:
            assert "ring holds" in s.log() or wait_for(lambda: "ring holds" in s.log() or
                                                       "journaled record(s) not yet delivered" in s.log(), 5), \
                s.log()
        n = load_then_kill_group(s, f"r{rnd}", 1.2, acked)
        assert n > 500, (n, s.log())
        ring = dirs["journal"] / "ring.fwr"
        with open(ring, "rb") as f:
            meta = f.read(256)
        head, tail = int.from_bytes(meta[64:72], "little"), int.from_bytes(meta[128:136], "little")
        in_ring.append(head - tail)
    assert in_ring[0] > 0 and in_ring[2] > 0, in_ring      # the sink was down: the kill found records there
    (dirs["ctl"] / "fail").unlink()
    s = start(make_server, dirs, workers="1", threads="1")
    out, missing = LineTail(dirs["out"]), set(acked)

    def all_delivered():
        missing.difference_update(bytes.fromhex(x["value"]).decode() for x in out.new())   # the test sink writes hex
        return not missing
    assert wait_for(all_delivered, timeout=60), (len(missing), s.log()[-3000:])
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0


def test_records_journaled_after_a_journal_write_cut_off_by_a_kill_are_delivered(make_server, dirs):
    """A sibling SIGKILLed inside its write to the journal can leave the
    first part of a record at the end of the segment (the kernel checks for
    a fatal signal between the pages it copies; the record itself is still
    in the ring, freed only after the write). Here that half record is put
    there by hand after a group SIGKILL; then the next server journals more
    records and is SIGKILLed too, the sink down all along. The third start
    delivers every acknowledged record and nothing else. Before, the second
    sibling appended behind the half record, and the third read the next
    record's first bytes as that record's rest, then found the journal
    damaged and skipped every record after it."""
    from forkwsgi.offload.records import HDR, Record, frame
    (dirs["ctl"] / "fail").write_text("")
    for tag in ("a", "b"):
        s = start(make_server, dirs, workers="1", threads="1", new_session=True)
        assert json.loads(get(s, f"/emit?n=10&id={tag}").body)["results"] == [True] * 10
        assert wait_for(lambda: json.loads(get(s, "/stats").body)["sibling"]["journaled"] == 10), s.log()
        os.killpg(s.pid, signal.SIGKILL)
        wait_group_killed(s)
        if tag == "a":
            cut = frame(Record("events", None, b"never acknowledged " * 4, time.time(), 1, 1))[:HDR.size + 20]
            with open(max(dirs["journal"].glob("journal-*.fwo")), "ab") as f:
                f.write(cut)
    (dirs["ctl"] / "fail").unlink()
    s = start(make_server, dirs, workers="1", threads="1")
    delivered = lambda: {bytes.fromhex(x["value"]) for x in lines(dirs["out"])}      # "<pid>-a0-"
    want = {f"{tag}{i}" for tag in "ab" for i in range(10)}
    assert wait_for(lambda: {v.split(b"-")[1].decode() for v in delivered()} >= want, timeout=20), s.log()[-3000:]
    assert all(re.fullmatch(rb"\d+-[ab]\d-", v) for v in delivered()), delivered()
    assert "damaged" not in s.log(), s.log()[-3000:]


def test_one_offload_dir_holds_one_server(make_server, dirs, tmp_path):
    """A second server on the same --offload-dir would read the first one's
    ring: it stops with one line that names the holder. Once the first is
    gone the directory is free again, even with its workers SIGKILLed
    behind it."""
    first = start(make_server, dirs, workers="1", threads="1")
    cmd = [sys.executable, "-m", "forkwsgi", "apps:offloader", "--bind", "127.0.0.1:0", "--workers", "1",
           "--offload-sink", "jsonl:" + str(tmp_path / "other.jsonl"), "--offload-dir", str(dirs["journal"])]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    err = [x for x in r.stderr.splitlines() if "error" in x]
    assert len(err) == 1 and f"is used by another forkwsgi server (pid {first.pid})" in err[0], r.stderr
    first.signal(signal.SIGKILL)            # the master only: its workers die after it (parent-death signal)
    assert first.proc.wait(10) == -signal.SIGKILL
    second = start(make_server, dirs, workers="1", threads="1")
    assert request(second.port, b"GET /emit?n=3&id=z HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").status == 200
    pids = tuple(f"{p}-".encode().hex() for p in second.worker_pids())
    assert wait_for(lambda: sum(x["value"].startswith(pids) for x in lines(dirs["out"])) >= 3, timeout=20)


def ring_wakes(path):
    """The wake-ups producers made (fw_ring_meta.wakes: each one a futex
    syscall in a request)."""
    with open(path, "rb") as f:
        return int.from_bytes(f.read(256)[200:208], "little")


def ring_sleeping(path):
    """The sibling sleeps on the ring's futex and wants a wake-up
    (fw_ring_meta.sleeping)."""
    with open(path, "rb") as f:
        return int.from_bytes(f.read(256)[192:196], "little") == 1


def test_producers_do_not_wake_the_sibling_while_records_flow(make_server, dirs):
    """A steady trickle of records (about 150 a second for 2 s): the sibling
    polls the ring on a timer while records come, so the requests make no
    futex syscall for it; only the first record after it went idle wakes
    it. Before, each batch began with a wake-up in some request."""
    s = start(make_server, dirs, workers="1", threads="1")
    assert wait_for(lambda: "Booted the offload sibling" in s.log())
    assert wait_for(lambda: ring_sleeping(dirs["journal"] / "ring.fwr"), timeout=20)   # idle, asleep on the futex
    ring = dirs["journal"] / "ring.fwr"
    before = ring_wakes(ring)
    end = time.monotonic() + 2.0
    n = 0
    while time.monotonic() < end and n < 1000:
        r = request(s.port, f"GET /emit?n=1&id=t{n}- HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode())
        assert r.status == 200
        n += 1
        time.sleep(0.005)
    assert wait_for(lambda: len(lines(dirs["out"])) == n, timeout=10)
    wakes = ring_wakes(ring) - before
    assert n > 100 and 1 <= wakes <= 3, (n, wakes)


def delivered_ids(dirs):
    """The values the test sink got, without apps:offloader's padding: "<pid>-<id><i>-"."""
    return {bytes.fromhex(x["value"]).rstrip(b"x").decode() for x in lines(dirs["out"])}


@pytest.mark.parametrize("ring", ["same size", "another size"])
def test_a_new_server_while_the_old_sibling_still_drains_loses_nothing(make_server, dirs, tmp_path, ring):
    """The master alone SIGKILLed: its sibling drains (SIGTERM from the
    kernel), and a new server on the same directory starts meanwhile; its
    sibling waits for the ring's reader lock. Here the old sibling delivers
    one batch after the new one began waiting (the sink's gate), then its
    sink fails until its graceful timeout: 30 records stay journaled after
    the position it acknowledged last. The new sibling delivers all 40.
    Before, it had read the journal's state before waiting: it began at the
    old acknowledged position, in the hole punched over what the old
    sibling delivered, reported the journal damaged there and skipped the
    30 records after it.

    A new server that asks for another --offload-queue-bytes keeps the
    ring the old sibling still reads, empty or not. Before, it made an
    empty one anew: its sibling locked the new file and did not wait, and
    two siblings worked on one journal at once (a third start then found
    the state of the old one, which it had written last, pointing into a
    segment the new one had deleted, and lost the new one's undelivered
    records)."""
    gate, fail = dirs["ctl"] / "gate", dirs["ctl"] / "fail"
    gate.write_text("")
    old = start(make_server, dirs, "--offload-batch", "10", "--graceful-timeout", "3", workers="1", threads="1")
    assert wait_for(lambda: sibling_pid(old) is not None)
    old_sibling = sibling_pid(old)
    # Stopped while the records come, the sibling journals all 40 in one
    # read (the ring is left empty), then holds the first 10 at the gate:
    # 10 KB, more than the 4 KiB page a delivery punches out.
    try:
        stop_and_wait(old_sibling)
        doc = json.loads(get(old, "/emit?n=40&size=1000&id=a").body)
    finally:
        os.kill(old_sibling, signal.SIGCONT)
    assert doc["results"] == [True] * 40
    want = {f"{doc['pid']}-a{i}-" for i in range(40)}
    assert wait_for(lambda: json.loads(get(old, "/stats").body)["sibling"]["journaled"] == 40), old.log()
    # Its sink holds the first batch at the gate (so the "fail" below comes
    # after that batch passed the sink's check for it).
    assert wait_for(lambda: (dirs["ctl"] / "at-gate").exists()), old.log()
    old.signal(signal.SIGKILL)
    assert old.proc.wait(10) == -signal.SIGKILL
    fresh_ctl = tmp_path / "ctl-new"           # the new server's sink has no gate
    fresh_ctl.mkdir()
    size = ("--offload-queue-bytes", "65536") if ring == "another size" else ()
    new = start(make_server, dirs, *size, workers="1", threads="1", env={"FW_SINK_CTL": str(fresh_ctl)})
    assert wait_for(lambda: "another sibling still reads the ring" in new.log(), timeout=10), new.log()
    fail.write_text("")
    gate.unlink()                               # the old sibling delivers that batch, then its sink fails
    assert wait_for(lambda: proc_gone(old_sibling), timeout=15), old.log()[-3000:]
    assert "30 record(s) not delivered before the stop" in old.log(), old.log()[-3000:]
    by_old = [x for x in lines(dirs["out"]) if x["pid"] == old_sibling]
    assert len(by_old) == 10, by_old
    delivered = lambda: delivered_ids(dirs)
    assert wait_for(lambda: want <= delivered(), timeout=20), (len(want - delivered()), new.log()[-3000:])
    assert "30 journaled record(s) not yet delivered" in new.log(), new.log()[-3000:]
    assert "damaged" not in new.log(), new.log()[-3000:]
    if ring == "another size":
        assert "is still open in a process of the last server" in new.log(), new.log()[-3000:]


def ring_capacity(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(16)[8:16], "little")


def test_a_ring_a_killed_masters_worker_still_writes_is_not_made_anew(make_server, dirs, tmp_path):
    """The master alone SIGKILLed while a request of its worker has not
    offloaded yet (a worker finishes its requests after its master died);
    the sibling has nothing to drain and is gone at once. A new server that
    asks for another --offload-queue-bytes finds the ring empty and keeps
    it all the same, since the worker still has it open: the records the
    worker writes then are delivered. Once no process of the old server is
    left, a start makes the ring anew at the size asked for. Before, the
    empty ring was made anew at once, and the worker's records went to a
    file that no one would read again: acknowledged, and lost."""
    hold = tmp_path / "hold"
    hold.write_text("")
    old = start(make_server, dirs, "--graceful-timeout", "20", workers="1", threads="1")
    assert wait_for(lambda: sibling_pid(old) is not None)
    old_sibling = sibling_pid(old)
    ring = dirs["journal"] / "ring.fwr"
    assert ring_capacity(ring) != 65536
    c = old.conn(timeout=60)
    c.send(b"GET /emit?n=0 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert c.read_response().status == 200     # the worker has the connection: it serves what comes on it
    c.send(f"GET /emit?n=5&id=late&hold={hold} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
    old.signal(signal.SIGKILL)
    assert old.proc.wait(10) == -signal.SIGKILL
    assert wait_for(lambda: proc_gone(old_sibling), timeout=10), old.log()[-3000:]
    new = start(make_server, dirs, "--offload-queue-bytes", "65536", workers="1", threads="1")
    hold.unlink()
    doc = json.loads(c.read_response().body)
    c.close()
    assert doc["results"] == [True] * 5
    want = {f"{doc['pid']}-late{i}-" for i in range(5)}
    delivered = lambda: delivered_ids(dirs)
    assert wait_for(lambda: want <= delivered(), timeout=20), (len(want - delivered()), new.log()[-3000:])
    assert "is still open in a process of the last server" in new.log(), new.log()[-3000:]
    assert wait_for(lambda: proc_gone(doc["pid"]), timeout=20), old.log()[-3000:]
    assert new.stop() == 0
    start(make_server, dirs, "--offload-queue-bytes", "65536", workers="1", threads="1")
    assert ring_capacity(ring) == 65536


def test_a_file_that_is_not_a_ring_is_set_aside_and_a_new_ring_made(make_server, dirs):
    """A ring file this version cannot read (another program's bytes, a
    damaged header) is not used: the server logs one error that names the
    file it was set aside as, keeps its bytes there, makes a new ring and
    delivers through it."""
    from forkwsgi.offload.queue import RING
    dirs["journal"].mkdir()
    junk = b"not a ring " * 1000
    (dirs["journal"] / RING).write_bytes(junk)
    s = start(make_server, dirs, workers="1", threads="1")
    aside = list(dirs["journal"].glob(RING + ".damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == junk, aside
    assert re.search(r"is not a ring this version can read \(damaged\?\): set aside as \S+\.damaged-\d+",
                     s.log()), s.log()[-3000:]
    assert json.loads(get(s, "/emit?n=5&id=new").body)["results"] == [True] * 5
    assert wait_for(lambda: len(lines(dirs["out"])) == 5), s.log()[-3000:]
