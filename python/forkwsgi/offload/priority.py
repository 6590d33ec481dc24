"""The offload sibling's share of the CPU (Priority): idle while it keeps
up, a fair share while it falls behind; keep_leaving_idle, as root, lets
the sibling's --user come back from idle.
"""
import logging
import os
import resource
import time

from .. import _forkwsgi

log = logging.getLogger("forkwsgi")


class Priority:
    """The sibling's share of the CPU, which it shares with request threads.

    While it keeps up (from the moment its ring watch runs: it starts up
    at its share), every thread of the sibling runs SCHED_IDLE: it gets
    the CPU only when no request thread wants it, and a request thread that
    wakes up preempts it at once, so offloading adds nothing to a request's
    latency. When it falls behind it switches to SCHED_BATCH at
    --offload-nice and takes its fair share until it has caught up:

    - the ring fills past WATCH of its size: on a CPU that request threads
      keep busy an idle sibling gets no time at all, not even to look, so a
      C thread of its own that stays SCHED_OTHER watches the ring every
      WATCH_MS and switches the others (src/ring_watch.c), long before the
      ring overflows into spill files;
    - or the oldest record it holds waited more than BEHIND seconds, or
      records wait beyond what it holds (spill files, the queue past
      --offload-max-pending).

    It goes back to idle once it has caught up (nothing waits beyond it, its
    oldest is under CAUGHT_UP, the ring is nearly empty) and has shared for
    at least HOLD seconds: under a steady saturating load it would only be
    switched back at once. Leaving SCHED_IDLE needs root, CAP_SYS_NICE or
    RLIMIT_NICE; without them the sibling stays SCHED_BATCH (never
    preempting a request thread on wake-up, but taking its share all the
    time)."""

    BEHIND = 1.0
    CAUGHT_UP = 0.2
    HOLD = 3.0
    WATCH = 1 / 8
    WATCH_MS = 5
    LOG_EVERY = 60.0         # seconds between log lines about switching

    def __init__(self, nice):
        self.nice = nice
        self.mode = None
        self.watch_tid = None
        self.threshold = None
        self.fired = 0
        self.since = 0.0                 # monotonic time of the last switch to share
        self.switches = 0                # to share, since the last log line
        self.logged_at = -self.LOG_EVERY
        self.told = False                # "falling behind" was logged: "caught up" will be
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        self.can_idle = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - nice
        # Its share until the watch runs: idle from the start, a sibling on
        # a busy CPU got no time to start up (to open the ring and the
        # journal), and the records made meanwhile waited seconds.
        self.set("share")

    def watch(self, capacity):
        """Start the ring watch (the ring's reader is open); from now on
        the sibling idles while it keeps up."""
        if self.can_idle and self.watch_tid is None:
            self.threshold = int(capacity * self.WATCH)
            self.watch_tid = _forkwsgi.ring_watch(self.threshold, self.WATCH_MS, self.nice)
            self.set("idle")

    def set(self, mode):
        policy = os.SCHED_IDLE if mode == "idle" else os.SCHED_BATCH
        for tid in os.listdir("/proc/self/task"):
            if int(tid) == self.watch_tid:
                continue
            try:
                os.sched_setscheduler(int(tid), policy, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, int(tid), self.nice)    # per thread on Linux
            except OSError:
                pass
        self.mode = mode
        if mode == "share":
            self.since = time.monotonic()
        if self.watch_tid is not None:
            self.fired = _forkwsgi.ring_watch_arm(mode == "idle")

    def _shared(self, why):
        self.switches += 1
        now = time.monotonic()
        if now - self.logged_at >= self.LOG_EVERY:
            more = f" ({self.switches} time(s) in the last {self.LOG_EVERY:.0f} s)" if self.switches > 1 else ""
            log.info("offload: falling behind (%s): taking a share of the CPU%s", why, more)
            self.logged_at, self.switches, self.told = now, 0, True

    def update(self, lag, backlog, used=0):
        """lag: seconds the oldest record the sibling holds has waited;
        backlog: records wait beyond what it holds (queue, spill files);
        used: bytes in the ring."""
        if not self.can_idle:
            return
        if self.mode == "idle" and self.watch_tid is not None and _forkwsgi.ring_watch_fired() != self.fired:
            self.mode, self.since = "share", time.monotonic()         # the watch switched every thread
            self._shared("the ring is more than 1/8 full")
        elif self.mode == "idle" and (lag > self.BEHIND or backlog):
            self.set("share")
            self._shared(f"a record waited {lag:.1f} s" if lag > self.BEHIND else
                         "records wait in the queue or on disk")
        elif (self.mode == "share" and lag < self.CAUGHT_UP and not backlog
              and time.monotonic() - self.since >= self.HOLD
              and (self.threshold is None or used < self.threshold // 4)):
            if self.told:
                log.info("offload: caught up: back to idle priority")
                self.told = False
            self.set("idle")


def keep_leaving_idle(nice):
    """As root, before the sibling becomes --user: Linux lets a process
    that is not root leave SCHED_IDLE (Priority) for a nice level within
    its RLIMIT_NICE (20 - nice or more): raised that far, if root may
    (CAP_SYS_RESOURCE, which containers often lack). If not, Priority
    sees it and never idles: it runs SCHED_BATCH."""
    need = 20 - nice
    soft, hard = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NICE, (need, hard if hard == resource.RLIM_INFINITY else max(hard, need)))
    except (ValueError, OSError):
        log.info("offload: the sibling runs SCHED_BATCH, not idle: as a user other than root, leaving SCHED_IDLE "
                 "needs RLIMIT_NICE %d or more (it is %d, and may not be raised here)", need, hard)
