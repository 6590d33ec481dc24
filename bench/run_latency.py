"""Tail latency at a fixed rate: bench/openloop.c on CPU 1 sends keep-alive
requests on 50 connections at 50 % and 90 % of bjoern's own saturation rate
(bjoern 1 process x 1 thread, measured first with wrk -c50 in the same run),
the same rates for every server, each server's whole process tree on CPU 0;
p50, p99, p99.9 and max from each request's due time (no coordinated
omission), rounds interleaved.

    python3 bench/run_latency.py [--layout 1x1|4x4] [--rounds 5] [--seconds 5]
                                 [--app route|flask] [--only forkwsgi,uwsgi,...] [--no-write]

Layouts (--layout), each its own section of bench/RESULTS.md:
  1x1  one process, one thread: forkwsgi (--workers 1 --threads 1), bjoern,
       fastpysgi, granian (1 worker, 1 blocking thread), gunicorn gthread
       (1 worker, 1 thread), uWSGI (1 process, 1 thread);
  4x4  four processes x four threads: forkwsgi --workers 4 --threads 4,
       gunicorn gthread -w 4 --threads 4, uWSGI --processes 4 --threads 4,
       granian --workers 4 --blocking-threads 4. bjoern and fastpysgi serve
       from one thread only: not in this table; bjoern's 1x1 saturation
       still sets the rates.
Peers from bench/.venv and uWSGI from bench/.venv-uwsgi, both made or
completed here at pinned versions (bench/common/peers.py, uwsgi.py).

uWSGI and keep-alive: --http-socket answers with a connection per request
(openloop reconnects for each), and --http11-socket keeps a connection
alive on the thread that accepted it until the client closes it or
--socket-timeout (4 s) passes, so on one thread the other 49 connections
wait in the accept queue (timeouts). uWSGI is therefore run the way it
serves kept-alive HTTP clients: its HTTP router (--http with
--http-keepalive, one async process beside the master) in front of the
workers, which it reaches over a uwsgi socket. The router is in the
process tree on CPU 0. The "connects" column shows the connections
openloop opened: 50 means all stayed alive.

Columns "x best peer": the server's p99 (p99.9) over the lowest p99 (p99.9)
of the other servers in the same round, median over rounds; forkwsgi's
goal is at or below 1.00 in both at both rates."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (BENCH, LAYOUTS, OUT, RESULTS, ServerTree, ensure_uwsgi, free_port, git_head,  # noqa: E402
                    invocation, log, peer_command, peers_ready, rotated, run_wrk, stop_all, wait_until_quiet,
                    write_section)
from common.openloop import build_openloop, run_openloop  # noqa: E402

VENV_PY = os.path.join(BENCH, ".venv", "bin", "python")
SERVERS = {"1x1": ["forkwsgi", "bjoern", "fastpysgi", "granian", "gunicorn-gthread", "uwsgi"],
           "4x4": ["forkwsgi", "gunicorn-gthread", "uwsgi", "granian"]}
APPS = {"route": ("apps:route", "/"), "flask": ("framework_apps:flask_app", "/user/7")}
# Distinct heading prefixes: write_section finds a section by its heading's start.
TITLES = {"1x1": "## Tail latency at a fixed rate",
          "4x4": "## Tail latency with 4 workers x 4 threads at a fixed rate"}
LAYOUT_TEXT = {
    "1x1": "each server 1 process x 1 thread (uWSGI: 1 worker behind its HTTP router)",
    "4x4": "each server 4 processes x 4 threads (forkwsgi --workers 4 --threads 4, gunicorn -k gthread -w 4 "
           "--threads 4, uWSGI --processes 4 --threads 4 behind its HTTP router, granian --workers 4 "
           "--blocking-threads 4)",
}
CONNS = 50


def command(server, spec, port, layout):
    if server == "forkwsgi":
        workers, threads = LAYOUTS[layout]
        return [sys.executable, "-m", "forkwsgi", spec, "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
                "--threads", str(threads), "--log-level", "warning"]
    return peer_command(server, spec, port, VENV_PY, layout)


def start(server, spec, path, layout):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=BENCH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ServerTree(command(server, spec, port, layout), port, os.path.join(OUT, f"latency-{server}.log"), env=env)
    if not s.wait_ready(path, timeout=30):
        s.stop()
        raise SystemExit(f"{server} did not answer: {s.log_text()[-300:]}")
    return s


def saturation(spec, path, seconds):
    """bjoern's req/s at 1 process x 1 thread, wrk -c50: the rate reference of both layouts."""
    s = start("bjoern", spec, path, "1x1")
    try:
        url = f"http://127.0.0.1:{s.port}{path}"
        run_wrk(["-t1", f"-c{CONNS}"], 1, url)
        return run_wrk(["-t1", f"-c{CONNS}"], seconds, url).stats["rps"]
    finally:
        s.stop()


