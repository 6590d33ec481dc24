#!/usr/bin/env python3
"""The offload journal on a full disk (the offload sibling's journal
directory runs out of space while records keep coming), as one measurement.

    sudo python3 bench/run_disk_full.py [PYTHONPATH_OF_THE_FORKWSGI_TO_TRY] [--no-write]

Mounts a 2 MiB tmpfs as --offload-dir, starts `forkwsgi apps:offloader
--workers 2 --threads 2 --offload-queue-bytes 1048576` with a jsonl sink on
the normal disk, sends about 100 requests a second of 10 records each for
20 s while the tmpfs is full, frees it, goes on 10 s, waits (up to 30 s)
until the sink holds every record accepted, stops the server with SIGTERM
and counts: records accepted (offload() returned True), delivered, missing,
duplicated; sibling crashes; disk-error log lines. Everything on 127.0.0.1;
the server is ended by its PID and the tmpfs unmounted. The counts go to
the terminal (one JSON line) and to the section "## Offload: the journal
on a full disk" of bench/RESULTS.md.
"""
import argparse
import collections
import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (RESULTS, ROOT, ServerTree, free_port, git_head, invocation, run_quiet,  # noqa: E402
                    wait_until, write_section)

TESTS = os.path.join(ROOT, "tests")
TITLE = "## Offload: the journal on a full disk"
DRAIN_WAIT = 30.0       # s for the sibling to deliver what was accepted
# The ring file under --offload-dir takes its size of the tmpfs from the
# start (its blocks are allocated when it is made): 1 MiB, as in
# tests/test_offload_disk.py, leaves the journal the other 1 MiB to fill.
# The default 32 MiB does not fit: the server would not start.
RING_BYTES = 1 << 20


def shown(path):
    """A path as the reader of RESULTS.md can use it: from the repository
    root when it is inside this checkout."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


def report(figures, forkwsgi_dir, when):
    """The RESULTS.md section: the run's counts as a table."""
    labels = [("requests", "requests sent"), ("http_errors", "requests that failed"),
              ("accepted", "records accepted (offload() returned True)"), ("delivered", "records delivered"),
              ("missing", "records missing"), ("duplicates", "records duplicated"),
              ("sibling_crashes", "offload sibling crashes"), ("disk_error_lines", "disk-error log lines"),
              ("server_exit", "server exit code after SIGTERM")]
    lines = [TITLE, "",
             f"Run on {when} by `{invocation()}`: forkwsgi from {shown(forkwsgi_dir)} at {git_head(forkwsgi_dir)}, "
             "--workers 2 --threads 2, a 1 MiB ring and --offload-dir on a 2 MiB tmpfs filled for 20 s while about 100 "
             "requests a second each offload 10 records of 500 bytes, then freed for 10 s; a jsonl sink on the "
             "normal disk. Not a speed benchmark: no record accepted may be missing or duplicated.", "",
             "| count | |", "|---|---:|"]
    lines += [f"| {label} | {figures[key]:,} |" if isinstance(figures[key], int) else f"| {label} | {figures[key]} |"
              for key, label in labels]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", default="", metavar="PYTHONPATH",
                    help="the python/ directory of the forkwsgi to try (default: the installed one)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md as it is")
    args = ap.parse_args()
    src = os.path.abspath(args.src) if args.src else ""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    base = tempfile.mkdtemp(prefix="forkwsgi-diskfull-")
    mnt = os.path.join(base, "small")
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2097152", "tmpfs", mnt], check=True)
    out = os.path.join(base, "out.jsonl")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (TESTS, src) if p))
    forkwsgi_dir = run_quiet([sys.executable, "-c", "import forkwsgi, os; print(os.path.dirname(forkwsgi.__file__))"],
                             env=env, cwd=TESTS).stdout.strip()
    log_path = os.path.join(base, "server.log")
    srv = ServerTree([sys.executable, "-m", "forkwsgi", "apps:offloader", "--bind", f"127.0.0.1:{port}",
                      "--workers", "2", "--threads", "2", "--offload-sink", f"jsonl:{out}",
                      "--offload-dir", os.path.join(mnt, "journal"), "--offload-linger", "0.02",
                      "--offload-queue-bytes", str(RING_BYTES)],
                     port, log_path, env, cpu=None, cwd=TESTS)       # not pinned: both CPUs
    counts = {"accepted": 0, "http_errors": 0}

    def emit(tag):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", f"/emit?n=10&size=500&id={tag}-")
            r = c.getresponse()
            body = r.read()
            c.close()
            if r.status != 200:
                counts["http_errors"] += 1
                return
            counts["accepted"] += sum(json.loads(body)["results"])
        except OSError:
            counts["http_errors"] += 1

    def values():
        try:
            with open(out) as f:
                return [json.loads(x)["value"] for x in f.read().split("\n")[:-1] if x]
        except FileNotFoundError:
            return []

    def drained():
        """The sink holds every record accepted so far."""
        return len(set(values())) >= counts["accepted"]

    try:
        if not srv.wait_listening(30, pause=0.1):
            raise SystemExit(f"the server did not start: {srv.log_text()[-2000:]}")
        for i in range(10):
            emit(f"warm{i}")
        wait_until(drained, DRAIN_WAIT, 0.05)
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        t0, i = time.monotonic(), 0
        while time.monotonic() - t0 < 20:
            emit(f"full{i}")
            i += 1
            time.sleep(0.01)
        os.unlink(filler)
        t1 = time.monotonic()
        while time.monotonic() - t1 < 10:
            emit(f"after{i}")
            i += 1
            time.sleep(0.01)
        wait_until(drained, DRAIN_WAIT, 0.2)
        _, code = srv.stop(term_wait=60)
    finally:
        srv.stop()
        subprocess.run(["umount", "-l", mnt], check=False)
    got = collections.Counter(values())
    text = srv.log_text()
    figures = {
        "requests": i + 10, "http_errors": counts["http_errors"], "accepted": counts["accepted"],
        "delivered": len(got), "missing": counts["accepted"] - len(got),
        "duplicates": sum(v - 1 for v in got.values()),
        "sibling_crashes": text.count("the offload sibling failed"),
        "disk_error_lines": sum(1 for x in text.splitlines() if "cannot write" in x),
        "server_exit": code, "log": log_path}
    print(json.dumps(figures))
    if not args.no_write:
        write_section(RESULTS, TITLE, report(figures, forkwsgi_dir, when))
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
