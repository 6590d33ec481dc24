#!/usr/bin/env python3
"""Load-aware accept benchmark: forkwsgi --balance vs gunicorn and uWSGI.

forkwsgi --balance least-busy / reuseport / shared against gunicorn gthread
(4 x 2, 4 x 2 --reuse-port, 1 x 8) and uWSGI --thunder-lock.

    python3 bench/run_balance.py            # the full run (~35-40 minutes)
    python3 bench/run_balance.py --quick    # 15 s / 8 s cells (~6-8 minutes)

Two parts:

mixed   app = time.sleep(d) with d from the query string. 5 client loops of
        light requests (d uniform in [0, 1] s) and 2 loops of heavy ones
        (d = 10 s); 4 workers x 2 threads (gunicorn also 1 x 8). Reports the
        light requests' overhead (round trip - d), once with a new connection
        per request and once with connections kept alive.
cpu     app = 5 x (sleep 10 ms + ~10 ms of pure-Python CPU): closed-loop
        clients at concurrency 2 and 4, new connection per request, against
        2 workers x 2 threads and 2 x 1. Reports req/s, latency and how many
        requests overlapped another request in the same process.

Run it with the Python where forkwsgi is installed; gunicorn and uWSGI are
installed into bench/.venv, which this script creates. Every server process
is pinned to CPU 0, the clients (threads of this process) to CPU 1; every
server gets a fresh port and is stopped by PID/process group. forkwsgi rows
are "not available" while `python -m forkwsgi --help` lacks --threads and
--balance. Raw results go to bench/out/ (gitignored); the summary to the
terminal and to the "Balancing" section of bench/RESULTS.md.
"""
import argparse
import datetime
import http.client
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH, CLIENT_CPU, HOST, OUT, RESULTS, ROOT, SERVER_CPU, CpuMeter, ServerTree,  # noqa: E402
                    apt_install, first_error_line, free_port, git_head, invocation, log, pin_self, pinned, run_quiet,
                    self_cpu_seconds, stop_all, wait_http, wait_until_quiet, write_section)

VENV = os.path.join(BENCH, ".venv")
VENV_PY = os.path.join(VENV, "bin", "python")
UWSGI = os.path.join(VENV, "bin", "uwsgi")
SECTION = "## Balancing: 4 x 2 mixed workload and half-CPU app"

TIMEOUT = "60"             # --timeout of every server (uWSGI: --harakiri)
KEEPALIVE = "75"           # --keep-alive of forkwsgi and gunicorn

# mixed workload
LIGHT_LOOPS, HEAVY_LOOPS = 5, 2
LIGHT_MAX_DELAY, HEAVY_DELAY = 1.0, 10.0
CLIENT_TIMEOUT = 60.0      # per request; a heavy request is 10 s
# half-CPU app
CONCURRENCIES = (2, 4)

# Extra gunicorn flags, decided in ensure_venv(): gunicorn 25+ opens a
# control socket under ~/.gunicorn unless told not to.
GUNICORN_EXTRA = []




# ---------------------------------------------------------------- servers

def forkwsgi_argv(app, port, workers, threads, balance):
    return [sys.executable, "-m", "forkwsgi", f"balance_apps:{app}",
            "--workers", str(workers), "--threads", str(threads), "--balance", balance,
            "--bind", f"{HOST}:{port}", "--chdir", BENCH,
            "--timeout", TIMEOUT, "--keep-alive", KEEPALIVE]


def gunicorn_argv(app, port, workers, threads, reuse_port=False):
    return [VENV_PY, "-m", "gunicorn", "-w", str(workers), "-k", "gthread",
            "--threads", str(threads), "--timeout", TIMEOUT, "--keep-alive", KEEPALIVE,
            *(["--reuse-port"] if reuse_port else []), *GUNICORN_EXTRA,
            "-b", f"{HOST}:{port}", "--chdir", BENCH, f"balance_apps:{app}"]


def uwsgi_argv(app, port, workers, threads):
    return [UWSGI, "--master", "--processes", str(workers), "--threads", str(threads),
            "--thunder-lock", "--http-socket", f"{HOST}:{port}", "--chdir", BENCH,
            "--module", f"balance_apps:{app}", "--enable-threads", "--die-on-term",
            "--disable-logging", "--need-app", "--harakiri", TIMEOUT]


# name -> (family, workers, argv(app, port))
MIXED_SERVERS = {
    "forkwsgi-least-busy": ("forkwsgi", 4, lambda a, p: forkwsgi_argv(a, p, 4, 2, "least-busy")),
    "forkwsgi-reuseport": ("forkwsgi", 4, lambda a, p: forkwsgi_argv(a, p, 4, 2, "reuseport")),
    "forkwsgi-shared": ("forkwsgi", 4, lambda a, p: forkwsgi_argv(a, p, 4, 2, "shared")),
    "gunicorn-4x2": ("gunicorn", 4, lambda a, p: gunicorn_argv(a, p, 4, 2)),
    "gunicorn-4x2-reuseport": ("gunicorn", 4, lambda a, p: gunicorn_argv(a, p, 4, 2, True)),
    "gunicorn-1x8": ("gunicorn", 1, lambda a, p: gunicorn_argv(a, p, 1, 8)),
}
CPU_SERVERS = {
    "forkwsgi-2x2": ("forkwsgi", 2, lambda a, p: forkwsgi_argv(a, p, 2, 2, "least-busy")),
    "forkwsgi-2x1": ("forkwsgi", 2, lambda a, p: forkwsgi_argv(a, p, 2, 1, "least-busy")),
    "gunicorn-2x2": ("gunicorn", 2, lambda a, p: gunicorn_argv(a, p, 2, 2)),
    "gunicorn-2x1": ("gunicorn", 2, lambda a, p: gunicorn_argv(a, p, 2, 1)),
    "uwsgi-2x2": ("uwsgi", 2, lambda a, p: uwsgi_argv(a, p, 2, 2)),
    "uwsgi-2x1": ("uwsgi", 2, lambda a, p: uwsgi_argv(a, p, 2, 1)),
}
MODES = {"new": "new connection per request", "keepalive": "connections kept alive"}


