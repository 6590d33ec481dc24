"""Collecting the workers' spill files into the journal.

A worker appends a record to its spill file when the queue is full (or the
record is too large for it); the sibling copies whole records from there
into the journal, remembers in the journal's state how far it read each
file, and deletes a file it has read to the end (or to half a record that
no one will finish). While the journal cannot be written (a full disk), the
records go to the sink straight from the file instead: once delivered, the
state remembers how far, and their room in the file is given back.
"""
import contextlib
import fcntl
import logging
import os

from .. import _forkwsgi
from .records import HDR, BadRecord, length, parse

log = logging.getLogger("forkwsgi")

SPILL_CHUNK = 8 << 20                    # bytes read from one spill file per scan (or its next record)


class SpillCollector:
    def __init__(self, spill_dir, journal, disk, producers_alive=None):
        self.spill_dir = spill_dir
        self.journal = journal
        self.disk = disk                 # disktrouble.DiskTrouble: failed writes are counted and retried
        self.producers_alive = producers_alive or _pid_alive
        self.room = 0
        self.journaled = 0               # records journaled, for the sibling's counter
        self.unsettled = {}              # name -> offset read up to, straight, not all delivered yet

    def collect(self, room, take, direct=False):
        """Copy whole records from the workers' spill files into the journal,
        at most `room` records (the rest waits in the file); take(entry) gets
        each journaled record as (Record, segment, end offset). Returns True
        if records were left waiting in a file.

        direct: the journal cannot be written; take(entry) gets each record
        as (Record, file name, end offset in the file), to be delivered
        straight from there (delivered() then says so). Only the sibling's
        read_mode() mixes the two: never a journaled read of a file while
        records read straight from it are not delivered.

        A file read to the end is deleted, also while its worker lives. The
        producer takes the file's lock for every append; the sibling takes
        it only to read a chunk and, once that chunk is journaled, to check
        that nothing came since and unlink. A producer that finds its file
        unlinked starts a new one under a new name, so the offsets kept here
        by name never meet another file. A producer never writes to a file
        it did not make (cserver/fw_offload.c: spill_create), so one that a
        previous process with the same pid left is read and deleted here
        like any other."""
        try:
            names = [n for n in os.listdir(self.spill_dir) if n.startswith("spill-") and n.endswith(".fwo")]
        except FileNotFoundError:
            return False
        state = self.journal.state["spill"]
        for gone in set(state) - set(names):        # deleted, and the state not saved after
            state.pop(gone)
        left = False
        self.room = room
        for name in names:
            if self.room <= 0 or (not direct and self.disk.wait()):
                return True
            try:
                pid = int(name[6:-4].split("-")[0])
            except ValueError:
                continue
            left |= self._collect_one(os.path.join(self.spill_dir, name), name, self.producers_alive(pid), take,
                                      direct)
        return left

    def delivered(self, ends):
        """Records read straight from spill files were delivered: `ends`
        maps a file's name to the offset after the last of them. Saved in
        the state (in place: no new block needed), then their room in the
        file is given back (a hole punched at its head: only once the state
        says so, a successor never reads in a hole); a file delivered to its
        end is deleted by the next scan. OSError: the state could not be
        saved (it is, with the next state write)."""
        for name, end in ends.items():
            self.journal.state["spill"][name] = end
            if self.unsettled.get(name) == end:
                del self.unsettled[name]
        self.journal.save_state()
        for name, end in ends.items():
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(os.path.join(self.spill_dir, name), os.O_WRONLY | os.O_CLOEXEC)
                try:
                    _forkwsgi.offload_forget(fd, end)
                finally:
                    os.close(fd)

    def _collect_one(self, path, name, alive, take, direct):
        """One spill file: its whole records taken (journaled, or read
        straight), the file deleted once read to the end. Returns True if
        records were left in it."""
        done = self.journal.state["spill"].get(name, 0)      # journaled, or delivered
        # Read on from here; past done only in direct mode (read_mode()
        # reads into the journal only once everything read straight is
        # delivered).
        start = self.unsettled.get(name, done)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)       # (written only to give its blocks back)
        except FileNotFoundError:
            self.unsettled.pop(name, None)
            return False
        try:
            with _Locked(fd, wait=False):             # not locked (being appended): read what is whole
                data = os.pread(fd, _read_size(fd, start), start)
            off, taken, incomplete = self._take_records(path, name, data, start, done, take, direct)
            if direct and (taken or start != done):
                # Read, not delivered yet: the file stays as it is until they are.
                self.unsettled[name] = start + off
                return os.fstat(fd).st_size > start + off
            if off and not self._journaled(name, done, off):
                return True
            if self._delete_if_read(fd, path, name, done + off, done + len(data), incomplete, alive):
                return False
            return os.fstat(fd).st_size > done + off
        finally:
            os.close(fd)

    def _take_records(self, path, name, data, start, done, take, direct):
        """The whole records of `data` (read at offset `start`), as far as
        the room goes: appended to the journal, or (direct) handed to take()
        as they are. Returns (bytes of data taken or skipped as damaged,
        records read straight, whether it stopped at a record not all
        there)."""
        view = memoryview(data)                     # the journal gets slices of it, not copies
        off = 0
        taken = 0                                   # read straight, to be delivered
        while off < len(data) and self.room > 0:
            try:
                rec, size = parse(data, off)
            except BadRecord:
                if direct and (taken or start != done):
                    break       # skipped once what was read before it is delivered (the state is there then)
                log.error("offload: spill file %s is damaged at offset %d: skipping the rest of it",
                          path, start + off)
                return len(data), taken, False
            if rec is None:
                return off, taken, True
            if direct:
                take((rec, name, start + off + size))
                taken += 1
            else:
                try:
                    seg, end = self.journal.append(view[off:off + size])
                except OSError as e:
                    self.disk.failed("the journal", e)   # the rest waits in the spill file
                    break
                self.disk.ok()
                take((rec, seg, end))
                self.journaled += 1
            self.room -= 1
            off += size
        return off, taken, False

    def _journaled(self, name, done, off):
        """The `off` bytes after `done` were journaled (or skipped as
        damaged): made sure before the file forgets them. False if that
        cannot be made sure: they are collected again (twice, never lost)."""
        try:
            self.journal.sync()
            self.journal.state["spill"][name] = done + off
            self.journal.save_state()
        except OSError as e:
            self.journal.state["spill"][name] = done
            self.disk.failed("the journal state", e)
            return False
        return True

    def _delete_if_read(self, fd, path, name, collected, read_to, incomplete, alive):
        """Read to the end (`collected`, its offset; `read_to`, where the
        read ended): delete the file if nothing came meanwhile (checked
        under the lock, which a live producer holds while appending).
        Returns True if it was deleted.

        Without an append under way, half a record at the end is one whose
        producer was killed while appending it (offload() had not
        returned), or could not take back after a failed write (offload()
        returned False; the producer moved on to a new file): no one will
        finish it or write behind it."""
        with _Locked(fd, wait=False) as locked:
            quiet = locked or not alive               # no append under way
            size = os.fstat(fd).st_size
            # (size == what was read: the read reached the end, so the
            # rest is all there is of that record.)
            cut_off = quiet and incomplete and size == read_to and _cut_off(fd, collected, size)
            deleted = quiet and (size == collected or cut_off)
            if deleted:
                os.unlink(path)
                # Its blocks go back now, not when its worker, which
                # still has it open, next spills and finds it gone (a
                # full disk would stay full meanwhile). After the
                # unlink: a file cut short under its name would be
                # appended to below the offset the state keeps.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
        if cut_off:
            log.warning("offload: spill file %s ends in half a record (an append cut off: its worker "
                        "was killed, or the disk failed; that record was never acknowledged): deleted "
                        "after journaling the whole records before it", path)
        if deleted:
            self.journal.state["spill"].pop(name, None)
            try:
                self.journal.save_state()
            except OSError as e:
                self.disk.failed("the journal state", e)
        return deleted


def _read_size(fd, start):
    """How much to read from start on: a chunk, or all of the record there
    if it is larger (parse needs a record whole), never more than the file
    holds (a damaged header may claim up to 4 GiB)."""
    try:
        need = length(os.pread(fd, HDR.size, start)) or 0
    except BadRecord:
        need = 0                         # parse finds the damage and says so
    return max(0, min(max(SPILL_CHUNK, need), os.fstat(fd).st_size - start))


def _cut_off(fd, start, size):
    """Whether the bytes from start to size are less than one record. Read
    again here, under the lock: what was read before may have been an
    append under way."""
    try:
        return parse(os.pread(fd, size - start, start))[0] is None
    except BadRecord:
        return False                     # damage: the next read says so and skips it


class _Locked:
    """flock(LOCK_EX | LOCK_NB) on fd for a with-block; as the value: whether
    the lock was had (the block runs either way)."""

    def __init__(self, fd, wait=False):
        self.fd = fd
        self.flags = fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)
        self.locked = False

    def __enter__(self):
        try:
            fcntl.flock(self.fd, self.flags)
            self.locked = True
        except BlockingIOError:
            pass
        return self.locked

    def __exit__(self, *exc):
        if self.locked:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
