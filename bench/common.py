"""What the benchmark scripts share: machine load readings, server process
trees started and stopped by PID, and the writer of their sections of
bench/RESULTS.md."""
import os
import re
import signal
import socket
import subprocess
import time


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


def free_port(host="127.0.0.1"):
    """A port nobody listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def proc_table():
    """pid -> (ppid, CPU ticks incl. reaped children) for every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
            except (OSError, IndexError, ValueError):
                pass
    return table


LIVE = set()           # servers started and not yet stopped (stopped at exit by the scripts)


class ServerTree:
    """One server process tree, started in its own session (process group)
    pinned to `cpu` with taskset; stop() signals it by PID, then SIGKILLs the
    group, so nothing it started outlives the run."""

    def __init__(self, argv, port, log_path, env, cpu, cwd):
        self.port = port
        self.log_path = log_path
        self.argv = ["taskset", "-c", cpu, *argv]
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
            for pid, (ppid, _) in table.items():
                if ppid in pids and pid not in pids:
                    pids.add(pid)
                    grew = True
        return pids, table

    def cpu_seconds(self):
        pids, table = self.tree()
        return sum(table[p][1] for p in pids if p in table) / os.sysconf("SC_CLK_TCK")

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