def display_command(argv, port=None):
    """A command as the reader would type it from the repository root."""
    shown = []
    for a in argv:
        if a == sys.executable:
            a = "python3"
        elif a == VENV_PY:
            a = "bench/.venv/bin/python"
        elif a == UWSGI:
            a = "bench/.venv/bin/uwsgi"
        elif a == BENCH:
            a = "bench"
        elif port is not None:
            a = a.replace(f":{port}", ":PORT")
        shown.append(f'"{a}"' if " " in a else a)
    return " ".join(shown)


class Server(ServerTree):
    """One server (forkwsgi, gunicorn or uWSGI) pinned to SERVER_CPU."""

    def __init__(self, name, family, workers, argv, port, log_path, env):
        super().__init__(argv, port, log_path, env, SERVER_CPU, BENCH)
        self.name, self.family, self.workers = name, family, workers

    def wait_ready(self, path, timeout=30.0):
        """Until `path` answers 200 and every worker has booted (wait_workers)."""
        deadline = time.monotonic() + timeout
        if not wait_http(self.port, path, timeout, alive=self.alive, conn_timeout=5,
                         headers={"Connection": "close"}):
            return False
        return self.wait_workers(self.workers, max(0.0, deadline - time.monotonic()))


def start_server(name, family, workers, argv_fn, app, tag, env, ready_path):
    """Start on a fresh port, wait until ready; one retry on a new port if
    the port turned out to be taken. Returns (server, failure or None)."""
    for attempt in range(2):
        port = free_port()
        srv = Server(name, family, workers, argv_fn(app, port), port,
                     os.path.join(OUT, f"balance-{tag}.server.log"), env)
        if srv.wait_ready(ready_path):
            return srv, None
        crashed, code = srv.stop()
        text = srv.log_text()
        if attempt == 0 and re.search(r"address already in use|in use", text, re.I):
            continue
        why = f"server exited (code {code})" if crashed else "server did not become ready"
        tail = " ⏎ ".join(ln.strip() for ln in text.strip().splitlines()[-3:])
        return srv, f"{why}: {tail[-300:]}"
    return srv, "port in use twice"


# ---------------------------------------------------------------- machine load



def cpu_meter(srv):
    """CPU of the server tree and of this process (the clients) over a load."""
    return CpuMeter(server=srv.cpu_seconds, client=self_cpu_seconds)


def cpu_pcts(span):
    """A load's CPU in % of one CPU: server tree, clients, everyone else."""
    return {"server_cpu_pct": span.pct(span.used["server"]), "client_cpu_pct": span.pct(span.used["client"]),
            "other_cpu_pct": max(0.0, span.pct(span.others))}


# ---------------------------------------------------------------- client

class Client:
    """GET requests to the server under test. keepalive=False: a new
    connection per request (Connection: close). keepalive=True: one
    connection, reused; if the server closed it (Connection: close in a
    response, or a reset/EOF when reusing it) it reconnects transparently,
    counts it, and retries the request once on the new connection."""

    RETRYABLE = (http.client.RemoteDisconnected, http.client.BadStatusLine,
                 ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

    def __init__(self, port, keepalive, timeout=CLIENT_TIMEOUT):
        self.port, self.keepalive, self.timeout = port, keepalive, timeout
        self.conn = None
        self.connections = 0       # connections opened
        self.reconnects = 0        # keep-alive: connections opened after the first
        self.server_closes = 0     # keep-alive: responses that closed the connection
        self.stale_retries = 0     # keep-alive: requests resent after a reset/EOF

    def _open(self):
        self.connections += 1
        if self.keepalive and self.connections > 1:
            self.reconnects += 1
        return http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)

    def get(self, path):
        """-> (status, headers dict with lower-case names)."""
        if not self.keepalive:
            conn = self._open()
            try:
                conn.request("GET", path, headers={"Connection": "close"})
                r = conn.getresponse()
                r.read()
                return r.status, {k.lower(): v for k, v in r.getheaders()}
            finally:
                conn.close()
        for _ in range(2):
            fresh = self.conn is None
            if fresh:
                self.conn = self._open()
            try:
                self.conn.request("GET", path)
                r = self.conn.getresponse()
                r.read()
            except self.RETRYABLE:
                self.close()
                if fresh:
                    raise
                self.stale_retries += 1
                continue
            except BaseException:
                self.close()
                raise
            if r.will_close:
                self.server_closes += 1
                self.close()
            return r.status, {k.lower(): v for k, v in r.getheaders()}
        raise ConnectionError("request failed twice")

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def error_name(e):
    return type(e).__name__ + (f": {e}" if str(e) else "")


