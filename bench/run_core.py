#!/usr/bin/env python3
"""Side-by-side benchmark of forkwsgi's core (one process, one thread)
against bjoern and gunicorn (sync and gthread, 1 worker each).

    python3 bench/run_core.py            # the full run (~9-10 minutes)
    python3 bench/run_core.py --quick    # 1 repetition of 3 s, to try it out

Run it with the Python where forkwsgi is installed; the peers are installed
into their own virtualenv, bench/.venv, which this script creates.

Every server is pinned to CPU 0 and wrk to CPU 1 (taskset). Each
(server, workload) cell is run REPS times, round-robin across servers so
machine noise is spread over all of them; every run starts a fresh server,
waits until it answers, discards a warm-up run of wrk, then measures.
Raw wrk output and server logs go to bench/out/ (gitignored); the summary
goes to the terminal and to the "Core" section of bench/RESULTS.md.
"""
import argparse
import datetime
import glob
import hashlib
import http.client
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import apt_install, cpu_times, log, run_quiet, wait_until_quiet, write_section  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(BENCH, ".venv")
VENV_PY = os.path.join(VENV, "bin", "python")
OUT = os.path.join(BENCH, "out")
RESULTS = os.path.join(BENCH, "RESULTS.md")
SECTION = "## Core: single process vs bjoern, gunicorn"

# Extra gunicorn flags, decided in ensure_venv(): gunicorn 25+ opens a
# control socket under ~/.gunicorn unless told not to.
GUNICORN_EXTRA = []

SERVER_CPU = "0"
CLIENT_CPU = "1"
HOST = "127.0.0.1"
FIRST_PORT = 20100

SERVERS = ["forkwsgi", "bjoern", "gunicorn-sync", "gunicorn-gthread"]
PIPELINE_PROBE_DEPTH = 3

# name -> (description, app, wrk arguments, servers)
WORKLOADS = {
    "keepalive-hello": ("keep-alive, 50 connections, hello (13 B)", "hello",
                        ["-t1", "-c50"], SERVERS),
    "keepalive-4k": ("keep-alive, 50 connections, 4 KiB body", "body4k",
                     ["-t1", "-c50"], SERVERS),
    "close-hello": ("Connection: close, 10 connections, hello", "hello",
                    ["-t1", "-c10", "-H", "Connection: close"], SERVERS),
    # Servers that do not answer every request of a pipelined batch are
    # probed, found out and skipped (see Server.probe_pipelining).
    "pipeline16-hello": ("pipelined depth 16, 50 connections, hello", "hello",
                         ["-t1", "-c50"], SERVERS),
}

EXPECTED_BODY = {"hello": b"Hello, World!", "body4k": b"x" * 4096}




# ---------------------------------------------------------------- setup



def ensure_system_packages():
    """wrk and libev-dev (bjoern builds against it) from apt, if missing."""
    missing = []
    if not shutil.which("wrk"):
        missing.append("wrk")
    if not os.path.exists("/usr/include/ev.h"):
        missing.append("libev-dev")
    if not shutil.which("taskset"):
        missing.append("util-linux")
    if not missing:
        return
    apt_install(*missing)
    if not shutil.which("wrk") or not shutil.which("taskset"):
        sys.exit("wrk and taskset are required")


def first_error_line(pip_output):
    """The first compiler error if there is one, else pip's first ERROR line."""
    lines = [ln.strip() for ln in pip_output.splitlines()]
    for pattern in (r": (fatal )?error: ", r"^ERROR: ", r"\berror\b"):
        for line in lines:
            if re.search(pattern, line):
                return line
    return lines[-1] if lines else "(no output)"


