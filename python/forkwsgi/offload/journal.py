"""The offload journal: segment files of records in the queue's format and
the acknowledged position. The only writer of journal files (in C,
_forkwsgi.ring_take appends records from the ring to the segment Journal
hands it)."""
import contextlib
import errno
import json
import logging
import os
import struct
import zlib

from .. import _forkwsgi
from .records import BadRecord, Record, key, parse

log = logging.getLogger("forkwsgi")


SEGMENT_BYTES = 8 << 20                  # a journal segment is closed past this size
ROLL_DELIVERED = 1 << 20                 # no holes: a delivered segment this large is replaced
STATE = "state.fws"                      # the journal's state: two slots written in place
STATE_SLOT = 32 << 10
STATE_HDR = struct.Struct("<4sIQI")      # magic, payload length, generation, crc32 of the payload
STATE_MAGIC = b"FWS1"


class Journal:
    """Segment files journal-N.fwo in `directory`, plus the state: the
    acknowledged position (segment, offset) and how far each spill file was
    collected. Only the sibling writes here, one at a time.

    The disk may fill up (or fail) at any write. Every method that writes
    raises OSError and leaves things as they were: a half-written record is
    taken back, and the state is written in place, into two slots
    allocated when the file was made (the newer valid one counts), so
    saving the acknowledged position never needs a free block: delivered
    records are never sent again because the disk was full. Delivered bytes
    give their blocks back (a hole punched in the segment, or the segment
    deleted), so the journal holds about what is not yet delivered."""

    def __init__(self, directory, fsync):
        self.dir = directory
        self.fsync = fsync
        os.makedirs(directory, exist_ok=True)
        self.state = {"segment": 0, "offset": 0, "spill": {}}
        self.state_gen = 0
        self.state_fd = None
        self.state_dirty = False
        self._load_state()
        try:
            # Now, while there is room (the first start): from then on the
            # state is written in place, a full disk or not.
            self.state_fd = self._make_state_file()
        except OSError as e:
            log.error("offload: cannot allocate the journal state in %s (%s): acknowledgements are saved "
                      "once there is room", directory, e.strerror or e)
        segs = self.segments()
        # No segment left (every one delivered and deleted): the next one
        # after the acknowledged one, or its first records would sit before
        # the acknowledged offset.
        self.seg = max(segs) if segs else self.state["segment"] + (1 if self.state["offset"] else 0)
        self.fd = self._open_segment(self.seg)
        self.size = os.fstat(self.fd).st_size
        # A predecessor killed inside a write to this segment may have left
        # the first part of a record at its end (the whole record is still
        # in the ring: freed only after the write). Nothing is appended
        # behind it, or a reader would take the next record's first bytes
        # for its rest and find the journal damaged after it: the first
        # write goes to a new segment (a reader stops at a torn tail and
        # goes on with the next segment).
        self.inherited_tail = self.size > 0
        self.dirty = False
        self.can_forget = True                # False once the file system refused to punch holes

    def seg_path(self, n):
        return os.path.join(self.dir, f"journal-{n:08d}.fwo")

    def _open_segment(self, n):
        return os.open(self.seg_path(n), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def segments(self):
        out = []
        for name in os.listdir(self.dir):
            if name.startswith("journal-") and name.endswith(".fwo"):
                try:
                    out.append(int(name[8:-4]))
                except ValueError:
                    pass
        return sorted(out)

    def roll(self):
        """Start the next segment if this one is full, or a predecessor's."""
        if self.size >= SEGMENT_BYTES or self.inherited_tail:
            self._next_segment()

    def _next_segment(self):
        fd = self._open_segment(self.seg + 1)       # may fail (ENOSPC): the old one stays in use
        os.close(self.fd)
        self.fd, self.seg, self.size, self.dirty = fd, self.seg + 1, 0, False
        self.inherited_tail = False

    def append(self, data):
        """Append one framed record; returns its (segment, end offset). On a
        write error nothing of it stays and OSError is raised."""
        self.roll()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            self.recover()
            raise
        self.size += len(data)
        self.dirty = True
        return self.seg, self.size

    def take(self, limit, dups):
        """Move up to `limit` records from the ring into the journal (in C:
        _forkwsgi.ring_take, one write for all of them, then their room in
        the ring is freed). A record whose key (records.key) is in `dups`
        was journaled by a predecessor that died before freeing it: not
        appended again. Returns (taken, state, entries): how many records
        were taken, state "empty" or "more", entries (Record, segment, end
        offset) for the records appended now. OSError: nothing was
        appended, the records stay in the ring."""
        self.roll()
        try:
            entries, taken, state, _ = _forkwsgi.ring_take(self.fd, limit, SEGMENT_BYTES - self.size, dups,
                                                           Record, self.seg, self.size)
        except OSError:
            self.recover()
            raise
        if entries:
            self.size = entries[-1][2]
            self.dirty = True
        return taken, state, entries

    def recover(self):
        """After a failed append: the segment must end where the last whole
        record does. If the half record cannot be cut off, the next record
        goes to a new segment (a reader stops at the torn tail and moves on)."""
        with contextlib.suppress(OSError):
            if os.fstat(self.fd).st_size != self.size:
                os.ftruncate(self.fd, self.size)
            if os.fstat(self.fd).st_size != self.size:
                self._next_segment()

    def sync(self):
        if self.dirty and self.fsync != "never":
            os.fsync(self.fd)
        self.dirty = False

    def unacked(self):
        """Every journaled record after the acknowledged position, in order,
        as (Record, segment, end offset, key)."""
        for n in self.segments():
            if n < self.state["segment"]:
                continue
            with open(self.seg_path(n), "rb") as f:
                off = self.state["offset"] if n == self.state["segment"] else 0
                f.seek(off)                   # before it: delivered (maybe a hole)
                data = f.read()
            pos = 0
            while pos < len(data):
                try:
                    rec, size = parse(data, pos)
                except BadRecord:
                    log.error("offload journal %s is damaged at offset %d: skipping the rest of it",
                              self.seg_path(n), off + pos)
                    break
                if rec is None:
                    break             # a torn tail: the sibling died while appending
                k = key(data, pos)
                pos += size
                yield rec, n, off + pos, k

    def ack(self, seg, off):
        """Everything up to (seg, off) was delivered: record it, then give
        the room it took back. OSError if the state could not be saved (it
        is saved with the next ack, or by save_state)."""
        self.state["segment"], self.state["offset"] = seg, off
        self.state_dirty = True
        self.save_state()
        # Only once the state says so: a successor must never start reading
        # inside a hole or a deleted segment.
        for n in self.segments():
            if n < seg:
                os.unlink(self.seg_path(n))
        if seg != self.seg:
            # An older segment (a predecessor's, delivered after a restart):
            # nothing is appended to it any more. Its room goes back too, or
            # a full disk would stay full until the current one is acknowledged.
            path = self.seg_path(seg)
            with contextlib.suppress(FileNotFoundError):
                if off >= os.path.getsize(path):
                    os.unlink(path)           # the current segment, after it, stays: never an empty journal
                else:
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        self._forget(fd, off)
                    finally:
                        os.close(fd)
            return
        self._forget(self.fd, off)
        if not self.can_forget and off == self.size and self.size >= ROLL_DELIVERED:
            # All of it delivered: a successor starts after it, from the new one.
            self._next_segment()
            os.unlink(self.seg_path(seg))

    def _forget(self, fd, off):
        """Punch out a segment's bytes before off (delivered)."""
        if self.can_forget and not _forkwsgi.offload_forget(fd, off):
            self.can_forget = False           # no holes here: delivered segments go whole

    def save_state(self):
        """Write the state into the older of the two slots (in place: no new
        block needed). OSError (EIO, or ENOSPC if the file could not be made
        yet) leaves state_dirty set."""
        if self.state_fd is None:
            self.state_fd = self._make_state_file()
        payload = json.dumps(self.state, separators=(",", ":")).encode()
        if len(payload) > STATE_SLOT - STATE_HDR.size:
            # Thousands of half-collected spill files: forget the offsets of
            # some (collected again from the start: duplicates, not losses).
            log.error("offload: the journal state is too large for its slot; spill offsets are forgotten")
            spill = dict(list(self.state["spill"].items())[:STATE_SLOT // 64])
            payload = json.dumps(dict(self.state, spill=spill), separators=(",", ":")).encode()
        gen = self.state_gen + 1
        data = STATE_HDR.pack(STATE_MAGIC, len(payload), gen, zlib.crc32(payload)) + payload
        if os.pwrite(self.state_fd, data, (gen % 2) * STATE_SLOT) != len(data):
            raise OSError(errno.EIO, "short write of the journal state")
        if self.fsync != "never":
            os.fdatasync(self.state_fd)
        self.state_gen = gen
        self.state_dirty = False

    def _make_state_file(self):
        path = os.path.join(self.dir, STATE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < 2 * STATE_SLOT:
                os.posix_fallocate(fd, 0, 2 * STATE_SLOT)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _load_state(self):
        """The newer valid slot of the state file; else the JSON file of
        earlier versions; else the start."""
        path = os.path.join(self.dir, STATE)
        best = None
        # Read as it is: it may be shorter than its two slots (allocating
        # them failed on a full disk; they are allocated after reading).
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            for slot in (0, 1):
                raw = os.pread(f.fileno(), STATE_SLOT, slot * STATE_SLOT)
                if len(raw) < STATE_HDR.size:
                    continue
                magic, n, gen, crc = STATE_HDR.unpack_from(raw)
                payload = raw[STATE_HDR.size:STATE_HDR.size + n]
                if magic == STATE_MAGIC and len(payload) == n and zlib.crc32(payload) == crc and \
                        (best is None or gen > best[0]):
                    best = (gen, payload)
        old = os.path.join(self.dir, "state.json")
        if best is not None:
            self.state_gen = best[0]
            self.state.update(json.loads(best[1]))
        elif os.path.exists(old):
            with open(old) as f:
                self.state.update(json.load(f))

