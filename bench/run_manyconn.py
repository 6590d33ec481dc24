"""Many connections: 10,000 kept-alive connections to one server process
(one thread), 1,000 of them sending at a fixed total rate (each in turn),
the other 9,000 open and silent; against the same rate on 50 connections.
Per server: CPU per request (the server's on-CPU time from the moment every
connection is open), the ratio of the two, RSS, and RSS per connection.

    python3 bench/run_manyconn.py [--rounds 3] [--seconds 8] [--rate 3000]
                                  [--only forkwsgi,bjoern,...] [--no-write]

Each server 1 process x 1 thread on CPU 0, bench/openloop on CPU 1 (-f:
every active connection sends in turn; -i 9000: the silent ones), rounds
interleaved. forkwsgi runs with its defaults except --max-connections 11000
(its default, 10,000, is the most a worker holds; at the limit it closes
the connection idle longest to make room), granian with --backpressure
11000 (its default, 1,024, is the most connections it serves at once). RSS: the server's whole process
tree (VmRSS summed) before the load (after a 1 s warm-up on 50
connections) and halfway through the 10,000-connection run; per connection
is the difference over 10,000 (bytes, the median over rounds), and its
ratio to the lowest of the other servers'. A cell whose server closed any of the silent
connections, or answered any request with an error, says so."""
import argparse
import os
import resource
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (BENCH, OUT, RESULTS, ServerTree, free_port, git_head, invocation, log,  # noqa: E402
                    peer_command, peers_ready, rotated, stop_all, wait_until_quiet, write_section)
from common.openloop import build_openloop, run_openloop  # noqa: E402

VENV_PY = os.path.join(BENCH, ".venv", "bin", "python")
SERVERS = ["forkwsgi", "bjoern", "fastpysgi", "granian"]
SPEC, PATH = "apps:route", "/"
TITLE = "## Many connections"
ACTIVE, SILENT, FEW = 1000, 9000, 50


def command(server, port):
    if server == "forkwsgi":
        return [sys.executable, "-m", "forkwsgi", SPEC, "--bind", f"127.0.0.1:{port}", "--log-level", "warning",
                "--max-connections", "11000"]
    if server == "granian":      # at most --backpressure connections at once (default 1024)
        return peer_command(server, SPEC, port, VENV_PY) + ["--backpressure", "11000"]
    return peer_command(server, SPEC, port, VENV_PY)


def tree_rss_kib(server):
    """VmRSS of the server's process tree, summed, in KiB."""
    pids, _ = server.tree()
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