def ensure_venv():
    """bench/.venv with bjoern and gunicorn; try meinheld and record why it fails."""
    if not os.path.exists(VENV_PY):
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    pip = [VENV_PY, "-m", "pip", "--disable-pip-version-check"]
    if run_quiet([VENV_PY, "-c", "import bjoern, gunicorn"]).returncode != 0:
        log("installing bjoern and gunicorn into bench/.venv")
        r = run_quiet([*pip, "install", "bjoern", "gunicorn"])
        if r.returncode != 0:
            log(r.stdout[-3000:])
            sys.exit("could not install bjoern/gunicorn")
    log("trying to install meinheld into bench/.venv (expected to fail on 3.11)")
    r = run_quiet([*pip, "install", "meinheld"])
    if r.returncode == 0:
        meinheld = "meinheld: installed (not benchmarked by this script)"
    else:
        py = run_quiet([VENV_PY, "-c", "import platform; print(platform.python_version())"])
        pin = re.search(r"Downloading (greenlet-[\w.]+?)\.tar\.gz", r.stdout)
        meinheld = (f"meinheld: does not build on Python {py.stdout.strip()}"
                    f"{' (it pins ' + pin.group(1) + ')' if pin else ''}: "
                    f"{first_error_line(r.stdout)}")
        with open(os.path.join(OUT, "meinheld-pip.log"), "w") as f:
            f.write(r.stdout)
    gunicorn_help = run_quiet([VENV_PY, "-m", "gunicorn", "--help"]).stdout
    if "--no-control-socket" in gunicorn_help:
        GUNICORN_EXTRA[:] = ["--no-control-socket"]
    versions = run_quiet([VENV_PY, "-c",
                          "import importlib.metadata as m; "
                          "print(m.version('bjoern'), m.version('gunicorn'))"]).stdout.split()
    return meinheld, {"bjoern": versions[0], "gunicorn": versions[1]}


# ---------------------------------------------------------------- machine load





# ---------------------------------------------------------------- servers

def server_argv(server, app, port):
    bind = f"{HOST}:{port}"
    if server == "forkwsgi":
        return [sys.executable, "-m", "forkwsgi", f"apps:{app}", "--bind", bind]
    if server == "bjoern":
        return [VENV_PY, "serve_bjoern.py", app, str(port)]
    if server == "gunicorn-sync":
        return [VENV_PY, "-m", "gunicorn", "-w", "1", "-k", "sync", *GUNICORN_EXTRA,
                "-b", bind, f"apps:{app}"]
    if server == "gunicorn-gthread":
        return [VENV_PY, "-m", "gunicorn", "-w", "1", "-k", "gthread", "--threads", "1",
                *GUNICORN_EXTRA, "-b", bind, f"apps:{app}"]
    raise ValueError(server)


def display_command(argv):
    """A command as the reader would type it from the repository root."""
    shown = []
    for a in argv:
        if a == sys.executable:
            a = "python3"
        elif a == VENV_PY:
            a = "bench/.venv/bin/python"
        elif a == "serve_bjoern.py":
            a = "bench/serve_bjoern.py"
        elif " " in a:
            a = f'"{a}"'
        shown.append(a)
    return " ".join(shown)