def pct(values, p):
    """Percentile p (0-100) with linear interpolation."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def save_run(tag, result, **raw):
    """bench/out/balance-TAG.json: the run's summary and its raw samples."""
    with open(os.path.join(OUT, f"balance-{tag}.json"), "w") as f:
        json.dump({**result, **raw}, f)


# ---------------------------------------------------------------- mixed workload

def start_cell(result, name, family, workers, argv_fn, app, tag, env, ready_path):
    """Start the server of one cell; None (the failure saved in result) if it
    did not come up."""
    srv, failure = start_server(name, family, workers, argv_fn, app, tag, env, ready_path)
    result["command"] = display_command(srv.argv, srv.port)
    if failure:
        result["failure"] = failure
        result["log_tail"] = srv.log_text()[-1500:]
        save_run(tag, result)
        return None
    return srv


def mixed_loop(kind, idx, client, base, deadline, stop, out, errors):
    """One client loop; requests are started only before `deadline`."""
    rng = random.Random(1000 + idx)      # the same delays for every server
    max_count = int((deadline - base) * 100) + 100
    count = 0
    while count < max_count and time.monotonic() < deadline and not stop.is_set():
        count += 1
        d = round(rng.uniform(0, LIGHT_MAX_DELAY), 3) if kind == "light" else HEAVY_DELAY
        t0 = time.monotonic()
        try:
            status, h = client.get(f"/?d={d:.3f}")
        except Exception as e:
            if stop.is_set():            # the server was stopped under it
                break
            errors.append({"kind": kind, "loop": idx, "t": round(t0 - base, 3),
                           "error": error_name(e)})
            time.sleep(0.2)
            continue
        t1 = time.monotonic()
        if status != 200:
            errors.append({"kind": kind, "loop": idx, "t": round(t0 - base, 3),
                           "error": f"HTTP {status}"})
            continue
        out.append({"kind": kind, "loop": idx, "t": round(t0 - base, 4), "d": d,
                    "rt": round(t1 - t0, 6), "pid": int(h.get("x-pid", 0))})
    client.close()


