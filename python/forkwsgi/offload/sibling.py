"""The offload sibling: takes records off the queue, journals them, delivers
them to a sink in batches, and remembers what the sink acknowledged.

Delivery is at least once. A record is in one of these places, and each
survives the death of any one process:

- the ring (a file under --offload-dir that every worker maps: it outlives
  every process), until the sibling has appended it to the journal: it
  reads records in place, journals them in one write, and only then frees
  their room (a sibling killed in between journals them twice; a successor
  recognises them by producer pid, sequence and time);
- a worker's spill file (overflow, or too large for the queue), until the
  sibling has copied it into the journal; the offset read so far is in the
  state file;
- the journal (segment files in --offload-dir), until the sink acknowledged
  it; the acknowledged position is in the state file (journal.py), written
  after each delivered batch, so a new sibling (after a crash, a reload, or
  the next start of the server) delivers again exactly what was not
  acknowledged.
"""
import collections
import contextlib
import logging
import os
import time

from .. import _forkwsgi
from .counters import SIB, SIB_CUMULATIVE, SIB_NAMES
from .disktrouble import DiskTrouble
from .journal import Journal
from .queue import flock_within, ring_path
from .records import Record, frame
from .sinks import SinkDiskError, Ticket, make_sink
from .spills import SpillCollector

log = logging.getLogger("forkwsgi")


def open_reader(cfg):
    """Become the ring's one reader: open the ring file (a description of
    our own), hold flock on it while we live (a predecessor still draining,
    the sibling of a server that was killed, reads first), map it in C.
    Returns the fd."""
    fd = os.open(ring_path(cfg), os.O_RDWR | os.O_CLOEXEC)
    if not flock_within(fd, cfg["graceful_timeout"] + 5.0,
                        lambda: log.info("offload: another sibling still reads the ring (a server that stopped): "
                                         "waiting")):
        os.close(fd)
        raise RuntimeError("another offload sibling still reads the ring")
    _forkwsgi.ring_open_reader(fd)
    return fd


class Batch:
    """Records handed to the sink together: entries (Record, journal
    segment or None, end offset or ring position), the sink's Ticket (None
    while a failed batch waits for resend_at), settled once delivered or
    set aside."""

    __slots__ = ("entries", "ticket", "resend_at", "settled")

    def __init__(self, entries):
        self.entries = entries
        self.ticket = None
        self.resend_at = 0.0
        self.settled = False


