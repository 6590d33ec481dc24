"""A worker process: one C server loop on the sockets the master bound.

Runs in the child right after fork(). It tells the master it is ready by
writing one byte to its readiness pipe once the app is loaded and the server
object exists, so a rolling reload only retires old workers once new ones
can take their traffic. Exit codes tell the master why a worker ended.
"""
import atexit
import faulthandler
import os
import signal
import sys
import threading

from . import _forkwsgi, accesslog, appload, hooks as hooks_mod, logs, process
from .hooks import Hooks
from .offload import producer
from .server import Server

# Exit codes the master acts on (gunicorn's numbers, for operators' scripts).
WORKER_BOOT_ERROR = 3
APP_LOAD_ERROR = 4


class Setup:
    """What the master gives a worker at fork."""

    def __init__(self, index, master_pid, sockets, app, app_spec, options, ready_fd, nice=0,
                 multiprocess=True, status=None, stats=None, balance=None, offload=None, hooks=None,
                 hook_worker=None, master=None, owner=None, access_logger=None, protocols=None,
                 listen_late=None):
        self.index = index              # 1..N, for titles and logs
        self.master_pid = master_pid
        self.sockets = sockets          # the listening sockets it serves
        self.listen_late = listen_late  # a backlog: the sockets are bound only, it listens
                                        # once the app is imported (reuseport, --lazy-apps)
        self.protocols = protocols      # what each speaks (http, uwsgi); None: all --protocol
        self.app = app                  # preloaded, or None: loaded here from app_spec (--lazy-apps)
        self.app_spec = app_spec
        self.options = options          # the Server's settings
        self.ready_fd = ready_fd        # readiness pipe: one byte once it can serve
        self.nice = nice
        self.multiprocess = multiprocess    # wsgi.multiprocess
        self.status = status            # its status entries (slots.py)
        self.stats = stats              # its counters (slots.py, cserver/fw_stats.h)
        self.balance = balance          # its scoreboard slot and hand-off fds (slots.py)
        self.offload = offload          # producer.setup() arguments, or None
        self.hooks = hooks or Hooks({})         # the config file's server hooks (hooks.py)
        self.hook_worker = hook_worker  # this worker as hooks see it (hooks.Worker)
        self.master = master            # the arbiter, as worker_exit(server, worker) gets it
        self.owner = owner              # --user/--group (process.Owner): become it before the app loads
        self.access_logger = access_logger      # access lines as records to this logger (logs.access_logger)


def run(setup, log):
    """Entry point in the child; never returns."""
    code = 0
    try:
        _leave_the_masters_ways(setup)
        access_fd = _become_the_owner(setup, log)
        # After become(): the kernel forgets it when the identity changes.
        process.die_with_parent(setup.master_pid)
        if setup.offload:
            _setup_offload(setup, log)
        app = setup.app if setup.app is not None else _import_app(setup, log)
        if setup.listen_late is not None:
            for s in setup.sockets:
                s.listen(setup.listen_late)
        hooks, hw = setup.hooks, setup.hook_worker
        if hw is not None and setup.stats is not None:
            hw.count_requests(lambda: _forkwsgi.stats_read(setup.stats, 0)["requests"])      # worker.nr
        if "pre_request" in hooks or "post_request" in hooks:
            app = hooks_mod.wrap(app, hooks, hw)          # only then: no cost otherwise
        server = _make_server(app, setup, access_fd, log)
        _catch_signals(server, hooks, hw, setup.master_pid)
        # The master held the stop signals across fork: one that arrived
        # since is delivered now, to the handlers above (the server then
        # stops as soon as it starts).
        process.release_stop_signals()
        if hw is not None:
            hw.app = hw.wsgi = app
            hw.booted = True
        hooks.call("post_worker_init", hw)
        _start_threads(server, setup, log)
        os.write(setup.ready_fd, b"R")
        os.close(setup.ready_fd)
        server.serve(announce=False)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        code = 0
    except BaseException:
        log.exception("worker %d failed", setup.index)
        code = WORKER_BOOT_ERROR
    finally:
        _finish(setup, code)


def _leave_the_masters_ways(setup):
    """Undo what the fork copied of the master's: its signal handlers and
    wakeup fd, its title, its nice level."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # SIGUSR1 is ours too (reopen the log files), set by _catch_signals.
    process.leave_to_the_master((signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1))
    process.set_title(f"forkwsgi: worker {setup.index}")
    # Absolute, not relative to the master's (inherited) level.
    os.setpriority(os.PRIO_PROCESS, 0, setup.nice)


def _become_the_owner(setup, log):
    """--user/--group: become them (exit WORKER_BOOT_ERROR if that fails).
    Returns the access log's fd when it had to be opened first, or None."""
    access_fd = None
    if setup.owner and setup.owner.needed():
        # What the worker opens by path, it opens before it gives up
        # the master's identity (the directory may be root's alone).
        if setup.options.get("access_logfile") and not setup.access_logger:
            access_fd = accesslog.open_file(setup.options["access_logfile"])
        try:
            setup.owner.become()
        except OSError as e:
            log.error("worker %d: cannot become uid %d gid %d: %s", setup.index, setup.owner.uid,
                      setup.owner.gid, e.strerror)
            _boot_failed()
    return access_fd


