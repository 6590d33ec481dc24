"""The master process: binds, preloads, forks workers and supervises them.

The model is gunicorn's arbiter, so operators need not relearn anything:
signals are queued by the handler and dispatched by name from the main loop
(handle_term, handle_hup, ...), never acted on inside the handler.

- SIGTERM: graceful stop (workers finish in-flight requests within
  --graceful-timeout, then anything left is killed).
- SIGINT, SIGQUIT: fast stop; also during a graceful stop (what is left stops now).
- SIGHUP: reload: a new set of workers starts, and each old worker retires
  only once a new one reports ready, so no request is refused. With the
  app preloaded (the default) the master first re-executes itself in place
  (reexec.py: same PID, new code); with --lazy-apps each new worker imports
  the app afresh.
- SIGUSR2 (gunicorn's binary upgrade): the in-place reload, in every mode.
- SIGWINCH: ignored (gunicorn acts on it only when daemonized).
- SIGTTIN / SIGTTOU: one worker more / less.
- SIGUSR1: passed to the workers (reopen log files).
- SIGCHLD: reap; a dead worker is replaced at once, with back-off when
  workers keep dying right after they start; a worker that cannot import the
  app stops the master with that message instead of looping.
"""
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter

from . import binding, config, hooks, logs, observer, process, reexec, systemd
from .checks import WorkerChecks
from .heldimport import HeldImport
from .lifecycle import HaltServer, WorkerInfo, WorkerLifecycle
from .slots import WorkerSlots
from .startup import StartUp

log = logging.getLogger("forkwsgi")


# How often the master looks for a worker past --max-requests when it must
# start the replacement first (Lifecycle.replaces_first): 50 looks a
# second at ~20 µs each, against an overshoot of 0.2 s of its traffic.
DUE_POLL = 0.02


