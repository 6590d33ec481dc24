"""Tail latency at a fixed rate: each server one process, one thread, on
CPU 0; bench/openloop.c on CPU 1 sends keep-alive requests on 50
connections at 50 % and 90 % of bjoern's own saturation rate (measured
first, with wrk -c50, in the same run), the same rates for every server;
p50, p99, p99.9 and max from each request's due time (no coordinated
omission), rounds interleaved.

    python3 bench/run_latency.py [--rounds 5] [--seconds 5] [--app route|flask]
                                 [--only forkwsgi,bjoern,...] [--no-write]

Servers: forkwsgi (its defaults), bjoern, fastpysgi, granian (wsgi, 1 worker, 1 blocking thread), gunicorn gthread
(1 worker, 1 thread); peers from bench/.venv (run_core.py makes it)."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (BENCH, OUT, RESULTS, ServerTree, free_port, git_head, invocation, log,  # noqa: E402
                    peer_command, rotated, run_wrk, stop_all, wait_until_quiet, write_section)
from common.openloop import build_openloop, run_openloop  # noqa: E402

VENV_PY = os.path.join(BENCH, ".venv", "bin", "python")
SERVERS = ["forkwsgi", "bjoern", "fastpysgi", "granian", "gunicorn-gthread"]
APPS = {"route": ("apps:route", "/"), "flask": ("framework_apps:flask_app", "/user/7")}
TITLE = "## Tail latency at a fixed rate"
CONNS = 50


def command(server, spec, port):
    if server == "forkwsgi":
        return [sys.executable, "-m", "forkwsgi", spec, "--bind", f"127.0.0.1:{port}", "--log-level", "warning"]
    return peer_command(server, spec, port, VENV_PY)


def start(server, spec, path):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=BENCH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ServerTree(command(server, spec, port), port, os.path.join(OUT, f"latency-{server}.log"), env=env)
    if not s.wait_ready(path, timeout=30):
        s.stop()
        raise SystemExit(f"{server} did not answer: {s.log_text()[-300:]}")
    return s


def saturation(spec, path, seconds):
    s = start("bjoern", spec, path)
    try:
        url = f"http://127.0.0.1:{s.port}{path}"
        run_wrk(["-t1", f"-c{CONNS}"], 1, url)
        return run_wrk(["-t1", f"-c{CONNS}"], seconds, url).stats["rps"]
    finally:
        s.stop()


def cell(server, spec, path, rate, seconds, tag):
    s = start(server, spec, path)
    try:
        run_openloop(s.port, rate, 1, os.path.join(OUT, f"latency-{tag}.warm"), CONNS, path=path)
        wait_until_quiet(10)
        return run_openloop(s.port, rate, seconds, os.path.join(OUT, f"latency-{tag}.lat"), CONNS, path=path)
    finally:
        s.stop()


def report(results, servers, rates, sat, args):
    lines = [TITLE, "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{invocation()}` at {git_head()}: "
             f"app {APPS[args.app][0]} (GET {APPS[args.app][1]}), each server 1 process x 1 thread on CPU 0, "
             f"bench/openloop on CPU 1, {CONNS} kept-alive connections, {args.seconds} s per cell after 1 s of "
             f"warm-up, {args.rounds} rounds interleaved. bjoern's saturation (wrk -c{CONNS}): {sat:,.0f} req/s.",
             "", "Latency in ms from each request's due time: median over rounds of each percentile; "
             "\"x bjoern\" is forkwsgi's p99 over bjoern's in the same round (median).", ""]
    for label, rate in rates:
        lines += [f"**{label} of bjoern's saturation: {rate:,} req/s**", "",
                  "| server | p50 | p99 | p99.9 | max | p99 x bjoern | errors+timeouts |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for server in servers:
            rs = [r for r in results[label][server] if "p99_us" in r and r["p99_us"] is not None]
            if not rs:
                lines.append(f"| {server} | failed | | | | | |")
                continue
            ratios = [r["p99_us"] / b["p99_us"] for r, b in zip(results[label][server], results[label]["bjoern"])
                      if r.get("p99_us") and b.get("p99_us")]
            med = {k: statistics.median(r[k] for r in rs) / 1000 for k in ("p50_us", "p99_us", "p999_us", "max_us")}
            bad = sum(r.get("errors", 0) + r.get("timeouts", 0) for r in rs)
            lines.append(f"| {server} | {med['p50_us']:.2f} | {med['p99_us']:.2f} | {med['p999_us']:.2f} | "
                         f"{med['max_us']:.2f} | {statistics.median(ratios):.2f} | {bad} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--app", choices=sorted(APPS), default="route")
    ap.add_argument("--only", default=",".join(SERVERS))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    servers = [s for s in args.only.split(",") if s]
    if "bjoern" not in servers:
        servers.append("bjoern")
    build_openloop()
    spec, path = APPS[args.app]
    try:
        sat = saturation(spec, path, 5)
        log(f"bjoern saturates at {sat:,.0f} req/s")
        rates = [("50 %", int(sat * 0.5)), ("90 %", int(sat * 0.9))]
        results = {label: {s: [] for s in servers} for label, _ in rates}
        for rnd in range(args.rounds):
            for label, rate in rates:
                for server in rotated(servers, rnd):
                    r = cell(server, spec, path, rate, args.seconds, f"{server}-{rate}-{rnd}")
                    results[label][server].append(r)
                    log(f"round {rnd + 1} {label} {server}: " + (
                        f"p50 {r['p50_us'] / 1000:.2f} p99 {r['p99_us'] / 1000:.2f} p99.9 {r['p999_us'] / 1000:.2f} ms"
                        if r.get("p99_us") else f"failed {r}"))
    finally:
        stop_all()
    section = report(results, servers, rates, sat, args)
    print(section)
    if not args.no_write:
        write_section(RESULTS, TITLE, section)


if __name__ == "__main__":
    main()
