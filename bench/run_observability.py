#!/usr/bin/env python3
"""What watching the server costs: the per-worker counters (always on
under a master), and --stats / --metrics scraped every second, side by side
with forkwsgi before the counters existed, in one run.

    python3 bench/run_observability.py            # 3 rounds of 10 s (~3 minutes)
    python3 bench/run_observability.py --quick    # 1 round of 3 s

The baseline is forkwsgi at git revision --baseline (default: the commit
before the counters), built once into bench/out/baseline-REV (a git
worktree). Workload: keep-alive, 50 connections, the hello app
(bench/apps.py), one worker under a master (--workers 1), one thread.
Server on CPU 0, wrk and the scraper on CPU 1 (taskset); the runs of a round
are interleaved, each with a fresh server. The summary goes to the
"Observability" section of bench/RESULTS.md.
"""
import argparse
import datetime
import http.client
import os
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_core  # noqa: E402
from common import (CLIENT_CPU, CpuMeter, free_port, invocation, log, pin_self, rotated, wait_until_quiet,  # noqa: E402
                    write_section)

SECTION = "## Observability: cost of the counters, --stats and --metrics"
REPO = os.path.dirname(run_core.BENCH)
DEFAULT_BASELINE = "f956b29^"      # the commit before cserver/fw_stats.c


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True, check=True).stdout.strip()


def baseline_tree(rev):
    """A worktree of forkwsgi at rev with its extension built: its python/ dir."""
    sha = git("rev-parse", "--short", rev)
    path = os.path.join(run_core.OUT, f"baseline-{sha}")
    if not os.path.exists(os.path.join(path, "python", "forkwsgi")):
        log(f"building forkwsgi at {sha} into {path}")
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--force", "--detach", path, sha], check=True,
                       capture_output=True)
    if not any(f.startswith("_forkwsgi") and f.endswith(".so") for f in os.listdir(os.path.join(path, "python",
                                                                                                 "forkwsgi"))):
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=path, check=True,
                       capture_output=True)
    return sha, os.path.join(path, "python")


class Scraper:
    """GET /metrics and one stats document every second (on the client's CPU)."""

    def __init__(self, metrics_port, stats_port):
        self.stop = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self.run, args=(metrics_port, stats_port), daemon=True)
        self.thread.start()

    def run(self, metrics_port, stats_port):
        pin_self(CLIENT_CPU)           # this thread: the process stays where it is
        while not self.stop.wait(1.0):
            try:
                c = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=5)
                c.request("GET", "/metrics")
                c.getresponse().read()
                c.close()
                with socket.create_connection(("127.0.0.1", stats_port), timeout=5) as s:
                    while s.recv(65536):
                        pass
                self.count += 1
            except OSError:
                pass

    def finish(self):
        self.stop.set()
        self.thread.join(10)
        return self.count


def one_run(name, argv, env, port, duration, warmup, scrape=None):
    wait_until_quiet(15)
    srv = run_core.Server(name, "hello", port, os.path.join(run_core.OUT, f"observability.{port}.log"),
                          argv=argv, env=env)
    scraper = None
    try:
        if not srv.wait_ready():
            return {"failure": "server did not become ready"}
        run_core.run_wrk("keepalive-hello", port, warmup)
        if scrape:
            scraper = Scraper(*scrape)
        meter = CpuMeter(server=srv.sched_cpu_seconds)
        stats, text, _ = run_core.run_wrk("keepalive-hello", port, duration)
        span = meter.stop()
        wall, cpu = span.wall, span.used["server"]
        scrapes = scraper.finish() if scraper else 0
        if stats is None:
            return {"failure": "wrk failed: " + text.strip()[-300:]}
        return {"rps": stats["rps"], "errors": stats["errors"], "cpu_us": 1e6 * cpu / max(1, stats["requests"]),
                "wall": wall, "scrapes": scrapes}
    finally:
        if scraper:
            scraper.finish()
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.duration, args.warmup = 1, 3, 1
    os.makedirs(run_core.OUT, exist_ok=True)
    run_core.ensure_system_packages()
    sha, base_path = baseline_tree(args.baseline)
    here = os.path.join(REPO, "python")
    env_of = {"baseline": dict(os.environ, PYTHONPATH=base_path + os.pathsep + run_core.BENCH),
              "now": dict(os.environ, PYTHONPATH=here + os.pathsep + run_core.BENCH)}
    names = [f"forkwsgi at {sha} (no counters)", "forkwsgi (counters)", "forkwsgi + --stats --metrics, scraped 1/s"]
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {n: [] for n in names}
    for rep in range(args.reps):
        for name in rotated(names, rep):
            port = free_port()
            argv = [sys.executable, "-m", "forkwsgi", "apps:hello", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
            scrape = None
            if "scraped" in name:
                mp, sp = free_port(), free_port()
                argv += ["--metrics", f"127.0.0.1:{mp}", "--stats", f"127.0.0.1:{sp}"]
                scrape = (mp, sp)
            env = env_of["baseline" if "no counters" in name else "now"]
            r = one_run(name, argv, env, port, args.duration, args.warmup, scrape)
            results[name].append(r)
            if "rps" in r:
                log(f"[{rep + 1}/{args.reps}] {name:45} {r['rps']:>9,.0f} req/s  {r['cpu_us']:.2f} µs/req  "
                    f"errors {r['errors']}  scrapes {r['scrapes']}")
            else:
                log(f"[{rep + 1}/{args.reps}] {name:45} FAILED: {r['failure']}")

    def med(name, key):
        vals = sorted(r[key] for r in results[name] if key in r)
        return vals[len(vals) // 2] if vals else float("nan")

    rows = ["| server | req/s (median) | req/s (each run) | server CPU µs/req | errors |", "|---|---:|---|---:|---:|"]
    for n in names:
        each = " / ".join(f"{r['rps']:,.0f}" for r in results[n] if "rps" in r)
        rows.append(f"| {n} | {med(n, 'rps'):,.0f} | {each} | {med(n, 'cpu_us'):.2f} | "
                    f"{sum(r.get('errors', 0) for r in results[n])} |")
    base = names[0]
    ratio = ["| compared with the baseline | req/s | CPU per request |", "|---|---:|---:|"]
    for n in names[1:]:
        ratio.append(f"| {n} | {med(n, 'rps') / med(base, 'rps'):.3f} | {med(n, 'cpu_us') / med(base, 'cpu_us'):.3f} |")
    table = "\n".join(rows) + "\n\n" + "\n".join(ratio)
    log("\n" + table)
    if not args.no_write:
        head, dirty = run_core.git_state()
        section = f"""{SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `{invocation()}`,
forkwsgi from git {head}{' (uncommitted changes)' if dirty else ''} against forkwsgi at {sha} (before the
counters). Keep-alive, 50 connections (`wrk -t1 -c50`), the hello app, `--workers 1` (a master and one
worker), one thread; server on CPU {run_core.SERVER_CPU}, wrk and the scraper on CPU {run_core.CLIENT_CPU};
{args.reps} interleaved round(s) of {args.duration} s after {args.warmup} s of warm-up, a fresh server each run.

{table}
"""
        write_section(run_core.RESULTS, SECTION, section)
        log(f"wrote {run_core.RESULTS}")


if __name__ == "__main__":
    main()
