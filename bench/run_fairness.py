#!/usr/bin/env python3
"""Fairness and slow clients: forkwsgi beside gunicorn gthread on the same loads.

    python3 bench/run_fairness.py            # every part (~3 minutes)
    python3 bench/run_fairness.py --parts mixed,expect

Four parts, each run against forkwsgi and gunicorn gthread with the same
workers and threads (gunicorn from bench/.venv, as run_balance.py makes it):

mixed     2 workers x 2 threads, an app that sleeps 50 ms. 8 clients each on
          one kept-alive connection (20 ms between requests) and 4 that open
          a new connection per request, 12 s: requests served per class, the
          share of the new-connection class, p50 and max latency.
health    nginx (keepalive 32) in front of 4 x 4, wrk -c64 through it for
          12 s (20 ms requests), and a health check on a new connection to
          the server every 0.5 s (5 s timeout): answered, failed, slowest.
expect    2 workers (1 thread), --timeout 10: two uploads with
          "Expect: 100-continue" whose body comes a byte every 2 s, for 15 s,
          while a probe asks every second (1 s timeout): probes answered,
          the slowest, and workers killed.
stream    4 Server-Sent Events 1 s apart, read with python-requests'
          iter_lines: how late each event arrives after it was yielded.

Every server is pinned to CPU 0, every client (these threads, wrk, nginx)
to CPU 1, all on 127.0.0.1; servers are stopped by PID and process group.
The summary goes to the terminal and to the section "## Fairness and slow
clients" of bench/RESULTS.md.
"""
import argparse
import datetime
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BENCH, CLIENT_CPU, OUT, RESULTS, ServerTree, free_port, git_head, invocation, log,  # noqa: E402
                    pin_self, start_nginx, start_wrk, stop_all, write_section)
from run_balance import GUNICORN_EXTRA, VENV_PY, ensure_venv  # noqa: E402

SECTION = "## Fairness and slow clients"
APP = "fairness_apps:app"


def forkwsgi(port, workers, threads, *extra):
    return [sys.executable, "-m", "forkwsgi", APP, "--workers", str(workers), "--threads", str(threads),
            "--bind", f"127.0.0.1:{port}", "--chdir", BENCH, *extra]


def gunicorn(port, workers, threads, *extra):
    return [VENV_PY, "-m", "gunicorn", "-w", str(workers), "-k", "gthread", "--threads", str(threads),
            *GUNICORN_EXTRA, "-b", f"127.0.0.1:{port}", "--chdir", BENCH, *extra, APP]


def start(name, argv_of, port, workers):
    s = ServerTree(argv_of(port), port, os.path.join(OUT, f"fairness-{name}.log"), dict(os.environ))
    if s.wait_listening(30, pause=0.1) and s.wait_workers(workers, 30):
        return s
    s.stop()
    raise SystemExit(f"{name} did not start: {s.log_text()[-2000:]}")


def read_response(sock, buf=b""):
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            raise EOFError
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
    while len(rest) < n:
        d = sock.recv(65536)
        if not d:
            raise EOFError
        rest += d
    return head, rest[n:]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


# ---- parts -----------------------------------------------------------------

