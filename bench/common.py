"""What the benchmark scripts share, so each script holds only its own
workload and report:

- places and pins: BENCH, ROOT, OUT, RESULTS, HOST, SERVER_CPU, CLIENT_CPU;
  pinned() (taskset for a command), pin_self() (this process);
- servers: ServerTree (a process tree started pinned in its own session,
  ready checks, CPU of the tree, stop by PID then by group), stop_all(),
  wait_http() and wait_listening() (readiness of a port), free_port();
- wrk: run_wrk() (pinned, bounded, its CPU from rusage) and wrk_stats() (the
  BENCH-STATS line of stats.lua);
- CPU accounting: cpu_times(), steal_seconds(), self_cpu_seconds(),
  children_cpu_seconds(), pid_cpu_seconds(), proc_table(), CpuMeter (CPU of
  named parts and of everyone else over a span); wait_until_quiet();
- reports: write_section() (a section of bench/RESULTS.md, the replaced one
  moved to bench/HISTORY.md), nginx_conf(), log(), run_quiet(), apt_install().
"""
import collections
import http.client
import os
import re
import resource
import signal
import socket
import subprocess
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
OUT = os.path.join(BENCH, "out")
RESULTS = os.path.join(BENCH, "RESULTS.md")
HOST = "127.0.0.1"
SERVER_CPU = "0"       # every server under test
CLIENT_CPU = "1"       # wrk, the Python clients, nginx in front


def log(msg=""):
    print(msg, flush=True)


