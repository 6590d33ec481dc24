"""Offload for a process that serves without a master: an embedded Server
(``forkwsgi.run(app, offload_sink=...)``) or ``forkwsgi --workers 0``.

This process holds the queue (both ends, as the master would) and is the
only producer (counter slot 0). The sibling runs as a separate program
(``python -c 'from forkwsgi.sibling import main; main()'``), not a fork: an
embedding process may have threads of its own, and a fork of it could
inherit a lock some thread held. It is started, restarted when it dies
(with back-off) and stopped by one supervisor thread, which spends its life
blocked in waitpid() without the GIL: it costs the request threads nothing.
"""
import json
import logging
import mmap
import os
import signal
import subprocess
import sys
import threading
import time

from . import _forkwsgi, sibling

log = logging.getLogger("forkwsgi")

_active = []          # the process's one host (the C producer is per process)


class OffloadHost:
    def __init__(self, cfg, logger=None):
        if _active:
            raise ValueError("offload_sink: this process already runs an offload sibling "
                             "(one embedded server per process may use offload)")
        self.log = logger or log
        self.cfg = sibling.sibling_config(cfg)
        sibling.check_config(self.cfg)
        self.proc = None
        self.lock = threading.Lock()
        self.stopping = False
        self.started = threading.Event()
        self.send = self.recv = self.counters = None
        self.counters_fd = -1
        try:
            self.send, self.recv = sibling.make_queue(self.cfg)
            size = sibling.counters_size(1)
            self.counters_fd = os.memfd_create("forkwsgi-offload-counters", os.MFD_CLOEXEC)
            os.ftruncate(self.counters_fd, size)
            self.counters = mmap.mmap(self.counters_fd, size)
            _forkwsgi.offload_setup(on_drop=sibling.on_drop,
                                    **sibling.producer_options(self.cfg, self.send, self.counters, 0))
        except BaseException:
            self._close()
            raise
        sibling.attach(self.counters, 1)
        _active.append(self)
        # The supervisor starts the sibling too: the kernel's parent-death
        # signal follows the thread that forked, so that thread must live as
        # long as the sibling should.
        self.thread = threading.Thread(target=self._supervise, name="forkwsgi-offload-supervisor",
                                       daemon=True)
        self.thread.start()
        self.started.wait(10)
        self.log.info("Offload to %s (journal %s, overflow %s)", self.cfg["offload_sink"],
                      self.cfg["offload_dir"], self.cfg["offload_overflow"])

    def _spawn(self):
        keep = {k: v for k, v in self.cfg.items()
                if k.startswith("offload_") or k in ("graceful_timeout", "log_level")}
        # The sibling imports what this process can (forkwsgi, a python: sink)
        # through this process's path, which may have been changed at run time.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   FORKWSGI_SIBLING=json.dumps({"fd": self.recv.fileno(), "counters_fd": self.counters_fd,
                                                "parent": os.getpid(), "cfg": keep}))
        with sibling.stop_signals_held():
            return subprocess.Popen([sys.executable, "-c", "from forkwsgi.sibling import main; main()"],
                                    pass_fds=(self.recv.fileno(), self.counters_fd), env=env,
                                    stdin=subprocess.DEVNULL, process_group=0)    # no Ctrl-C from a terminal

    def _supervise(self):
        backoff = 0.0
        while True:
            with self.lock:
                if self.stopping:
                    self.started.set()
                    return
                try:
                    self.proc = self._spawn()
                except OSError as e:
                    self.log.error("offload: cannot start the sibling: %s", e)
                    self.proc = None
                else:
                    self.log.info("Booted the offload sibling (pid %d)", self.proc.pid)
            self.started.set()
            began = time.monotonic()
            rc = self.proc.wait() if self.proc else -1
            if self.stopping:
                return
            self.log.error("offload: the sibling exited (%s): restarting it", rc)
            # Back-off only while it keeps dying at start-up.
            backoff = min(max(0.1, backoff * 2), 10.0) if time.monotonic() - began < 1.0 else 0.0
            time.sleep(backoff)

    def stop(self, graceful=True):
        """The sibling drains the queue within the graceful timeout (what it
        cannot deliver stays journaled for the next start); what is still
        queued after it goes to a spill file; then everything is closed."""
        with self.lock:
            self.stopping = True       # the supervisor starts no more
            proc = self.proc
            if graceful and (proc is None or proc.poll() is not None):
                # It died, or waits out a back-off: a sibling drains the
                # queue and the journal now, not at a next start that may
                # never come on this disk.
                self.log.info("Offload: no sibling running at the stop: starting one to drain the queue")
                try:
                    proc = self.proc = self._spawn()
                except OSError as e:
                    self.log.error("offload: cannot start the sibling: %s", e)
        try:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM if graceful else signal.SIGQUIT)
                try:
                    proc.wait(self.cfg["graceful_timeout"] + 2.0 if graceful else 3.0)
                except subprocess.TimeoutExpired:
                    self.log.warning("Offload sibling (pid %d) did not stop in time: killing it", proc.pid)
                    proc.kill()
                    proc.wait()
            self.thread.join(5)
        finally:
            _active.remove(self)
            _forkwsgi.offload_teardown()      # waits for offload() calls in progress; then they raise
            sibling.attach(None, 0)
            sibling.close_out(self.recv, self.cfg, self.counters, 1, self.log)
            self._close()

    def _close(self):
        for sock in (self.send, self.recv):
            if sock is not None:
                sock.close()
        if self.counters is not None:
            self.counters.close()
        if self.counters_fd >= 0:
            os.close(self.counters_fd)
        self.send = self.recv = self.counters = None
        self.counters_fd = -1