def cell(server, spec, path, layout, rate, seconds, tag):
    s = start(server, spec, path, layout)
    try:
        run_openloop(s.port, rate, 1, os.path.join(OUT, f"latency-{tag}.warm"), CONNS, path=path)
        wait_until_quiet(10)
        return run_openloop(s.port, rate, seconds, os.path.join(OUT, f"latency-{tag}.lat"), CONNS, path=path)
    finally:
        s.stop()


def over(rows, server, refs, key):
    """Median over rounds of `server`'s `key` over the lowest `key` of the
    servers `refs` in the same round (rounds where either failed left out);
    None if no round has both."""
    ratios = []
    for i, r in enumerate(rows[server]):
        ref = [rows[o][i][key] for o in refs if i < len(rows[o]) and rows[o][i].get(key)]
        if r.get(key) and ref:
            ratios.append(r[key] / min(ref))
    return statistics.median(ratios) if ratios else None


def fmt(x):
    return "" if x is None else f"{x:.2f}"


def table(rows, servers, with_bjoern):
    """The Markdown table of one rate: `rows` maps server -> its cells, in round order."""
    head = ["server", "p50", "p99", "p99.9", "max"] + (["p99 x bjoern"] if with_bjoern else []) + [
        "p99 x best peer", "p99.9 x best peer", "connects", "errors+timeouts"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for server in servers:
        rs = [r for r in rows[server] if r.get("p99_us") is not None]
        if not rs:
            lines.append(f"| {server} | failed |" + " |" * (len(head) - 2))
            continue
        med = {k: statistics.median(r[k] for r in rs) / 1000 for k in ("p50_us", "p99_us", "p999_us", "max_us")}
        cells = [server] + [f"{med[k]:.2f}" for k in ("p50_us", "p99_us", "p999_us", "max_us")]
        if with_bjoern:
            cells.append(fmt(over(rows, server, ["bjoern"], "p99_us")))
        peers = [s for s in servers if s != server]
        cells += [fmt(over(rows, server, peers, "p99_us")), fmt(over(rows, server, peers, "p999_us")),
                  f"{statistics.median(r.get('connects', 0) for r in rs):.0f}",
                  str(sum(r.get("errors", 0) + r.get("timeouts", 0) for r in rows[server]))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(results, servers, rates, sat, args, uwsgi_note):
    with_bjoern = "bjoern" in servers
    lines = [TITLES[args.layout], "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{invocation()}` at {git_head()}: "
             f"app {APPS[args.app][0]} (GET {APPS[args.app][1]}), {LAYOUT_TEXT[args.layout]}, the whole process "
             f"tree on CPU 0, bench/openloop on CPU 1, {CONNS} kept-alive connections, {args.seconds} s per cell "
             f"after 1 s of warm-up, {args.rounds} round{'s' * (args.rounds != 1)} interleaved. Rates from bjoern's saturation "
             f"(1 process x 1 thread, wrk -c{CONNS}): {sat:,.0f} req/s. {uwsgi_note}",
             "", "Latency in ms from each request's due time: median over rounds of each percentile. "
             + ("\"p99 x bjoern\": the server's p99 over bjoern's in the same round; " if with_bjoern else "")
             + "\"x best peer\": the server's p99 (p99.9) over the lowest p99 (p99.9) of the other servers in the "
             "same round; ratios are medians over rounds. forkwsgi's goal: both \"x best peer\" at or below 1.00. "
             "\"connects\": connections openloop opened (50: all stayed alive). Figures stand only with 0 "
             "errors+timeouts.", ""]
    for label, rate in rates:
        lines += [f"**{label} of bjoern's saturation: {rate:,} req/s**", ""]
        lines += table(results[label], servers, with_bjoern)
        lines.append("")
    return "\n".join(lines)


def pick_servers(ap, args):
    """The servers of --only in the layout (1x1 always has bjoern, its
    reference); a name not in the layout is a usage error."""
    known = SERVERS[args.layout]
    servers = [s for s in args.only.split(",") if s] if args.only else list(known)
    unknown = [s for s in servers if s not in known]
    if unknown:
        ap.error(f"not in layout {args.layout}: {', '.join(unknown)} (it has {', '.join(known)})")
    if args.layout == "1x1" and "bjoern" not in servers:
        servers.append("bjoern")
    return servers


def uwsgi_ready(servers):
    """Drop uwsgi from `servers` if bench/.venv-uwsgi cannot be made; the
    sentence the report gives about it."""
    if "uwsgi" not in servers:
        return ""
    version, why = ensure_uwsgi()
    if why:
        log(f"uWSGI left out: {why}")
        servers.remove("uwsgi")
        return f"uWSGI left out: {why}."
    return (f"uWSGI {version} (bench/.venv-uwsgi) serves through its HTTP router (--http --http-keepalive): "
            "--http-socket keeps no connection alive and --http11-socket keeps one per thread.")


def log_cell(rnd, label, server, r):
    if r.get("p99_us") is None:
        log(f"round {rnd + 1} {label} {server}: failed {r}")
        return
    log(f"round {rnd + 1} {label} {server}: p50 {r['p50_us'] / 1000:.2f} p99 {r['p99_us'] / 1000:.2f} "
        f"p99.9 {r['p999_us'] / 1000:.2f} max {r['max_us'] / 1000:.2f} ms, connects {r.get('connects')}, "
        f"errors {r.get('errors')}, timeouts {r.get('timeouts')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="1x1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--app", choices=sorted(APPS), default="route")
    ap.add_argument("--only", default="", help="comma-separated servers of the layout (default: all of them)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    servers = pick_servers(ap, args)
    missing = peers_ready(servers, ["flask"] if args.app == "flask" else [])
    if "bjoern" in missing or "flask" in missing:
        sys.exit(f"bjoern sets the rates and must run: {missing}")
    servers = [s for s in servers if s not in missing]
    build_openloop()
    uwsgi_note = uwsgi_ready(servers)
    spec, path = APPS[args.app]
    try:
        sat = saturation(spec, path, 5)
        log(f"bjoern saturates at {sat:,.0f} req/s")
        rates = [("50 %", int(sat * 0.5)), ("90 %", int(sat * 0.9))]
        results = {label: {s: [] for s in servers} for label, _ in rates}
        for rnd in range(args.rounds):
            for label, rate in rates:
                for server in rotated(servers, rnd):
                    r = cell(server, spec, path, args.layout, rate, args.seconds,
                             f"{args.layout}-{server}-{rate}-{rnd}")
                    results[label][server].append(r)
                    log_cell(rnd, label, server, r)
    finally:
        stop_all()
    section = report(results, servers, rates, sat, args, uwsgi_note)
    print(section)
    if not args.no_write:
        write_section(RESULTS, TITLES[args.layout], section)


if __name__ == "__main__":
    main()