def mixed(port, seconds=12.0):
    req = b"GET /sleep?d=0.05 HTTP/1.1\r\nHost: t\r\n\r\n"
    lat, errors, end = {"kept": [], "new": []}, [], time.monotonic() + seconds

    def kept():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            buf = b""
            while time.monotonic() < end:
                t = time.monotonic()
                s.sendall(req)
                _, buf = read_response(s, buf)
                lat["kept"].append(time.monotonic() - t)
                time.sleep(0.02)
            s.close()
        except (OSError, EOFError) as e:
            errors.append(repr(e))

    def new():
        while time.monotonic() < end:
            t = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                    s.sendall(req)
                    read_response(s)
            except (OSError, EOFError) as e:
                errors.append(repr(e))
                continue
            lat["new"].append(time.monotonic() - t)
    threads = [threading.Thread(target=kept) for _ in range(8)] + [threading.Thread(target=new) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    total = len(lat["kept"]) + len(lat["new"])
    return {"kept": len(lat["kept"]), "kept_p50_ms": pct(lat["kept"], 0.5) * 1000,
            "kept_max_ms": max(lat["kept"], default=0) * 1000, "new": len(lat["new"]),
            "new_p50_ms": pct(lat["new"], 0.5) * 1000, "new_max_ms": max(lat["new"], default=0) * 1000,
            "share": len(lat["new"]) / total if total else 0.0, "errors": len(errors)}


NGINX_HTTP = """
    upstream app {{ server 127.0.0.1:{upstream}; keepalive 32; keepalive_timeout 60s; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; }}
    }}"""


def health(port, seconds=12.0):
    d = tempfile.mkdtemp(prefix="fairness-nginx-")
    nport = free_port()
    proxy = start_nginx(d, NGINX_HTTP.format(upstream=port, port=nport), nport)
    try:
        proxy.wait_listening(10)
        load = start_wrk(["-t1", "-c64", "--timeout", "5s"], int(seconds), f"http://127.0.0.1:{nport}/sleep?d=0.02",
                         script=None)
        time.sleep(1.0)                     # the checks run under the load, not its ramp-up
        checks, end = [], time.monotonic() + seconds - 2
        while time.monotonic() < end:
            t = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                    s.settimeout(5)
                    s.sendall(b"GET /sleep?d=0 HTTP/1.1\r\nHost: health\r\nConnection: close\r\n\r\n")
                    read_response(s)
                checks.append(time.monotonic() - t)
            except (OSError, EOFError):
                checks.append(None)
            time.sleep(max(0.0, 0.5 - (time.monotonic() - t)))
        out = load.result().output
    finally:
        proxy.stop()
        shutil.rmtree(d, ignore_errors=True)
    ok = [c for c in checks if c is not None]
    reqs = next((line.split()[0] for line in out.splitlines() if "requests in" in line), "?")
    return {"checks": len(checks), "failed": len(checks) - len(ok), "max_ms": max(ok, default=0) * 1000,
            "wrk_requests": reqs}


def expect(port, server, seconds=15.0):
    stop, pids_before = threading.Event(), set(server.tree()[0])

    def trickle():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
                s.sendall(b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n"
                          b"Expect: 100-continue\r\n\r\n")
                while not stop.wait(2.0):
                    s.sendall(b"x")
        except OSError:
            pass
    attackers = [threading.Thread(target=trickle) for _ in range(2)]
    for t in attackers:
        t.start()
    time.sleep(0.5)
    probes, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.settimeout(1)
                s.sendall(b"GET /sleep?d=0 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                read_response(s)
            probes.append(time.monotonic() - t)
        except (OSError, EOFError):
            probes.append(None)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    stop.set()
    for t in attackers:
        t.join(10)
    killed = len(pids_before - set(server.tree()[0]))
    ok = [p for p in probes if p is not None]
    return {"probes": len(probes), "answered": len(ok), "max_ms": max(ok, default=0) * 1000,
            "workers_gone": killed}


def stream(port):
    import requests
    delays = []
    with requests.get(f"http://127.0.0.1:{port}/ticker?n=4&every=1", stream=True, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                delays.append(time.monotonic() - float(line.split()[2]))
    return {"delays_ms": [round(d * 1000) for d in delays]}


PARTS = {
    "mixed": (2, 2, (), mixed),
    "health": (4, 4, (), health),
    "expect": (2, 1, ("--timeout", "10"), None),
    "stream": (1, 2, (), stream),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="mixed,health,expect,stream")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    missing, versions = ensure_venv(True, False)
    if missing:
        sys.exit(f"cannot run gunicorn: {missing}")
    pin_self(CLIENT_CPU)
    t0 = time.monotonic()
    rows = {}
    try:
        for part in args.parts.split(","):
            workers, threads, extra, fn = PARTS[part]
            for name, argv_of in (("forkwsgi", forkwsgi), ("gunicorn-gthread", gunicorn)):
                port = free_port()
                s = start(f"{part}-{name}", lambda p: argv_of(p, workers, threads, *extra), port, workers)
                try:
                    rows[(part, name)] = expect(port, s) if part == "expect" else fn(port)
                finally:
                    s.stop()
                log(f"{part:7} {name:17} {rows[(part, name)]}")
    finally:
        stop_all()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rev = git_head()
    lines = [SECTION, "", f"Run on {when} by `{invocation()}` at {rev} (took "
             f"{(time.monotonic() - t0) / 60:.1f} min); gunicorn {versions.get('gunicorn')} gthread beside it "
             f"with the same workers and threads; servers on CPU 0, clients on CPU 1.", ""]
    for part in args.parts.split(","):
        lines += [f"**{part}**", "", "| server | figures |", "|---|---|"]
        for name in ("forkwsgi", "gunicorn-gthread"):
            r = rows.get((part, name), {})
            lines.append(f"| {name} | " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) and k != "share"
                                                     else f"{k} {v:.0%}" if k == "share" else f"{k} {v}"
                                                     for k, v in r.items()) + " |")
        lines.append("")
    text = "\n".join(lines)
    log(text)
    if not args.no_write:
        write_section(RESULTS, SECTION, text)


if __name__ == "__main__":
    main()
