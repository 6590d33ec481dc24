"""Server process trees: started pinned in their own session, checked
ready, measured, stopped by PID then by group; ports, pinning, nginx in front."""
import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import time

from .base import BENCH, CLIENT_CPU, HOST, SERVER_CPU, wait_until
from .cpu import proc_table
from .uwsgi import UWSGI_BIN


def free_port(host=HOST, pair=False):
    """A port nobody listens on now (the kernel's pick for port 0); with
    pair, one whose next port is free too."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not pair or port >= 65535:
            return port
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port")


def pinned(cpu, argv):
    """argv run on CPU `cpu` only (taskset execs it: same PID)."""
    return ["taskset", "-c", cpu, *argv]


def pin_self(cpus):
    """Pin this process (the Python clients) to `cpus`, if allowed: one CPU
    ("1" or 1) or a set of them. Returns the CPUs it had before."""
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {int(c) for c in cpus} if isinstance(cpus, (set, frozenset)) else {int(cpus)})
    except OSError:
        pass
    return before


@contextlib.contextmanager
def pinned_self(cpus):
    """This process pinned to `cpus` (as pin_self) inside the block, then
    back: a process started inside (with all its threads) inherits them."""
    before = pin_self(cpus)
    try:
        yield
    finally:
        pin_self(before)


def wait_http(port, path="/", timeout=20.0, alive=None, conn_timeout=1.0, body=None, headers=None,
              host=HOST):
    """Until GET `path` answers 200 (and, given `body`, exactly that body);
    False at the deadline or once alive() says the server is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            c = http.client.HTTPConnection(host, port, timeout=conn_timeout)
            c.request("GET", path, headers=headers or {})
            r = c.getresponse()
            got = r.read()
            c.close()
            if r.status == 200 and (body is None or got == body):
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def wait_listening(port, timeout=20.0, alive=None, pause=0.05, host=HOST):
    """Until a TCP connection to the port succeeds; False at the deadline or
    once alive() says the server is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(pause)
    return False


LIVE = set()           # servers started and not yet stopped (stopped at exit by the scripts)


class ServerTree:
    """One server process tree, started in its own session (process group)
    pinned to `cpu` with taskset (cpu None: not pinned); stop() signals it by
    PID, then SIGKILLs the group, so nothing it started outlives the run.
    env None: this process's environment."""

    def __init__(self, argv, port, log_path, env=None, cpu=SERVER_CPU, cwd=BENCH):
        self.port = port
        self.log_path = log_path
        self.argv = pinned(cpu, argv) if cpu is not None else list(argv)
        self.logf = open(log_path, "w")
        # taskset execs the server, so proc.pid is the server's own PID, and
        # with start_new_session it is also the process group of its children.
        self.proc = subprocess.Popen(self.argv, cwd=cwd, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.pgid = self.proc.pid
        self.stopped = False
        LIVE.add(self)

    def exited(self):
        """True once the server has exited (without reaping it, so its PID
        and process group cannot be reused before stop() kills the group)."""
        if self.proc.returncode is not None:
            return True
        try:
            r = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return r is not None

    def tree(self):
        """(PIDs of the server and its descendants, the proc table)."""
        table = proc_table()
        pids, grew = {self.proc.pid}, True
        while grew:
            grew = False
            for pid, (ppid, *_) in table.items():
                if ppid in pids and pid not in pids:
                    pids.add(pid)
                    grew = True
        return pids, table

    def alive(self):
        return not self.exited()

    def wait_ready(self, path="/", timeout=20.0, **kw):
        """Until GET `path` answers 200 (wait_http); False if it exits first."""
        return wait_http(self.port, path, timeout, alive=self.alive, **kw)

    def wait_listening(self, timeout=20.0, **kw):
        """Until its port accepts a connection; False if it exits first."""
        return wait_listening(self.port, timeout, alive=self.alive, **kw)

    def wait_workers(self, workers, timeout=30.0, quiet=0.25):
        """Until the tree holds `workers` processes besides the first (the
        master) and has used under 2 % of a CPU for `quiet` s: every worker
        has booted (imported, started its threads) and waits for connections.
        False at the deadline or if the server exits first."""
        deadline = time.monotonic() + timeout
        if not wait_until(lambda: self.exited() or len(self.tree()[0]) - 1 >= workers, timeout, 0.05):
            return False
        while not self.exited():
            before = self.sched_cpu_seconds()
            time.sleep(quiet)
            if self.sched_cpu_seconds() - before < 0.02 * quiet:
                return True
            if time.monotonic() >= deadline:
                return False
        return False

    def cpu_seconds(self):
        """CPU of the tree in clock ticks' resolution (utime+stime, reaped
        children included), in seconds."""
        pids, table = self.tree()
        return sum(table[p][1] for p in pids if p in table) / os.sysconf("SC_CLK_TCK")

    def sched_cpu_seconds(self):
        """CPU time of the server and its descendants in seconds, each
        thread's on-CPU time from /proc/PID/task/TID/schedstat (ns). Not
        utime+stime: those are sampled at each clock tick, and at 250 Hz a
        5 s cell of a server at 60 % CPU is ~750 samples, a few % of noise in
        CPU per request. Falls back to the processes' own utime+stime where
        the kernel has no schedstat."""
        pids, table = self.tree()
        if not os.path.exists(f"/proc/{self.proc.pid}/schedstat"):
            return sum(table[p][2] for p in pids if p in table) / os.sysconf("SC_CLK_TCK")
        ns = 0
        for pid in pids:
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue                        # exited meanwhile
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        ns += int(f.read().split()[0])
                except (OSError, IndexError, ValueError):
                    pass
        return ns / 1e9

    def stop(self, term_wait=5.0):
        """SIGTERM to the server, SIGKILL to the group after term_wait
        (always). Returns (crashed, exit code)."""
        if self.stopped:
            return False, self.proc.returncode
        crashed = self.exited()
        if not crashed:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + term_wait
            while time.monotonic() < deadline and not self.exited():
                time.sleep(0.05)
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()
        self.stopped = True
        LIVE.discard(self)
        return crashed, self.proc.returncode

    def log_text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()


def stop_all(term_wait=None):
    """Stop every server still running (a script's last step, Ctrl-C
    included); term_wait None: each server's own default."""
    for srv in list(LIVE):
        srv.stop() if term_wait is None else srv.stop(term_wait)


def nginx_conf(dir, http, connections=1024):
    """An nginx.conf for a run: in the foreground, its pid, error log and
    temp files in `dir`, around `http` (the inside of the http block)."""
    return f"""worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
daemon off;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
{http}
}}
"""


def start_nginx(dir, http, port, cpu=CLIENT_CPU):
    """nginx in the foreground with nginx_conf(dir, http) (listening on
    `port`), pinned to `cpu`, as a ServerTree; its error log is
    `.error_log`."""
    conf = os.path.join(dir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(nginx_conf(dir, http))
    error_log = os.path.join(dir, "error.log")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    tree = ServerTree([nginx, "-p", dir, "-e", error_log, "-c", conf], port, os.path.join(dir, "nginx.out"),
                      cpu=cpu)
    tree.error_log = error_log
    return tree


# Process layouts (workers, threads per worker) a benchmark can ask of a
# server: "1x1" is one process with one thread serving, "4x4" four worker
# processes with four app threads each.
LAYOUTS = {"1x1": (1, 1), "4x4": (4, 4)}


def uwsgi_command(spec, port, workers=1, threads=1):
    """uWSGI (bench/.venv-uwsgi) serving `spec` over HTTP with keep-alive, on
    127.0.0.1:port: its HTTP router (--http, one async process forwarding
    to the workers over a uwsgi socket, a connection per request) with
    --http-keepalive, a master, `workers` processes x `threads` threads.
    Not --http-socket (no keep-alive: a connection per request) nor
    --http11-socket (keep-alive, but each thread keeps its one connection
    until the client closes it or --socket-timeout passes, so 50 clients
    on one thread wait seconds in the accept queue)."""
    return [UWSGI_BIN, "--http", f"{HOST}:{port}", "--http-keepalive", "--master", "--processes", str(workers),
            "--threads", str(threads), "--pythonpath", BENCH, "--module", spec, "--listen", "1024",
            "--disable-logging", "--die-on-term", "--need-app"]


def peer_command(server, spec, port, python, layout="1x1"):
    """The command that serves the WSGI app `spec` (MODULE:NAME) with a peer
    server (bjoern, fastpysgi, granian, gunicorn-gthread, uwsgi) on
    127.0.0.1:port in `layout` (a LAYOUTS key), run by `python` (bench/.venv's;
    uwsgi runs from bench/.venv-uwsgi, see uwsgi_command). bjoern and
    fastpysgi have only "1x1" (ValueError otherwise)."""
    workers, threads = LAYOUTS[layout]
    module, name = spec.split(":")
    if server == "granian":
        return [python, "-m", "granian", "--interface", "wsgi", "--host", HOST, "--port", str(port),
                "--workers", str(workers), "--blocking-threads", str(threads), "--no-ws", spec]
    if server == "gunicorn-gthread":
        return [python, "-m", "gunicorn", "-w", str(workers), "-k", "gthread", "--threads", str(threads),
                "--no-control-socket", "-b", f"{HOST}:{port}", spec]
    if server == "uwsgi":
        return uwsgi_command(spec, port, workers, threads)
    if (workers, threads) != (1, 1):
        raise ValueError(f"{server} serves from one process and one thread only, not {layout}")
    run = {"bjoern": f"import bjoern; bjoern.run({name}, '{HOST}', {port})",
           "fastpysgi": f"import fastpysgi; fastpysgi.run({name}, '{HOST}', {port}, workers=1)"}[server]
    return [python, "-c", f"from {module} import {name}; {run}"]
