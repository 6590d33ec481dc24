"""The master process: binds, preloads, forks workers and supervises them.

The model is gunicorn's arbiter, so operators need not relearn anything:
signals are queued by the handler and dispatched by name from the main loop
(handle_term, handle_hup, ...), never acted on inside the handler.

- SIGTERM: graceful stop (workers finish in-flight requests within
  --graceful-timeout, then anything left is killed).
- SIGINT, SIGQUIT: fast stop.
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
import gc
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections import Counter

from . import (appload, appmetrics, binding, config, hooks, logs, metrics, observer, process, reexec, stats, statsd,
               systemd, worker)
from .offload.queue import OffloadQueue
from .offload.sinks import sink_file
from .offload.supervisor import ForkStarter, Supervisor
from .server import check_spool_dir
from .slots import WorkerSlots

log = logging.getLogger("forkwsgi")


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
        self.timeout_held = False    # past --timeout, kept because no replacement can start
        self.max_requests = 0        # its own --max-requests (jitter included)
        self.due = False             # --lazy-apps: past it, replaced once a new one serves (check_due)


class Arbiter(reexec.InPlaceReload, hooks.GunicornServer):
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

    # ---- start-up ----------------------------------------------------------

    def start(self):
        """Bind (or take over what the master before an in-place reload
        held) and preload. Raises binding.BindError / appload.AppImportError."""
        process.set_title("forkwsgi: master")
        if not self.inherited:
            # gunicorn's order: the number of workers is first set (None ->
            # N), then on_starting.
            self.hooks.call("nworkers_changed", self, self.num_workers, None)
            self.hooks.call("on_starting", self)
        if self.cfg["master_nice"]:
            os.setpriority(os.PRIO_PROCESS, 0, self.cfg["master_nice"])
        st = self.inherited
        if st:
            self.sockets = [socket.socket(fileno=fd) for fd in st["sockets"]]
            self.protocols = st.get("protocols") or ["http"] * len(self.sockets)
            was = {"bind": st.get("bind") or [], "uwsgi_socket": st.get("uwsgi_socket", []),
                   "protocol": st.get("protocol", "http")}
            if any(self.cfg[k] != v for k, v in was.items()) and not all(b.startswith("fd://") for b in was["bind"]):
                # The workers that serve on, and the hand-offs between them,
                # number the listening sockets: they stay as they are.
                self.log.warning("reload: --bind changed to %s; a reload keeps the listening sockets (%s): "
                                 "a restart applies it",
                                 ", ".join(a + (" (uwsgi)" if p == "uwsgi" else "") for a, p in
                                           binding.listeners(self.cfg)),
                                 ", ".join(self.urls()))
                self.cfg.update(was)
        for addr, proto in ([] if st else binding.listeners(self.cfg)):
            # reuseport: the master only holds the port (bound, not
            # listening, so no connection queues on it); each worker gets a
            # listening socket of its own in the group.
            self.sockets.append(binding.create(addr, self.cfg["backlog"], reuseport=self.balance == "reuseport",
                                               umask=binding.unix_umask(self.cfg["umask"]),
                                               mode=self.cfg["chmod_socket"]))
            self.protocols.append(proto)
            if self.owner and binding.parse(addr)[0] == "unix":
                # gunicorn's: a socket it made is the user's, whose clients
                # may be the user's too (the mode: binding.unix_umask); one
                # systemd passed (fd://) is left as it is.
                self.owner.give(binding.describe(self.sockets[-1])[0])
        kept = dict(st["observers"]) if st else {}
        kept_at = dict(st.get("observer_addrs") or {}) if st else {}
        for name, kind in (("stats", stats.StatsServer), ("metrics", metrics.MetricsServer)):
            fd = kept.pop(name, None)
            if fd is not None and self.cfg[name] and self.cfg[name] != kept_at.get(name, self.cfg[name]):
                # Moved by a reload: nothing else depends on this socket, so
                # the new address is taken now (the old one, if that fails).
                try:
                    server = kind(self.cfg[name])
                except (OSError, binding.BindError) as e:
                    self.log.error("reload: --%s %s: %s; keeping %s", name, self.cfg[name], e, kept_at[name])
                    self.cfg[name] = kept_at[name]
                else:
                    os.close(fd)
                    fd = None
                    self.observers.append(server)
                    self.log.info("reload: --%s moved from %s; %s", name, kept_at[name], server.announcement())
                    continue
            if self.cfg[name]:
                server = kind(self.cfg[name], socket.socket(fileno=fd) if fd is not None else None)
                self.observers.append(server)
                if fd is None:
                    self.log.info("%s", server.announcement())
            elif fd is not None:
                os.close(fd)                  # dropped from the settings by a reload
        if self.cfg["statsd_host"]:
            # From zero at a start; after an in-place reload, from what the
            # image before sent (None when it had no statsd: from now on).
            self.statsd = statsd.Statsd(self.cfg, self.log, sent=st.get("statsd") if st else {})
            self.log.addHandler(statsd.LogCounter(self.statsd))     # the workers inherit it
            if not st:
                self.log.info("%s", self.statsd.announcement())
        inherited_queue = st and st["offload"]
        if self.cfg["offload_sink"] or inherited_queue:
            # The queue lives as long as the master, so what is queued
            # outlives any worker or sibling (and an in-place reload: its
            # counters are in a memfd).
            ocfg = self.cfg if self.cfg["offload_sink"] else dict(self.cfg, **inherited_queue["cfg"])
            queue = OffloadQueue(ocfg, self.slots.nslots, shared_fd=True, inherited=inherited_queue,
                                 owner=self.owner)
            self.offload = Supervisor(queue, ForkStarter(queue, self._close_in_sibling, self.owner), self.log)
            self.log.info("%s", queue.describe())
            if inherited_queue and inherited_queue["sibling"]:
                self.offload.adopt(inherited_queue["sibling"])      # it hands over to a new one
        if self.cfg["metrics"]:
            # Before the app imports prometheus_client.
            self.app_metrics = appmetrics.AppMetrics.setup(self.owner)
            if self.app_metrics and not st:
                self.log.info("App metrics: prometheus_client's multiprocess files in %s", self.app_metrics.dir)
        if not st:
            check_spool_dir(self.cfg["spool_dir"])
        if self.owner and not st:
            self._check_owner_can_write()
        if st:
            self.served = True
            self._adopt_workers(st)
            self.notifier.tick()      # a watchdog keep-alive before the import, which may take a while
        if not self.lazy:
            try:
                self.app = self.import_app()
            except Exception as e:
                if not st:
                    raise
                # The check before the exec passed, the import now fails (the
                # code changed again meanwhile): the workers serve on.
                self.hold_for_import(appload.describe_error(e))
                self.log.error("reload: the app does not import: %s; the %d running worker(s) serve on with "
                               "the code they have and do not retire by themselves (--max-requests, --max-rss) "
                               "meanwhile; the import is tried again in %.0f s (or fix it and send SIGHUP)",
                               self.no_app, len(self.workers), self.import_delay)
            # Objects made so far (the app, its imports) stay out of the
            # collector's reach, so the workers share their pages instead of
            # copying them when a collection touches them.
            gc.collect()
            gc.freeze()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)
        # Held across an in-place reload's exec: what arrived meanwhile is
        # delivered now, to the handlers above.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.SIGNALS)
        for url in self.urls():
            self.log.info("Listening at: %s", url)
        self.log.info("Master %d: %d worker(s) x %d thread(s), balance %s, %s", self.pid,
                      self.num_workers, self.threads, self.balance,
                      "app loaded per worker (--lazy-apps)" if self.lazy else "app preloaded")
        if self.preload_note:
            self.log.info("%s", self.preload_note)
        if not st:
            self.hooks.call("when_ready", self)
        if st:
            self.log.info("Reloaded in place (same PID %d): %d running worker(s) taken over; %s", self.pid,
                          len(self.workers), "they serve on (no new code)" if self.no_app else
                          "each retires once a new one is ready")

    def import_app(self):
        """Import the app here, before forking (preload). A thread its import
        starts (a metrics exporter, a scheduler) runs in the master only:
        fork() copies the calling thread alone, so no worker has it. Said
        in the log, naming them, since the app then misses it silently."""
        before = set(threading.enumerate())
        app = appload.load(self.app_spec)
        started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if started:
            self.log.warning("the app's import started %d thread(s) (%s): they run in the master only, not in "
                             "the workers, which are forked without them; to have them in each worker, import "
                             "the app there: --lazy-apps (gunicorn: preload_app = False)", len(started),
                             ", ".join(repr(t.name) for t in started))
        return app

    def urls(self):
        """The listening sockets, printable (binding.describe)."""
        return [binding.describe(s, p)[2] for s, p in zip(self.sockets, self.protocols)]

    def discard(self):
        """start() failed: remove what it made that would outlive us (the
        app metrics' directory)."""
        if self.app_metrics:
            self.app_metrics.close()

    def _check_owner_can_write(self):
        """--user: what its processes write in is usable by it (a parent
        directory closed to it, a --spool-dir of root's): one line now, not
        a 500 for every request that spools a body or counts a metric, or a
        sibling that dies at every start."""
        dirs = os.W_OK | os.X_OK
        wanted = [(self.cfg["spool_dir"], dirs, "--spool-dir")] if self.cfg["spool_dir"] else []
        if self.app_metrics:
            wanted.append((self.app_metrics.dir, dirs, "the app metrics' directory (PROMETHEUS_MULTIPROC_DIR)"))
        if self.offload:
            ocfg = self.offload.queue.cfg
            wanted.append((ocfg["offload_dir"], dirs, "--offload-dir"))
            if sink_file(ocfg["offload_sink"]):
                wanted.append((sink_file(ocfg["offload_sink"]), os.W_OK, "the --offload-sink file"))
        bad = self.owner.unusable([(path, mode) for path, mode, _ in wanted])
        if bad:
            raise config.ConfigError("; ".join(f"{what} {path}: uid {self.owner.uid} gid {self.owner.gid} "
                                               "(--user/--group) cannot write there"
                                               for path, _, what in wanted if path in bad))

    def _close_in_sibling(self):
        """In the forked sibling: close what belongs to the master."""
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for obs in self.observers:
            obs.close()
        for w in self.workers.values():
            if w.ready_fd is not None:
                os.close(w.ready_fd)
        for s in self.sockets:
            s.close()
        self.slots.close_all()

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
        watchdog = self.notifier.tick()
        if watchdog is not None:
            timeout = min(timeout, max(watchdog, 0.0))
        readable, _ = observer.serve_for(self.observers, timeout, self, read_fds=fds)
        for fd in readable:
            if fd == self.wake_r:
                try:
                    while os.read(self.wake_r, 64):
                        pass
                except BlockingIOError:
                    pass
            else:
                self._worker_ready(fd)

    def _worker_ready(self, fd):
        w = next((w for w in self.workers.values() if w.ready_fd == fd), None)
        try:
            data = os.read(fd, 1)
        except OSError:
            data = b""
        os.close(fd)
        if w is None:
            return
        w.ready_fd = None
        if not data:
            return            # it died before it was ready: reap() tells why
        w.ready = True
        w.ready_at = time.monotonic()
        self.served = True
        self.log.debug("worker %d (pid %d) ready", w.index, w.pid)
        old = [o for o in self.workers.values() if o.old and not o.retiring]
        if old and not w.old:   # rolling reload: one old worker out for each new one in
            # (not for an old one that comes ready late: a reload sent while
            # it was still booting must not retire its peer for nothing)
            o = min(old, key=lambda o: (not o.due, o.index))
            self.retire(o, "max_requests" if o.due else "reload")
        self.announce_ready()

    def announce_ready(self):
        """Tell systemd the server is ready once every worker of the current
        set serves (at start, and at the end of each reload)."""
        current = [w for w in self.workers.values() if not w.old and not w.retiring]
        if self.announce and len(current) >= self.num_workers and all(w.ready for w in current):
            self.announce = False
            urls = ", ".join(self.urls())
            self.notifier.ready(f"{len(current)} worker(s) serving {urls}")

    # ---- workers -------------------------------------------------------------

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
            for w in sorted(current, key=lambda w: -w.index)[:len(current) - self.num_workers]:
                self.retire(w, "scale_down")
        elif len(current) < self.num_workers and self.backoff.due() and not self.no_app:
            used = {w.index for w in current}
            for index in range(1, self.num_workers + 1):
                if index not in used and len(used) < self.num_workers:
                    if not self.spawn(index):
                        break
                    used.add(index)

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
        if self.lazy and options["max_requests"]:
            # With --lazy-apps the master has no app to fork a replacement
            # from: one that cannot import the code now on disk would leave
            # none. So it does not retire by itself at --max-requests; the
            # master starts its replacement, and retires it once that one
            # serves (check_due).
            self.slots.hold(slot, True)
        ofl = self.offload.queue.producer_options(slot) if self.offload else None
        sockets = self.sockets
        if self.balance == "reuseport":
            sockets = [binding.reuseport_peer(s, self.cfg["backlog"]) for s in self.sockets]
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
                self._run_worker(index, slot, sockets, options, w, status, counters, balance, ofl, hw)
        status.release()
        counters.release()
        if sockets is not self.sockets:
            for s in sockets:
                s.close()              # the worker's own now: its queue dies with it
        os.close(w)
        self.workers[pid] = WorkerInfo(pid, index, r)
        self.workers[pid].max_requests = options["max_requests"]
        hw.pid, hw.ppid = pid, self.pid
        hw.count_requests(lambda: self.slots.counters(slot)["requests"])
        self.workers[pid].hook_worker = hw
        self.spawns[index] += 1
        self.workers[pid].slot = slot
        self.log.info("Booted worker %d (pid %d)", index, pid)
        return True

    def _run_worker(self, index, slot, sockets, options, ready_fd, status, counters, balance, ofl, hw):
        """In the forked worker: close what belongs to the master, then run."""
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for obs in self.observers:
            obs.close()
        for other in self.workers.values():
            if other.ready_fd is not None:
                os.close(other.ready_fd)
        self.slots.keep_only(slot)
        if self.offload:
            self.offload.queue.close_in_child()     # the hold on --offload-dir is the master's
        if sockets is not self.sockets:
            for s in self.sockets:
                s.close()          # the master's placeholders
        self.hooks.call("post_fork", self, hw.in_child())
        # wsgi.multiprocess: true when the app may run in several processes at once.
        worker.run(worker.Setup(index, self.pid, sockets, self.app, self.app_spec, options, ready_fd,
                                protocols=self.protocols,
                                nice=self.cfg["worker_nice"], multiprocess=self.num_workers > 1,
                                status=status, stats=counters, balance=balance, offload=ofl,
                                hooks=self.hooks, hook_worker=hw, master=self, owner=self.owner,
                                access_logger=self.access_logger), self.log)

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
                os.close(w.ready_fd)
            if w.slot is not None and not w.retiring and w.ready and self.slots.states()[w.slot] == "draining":
                # It retired by itself before check_stopping saw it.
                w.retiring = True
                w.retire_reason = self.self_retire_reason()
            if w.slot is not None:
                self.retired_requests[w.index] += self.slots.counters(w.slot)["requests"]
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
            if code == worker.WORKER_BOOT_ERROR and not w.ready:
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
            if code == 0 and w.ready:
                # It retired by itself (--max-requests): not a crash.
                self.log.info("Worker %d (pid %d) retired%s", w.index, pid, "" if self.no_app else "; replacing it")
                self.restarts["max_requests"] += 1
                continue
            self.restarts["crash"] += 1
            serving = self.requests_in_app(w)
            self.log.warning("Worker %d (pid %d) died (%s)%s%s", w.index, pid, how,
                             f" while serving {serving}" if serving else "",
                             "" if self.no_app else "; replacing it")
            if self.backoff.died(w.started, w.ready):
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

    def lost_the_app(self, w):
        """A new worker could not import the app (--lazy-apps: the code on
        disk broke after the server started). Stopping would take the
        running workers down too: they serve on, none retires by itself,
        and the import is tried again (retry_import), as after a reload
        whose new image does not import."""
        self.hold_for_import(f"worker {w.index} could not import the app {self.app_spec!r} (its error is above)")
        serving = sum(1 for x in self.workers.values() if x.ready and not x.retiring)
        self.log.error("%s: the %d running worker(s) serve on with the code they have and do not retire by "
                       "themselves meanwhile; the import is tried again in %.0f s (or fix it and send SIGHUP)",
                       self.no_app, serving, max(0.0, self.import_retry_at - time.monotonic()))

    def hold_for_import(self, why):
        """No app to fork from (why): the workers that serve keep serving
        (none is replaced as old, none retires by itself) and the import is
        tried again (retry_import), from now on if not already."""
        if not self.no_app:
            self.import_retry_at = time.monotonic() + self.import_delay
        self.no_app = why
        for x in self.workers.values():
            if not x.retiring:
                x.old = False
        self.hold_workers(True)

    def hold_workers(self, on):
        """Ask every worker not to retire by itself while on (the master
        could not replace it), or let them again."""
        for w in self.workers.values():
            if w.slot is not None:
                self.slots.hold(w.slot, on)

    IMPORT_RETRY_MAX = 30.0

    def retry_import(self):
        """A reloaded master whose app did not import tries again, with a
        growing pause: in a child first (an import that hangs must not hang
        the master). Once it imports, the master re-executes itself in place:
        new workers start and the ones kept serving retire one by one, as in
        a reload."""
        if not self.no_app or self.stop_pending():
            return
        if self.import_check is None:
            if time.monotonic() >= self.import_retry_at:
                self.import_check = reexec.Preflight(self.argv, self.cwd)
            return
        result = self.import_check.result()
        if result is None:
            return
        self.import_check = None
        self.import_attempts += 1
        ok, output = result
        if not ok:
            self.no_app = output.splitlines()[-1] if output else "(no output)"
            self.import_delay = min(self.import_delay * 2, self.IMPORT_RETRY_MAX)
            self.import_retry_at = time.monotonic() + self.import_delay
            self.log.error("the app still does not import (try %d): %s; the workers of the code before serve "
                           "on; next try in %.0f s", self.import_attempts, self.no_app, self.import_delay)
            return
        if not self.same_layout(output):
            self.import_retry_at = time.monotonic() + self.IMPORT_RETRY_MAX
            return
        # Not imported here: modules of the failed tries are still in
        # sys.modules, and would mix old code with new. A fresh image
        # imports it all, as on any reload.
        self.log.info("the app imports now (try %d): the master re-executes itself in place, then new "
                      "workers start and each worker of the code before retires once a new one is ready",
                      self.import_attempts)
        self.re_execute()

    def requests_in_app(self, w):
        """What w's app threads were serving, from its status slots (until
        its replacement takes them): "'GET /a' (app thread 0), ...", or ""."""
        if w.slot is None:
            return ""
        return ", ".join(f"{line!r} (app thread {t})" for t, _, line in self.slots.serving(w.slot))

    def check_timeouts(self):
        """--timeout: a worker stuck in one call into the app is replaced; its
        request line and every thread's Python stack go to the log first."""
        limit = self.cfg["timeout"]
        if not limit:
            return
        now = time.monotonic_ns()
        for w in list(self.workers.values()):
            if w.retiring or not w.ready or w.slot is None:
                continue
            stuck = [(began, t, line) for t, began, line in self.slots.serving(w.slot)
                     if (now - began) / 1e9 > limit]
            if not stuck:
                continue
            began, t, line = min(stuck)
            if self.no_app:
                # No app to start a replacement with: retiring it would take
                # its capacity away for good. It serves on, on its other
                # threads; its stack is logged once.
                if not w.timeout_held:
                    w.timeout_held = True
                    self.log.error("Worker %d (pid %d): %.1f s in %r on app thread %d (--timeout %g), but the "
                                   "app does not import, so it cannot be replaced: it serves on; its Python "
                                   "stacks follow", w.index, w.pid, (now - began) / 1e9, line, t, limit)
                    self.kill(w.pid, signal.SIGUSR2)
                continue
            self.log.error("Worker %d (pid %d) timed out: %.1f s in %r on app thread %d (--timeout %g); "
                           "its Python stacks follow; it takes no more requests, its other requests get "
                           "--graceful-timeout %g s to finish, and a new worker replaces it", w.index, w.pid,
                           (now - began) / 1e9, line, t, limit, self.cfg["graceful_timeout"])
            for h in self.log.handlers:
                h.flush()
            self.kill(w.pid, signal.SIGUSR2)       # faulthandler writes the stack to stderr
            self.timeouts[w.index] += 1
            # As any retirement: no new work, idle connections handed on, the
            # requests in flight on its other threads finish; the stuck one
            # ends with the worker (check_stopping).
            self.retire(w, "timeout")

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
                    w.retiring = True
                    w.retire_reason = self.self_retire_reason()
                    self.log.info("Worker %d (pid %d) retires (%s); starting its replacement", w.index, w.pid,
                                  self.SELF_RETIRED[w.retire_reason])
            if w.stopping_since is None or w.killed:
                continue
            if now - w.stopping_since > 2 * self.cfg["graceful_timeout"] + 1.0:
                serving = self.requests_in_app(w)
                self.log.warning("Worker %d (pid %d) did not stop within --graceful-timeout %g s%s: killing it",
                                 w.index, w.pid, self.cfg["graceful_timeout"],
                                 f" (still in {serving})" if serving else " (nor its atexit handlers)")
                w.killed = True
                self.kill(w.pid, signal.SIGKILL)

    def check_due(self):
        """--lazy-apps with --max-requests: a worker past its limit keeps
        serving while its replacement starts (marked old, as in a rolling
        reload); it retires once the replacement is ready. If that one
        cannot import the app, the old one serves on (lost_the_app)."""
        if not (self.lazy and self.cfg["max_requests"]) or self.no_app:
            return
        for w in self.workers.values():
            if w.due or w.old or w.retiring or not w.ready or w.slot is None or not w.max_requests:
                continue
            served = self.slots.counters(w.slot)["requests"]
            if served >= w.max_requests:
                w.due = w.old = True
                self.log.info("Worker %d (pid %d) served %d requests (--max-requests %d): starting its "
                              "replacement; it retires once that one serves", w.index, w.pid, served,
                              w.max_requests)

    SELF_RETIRED = {"max_requests": "--max-requests", "app_exit": "the app called sys.exit()"}

    def self_retire_reason(self):
        """Why a worker stops by itself: --max-requests, when set, or else
        the app's sys.exit() (the worker says only that it drains)."""
        return "max_requests" if self.cfg["max_requests"] else "app_exit"

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
        page = os.sysconf("SC_PAGE_SIZE")
        for w in list(self.workers.values()):
            if w.retiring or not w.ready:
                continue
            try:
                with open(f"/proc/{w.pid}/statm") as f:
                    rss_mib = int(f.read().split()[1]) * page / (1 << 20)
            except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
                continue
            if rss_mib > limit and self.no_app:
                if not w.rss_held:
                    w.rss_held = True
                    self.log.warning("Worker %d (pid %d) uses %.0f MiB > --max-rss %d, but the app does not "
                                     "import: it serves on until a new worker can replace it", w.index, w.pid,
                                     rss_mib, limit)
            elif rss_mib > limit:
                self.log.warning("Worker %d (pid %d) uses %.0f MiB > --max-rss %d: recycling it",
                                 w.index, w.pid, rss_mib, limit)
                self.retire(w, "max_rss")

    def stop(self, graceful=True):
        """Stop every worker: SIGTERM and wait up to the graceful timeout, or
        SIGQUIT; then SIGKILL whatever is left."""
        self.stopping = True
        self.notifier.stopping()
        for check in (self.preflight, self.import_check):
            if check:
                check.cancel()
        self.preflight = self.import_check = None
        sig = signal.SIGTERM if graceful else signal.SIGQUIT
        for w in list(self.workers.values()):
            self.kill(w.pid, sig)
        limit = (self.cfg["graceful_timeout"] + 1.0) if graceful else 2.0
        deadline = time.monotonic() + limit
        while self.workers and time.monotonic() < deadline:
            self._reap_quietly()
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

    def answer_observers(self, timeout):
        """Serve --stats and --metrics clients for up to timeout seconds."""
        if not self.observers:
            time.sleep(timeout)
            return
        observer.serve_for(self.observers, timeout, self)

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
