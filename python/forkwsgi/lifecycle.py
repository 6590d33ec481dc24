"""The workers' lifecycle, as the master sees it (a mixin of
arbiter.Arbiter): keep --workers of them running, fork each (spawn), note
when one comes ready (and retire an old one for it in a rolling reload),
retire one, and reap those that end, telling a retirement from a crash.
"""
import os
import random
import signal
import time

from . import binding, hooks, process, worker
from .checks import rss_mib


class HaltServer(Exception):
    def __init__(self, reason, exit_status=1):
        super().__init__(reason)
        self.reason = reason
        self.exit_status = exit_status


class WorkerInfo:
    def __init__(self, pid, index, ready_fd):
        self.pid = pid
        self.index = index
        self.ready_fd = ready_fd     # read end of its readiness pipe, None once ready
        self.ready = False
        self.ready_at = None         # time.monotonic() when it said it was ready
        self.slot = None             # index into the shared status slots
        self.started = time.monotonic()
        self.spawned = time.time()      # for the stats server's last_spawn
        self.old = False             # replaced by a reload: retire once a new one is ready
        self.retiring = False        # sent SIGTERM by us
        self.retire_reason = None    # why (Arbiter.retire), for the restart counts
        self.hook_worker = None      # what hooks got for it (hooks.Worker)
        self.stopping_since = None   # time.monotonic() when it began to stop (retired, or by itself)
        self.frozen_seen = None      # its beat when the heartbeat check last found it frozen
        self.killed = False          # SIGKILLed for not stopping in time
        self.rss_held = False        # over --max-rss, kept because no replacement can start
        self.rss_at_ready = None     # its RSS (MiB) when it said it was ready (--max-rss)
        self.rss_born_over = False   # over --max-rss from the start: not recycled for memory
        self.timeout_held = False    # past --timeout, kept because no replacement can start
        self.timed_out_at = None     # time.monotonic() when --timeout found it stuck (its stacks asked for)
        self.max_requests = 0        # its own --max-requests (jitter included)
        self.due = False             # --lazy-apps: past --max-requests or --max-rss (the reason), replaced
                                     # once a new one serves (check_due, check_memory)
        self.image = 0               # the reload (Arbiter.code_image) whose code it runs



