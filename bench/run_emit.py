#!/usr/bin/env python3
"""What one forkwsgi.offload() call costs the request: the ring (this
checkout) against the socket queue it replaced (a build of --before), side
by side in one run.

    python3 bench/run_emit.py                 # 3 rounds (~2 minutes)
    python3 bench/run_emit.py --quick         # 1 round

The app (bench/emit_apps.py) emits --calls records of 1 KiB back to back in
one request, each call timed with perf_counter_ns, and answers the
percentiles: a tight loop, within the queue's size (2,000 x 1 KiB of a 4
MiB queue), so neither queue is ever full and no record spills. Between
requests the client waits for the sibling to take everything (jsonl sink).
Variants, each a fresh server (1 worker, 1 thread) pinned to CPU 0, the
client on CPU 1, interleaved over the rounds:

    no call          the loop with the timing but no offload() (the floor)
    socket queue     forkwsgi at --before: one sendmsg() per record
    ring             this checkout: a copy into the ring, no syscall

Reported: the median over requests of each request's p50, p90 and p99 (ns),
and the ring's figures against the socket queue's. The summary goes to the
"Offload: emit cost" section of bench/RESULTS.md.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH, CLIENT_CPU, OUT, RESULTS, ROOT, ServerTree, free_port, git_head, invocation,  # noqa: E402
                    log, pin_self, rotated, stop_all, wait_until_quiet, write_section)

SECTION = "## Offload: emit cost, socket queue vs ring"


def build_before(rev):
    """A build of `rev` (the socket queue) in a worktree of its own; its python/ dir."""
    tree = os.path.join(OUT, f"emit-before-{rev}")
    if not os.path.isdir(tree):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", tree, rev], check=True,
                       stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return os.path.join(tree, "python")


def build_here():
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return os.path.join(ROOT, "python")


def get(port, path, timeout=30):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:200])
    return json.loads(body)


def one_run(name, pypath, emit, args, scratch, tag):
    wait_until_quiet(15)
    port = free_port()
    out = os.path.join(scratch, f"{tag}.jsonl")
    argv = [sys.executable, "-m", "forkwsgi", "emit_apps:app", "--bind", f"127.0.0.1:{port}", "--workers", "1",
            "--threads", "1", "--offload-sink", f"jsonl:{out}", "--offload-dir", os.path.join(scratch, tag)]
    env = dict(os.environ, PYTHONPATH=pypath + os.pathsep + BENCH)
    srv = ServerTree(argv, port, os.path.join(OUT, f"emit-{tag}.log"), env)
    try:
        if not srv.wait_listening(20):
            return {"failure": "server did not become ready: " + srv.log_text()[-500:]}
        path = f"/loop?n={args.calls}&size=1024&emit={1 if emit else 0}"
        for _ in range(3):                                 # warm-up
            get(port, path)
            time.sleep(0.3)
        rows = []
        for _ in range(args.requests):
            r = get(port, path)
            if r["ok"] != args.calls:
                return {"failure": f"{args.calls - r['ok']} record(s) not accepted"}
            rows.append(r)
            time.sleep(0.3)                                # the sibling takes them meanwhile
        return {k: statistics.median(r[k] for r in rows) for k in ("p50", "p90", "p99", "max")}
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="5cdaf0e", help="the build with the socket queue (default 5cdaf0e)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20, help="timed requests per run")
    ap.add_argument("--calls", type=int, default=2000, help="records per request")
    ap.add_argument("--quick", action="store_true", help="1 round of 5 requests")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.requests = 1, 5
    os.makedirs(OUT, exist_ok=True)
    pin_self(CLIENT_CPU)
    started = time.monotonic()
    rev = git_head()
    log(f"building {args.before} (socket queue) and this checkout ({rev})")
    before, here = build_before(args.before), build_here()
    variants = [("no call (timing floor)", here, False), (f"socket queue ({args.before})", before, True),
                (f"ring ({rev})", here, True)]
    results = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory(prefix="forkwsgi-emit-") as scratch:
        try:
            for rnd in range(args.rounds):
                order = rotated(variants, rnd)
                for i, (name, pypath, emit) in enumerate(order):
                    res = one_run(name, pypath, emit, args, scratch, f"r{rnd}v{i}")
                    log(f"round {rnd + 1}: {name}: {res}")
                    results[name].append(res)
        finally:
            stop_all()
    med = {}
    for name, runs in results.items():
        ok = [r for r in runs if "failure" not in r]
        med[name] = {k: statistics.median(r[k] for r in ok) for k in ("p50", "p90", "p99", "max")} if ok else None
    sock, ring = med[variants[1][0]], med[variants[2][0]]
    lines = [SECTION, "",
             f"Run on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC by `{invocation()}` "
             f"(took {(time.monotonic() - started) / 60:.1f} min), this "
             f"checkout at {rev} against {args.before}. One request emits {args.calls:,} records of 1 KiB back to "
             f"back, each `forkwsgi.offload()` call timed with perf_counter_ns (Python's call included); "
             f"{args.requests} timed requests per run after 3 of warm-up, a fresh server (1 worker, 1 thread, jsonl "
             f"sink) per run on CPU 0, the client on CPU 1, {args.rounds} interleaved round(s). Figures: the median "
             f"over requests of each request's percentile, ns.", "",
             "| variant | p50 | p90 | p99 | max |", "|---|---:|---:|---:|---:|"]
    for name, _, _ in variants:
        m = med[name]
        lines.append(f"| {name} | " + (" | ".join(f"{m[k]:,.0f}" for k in ("p50", "p90", "p99", "max"))
                                       if m else "failed | | | ") + " |")
    if sock and ring:
        lines += ["", "| ring / socket queue | p50 | p90 | p99 |", "|---|---:|---:|---:|",
                  "| ratio | " + " | ".join(f"{ring[k] / sock[k]:.3f}" for k in ("p50", "p90", "p99")) + " |"]
    section = "\n".join(lines) + "\n"
    print(section)
    if not args.no_write:
        write_section(RESULTS, SECTION, section)


if __name__ == "__main__":
    main()
