#!/usr/bin/env python3
"""User-space instructions per request, counted by valgrind's callgrind:
forkwsgi against bjoern (and, with --rev, an older forkwsgi) on one app.

    python3 bench/run_callgrind.py [--app framework_apps:django_app --path /user/7]
                                   [--requests 300,1300] [--rev 3127d43] [--no-write]

Why: this machine has no hardware counters (a VM: `perf stat` says
"not supported") and its timings wander by 10 % from one run to the next,
so a difference of a few hundred nanoseconds a request, or a server's share
of a framework's request, cannot be seen with wrk. Callgrind counts the
instructions a process runs, the same on every run (give or take the
interpreter's hash seeds and the garbage collector's timing): the count
per request is the difference between two runs of N1 and N2 requests over
one kept-alive connection, divided by N2 - N1 (start-up and shutdown
cancel out). Kernel work (the system calls) is not counted: it is the
same three calls a request for forkwsgi (epoll_wait, read, sendmsg) and
bjoern (epoll_wait, read, write).

Reported per server: instructions per request in all, in the server's own C
code (forkwsgi: cserver/ and src/; bjoern: bjoern/, http_parser, libev),
in the garbage collector (gcmodule.c and the *_traverse functions), and
the ratio of the whole to bjoern's. Each server runs alone under callgrind
(1 process x 1 thread; forkwsgi's worker is the process counted), the
client is a plain socket loop in this process: nothing runs at once but
these two. Slow: each request costs ~50x its native time.

    python3 bench/run_callgrind.py --floor [--rev a2b2b45[,2818a7e...]]

With --floor it counts instead the measure of the speed issue's first goal,
forkwsgi's work above the CPython floor, in instructions: for each of
run_core.py's single-connection workloads (keep-alive hello, 4k and post-1k,
on apps:route, each request as wrk sends it: a Host header, and post.lua's
Content-Type and 1 KiB body), forkwsgi's instructions per request less the
C reference's (bench/refserver.c, run under callgrind the same way) less
the floor's: run_floor.py's loop of that request (the least environ, the
app, iterating its body), run under callgrind for N1 and N2 requests. The
timed figure (run_core.py --floor-only, run_ab.py --floor) moves by
hundreds of nanoseconds from round to round on this VM; this one does not.
It leaves out the kernel (the same three system calls a request for the
reference and forkwsgi) and what instructions do not show (cache misses).
"""
import argparse
import contextlib
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (BENCH, FRAMEWORKS, OUT, RESULTS, ROOT, free_port, git_head, invocation, log,  # noqa: E402
                    peers_ready, write_section)
from run_core import REFSERVER_BIN, build_refserver, read_response  # noqa: E402
from run_floor import POST_BODY  # noqa: E402

VENV_PY = os.path.join(BENCH, ".venv", "bin", "python")
TITLE = "## Instructions per request (callgrind)"     # + ": APP", one section per app
OWN = {"forkwsgi": lambda f: f.startswith(("cserver/", "src/")),
       "bjoern": lambda f: "bjoern" in f or "http_parser" in f or f.startswith("???:ev_")}


def is_gc(f):
    return "gcmodule.c" in f or "_traverse" in f


def server_argv(server, spec, port, checkout):
    module, name = spec.split(":")
    if server == "reference":
        return [REFSERVER_BIN, str(port), "127.0.0.1"]
    if server == "bjoern":
        return [VENV_PY, "-c", f"from {module} import {name}; import bjoern; bjoern.run({name}, '127.0.0.1', {port})"]
    return [sys.executable, "-m", "forkwsgi", spec, "--bind", f"127.0.0.1:{port}", "--log-level", "warning"]


CLIENT_PORT = 47011


# The requests of --floor, as wrk sends them in run_core.py (a Host header;
# post.lua adds Content-Type and its 1 KiB body): the floor's environ holds
# HTTP_HOST and, for the POST, CONTENT_TYPE and CONTENT_LENGTH.
FLOOR_WORKLOADS = {"keepalive-hello": ("GET", "/"), "keepalive-4k": ("GET", "/4k"), "post-1k": ("POST", "/post")}


