"""The offload sibling's supervision: one policy for starting, restarting
(with back-off), reloading and stopping it, and two ways to start it:

- ForkStarter: the master forks it (its waitpid loop reaps it and tells
  Supervisor.exited);
- SpawnStarter: a process that serves without a master (an embedded
  Server, or --workers 0) runs it as a program of its own, not a fork: an
  embedding process may have threads of its own, and a fork of it could
  inherit a lock some thread held. Host wraps that case: it holds the queue
  and one thread that starts the sibling and waits for it in waitpid()
  without the GIL, costing the request threads nothing.

At a stop the sibling drains the queue within the graceful timeout; when
none is running then (it died, or waits out a back-off) one is started for
it: what is queued and journaled would otherwise wait for a next start on
this disk, which a deleted pod never gets.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from .. import process
from . import producer
from .queue import OffloadQueue
from .sibling_process import run_sibling

log = logging.getLogger("forkwsgi")


class ForkStarter:
    """Fork the sibling from the master. in_child: closes, in the child,
    what belongs to the master (its pipes, the listening sockets). owner:
    --user/--group (process.Owner), which the sibling becomes, or None."""

    def __init__(self, queue, in_child, owner=None):
        self.queue = queue
        self.in_child = in_child
        self.owner = owner

    def start(self):
        with process.stop_signals_held():
            pid = os.fork()
            if pid == 0:
                self.in_child()
                self.queue.close_in_child()
                run_sibling(self.queue.cfg, os.getppid(), counters=self.queue.sibling_counters(),
                            owner=self.owner)
        return pid

    def wait(self, pid, timeout):
        """Its exit status, or None if it still runs after timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return 0                   # reaped elsewhere meanwhile
            if got:
                return status
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)


class SpawnStarter:
    """Run the sibling as a program (python -m forkwsgi.offload.sibling_process),
    handing it the counters' memfd (it opens the ring itself)."""

    def __init__(self, queue):
        self.queue = queue
        self.procs = {}

    def start(self):
        q = self.queue
        keep = {k: v for k, v in q.cfg.items() if k.startswith("offload_") or k in ("graceful_timeout", "log_level")}
        # The sibling imports what this process can (forkwsgi, a python: sink)
        # through this process's path, which may have been changed at run time.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   FORKWSGI_SIBLING=json.dumps({"counters_fd": q.counters_fd, "parent": os.getpid(), "cfg": keep}))
        with process.stop_signals_held():
            proc = subprocess.Popen([sys.executable, "-m", "forkwsgi.offload.sibling_process"],
                                    pass_fds=(q.counters_fd,), env=env,
                                    stdin=subprocess.DEVNULL, process_group=0)    # no Ctrl-C from a terminal
        self.procs[proc.pid] = proc
        return proc.pid

    def wait(self, pid, timeout):
        """Its wait status, or None if it still runs after timeout seconds
        (None: wait as long as it takes)."""
        proc = self.procs[pid]
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.procs.pop(pid, None)
        code = proc.returncode                     # back to a wait status: exit code or signal
        return code << 8 if code >= 0 else -code