class WorkerLifecycle:
    """Uses the arbiter's workers, slots, sockets, options, hooks, backoff
    and the held-import state (heldimport.py)."""

    def _read_ready_byte(self, w):
        """Read w's readiness pipe (readable, or its writer gone) and close
        it: w is ready if its byte is there. Returns w.ready."""
        try:
            data = os.read(w.ready_fd, 1)
        except OSError:        # EAGAIN too: a child the app forked may hold the write end
            data = b""
        os.close(w.ready_fd)
        w.ready_fd = None
        if data:
            w.ready = True
            w.ready_at = time.monotonic()
            if self.cfg["max_rss"]:
                w.rss_at_ready = rss_mib(w.pid)
            self.served = True
            self.log.debug("worker %d (pid %d) ready", w.index, w.pid)
        return w.ready

    def _worker_ready(self, fd):
        w = next((w for w in self.workers.values() if w.ready_fd == fd), None)
        if w is None:
            os.close(fd)
            return
        if not self._read_ready_byte(w):
            return            # it died before it was ready: reap() tells why
        old = [o for o in self.workers.values() if o.old and not o.retiring]
        if old and not w.old:   # rolling reload: one old worker out for each new one in
            # (not for an old one that comes ready late: a reload sent while
            # it was still booting must not retire its peer for nothing)
            o = min(old, key=lambda o: (not o.due, o.index))
            self.retire(o, o.due or "reload")
        self.announce_ready()

    def announce_ready(self):
        """Tell systemd the server is ready once every worker of the current
        set serves (at start, and at the end of each reload)."""
        current = [w for w in self.workers.values() if not w.old and not w.retiring]
        if self.announce and len(current) >= self.num_workers and all(w.ready for w in current):
            self.announce = False
            urls = ", ".join(self.urls())
            self.notifier.ready(f"{len(current)} worker(s) serving {urls}")

    def manage_workers(self):
        if self.stop_pending():
            return
        if self.offload and self.offload.due():
            self.offload.start()
        current = [w for w in self.workers.values() if not w.old and not w.retiring]
        if self.no_app:
            # Those booting now cannot import either: only the ones that
            # serve count, and none is started.
            current = [w for w in current if w.ready]
        if len(current) > self.num_workers:
            # Oldest code first: while the app does not import, the workers
            # of a reload that came ready join those held from before it.
            for w in sorted(current, key=lambda w: (w.image, -w.index))[:len(current) - self.num_workers]:
                self.retire(w, "scale_down")
        elif len(current) < self.num_workers and self.backoff.due() and not self.no_app:
            used = {w.index for w in current}
            for index in range(1, self.num_workers + 1):
                if index not in used and len(used) < self.num_workers:
                    if not self.spawn(index):
                        break
                    used.add(index)
        self.retire_leftover_old(current)

    def retire_leftover_old(self, current):
        """A reload sent during a reload makes the first one's new workers,
        still booting, old too: more old workers than new ones to replace
        them one for one (_worker_ready), and the extra ones would serve the
        code before the last reload for good. Once the current set is
        complete and every one of it serves, the old ones left go."""
        if len(current) < self.num_workers or not all(w.ready for w in current):
            return
        for o in [o for o in self.workers.values() if o.old and not o.retiring]:
            self.retire(o, o.due or "reload")

    def replaces_first(self):
        """--max-requests: does a worker past its limit keep serving while
        the master starts its replacement, retiring once that one serves
        (check_due), instead of retiring by itself? With --lazy-apps: the
        master has no app to fork a replacement from, and one that cannot
        import the code now on disk would leave none. With --balance
        reuseport: a worker's listening socket is its own, and closed
        before a replacement's is open it would leave the port with none
        (two workers retiring together: connections refused)."""
        return bool(self.cfg["max_requests"]) and (self.lazy or self.balance == "reuseport")

    def spawn(self, index):
        options = self.options
        if options["max_requests"] and self.cfg["max_requests_jitter"]:
            # Each worker its own limit, so they do not all retire at once.
            options = dict(options, max_requests=options["max_requests"] +
                           random.randint(0, self.cfg["max_requests_jitter"]))
        slot = self.slots.free_slot({x.slot for x in self.workers.values()})
        if slot is None:
            self.log.warning("all %d worker slots are in use: worker %d waits for one", self.slots.nslots, index)
            return False
        status, counters, balance = self.slots.prepare(slot, self.code_image)
        if self.replaces_first():
            # It does not retire by itself at --max-requests: the master
            # starts its replacement, and retires it once that one serves.
            self.slots.hold(slot, True)
        ofl = self.offload.queue.producer_options(slot) if self.offload else None
        sockets = self.sockets
        # With --lazy-apps a reuseport worker listens once its app is
        # imported (worker.run: Setup.listen_late): the kernel would give
        # connections to a socket in the group while the import runs, and
        # reset them if it fails.
        listen_late = self.cfg["backlog"] if self.balance == "reuseport" and self.lazy else None
        if self.balance == "reuseport":
            sockets = [binding.reuseport_peer(s, self.cfg["backlog"], listen=listen_late is None)
                       for s in self.sockets]
        self.worker_age += 1
        hw = hooks.Worker(index, self.worker_age, self.log, self.cfg, max_requests=options["max_requests"],
                          sockets=sockets)
        self.hooks.call("pre_fork", self, hw)
        r, w = os.pipe2(os.O_CLOEXEC)
        # Stop signals are held across fork: the child unblocks them once
        # its own handlers are in place (worker.run), so one that arrives
        # meanwhile is delivered to them, not lost to the handlers it
        # inherited from us. With them held, the queue cannot change under
        # the last check that no stop is pending.
        with process.stop_signals_held():
            if self.stop_pending():
                os.close(r)
                os.close(w)
                if sockets is not self.sockets:
                    for s in sockets:
                        s.close()
                status.release()
                counters.release()
                return False
            pid = os.fork()
            if pid == 0:           # still holding them: never leaves this block
                os.close(r)
                self._run_worker(index, slot, sockets, options, w, status, counters, balance, ofl, hw, listen_late)
        status.release()
        counters.release()
        if sockets is not self.sockets:
            for s in sockets:
                s.close()              # the worker's own now: its queue dies with it
        os.close(w)
        os.set_blocking(r, False)        # reap() reads it without waiting
        self.workers[pid] = WorkerInfo(pid, index, r)
        self.workers[pid].max_requests = options["max_requests"]
        self.workers[pid].image = self.code_image
        hw.pid, hw.ppid = pid, self.pid
        hw.count_requests(lambda: self.slots.counters(slot)["requests"])
        self.workers[pid].hook_worker = hw
        self.spawns[index] += 1
        self.workers[pid].slot = slot
        self.log.info("Booted worker %d (pid %d)", index, pid)
        return True

    def _run_worker(self, index, slot, sockets, options, ready_fd, status, counters, balance, ofl, hw, listen_late):
        """In the forked worker: close what belongs to the master, then run."""
        self._close_masters_own()
        self.slots.keep_only(slot)
        if self.offload:
            self.offload.queue.close_in_child()     # the hold on --offload-dir is the master's
        if sockets is not self.sockets:
            for s in self.sockets:
                s.close()          # the master's placeholders
        self.hooks.call("post_fork", self, hw.in_child())
        # wsgi.multiprocess: true when the app may run in several processes at once.
        worker.run(worker.Setup(index, self.pid, sockets, self.app, self.app_spec, options, ready_fd,
                                listen_late=listen_late,
                                protocols=self.protocols,
                                nice=self.cfg["worker_nice"], multiprocess=self.num_workers > 1,
                                status=status, stats=counters, balance=balance, offload=ofl,
                                hooks=self.hooks, hook_worker=hw, master=self, owner=self.owner,
                                access_logger=self.access_logger), self.log)

    def _close_masters_own(self):
        """In a child it forks (a worker, the offload sibling): close the
        master's wakeup pipe, --stats/--metrics sockets and readiness pipes."""
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for obs in self.observers:
            obs.close()
        for w in self.workers.values():
            if w.ready_fd is not None:
                os.close(w.ready_fd)

    def retire(self, w, reason):
        """Retire w while the others serve on: it hands its idle connections
        to them (the scoreboard flag says so) instead of closing them.
        reason: reload, max_rss, or scale_down (SIGTTOU: not replaced)."""
        self.log.debug("worker %d (pid %d) retires (%s)", w.index, w.pid, reason)
        w.retiring = True
        w.retire_reason = reason
        w.stopping_since = time.monotonic()
        if w.slot is not None:
            self.slots.retire(w.slot)
        self.kill(w.pid, signal.SIGTERM)

    def kill(self, pid, sig):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.preflight and pid == self.preflight.pid:
                self.preflight.reaped(status)
                continue
            if self.import_check and pid == self.import_check.pid:
                self.import_check.reaped(status)
                continue
            if self.offload and pid == self.offload.pid:
                self.offload.exited(status)
                continue
            w = self.workers.pop(pid, None)
            if w is None:
                continue
            if w.hook_worker:
                w.hook_worker.count_requests(None)        # its last count, before the slot is reused
            self.hooks.call("child_exit", self, w.hook_worker or hooks.Worker(w.index, 0, self.log, self.cfg, pid))
            if self.app_metrics:
                self.app_metrics.worker_exited(pid)
            if w.ready_fd is not None:
                # It may have come ready, served and exited since the last
                # look at the pipes (the master was in a hook, or slow):
                # its byte says so, or it would pass for a crash at start-up.
                self._read_ready_byte(w)
            if w.slot is not None and not w.retiring and w.ready and self.slots.states()[w.slot] == "draining":
                self.retired_by_itself(w)     # before check_stopping saw it
            served = None
            if w.slot is not None:
                served = self.slots.counters(w.slot)["requests"]
                self.retired_requests[w.index] += served
                self.slots.fold(w.slot)
                self.slots.release(w.slot)
                self.slots.pass_on_stranded(self.stopping)
            code = os.waitstatus_to_exitcode(status)
            how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
            if code == worker.APP_LOAD_ERROR:
                if not self.served:
                    raise HaltServer(f"worker {w.index} could not load the app {self.app_spec!r}: stopping", 4)
                self.lost_the_app(w)
                continue
            if code == worker.WORKER_BOOT_ERROR and not w.ready and not self.served:
                # Before anything served: the set-up is wrong, say so and stop.
                # Once the server has served, a replacement that cannot boot
                # (memory, descriptors, threads running short for a while) is
                # retried after the back-off below: the others serve on.
                raise HaltServer(f"worker {w.index} failed to boot: stopping", 3)
            if self.stopping:
                self.log.info("Worker %d (pid %d) exited (%s)", w.index, pid, how)
                continue
            self.say_unreplaceable(w)
            if w.retiring:
                self.log.info("Worker %d (pid %d) exited (%s)%s", w.index, pid, how,
                              f" ({self.SELF_RETIRED[w.retire_reason]})" if w.retire_reason in self.SELF_RETIRED
                              and w.stopping_since is None else "")
                if w.retire_reason != "scale_down":
                    self.restarts[w.retire_reason] += 1
                continue
            if code == 0 and w.ready and self.cfg["max_requests"] and served is not None \
                    and served >= self.cfg["max_requests"]:
                # It retired by itself (--max-requests): not a crash. (Short
                # of its --max-requests, an exit 0 nobody asked for is a death:
                # the app or a hook ended the process.)
                self.log.info("Worker %d (pid %d) retired%s", w.index, pid, "" if self.no_app else "; replacing it")
                self.restarts["max_requests"] += 1
                continue
            self.restarts["crash"] += 1
            serving = self.requests_in_app(w)
            self.log.warning("Worker %d (pid %d) died (%s)%s%s", w.index, pid, how,
                             f" while serving {serving}" if serving else "",
                             "" if self.no_app else "; replacing it")
            if self.backoff.died(w.started, w.ready_at if w.ready else None):
                if w.ready:
                    self.log.warning("workers die within %.0f s of being ready: next start in %.1f s",
                                     self.backoff.boot_seconds, self.backoff.delay)
                else:
                    self.log.warning("workers die at start-up: next start in %.1f s", self.backoff.delay)

    def say_unreplaceable(self, w):
        """A worker ended while the master has no app to fork a new one:
        the log says so, and how many serve."""
        if not self.no_app or w.old or w.retire_reason == "scale_down":
            return
        serving = sum(1 for x in self.workers.values() if x.ready and not x.retiring)
        self.log.error("Worker %d (pid %d) ended and cannot be replaced while the app does not import (%s): "
                       "%d of %d worker(s) serve; the import is tried again in %.0f s", w.index, w.pid,
                       self.no_app, serving, self.num_workers, max(0.0, self.import_retry_at - time.monotonic()))
    def requests_in_app(self, w):
        """What w's app threads were serving, from its status slots (until
        its replacement takes them): "'GET /a' (app thread 1), ...", or ""."""
        if w.slot is None:
            return ""
        return ", ".join(f"{line!r} ({self.slots.thread_label(t)})" for t, _, line in self.slots.serving(w.slot))

    SELF_RETIRED = {"max_requests": "--max-requests", "app_exit": "the app called sys.exit()",
                    "signal": "sent a stop signal, not by the master"}

    def retired_by_itself(self, w):
        """w's slot drains and we did not ask it to: it retires (why:
        self_retire_reason), and an early sys.exit() backs off."""
        w.retiring = True
        w.retire_reason = self.self_retire_reason(w)
        self.back_off_early_exit(w)

    def back_off_early_exit(self, w):
        """w said it retires by itself (its slot drains): if the app ended
        it (sys.exit()) within boot_seconds of ready, a request that exits,
        retried by its client, is a crash loop: its replacement waits for
        the back-off as after a death. (--max-requests is no such loop: a
        small one under load retires workers that fast on purpose.)"""
        if self.stop_pending() or w.retire_reason != "app_exit" or w.ready_at is None:
            return                       # (a stop drains every worker: no exit of its own)
        if self.backoff.died(w.started, w.ready_at):
            self.log.warning("workers exit by themselves (sys.exit()) within %.0f s of being ready: next start in "
                             "%.1f s", self.backoff.boot_seconds, self.backoff.delay)

    def self_retire_reason(self, w):
        """Why w stops by itself, as its slot says: --max-requests, the app's
        sys.exit(), or a stop signal someone other than the master sent it
        (kill PID, a process manager). A worker that does not say (an older
        build's, across an upgrade) is guessed at as before: --max-requests
        when set, else the app."""
        said = self.slots.drain_reason(w.slot) if w.slot is not None else None
        if said in ("max_requests", "app_exit"):
            return said
        if said == "asked":
            return "signal"
        return "max_requests" if self.cfg["max_requests"] else "app_exit"

