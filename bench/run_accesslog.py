#!/usr/bin/env python3
"""What an access log costs: forkwsgi and gunicorn, each with the access
log to a file and without, side by side in one run.

    python3 bench/run_accesslog.py            # 3 rounds of 10 s (~4 minutes)
    python3 bench/run_accesslog.py --quick    # 1 round of 3 s

Workload: keep-alive, 50 connections, the 13-byte hello app (bench/apps.py),
one worker: forkwsgi with one thread (the app on the loop thread),
gunicorn gthread with one thread (its keep-alive worker). The access log
goes to a file under bench/out/ in gunicorn's default format. Server on
CPU 0, wrk on CPU 1 (taskset); the runs of a round are interleaved and
each starts a fresh server (run_core.py's machinery). Reported: median
req/s and server CPU per request, and for each server the ratio log on /
log off; the summary goes to the "Access log" section of bench/RESULTS.md.
"""
import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_core  # noqa: E402
from common import CpuMeter, invocation, log, rotated, wait_until_quiet, write_section  # noqa: E402

SECTION = "## Access log: cost, log on vs off"
OUT = run_core.OUT


def configs(log_dir):
    py, venv = sys.executable, run_core.VENV_PY
    return {
        "forkwsgi": lambda bind: [py, "-m", "forkwsgi", "apps:hello", "--bind", bind],
        "forkwsgi + access log": lambda bind: [py, "-m", "forkwsgi", "apps:hello", "--bind", bind,
                                               "--access-logfile", os.path.join(log_dir, "forkwsgi.access.log")],
        "gunicorn-gthread": lambda bind: [venv, "-m", "gunicorn", "-w", "1", "-k", "gthread", "--threads", "1",
                                          *run_core.GUNICORN_EXTRA, "-b", bind, "apps:hello"],
        "gunicorn-gthread + access log": lambda bind: [
            venv, "-m", "gunicorn", "-w", "1", "-k", "gthread", "--threads", "1", *run_core.GUNICORN_EXTRA,
            "-b", bind, "--access-logfile", os.path.join(log_dir, "gunicorn.access.log"), "apps:hello"],
    }


def one_run(name, argv_of, port, duration, warmup):
    wait_until_quiet(15)
    srv = run_core.Server(name, "hello", port, os.path.join(OUT, f"accesslog.{port}.log"),
                          argv=argv_of(f"{run_core.HOST}:{port}"))
    try:
        if not srv.wait_ready():
            return {"failure": "server did not become ready"}
        run_core.run_wrk("keepalive-hello", port, warmup)
        meter = CpuMeter(server=srv.sched_cpu_seconds)
        stats, text, _ = run_core.run_wrk("keepalive-hello", port, duration)
        span = meter.stop()
        wall, cpu = span.wall, span.used["server"]
        if stats is None:
            return {"failure": "wrk failed: " + text.strip()[-300:]}
        return {"rps": stats["rps"], "errors": stats["errors"], "non2xx": stats["status"],
                "cpu_us": 1e6 * cpu / max(1, stats["requests"]), "wall": wall, "requests": stats["requests"]}
    finally:
        srv.stop()


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.duration, args.warmup = 1, 3, 1
    os.makedirs(OUT, exist_ok=True)
    run_core.ensure_system_packages()
    run_core.ensure_venv()
    log_dir = os.path.join(OUT, "access-logs")
    os.makedirs(log_dir, exist_ok=True)
    cfgs = configs(log_dir)
    names = list(cfgs)
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {n: [] for n in names}
    written = {n: 0 for n in names}
    port = run_core.FIRST_PORT + 500
    for rep in range(args.reps):
        for name in rotated(names, rep):
            for f in os.listdir(log_dir):
                os.unlink(os.path.join(log_dir, f))
            port += 1
            r = one_run(name, cfgs[name], port, args.duration, args.warmup)
            lines = sum(count_lines(os.path.join(log_dir, f)) for f in os.listdir(log_dir))
            r["lines"] = lines
            results[name].append(r)
            if "rps" in r:
                log(f"[{rep + 1}/{args.reps}] {name:30} {r['rps']:>9,.0f} req/s  {r['cpu_us']:.1f} µs/req  "
                    f"errors {r['errors']}  non-2xx {r['non2xx']}  log lines {lines:,}")
            else:
                log(f"[{rep + 1}/{args.reps}] {name:30} FAILED: {r['failure']}")
            written[name] += lines

    def med(name, key):
        vals = [r[key] for r in results[name] if key in r]
        return sorted(vals)[len(vals) // 2] if vals else float("nan")

    rows = ["| server | req/s (median) | req/s (each run) | server CPU µs/req | errors | log lines written |",
            "|---|---:|---|---:|---:|---:|"]
    for n in names:
        each = " / ".join(f"{r['rps']:,.0f}" for r in results[n] if "rps" in r)
        rows.append(f"| {n} | {med(n, 'rps'):,.0f} | {each} | {med(n, 'cpu_us'):.1f} | "
                    f"{sum(r.get('errors', 0) for r in results[n])} | {written[n]:,} |")
    ratio = ["| server | req/s with log / without | CPU per request with log / without |", "|---|---:|---:|"]
    for base in ("forkwsgi", "gunicorn-gthread"):
        on = base + " + access log"
        ratio.append(f"| {base} | {med(on, 'rps') / med(base, 'rps'):.3f} | "
                     f"{med(on, 'cpu_us') / med(base, 'cpu_us'):.3f} |")
    table = "\n".join(rows) + "\n\n" + "\n".join(ratio)
    log("\n" + table)
    if not args.no_write:
        head, dirty = run_core.git_state()
        section = f"""{SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `{invocation()}`,
forkwsgi from git {head}{' (uncommitted changes)' if dirty else ''}. Keep-alive, 50 connections
(`wrk -t1 -c50`), the hello app, one worker with one thread; access log to a file in gunicorn's
default format; server on CPU {run_core.SERVER_CPU}, wrk on CPU {run_core.CLIENT_CPU}; {args.reps}
interleaved round(s) of {args.duration} s after {args.warmup} s of warm-up, a fresh server each run.

{table}
"""
        write_section(run_core.RESULTS, SECTION, section)
        log(f"wrote {run_core.RESULTS}")


if __name__ == "__main__":
    main()