def _setup_offload(setup, log):
    """This process's producer: forkwsgi.offload() from any thread (and
    from the app's own import, with --lazy-apps). One that cannot map the
    ring (out of memory or address space) failed to boot: one line says
    why, and the master stops."""
    try:
        producer.setup(**setup.offload)
    except OSError as e:
        log.error("worker %d: cannot open the offload ring: %s", setup.index, _why(e))
        _boot_failed()


def _make_server(app, setup, access_fd, log):
    """The worker's server. One whose core cannot be made (out of memory,
    out of descriptors: an eventfd, an epoll set) failed to boot: one line
    says why, not a traceback, and the master stops."""
    try:
        return Server(app, sockets=setup.sockets, _protocols=setup.protocols, logger=log,
                      _multiprocess=setup.multiprocess,
                      _status=setup.status, _stats=setup.stats, _balance=setup.balance,
                      _offload=bool(setup.offload), _access_log_fd=access_fd,
                      _release_listeners=True, _name=f"forkwsgi worker {setup.index}",
                      _access_logger=setup.access_logger, **setup.options)
    except MemoryError:
        log.error("worker %d: cannot start the server: out of memory", setup.index)
    except OSError as e:
        if e.strerror is None:
            raise
        log.error("worker %d: cannot start the server: %s", setup.index, _why(e))
    _boot_failed()


def _start_threads(server, setup, log):
    """The app threads, before the worker says it is ready: one that cannot
    start them (a memory limit, a thread limit) failed to boot, and the
    master stops rather than respawning it without end."""
    try:
        server.start_threads()
    except OSError as e:
        log.error("worker %d: %s", setup.index, e.strerror)
        _boot_failed()


def _import_app(setup, log):
    """--lazy-apps: the app, imported here (exit APP_LOAD_ERROR if it fails)."""
    try:
        return appload.load(setup.app_spec)
    except appload.AppImportError as e:
        log.error("worker %d: %s", setup.index, e)
        os._exit(APP_LOAD_ERROR)
    except Exception:
        log.exception("worker %d: error while importing the app %r", setup.index, setup.app_spec)
        os._exit(APP_LOAD_ERROR)


def _catch_signals(server, hooks, hw, master_pid):
    """The worker's own handlers: SIGTERM stops gracefully, SIGINT and
    SIGQUIT at once, SIGUSR1 reopens the logs, SIGUSR2 dumps the stacks."""
    # --timeout: the master asks for every thread's Python stack with
    # SIGUSR2 before it kills a stuck worker (safe even mid-bytecode);
    # gunicorn's worker_abort hook is called then too, as soon as
    # Python code runs in this thread.
    if "worker_abort" in hooks:
        signal.signal(signal.SIGUSR2, lambda signum, frame: hooks.call("worker_abort", hw))
    faulthandler.register(signal.SIGUSR2, all_threads=True, chain="worker_abort" in hooks)

    def graceful(signum, frame):
        # Sent to this worker alone (kill PID) while its master serves on:
        # a retirement, its idle connections handed to the other workers
        # as at --max-requests (the master replaces it). The master's own
        # stop says so in the scoreboard first (Arbiter.stop), and then
        # they close; so does a dead master's SIGTERM (die_with_parent).
        if os.getppid() == master_pid:
            server._retire()
        else:
            server.stop(graceful=True)

    def fast(signum, frame):
        hooks.call("worker_int", hw)
        server.stop(graceful=False)

    def reopen(signum, frame):
        server.reopen_logs()
        logs.reopen()

    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGINT, fast)
    signal.signal(signal.SIGQUIT, fast)
    signal.signal(signal.SIGUSR1, reopen)


def _why(e):
    """An OSError as one line: the file it names, if any, and why."""
    why = e.strerror or str(e)
    return f"{e.filename}: {why}" if e.filename else why


def _boot_failed():
    """A worker that cannot boot ends now (the master sees exit 3 before
    ready), with what it printed so far flushed: stdout may be a pipe
    (systemd, docker), block-buffered, and os._exit does not flush it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(WORKER_BOOT_ERROR)


def _finish(setup, code):
    """The worker's end, whatever happened: worker_exit, the app's atexit
    handlers after a normal end, then _exit (never the master's cleanup)."""
    try:
        if setup.hook_worker is not None:
            setup.hook_worker.alive = False
            setup.hooks.call("worker_exit", setup.master, setup.hook_worker)
        if code == 0:
            run_atexit(setup.options.get("graceful_timeout") or 30.0)
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def run_atexit(limit):
    """A worker that ends normally (a stop, a reload, --max-requests,
    --max-rss) runs the atexit handlers, as interpreter shutdown would:
    Sentry, OpenTelemetry and buffered log handlers flush there. Only the
    handlers, not the rest of a shutdown, which would also wait for every
    thread the app started; and a handler still running after `limit`
    seconds (the graceful timeout) does not keep the worker: a timer ends it."""
    timer = threading.Timer(limit, os._exit, (0,))
    timer.daemon = True
    timer.start()
    atexit._run_exitfuncs()