class Arbiter(StartUp, WorkerLifecycle, WorkerChecks, HeldImport, reexec.InPlaceReload, hooks.GunicornServer):
    """The master: its state, its main loop, its signals and its stop. The
    mixins hold the rest, one job each: startup.py, lifecycle.py (spawn,
    retire, reap), checks.py, heldimport.py, reexec.py (in-place reload)."""
    worker_info = WorkerInfo      # what InPlaceReload makes for the workers it takes over
    SIGNALS = {
        signal.SIGHUP: "hup", signal.SIGQUIT: "quit", signal.SIGINT: "int", signal.SIGTERM: "term",
        signal.SIGTTIN: "ttin", signal.SIGTTOU: "ttou", signal.SIGUSR1: "usr1", signal.SIGCHLD: "chld",
        signal.SIGUSR2: "usr2", signal.SIGWINCH: "winch",
    }

    def __init__(self, app_spec, cfg, logger=log, notifier=None, argv=None, cwd=None, hook_fns=None, owner=None,
                 preload_note=None):
        self.app_spec = app_spec
        self.preload_note = preload_note    # where the app is imported, and why (config.settle_preload)
        self.owner = owner           # --user/--group: who the workers become (process.Owner), or None
        # Server hooks (hooks.py); cfg also reads as attributes, as hooks expect.
        self.hooks = hooks.Hooks(hook_fns or {}, logger)
        self.worker_age = 0
        # How it was started, for a reload that re-executes it (reexec.py),
        # and what a master before it left, if it is such a re-execution.
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.cwd = cwd or os.getcwd()
        self.inherited = reexec.inherited()
        self.preflight = None
        # systemd (Type=notify): READY=1 once the workers serve, again after
        # each reload; `announce` says one is due.
        self.notifier = notifier or systemd.Notifier({})
        self.announce = True
        self.cfg = hooks.Cfg(cfg)
        self.log = logger
        self.num_workers = cfg["workers"]
        self.lazy = cfg["lazy_apps"]
        self.options = config.server_options(cfg)
        self.access_logger = logs.access_logger(cfg)     # access lines as log records (accessrecords.py)
        self.workers = {}
        self.sig_queue = []
        self.app = None
        self.sockets = []
        self.protocols = []          # what each of them speaks: http or uwsgi (binding.listeners)
        self.backoff = process.Backoff()
        self.stopping = False
        self.pid = os.getpid()
        self.wake_r = self.wake_w = None
        self.threads = cfg["threads"]
        self.balance = cfg["balance"]
        # Worker slots (slots.py): room for a rolling reload (old and new
        # side by side) and some SIGTTIN.
        nslots = min(4096, max(16, 2 * self.num_workers + 8))
        if self.inherited:
            self._keep_layout(self.inherited)
        self.slots = WorkerSlots(nslots, self.threads, self.balance == "least-busy" and self.threads > 1,
                                 logger, inherited=self.inherited and self.inherited["slots"])
        self.offload = None          # the sibling's Supervisor (offload/), with its queue
        self.no_app = None           # why a reloaded master has no app to fork (workers serve on)
        self.served = False          # a worker has served: a failed import no longer stops the server
        self.rss_unreachable_said = False    # workers start over --max-rss: said once (check_memory)
        self.import_check = None     # while no_app: the child trying the import again (reexec.Preflight)
        self.import_retry_at = 0.0
        self.import_delay = 1.0      # doubles up to IMPORT_RETRY_MAX between tries
        self.import_attempts = 0
        # For the stats server (stats.py): workers started per index (its
        # respawns are one less), --timeout kills per index, reloads.
        self.spawns, self.timeouts = Counter(), Counter()
        self.retired_requests = Counter()    # requests served by workers that ended, per index (stats.py)
        self.restarts = Counter()    # workers replaced, by reason (metrics.py)
        self.reloads = 0
        self.code_image = 0          # the code new workers run: each reload's is newer (scoreboard image)
        # --stats and --metrics: sockets the master answers in its loop.
        self.observers = []
        self.app_metrics = None      # the app's prometheus_client files, with --metrics (appmetrics.py)
        self.statsd = None           # --statsd-host: gunicorn's metrics (statsd.py)

    def _on_signal(self, signum, frame):
        if len(self.sig_queue) < 16:
            self.sig_queue.append(signum)

    # ---- main loop -----------------------------------------------------------

    def run(self):
        """Supervise until stopped. Returns the exit status."""
        try:
            self.manage_workers()
            while True:
                self.sleep()
                # Signals first: a stop that arrived with the workers' exits
                # (a signal to the whole process group) must be seen before
                # reaping, or the dead workers would be replaced.
                self.handle_signals()
                self.reap()
                self.check_preflight()
                self.retry_import()
                self.check_memory()
                self.check_timeouts()
                self.check_stopping()
                self.check_due()
                self.check_heartbeats()
                self.manage_workers()
                if self.statsd:
                    self.statsd.tick(self)
                if self.slots.stranded:
                    self.slots.pass_on_stranded(self.stopping)
        except StopServer:
            return 0
        except HaltServer as e:
            self.log.error("%s", e.reason)
            self.stop(graceful=False)
            return e.exit_status
        finally:
            if self.statsd:
                self.statsd.flush(self, gauge=False)        # the last requests, of workers now ended
            self.hooks.call("on_exit", self)
            if self.app_metrics:
                self.app_metrics.close()
            for s in self.sockets:
                s.close()
            for obs in self.observers:
                obs.close()

    STOP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)

    def handle_signals(self):
        """Dispatch every queued signal by name. A stop goes before anything
        else queued with it (a fast stop before a graceful one), and ends
        the loop (StopServer)."""
        while self.sig_queue:
            stops = [sig for sig in self.sig_queue if sig in self.STOP_SIGNALS]
            if stops:
                self.sig_queue.clear()
                fast = [sig for sig in stops if sig != signal.SIGTERM]
                getattr(self, "handle_" + self.SIGNALS[(fast or stops)[0]])()
            sig = self.sig_queue.pop(0)
            getattr(self, "handle_" + self.SIGNALS[sig])()

    def stop_pending(self):
        return self.stopping or any(sig in self.STOP_SIGNALS for sig in self.sig_queue)

    def sleep(self):
        """Wait for a signal, a worker's readiness, or a second; serve the
        --stats and --metrics clients meanwhile (observer.py: never waiting
        for one)."""
        fds = [self.wake_r] + [w.ready_fd for w in self.workers.values() if w.ready_fd is not None]
        timeout = 0.02 if self.slots.stranded else 0.1 if self.preflight else 1.0
        if self.cfg["max_requests"]:
            timeout = min(timeout, 0.2)       # a worker retiring by itself is seen soon (check_stopping)
            if self.replaces_first():
                # One past its limit gets its replacement started soon
                # (check_due): it serves on until that one is ready.
                timeout = min(timeout, DUE_POLL)
        pause = self.backoff.wait()
        if pause:
            timeout = min(timeout, pause)     # "next start in 0.1 s" means that, not the tick
        watchdog = self.notifier.tick()
        if watchdog is not None:
            timeout = min(timeout, max(watchdog, 0.0))
        readable, _ = observer.serve_for(self.observers, timeout, self, read_fds=fds)
        for fd in readable:
            if fd == self.wake_r:
                self.drain_wakeups()
            else:
                self._worker_ready(fd)

    def drain_wakeups(self):
        """Read the signal wake-up pipe empty (the signals are in sig_queue)."""
        try:
            while os.read(self.wake_r, 64):
                pass
        except BlockingIOError:
            pass
    def stop(self, graceful=True):
        """Stop every worker: SIGTERM and wait up to the graceful timeout, or
        SIGQUIT; then SIGKILL whatever is left."""
        self.stopping = True
        self.notifier.stopping()
        for check in (self.preflight, self.import_check):
            if check:
                check.cancel()
        self.preflight = self.import_check = None
        self._close_listeners()
        sig = signal.SIGTERM if graceful else signal.SIGQUIT
        for w in list(self.workers.values()):
            if w.slot is not None:
                self.slots.end(w.slot)      # before the signal: a stop, not a retirement
            self.kill(w.pid, sig)
        limit = (self.cfg["graceful_timeout"] + 1.0) if graceful else 2.0
        deadline = time.monotonic() + limit
        while self.workers and time.monotonic() < deadline:
            self._reap_quietly()
            if graceful and self._fast_stop_asked():
                # SIGINT or SIGQUIT during a graceful stop (an impatient
                # operator, a second Ctrl-C): what is left stops now.
                graceful = False
                for w in list(self.workers.values()):
                    self.kill(w.pid, signal.SIGQUIT)
                deadline = min(deadline, time.monotonic() + 2.0)
            if self.workers:
                self.answer_observers(0.05)     # /healthz says 503 meanwhile
        for w in list(self.workers.values()):
            self.log.warning("Worker %d (pid %d) did not stop in time: killing it", w.index, w.pid)
            self.kill(w.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while self.workers and time.monotonic() < deadline:
            self._reap_quietly()
            time.sleep(0.02)
        self.slots.pass_on_stranded(stopping=True)          # they close
        if self.offload:
            # After the workers (nothing more is produced): the sibling
            # drains the queue within the graceful timeout; what it cannot
            # deliver stays in its journal for the next start.
            self.offload.stop(graceful)
            self.offload.queue.close_out(self.log)

    def _close_listeners(self):
        """A stop: new connections are refused from now on. The workers
        let go of their copies of the listening sockets as their stop
        begins; the master's kept the kernel accepting connections into a
        queue nobody took from, reset when the master exited after the
        drain (behind a proxy, a 502 it cannot retry for a POST; a refused
        connect it retries elsewhere). A socket systemd or a parent passed
        in (LISTEN_FDS, fd://) lives on in their copy. The file of a unix
        socket the master made (--bind unix:PATH) is removed, as gunicorn
        removes it; a passed one's is its owner's."""
        made = {binding.parse(addr)[1] for addr, _ in binding.listeners(self.cfg) if addr.startswith("unix:")}
        for s in self.sockets:
            name = s.getsockname() if s.family == socket.AF_UNIX else None
            if isinstance(name, str) and name in made:          # not an abstract one (bytes)
                with contextlib.suppress(OSError):
                    os.unlink(name)
            s.close()
        self.sockets = []

    def _fast_stop_asked(self):
        """A SIGINT or SIGQUIT queued (taken off the queue, and said)."""
        fast = [sig for sig in self.sig_queue if sig in (signal.SIGINT, signal.SIGQUIT)]
        if not fast:
            return False
        for sig in fast:                 # in place: a handler may append meanwhile
            self.sig_queue.remove(sig)
        self.log.info("Received %s during a graceful stop: stopping now", signal.Signals(fast[0]).name)
        return True

    def answer_observers(self, timeout):
        """Serve --stats and --metrics clients for up to timeout seconds, or
        until a signal comes: a worker's exit (SIGCHLD) ends the wait, so a
        stop takes what the workers take, not the next tick. The signal
        itself stays queued (sig_queue); only the wake-up bytes are read."""
        readable, _ = observer.serve_for(self.observers, timeout, self, read_fds=[self.wake_r])
        if self.wake_r in readable:
            self.drain_wakeups()

    def _reap_quietly(self):
        try:
            self.reap()
        except HaltServer:
            pass

    # ---- signal handlers, by name -------------------------------------------

    def handle_chld(self):
        self.reap()

    def handle_term(self):
        self.log.info("Received SIGTERM: stopping gracefully")
        self.stop(graceful=True)
        raise StopServer

    def handle_int(self):
        self.log.info("Received SIGINT: stopping now")
        self.stop(graceful=False)
        raise StopServer

    def handle_quit(self):
        self.log.info("Received SIGQUIT: stopping now")
        self.stop(graceful=False)
        raise StopServer

    def handle_hup(self):
        # A config file (-c, --ini) may have changed: the master reads it
        # again by re-executing itself, as gunicorn's HUP reloads its
        # configuration. With --lazy-apps and settings only from the command
        # line and the environment, which cannot change, each worker
        # re-imports the app in a rolling reload.
        if not self.lazy or self.cfg["config"] or self.cfg["ini"]:
            self.reload_in_place("SIGHUP")
            return
        self.log.info("Received SIGHUP: rolling reload of %d worker(s), each importing the app afresh "
                      "(--lazy-apps)", self.num_workers)
        self.hooks.call("on_reload", self)
        self.notifier.reloading()
        self.announce = True
        for w in self.workers.values():
            if not w.retiring:
                w.old = True
        self.code_image += 1
        if self.offload:
            self.offload.reload()
        self.manage_workers()

    def handle_ttin(self):
        self.num_workers += 1
        self.hooks.call("nworkers_changed", self, self.num_workers, self.num_workers - 1)
        self.log.info("Received SIGTTIN: %d worker(s)", self.num_workers)
        self.manage_workers()

    def handle_ttou(self):
        if self.num_workers > 1:
            self.num_workers -= 1
            self.hooks.call("nworkers_changed", self, self.num_workers, self.num_workers + 1)
        self.log.info("Received SIGTTOU: %d worker(s)", self.num_workers)
        self.manage_workers()

    def handle_usr2(self):
        self.reload_in_place("SIGUSR2")

    def handle_winch(self):
        self.log.debug("Received SIGWINCH: ignored (not daemonized)")

    def handle_usr1(self):
        """logrotate moved the log files: reopen them here, and tell the
        workers and the offload sibling. Under --user the master makes the
        new files first and gives them to the user, who may not create
        files where root keeps its logs."""
        logs.reopen()
        if self.owner:
            for path in (self.cfg["access_logfile"], self.cfg["error_logfile"]):
                if path and path != "-":
                    try:
                        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644))
                        self.owner.give(os.path.abspath(path))
                    except OSError as e:
                        self.log.error("SIGUSR1: cannot make %s for the workers: %s", path, e.strerror)
        for w in self.workers.values():
            self.kill(w.pid, signal.SIGUSR1)
        if self.offload and self.offload.pid:
            self.kill(self.offload.pid, signal.SIGUSR1)


class StopServer(Exception):
    pass
