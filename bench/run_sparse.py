#!/usr/bin/env python3
"""Sparse arrivals beside heavy requests: where does a light request run?

    python3 bench/run_sparse.py              # 3 seeds x 120 arrivals per server (~8 min)
    python3 bench/run_sparse.py --quick      # 1 seed x 40 arrivals (~1 min)

New connections arrive one at a time, 0.11-0.5 s apart (2 to 9 a second:
each after a quiet spell longer than forkwsgi's FW_RANK_LIVE_MS, so its
workers are not ranked for it beforehand), each with one request
(`Connection: close`) to run_balance.py's sleep_app: 30 % heavy (d = 0.4 s),
the rest light (d = 0.02 s); the same arrival schedule for every server
(seeded). 2 workers x 2 threads: forkwsgi least-busy, gunicorn gthread,
uWSGI (--thunder-lock). Counted per server: light requests whose app call
began while a heavy one ran in the same process ("beside a heavy"), and of
those the ones that began while the other process ran nothing ("... while a
worker idled": the misplacements a load-aware server should never make), from
the X-Pid / X-Start / X-End headers (CLOCK_MONOTONIC, system-wide); and the
light requests' overhead (round trip - d).

Servers on CPU 0, the client (threads of this process) on CPU 1, 127.0.0.1
only; peers from bench/.venv (run_balance.ensure_venv). Raw results go to
bench/out/sparse-*.json, the summary to the terminal and to the section
"Sparse arrivals" of bench/RESULTS.md.
"""
import argparse
import datetime
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_balance as rb  # noqa: E402
from common import CLIENT_CPU, OUT, RESULTS, SERVER_CPU, invocation, log, pin_self, stop_all, write_section  # noqa: E402

SECTION = "## Sparse arrivals beside heavy requests (2 x 2)"
HEAVY, LIGHT, HEAVY_SHARE = 0.4, 0.02, 0.3
GAP = (0.11, 0.5)
SERVERS = {
    "forkwsgi-least-busy": ("forkwsgi", 2, lambda a, p: rb.forkwsgi_argv(a, p, 2, 2, "least-busy")),
    "gunicorn-gthread": ("gunicorn", 2, lambda a, p: rb.gunicorn_argv(a, p, 2, 2)),
    "uwsgi": ("uwsgi", 2, lambda a, p: rb.uwsgi_argv(a, p, 2, 2)),
}


def one(port, d, out, errors):
    """One arrival: a new connection, one request; its timing to `out`."""
    client = rb.Client(port, keepalive=False, timeout=30)
    t0 = time.monotonic()
    try:
        status, h = client.get(f"/?d={d}")
    except Exception as e:  # noqa: BLE001 - counted, and the run goes on
        errors.append(rb.error_name(e))
        return
    if status != 200:
        errors.append(f"HTTP {status}")
        return
    out.append({"d": d, "t0": t0, "rt": time.monotonic() - t0, "pid": int(h["x-pid"]),
                "start": float(h["x-start"]), "end": float(h["x-end"])})


def analyse(records):
    """The light requests that began beside a heavy one in their process,
    and those of them that began while another process ran nothing."""
    pids = {r["pid"] for r in records}
    beside = idle_other = 0
    lights = [r for r in records if r["d"] == LIGHT]
    for r in lights:
        def running(pid):
            return sum(1 for x in records if x is not r and x["pid"] == pid and x["start"] <= r["start"] < x["end"])
        heavy_here = any(x["d"] == HEAVY and x["pid"] == r["pid"] and x["start"] <= r["start"] < x["end"]
                         for x in records)
        if heavy_here:
            beside += 1
            if len(pids) < 2 or any(running(p) == 0 for p in pids if p != r["pid"]):
                idle_other += 1
    over = [1000 * (r["rt"] - r["d"]) for r in lights]
    return {"lights": len(lights), "beside_heavy": beside, "beside_heavy_while_idle": idle_other,
            "overhead_ms": {k: rb.pct(over, p) for k, p in (("p50", 50), ("p99", 99), ("max", 100))},
            "workers_used": len(pids)}