def request_bytes(method, path, wrk_like):
    if not wrk_like:
        return f"GET {path} HTTP/1.1\r\nHost: bench\r\nUser-Agent: run_callgrind\r\nAccept: */*\r\n\r\n".encode()
    # One Host for every run, whatever the server's port: the str cache's
    # slots are chosen by hashing the bytes, and a value that shares a slot
    # with another of the request misses on every request (hundreds of
    # instructions that would differ from one run to the next).
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(POST_BODY)}\r\n"
    return (head + "\r\n").encode() + (POST_BODY if method == "POST" else b"")


def connect(port, source_port, deadline):
    """A connection to the server from a fixed source port."""
    while True:
        # From one source port in every run: the client's port is in the
        # environ (REMOTE_PORT), and the str cache's slots are chosen by
        # hashing the bytes, so a port that shares a slot with another value
        # of the request makes both miss on every request (hundreds of
        # instructions that would differ from one run to the next).
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.settimeout(60)
            s.bind(("127.0.0.1", source_port))
            s.connect(("127.0.0.1", port))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not listen")
            time.sleep(0.3)


def drive(port, path, n, deadline, method="GET", wrk_like=False, conns=1):
    """n requests over `conns` kept-alive connections, in rounds: a request
    sent on each, then each answer read whole (conns > 1: the requests of a
    round wait together, as wrk's do at saturation, so a loop pass serves
    several)."""
    socks = [connect(port, CLIENT_PORT + i, deadline) for i in range(conns)]
    req = request_bytes(method, path, wrk_like)
    try:
        for _ in range(n // conns):
            for s in socks:
                s.sendall(req)
            for s in socks:
                got = read_response(s, time.monotonic() + 60)
                if not got or not got[0].startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"answer: {got and got[0][:80]!r}")
    finally:
        for s in socks:
            s.close()


def profile(out_file, checkout):
    """{function: self instructions} from callgrind_annotate, the
    checkout's files named relative to it (others keep their paths)."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", out_file],
                          capture_output=True, text=True, check=True).stdout
    prof = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if not m or ":" not in m.group(2) or "=>" in m.group(2):
            continue
        key = m.group(2).split(" [")[0].replace(os.path.realpath(checkout) + "/", "")
        prof[key] = prof.get(key, 0) + int(m.group(1).replace(",", ""))
    return prof


def run_once(server, spec, path, n, checkout, tmp, method="GET", wrk_like=False, conns=1):
    """Serve n requests under callgrind; the profile of the process that
    served them."""
    port = free_port()
    # A new directory per run: the files are found by their prefix, and two
    # builds of forkwsgi (--rev) would otherwise share it.
    prefix = os.path.join(tempfile.mkdtemp(dir=tmp), f"{server}-{n}")
    # One hash seed for every run: str hashes decide where the environ's
    # keys land in its table, and so how long dict inserts probe (a few
    # hundred instructions a request from one seed to the next).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BENCH, os.path.join(checkout, "python")]),
               PYTHONHASHSEED="0")
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}.%p"] + server_argv(server, spec, port,
                                                                                                 checkout)
    with open(prefix + ".log", "w") as logf:
        p = subprocess.Popen(argv, cwd=BENCH, env=env, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        drive(port, path, n, time.monotonic() + 120, method, wrk_like, conns)
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    profiles = [profile(f, checkout) for f in glob.glob(prefix + ".*") if not f.endswith(".log")]
    if not profiles:
        raise RuntimeError(f"{server}: no callgrind output (see {prefix}.log)")
    # forkwsgi: its worker, the process whose event loop ran (fw_server_run);
    # bjoern: its one process.
    serving = [pr for pr in profiles if any(k.endswith(":fw_server_run") for k in pr)] or profiles
    return max(serving, key=lambda pr: sum(pr.values()))


def per_request(server, spec, path, n1, n2, checkout, tmp):
    a = run_once(server, spec, path, n1, checkout, tmp)
    b = run_once(server, spec, path, n2, checkout, tmp)
    diff = {k: (b.get(k, 0) - a.get(k, 0)) / (n2 - n1) for k in set(a) | set(b)}
    own = OWN["bjoern" if server == "bjoern" else "forkwsgi"]
    return {"total": sum(diff.values()), "own": sum(v for k, v in diff.items() if own(k)),
            "gc": sum(v for k, v in diff.items() if is_gc(k)),
            "top_own": sorted(((v, k) for k, v in diff.items() if own(k)), reverse=True)[:8]}


def total(prof):
    return sum(prof.values())


def floor_count(workload, n, tmp):
    """Instructions of run_floor.py's loop of n requests of the workload."""
    out = os.path.join(tmp, f"floor-{workload}-{n}")
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                    os.path.abspath(__file__), "--floor-loop", workload, str(n)],
                   cwd=BENCH, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return total(profile(out, ROOT))


