"""Reloads that run new code under the same PID: the master re-executes
itself in place.

With the app preloaded (the default) a worker is a fork of the master and
runs the code the master imported at start; new code needs a new
interpreter. On SIGHUP (SIGUSR2 too, gunicorn's upgrade signal) the master:

1. checks, in a child process (python -m forkwsgi.preflight ARGS), that the
   settings load and the app imports; if not, it logs why, and the workers
   it has keep serving the code they run;
2. writes down what it holds (listening sockets, its workers and their
   slots: the shared memory, kick eventfds and hand-off sockets; the
   offload queue and sibling) in one environment variable, lets those
   descriptors survive exec, and exec()s itself with the arguments it was
   started with: same PID, so systemd, Kubernetes and pid files follow
   nothing, and the workers, still its children, serve on meanwhile;
3. the new image takes all of it over (arbiter.py), imports the app afresh,
   forks new workers, and retires each old worker once a new one is ready:
   the rolling reload, kept-alive connections handed over unread.

The master's signals are blocked across exec: one that arrives meanwhile
stays pending and is handled by the new image.
"""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from . import observer, preflight, slots

ENV = "FORKWSGI_REEXEC"
FINISH_OBSERVERS = 1.0      # seconds, at most, to answer the --metrics/--stats clients already accepted
log = logging.getLogger("forkwsgi")