def run_quiet(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def apt_install(*packages):
    """Debian packages the benchmark needs (as root); what fails is logged."""
    log(f"installing with apt-get: {' '.join(packages)}")
    try:
        run_quiet(["apt-get", "update"])
        r = run_quiet(["apt-get", "install", "-y", *packages])
        if r.returncode != 0:
            log(r.stdout[-2000:])
    except OSError as e:
        log(f"apt-get unavailable: {e}")


def cpu_times():
    """(process time, irq+softirq time) in seconds, summed over all CPUs.

    Process time is user+nice+system; with IRQ time accounting (as here) the
    kernel's network softirq work is counted apart from any process."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system) / hz, (irq + softirq) / hz


def steal_seconds():
    """Time the hypervisor gave this VM's CPUs to others, summed over all CPUs."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[7] / os.sysconf("SC_CLK_TCK") if len(fields) > 7 else 0.0


def self_cpu_seconds():
    """CPU of this process (the Python clients' threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def children_cpu_seconds():
    """CPU of this process's reaped children (wrk and other load generators)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pid_cpu_seconds(pid):
    """utime+stime of one process (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    except (OSError, TypeError):
        return 0.0


class CpuSpan(collections.namedtuple("CpuSpan", "wall used others irq steal")):
    """What CpuMeter.stop() measured, in seconds: wall time, CPU of each
    part (used), of every other process (others), IRQ+softirq, steal."""

    def pct(self, seconds):
        """CPU seconds over the span as % of one CPU."""
        return 100 * seconds / self.wall


class CpuMeter:
    """CPU seconds used by named parts between start (construction) and
    stop(), and by everyone else (the machine's process time minus the parts).

        meter = CpuMeter(server=srv.cpu_seconds, client=self_cpu_seconds)
        ...load...
        span = meter.stop()     # span.used["server"], span.others, span.wall

    Each part is a function returning CPU seconds so far."""

    def __init__(self, **parts):
        self.parts = parts
        self.t0 = time.monotonic()
        self.start = {name: fn() for name, fn in parts.items()}
        (self.all0, self.irq0), self.steal0 = cpu_times(), steal_seconds()

    def stop(self):
        wall = time.monotonic() - self.t0
        used = {name: fn() - self.start[name] for name, fn in self.parts.items()}
        proc, irq = cpu_times()
        return CpuSpan(wall=wall, used=used, others=proc - self.all0 - sum(used.values()),
                       irq=irq - self.irq0, steal=steal_seconds() - self.steal0)


def wait_until_quiet(max_wait, threshold_pct=10.0):
    """Wait (at most max_wait s) until other processes use under threshold_pct
    of one CPU over a 0.5 s sample; returns (seconds waited, last busy %).
    Other jobs on this 2-core machine (test suites, builds) skew the figures."""
    t0 = time.monotonic()
    while True:
        before = cpu_times()[0]
        time.sleep(0.5)
        busy = 100 * (cpu_times()[0] - before) / 0.5
        waited = time.monotonic() - t0
        if busy < threshold_pct or waited >= max_wait:
            return waited, busy


HISTORY_HEAD = """# forkwsgi benchmark history

Runs that a newer run of the same benchmark replaced in RESULTS.md, and the
hand-written notes on runs, newest first; each heading starts with the date
(UTC) of the run it is about.

"""


def _heading_span(text, prefix):
    """(start, end) of the section whose "## " heading starts with `prefix`
    (up to the next "## " heading), or None."""
    m = re.search(r"^" + re.escape(prefix), text, re.M)
    if not m:
        return None
    nxt = re.search(r"^## ", text[m.end():], re.M)
    return m.start(), (m.end() + nxt.start() if nxt else len(text))


def _to_history(history_path, old):
    """Put a replaced section at the top of the history file (newest first),
    its heading prefixed with the date of the run it shows."""
    when = re.search(r"Run on (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", old)
    date = when.group(1) if when else time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    entry = "## " + date + " · " + old.strip()[3:] + "\n\n"
    text = HISTORY_HEAD
    if os.path.exists(history_path):
        with open(history_path) as f:
            text = f.read() or HISTORY_HEAD
    first = re.search(r"^## ", text, re.M)
    at = first.start() if first else len(text.rstrip()) + 2
    text = text[:at].rstrip() + "\n\n" + entry + text[at:]
    with open(history_path, "w") as f:
        f.write(text.rstrip() + "\n")


def write_section(path, title, section, replaces=None):
    """Put `section` (headed `title`) in the Markdown file at `path` in place
    of the section whose heading starts with `replaces` (default: `title`), or
    append it; the other sections stay as they are. The section replaced
    moves to the top of HISTORY.md beside `path`, so RESULTS.md holds each
    benchmark's latest run and no run is lost."""
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if not text.strip():
        text = "# forkwsgi benchmarks\n\n"
    span = _heading_span(text, replaces or title)
    if span:
        start, end = span
        _to_history(os.path.join(os.path.dirname(os.path.abspath(path)), "HISTORY.md"), text[start:end])
        text = text[:start] + section.rstrip() + "\n\n" + text[end:].lstrip()
    else:
        text = text.rstrip() + "\n\n" + section
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")


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


def pin_self(cpu):
    """Pin this process (the Python clients) to CPU `cpu`, if allowed."""
    try:
        os.sched_setaffinity(0, {int(cpu)})
    except OSError:
        pass


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


def wrk_stats(output):
    """The figures of bench/stats.lua's "BENCH-STATS k=v ..." line, with
    rps and errors (socket errors of all kinds) added; None without it."""
    m = re.search(r"^BENCH-STATS (.*)$", output, re.M)
    if not m:
        return None
    stats = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    stats["rps"] = stats["requests"] / (stats["duration_us"] / 1e6)
    stats["errors"] = stats["connect"] + stats["read"] + stats["write"] + stats["timeout"]
    return stats


WrkRun = collections.namedtuple("WrkRun", "stats output cpu timed_out")


def run_wrk(args, seconds, url, script="stats.lua", cpu=CLIENT_CPU, prefix=()):
    """`wrk ARGS -dSECONDS --latency -s SCRIPT URL` pinned to `cpu` (after
    `prefix`, e.g. chrt), from bench/, bounded to seconds + 60. Returns a
    WrkRun: stats (wrk_stats(); None if wrk failed or timed out), its
    output, its CPU seconds, timed_out."""
    argv = [*prefix, *pinned(cpu, ["wrk", *args, f"-d{seconds}s", "--latency", "-s", script, url])]
    before = children_cpu_seconds()
    try:
        r = run_quiet(argv, cwd=BENCH, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return WrkRun(None, f"wrk did not finish within {seconds + 60} s", 0.0, True)
    cpu_s = children_cpu_seconds() - before
    return WrkRun(wrk_stats(r.stdout) if r.returncode == 0 else None, r.stdout, cpu_s, False)


def proc_table():
    """pid -> (ppid, CPU ticks incl. reaped children, its own CPU ticks) for
    every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]),
                                     int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                pass
    return table


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
