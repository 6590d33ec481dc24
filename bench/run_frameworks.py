"""Real framework apps, side by side: a small Flask JSON service and a
one-file Django service (bench/framework_apps.py), keep-alive, each server
one process serving on CPU 0, wrk -c50 on CPU 1; requests per server
CPU-second and p99, as ratios to bjoern's in the same round, rounds
interleaved (issue: speed on real apps).

    python3 bench/run_frameworks.py [--rounds 3] [--seconds 5] [--apps flask,django]
                                    [--only forkwsgi,bjoern,...] [--variant NAME="FLAGS"] [--no-write]

Servers: forkwsgi (--threads 1, its defaults), bjoern, fastpysgi, granian (--interface wsgi, 1 worker, 1 blocking thread). The peers run from
bench/.venv, forkwsgi from this checkout; Flask and Django at the same
pinned versions in both interpreters (installed here when missing:
bench/common/peers.py)."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (BENCH, OUT, RESULTS, ServerTree, free_port, git_head, invocation, log, median_ci,  # noqa: E402
                    peer_command, peers_ready, rotated, run_wrk, stop_all, wait_until_quiet, write_section)

VENV_PY = os.path.join(BENCH, ".venv", "bin", "python")
APPS = {"flask": "flask_app", "django": "django_app"}
SERVERS = ["forkwsgi", "bjoern", "fastpysgi", "granian"]
PATH = "/user/7"
TITLE = "## Real frameworks: Flask and Django"


VARIANTS = {}          # --variant NAME="forkwsgi flags": a forkwsgi of other settings, as server NAME


def command(server, app, port):
    if server == "forkwsgi" or server in VARIANTS:
        return [sys.executable, "-m", "forkwsgi", f"framework_apps:{app}", "--bind", f"127.0.0.1:{port}",
                "--log-level", "warning", *VARIANTS.get(server, [])]
    return peer_command(server, f"framework_apps:{app}", port, VENV_PY)


def measure(server, app, seconds):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=BENCH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ServerTree(command(server, app, port), port, os.path.join(OUT, f"frameworks-{server}.log"), env=env)
    try:
        if not s.wait_ready(PATH, timeout=30):
            return {"error": (s.log_text() or "did not answer")[-300:]}
        run_wrk(["-t1", "-c50"], 1, f"http://127.0.0.1:{port}{PATH}")          # warm-up, discarded
        wait_until_quiet(10)
        cpu0 = s.sched_cpu_seconds()
        w = run_wrk(["-t1", "-c50"], seconds, f"http://127.0.0.1:{port}{PATH}")
        cpu = s.sched_cpu_seconds() - cpu0
        if not w.stats or w.stats["requests"] == 0:
            return {"error": w.output[-300:]}
        st = w.stats
        return {"per_cpu_s": st["requests"] / cpu, "rps": st["rps"], "p99_ms": st["p99_us"] / 1000,
                "errors": st["errors"] + st["status"]}
    finally:
        s.stop()


def report(results, servers, apps, rounds, seconds):
    lines = [TITLE, "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{invocation()}` at {git_head()} "
             f"({rounds} rounds interleaved, {seconds} s measured per cell after a 1 s warm-up; server on CPU 0, "
             f"wrk -t1 -c50 keep-alive on CPU 1; GET {PATH}).", "",
             "Requests per server CPU-second (the server's whole process tree, from schedstat), as a ratio to "
             "bjoern's in the same round: median (range); then a 95 % interval for that median (distribution-free: "
             "order statistics, 6 rounds or more) and the rounds in which the server did more than bjoern. "
             "p99 is wrk's, median over rounds.", ""]
    for app in apps:
        lines += [f"**{app}**", "",
                  "| server | req per server CPU-s | × bjoern | 95 % interval | ahead of bjoern | req/s | p99 ms | errors |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for server in servers:
            cells = [r for r in results[app][server] if "per_cpu_s" in r]
            if not cells:
                err = next((r["error"] for r in results[app][server] if "error" in r), "no result")
                lines.append(f"| {server} | failed: {err.splitlines()[-1][:80] if err else ''} | | | | | | |")
                continue
            ratios = [r["per_cpu_s"] / b["per_cpu_s"] for r, b in zip(results[app][server], results[app]["bjoern"])
                      if "per_cpu_s" in r and "per_cpu_s" in b]
            ratio = (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
            ci = median_ci(ratios) if server != "bjoern" else None
            interval = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "-"
            ahead = f"{sum(x > 1 for x in ratios)} of {len(ratios)}" if ratios and server != "bjoern" else "-"
            lines.append(f"| {server} | {statistics.median(r['per_cpu_s'] for r in cells):,.0f} | {ratio} | "
                         f"{interval} | {ahead} | "
                         f"{statistics.median(r['rps'] for r in cells):,.0f} | "
                         f"{statistics.median(r['p99_ms'] for r in cells):.2f} | {sum(r['errors'] for r in cells)} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--apps", default="flask,django")
    ap.add_argument("--only", default=",".join(SERVERS))
    ap.add_argument("--variant", action="append", default=[], metavar='NAME="FLAGS"',
                    help="also run forkwsgi with these flags, as server NAME (A/B of a setting)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    apps = [a for a in args.apps.split(",") if a]
    servers = [s for s in args.only.split(",") if s]
    for v in args.variant:
        name, _, flags = v.partition("=")
        VARIANTS[name] = flags.split()
        servers.append(name)
    if "bjoern" not in servers:
        servers.append("bjoern")       # the ratios' reference
    missing = peers_ready(servers, apps)
    if "bjoern" in missing or any(a in missing for a in apps):
        sys.exit(f"bjoern and the frameworks are needed: {missing}")
    servers = [s for s in servers if s not in missing]
    os.makedirs(OUT, exist_ok=True)
    results = {app: {s: [] for s in servers} for app in apps}
    try:
        for rnd in range(args.rounds):
            for app in apps:
                for server in rotated(servers, rnd):
                    r = measure(server, APPS[app], args.seconds)
                    results[app][server].append(r)
                    log(f"round {rnd + 1} {app} {server}: " + (f"{r['per_cpu_s']:,.0f} req/CPU-s, p99 "
                        f"{r['p99_ms']:.2f} ms" if "per_cpu_s" in r else f"failed: {r['error'][-120:]}"))
    finally:
        stop_all()
    section = report(results, servers, apps, args.rounds, args.seconds)
    print(section)
    if not args.no_write:
        write_section(RESULTS, TITLE, section)


if __name__ == "__main__":
    main()