class Server:
    def __init__(self, name, app, port, log_path):
        self.name, self.app, self.port = name, app, port
        self.log_path = log_path
        self.argv = ["taskset", "-c", SERVER_CPU, *server_argv(name, app, port)]
        self.logf = open(log_path, "w")
        # taskset execs the server, so proc.pid is the server's own PID.
        self.proc = subprocess.Popen(self.argv, cwd=BENCH, stdout=self.logf,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout=20.0):
        """Until GET / answers 200 (for gunicorn: the worker, not just the master)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                c = http.client.HTTPConnection(HOST, self.port, timeout=1)
                c.request("GET", "/")
                ok = c.getresponse().status == 200
                c.close()
                if ok:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def probe(self):
        """One raw request: status line, response head size, body check."""
        with socket.create_connection((HOST, self.port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            want = EXPECTED_BODY[self.app]
            while len(body) < len(want):
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
        return {"status_line": head.split(b"\r\n")[0].decode("latin-1"),
                "head_bytes": len(head) + 4,
                "head": head.decode("latin-1"),
                "body_ok": body == want}

    def probe_pipelining(self, depth=PIPELINE_PROBE_DEPTH):
        """Send `depth` requests in one write; count the responses within 2 s."""
        with socket.create_connection((HOST, self.port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n" * depth)
            data, deadline = b"", time.monotonic() + 2
            while data.count(b"HTTP/1.1 ") < depth and time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                data += chunk
        return data.count(b"HTTP/1.1 ")

    def tree_cpu_seconds(self):
        """user+system CPU of the server and its descendants (gunicorn's worker)."""
        pids, parents = {self.proc.pid}, {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    parents[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
                except (OSError, IndexError, ValueError):
                    pass
        grew = True
        while grew:
            grew = False
            for pid, (ppid, _) in parents.items():
                if ppid in pids and pid not in pids:
                    pids.add(pid)
                    grew = True
        ticks = sum(parents[p][1] for p in pids if p in parents)
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self):
        """SIGTERM by PID, SIGKILL if it lingers. Returns (crashed, exit code)."""
        crashed = self.proc.poll() is not None
        if not crashed:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        return crashed, self.proc.returncode


# ---------------------------------------------------------------- wrk

def wrk_argv(workload, port, seconds):
    _, _, args, _ = WORKLOADS[workload]
    script = "pipeline.lua" if workload.startswith("pipeline") else "stats.lua"
    return ["wrk", *args, f"-d{seconds}s", "--latency", "-s", script, f"http://{HOST}:{port}/"]


def run_wrk(workload, port, seconds):
    argv = ["taskset", "-c", CLIENT_CPU, *wrk_argv(workload, port, seconds)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        r = run_quiet(argv, cwd=BENCH, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return None, f"wrk did not finish within {seconds + 60} s", 0.0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    m = re.search(r"^BENCH-STATS (.*)$", r.stdout, re.M)
    if r.returncode != 0 or not m:
        return None, r.stdout, cpu
    stats = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    stats["rps"] = stats["requests"] / (stats["duration_us"] / 1e6)
    stats["errors"] = stats["connect"] + stats["read"] + stats["write"] + stats["timeout"]
    return stats, r.stdout, cpu


def one_run(server, workload, rep, port, duration, warmup, quiet_wait):
    app = WORKLOADS[workload][1]
    tag = f"{workload}.{server}.{rep}"
    waited, busy = wait_until_quiet(quiet_wait)
    if busy >= 10.0:
        log(f"    machine still busy ({busy:.0f}% of a CPU used by others) after {waited:.0f} s; "
            "running anyway")
    srv = Server(server, app, port, os.path.join(OUT, f"{tag}.server.log"))
    result = {"server": server, "workload": workload, "rep": rep, "port": port,
              "command": display_command(srv.argv)}
    try:
        if not srv.wait_ready():
            result["failure"] = "server did not become ready"
            return result
        result["probe"] = srv.probe()
        if workload.startswith("pipeline"):
            answered = srv.probe_pipelining()
            if answered < PIPELINE_PROBE_DEPTH:
                result["unsupported"] = (f"answered {answered} of {PIPELINE_PROBE_DEPTH} "
                                         "pipelined requests sent in one write")
                return result
        run_wrk(workload, port, warmup)                     # discarded
        cpu0, (proc0, irq0) = srv.tree_cpu_seconds(), cpu_times()
        t0 = time.monotonic()
        stats, text, wrk_cpu = run_wrk(workload, port, duration)
        wall = time.monotonic() - t0
        server_cpu = srv.tree_cpu_seconds() - cpu0
        proc1, irq1 = cpu_times()
        result["server_cpu_pct"] = 100 * server_cpu / wall
        result["wrk_cpu_pct"] = 100 * wrk_cpu / wall
        result["softirq_cpu_pct"] = 100 * (irq1 - irq0) / wall
        result["other_cpu_pct"] = max(0.0, 100 * (proc1 - proc0 - server_cpu - wrk_cpu) / wall)
        with open(os.path.join(OUT, f"{tag}.wrk.txt"), "w") as f:
            f.write(text)
        if stats is None:
            result["failure"] = "wrk failed: " + text.strip()[-300:]
        else:
            result.update(stats)
    finally:
        crashed, code = srv.stop()
        if crashed:
            result["failure"] = f"server exited during the run (code {code})"
        with open(srv.log_path, errors="replace") as f:
            server_log = f.read()
        result["log_tail"] = server_log[-1500:]
        result["log_suspicious"] = [ln for ln in server_log.splitlines()
                                    if re.search(r"error|traceback|exception|warn|critical",
                                                 ln, re.I)][:10]
    return result


# ---------------------------------------------------------------- report

def median(values):
    return statistics.median(values) if values else float("nan")


def summarize(results):
    rows = []
    for workload, (desc, _, _, servers) in WORKLOADS.items():
        for server in servers:
            runs = [r for r in results if r["server"] == server and r["workload"] == workload]
            ok = [r for r in runs if "rps" in r]
            rows.append({
                "workload": workload, "server": server, "runs": len(runs), "ok": len(ok),
                "rps": median([r["rps"] for r in ok]),
                "rps_all": [round(r["rps"]) for r in ok],
                "p50_ms": median([r["p50_us"] / 1000 for r in ok]),
                "p99_ms": median([r["p99_us"] / 1000 for r in ok]),
                "non2xx": sum(r["status"] for r in ok),
                "errors": sum(r["errors"] for r in ok),
                "error_detail": {k: sum(r[k] for r in ok)
                                 for k in ("connect", "read", "write", "timeout")},
                "server_cpu": median([r["server_cpu_pct"] for r in ok]),
                "cpu_us_per_req": median([r["server_cpu_pct"] * 1e4 / r["rps"] for r in ok]),
                "wrk_cpu": median([r["wrk_cpu_pct"] for r in ok]),
                "softirq_cpu": median([r["softirq_cpu_pct"] for r in ok]),
                "other_cpu": max([r["other_cpu_pct"] for r in ok], default=float("nan")),
                "failures": [r["failure"] for r in runs if "failure" in r],
                "unsupported": next((r["unsupported"] for r in runs if "unsupported" in r), None),
            })
    return rows


def lat(ms):
    # wrk reports 0 percentiles when its latency histogram is unusable.
    return "n/a" if ms == 0 else f"{ms:.2f}"


def fmt_table(rows):
    header = ("| workload | server | req/s (median) | req/s (each run) | p50 ms | p99 ms "
              "| non-2xx | socket errors | server CPU % | server CPU µs/req | wrk CPU % "
              "| softirq CPU % | others' CPU % (worst run) |")
    lines = [header, "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r["ok"]:
            why = r["unsupported"] or "; ".join(r["failures"]) or "no run"
            lines.append(f"| {r['workload']} | {r['server']} | — | {why} | | | | | | | | | |")
            continue
        err = str(r["errors"])
        if r["errors"]:
            err += " (" + ", ".join(f"{k} {v}" for k, v in r["error_detail"].items() if v) + ")"
        lines.append(
            f"| {r['workload']} | {r['server']} | {r['rps']:,.0f} | "
            f"{' / '.join(f'{x:,}' for x in r['rps_all'])} | {lat(r['p50_ms'])} | "
            f"{lat(r['p99_ms'])} | {r['non2xx']} | {err} | {r['server_cpu']:.0f} | "
            f"{r['cpu_us_per_req']:.1f} | "
            f"{r['wrk_cpu']:.0f} | {r['softirq_cpu']:.0f} | {r['other_cpu']:.0f} |")
    return "\n".join(lines)


def ratios(rows):
    by = {(r["workload"], r["server"]): r["rps"] for r in rows if r["ok"]}
    lines = ["| workload | " + " | ".join(f"forkwsgi / {s}" for s in SERVERS[1:]) + " |",
             "|---|" + "---:|" * (len(SERVERS) - 1)]
    for workload in WORKLOADS:
        cells = []
        for peer in SERVERS[1:]:
            if (workload, peer) in by and (workload, "forkwsgi") in by:
                cells.append(f"{by[(workload, 'forkwsgi')] / by[(workload, peer)]:.2f}×")
            else:
                cells.append("—")
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine_facts():
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "?"
    cpu = "?"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    wrk_version = run_quiet(["wrk", "-v"]).stdout.strip().splitlines()[0].split(" Copyright")[0]
    pkg = os.path.join(BENCH, "..", "python", "forkwsgi")
    so = [f for f in os.listdir(pkg) if f.endswith(".so")]
    so_facts = "?"
    if so:
        path = os.path.join(pkg, so[0])
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        built = os.path.getmtime(path)
        sources = glob.glob(os.path.join(BENCH, "..", "cserver", "*.[ch]")) + \
            glob.glob(os.path.join(BENCH, "..", "src", "*.[ch]"))
        newer = [os.path.relpath(p, os.path.join(BENCH, "..")) for p in sources
                 if os.path.getmtime(p) > built]
        so_facts = (f"`{so[0]}` sha256 {digest}…, built "
                    f"{datetime.datetime.fromtimestamp(built, datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
                    + (f"; **older than** {', '.join(sorted(newer))} (stale build?)" if newer else
                       ", newer than every C source"))
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
        "python": platform.python_version(), "wrk": wrk_version,
        "ip_local_port_range": read("/proc/sys/net/ipv4/ip_local_port_range").replace("\t", "-"),
        "tcp_tw_reuse": read("/proc/sys/net/ipv4/tcp_tw_reuse"),
        "forkwsgi_so": so_facts,
    }


def git_state():
    head = run_quiet(["git", "-C", BENCH, "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = run_quiet(["git", "-C", BENCH, "status", "--porcelain", "--", "../cserver", "../src",
                       "../python"]).stdout.split("\n")
    dirty = [ln[3:] for ln in dirty if ln.strip()]
    return head, dirty


def write_results(rows, results, meinheld, versions, facts, args, started, elapsed):
    head, dirty = git_state()
    probes = {}
    for r in results:
        if "probe" in r and r["workload"] == "keepalive-hello":
            probes.setdefault(r["server"], r["probe"])
    commands = {}
    for r in results:
        commands.setdefault(r["server"], {}).setdefault(r["workload"], r["command"])
    problems = []
    for r in results:
        tag = f"{r['workload']}/{r['server']}/run {r['rep'] + 1}"
        if "failure" in r:
            problems.append(f"- {tag}: **{r['failure']}**; server log tail:\n\n```\n"
                            f"{r['log_tail']}\n```")
        elif r.get("log_suspicious"):
            problems.append(f"- {tag}: server log lines: "
                            + "; ".join(f"`{ln.strip()}`" for ln in r["log_suspicious"]))
        if r.get("probe") and not r["probe"]["body_ok"]:
            problems.append(f"- {tag}: wrong response body")

    port = "PORT"
    wrk_lines = "\n".join(
        f"taskset -c {CLIENT_CPU} " + display_command(wrk_argv(w, port, args.duration))
        for w in WORKLOADS)
    server_lines = "\n".join(
        f"{display_command(['taskset', '-c', SERVER_CPU, *server_argv(s, 'APP', port)])}"
        for s in SERVERS)
    section = f"""{SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `python3 bench/run_core.py{' --quick' if args.quick else ''}` \
(took {elapsed / 60:.1f} min).

**Machine.** nproc {facts['nproc']} ({facts['cpu']}), kernel {facts['kernel']}, \
Python {facts['python']} (same interpreter for forkwsgi and the peers' venv), {facts['wrk']}, \
ip_local_port_range {facts['ip_local_port_range']}, tcp_tw_reuse {facts['tcp_tw_reuse']}.
Server pinned to CPU {SERVER_CPU}, wrk to CPU {CLIENT_CPU}; everything on 127.0.0.1.

**Software.** forkwsgi from git {head}{' with uncommitted changes in ' + ', '.join(dirty) if dirty else ''} \
(the installed extension {facts['forkwsgi_so']}); \
bjoern {versions['bjoern']}, gunicorn {versions['gunicorn']} (in bench/.venv).
{meinheld}

**Method.** Apps: `bench/apps.py` — `hello` (13-byte body) and `body4k` (4096-byte body),
both with Content-Type text/plain and an explicit Content-Length. For each (server, workload)
cell, {args.reps} run(s), interleaved round-robin across servers (the server order rotates each
round); each run starts a fresh server, waits until `GET /` answers 200, runs wrk for
{args.warmup} s and discards it, then measures {args.duration} s. The table gives the median
req/s over the runs (and each run's figure), the median of wrk's p50/p99 latency, the total of
non-2xx responses (wrk counts status ≥ 400) and of socket errors (connect/read/write/timeout)
over all runs, and median CPU use in % of one CPU: of the server (process tree, on CPU
{SERVER_CPU}, from /proc/PID/stat), of wrk (on CPU {CLIENT_CPU}, from its rusage), and the
irq+softirq time of both CPUs from /proc/stat (loopback TCP delivery; the kernel may also have
charged part of it to the processes, so the columns can add up to more than 200 %). A server
near 100 % is the bottleneck; wrk near 100 % means the load generator is. "Server CPU µs/req"
(server CPU time over requests served) is the figure least disturbed by other load.
Before each run the script waits (up to {args.quiet_wait:.0f} s) for other processes to go
idle; "others' CPU" is what other processes on the machine used during the worst run of the
cell — anything above a few % means that cell's figures are disturbed.
Pipelining (depth 16, `bench/pipeline.lua`) counts every response in req/s, but wrk's latency
there is per batch of 16 (from sending the batch to its last response). It is measured only
for servers that pass a probe first: {PIPELINE_PROBE_DEPTH} requests sent in one write must get {PIPELINE_PROBE_DEPTH} responses within 2 s;
the others are listed with what they did.

Server commands (APP is `hello` or `body4k`):

```
{server_lines}
```

wrk commands (each also run once for {args.warmup} s first, discarded; run from bench/):

```
{wrk_lines}
```

### Results

{fmt_table(rows)}

### forkwsgi / peer, median req/s

{ratios(rows)}

### Response heads (hello, as sent to `GET / HTTP/1.1`)

""" + "\n".join(f"- {s}: {p['head_bytes']} bytes — `{p['head'].replace(chr(13) + chr(10), ' ⏎ ')}`"
                for s, p in probes.items()) + f"""

### Problems seen

{chr(10).join(problems) if problems else 'None: every run completed, no server exited early, no error lines in server logs.'}
"""
    write_section(RESULTS, SECTION, section)


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10, help="measured seconds per run")
    ap.add_argument("--warmup", type=int, default=2, help="discarded warm-up seconds per run")
    ap.add_argument("--quiet-wait", type=float, default=15,
                    help="before each run, wait up to this many seconds for other "
                         "processes to go idle")
    ap.add_argument("--quick", action="store_true", help="1 rep of 3 s (smoke test)")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.duration, args.warmup = 1, 3, 1

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    os.makedirs(OUT, exist_ok=True)
    if run_quiet([sys.executable, "-c", "import forkwsgi"]).returncode != 0:
        sys.exit(f"forkwsgi is not importable from {sys.executable}; run this with the "
                 "Python where forkwsgi is installed")
    ensure_system_packages()
    meinheld, versions = ensure_venv()
    log(meinheld)
    facts = machine_facts()

    plan = []
    for rep in range(args.reps):
        for workload, (_, _, _, servers) in WORKLOADS.items():
            k = rep % len(servers)
            for server in servers[k:] + servers[:k]:
                plan.append((server, workload, rep))
    per_run = args.duration + args.warmup + 1.2
    log(f"{len(plan)} runs, at most about {len(plan) * per_run / 60:.1f} min "
        "(servers failing the pipelining probe are skipped)")

    results, unsupported = [], set()
    for i, (server, workload, rep) in enumerate(plan):
        if (server, workload) in unsupported:
            continue
        port = FIRST_PORT + i
        r = one_run(server, workload, rep, port, args.duration, args.warmup, args.quiet_wait)
        results.append(r)
        if "unsupported" in r:
            unsupported.add((server, workload))
            log(f"[{i + 1}/{len(plan)}] {workload:17} {server:17} skipped: {r['unsupported']}")
        elif "rps" in r:
            log(f"[{i + 1}/{len(plan)}] {workload:17} {server:17} {r['rps']:>10,.0f} req/s  "
                f"p50 {r['p50_us'] / 1000:.2f} ms  p99 {r['p99_us'] / 1000:.2f} ms  "
                f"non-2xx {r['status']}  errors {r['errors']}  "
                f"cpu srv {r['server_cpu_pct']:.0f}% wrk {r['wrk_cpu_pct']:.0f}% "
                f"softirq {r['softirq_cpu_pct']:.0f}% others {r['other_cpu_pct']:.0f}%")
        else:
            log(f"[{i + 1}/{len(plan)}] {workload:17} {server:17} FAILED: {r['failure']}")
    elapsed = time.monotonic() - t_start

    with open(os.path.join(OUT, "core-results.json"), "w") as f:
        json.dump({"facts": facts, "versions": versions, "meinheld": meinheld,
                   "results": results}, f, indent=1)
    rows = summarize(results)
    log("\n" + fmt_table(rows) + "\n\n" + ratios(rows) + "\n\n" + meinheld)
    if not args.no_write:
        write_results(rows, results, meinheld, versions, facts, args, started, elapsed)
        log(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