def run(name, seed, n, env, quiet_wait):
    family, workers, argv_fn = SERVERS[name]
    tag = f"sparse-{name}-{seed}"
    rb.wait_until_quiet(quiet_wait)
    result = {"server": name, "seed": seed}
    srv = rb.start_cell(result, name, family, workers, argv_fn, "sleep_app", tag, env, "/?d=0")
    if srv is None:
        return result
    rng = random.Random(seed)
    records, errors, threads = [], [], []
    try:
        time.sleep(1.0)                                   # a quiet spell before the first
        for _ in range(n):                                # bounded: n arrivals
            time.sleep(rng.uniform(*GAP))
            d = HEAVY if rng.random() < HEAVY_SHARE else LIGHT
            t = threading.Thread(target=one, args=(srv.port, d, records, errors), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(35)
    finally:
        crashed, code = srv.stop()
    if crashed:
        result["failure"] = f"server exited during the run (code {code})"
    result.update(analyse(records), errors=len(errors), error_samples=errors[:5], n=len(records))
    with open(os.path.join(OUT, f"{tag}.json"), "w") as f:
        json.dump({**result, "records": records}, f)
    return result


def summarize(results):
    lines = ["| server | light requests | beside a heavy | beside a heavy while a worker idled "
             "| light overhead p50 / p99 / max ms | errors |",
             "|---|---:|---:|---:|---|---:|"]
    for name in SERVERS:
        rs = [r for r in results if r["server"] == name and "lights" in r]
        if not rs:
            fail = next((r.get("failure") for r in results if r["server"] == name), "not run")
            lines.append(f"| {name} | — | — | — | {fail} | — |")
            continue
        over = [r["overhead_ms"] for r in rs]
        lines.append(f"| {name} | {sum(r['lights'] for r in rs)} | {sum(r['beside_heavy'] for r in rs)} | "
                     f"{sum(r['beside_heavy_while_idle'] for r in rs)} | "
                     f"{sorted(o['p50'] for o in over)[len(over) // 2]:.1f} / "
                     f"{max(o['p99'] for o in over):.1f} / {max(o['max'] for o in over):.1f} | "
                     f"{sum(r['errors'] for r in rs)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 40 arrivals")
    ap.add_argument("--seeds", default="7,11,12", help="arrival schedules, one run each per server")
    ap.add_argument("--arrivals", type=int, default=120, help="arrivals per run")
    ap.add_argument("--only", help="comma-separated server names or families")
    ap.add_argument("--quiet-wait", type=float, default=10)
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")][:1 if args.quick else None]
    n = 40 if args.quick else args.arrivals
    names = rb.select(SERVERS, [t.strip() for t in args.only.split(",")] if args.only else None)
    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    os.makedirs(OUT, exist_ok=True)
    families = {SERVERS[s][0] for s in names}
    unavailable, versions = rb.ensure_venv("gunicorn" in families, "uwsgi" in families)
    pin_self(CLIENT_CPU)
    results = []
    try:
        for seed in seeds:
            for name in names:
                if SERVERS[name][0] in unavailable:
                    results.append({"server": name, "seed": seed, "failure": unavailable[SERVERS[name][0]]})
                    continue
                r = run(name, seed, n, dict(os.environ), args.quiet_wait)
                results.append(r)
                log(f"seed {seed:3} {name:20} " + (f"FAILED: {r['failure']}" if "lights" not in r else
                    f"lights {r['lights']:3}  beside a heavy {r['beside_heavy']:3}  while a worker idled "
                    f"{r['beside_heavy_while_idle']:3}  overhead p50 {r['overhead_ms']['p50']:.1f} ms  "
                    f"errors {r['errors']}"))
    finally:
        stop_all(term_wait=2.0)
    table = summarize(results)
    log("\n" + table)
    if args.no_write:
        return
    fw = rb.forkwsgi_facts()
    section = f"""{SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `{invocation()}` (took {(time.monotonic() - t_start) / 60:.1f} min);
forkwsgi from git {fw['git_head']}, gunicorn {versions.get('gunicorn', '—')}, uWSGI {versions.get('uwsgi', '—')}.
Servers on CPU {SERVER_CPU}, the client on CPU {CLIENT_CPU}, 127.0.0.1. Seeds {', '.join(map(str, seeds))},
{n} arrivals each: new connections 0.11-0.5 s apart, one request each, {HEAVY_SHARE:.0%} of {HEAVY} s,
the rest {LIGHT} s (`bench/balance_apps.py:sleep_app`), 2 workers x 2 threads. "Beside a heavy": a
light request whose app call began while a heavy one ran in its process; "while a worker idled": and
the other process ran nothing then. Overhead: round trip - d, light requests (p50: median over the
seeds; p99 and max: the worst seed).

{table}
"""
    write_section(RESULTS, SECTION, section)
    log(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