def floor_rows(servers, n1, n2, tmp, conns=1):
    """{workload: {label: instructions per request}} for the reference, the
    floor and each forkwsgi of servers."""
    rows = {}
    for workload, (method, path) in FLOOR_WORKLOADS.items():
        row = {}
        for label, server, checkout in [("reference", "reference", ROOT)] + servers:
            log(f"{workload}: {label}, {n1} and {n2} requests under callgrind")
            a = run_once(server, "apps:route", path, n1, checkout, tmp, method, True, conns)
            b = run_once(server, "apps:route", path, n2, checkout, tmp, method, True, conns)
            row[label] = (total(b) - total(a)) / (n2 - n1)
        log(f"{workload}: the floor's loop, {n1} and {n2} requests under callgrind")
        row["floor"] = (floor_count(workload, n2, tmp) - floor_count(workload, n1, tmp)) / (n2 - n1)
        rows[workload] = row
    return rows


FLOOR_TITLE = "## Instructions above the CPython floor (callgrind)"


def floor_title(conns):
    # (Not FLOOR_TITLE and a tail: write_section finds a section by its
    # heading's start.)
    return FLOOR_TITLE if conns == 1 else f"## Instructions above the CPython floor, {conns} connections (callgrind)"


def floor_section(rows, labels, n1, n2, conns=1):
    where = ("one kept-alive connection" if conns == 1 else
             f"{conns} kept-alive connections in rounds (a request sent on each, then the {conns} answers "
             "read: they wait together, as wrk -c50's do at saturation, so a loop pass serves several)")
    lines = [floor_title(conns), "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{invocation()}` at {git_head()}: "
             f"apps:route, each server 1 process x 1 thread under valgrind's callgrind, {where}, "
             "each request as wrk sends it in run_core.py (post-1k: post.lua's Content-Type and 1 KiB body); "
             f"per request = (run of {n2:,} requests - run of {n1:,}) / {n2 - n1:,}. The floor is "
             "run_floor.py's loop of the same request (the least environ, the app, iterating its body) under "
             "callgrind the same way. Above the floor = forkwsgi - reference - floor: user-space instructions "
             "only (the kernel's share is the same three system calls a request for the reference and "
             "forkwsgi); the same on every run.", "",
             "| workload | reference | floor | " + " | ".join(f"{lb}: all" for lb in labels) + " | " +
             " | ".join(f"{lb}: above the floor" for lb in labels) + " |",
             "|---|" + "---:|" * (2 + 2 * len(labels))]
    for workload, row in rows.items():
        above = [row[lb] - row["reference"] - row["floor"] for lb in labels]
        lines.append(f"| {workload} | {row['reference']:,.0f} | {row['floor']:,.0f} | " +
                     " | ".join(f"{row[lb]:,.0f}" for lb in labels) + " | " +
                     " | ".join(f"{a:,.0f}" for a in above) + " |")
    if len(labels) > 1:
        lines += ["", "The speed issue's goal 1: at most 0.50 of its base's (a2b2b45) above the floor."]
    for other in labels[1:]:
        lines += ["", f"{labels[0]} above the floor as a share of {other}'s: " +
                  ", ".join(f"{w} {(r[labels[0]] - r['reference'] - r['floor']) / (r[other] - r['reference'] - r['floor']):.2f}"
                            for w, r in rows.items()) + "."]
    return "\n".join(lines + [""])