class Supervisor:
    """One sibling at a time: started when due, restarted when it dies
    (back-off while it dies at start-up), replaced on a reload, drained at
    a stop."""

    def __init__(self, queue, starter, logger=log):
        self.queue = queue
        self.starter = starter
        self.log = logger
        self.pid = None
        self.started = 0.0
        self.backoff = process.Backoff()
        self.replacing = False            # asked to hand over (reload): its exit is expected
        self.stopping = False

    def due(self):
        """Start one now? (none running, no stop, back-off over)"""
        return self.pid is None and not self.stopping and self.backoff.due()

    def start(self):
        self.pid = self.starter.start()
        self.started = time.monotonic()
        self.log.info("Booted the offload sibling (pid %d)", self.pid)

    def exited(self, status):
        """The sibling ended with wait status `status`. Returns the pause
        before the next start (None: no restart, the server stops)."""
        pid, self.pid = self.pid, None
        code = os.waitstatus_to_exitcode(status)
        how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        if self.stopping or self.replacing:
            self.log.info("Offload sibling (pid %d) exited (%s)", pid, how)
            self.replacing = False
            return None if self.stopping else 0.0
        self.log.warning("offload: the sibling exited (pid %d, %s): it died; replacing it", pid, how)
        return self.backoff.died(self.started)

    def adopt(self, pid):
        """The sibling a master started before it re-executed itself in
        place (reexec.py): it hands over to a new one, as on a reload."""
        self.pid = pid
        self.started = time.monotonic()
        self.reload()

    def reload(self):
        """A fresh sibling too (new code, new sink connection): this one
        delivers what it took and exits; its replacement takes over."""
        if self.pid is not None:
            self.replacing = True
            _kill(self.pid, signal.SIGHUP)

    def stop(self, graceful=True):
        """Drain and stop the sibling (the caller then closes the queue out:
        OffloadQueue.close_out)."""
        self.stopping = True
        if self.pid is not None:
            status = self.starter.wait(self.pid, 0)
            if status is not None:                 # it died just now
                self.exited(status)
        if graceful and self.pid is None:
            self._start_drainer("no sibling running at the stop")
        status = self._stop_running(graceful)
        # Killed by a signal of someone else's as ours went out (a SIGKILL
        # a moment before, not yet seen when this stop looked): it drained
        # nothing, so one more sibling does.
        if graceful and status is not None and os.waitstatus_to_exitcode(status) < 0:
            self._start_drainer("the sibling was killed as the stop began")
            self._stop_running(graceful)

    def _start_drainer(self, why):
        self.log.info("Offload: %s: starting one to drain the queue", why)
        try:
            self.start()
        except OSError as e:
            self.log.error("offload: cannot start the sibling: %s", e)

    def _stop_running(self, graceful):
        """Signal the running sibling to stop and wait for it. Returns its
        wait status if it ended by itself, None if none ran or it had to be
        killed."""
        if self.pid is None:
            return None
        _kill(self.pid, signal.SIGTERM if graceful else signal.SIGQUIT)
        limit = self.queue.cfg["graceful_timeout"] + 2.0 if graceful else 3.0
        status = self.starter.wait(self.pid, limit)
        ours = status is None
        if ours:
            self.log.warning("Offload sibling (pid %d) did not stop in time: killing it", self.pid)
            _kill(self.pid, signal.SIGKILL)
            status = self.starter.wait(self.pid, 5.0)
        if status is not None:
            self.exited(status)
        return None if ours else status


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


_active = []          # the process's one host (the C producer is per process)


class Host:
    """Offload in a process that serves without a master: it holds the
    directory and the ring (as the master would), is the only producer
    (counter slot 0), and supervises the sibling from one thread."""

    def __init__(self, cfg, logger=None):
        if _active:
            raise ValueError("offload_sink: this process already runs an offload sibling "
                             "(one embedded server per process may use offload)")
        self.log = logger or log
        self.queue = OffloadQueue(cfg, nslots=1, shared_fd=True)
        try:
            producer.setup(**self.queue.producer_options(0))
        except BaseException:
            self.queue.close()
            raise
        self.supervisor = Supervisor(self.queue, SpawnStarter(self.queue), self.log)
        self.lock = threading.Lock()
        self.started = threading.Event()
        _active.append(self)
        # The supervising thread starts the sibling too: the kernel's
        # parent-death signal follows the thread that forked, so that
        # thread must live as long as the sibling should.
        self.thread = threading.Thread(target=self._supervise, name="forkwsgi-offload-supervisor", daemon=True)
        self.thread.start()
        self.started.wait(10)
        self.log.info("%s", self.queue.describe())

    def _supervise(self):
        sup = self.supervisor
        while True:
            with self.lock:
                if sup.stopping:
                    self.started.set()
                    return
                try:
                    sup.start()
                except OSError as e:
                    self.log.error("offload: cannot start the sibling: %s", e)
            self.started.set()
            pid = sup.pid
            status = sup.starter.wait(pid, None) if pid is not None else None
            with self.lock:
                if sup.stopping:
                    return
                pause = sup.exited(status) if status is not None else sup.backoff.died(time.monotonic())
            time.sleep(pause or 0.0)

    def stop(self, graceful=True):
        """The sibling drains the ring within the graceful timeout (what it
        cannot deliver stays journaled, and what it could not read stays in
        the ring, for the next start); then everything is closed."""
        try:
            with self.lock:
                self.supervisor.stopping = True        # the thread starts no more
            self.supervisor.stop(graceful)
            self.thread.join(5)
        finally:
            _active.remove(self)
            producer.teardown()        # waits for offload() calls in progress; later ones raise
            self.queue.close_out(self.log)
            self.queue.close()
