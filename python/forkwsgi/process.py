"""Process plumbing every forkwsgi process shares (master, workers, the
offload sibling): titles, the log's format, dying with the parent, holding
stop signals across a fork, and the back-off of a child that keeps dying.

A leaf: it imports nothing else of forkwsgi, so anything may import it."""
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time

try:
    import setproctitle as _spt
except ImportError:  # pragma: no cover - it is a declared dependency
    _spt = None

log = logging.getLogger("forkwsgi")

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15

# The signals that stop a forkwsgi process (SIGHUP: the sibling hands over).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}


_name = None                  # --name: shown in every title of the server's processes


def set_name(name):
    global _name
    _name = name or None


def set_title(title):
    """The title ps and top show ("forkwsgi: master", "forkwsgi: worker 3",
    with --name: "forkwsgi: worker 3 [shop]")."""
    if _name:
        title = f"{title} [{_name}]"
    if _spt is not None:
        _spt.setproctitle(title)
        return
    try:   # at least the kernel's 15-byte comm
        libc = ctypes.CDLL(None)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


class PidFile:
    """--pid: the master's PID in FILE, written once the sockets are bound
    (atomically: a reader never sees it half written), removed at exit if it
    is still ours."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self.pid = os.getpid()
        tmp = f"{self.path}.{self.pid}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{self.pid}\n")
        os.replace(tmp, self.path)

    def remove(self):
        try:
            with open(self.path) as f:
                if f.read().strip() != str(self.pid):
                    return                     # another server's now
            os.unlink(self.path)
        except OSError:
            pass


def setup_logging(level):
    """The server's log: one line per event on stderr, gunicorn's format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s",
                                           "%Y-%m-%d %H:%M:%S %z"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def die_with_parent(parent_pid):
    """Ask the kernel to send SIGTERM when the parent dies; if it died before
    we asked, exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


@contextlib.contextmanager
def stop_signals_held():
    """Around starting a child (fork or spawn): the child inherits the
    calling thread's mask, so a stop signal waits until the child has its
    own handlers (it calls release_stop_signals) instead of killing it or
    being swallowed by handlers inherited from the parent."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _masters_signal(signum, frame):
    pass


def leave_to_the_master(signals):
    """In a child of the master: `signals` are the master's to act on (a
    reload, one worker more or less, reopening logs), and reach the child
    too when sent to the whole process group (a terminal hang-up, `kill
    -HUP -- -PGID`). Their defaults would kill (HUP, USR1) or suspend (TTIN,
    TTOU) it: a handler that does nothing instead. A handler, not SIG_IGN:
    processes the child starts get the defaults back."""
    for sig in signals:
        signal.signal(sig, _masters_signal)


def release_stop_signals():
    """In a child, once its handlers are in place: a stop that arrived since
    the fork is delivered now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class Backoff:
    """When to start a child again after it died: at once, unless it keeps
    dying at start-up (before it was ready, within `boot_seconds`); then
    0.1 s, doubling up to `limit`. One that died after it was ready did not
    die at start-up."""

    def __init__(self, boot_seconds=2.0, limit=10.0):
        self.boot_seconds = boot_seconds
        self.limit = limit
        self.delay = 0.0
        self.next_start = 0.0

    def died(self, started, ready=False):
        """A child started at `started` (monotonic) died now; ready: it had
        said it was ready. Returns the pause before the next start (0: at
        once)."""
        now = time.monotonic()
        if now - started < self.boot_seconds and not ready:
            self.delay = min(max(0.1, self.delay * 2), self.limit)
        else:
            self.delay = 0.0
        self.next_start = now + self.delay
        return self.delay

    def due(self):
        return time.monotonic() >= self.next_start


def prepare_import(cfg):
    """The settings that shape where the app is imported from and what it
    sees: --chdir (raises OSError), --env, --pythonpath. For the server and
    for the check a reload makes before it re-executes (reexec.py)."""
    if cfg["chdir"]:
        os.chdir(cfg["chdir"])
        sys.path.insert(0, os.getcwd())
    for pair in cfg["raw_env"]:
        key, _, value = pair.partition("=")
        os.environ[key] = value
    for d in reversed((cfg["pythonpath"] or "").split(",")):
        if d.strip():
            sys.path.insert(0, os.path.abspath(d.strip()))


class Owner:
    """--user/--group: who the workers run as (gunicorn's semantics: the
    master keeps its own identity; each worker drops to this one after
    fork, before it loads the app)."""

    def __init__(self, user, group, initgroups=False):
        import grp
        import pwd
        pw = pwd.getpwuid(int(user)) if user and str(user).isdigit() else pwd.getpwnam(user) if user else None
        self.uid = pw.pw_uid if pw else os.geteuid()
        self.name = pw.pw_name if pw else None
        if group:
            self.gid = int(group) if str(group).isdigit() else grp.getgrnam(group).gr_gid
        else:
            self.gid = pw.pw_gid if pw else os.getegid()
        self.initgroups = initgroups

    def needed(self):
        return (self.uid, self.gid) != (os.geteuid(), os.getegid())

    def give(self, path):
        """Make a file or directory the workers write theirs (as gunicorn does
        for its log files); only a root master can, and only needs to."""
        if path and os.geteuid() == 0 and self.needed() and os.path.exists(path):
            os.chown(path, self.uid, self.gid)

    def become(self):
        """In a worker: drop to this identity (groups, then gid, then uid).
        Raises OSError (EPERM) when the master may not."""
        if not self.needed():
            return
        if self.initgroups and self.name:
            os.initgroups(self.name, self.gid)
        elif os.geteuid() == 0:
            os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
