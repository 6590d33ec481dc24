#!/usr/bin/env python3
"""The offload journal on a full disk (issue 9 item 4), as one measurement.

    sudo python3 bench/run_disk_full.py [PYTHONPATH_OF_THE_FORKWSGI_TO_TRY]

Mounts a 2 MiB tmpfs as --offload-dir, starts `forkwsgi apps:offloader
--workers 2 --threads 2` with a jsonl sink on the normal disk, sends about
100 requests a second of 10 records each for 20 s while the tmpfs is full,
frees it, goes on 10 s, waits 3 s, stops the server with SIGTERM and
counts: records accepted (offload() returned True), delivered, missing,
duplicated; sibling crashes; disk-error log lines. Everything on
127.0.0.1; the server is ended by its PID and the tmpfs unmounted.
"""
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
from common import ROOT, ServerTree, free_port  # noqa: E402

TESTS = os.path.join(ROOT, "tests")


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else ""
    base = tempfile.mkdtemp(prefix="forkwsgi-diskfull-")
    mnt = os.path.join(base, "small")
    os.makedirs(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2097152", "tmpfs", mnt], check=True)
    out = os.path.join(base, "out.jsonl")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (TESTS, src) if p))
    log_path = os.path.join(base, "server.log")
    srv = ServerTree([sys.executable, "-m", "forkwsgi", "apps:offloader", "--bind", f"127.0.0.1:{port}",
                      "--workers", "2", "--threads", "2", "--offload-sink", f"jsonl:{out}",
                      "--offload-dir", os.path.join(mnt, "journal"), "--offload-linger", "0.02"],
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

    try:
        srv.wait_listening(30, pause=0.1)
        for i in range(10):
            emit(f"warm{i}")
        time.sleep(1)
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
        time.sleep(3)
        _, code = srv.stop(term_wait=60)
    finally:
        srv.stop()
        subprocess.run(["umount", "-l", mnt], check=False)
    got = collections.Counter(values())
    text = srv.log_text()
    print(json.dumps({
        "requests": i + 10, "http_errors": counts["http_errors"], "accepted": counts["accepted"],
        "delivered": len(got), "missing": counts["accepted"] - len(got),
        "duplicates": sum(v - 1 for v in got.values()),
        "sibling_crashes": text.count("the offload sibling failed"),
        "disk_error_lines": sum(1 for x in text.splitlines() if "cannot write" in x),
        "server_exit": code, "log": log_path}))


if __name__ == "__main__":
    main()