def cell(server_name, rate, seconds, many, tag):
    """One server, one load: {cpu_us (per request), rss_kib, base_rss_kib, ...openloop's counts}."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=BENCH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = ServerTree(command(server_name, port), port, os.path.join(OUT, f"manyconn-{server_name}.log"), env=env)
    try:
        if not s.wait_ready(PATH, timeout=30):
            return {"failure": f"did not answer: {s.log_text()[-300:]}"}
        run_openloop(port, rate, 1, os.path.join(OUT, f"manyconn-{tag}.warm"), FEW, path=PATH, fifo=True)
        wait_until_quiet(10)
        base_rss = tree_rss_kib(s)
        mark, mid = {}, {}

        def ready():
            mark["cpu"] = s.sched_cpu_seconds()
            mark["t"] = time.monotonic()
            threading.Timer(seconds / 2, lambda: mid.setdefault("rss", tree_rss_kib(s))).start()

        r = run_openloop(port, rate, seconds, os.path.join(OUT, f"manyconn-{tag}.lat"),
                         ACTIVE if many else FEW, path=PATH, fifo=True, idle=SILENT if many else 0, on_ready=ready)
        if "failure" in r:
            return r
        cpu = s.sched_cpu_seconds() - mark["cpu"]
        r.update(cpu_us=1e6 * cpu / max(1, r["ok"]), base_rss_kib=base_rss, rss_kib=mid.get("rss", 0))
        return r
    finally:
        s.stop()


def report(results, servers, args):
    conns = ACTIVE + SILENT
    lines = [TITLE, "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{invocation()}` at {git_head()}: "
             f"app {SPEC} (GET {PATH}), each server 1 process x 1 thread on CPU 0, bench/openloop on CPU 1 at "
             f"{args.rate:,} req/s for {args.seconds} s: {conns:,} kept-alive connections ({ACTIVE:,} sending in "
             f"turn, {SILENT:,} silent) against {FEW} connections; {args.rounds} rounds interleaved, medians.",
             "", f"| server | CPU/request, {FEW} conns (µs) | CPU/request, {conns:,} conns (µs) | ratio | "
                 f"p99 at {conns:,} (ms) | RSS before (MiB) | RSS at {conns:,} (MiB) | bytes per connection | "
                 "x lowest of the others | silent ones closed | errors+timeouts |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def per_conn(server):
        """Median over rounds of the RSS growth per connection (bytes), or None."""
        many = [r for r in results[server]["many"] if "cpu_us" in r]
        return statistics.median((r["rss_kib"] - r["base_rss_kib"]) * 1024 / conns for r in many) if many else None

    grown = {server: per_conn(server) for server in servers}
    for server in servers:
        few = [r for r in results[server]["few"] if "cpu_us" in r]
        many = [r for r in results[server]["many"] if "cpu_us" in r]
        if not few or not many:
            why = next((r["failure"] for r in results[server]["few"] + results[server]["many"] if "failure" in r), "")
            lines.append(f"| {server} | failed: {why[:80]} | | | | | | | | | |")
            continue
        c_few = statistics.median(r["cpu_us"] for r in few)
        c_many = statistics.median(r["cpu_us"] for r in many)
        base = statistics.median(r["base_rss_kib"] for r in many)
        rss = statistics.median(r["rss_kib"] for r in many)
        p99 = statistics.median(r["p99_us"] for r in many if r.get("p99_us")) / 1000
        closed = max(r.get("idle_closed", 0) for r in many)
        bad = sum(r.get("errors", 0) + r.get("timeouts", 0) + r.get("non200", 0) for r in few + many)
        others = [g for o, g in grown.items() if o != server and g]
        vs = f"{grown[server] / min(others):.2f}" if others else ""
        lines.append(f"| {server} | {c_few:.1f} | {c_many:.1f} | {c_many / c_few:.2f} | {p99:.2f} | "
                     f"{base / 1024:.1f} | {rss / 1024:.1f} | {grown[server]:.0f} | {vs} | {closed} | {bad} |")
    lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--only", default=",".join(SERVERS))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    servers = [s for s in args.only.split(",") if s]
    missing = peers_ready(servers)
    servers = [s for s in servers if s not in missing]
    # 10,000 sockets on each side: the client's and the servers' descriptor limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = ACTIVE + SILENT + 1000
    if hard != resource.RLIM_INFINITY and hard < want:
        raise SystemExit(f"the descriptor limit is {hard}; this benchmark needs {want} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else hard, hard))
    build_openloop()
    results = {s: {"few": [], "many": []} for s in servers}
    try:
        for rnd in range(args.rounds):
            for server in rotated(servers, rnd):
                for kind in ("few", "many"):
                    r = cell(server, args.rate, args.seconds, kind == "many", f"{server}-{kind}-{rnd}")
                    results[server][kind].append(r)
                    log(f"round {rnd + 1} {server} {kind}: " + (
                        f"{r['cpu_us']:.1f} µs/request, RSS {r['rss_kib'] / 1024:.1f} MiB, "
                        f"closed {r.get('idle_closed')}, errors {r['errors']} timeouts {r['timeouts']}"
                        if "cpu_us" in r else f"failed {r}"))
    finally:
        stop_all()
    section = report(results, servers, args)
    print(section)
    if not args.no_write:
        write_section(RESULTS, TITLE, section)


if __name__ == "__main__":
    main()