class Sibling:
    FLOWING = 1.0          # seconds after the last record during which the sibling polls the ring on a timer
    MAX_IN_FLIGHT = 8      # batches handed to the sink and not yet settled
    READ_FIRST = 1 / 8     # of the ring in use: read it before the next batch is delivered

    def __init__(self, cfg, counters=None, producers_alive=None, priority=None):
        self.cfg = cfg
        self.counters = counters          # shared mmap region (SIB layout) or None
        self.batch_size = cfg["offload_batch"]
        self.linger = cfg["offload_linger"]
        # Opened by take_over, once this sibling is the ring's one reader.
        self.journal = None
        self.spills = None
        self.producers_alive = producers_alive
        self.sink = make_sink(cfg["offload_sink"], cfg, stopping=self._past_deadline)
        self.pending = collections.deque()      # (Record, segment, end offset), not yet handed to the sink
        self.in_flight = collections.deque()    # Batch, in order
        self.stop_at = None
        self.stop_reading = False
        self.stop_asked = None                   # monotonic time of request_stop
        self.stats = dict.fromkeys(SIB_NAMES, 0)
        if counters is not None:      # a replacement sibling: the totals go on
            prev = dict(zip(SIB_NAMES, SIB.unpack_from(counters, 0)))
            self.stats.update({n: prev[n] for n in SIB_CUMULATIVE})
        self.backoff = 0.1
        self.dups = None                         # keys of unacked journal records (resume): a predecessor's
        self.last_taken = 0.0                    # monotonic time the last records were taken from the ring
        self.next_spill_scan = 0.0
        self.spill_looked = 0.0                  # monotonic time the last look at the spill files began
        self.priority = priority
        self.spill_backlog = False               # records wait in spill files
        self.queue_backlog = False               # the last read stopped before the queue was empty
        self.disk = DiskTrouble(self.stats, cfg["offload_dir"])
        self.sent_direct = 0                     # delivered straight from the queue or a spill file
        self.direct_held = 0                     # records held that were read straight (not journaled)
        self.read_first = None                   # bytes in the ring that call for a read before a delivery
        self.read_again = False                  # deliver() stopped for the ring: no pause before the read

    # -- reading ------------------------------------------------------------

    def take_over(self):
        """Become the ring's one reader (open_reader waits while a
        predecessor still drains: the sibling of a server whose master was
        killed), and only then open the journal. Until the predecessor is
        gone, the journal's state, its segments and the spill offsets are
        its own and still move: read earlier, the acknowledged position
        could lie in bytes it has since delivered and punched out (zeros,
        taken for damage: the records after them skipped), the segment be
        one it has since left."""
        open_reader(self.cfg)
        self.read_first = int(_forkwsgi.ring_reader_stats()["capacity"] * self.READ_FIRST)
        self.journal = Journal(self.cfg["offload_dir"], self.cfg["offload_fsync"])
        self.spills = SpillCollector(self.cfg["offload_spill_dir"], self.journal, self.disk, self.producers_alive)

    def resume(self):
        """Deliver first what the journal holds and the sink did not
        acknowledge. Their keys tell the first records of the ring that a
        predecessor journaled and died before freeing."""
        keys = set()
        for rec, seg, off, key in self.journal.unacked():
            self.pending.append((rec, seg, off))
            keys.add(key)
        if keys:
            log.info("offload: %d journaled record(s) not yet delivered: delivering them", len(keys))
            self.dups = keys
        used = _forkwsgi.ring_used()
        if used:
            log.info("offload: the ring holds %d bytes of records from before this sibling: delivering them", used)

    def read_mode(self):
        """How records are read now, from the ring and the spill files:
        "journal"; "direct" while the journal cannot be written (a full
        disk): straight to the sink, their room given back only once they
        are delivered, so that a full disk never stops offload while the
        sink takes records; None: the journal is due to be tried again,
        after the records read straight are delivered (reading into the
        journal frees the ring up to where it read, and moves a spill
        file's offset past what it read: theirs too)."""
        if not self.disk.failing:
            return "journal"
        if self.disk.wait():
            return "direct"
        return None if self.direct_held else "journal"

    def read_queue(self, limit=4096, direct=False):
        """Move up to `limit` records from the ring into the journal: read in
        place, appended in one write, and only then freed (in C:
        _forkwsgi.ring_take). Returns how many were taken.

        direct (the journal's disk is full): read without journaling, pending
        with the ring position after each, freed once delivered."""
        n = 0
        while n < limit:
            try:
                if direct:
                    entries, taken, state, _ = _forkwsgi.ring_take(-1, limit - n, 1 << 62, self.dups, Record,
                                                                   None, 0)
                    self.direct_held += len(entries)
                else:
                    taken, state, entries = self.journal.take(limit - n, self.dups)
                    self.stats["journaled"] += len(entries)
            except OSError as e:
                self.disk.failed("the journal", e)          # the records stay in the ring
                break
            # (Records not fresh were journaled by our predecessor: pending since resume().)
            self.pending.extend(entries)
            if entries or state == "empty":
                self.dups = None                 # past the predecessor's last batch
            if taken and not direct:
                self.disk.ok()
            self.stats["dequeued"] += taken
            if taken:
                self.last_taken = time.monotonic()
            n += taken
            if state != "more":
                break
        return n

    def collect_spills(self, direct=False):
        """Journal what waits in the workers' spill files (spills.py), as far
        as --offload-max-pending allows; direct: take it without journaling
        (delivered from there, spills.delivered). True if records were left
        there."""
        room = self.cfg["offload_max_pending"] - len(self.pending) - self.in_flight_records()
        n = len(self.pending)
        left = self.spills.collect(room, self.pending.append, direct)
        if direct:
            self.direct_held += len(self.pending) - n
        self.stats["journaled"] += self.spills.journaled
        self.spills.journaled = 0
        return left

    # -- delivering ---------------------------------------------------------

    def deliver(self, force=False):
        """Settle the batches the sink has finished, in order, then hand it
        new ones: when full, old enough, or forced (a stop). Up to
        MAX_IN_FLIGHT batches are with the sink at once, so its round trip
        (the broker's acks) does not set the pace. Returns True if a batch
        was settled.

        Between two batches it looks at the ring: once that is more than
        READ_FIRST full, the rest waits for the next round, after a read. A
        sink that writes and fsyncs in send() (jsonl) takes ~10 ms a batch
        on a CPU that request threads keep busy (the sibling, at its share,
        waits for a tick after each fsync): the 8 batches of a 4,096-record
        read kept it from the ring for 0.4 s, and a 256 KiB ring overflowed
        meanwhile."""
        self.read_again = False
        if self.in_flight:
            self.sink.poll(0)
        settled = self._settle()
        now = time.monotonic()
        handed = 0
        for b in self.in_flight:                  # failed batches whose pause is over
            if b.ticket is None and now >= b.resend_at:
                if self._read_first(handed, force):
                    break
                b.ticket = self._hand(b.entries)
                handed += 1
        while not self.read_again and self.pending and len(self.in_flight) < self.MAX_IN_FLIGHT:
            if (not force and len(self.pending) < self.batch_size
                    and time.time() - self.pending[0][0].ts < self.linger):
                break
            if self._read_first(handed, force):
                break
            handed += 1
            entries = [self.pending.popleft() for _ in range(min(self.batch_size, len(self.pending)))]
            try:
                self.journal.sync()
            except OSError as e:                  # sent all the same: the sink is what matters now
                self.disk.failed("the journal", e)
            b = Batch(entries)
            self.in_flight.append(b)
            b.ticket = self._hand(entries)
            if b.ticket.done:
                # A sink that delivers in send() (SendSink): acknowledge before the
                # next batch, so a sibling killed now repeats one batch at most.
                settled = self._settle() or settled
        # A sink that delivers in send() is done already: settle now, so
        # that the journal gives their room back before the next read.
        settled = self._settle() or settled
        self.stats["in_flight"] = self.in_flight_records()
        return settled

    def _read_first(self, handed, force):
        """True (read_again set) if the ring is to be read before another
        batch is handed over: one was, and the ring is more than READ_FIRST
        full (not while a stop forces the rest out)."""
        self.read_again = (handed > 0 and not force and self.read_first is not None
                           and _forkwsgi.ring_used() > self.read_first)
        return self.read_again

    def _hand(self, entries):
        records = [r for r, _, _ in entries]
        try:
            return self.sink.submit(records)
        except Exception as e:  # noqa: BLE001 - any sink failure is retried
            return Ticket(records).fail(e)

    def _settle(self):
        """Batches the sink finished: a failed one waits for its pause and
        is handed over again (the sink may hold some of its records twice:
        at least once); from the first, in order, the delivered ones are
        acknowledged in the journal (one state write for all of them) or,
        read straight from the ring or a spill file, freed there."""
        now = time.monotonic()
        for b in self.in_flight:
            if b.ticket is None or not b.ticket.done or b.settled:
                continue
            try:
                rejected = b.ticket.outcome()
                if rejected:
                    self.set_aside([(b.entries[i][0], reason) for i, reason in rejected])
                b.settled = True
                self.backoff = 0.1
                for w in self.in_flight:          # the sink is back: what waits after a failure goes now
                    if w.ticket is None:
                        w.resend_at = min(w.resend_at, now)
            except SinkDiskError as e:
                # Refused records that cannot be set aside are not lost: the
                # batch is sent again (its accepted records twice).
                self.disk.failed("rejected.fwo", e.__cause__)
                self._resend(b, now + max(self.disk.wait(), 0.1))
            except Exception as e:  # noqa: BLE001 - any sink failure is retried
                self.stats["sink_errors"] += 1
                log.warning("offload: sink failed (%s); %d record(s) retried in %.1f s", e, len(b.entries),
                            self.backoff)
                self._resend(b, now + self.backoff)
                self.backoff = min(self.backoff * 2, 5.0)
        acked = released = None
        spilled = {}                              # spill file name -> offset after its last delivered record
        n = 0
        while self.in_flight and self.in_flight[0].settled:
            b = self.in_flight.popleft()
            n += 1
            for _, seg, end in b.entries:
                if isinstance(seg, int):          # journal segment
                    acked = (seg, end)
                    continue
                if seg is None:                   # read straight from the ring
                    released = end if released is None else max(released, end)
                else:                             # straight from the spill file named seg
                    spilled[seg] = end
                self.sent_direct += 1
                self.direct_held -= 1
            self.stats["delivered"] += len(b.entries)
            self.stats["batches"] += 1
        if acked is not None:
            try:
                self.journal.ack(*acked)
            except OSError as e:                  # kept in memory; saved with the next ack
                self.disk.failed("the journal state", e)
        if released is not None:
            _forkwsgi.ring_release(released)
        if spilled:
            try:
                self.spills.delivered(spilled)
            except OSError as e:                  # kept in memory; saved with the next state write
                self.disk.failed("the journal state", e)
        return n > 0

    def _resend(self, b, when):
        self.stats["retried"] += len(b.entries)
        b.ticket, b.resend_at = None, when

    def in_flight_records(self):
        return sum(len(b.entries) for b in self.in_flight)

    def oldest_ts(self):
        """When the oldest record the sibling holds (in flight or pending) was made; None if none."""
        if self.in_flight:
            return self.in_flight[0].entries[0][0].ts
        return self.pending[0][0].ts if self.pending else None

    def next_resend(self):
        """Seconds until a failed batch may be handed over again (None: none waits)."""
        waits = [b.resend_at for b in self.in_flight if b.ticket is None]
        return max(0.0, min(waits) - time.monotonic()) if waits else None

    def wait(self, seconds):
        """Sleep up to `seconds`; with batches at the sink, until its first report."""
        if any(b.ticket is not None and not b.ticket.done for b in self.in_flight):
            self.sink.poll(seconds)
        else:
            time.sleep(seconds)

    def set_aside(self, refused):
        """Records the sink refused for good: appended to rejected.fwo (the
        queue's format, so they can be replayed once the cause is fixed)."""
        path = os.path.join(self.journal.dir, "rejected.fwo")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise SinkDiskError() from e
        start = os.fstat(fd).st_size
        try:
            for rec, _ in refused:
                data = memoryview(frame(rec))
                while data:
                    data = data[os.write(fd, data):]
            if self.cfg["offload_fsync"] != "never":
                os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)          # all of them or none
            raise SinkDiskError() from e
        finally:
            os.close(fd)
        self.stats["rejected"] += len(refused)
        log.error("offload: the sink refused %d record(s) for good (topic %r: %s): kept in %s",
                  len(refused), refused[0][0].topic, refused[0][1], path)

    def _save_state(self):
        try:
            self.journal.save_state()
        except OSError as e:
            self.disk.failed("the journal state", e)

    def _past_deadline(self):
        return self.stop_at is not None and time.monotonic() >= self.stop_at

    def publish(self):
        self.stats["pending"] = len(self.pending) + self.in_flight_records()
        self.stats["oldest_ts"] = self.oldest_ts() or 0.0
        if self.counters is not None:
            SIB.pack_into(self.counters, 0, *(int(self.stats[n]) if n != "oldest_ts" else float(self.stats[n])
                                               for n in SIB_NAMES))

    # -- the loop -----------------------------------------------------------

    def request_stop(self, deadline, read=True):
        """Stop by `deadline`. read: drain the queue first (the whole server
        stops); else only deliver what was taken (a successor takes over)."""
        self.stop_at = deadline
        self.stop_reading = not read
        self.stop_asked = time.monotonic()
        self.next_spill_scan = 0.0

    def run(self):
        """The sibling's loop, until a stop (request_stop) is done: read,
        adjust the priority, deliver, pause until there is more to do."""
        prepare = getattr(self.sink, "prepare", None)
        if prepare:
            prepare()
        self.resume()
        while True:
            room = self._read()
            if self.priority is not None:
                oldest = self.oldest_ts()
                self.priority.update(time.time() - oldest if oldest else 0.0,
                                     self.spill_backlog or self.queue_backlog,
                                     _forkwsgi.ring_used())
            delivered = self.deliver(force=self.stop_at is not None)
            self.publish()
            if self.stop_at is None:
                if not self.read_again:
                    self._pause(room)
            elif self._drained():
                break
            else:
                self._drain_pause(delivered)
        self._finish()

    def _read(self):
        """One round of reading: the journal's state saved if due, the spill
        files looked at if due, the ring read as far as there is room.
        Returns the room left under --offload-max-pending before the read."""
        now = time.monotonic()
        if self.journal.state_dirty and not self.disk.wait():
            self._save_state()
        if now >= self.next_spill_scan and self.read_mode():
            self.spill_backlog = self.collect_spills(self.read_mode() == "direct")
            self.next_spill_scan = now + (0.05 if self.spill_backlog else 0.5)
            self.spill_looked = now
        room = self.cfg["offload_max_pending"] - len(self.pending) - self.in_flight_records()
        self.queue_backlog = room <= 0
        # A full disk: records go to the sink straight from the queue,
        # and the journal is tried again after a pause.
        mode = self.read_mode()
        if room > 0 and not self.stop_reading and mode:
            limit = min(room, 4096)
            self.queue_backlog = self.read_queue(limit, mode == "direct") >= limit
            self.publish()
        return room

    def _pause(self, room):
        """Until there is more to do, while not stopping."""
        if self.pending or self.in_flight:
            # A batch is forming, or the sink has batches: sleep until
            # the next is due or the sink reports, without waking for
            # each record that arrives meanwhile (they wait in the queue
            # and are read in one go). One wake-up per batch, not per
            # record: the request threads share the CPU with us.
            due = []
            if self.pending and len(self.in_flight) < self.MAX_IN_FLIGHT:
                due.append(self.pending[0][0].ts + self.linger - time.time())
            resend = self.next_resend()
            if resend is not None:
                due.append(resend)
            timeout = min(due) if due else self.linger
            self.wait(min(max(timeout, 0.001), 0.05 if room <= 0 else self.linger))
        elif time.monotonic() - self.last_taken < self.FLOWING:
            # Records came a moment ago, more are likely: look again on a
            # timer, so that no producer has to wake us (a futex wake is a
            # syscall in a request). They wake us only once we sleep for
            # good, FLOWING seconds after the last record.
            time.sleep(min(max(self.linger, 0.001), 0.05))
        else:
            _forkwsgi.ring_wait(500)             # idle: the first record wakes us (futex, no GIL)

    def _drained(self):
        """Draining (a stop): read what is queued (the ring, the spill
        files: a pod that goes away has no next start), deliver it; True
        once both are empty or the graceful timeout is up (what is left
        stays where it is for the next start)."""
        # (The producers have stopped: what they spilled last is
        # known only to a look at the spill files begun since.)
        spilled = self.spill_backlog or self.spill_looked < self.stop_asked
        queued = not self.stop_reading and (_forkwsgi.ring_has_data() or spilled)
        held = self.pending or self.in_flight
        return not held and not queued or time.monotonic() >= self.stop_at

    def _drain_pause(self, delivered):
        """Between rounds of draining: until the sink reports, or briefly."""
        held = self.pending or self.in_flight
        if not delivered and held:
            resend = self.next_resend()
            self.wait(min(0.05, resend if resend is not None else 0.05))
        elif not held:
            self.next_spill_scan = 0.0    # only spill files wait: read them now
            time.sleep(0.01)              # (not in a tight loop if one cannot be read yet)

    def _finish(self):
        """After the loop: what is left journaled and logged, the sink closed."""
        if self.read_mode() == "journal":        # never behind records read straight and not delivered
            self.collect_spills()
        try:
            self.journal.sync()
        except OSError as e:
            self.disk.failed("the journal", e)
        if self.sent_direct:
            log.warning("offload: %d record(s) sent straight from the queue and the spill files: the journal's "
                        "disk was full", self.sent_direct)
        held = list(self.pending) + [e for b in self.in_flight for e in b.entries]
        if held:
            # Where they were read from: the journal, or (read straight) the
            # ring and the spill files, which free them only once delivered.
            log.warning("offload: %d record(s) not delivered before the stop: kept in %s for the next start",
                        len(held), self.journal.dir)
        log.info("offload: %s", ", ".join(f"{n} {self.stats[n]}" for n in SIB_NAMES if n != "oldest_ts"))
        close = getattr(self.sink, "close", None)
        if close:
            close()