# Variables that belong to the master, not to the preflight check.
_NOT_FOR_THE_CHECK = (ENV, "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                      "LISTEN_FDNAMES")


def inherited(environ=None):
    """The state a master wrote before it re-executed itself into this
    process, or None. The variable is removed (the workers must not see it)."""
    environ = os.environ if environ is None else environ
    raw = environ.pop(ENV, None)
    if not raw:
        return None
    try:
        state = json.loads(raw)
    except ValueError:
        log.error("%s is not valid JSON: ignored", ENV)
        return None
    if state.get("pid") != os.getpid():
        return None          # a child of a master that exec'd some other program
    return state


class Preflight:
    """Does the new code load? `python -m forkwsgi.preflight ARGS`, run
    beside the master with its arguments, from its start-up directory. The
    master reaps it (its waitpid(-1) would steal it from subprocess) and
    hands the status over with reaped()."""

    def __init__(self, argv, cwd):
        self.out = tempfile.TemporaryFile()
        env = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_THE_CHECK}
        # The app's prometheus_client files of the check's import go to a
        # directory of its own, removed after it: in the workers' directory
        # they would be counted (a counter bumped at import) and never
        # folded away.
        self.prom_dir = None
        if env.get("PROMETHEUS_MULTIPROC_DIR"):
            env["PROMETHEUS_MULTIPROC_DIR"] = self.prom_dir = tempfile.mkdtemp(prefix="forkwsgi-check-")
        # Its own process group: a signal sent to the server's group (a
        # terminal hang-up, kill -HUP -PGID) is for the master, not for it.
        self.proc = subprocess.Popen([sys.executable, "-m", "forkwsgi.preflight", *argv], cwd=cwd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pid = self.proc.pid
        self.status = None

    def reaped(self, status):
        self.status = status
        self.proc.returncode = os.waitstatus_to_exitcode(status)    # subprocess must not wait for it
        if self.prom_dir:
            shutil.rmtree(self.prom_dir, ignore_errors=True)

    def result(self):
        """None while it runs; then (ok, what it printed)."""
        if self.status is None:
            return None
        self.out.seek(0)
        text = self.out.read().decode("utf-8", "replace").strip()
        self.out.close()
        return self.proc.returncode == 0, text

    def cancel(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                self.reaped(os.waitpid(self.pid, 0)[1])
            except (ProcessLookupError, ChildProcessError):
                pass
        self.out.close()


class InPlaceReload:
    """The master's side (a mixin of arbiter.Arbiter): start the check,
    exec when it passed, and in the new image take over what the old one
    held. Uses the arbiter's workers, slots, sockets, offload, notifier."""

    def _keep_layout(self, st):
        """Settings the running workers' shared memory is laid out for
        cannot change in a reload: the old values stay, with a warning."""
        for name, old in (("threads", st["slots"]["threads"]), ("balance", st["balance"])):
            if self.cfg[name] != old:
                self.log.warning("reload: --%s %s takes a restart; keeping %s", name, self.cfg[name], old)
                self.cfg[name] = self.options[name] = old
        self.threads, self.balance = self.cfg["threads"], self.cfg["balance"]

    def _adopt_workers(self, st):
        self.reloads = st["reloads"]
        self.code_image = st.get("code_image", 0) + 1
        self.spawns.update({int(k): v for k, v in st["spawns"].items()})
        self.retired_requests.update({int(k): v for k, v in st.get("retired_requests", {}).items()})
        self.timeouts.update({int(k): v for k, v in st["timeouts"].items()})
        self.restarts.update(st["restarts"])
        for d in st["workers"]:
            w = self.worker_info(d["pid"], d["index"], d["ready_fd"])
            w.slot, w.ready, w.retiring, w.old = d["slot"], d["ready"], d["retiring"], True
            w.image = d.get("image", 0)
            self.workers[w.pid] = w
        # Ours alone again: nothing we start later inherits them.
        for fd in self._state()[1]:
            os.set_inheritable(fd, False)

    def _state(self):
        """What a re-executed master takes over (JSON), and its descriptors."""
        slots, fds = self.slots.state()
        state = {"pid": self.pid, "balance": self.balance, "sockets": [s.fileno() for s in self.sockets],
                 "bind": self.cfg["bind"], "uwsgi_socket": self.cfg["uwsgi_socket"], "protocol": self.cfg["protocol"],
                 "protocols": self.protocols,
                 "slots": slots, "offload": None, "reloads": self.reloads + 1, "code_image": self.code_image,
                 "spawns": dict(self.spawns), "timeouts": dict(self.timeouts), "restarts": dict(self.restarts),
                 "retired_requests": dict(self.retired_requests),
                 "statsd": self.statsd.sent if self.statsd else None,     # sent just before (check_preflight)
                 "observers": {obs.name: obs.fileno() for obs in self.observers},
                 "observer_addrs": {obs.name: self.cfg[obs.name] for obs in self.observers},
                 "workers": [{"pid": w.pid, "index": w.index, "slot": w.slot, "ready": w.ready,
                              "ready_fd": w.ready_fd, "retiring": w.retiring,
                              "image": w.image} for w in self.workers.values()]}
        fds += state["sockets"] + [w.ready_fd for w in self.workers.values() if w.ready_fd is not None]
        fds += list(state["observers"].values())
        if self.offload:
            queue, qfds = self.offload.queue.state()
            queue["sibling"] = self.offload.pid
            queue["cfg"] = {k: v for k, v in self.offload.queue.cfg.items() if k.startswith("offload_")}
            state["offload"] = queue
            fds += qfds
        return state, fds

    def reload_in_place(self, why):
        if self.preflight:
            self.log.info("Received %s: a reload is already under way", why)
            return
        self.log.info("Received %s: rolling reload of %d worker(s) with the code as it is now: checking that "
                      "the app imports, then the master re-executes itself in place (same PID) and each old "
                      "worker retires once a new one is ready", why, self.num_workers)
        self.notifier.reloading()
        self.announce = True
        self.hooks.call("on_reload", self)
        try:
            self.preflight = Preflight(self.argv, self.cwd)
        except OSError as e:
            # E2BIG: an environment of over 128 KiB in one variable (an ini's
            # env = X=@(FILE)); the exec would fail the same way.
            self.log.error("reload: cannot start the check of the new code: %s; the workers serve on", e)
            self.announce_ready()
            return
        if self.offload:
            # The sibling hands over now, as on any reload (a SIGHUP sent to
            # the whole group tells it so itself): its exit is expected.
            self.offload.reload()

    def check_preflight(self):
        """Once the check of a reload has ended: exec, or say why not."""
        if not self.preflight or self.preflight.status is None:
            return
        ok, output = self.preflight.result()
        self.preflight = None
        if self.stop_pending():
            return
        if not ok:
            self.log.error("reload: the new code does not load, the %d worker(s) serve on with the code they "
                           "have: %s", len(self.workers), output or "(no output)")
            self.announce_ready()
            return
        if not self.same_layout(output):
            self.announce_ready()
            return
        self.re_execute()

    def same_layout(self, output):
        """Does the build the check ran lay out the shared memory as this
        one (slots.LAYOUT)? If not (forkwsgi was upgraded in place), an
        exec would read the running workers' memory wrongly: said, and the
        workers serve on until a restart."""
        said = layout_of(output)
        if said is None or said == slots.LAYOUT:
            return True          # (a build before the check said it: as before)
        self.log.error("reload: the forkwsgi now installed lays out the memory shared with the workers "
                       "differently (%s; running: %s): an upgrade of forkwsgi itself takes a restart; the %d "
                       "worker(s) serve on", said, slots.LAYOUT, len(self.workers))
        return False

    def re_execute(self):
        """exec() into a new image of this master, which takes over the
        workers; returns only if that failed (said in the log)."""
        if self.statsd:
            self.statsd.flush(self)     # what was counted so far goes now: the new image starts from there
        observer.finish(self.observers, self, FINISH_OBSERVERS)
        if self.stop_pending():
            self.log.info("reload: a stop came first; no re-execution")
            return
        state, fds = self._state()
        if self.hooks.call("pre_exec", self) is False:
            # As gunicorn, whose new master does not start when pre_exec raises.
            self.log.error("reload: the pre_exec hook raised (above): no re-execution; the workers serve on")
            self.announce_ready()
            return
        err = execute(state, fds, self.argv, self.cwd, self.SIGNALS, self.notifier.environ(), self.sig_queue)
        self.log.error("reload: cannot re-execute %s: %s; the workers serve on", sys.executable, err)
        self.announce_ready()


def layout_of(output):
    """The shared-memory layout a preflight check reported, or None."""
    for line in (output or "").splitlines():
        if line.startswith(preflight.LAYOUT_SAYS):
            return line[len(preflight.LAYOUT_SAYS):].strip()
    return None


def execute(state, fds, argv, cwd, signals, extra_env, queued):
    """exec() this process into a new forkwsgi master with `argv`, handing
    it `state` (JSON), the descriptors `fds` and extra_env (what was taken
    out of the environment at start: systemd's NOTIFY_SOCKET). The signals
    received but not yet handled (`queued`, emptied) are raised again while
    blocked: pending across exec, the new image handles them. Returns only
    if exec failed (after undoing what it did), with the OSError."""
    for fd in fds:
        os.set_inheritable(fd, True)
    env = dict(os.environ, **extra_env)
    env[ENV] = json.dumps(state, separators=(",", ":"))
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    for stream in [*log.handlers, sys.stdout, sys.stderr]:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass        # a full disk under --capture-output: what was not written is lost, the reload goes on
    for sig in dict.fromkeys(queued):
        # To this thread, which blocks it: its pending set survives exec
        # (a signal to the process could go to another thread, unblocked).
        signal.pthread_kill(threading.get_ident(), sig)
    queued.clear()
    here = os.getcwd()
    try:
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", "forkwsgi", *argv], env)
    except OSError as e:
        os.chdir(here)
        for fd in fds:
            os.set_inheritable(fd, False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
        return e
