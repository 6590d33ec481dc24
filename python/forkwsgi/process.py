"""Process plumbing every forkwsgi process shares (master, workers, the
offload sibling): titles, the log's format, dying with the parent, holding
stop signals across a fork, and the back-off of a child that keeps dying.

A leaf: it imports nothing else of forkwsgi, so anything may import it."""
import contextlib
import ctypes
import logging
import os
import signal
import stat
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
    """When to start a child again after it died: at once, unless it died
    soon after it started (before it was ready, within `boot_seconds` of
    its start) or soon after it came ready (within `boot_seconds` of
    that: an app that crashes at its first request, or a thread of it
    that kills the process); then 0.1 s, doubling up to `limit`. One that
    lived longer resets the delay, and so does a quiet spell: a short death
    more than 2 x `limit` after the last one starts again at 0.1 s.

    Without the second case a worker that exited 5 ms after it said ready
    was replaced at once, ~160 forks a second for as long as it lasted."""

    def __init__(self, boot_seconds=2.0, limit=10.0, clock=time.monotonic):
        self.boot_seconds = boot_seconds
        self.limit = limit
        self.clock = clock
        self.delay = 0.0
        self.next_start = 0.0
        self.last_short = None          # monotonic time of the last death that counted

    def died(self, started, ready_at=None):
        """A child started at `started` (monotonic) died now; ready_at:
        when it said it was ready (None: it never did). Returns the pause
        before the next start (0: at once)."""
        now = self.clock()
        if now - (started if ready_at is None else ready_at) < self.boot_seconds:
            if self.last_short is not None and now - self.last_short > 2 * self.limit:
                self.delay = 0.0
            self.delay = min(max(0.1, self.delay * 2), self.limit)
            self.last_short = now
        else:
            self.delay = 0.0
        self.next_start = now + self.delay
        return self.delay

    def due(self):
        return self.clock() >= self.next_start

    def wait(self):
        """Seconds until the next start is due (0: it is)."""
        return max(0.0, self.next_start - self.clock())


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
        for its log files and unix sockets); only a root master can, and only
        needs to."""
        if path and self._root_over_another() and os.path.exists(path):
            os.chown(path, self.uid, self.gid)

    def _root_over_another(self):
        return os.geteuid() == 0 and self.needed()

    def give_tree(self, top, keep=()):
        """A directory forkwsgi made for its processes (--offload-dir) and
        what is in it, theirs (also files a run as root left there); the
        names in `keep` (at the top) stay the master's. The user may write
        there, so nothing it put there may turn this into a chown of a file
        of root's: each name is pinned first (O_PATH, links not followed),
        and only directories and regular files with one name are given (a
        file forkwsgi made has one; a second is a hard link someone made)."""
        if not self._root_over_another():
            return
        top = os.path.realpath(top)           # the operator's path: a link there is theirs
        for where, dirs, files, dfd in os.fwalk(top):     # never enters a linked directory
            for name in dirs + files:
                if where != top or name not in keep:
                    self._give_pinned(os.path.join(where, name), name, dfd)
        self._give_pinned(top, top, None)

    def _give_pinned(self, path, name, dfd):
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode) or (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
                os.chown(f"/proc/self/fd/{fd}", self.uid, self.gid)      # that very file
            elif stat.S_ISREG(st.st_mode):
                log.warning("%s has %d names (hard links): not given to uid %d", path, st.st_nlink, self.uid)
        finally:
            os.close(fd)

    def share_dir(self, path):
        """A directory the master and the workers both make files in (the
        app's metrics): the workers' group may add files, and the sticky bit
        keeps each file its maker's: a worker can neither remove nor replace
        a file of the master's (with a link the master would then follow)."""
        if self._root_over_another():
            os.chown(path, 0, self.gid)
            os.chmod(path, 0o1770)

    def unusable(self, wanted):
        """Which of `wanted`, (path, os.access mode) pairs, this identity
        could not use: asked in a child that becomes it, so its groups,
        every directory on the way and ACLs count exactly as in a worker.
        At start-up, before the master has threads."""
        if not self._root_over_another():
            return []
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                self.become()
                bad = [path for path, mode in wanted if not os.access(path, mode)]
                os.write(w, "\0".join(bad).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with open(r, "rb") as f:
            out = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if status:
            return [path for path, _ in wanted]
        return [p for p in out.split("\0") if p]

    def become(self):
        """In a worker or the offload sibling: drop to this identity
        (groups, then gid, then uid). Raises OSError (EPERM) when the master
        may not. The kernel forgets die_with_parent() on a change of
        identity: call that after this."""
        if not self.needed():
            return
        if self.initgroups and self.name:
            os.initgroups(self.name, self.gid)
        elif os.geteuid() == 0:
            os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
