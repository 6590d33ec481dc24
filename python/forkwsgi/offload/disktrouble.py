"""Writes to --offload-dir that fail (DiskTrouble): counted, logged at
most once a second, tried again after a pause."""
import logging
import time

log = logging.getLogger("forkwsgi")


class DiskTrouble:
    """Writes to --offload-dir that fail (a full disk, EIO). The sibling
    goes on: records stay where they wait (the queue, spill files) until
    the sink has them (Sibling.read_mode), each failure is counted, logged
    at most once a second, and the write is tried again after a pause (0.1
    s, doubling up to 1 s) until it works."""

    def __init__(self, stats, directory):
        self.stats = stats
        self.dir = directory
        self.since = None              # when the current run of failures began
        self.failures = 0              # in this run
        self.unlogged = 0
        self.logged_at = 0.0
        self.told = False              # this run was logged: its end will be
        self.retry_at = 0.0

    @property
    def failing(self):
        return self.since is not None

    def wait(self):
        """Seconds until the next try (0: go ahead)."""
        return max(0.0, self.retry_at - time.monotonic())

    def failed(self, what, err):
        now = time.monotonic()
        self.stats["disk_errors"] += 1
        if self.since is None:
            self.since = now
        self.failures += 1
        self.unlogged += 1
        self.retry_at = now + min(0.1 * 2 ** min(self.failures - 1, 4), 1.0)
        if now - self.logged_at >= 1.0:
            log.error("offload: cannot write %s in %s (%s): %d failed write(s); records go to the sink "
                      "straight from the queue and spill files until there is room",
                      what, self.dir, err.strerror or err, self.unlogged)
            self.logged_at, self.unlogged, self.told = now, 0, True

    def ok(self):
        """A journal write worked."""
        if self.since is not None:
            # (Only after a logged run: a disk that fills and empties all
            # the time gives one pair of lines a second, not one per run.)
            if self.told:
                log.warning("offload: %s is writable again (%d failed write(s) in %.1f s)",
                            self.dir, self.failures, time.monotonic() - self.since)
            self.since, self.failures, self.retry_at, self.told = None, 0, 0.0, False
