"""The master's checks on its workers, once per turn of its loop (a mixin
of arbiter.Arbiter): --timeout (stuck in the app), a worker that does not
finish stopping, --max-requests under --lazy-apps (check_due),
--heartbeat-timeout (a frozen loop) and --max-rss. While the app does not
import (heldimport.py) a worker that cannot be replaced is kept, and said so.
"""
import os
import signal
import time

# How long a timed-out worker lives on at least, for faulthandler to write
# its stacks (SIGUSR2) before a SIGKILL could cut them short.
STACKS_GRACE = 0.5


def rss_mib(pid):
    """Process pid's resident memory in MiB, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


class WorkerChecks:
    """Uses the arbiter's workers, slots, cfg and retire/kill (lifecycle.py)."""

    def check_timeouts(self):
        """--timeout: a worker stuck in one call into the app is replaced; its
        request line and every thread's Python stack go to the log first."""
        limit = self.cfg["timeout"]
        if not limit:
            return
        now = time.monotonic_ns()
        inline = self.cfg["threads"] == 1
        for w in list(self.workers.values()):
            if not w.ready or w.slot is None or w.killed or w.timed_out_at is not None:
                continue
            if w.retiring and not inline:
                continue            # draining: --graceful-timeout bounds its calls now
            stuck = [(began, t, line) for t, began, line in self.slots.serving(w.slot)
                     if (now - began) / 1e9 > limit]
            if not stuck:
                continue
            began, t, line = min(stuck)
            if w.retiring:
                # Retiring already (a reload, --max-requests, --max-rss) with
                # its one app thread stuck: the time limit holds all the same
                # (gunicorn's timeout covers the old workers of a reload).
                self.log.error("Worker %d (pid %d), retiring (%s), timed out: %.1f s in %r on %s (--timeout %g); "
                               "its Python stacks follow; it is killed (its one app thread is stuck)", w.index,
                               w.pid, w.retire_reason or "by itself", (now - began) / 1e9, line,
                               self.slots.thread_label(t), limit)
                self._timed_out(w)
                continue
            if self.no_app:
                # No app to start a replacement with: retiring it would take
                # its capacity away for good. It serves on, on its other
                # threads; its stack is logged once.
                if not w.timeout_held:
                    w.timeout_held = True
                    self.log.error("Worker %d (pid %d): %.1f s in %r on %s (--timeout %g), but the "
                                   "app does not import, so it cannot be replaced: it serves on; its Python "
                                   "stacks follow", w.index, w.pid, (now - began) / 1e9, line,
                                   self.slots.thread_label(t), limit)
                    self.kill(w.pid, signal.SIGUSR2)
                continue
            if self.cfg["threads"] == 1:
                then = "it is killed (its one app thread is stuck)"
            else:
                then = (f"it takes no more requests, its requests in the app get --graceful-timeout "
                        f"{self.cfg['graceful_timeout']:g} s to finish (this one too), then it is killed")
            self.log.error("Worker %d (pid %d) timed out: %.1f s in %r on %s (--timeout %g); its Python stacks "
                           "follow; %s, and a new worker replaces it", w.index, w.pid, (now - began) / 1e9, line,
                           self.slots.thread_label(t), limit, then)
            self._timed_out(w)
            # As any retirement: no new work, idle connections handed on, the
            # requests in flight on its other threads finish; the stuck one
            # ends with the worker (check_stopping).
            self.retire(w, "timeout")

    def _timed_out(self, w):
        """w is past --timeout: its stacks are asked for (the kill waits
        STACKS_GRACE for them: check_stopping)."""
        for h in self.log.handlers:
            try:
                h.flush()
            except (OSError, ValueError):
                pass
        self.kill(w.pid, signal.SIGUSR2)       # faulthandler writes the stack to stderr
        self.timeouts[w.index] += 1
        w.timed_out_at = time.monotonic()

    def check_stopping(self):
        """A worker that stops (retiring, or retiring by itself at
        --max-requests) while a call into the app never returns would never
        exit. It has --graceful-timeout for its requests, then as long again
        for the app's atexit handlers (worker.run_atexit); past both it is
        killed, and replaced."""
        now = time.monotonic()
        board = None
        for w in list(self.workers.values()):
            if w.stopping_since is None and w.slot is not None and not w.retiring:
                board = board or self.slots.states()
                if board[w.slot] == "draining" and w.ready:
                    # It retires by itself (--max-requests, or the app called
                    # sys.exit()): its replacement starts now, not once it
                    # has exited, so that it has a worker to hand its
                    # kept-alive connections to.
                    w.stopping_since = now
                    self.log.info("Worker %d (pid %d) retires (%s); starting its replacement", w.index, w.pid,
                                  self.SELF_RETIRED[self.self_retire_reason(w)])
                    self.retired_by_itself(w)
            if w.stopping_since is None or w.killed:
                continue
            if (w.timed_out_at is not None and self.cfg["threads"] == 1 and
                    now - w.timed_out_at >= STACKS_GRACE and self.only_timed_out(w)):
                # One app thread (gunicorn's sync worker, uWSGI's default):
                # its loop waits for the stuck call, so nothing else of the
                # worker moves; it goes now, as under gunicorn's timeout and
                # uWSGI's harakiri. With more threads (gthread, which never
                # cuts a request) the stuck call has the graceful time too.
                self.log.warning("Worker %d (pid %d): killed, its calls left in the app all past --timeout %g "
                                 "(%s)", w.index, w.pid, self.cfg["timeout"], self.requests_in_app(w))
                w.killed = True
                self.kill(w.pid, signal.SIGKILL)
                continue
            if now - w.stopping_since > 2 * self.cfg["graceful_timeout"] + 1.0:
                serving = self.requests_in_app(w)
                self.log.warning("Worker %d (pid %d) did not stop within twice --graceful-timeout %g s (its "
                                 "requests', then its atexit handlers')%s: killing it",
                                 w.index, w.pid, self.cfg["graceful_timeout"],
                                 f" (still in {serving})" if serving else " (nor its atexit handlers)")
                w.killed = True
                self.kill(w.pid, signal.SIGKILL)

    def only_timed_out(self, w):
        """Question: are the calls w has in the app, one at least, all past
        --timeout?"""
        limit = self.cfg["timeout"]
        if not limit or w.slot is None:
            return False
        now = time.monotonic_ns()
        serving = self.slots.serving(w.slot)
        return bool(serving) and all((now - began) / 1e9 > limit for _, began, _ in serving)

    def check_due(self):
        """--max-requests with --lazy-apps or --balance reuseport
        (replaces_first): a worker past its limit keeps serving while its
        replacement starts (marked old, as in a rolling reload); it retires
        once the replacement is ready. If that one cannot import the app,
        the old one serves on (lost_the_app)."""
        if not self.replaces_first() or self.no_app:
            return
        for w in self.workers.values():
            if w.due or w.old or w.retiring or not w.ready or w.slot is None or not w.max_requests:
                continue
            served = self.slots.counters(w.slot)["requests"]
            if served >= w.max_requests:
                w.due, w.old = "max_requests", True
                self.log.info("Worker %d (pid %d) served %d requests (--max-requests %d): starting its "
                              "replacement; it retires once that one serves", w.index, w.pid, served,
                              w.max_requests)

    def check_heartbeats(self):
        """--heartbeat-timeout: a worker whose loop has stopped turning with
        no request in its app (SIGSTOP, a system call that never returns) is
        frozen; its kept-alive clients would hang for ever. It is replaced.
        A loop busy in the app is --timeout's business, not this."""
        limit = self.cfg["heartbeat_timeout"]
        if not limit:
            return
        now = time.monotonic()
        beats = self.slots.beats()
        for w in list(self.workers.values()):
            if w.retiring or not w.ready or w.slot is None or beats[w.slot] is None:
                continue
            # Before its loop's first pass, the time since it said it was ready.
            since = beats[w.slot] / 1000 if beats[w.slot] else (w.ready_at or now)
            if now - since <= limit or self.slots.serving(w.slot):
                w.frozen_seen = None
                continue
            # Seen so twice, its beat unchanged: a loop that has just left
            # the app beats a moment after its status slot says so.
            if w.frozen_seen != beats[w.slot]:
                w.frozen_seen = beats[w.slot]
                continue
            self.log.error("Worker %d (pid %d) is frozen: its event loop has not turned for %.1f s, with no "
                           "request in the app (--heartbeat-timeout %g); replacing it", w.index, w.pid,
                           now - since, limit)
            w.retiring = True
            w.retire_reason = "frozen"
            self.kill(w.pid, signal.SIGKILL)

    def check_memory(self):
        """--max-rss: recycle, gracefully, a worker whose memory grew too much."""
        limit = self.cfg["max_rss"]
        if not limit:
            return
        for w in list(self.workers.values()):
            if w.retiring or not w.ready or w.due or w.rss_born_over:
                continue
            rss = rss_mib(w.pid)
            if rss is None or rss <= limit:
                continue
            if w.rss_at_ready is not None and w.rss_at_ready > limit:
                # Over it from the start: its replacement would be too, and
                # recycling would fork without end (a worker a tick).
                w.rss_born_over = True
                if not self.rss_unreachable_said:
                    self.rss_unreachable_said = True
                    self.log.warning("Worker %d (pid %d) used %.0f MiB as it became ready, over --max-rss %d: "
                                     "a new worker would too, so workers that start over the limit are not "
                                     "recycled for memory; raise --max-rss above what a worker needs",
                                     w.index, w.pid, w.rss_at_ready, limit)
            elif self.no_app:
                if not w.rss_held:
                    w.rss_held = True
                    self.log.warning("Worker %d (pid %d) uses %.0f MiB > --max-rss %d, but the app does not "
                                     "import: it serves on until a new worker can replace it", w.index, w.pid,
                                     rss, limit)
            elif self.lazy:
                # A replacement imports the app first, which takes a while:
                # retired now, its kept-alive clients would have no worker
                # to go to (--workers 1). It serves until that one does.
                self.log.warning("Worker %d (pid %d) uses %.0f MiB > --max-rss %d: starting its replacement; it "
                                 "retires once that one serves", w.index, w.pid, rss, limit)
                w.due, w.old = "max_rss", True
            else:
                self.log.warning("Worker %d (pid %d) uses %.0f MiB > --max-rss %d: recycling it",
                                 w.index, w.pid, rss, limit)
                self.retire(w, "max_rss")
