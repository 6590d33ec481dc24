"""The master's start-up (a mixin of arbiter.Arbiter): bind the listening
sockets (or take over those of the image before an in-place reload), open
the --stats/--metrics sockets, statsd and the offload queue, preload the
app, then catch signals and say where it listens.
"""
import gc
import os
import signal
import socket
import threading

from . import appload, appmetrics, binding, config, process, statsd
from .settings import BY_NAME
from .server import check_spool_dir


def _observer_kind(name):
    """The server class of --stats or --metrics, imported when one is
    used: most servers have neither, and the two modules cost every start
    ~2 ms."""
    if name == "stats":
        from .stats import StatsServer
        return StatsServer
    from .metrics import MetricsServer
    return MetricsServer


class StartUp:
    """Uses the arbiter's cfg, owner, hooks, slots, inherited state (reexec.py)."""

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
            self._take_sockets(st)
        else:
            self._bind()
        self._open_observers(st)
        if self.cfg["statsd_host"]:
            self._start_statsd(st)
        self._open_offload(st)
        if self.cfg["metrics"]:
            self._start_app_metrics(st)
        if not st:
            check_spool_dir(self.cfg["spool_dir"])
        if self.owner and not st:
            self._check_owner_can_write()
        if st:
            self.served = True
            self._adopt_workers(st)
            self.notifier.tick()      # a watchdog keep-alive before the import, which may take a while
        if not self.lazy:
            self._preload(st)
        self._catch_signals()
        self._say_started(st)

    def _take_sockets(self, st):
        """An in-place reload: the listening sockets of the image before."""
        self.sockets = [socket.socket(fileno=fd) for fd in st["sockets"]]
        self.protocols = st.get("protocols") or ["http"] * len(self.sockets)
        was = {"bind": st.get("bind") or [], "uwsgi_socket": st.get("uwsgi_socket", []),
               "protocol": st.get("protocol", "http")}
        given = [*was["bind"], *(was["uwsgi_socket"] or [])]
        if given and all(b.startswith("fd://") for b in given):
            # Passed in (systemd's LISTEN_FDS, which the image before took):
            # they are what is served, and whose files are never removed.
            self.cfg.update(was)
        elif any(self.cfg[k] != v for k, v in was.items()):
            # The workers that serve on, and the hand-offs between them,
            # number the listening sockets: they stay as they are.
            self.log.warning("reload: --bind changed to %s; a reload keeps the listening sockets (%s): "
                             "a restart applies it",
                             ", ".join(a + (" (uwsgi)" if p == "uwsgi" else "") for a, p in
                                       binding.listeners(self.cfg)),
                             ", ".join(self.urls()))
            self.cfg.update(was)

    def _bind(self):
        """Make the listening sockets of --bind and --uwsgi-socket."""
        for addr, proto in binding.listeners(self.cfg):
            # reuseport: the master only holds the port (bound, not
            # listening, so no connection queues on it); each worker gets a
            # listening socket of its own in the group.
            self.sockets.append(binding.create(addr, self.cfg["backlog"], reuseport=self.balance == "reuseport",
                                               umask=binding.unix_umask(self.cfg["umask"]),
                                               mode=self.cfg["chmod_socket"]))
            self.protocols.append(proto)
            if proto == "uwsgi" and not binding.loopback_only(addr) and \
                    self.cfg["uwsgi_allow_ips"] == BY_NAME["uwsgi_allow_ips"].default:
                # uWSGI takes uwsgi requests from any peer; the variables
                # they carry (REMOTE_ADDR, HTTPS, REMOTE_USER) are trusted,
                # so here only the default peers may: said once, at start.
                self.log.warning("--uwsgi-socket %s listens beyond this machine, but takes uwsgi requests from "
                                 "127.0.0.1 and ::1 only (--uwsgi-allow-from's default): a proxy elsewhere has "
                                 "its connections closed; give its address with --uwsgi-allow-from (uWSGI takes "
                                 "them from anyone)", addr)
            if binding.parse(addr)[0] != "unix":
                continue
            path = binding.describe(self.sockets[-1])[0]
            if self.cfg["chown_socket"] and not path.startswith("@"):      # an abstract one has no file
                # USER[:GROUP] or :GROUP (uWSGI's chown-socket), resolved as --user/--group are.
                name, _, group = self.cfg["chown_socket"].partition(":")
                owner = process.Owner(name or None, group or None)
                try:
                    os.chown(path, owner.uid, owner.gid)
                except OSError as e:
                    raise binding.BindError(f"--chown-socket {self.cfg['chown_socket']}: cannot give {path} to "
                                            f"it: {e.strerror}") from None
            elif self.owner:
                # gunicorn's: a socket it made is the user's, whose clients
                # may be the user's too (the mode: binding.unix_umask); one
                # systemd passed (fd://) is left as it is.
                self.owner.give(path)

    def _open_observers(self, st):
        """The --stats and --metrics sockets: new, or kept from the image
        before an in-place reload (moved, or closed, as the settings say)."""
        kept = dict(st["observers"]) if st else {}
        kept_at = dict(st.get("observer_addrs") or {}) if st else {}
        for name in ("stats", "metrics"):
            fd = kept.pop(name, None)
            if fd is None and not self.cfg[name]:
                continue                 # neither asked for nor kept: its module stays unimported
            kind = _observer_kind(name)
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

    def _start_statsd(self, st):
        # From zero at a start; after an in-place reload, from what the
        # image before sent (None when it had no statsd: from now on).
        self.statsd = statsd.Statsd(self.cfg, self.log, sent=st.get("statsd") if st else {})
        self.log.addHandler(statsd.LogCounter(self.statsd))     # the workers inherit it
        if not st:
            self.log.info("%s", self.statsd.announcement())

    def _open_offload(self, st):
        """The offload queue and its sibling (--offload-sink, or what the
        image before an in-place reload had)."""
        inherited_queue = st and st["offload"]
        if self.cfg["offload_sink"] or inherited_queue:
            # The queue lives as long as the master, so what is queued
            # outlives any worker or sibling (and an in-place reload: its
            # counters are in a memfd). Imported here: most servers never
            # offload, and these modules cost ~20 ms of every start.
            from .offload.queue import OffloadQueue
            from .offload.supervisor import ForkStarter, Supervisor
            ocfg = self.cfg if self.cfg["offload_sink"] else dict(self.cfg, **inherited_queue["cfg"])
            queue = OffloadQueue(ocfg, self.slots.nslots, shared_fd=True, inherited=inherited_queue,
                                 owner=self.owner)
            self.offload = Supervisor(queue, ForkStarter(queue, self._close_in_sibling, self.owner), self.log)
            self.log.info("%s", queue.describe())
            if inherited_queue and inherited_queue["sibling"]:
                self.offload.adopt(inherited_queue["sibling"])      # it hands over to a new one

    def _start_app_metrics(self, st):
        # Before the app imports prometheus_client.
        self.app_metrics = appmetrics.AppMetrics.setup(self.owner)
        if self.app_metrics and not st:
            self.log.info("App metrics: prometheus_client's multiprocess files in %s", self.app_metrics.dir)

    def _preload(self, st):
        """Import the app here, to fork the workers from (not --lazy-apps)."""
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

    def _catch_signals(self):
        """Signals from now on queue for the main loop (arbiter.handle_signals)."""
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)
        # Held across an in-place reload's exec: what arrived meanwhile is
        # delivered now, to the handlers above.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.SIGNALS)

    def _say_started(self, st):
        """The start-up log's summary, and when_ready at a first start."""
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
            from .offload.sinks import sink_file     # loaded already: _open_offload imported the queue
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
        self._close_masters_own()
        for s in self.sockets:
            s.close()
        self.slots.close_all()