@contextlib.contextmanager
def older_build(rev):
    """A worktree of git revision rev with its extension built, removed
    afterwards; None without a rev."""
    if not rev:
        yield None
        return
    where = os.path.join(tempfile.gettempdir(), f"forkwsgi-callgrind-{os.getpid()}-{rev}")
    try:
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", where, rev], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=where, check=True,
                       stdout=subprocess.DEVNULL)
        yield where
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", where],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--app", default="framework_apps:django_app", help="MODULE:NAME in bench/")
    ap.add_argument("--path", default="/user/7")
    ap.add_argument("--requests", default="300,1300", help="N1,N2: the two runs' request counts")
    ap.add_argument("--rev", help="also an older forkwsgi (a git revision, built in a temporary worktree; "
                    "with --floor, REV[,REV...])")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    ap.add_argument("--floor", action="store_true",
                    help="count forkwsgi's instructions above the CPython floor on run_core.py's workloads")
    ap.add_argument("--conns", type=int, default=1,
                    help="with --floor: kept-alive connections, each sent one request a round (default 1)")
    ap.add_argument("--floor-loop", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_loop:                 # the process --floor runs under callgrind
        import run_floor
        run_floor.make_workload_cases()[args.floor_loop[0]](int(args.floor_loop[1]))
        return
    if args.floor and args.requests == ap.get_default("requests"):
        args.requests = "1000,3000"
    n1, n2 = (int(x) for x in args.requests.split(","))
    if not shutil.which("valgrind"):
        sys.exit("run_callgrind: valgrind is not installed (apt-get install valgrind)")
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="callgrind-", dir=OUT)
    if args.floor:
        build_refserver()
        main_floor(args, n1, n2, tmp)
        return
    missing = peers_ready(["bjoern"], FRAMEWORKS)
    if missing:
        sys.exit(f"run_callgrind: not available: {missing}")
    servers = [("forkwsgi", "forkwsgi", ROOT), ("bjoern", "bjoern", ROOT)]
    with older_build(args.rev) as wt:
        if wt:
            servers.append((f"forkwsgi {args.rev}", "forkwsgi", wt))
        results = {}
        for label, server, checkout in servers:
            log(f"{label}: {n1} and {n2} requests under callgrind")
            results[label] = per_request(server, args.app, args.path, n1, n2, checkout, tmp)
    ref = results["bjoern"]["total"]
    title = f"{TITLE}: {args.app}"
    lines = [title, "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{invocation()}` at {git_head()}: "
             f"app {args.app} (GET {args.path}), each server 1 process x 1 thread under valgrind's callgrind, "
             f"one kept-alive connection; per request = (run of {n2:,} requests - run of {n1:,}) / {n2 - n1:,}. "
             "User-space instructions only (no hardware counters here); the kernel's share is three system "
             "calls a request for each.", "",
             "| server | instructions per request | x bjoern | the server's own C code | garbage collector |",
             "|---|---:|---:|---:|---:|"]
    for label, r in results.items():
        lines.append(f"| {label} | {r['total']:,.0f} | {r['total'] / ref:.3f} | {r['own']:,.0f} | {r['gc']:,.0f} |")
    lines += ["", "forkwsgi's own code, the most instructions per request: " +
              ", ".join(f"`{k.split(':')[-1]}` {v:,.0f}" for v, k in results["forkwsgi"]["top_own"]) + ".", ""]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_section(RESULTS, title, section)


def main_floor(args, n1, n2, tmp):
    n1, n2 = (n // args.conns * args.conns for n in (n1, n2))     # whole rounds
    servers = [(f"forkwsgi {git_head()}", "forkwsgi", ROOT)]
    with contextlib.ExitStack() as stack:
        for rev in (args.rev or "").split(","):     # --floor takes REV[,REV...]
            if rev:
                servers.append((f"forkwsgi {rev}", "forkwsgi", stack.enter_context(older_build(rev))))
        rows = floor_rows(servers, n1, n2, tmp, args.conns)
    section = floor_section(rows, [label for label, _, _ in servers], n1, n2, args.conns)
    print(section)
    if not args.no_write:
        write_section(RESULTS, floor_title(args.conns), section)


if __name__ == "__main__":
    main()
