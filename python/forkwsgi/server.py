"""The embedding API: Server objects and run().

A Server binds its sockets when created (so errors show at once), then
serve() runs the C loop on the calling thread until stop(). Several servers
may live in one process, each serving on its own thread; there is no
module-level state.
"""
import contextlib
import logging
import os
import signal
import socket
import sys
import threading

from . import _forkwsgi, accesslog, accessrecords, binding, config
from ._version import __version__

log = logging.getLogger("forkwsgi")

BALANCE = {
    "least-busy": _forkwsgi.BALANCE_LEAST_BUSY,
    "reuseport": _forkwsgi.BALANCE_REUSEPORT,
    "shared": _forkwsgi.BALANCE_SHARED,
}


def check_spool_dir(path):
    """--spool-dir must be a directory this process can make files in: one
    line at start, not a 500 for every request whose body spools."""
    if path and not (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        why = "does not exist" if not os.path.exists(path) else \
            "is not a directory" if not os.path.isdir(path) else "is not writable (read-only, or permissions)"
        raise config.ConfigError(f"--spool-dir {path}: {why}")


def _settings(bind, host, port, options):
    """The registry's settings of a Server: `options`, with the addresses
    given as bind (one or a list) or host/port."""
    if bind is not None and isinstance(bind, str):
        bind = [bind]
    if host is not None or port is not None:
        bind = list(bind or []) + [address(host, port)]
    settings = config.resolve(options)
    if bind:
        settings["bind"] = list(bind)
    elif settings["uwsgi_socket"]:
        settings["bind"] = []          # the uwsgi sockets alone: no default HTTP address
    return settings


def _base_environ(settings, multiprocess, offload):
    """What every request's environ starts from."""
    base = {
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": settings["url_scheme"],
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": settings["threads"] > 1,
        "wsgi.multiprocess": bool(multiprocess),
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,
        "wsgi.file_wrapper": _forkwsgi.FileWrapper,
        "SCRIPT_NAME": "",
        "SERVER_SOFTWARE": f"forkwsgi/{__version__}",
    }
    if offload:
        base["forkwsgi.offload"] = _forkwsgi.offload
    return base


def _core_settings(settings, balance, release_listeners):
    """The settings of the C loop, by their registry names:
    _forkwsgi.CORE_SETTINGS (src/_forkwsgi.pyx) says where each lands."""
    core = {name: settings[name] for name in (*_forkwsgi.CORE_SETTINGS, "spool_dir", "secure_scheme_headers",
                                              "forwarded_proto")
            if settings[name] is not None}
    # A lone server has no peers: least-busy then just stops watching its
    # listeners while every app thread is busy (connections wait in the
    # kernel's queue, not in ours); the master passes the shared parts.
    core["balance"] = BALANCE[settings["balance"]]
    core.update(balance or {})
    # A worker lets go of the listening sockets as soon as it stops (its
    # master holds them; without a master the port is then free).
    core["release_listeners"] = bool(release_listeners)
    return core


class Server:
    """Serve `app` on `bind` addresses (or host/port, or ready sockets).

    Options are the settings of ``forkwsgi --help`` by their Python names
    (keepalive, header_timeout, limit_request_body, ...).
    """

    def __init__(self, app, bind=None, *, host=None, port=None, sockets=None, logger=None,
                 _multiprocess=False, _status=None, _stats=None, _balance=None, _offload=False, _offload_host=None,
                 _release_listeners=False, _access_log_fd=None, _name="forkwsgi", _unix_umask=None,
                 _access_logger=None, _protocols=None, **options):
        if not callable(app):
            raise TypeError("app must be a WSGI callable")
        self.settings = _settings(bind, host, port, options)
        if self.settings["root_path"]:
            app = mounted(app, self.settings["root_path"])
        self.log = logger or log
        check_spool_dir(self.settings["spool_dir"])
        self._own_sockets = sockets is None
        # Offload without a master: this process holds the queue and
        # supervises the sibling (offload/supervisor.py: Host); it lives as
        # long as the server, unless the caller made it (and then stops it).
        self._offload_host = None
        if self.settings["offload_sink"] and _offload_host is None:
            from .offload.supervisor import Host     # here: most servers never offload, and it costs ~20 ms to import
            self._offload_host = Host(self.settings, self.log)
        _offload = _offload or _offload_host is not None or self._offload_host is not None
        if sockets is None:
            sockets, _protocols = self._bind(_unix_umask)
        self.sockets = list(sockets)
        # What each socket speaks: given with the sockets (a worker's, from
        # its master), else what --protocol says.
        self.protocols = list(_protocols) if _protocols is not None else [self.settings["protocol"]] * len(sockets)
        if len(self.protocols) != len(self.sockets):
            self.close()
            raise ValueError("_protocols: one protocol per socket")
        described = [binding.describe(s, p) for s, p in zip(self.sockets, self.protocols)]
        self.urls = [d[2] for d in described]
        base = _base_environ(self.settings, _multiprocess, _offload)
        core = _core_settings(self.settings, _balance, _release_listeners)
        self._access_records = None
        try:
            access_fd = self._access_log(core, _access_logger, _access_log_fd)
            try:
                self._core = _forkwsgi.Server(
                    app, [s.fileno() for s in self.sockets], base, [(d[0], d[1]) for d in described],
                    self.log, status=_status, stats=_stats, thread_name=_name,
                    uwsgi=[i for i, p in enumerate(self.protocols) if p == "uwsgi"], **core)
            finally:
                if access_fd is not None:
                    os.close(access_fd)
        except BaseException:
            self.close()
            raise
        finally:
            if self._access_records:
                self._access_records.close_write_end()      # the C writer has its own copy
        self._stopped = threading.Event()

    def _bind(self, umask):
        """The sockets of --bind and --uwsgi-socket, made here, and what
        each speaks. One that fails: those made are closed (and the
        sibling stopped) before the error goes on."""
        sockets = []
        listeners = binding.listeners(self.settings)
        try:
            for addr, _ in listeners:
                sockets.append(binding.create(addr, self.settings["backlog"], umask=umask,
                                              mode=self.settings["chmod_socket"]))
        except Exception:
            for s in sockets:
                s.close()
            self._stop_offload()
            raise
        return sockets, [proto for _, proto in listeners]

    def _access_log(self, core, access_logger, access_log_fd):
        """The access log's spec into `core`: records to the access logger
        a logging configuration set up (accessrecords.py), or lines to the
        file. Returns the descriptor to close once the core has its copy
        (None: none); closes it itself if this fails."""
        if not access_logger and not self.settings["access_logfile"]:
            return None
        access_fd = access_log_fd
        try:
            if access_logger:                   # the descriptor, opened for the file, is not needed
                self._access_records = accessrecords.AccessRecords(access_logger, self.settings)
                core["access_log"] = self._access_records.spec()
                return access_fd
            # The C writer keeps a copy of this descriptor (and reopens
            # the file by its path on SIGUSR1).
            if access_fd is None:
                try:
                    access_fd = accesslog.open_file(self.settings["access_logfile"])
                except OSError as e:
                    raise config.ConfigError(f"--access-logfile {self.settings['access_logfile']}: "
                                             f"{e.strerror}") from None
            core["access_log"] = accesslog.spec(self.settings, access_fd)
            return access_fd
        except BaseException:
            if access_fd is not None:
                os.close(access_fd)
            raise

    def stats(self):
        """Counters of this server: connections, requests, in-flight, accepted, hand-offs."""
        return self._core.stats()

    @property
    def addresses(self):
        return [s.getsockname() for s in self.sockets]

    def start_threads(self):
        """Start the app threads (--threads > 1) before serve(): ready means
        able to serve. OSError if they cannot start."""
        self._core.start_threads()

    def serve(self, announce=True):
        """Run until stop(). Returns normally after a stop; re-raises
        KeyboardInterrupt/SystemExit raised by the app or a signal handler."""
        if announce:
            for url in self.urls:
                self.log.info("Listening at: %s", url)
        wake_r = wake_w = None
        old_wakeup = old_sigpipe = None
        if threading.current_thread() is threading.main_thread():
            # Python runs signal handlers only when asked; with a wakeup fd in
            # the loop a signal that lands while the loop is busy is still
            # handled at once, not at the next EINTR.
            wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
            # SIGPIPE stays ignored while serving, as Python sets it: an app
            # that set it back to its default (command-line code does, so
            # that `prog | head` ends quietly) would otherwise die of a
            # client's reset, sendfile() having no MSG_NOSIGNAL.
            old_sigpipe = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            self._core.serve(wake_r if wake_r is not None else -1)
        finally:
            # The access log's last lines are written now (a worker exits
            # soon after), and its thread ends; a later serve() has none.
            counts = self._core.close_access_log()
            if self._access_records:
                self._access_records.join(5.0)          # its last records, before the worker exits
            if counts and (counts["dropped"] or counts["write_errors"]):
                where = (f"records to logger {self._access_records.logger.name!r}" if self._access_records
                         else self.settings["access_logfile"])
                self.log.warning("access log %s: %d of %d line(s) dropped, %d write error(s)", where,
                                 counts["dropped"], counts["responses"], counts["write_errors"])
            if wake_r is not None:
                signal.set_wakeup_fd(old_wakeup)
                signal.signal(signal.SIGPIPE, old_sigpipe if old_sigpipe is not None else signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
            self._stopped.set()
            if announce:
                self.log.info("Stopped serving %s", ", ".join(self.urls))

    def reopen_logs(self):
        """Reopen the access log file (SIGUSR1, after logrotate moved it)."""
        self._core.reopen_logs()

    def stop(self, graceful=True):
        """Stop serving: gracefully (finish in-flight requests within the
        graceful timeout, close idle connections) or at once. Safe from any
        thread and from signal handlers."""
        self._core.stop(graceful=graceful)

    def _retire(self):
        """Stop gracefully while other workers serve on: idle connections are
        handed to them instead of closed (a pre-forked worker's SIGTERM
        sent to it alone: worker.py). Safe from any thread and from signal
        handlers."""
        self._core.retire()

    def close(self):
        """Close the sockets (if the server made them) and, with offload, let
        the sibling drain and stop."""
        if self._own_sockets:
            for s in self.sockets:
                s.close()
        self.sockets = []
        self._stop_offload()

    def _stop_offload(self):
        host, self._offload_host = self._offload_host, None
        if host is not None:
            host.stop(graceful=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def mounted(app, prefix):
    """--root-path: the app mounted under `prefix` behind a proxy that passes
    the full path: SCRIPT_NAME is the prefix, PATH_INFO what follows it
    (a path outside the prefix is passed as it is). One Python call per
    request, only when the setting is used."""
    n = len(prefix)

    def app_under_prefix(environ, start_response):
        path = environ["PATH_INFO"]
        environ["SCRIPT_NAME"] = prefix
        if path.startswith(prefix) and (len(path) == n or path[n] == "/"):
            environ["PATH_INFO"] = path[n:]
        return app(environ, start_response)

    return app_under_prefix


def address(host, port):
    """A --bind address from bjoern's (host, port): "unix:/path" (port
    unused) or a TCP host (an IPv6 one in brackets), 127.0.0.1 and 8000 by
    default."""
    h = host or "127.0.0.1"
    if h.startswith("unix:"):
        return h
    p = 8000 if port is None else port
    return f"[{h}]:{p}" if ":" in h and not h.startswith("[") else f"{h}:{p}"


# bjoern's listen(app, host, port) then run(): listen() binds (errors show
# there) and returns the socket; run() without an app serves it. Nothing
# of the C loop is made before run(): a process may fork between the two
# (bjoern's pre-fork pattern), and each child then runs a loop of its own
# on the socket it inherited. One per process, as in bjoern.
_listened = []


def listen(app, host=None, port=None, reuse_port=False, listen_backlog=None, **options):
    """bjoern.listen: bind now and return the listening socket; run()
    serves it. reuse_port sets SO_REUSEPORT (TCP), so that independent
    processes may each listen on the port (the kernel spreads the
    connections); listen_backlog is --backlog."""
    if not callable(app):
        raise TypeError("app must be a WSGI callable")
    if _listened:
        raise RuntimeError("listen() was called already: one server per process (as in bjoern)")
    options = _bjoern_options(options, listen_backlog)
    settings = _settings(None, host, port, options)          # a bad option fails here, as bjoern's
    sock = bjoern_socket(address(host, port), settings["backlog"], reuse_port)
    _listened.append((sock, app, options))
    return sock


def bjoern_socket(addr, backlog, reuse_port):
    """A listening socket as bjoern makes it: reuse_port sets SO_REUSEPORT on
    a TCP one before it binds (a unix one takes no such flag: bjoern ignores
    it there too)."""
    kind, value = binding.parse(addr, "0.0.0.0")
    if not reuse_port or kind != "tcp":
        return binding.create(addr, backlog)
    family, host, port = value
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise binding.BindError(f"cannot listen on {addr}: {e.strerror}") from None
    return sock


def _bjoern_options(options, listen_backlog=None):
    """bjoern's listen_backlog is --backlog. Its statsd={...} needs a master
    here (forkwsgi --workers N --statsd-host HOST:PORT): said, then left
    out."""
    options = dict(options)
    if listen_backlog is not None:
        options["backlog"] = listen_backlog
    statsd = options.pop("statsd", None)
    if statsd and statsd.get("enable", True):
        log.warning("statsd=: forkwsgi sends statsd metrics from its master: run forkwsgi --workers N "
                    "--statsd-host %s:%s; ignored here", statsd.get("host", "127.0.0.1"), statsd.get("port", 8125))
    return options


def run(app=None, host=None, port=None, *, bind=None, reuse_port=False, **options):
    """Serve `app` until SIGTERM (graceful) or SIGINT (immediate).

    bjoern's forms work as they are: run(app, host, port), run(app,
    "unix:/path") (and unix:@name, an abstract socket), run(app, host,
    port, reuse_port=True) (SO_REUSEPORT: independent processes share the
    port), and listen(app, host, port) then run(), in one process or in
    each child forked between the two. bind= (one address or a list)
    serves those and nothing else; with neither, 127.0.0.1:8000 (none with
    uwsgi_socket=). A unix socket's file is removed when it ends, as in
    bjoern."""
    if app is None:
        if not _listened:
            raise TypeError("run() needs an app, or listen(app, host, port) before it")
        sock, app, options = _listened.pop()
        server = _served(app, sock, options)
    elif _listened:
        raise RuntimeError("listen() was called already: run() serves what it bound (as in bjoern, whose run() "
                           "with an app listens again)")
    elif reuse_port and bind is None:
        listen(app, host, port, reuse_port=True, **options)
        sock, app, options = _listened.pop()
        server = _served(app, sock, options)
    else:
        server = Server(app, bind, host=host, port=port, **_bjoern_options(options))
    paths = [name for name in (s.getsockname() for s in server.sockets if s.family == socket.AF_UNIX)
             if isinstance(name, str) and name]            # not an abstract one (bytes)
    try:
        with server:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, lambda *_: server.stop(graceful=True))
            try:
                server.serve()
            except KeyboardInterrupt:
                pass
    finally:
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _served(app, sock, options):
    """The Server of a socket listen() made, which it then owns (closes)."""
    try:
        server = Server(app, sockets=[sock], **options)
    except BaseException:
        sock.close()
        raise
    server._own_sockets = True
    return server