def run_mixed(name, mode, duration, env, quiet_wait):
    family, workers, argv_fn = MIXED_SERVERS[name]
    tag = f"mixed-{mode}-{name}"
    waited, busy = wait_until_quiet(quiet_wait)
    result = {"part": "mixed", "mode": mode, "server": name, "duration": duration,
              "quiet_wait_s": round(waited, 1), "busy_before_pct": round(busy, 1)}
    srv = start_cell(result, name, family, workers, argv_fn, "sleep_app", tag, env, "/?d=0")
    if srv is None:
        return result
    keepalive = mode == "keepalive"
    records, errors, threads = [], [], []
    stop = threading.Event()
    clients = [Client(srv.port, keepalive) for _ in range(LIGHT_LOOPS + HEAVY_LOOPS)]
    try:
        meter = cpu_meter(srv)
        base = time.monotonic()
        deadline = base + duration
        for i, c in enumerate(clients):
            kind = "light" if i < LIGHT_LOOPS else "heavy"
            t = threading.Thread(target=mixed_loop, daemon=True,
                                 args=(kind, i, c, base, deadline, stop, records, errors))
            t.start()
            threads.append(t)
        # Light loops end with their last request (started before the
        # deadline); the heavy ones keep loading the server until then.
        for t in threads[:LIGHT_LOOPS]:
            t.join(duration + CLIENT_TIMEOUT + 10)
        result["light_stragglers"] = sum(t.is_alive() for t in threads[:LIGHT_LOOPS])
        result["wall_s"] = round(time.monotonic() - base, 2)
        result.update(cpu_pcts(meter.stop()))
        stop.set()
    finally:
        stop.set()
        crashed, code = srv.stop()
        for c in clients:
            c.close()
    for t in threads:
        t.join(10)
    if crashed:
        result["failure"] = f"server exited during the run (code {code})"
    light = [r for r in records if r["kind"] == "light"]
    heavy = [r for r in records if r["kind"] == "heavy"]
    over = [r["rt"] - r["d"] for r in light]
    per_pid = {}
    for r in records:
        e = per_pid.setdefault(str(r["pid"]), {"light": 0, "heavy": 0})
        e[r["kind"]] += 1
    result.update({
        "light_n": len(light), "heavy_n": len(heavy), "errors": len(errors),
        "error_samples": errors[:10],
        "overhead_ms": {k: 1000 * pct(over, p) for k, p in
                        (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
        "per_pid": per_pid,
        "connections": sum(c.connections for c in clients),
        "reconnects": sum(c.reconnects for c in clients),
        "server_closes": sum(c.server_closes for c in clients),
        "stale_retries": sum(c.stale_retries for c in clients),
    })
    text = srv.log_text()
    result["log_tail"] = text[-1500:]
    result["log_suspicious"] = [ln for ln in text.splitlines() if re.search(
        r"error|traceback|exception|critical|timeout", ln, re.I)][:10]
    save_run(tag, result, requests=records, errors_all=errors)
    return result


# ---------------------------------------------------------------- half-CPU app

def cpu_loop(idx, port, base, end, out, errors):
    client = Client(port, keepalive=False)
    max_count = int((end - base) * 200) + 100
    for _ in range(max_count):
        t0 = time.monotonic()
        if t0 >= end:
            break
        try:
            status, h = client.get("/")
        except Exception as e:
            errors.append({"loop": idx, "t": round(t0 - base, 3), "error": error_name(e)})
            time.sleep(0.2)
            continue
        t1 = time.monotonic()
        if status != 200:
            errors.append({"loop": idx, "t": round(t0 - base, 3), "error": f"HTTP {status}"})
            continue
        out.append({"loop": idx, "t0": t0 - base, "t1": t1 - base, "pid": int(h["x-pid"]),
                    "s": float(h["x-start"]), "e": float(h["x-end"]),
                    "cpu": float(h["x-cpu"])})


def mark_overlaps(records):
    """r["ov"] = True if the request ran (app start..end) at the same time as
    another request in the same process."""
    by_pid = {}
    for r in records:
        by_pid.setdefault(r["pid"], []).append(r)
    for rs in by_pid.values():
        rs.sort(key=lambda r: r["s"])
        max_end = -math.inf
        for i, r in enumerate(rs):
            nxt = rs[i + 1]["s"] if i + 1 < len(rs) else math.inf
            r["ov"] = max_end > r["s"] or nxt < r["e"]
            max_end = max(max_end, r["e"])


def run_cpu(name, conc, duration, warmup, env, quiet_wait, rep=0):
    family, workers, argv_fn = CPU_SERVERS[name]
    tag = f"cpu-c{conc}-{name}-r{rep}"
    waited, busy = wait_until_quiet(quiet_wait)
    result = {"part": "cpu", "concurrency": conc, "server": name, "duration": duration,
              "warmup": warmup, "quiet_wait_s": round(waited, 1),
              "busy_before_pct": round(busy, 1)}
    srv = start_cell(result, name, family, workers, argv_fn, "cpu_app", tag, env, "/")
    if srv is None:
        return result
    records, errors = [], []
    try:
        base = time.monotonic()
        end = base + warmup + duration
        threads = [threading.Thread(target=cpu_loop, daemon=True,
                                    args=(i, srv.port, base, end, records, errors))
                   for i in range(conc)]
        for t in threads:
            t.start()
        time.sleep(warmup)
        meter = cpu_meter(srv)
        for t in threads:
            t.join(duration + CLIENT_TIMEOUT + 10)
        result.update(cpu_pcts(meter.stop()))
    finally:
        crashed, code = srv.stop()
    if crashed:
        result["failure"] = f"server exited during the run (code {code})"
    mark_overlaps(records)
    # Requests that completed inside the measured window [warmup, warmup + duration].
    win = [r for r in records if warmup <= r["t1"] <= warmup + duration]
    lat = [r["t1"] - r["t0"] for r in win]
    per_pid = {}
    for r in win:
        per_pid[str(r["pid"])] = per_pid.get(str(r["pid"]), 0) + 1
    result.update({
        "requests": len(win), "rps": len(win) / duration,
        "p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99),
        "overlap_pct": 100 * sum(r["ov"] for r in win) / len(win) if win else float("nan"),
        "app_cpu_ms": 1000 * sum(r["cpu"] for r in win) / len(win) if win else float("nan"),
        "app_wall_ms": 1000 * pct([r["e"] - r["s"] for r in win], 50),
        "per_pid": per_pid, "errors": len(errors), "error_samples": errors[:10],
    })
    text = srv.log_text()
    result["log_tail"] = text[-1500:]
    result["log_suspicious"] = [ln for ln in text.splitlines() if re.search(
        r"error|traceback|exception|critical", ln, re.I)][:10]
    save_run(tag, result, requests_all=records, errors_all=errors)
    return result


# ---------------------------------------------------------------- setup



def ensure_venv(need_gunicorn, need_uwsgi):
    """bench/.venv with gunicorn and uWSGI (built from source by pip).
    Returns ({family: reason} for what could not be had, {name: version})."""
    missing = {}
    if not shutil.which("taskset"):
        apt_install("util-linux")
        if not shutil.which("taskset"):
            sys.exit("taskset is required")
    if not (need_gunicorn or need_uwsgi):
        return missing, {}
    if not os.path.exists(VENV_PY):
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    pip = [VENV_PY, "-m", "pip", "--disable-pip-version-check"]
    if need_gunicorn and run_quiet([VENV_PY, "-c", "import gunicorn"]).returncode != 0:
        log("installing gunicorn into bench/.venv")
        r = run_quiet([*pip, "install", "gunicorn"])
        if r.returncode != 0:
            missing["gunicorn"] = f"pip install gunicorn failed: {first_error_line(r.stdout)}"
    if need_uwsgi and not os.path.exists(UWSGI):
        log("installing uWSGI into bench/.venv (compiles from source, ~1-2 min)")
        r = run_quiet([*pip, "install", "uwsgi"])
        if r.returncode != 0:
            with open(os.path.join(OUT, "uwsgi-pip.log"), "w") as f:
                f.write(r.stdout)
            apt_install("build-essential", "python3-dev")
            r = run_quiet([*pip, "install", "uwsgi"])
        if r.returncode != 0 or not os.path.exists(UWSGI):
            with open(os.path.join(OUT, "uwsgi-pip.log"), "w") as f:
                f.write(r.stdout)
            missing["uwsgi"] = (f"pip install uwsgi failed (bench/out/uwsgi-pip.log): "
                                f"{first_error_line(r.stdout)}")
    versions = {}
    if "gunicorn" not in missing and need_gunicorn:
        help_text = run_quiet([VENV_PY, "-m", "gunicorn", "--help"]).stdout
        if "--no-control-socket" in help_text:
            GUNICORN_EXTRA[:] = ["--no-control-socket"]
        versions["gunicorn"] = run_quiet([VENV_PY, "-c", "import importlib.metadata as m; "
                                          "print(m.version('gunicorn'))"]).stdout.strip()
    if "uwsgi" not in missing and need_uwsgi:
        versions["uwsgi"] = run_quiet([UWSGI, "--version"]).stdout.strip()
    return missing, versions


def forkwsgi_status():
    """None if `python -m forkwsgi` has --threads and --balance, else why not."""
    try:
        r = run_quiet([sys.executable, "-m", "forkwsgi", "--help"], cwd=BENCH, timeout=30)
    except subprocess.TimeoutExpired:
        return "`python -m forkwsgi --help` did not finish"
    if r.returncode != 0:
        return (f"`python -m forkwsgi --help` fails with {sys.executable}: "
                f"{(r.stdout.strip().splitlines() or ['?'])[-1]}")
    lacking = [f for f in ("--threads", "--balance") if not re.search(re.escape(f) + r"\b",
                                                                      r.stdout)]
    if lacking:
        return f"{' and '.join(lacking)} not in `python -m forkwsgi --help` yet"
    return None


def forkwsgi_facts():
    r = run_quiet([sys.executable, "-c", "import forkwsgi, os; print(os.path.dirname("
                   "forkwsgi.__file__))"], cwd=BENCH)
    where = r.stdout.strip() if r.returncode == 0 else None
    head = git_head()
    dirty = run_quiet(["git", "-C", ROOT, "status", "--porcelain", "--", "cserver", "src",
                       "python"]).stdout.splitlines()
    return {"git_head": head, "dirty": [ln[3:] for ln in dirty if ln.strip()],
            "package_dir": where}


def calibrate_spin():
    """Iterations of balance_apps.spin for 10 ms, measured on the servers' CPU."""
    env = dict(os.environ, BALANCE_SPIN_ITERS="1")     # skip the import-time one
    r = run_quiet(pinned(SERVER_CPU, [sys.executable, "balance_apps.py"]),
                  cwd=BENCH, env=env)
    if r.returncode != 0:
        sys.exit("calibration failed: " + r.stdout[-500:])
    return int(r.stdout.strip().splitlines()[-1])


def select(servers, only):
    if not only:
        return list(servers)
    picked = []
    for name in servers:
        if any(name == tok or name.startswith(tok + "-") for tok in only):
            picked.append(name)
    return picked


# ---------------------------------------------------------------- report

def cell(text):
    """Text safe inside a markdown table cell."""
    return str(text).replace("\n", " ").replace("|", "\\|")


def fmt_ms(x):
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.1f}"


def fmt_per_pid_mixed(per_pid):
    rows = sorted(per_pid.values(), key=lambda e: -(e["light"] + e["heavy"]))
    return " · ".join(f"{e['light']}+{e['heavy']}h" for e in rows)


def mixed_table(results, modes, servers, unavailable):
    lines = ["| client | server | light req | overhead p50 ms | p90 ms | p99 ms | max ms "
             "| heavy req | errors | reconnects | requests per worker pid (light+heavy) "
             "| server CPU % | others' CPU % |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for mode in modes:
        for name in servers:
            fam = MIXED_SERVERS[name][0]
            r = next((x for x in results if x["part"] == "mixed" and x["mode"] == mode
                      and x["server"] == name), None)
            if fam in unavailable:
                lines.append(f"| {mode} | {name} | not available: {cell(unavailable[fam])} "
                             "| | | | | | | | | | |")
                continue
            if r is None:
                continue
            if "light_n" not in r:
                lines.append(f"| {mode} | {name} | FAILED: {cell(r['failure'])} "
                             "| | | | | | | | | | |")
                continue
            o = r["overhead_ms"]
            rec = str(r["reconnects"]) if mode == "keepalive" else "—"
            fail = f" (**{cell(r['failure'])}**)" if "failure" in r else ""
            lines.append(
                f"| {mode} | {name}{fail} | {r['light_n']} | {fmt_ms(o['p50'])} | "
                f"{fmt_ms(o['p90'])} | {fmt_ms(o['p99'])} | {fmt_ms(o['max'])} | "
                f"{r['heavy_n']} | {r['errors']} | {rec} | {fmt_per_pid_mixed(r['per_pid'])} | "
                f"{r.get('server_cpu_pct', float('nan')):.0f} | "
                f"{r.get('other_cpu_pct', float('nan')):.0f} |")
    return "\n".join(lines)


def cpu_runs(results, conc, name):
    return [x for x in results if x["part"] == "cpu" and x["concurrency"] == conc and x["server"] == name]


def median_run(runs):
    """The run with the median req/s (the lower middle one for an even count)."""
    ok = sorted((x for x in runs if "rps" in x and "failure" not in x and x["requests"]),
                key=lambda x: x["rps"])
    return ok[(len(ok) - 1) // 2] if ok else (runs[0] if runs else None)


def cpu_table(results, servers, unavailable):
    lines = ["| concurrency | server | req/s (median) | req/s of each repetition | p50 ms | p99 ms "
             "| overlapped % | app CPU ms/req | requests per worker pid | errors | server CPU % "
             "| others' CPU % |",
             "|---:|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for conc in CONCURRENCIES:
        for name in servers:
            fam = CPU_SERVERS[name][0]
            runs = cpu_runs(results, conc, name)
            r = median_run(runs)
            if fam in unavailable:
                lines.append(f"| {conc} | {name} | not available: {cell(unavailable[fam])} "
                             "| | | | | | | | | |")
                continue
            if r is None:
                continue
            if "rps" not in r:
                lines.append(f"| {conc} | {name} | FAILED: {cell(r['failure'])} "
                             "| | | | | | | | | |")
                continue
            fail = f" (**{cell(r['failure'])}**)" if "failure" in r else ""
            pids = " / ".join(str(n) for n in sorted(r["per_pid"].values(), reverse=True))
            each = ", ".join(f"{x['rps']:.1f}" if "rps" in x else "failed" for x in runs)
            lines.append(
                f"| {conc} | {name}{fail} | {r['rps']:.1f} | {each} | {fmt_ms(r['p50_ms'])} | "
                f"{fmt_ms(r['p99_ms'])} | {r['overlap_pct']:.0f} | {r['app_cpu_ms']:.1f} | "
                f"{pids} | {r['errors']} | {r.get('server_cpu_pct', float('nan')):.0f} | "
                f"{r.get('other_cpu_pct', float('nan')):.0f} |")
    return "\n".join(lines)


def verdicts(results, modes):
    """The issue's pass/fail ratios, as (criterion, value, limit, verdict)."""
    def mixed_p99(mode, name):
        r = next((x for x in results if x["part"] == "mixed" and x["mode"] == mode
                  and x["server"] == name and "light_n" in x and "failure" not in x
                  and x["light_n"]), None)
        return r["overhead_ms"]["p99"] if r else None

    def rps(conc, name):
        r = median_run(cpu_runs(results, conc, name))
        return r["rps"] if r and "rps" in r and "failure" not in r and r["requests"] else None

    def check(desc, num, den, limit, le):
        if num is None or den is None or den == 0:
            return (desc, None, limit, "n/a")
        ratio = num / den
        ok = ratio <= limit if le else ratio >= limit
        return (desc, ratio, limit, "PASS" if ok else "FAIL")

    out = []
    for mode in modes:
        fw = mixed_p99(mode, "forkwsgi-least-busy")
        out.append(check(f"(a) {mode}: light p99 forkwsgi least-busy / gunicorn 1x8 ≤ 2",
                         fw, mixed_p99(mode, "gunicorn-1x8"), 2.0, True))
        out.append(check(f"(a) {mode}: light p99 forkwsgi least-busy / gunicorn 4x2 ≤ 1/20",
                         fw, mixed_p99(mode, "gunicorn-4x2"), 0.05, True))
    out.append(check("(b) half-CPU c=2: req/s forkwsgi 2x2 / forkwsgi 2x1 ≥ 0.9",
                     rps(2, "forkwsgi-2x2"), rps(2, "forkwsgi-2x1"), 0.9, False))
    out.append(check("(b) half-CPU c=4: req/s forkwsgi 2x2 / uWSGI 2x2 --thunder-lock ≥ 1",
                     rps(4, "forkwsgi-2x2"), rps(4, "uwsgi-2x2"), 1.0, False))
    return out


def verdict_table(vs):
    lines = ["| criterion | ratio | verdict |", "|---|---:|---|"]
    for desc, ratio, _limit, v in vs:
        lines.append(f"| {desc} | {'—' if ratio is None else f'{ratio:.3f}'} | {v} |")
    return "\n".join(lines)


def problems(results):
    out = []
    for r in results:
        tag = (f"{r['part']}/{r.get('mode') or 'c' + str(r.get('concurrency'))}/"
               f"{r['server']}")
        if "failure" in r:
            out.append(f"- {tag}: **{r['failure']}**; server log tail:\n\n```\n"
                       f"{r.get('log_tail', '').strip()[-800:]}\n```")
        if r.get("errors"):
            out.append(f"- {tag}: {r['errors']} request errors, e.g. "
                       + "; ".join(f"`{e['error']}`" for e in r["error_samples"][:3]))
        if r.get("light_stragglers"):
            out.append(f"- {tag}: {r['light_stragglers']} light loops still running at the end")
        if r.get("log_suspicious"):
            out.append(f"- {tag}: server log lines: "
                       + "; ".join(f"`{ln.strip()[:200]}`" for ln in r["log_suspicious"][:5]))
    return out


def machine_facts():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version()}


def write_results(text_tables, results, args, ctx):
    facts, versions, fw, unavailable = (ctx["facts"], ctx["versions"], ctx["forkwsgi"],
                                        ctx["unavailable"])
    cmd = invocation()
    mixed_cmds = "\n".join(
        f"{name:24} taskset -c {SERVER_CPU} "
        + display_command(MIXED_SERVERS[name][2]("sleep_app", "PORT"))
        for name in MIXED_SERVERS)
    cpu_cmds = "\n".join(
        f"{name:14} taskset -c {SERVER_CPU} "
        + display_command(CPU_SERVERS[name][2]("cpu_app", "PORT"))
        for name in CPU_SERVERS)
    fw_line = (f"forkwsgi from git {fw['git_head']}"
               + (f" with uncommitted changes in {', '.join(fw['dirty'])}" if fw["dirty"] else "")
               + (f", imported from `{fw['package_dir']}`" if fw["package_dir"] else
                  ", **not importable**"))
    if "forkwsgi" in unavailable:
        fw_line += f" — forkwsgi rows not available: {unavailable['forkwsgi']}"
    probs = problems(results)
    section = f"""{SECTION}

Run on {ctx['started']:%Y-%m-%d %H:%M} UTC by `{cmd}` (took {ctx['elapsed'] / 60:.1f} min).

**Machine.** nproc {facts['nproc']} ({facts['cpu']}), kernel {facts['kernel']}, Python \
{facts['python']}. Every server process pinned to CPU {SERVER_CPU} (`taskset -c {SERVER_CPU}`), \
the client threads (one Python process) to CPU {CLIENT_CPU}; 127.0.0.1 only.

**Software.** {fw_line}; gunicorn {versions.get('gunicorn', '—')}, uWSGI \
{versions.get('uwsgi', '—')} (in bench/.venv).

**Mixed workload** ({args.duration_mixed} s per run). App `bench/balance_apps.py:sleep_app`:
`GET /?d=SECONDS` sleeps d and answers 2 bytes plus `X-Pid`. {LIGHT_LOOPS} client loops of
light requests (d uniform in [0, 1] s, a fixed random sequence per loop, so every server gets
the same delays) and {HEAVY_LOOPS} loops of heavy ones (d = {HEAVY_DELAY:.0f} s), all started
together; loops stop starting requests after {args.duration_mixed} s (the heavy loops keep the
server loaded until the last light request returns). Overhead = client round trip − d, light
requests only. Client modes: **new** = a new connection per request (`Connection: close`,
connect time included); **keepalive** = each loop holds one `http.client` connection and reuses
it; if the server closes it the loop reconnects (counted in "reconnects") and resends a request
that met a closed connection. "requests per worker pid" is light+heavy requests served by each
process (the `X-Pid` header).

**Half-CPU app** ({args.duration_cpu} s per cell after a {args.warmup_cpu} s warm-up).
`cpu_app`: 5 × (`time.sleep(0.010)` + a pure-Python loop of {ctx.get('spin_iters', '?')}
iterations ≈ 10 ms, calibrated once per benchmark on CPU {SERVER_CPU} and passed to every server in
`BALANCE_SPIN_ITERS`), ~100 ms per request, half of it holding the GIL. Closed-loop client
threads at concurrency 2 and 4, **new connection per request**. req/s counts requests that
completed in the measured window; latency is the client's round trip. "overlapped %" is the
share of requests whose app call (`X-Start`..`X-End`, CLOCK_MONOTONIC) overlapped another
request in the same process (`X-Pid`); "app CPU ms/req" is the thread CPU time the app used
(≈ 50 ms when the calibration holds). With every server on one CPU and 50 ms of CPU per request,
20 req/s is the ceiling.

Server commands (mixed, then half-CPU; run from the repository root, `cwd` bench/):

```
{mixed_cmds}
{cpu_cmds}
```

### Mixed workload: light-request overhead

{text_tables['mixed']}

### Half-CPU app

{text_tables['cpu']}

### Pass/fail (the issue's criteria)

{text_tables['verdicts']}

### Problems seen

{chr(10).join(probs) if probs else 'None: every run completed, no request errors, no error lines in server logs.'}
"""
    write_section(RESULTS, SECTION, section)


# ---------------------------------------------------------------- main

def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="short runs: mixed 15 s, half-CPU 8 s (1 s warm-up)")
    ap.add_argument("--duration-mixed", type=int, help="seconds per mixed run (default 120)")
    ap.add_argument("--duration-cpu", type=int, help="seconds per half-CPU cell (default 30)")
    ap.add_argument("--reps-cpu", type=int,
                    help="repetitions of each half-CPU cell, in interleaved rounds; the median counts")
    ap.add_argument("--warmup-cpu", type=int, help="discarded seconds per half-CPU cell "
                                                   "(default 2, --quick 1)")
    ap.add_argument("--only", help="comma-separated server names or families "
                                   f"({', '.join([*MIXED_SERVERS, *CPU_SERVERS])}; "
                                   "forkwsgi, gunicorn, uwsgi)")
    ap.add_argument("--modes", default="new,keepalive",
                    help="client modes of the mixed workload: new, keepalive")
    ap.add_argument("--parts", default="mixed,cpu", help="mixed, cpu")
    ap.add_argument("--quiet-wait", type=float,
                    help="before each run, wait up to this many seconds for other processes "
                         "to go idle (default 15, --quick 5)")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    args.duration_mixed = args.duration_mixed or (15 if args.quick else 120)
    args.duration_cpu = args.duration_cpu or (8 if args.quick else 30)
    args.reps_cpu = args.reps_cpu or (1 if args.quick else 3)
    if args.warmup_cpu is None:
        args.warmup_cpu = 1 if args.quick else 2
    if args.quiet_wait is None:
        args.quiet_wait = 5 if args.quick else 15
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not modes or set(modes) - set(MODES):
        ap.error("--modes takes new and/or keepalive")
    if not parts or set(parts) - {"mixed", "cpu"}:
        ap.error("--parts takes mixed and/or cpu")
    only = [t.strip() for t in args.only.split(",")] if args.only else None
    if only:
        known = set(MIXED_SERVERS) | set(CPU_SERVERS) | {"forkwsgi", "gunicorn", "uwsgi"}
        bad = [t for t in only if t not in known]
        if bad:
            ap.error(f"unknown server(s) {', '.join(bad)}; known: {', '.join(sorted(known))}")
    mixed_servers = select(MIXED_SERVERS, only) if "mixed" in parts else []
    cpu_servers = select(CPU_SERVERS, only) if "cpu" in parts else []
    families = {MIXED_SERVERS[n][0] for n in mixed_servers} | \
        {CPU_SERVERS[n][0] for n in cpu_servers}
    if not families:
        ap.error("nothing selected")

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    os.makedirs(OUT, exist_ok=True)
    unavailable, versions = ensure_venv("gunicorn" in families, "uwsgi" in families)
    if "forkwsgi" in families:
        why = forkwsgi_status()
        if why:
            unavailable["forkwsgi"] = why
    for fam, why in unavailable.items():
        log(f"{fam}: not available: {why}")
    ctx = {"facts": machine_facts(), "versions": versions, "forkwsgi": forkwsgi_facts(),
           "unavailable": unavailable, "started": started}

    env = dict(os.environ)
    if cpu_servers:
        ctx["spin_iters"] = calibrate_spin()
        env["BALANCE_SPIN_ITERS"] = str(ctx["spin_iters"])
        log(f"CPU slice: {ctx['spin_iters']} iterations ≈ 10 ms on CPU {SERVER_CPU}")

    # The clients are threads of this process: pin it (and so every thread
    # started from now on) to the client CPU. Servers are started through
    # `taskset -c SERVER_CPU`, which overrides the inherited mask.
    pin_self(CLIENT_CPU)

    plan = [("mixed", m, s) for m in modes for s in mixed_servers
            if MIXED_SERVERS[s][0] not in unavailable]
    # Half-CPU cells are short and this VM's speed drifts over minutes: each
    # is repeated, in rounds that visit every server in turn, and reported
    # as the median (run_core.py does the same).
    plan += [("cpu", (c, rep), s) for rep in range(args.reps_cpu) for c in CONCURRENCIES
             for s in cpu_servers if CPU_SERVERS[s][0] not in unavailable]
    est = sum(args.duration_mixed + 12 if p == "mixed" else args.duration_cpu
              + args.warmup_cpu + 4 for p, _, _ in plan)
    log(f"{len(plan)} runs, about {est / 60:.1f} min (plus waits for an idle machine)")

    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if inherited as ignored
    results = []
    interrupted = False
    try:
        for i, (part, x, name) in enumerate(plan):
            what = x if part == "mixed" else f"c={x[0]} #{x[1] + 1}"
            head = f"[{i + 1}/{len(plan)}] {part:5} {what:9} {name:22}"
            if part == "mixed":
                r = run_mixed(name, x, args.duration_mixed, env, args.quiet_wait)
            else:
                r = run_cpu(name, x[0], args.duration_cpu, args.warmup_cpu, env, args.quiet_wait, x[1])
                r["rep"] = x[1]
            results.append(r)
            if part == "mixed" and "light_n" in r:
                o = r["overhead_ms"]
                log(f"{head} light {r['light_n']:4}  overhead p50 {fmt_ms(o['p50'])} "
                    f"p99 {fmt_ms(o['p99'])} max {fmt_ms(o['max'])} ms  heavy {r['heavy_n']}  "
                    f"errors {r['errors']}  reconnects {r['reconnects']}  "
                    f"pids {fmt_per_pid_mixed(r['per_pid'])}"
                    + (f"  FAILED: {r['failure']}" if "failure" in r else ""))
            elif part == "cpu" and "rps" in r:
                log(f"{head} {r['rps']:5.1f} req/s  p50 {fmt_ms(r['p50_ms'])} "
                    f"p99 {fmt_ms(r['p99_ms'])} ms  overlapped {r['overlap_pct']:.0f}%  "
                    f"app CPU {r['app_cpu_ms']:.1f} ms/req  errors {r['errors']}"
                    + (f"  FAILED: {r['failure']}" if "failure" in r else ""))
            else:
                log(f"{head} FAILED: {r['failure']}")
    except KeyboardInterrupt:
        interrupted = True
        log("\ninterrupted: stopping servers")
    finally:
        stop_all(term_wait=2.0)
    ctx["elapsed"] = time.monotonic() - t_start

    tables = {"mixed": mixed_table(results, modes, mixed_servers, unavailable),
              "cpu": cpu_table(results, cpu_servers, unavailable)}
    vs = verdicts(results, modes)
    tables["verdicts"] = verdict_table(vs)
    with open(os.path.join(OUT, "balance-results.json"), "w") as f:
        json.dump({"facts": ctx["facts"], "versions": versions, "forkwsgi": ctx["forkwsgi"],
                   "unavailable": unavailable, "spin_iters": ctx.get("spin_iters"),
                   "args": vars(args), "interrupted": interrupted,
                   "started": ctx["started"].isoformat(), "elapsed_s": round(ctx["elapsed"]),
                   "verdicts": [{"criterion": d, "ratio": r, "limit": lim, "verdict": v}
                                for d, r, lim, v in vs],
                   "results": results}, f, indent=1)
    if mixed_servers:
        log("\nMixed workload, light-request overhead\n\n" + tables["mixed"])
    if cpu_servers:
        log("\nHalf-CPU app\n\n" + tables["cpu"])
    log("\nPass/fail\n\n" + tables["verdicts"])
    for p in problems(results):
        log(p.split("\n")[0])
    if interrupted:
        sys.exit(130)
    if not args.no_write:
        write_results(tables, results, args, ctx)
        log(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
