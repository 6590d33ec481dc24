#!/usr/bin/env python3
"""Side-by-side benchmark of forkwsgi's core (one process, one thread)
against a C reference server and the fastest WSGI servers that install here.

    python3 bench/run_core.py            # the full run: 5 rounds, 13-15 minutes
    python3 bench/run_core.py --quick    # 1 round of 2 s cells, about 2 minutes

Run it with the Python where forkwsgi is installed; the peers are installed
into their own virtualenv, bench/.venv, which this script creates. The
reference (bench/refserver.c: epoll, no Python) is built with cc into
bench/out/refserver.

Every server is pinned to CPU 0 and wrk to CPU 1 (taskset). The figure that
separates servers is the server's CPU per request (wrk is near 100 % of its
CPU in most cells, so req/s is bound by the load generator), and the one to
compare is its ratio to the reference's requests per CPU-second measured in
the same round. A round starts every server afresh, then runs each workload
on each server in turn (the server order rotates from round to round), each
cell a discarded warm-up then a measured wrk run; tables give medians over
the rounds, and the per-round ratios show how stable they are. Raw wrk output
and server logs go to bench/out/ (gitignored); the summary goes to the
terminal and to the "Core" section of bench/RESULTS.md.

    python3 bench/run_core.py --floor-only   # forkwsgi's CPU above the floor only, about 4 minutes

forkwsgi's CPU above the floor: in every round, after the cells, the CPython
floor of the keep-alive hello, 4k and post-1k requests is timed on the
server's CPU (`run_floor.py --json`: the least environ, the app, its body;
no server around it), and the report gives forkwsgi's CPU per request less
the reference's less that floor, per round and as the median: what
forkwsgi's own work costs beyond what any WSGI server on this CPython and
kernel must spend. The floor is taken in the same run because this
machine's speed moves from day to day. It has its own section of
bench/RESULTS.md, "Core: forkwsgi's CPU above the floor".
"""
import argparse
import collections
import datetime
import hashlib
import json
import os
import platform
import re
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import (BENCH, CLIENT_CPU, HOST, OUT, PINS, RESULTS, SERVER_CPU, CpuMeter, ServerTree,  # noqa: E402
                    ensure_peers, ensure_system_packages, first_error_line, git_head, invocation, log, rotated,
                    run_quiet, wait_until_quiet, write_section)

VENV = os.path.join(BENCH, ".venv")
VENV_PY = os.path.join(VENV, "bin", "python")
SECTION = "## Core: single process vs a C reference and the fastest WSGI servers"
FLOOR_SECTION = "## Core: forkwsgi's CPU above the floor"
OLD_SECTIONS = ["## Core: single process vs bjoern, gunicorn"]   # replaced by SECTION
REFSERVER_SRC = os.path.join(BENCH, "refserver.c")
REFSERVER_BIN = os.path.join(OUT, "refserver")
REFSERVER_CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]

# Extra gunicorn flags, decided in ensure_venv(): gunicorn 25+ opens a
# control socket under ~/.gunicorn unless told not to.
GUNICORN_EXTRA = []

FIRST_PORT = 20100

# The peers, pinned to the versions the figures were taken with (bench/.venv).
PEER_PACKAGES = {p: PINS[p] for p in ("bjoern", "gunicorn", "fastpysgi", "socketify", "pyruvate")}
SERVERS = ["reference", "forkwsgi", "bjoern", "fastpysgi", "socketify", "pyruvate",
           "pyruvate-no-keepalive", "gunicorn-sync", "gunicorn-gthread"]
PACKAGE_OF = {"bjoern": "bjoern", "fastpysgi": "fastpysgi", "socketify": "socketify",
              "pyruvate": "pyruvate", "pyruvate-no-keepalive": "pyruvate",
              "gunicorn-sync": "gunicorn", "gunicorn-gthread": "gunicorn"}
SERVE_PEER = ("bjoern", "fastpysgi", "socketify", "pyruvate", "pyruvate-no-keepalive")
# gunicorn serves ~10k req/s at ~100 µs of CPU per request, 10x the others:
# to keep the run short it has one cell per worker type, gthread on
# keep-alive hello and sync on close-hello (sync has no keep-alive).
# pyruvate is run as asked, keep-alive on, where it stalls; its default
# (keep-alive off: one request per connection) only on close-hello.
FAST = ["reference", "forkwsgi", "bjoern", "fastpysgi", "socketify", "pyruvate"]
PIPELINE_PROBE_DEPTH = 3
MIN_CPU_SECONDS = 0.05      # below this no CPU per request is given (a server that stalls)

Workload = collections.namedtuple("Workload", "desc path script wrk_args servers")
WORKLOADS = {
    "keepalive-hello": Workload("keep-alive, 50 connections, hello (13 B)", "/", "stats.lua",
                                ["-t1", "-c50"], FAST + ["gunicorn-gthread"]),
    "keepalive-4k": Workload("keep-alive, 50 connections, 4 KiB body", "/4k", "stats.lua",
                             ["-t1", "-c50"], FAST),
    # Servers that do not answer every request of a pipelined batch are
    # probed, found out and skipped.
    "pipeline16-hello": Workload("pipelined depth 16, 50 connections, hello", "/", "pipeline.lua",
                                 ["-t1", "-c50"], FAST),
    "close-hello": Workload("Connection: close, 10 connections, hello", "/", "stats.lua",
                            ["-t1", "-c10", "-H", "Connection: close"],
                            FAST + ["pyruvate-no-keepalive", "gunicorn-sync"]),
    "post-1k": Workload("keep-alive, 50 connections, POST of 1 KiB JSON read through wsgi.input",
                        "/post", "post.lua", ["-t1", "-c50"], FAST),
}

HELLO = b"Hello, World!"
POST_BODY = b'{"pad":"' + b"p" * (1024 - 10) + b'"}'
PROBES = {   # name -> (request, expected body); all three must pass before a round
    "hello": (b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n", HELLO),
    "4k": (b"GET /4k HTTP/1.1\r\nHost: bench\r\n\r\n", b"x" * 4096),
    "post": (b"POST /post HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(POST_BODY), POST_BODY), HELLO),
}


# ---------------------------------------------------------------- setup

def build_refserver():
    """cc -O2 bench/refserver.c -> bench/out/refserver (always rebuilt: it takes 0.2 s)."""
    argv = ["cc", *REFSERVER_CFLAGS, "-o", REFSERVER_BIN, REFSERVER_SRC]
    r = run_quiet(argv)
    if r.returncode != 0:
        sys.exit(f"could not build the reference server ({' '.join(argv)}):\n{r.stdout}")
    return run_quiet(["cc", "--version"]).stdout.splitlines()[0]


def ensure_venv():
    """bench/.venv with the peers at their pinned versions. Returns (versions,
    unavailable, meinheld): unavailable maps a package to why it cannot be
    installed or imported; meinheld is a sentence on why it does not build."""
    versions, unavailable = ensure_peers(PEER_PACKAGES)
    pip = [VENV_PY, "-m", "pip", "--disable-pip-version-check"]
    log("trying to install meinheld into bench/.venv (expected to fail on 3.11)")
    r = run_quiet([*pip, "install", "meinheld"])
    if r.returncode == 0:
        meinheld = "meinheld: installed (not benchmarked by this script)"
    else:
        py = run_quiet([VENV_PY, "-c", "import platform; print(platform.python_version())"])
        pin = re.search(r"Downloading (greenlet-[\w.]+?)\.tar\.gz", r.stdout)
        meinheld = (f"meinheld: does not build on Python {py.stdout.strip()}"
                    f"{' (it pins ' + pin.group(1) + ')' if pin else ''}: "
                    f"{first_error_line(r.stdout)}")
        with open(os.path.join(OUT, "meinheld-pip.log"), "w") as f:
            f.write(r.stdout)
    if "gunicorn" not in unavailable:
        gunicorn_help = run_quiet([VENV_PY, "-m", "gunicorn", "--help"]).stdout
        if "--no-control-socket" in gunicorn_help:
            GUNICORN_EXTRA[:] = ["--no-control-socket"]
    return versions, unavailable, meinheld


# ---------------------------------------------------------------- servers

def server_argv(server, app, port):
    bind = f"{HOST}:{port}"
    if server == "reference":
        return [REFSERVER_BIN, str(port), HOST]
    if server == "forkwsgi":
        return [sys.executable, "-m", "forkwsgi", f"apps:{app}", "--bind", bind]
    if server in SERVE_PEER:
        return [VENV_PY, "serve_peer.py", server, app, str(port)]
    if server == "gunicorn-sync":
        return [VENV_PY, "-m", "gunicorn", "-w", "1", "-k", "sync", *GUNICORN_EXTRA,
                "-b", bind, f"apps:{app}"]
    if server == "gunicorn-gthread":
        return [VENV_PY, "-m", "gunicorn", "-w", "1", "-k", "gthread", "--threads", "1",
                *GUNICORN_EXTRA, "-b", bind, f"apps:{app}"]
    raise ValueError(server)


def display_command(argv):
    """A command as the reader would type it from the repository root."""
    shown = []
    for a in argv:
        if a == sys.executable:
            a = "python3"
        elif a == VENV_PY:
            a = "bench/.venv/bin/python"
        elif a == REFSERVER_BIN:
            a = "bench/out/refserver"
        elif a.endswith(".py") and os.path.exists(os.path.join(BENCH, a)):
            a = f"bench/{a}"
        elif " " in a:
            a = f'"{a}"'
        shown.append(a)
    return " ".join(shown)


def read_response(sock, deadline):
    """One response with a Content-Length body from sock: (head, body); None
    if the peer closes the connection first; TimeoutError at the deadline."""
    data = b""
    while True:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            m = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.I)
            want = int(m.group(1)) if m else 0
            if len(rest) >= want:
                return head, rest[:want]
        if time.monotonic() >= deadline:
            raise TimeoutError
        sock.settimeout(deadline - time.monotonic())
        chunk = sock.recv(65536)        # socket.timeout is a TimeoutError
        if not chunk:
            return None
        data += chunk


class Server(ServerTree):
    """One server process tree pinned to CPU 0 (common.ServerTree), with the
    probes of a round; argv/env: another command than server_argv's (run_ab,
    run_accesslog, run_observability)."""

    def __init__(self, name, app, port, log_path, argv=None, env=None):
        super().__init__(argv or server_argv(name, app, port), port, log_path, env, SERVER_CPU, BENCH)
        self.name, self.app = name, app

    def probe(self, request, expected_body):
        """One raw request: status line, response head, body check."""
        try:
            with socket.create_connection((HOST, self.port), timeout=5) as s:
                s.sendall(request)
                answer = read_response(s, time.monotonic() + 5)
        except OSError:                 # TimeoutError included
            answer = None
        if answer is None:
            return {"status_line": "(no complete response within 5 s)", "head_bytes": 0,
                    "head": "", "body_ok": False}
        head, body = answer
        return {"status_line": head.split(b"\r\n")[0].decode("latin-1"),
                "head_bytes": len(head) + 4,
                "head": head.decode("latin-1"),
                "body_ok": body == expected_body}

    def probe_keepalive(self, timeout=2.0):
        """Two requests one after the other on one connection. Returns "yes"
        (both answered), "closes" (the server ends the connection after a
        response) or "stalls" (the connection stays open, the second response
        does not come within `timeout` s: pyruvate with keep-alive on)."""
        try:
            with socket.create_connection((HOST, self.port), timeout=5) as s:
                for _ in range(2):
                    s.sendall(PROBES["hello"][0])
                    if read_response(s, time.monotonic() + timeout) is None:
                        return "closes"
        except TimeoutError:
            return "stalls"
        except OSError:                 # reset, or refused to write after the close
            return "closes"
        return "yes"

    def probe_pipelining(self, depth=PIPELINE_PROBE_DEPTH):
        """Send `depth` requests in one write; count the responses within 2 s."""
        with socket.create_connection((HOST, self.port), timeout=5) as s:
            s.sendall(PROBES["hello"][0] * depth)
            data, deadline = b"", time.monotonic() + 2
            while data.count(b"HTTP/1.1 ") < depth and time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                data += chunk
        return data.count(b"HTTP/1.1 ")

    def stop(self, term_wait=10.0):
        """SIGTERM by PID, SIGKILL after 10 s. Returns (crashed, exit code)."""
        return super().stop(term_wait)


# ---------------------------------------------------------------- wrk

def wrk_argv(workload, port, seconds):
    w = WORKLOADS[workload]
    return ["wrk", *w.wrk_args, f"-d{seconds}s", "--latency", "-s", w.script,
            f"http://{HOST}:{port}{w.path}"]


def run_wrk(workload, port, seconds):
    """One wrk run of a workload: (stats or None, wrk's output, wrk's CPU seconds)."""
    w = WORKLOADS[workload]
    r = common.run_wrk(w.wrk_args, seconds, f"http://{HOST}:{port}{w.path}", script=w.script)
    return r.stats, r.output, r.cpu


# ---------------------------------------------------------------- one round

def start_round(names, rnd, app="route"):
    """Start every server of the round (each on its own port), wait until each
    answers and probe it. Returns name -> (Server, facts); facts has
    "failure" when the server is not usable this round."""
    started = {}
    try:
        for name in names:
            port = FIRST_PORT + rnd * len(SERVERS) + SERVERS.index(name)
            started[name] = Server(name, app, port, os.path.join(OUT, f"core.{name}.round{rnd + 1}.log"))
        return {name: (srv, check_server(srv)) for name, srv in started.items()}
    except BaseException:                   # Ctrl-C included: stop what was started
        for srv in started.values():
            srv.stop()
        raise


def check_server(srv):
    """Wait until the server answers, check its three responses, probe
    keep-alive. Returns its facts (run_round adds the pipelining probe's)."""
    facts = {"command": display_command(srv.argv), "port": srv.port}
    if not srv.wait_ready():
        facts["failure"] = "server did not become ready"
        return facts
    facts["probes"] = {p: srv.probe(*PROBES[p]) for p in PROBES}
    bad = [p for p, r in facts["probes"].items() if not r["body_ok"]]
    if bad:
        facts["failure"] = ("wrong response to the " + ", ".join(bad) + " probe: "
                            + "; ".join(facts["probes"][p]["status_line"] for p in bad))
    facts["keepalive"] = srv.probe_keepalive()
    return facts


def stop_round(servers):
    """Stop every server by PID; returns name -> (crashed, code, log text)."""
    ended = {}
    for name, (srv, _) in servers.items():
        crashed, code = srv.stop()
        ended[name] = (crashed, code, srv.log_text())
    return ended


def skip_reason(workload, facts, rnd):
    """Why this cell is not measured in this round, or None.

    A server that stalls in the keep-alive probe (pyruvate, which then also
    ignores "Connection: close") is measured in the first round only, to
    record what it does without spending every round on it."""
    if "failure" in facts:
        return facts["failure"]
    if workload.startswith("pipeline") and facts["pipelined"] < PIPELINE_PROBE_DEPTH:
        return (f"unsupported: answered {facts['pipelined']} of {PIPELINE_PROBE_DEPTH} pipelined "
                "requests sent in one write")
    if facts["keepalive"] == "stalls" and rnd > 0:
        return ("stalls: the second request on a connection got no response within 2 s "
                "(measured in round 1 only)")
    return None


def measure(srv, workload, tag, duration, warmup, quiet_wait):
    """One cell: wait for a quiet machine, warm up (discarded), measure."""
    result = {}
    waited, busy = wait_until_quiet(quiet_wait)
    if busy >= 10.0:
        log(f"    machine still busy ({busy:.0f}% of a CPU used by others) after {waited:.0f} s; "
            "running anyway")
    run_wrk(workload, srv.port, warmup)                     # discarded
    meter = CpuMeter(server=srv.sched_cpu_seconds)
    stats, text, wrk_cpu = run_wrk(workload, srv.port, duration)
    span = meter.stop()
    wall, server_cpu = span.wall, span.used["server"]
    result["server_cpu_s"] = server_cpu
    result["server_cpu_pct"] = 100 * server_cpu / wall
    result["wrk_cpu_pct"] = 100 * wrk_cpu / wall
    result["softirq_cpu_pct"] = 100 * span.irq / wall
    result["other_cpu_pct"] = max(0.0, 100 * (span.others - wrk_cpu) / wall)
    with open(os.path.join(OUT, f"{tag}.wrk.txt"), "w") as f:
        f.write(text)
    if stats is None:
        result["failure"] = "wrk failed: " + text.strip()[-300:]
        return result
    result.update(stats)
    if stats["requests"] >= 1000 and server_cpu >= MIN_CPU_SECONDS:
        result["cpu_us_per_req"] = 1e6 * server_cpu / stats["requests"]
        result["req_per_cpu_s"] = stats["requests"] / server_cpu
    return result


def run_round(rnd, names, workloads, args, unavailable):
    """Every (workload, server) cell of one round, servers in rotated order."""
    live = [n for n in names if PACKAGE_OF.get(n) not in unavailable]
    servers = start_round(live, rnd)
    results = []
    try:
        order = rotated(names, rnd)
        for workload in workloads:
            for name in order:
                if name not in WORKLOADS[workload].servers:
                    continue
                r = {"server": name, "workload": workload, "round": rnd}
                if name not in servers:
                    r["skipped"] = f"not available: {unavailable[PACKAGE_OF[name]]}"
                else:
                    srv, facts = servers[name]
                    r["command"] = facts["command"]
                    if workload.startswith("pipeline") and "pipelined" not in facts and "failure" not in facts:
                        facts["pipelined"] = srv.probe_pipelining()
                    why = skip_reason(workload, facts, rnd)
                    if why is None and srv.proc.poll() is not None:
                        why = f"server exited (code {srv.proc.returncode})"
                    if why:
                        r["skipped"] = why
                    else:
                        r.update(measure(srv, workload, f"core.{workload}.{name}.round{rnd + 1}",
                                         args.duration, args.warmup, args.quiet_wait))
                results.append(r)
                log_cell(r, args.rounds)
    finally:
        ended = stop_round(servers)
    facts = {}
    for name, (srv, f) in servers.items():
        crashed, code, text = ended[name]
        f["crashed"] = f"server exited during the round (code {code})" if crashed else None
        f["log_tail"] = text[-1500:]
        suspicious = collections.Counter(ln.strip() for ln in text.splitlines()
                                         if re.search(r"error|traceback|exception|warn|critical", ln, re.I))
        f["log_suspicious"] = [f"{ln} (×{n})" if n > 1 else ln for ln, n in suspicious.most_common(10)]
        facts[name] = f
    return results, facts


FLOOR_WORKLOADS = ("keepalive-hello", "keepalive-4k", "post-1k")     # run_floor.py --json's
FLOOR_CALLS, FLOOR_REPEAT = 100_000, 5


def measure_floor(workloads, quiet_wait):
    """This round's CPython floor of the workloads run_floor.py knows, in
    ns per request, timed on the server's CPU: {workload: ns}, or {}."""
    if not any(w in FLOOR_WORKLOADS for w in workloads):
        return {}
    wait_until_quiet(quiet_wait)
    p = run_quiet([sys.executable, os.path.join(BENCH, "run_floor.py"), "--json", "--cpu", SERVER_CPU,
                   "--number", str(FLOOR_CALLS), "--repeat", str(FLOOR_REPEAT)], timeout=300)
    if p.returncode != 0:
        log(f"run_floor.py failed: {p.stdout[-500:]}")
        return {}
    floors = json.loads(p.stdout.strip().splitlines()[-1])
    log("floor (ns per request): " + ", ".join(f"{w} {floors[w]:.0f}" for w in workloads if w in floors))
    return {w: v for w, v in floors.items() if w in workloads}


def above_floor(results, floors_by_round):
    """Per floor workload: forkwsgi's CPU per request less the reference's
    less the round's floor, in ns, per round where all three were taken."""
    cpu = {(r["workload"], r["server"], r["round"]): r["cpu_us_per_req"] for r in results if "cpu_us_per_req" in r}
    rows = []
    for w in FLOOR_WORKLOADS:
        per = {}
        for rnd, floors in enumerate(floors_by_round):
            fw, ref = cpu.get((w, "forkwsgi", rnd)), cpu.get((w, "reference", rnd))
            if fw is not None and ref is not None and w in floors:
                per[rnd] = {"fw": fw * 1000, "ref": ref * 1000, "floor": floors[w],
                            "over": fw * 1000 - ref * 1000 - floors[w],
                            "best": ref * 1000 / (ref * 1000 + floors[w]), "ratio": ref / fw}
        if per:
            rows.append((w, per))
    return rows


def fmt_above_floor(rows, rounds):
    lines = ["| workload | forkwsgi CPU ns/req | reference | CPython floor | **above the floor (ns)** | "
             "range over rounds | forkwsgi × reference | best possible × reference |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for w, per in rows:
        m = {k: median([v[k] for v in per.values()]) for k in ("fw", "ref", "floor", "over", "best", "ratio")}
        overs = [v["over"] for v in per.values()]
        lines.append(f"| {w} | {m['fw']:,.0f} | {m['ref']:,.0f} | {m['floor']:,.0f} | **{m['over']:,.0f}** | "
                     f"{min(overs):,.0f} – {max(overs):,.0f} | {m['ratio']:.3f} | {m['best']:.3f} |")
    cols = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines += ["", f"| above the floor, ns per request | {cols} |", "|---|" + "---:|" * rounds]
    for w, per in rows:
        lines.append(f"| {w} | " + " | ".join(f"{per[i]['over']:,.0f}" if i in per else "—"
                                              for i in range(rounds)) + " |")
    return "\n".join(lines)


def log_cell(r, rounds):
    where = f"[round {r['round'] + 1}/{rounds}] {r['workload']:16} {r['server']:16}"
    if "skipped" in r:
        log(f"{where} skipped: {r['skipped']}")
    elif "failure" in r:
        log(f"{where} FAILED: {r['failure']}")
    else:
        per_cpu = f"{r['req_per_cpu_s']:>9,.0f}" if "req_per_cpu_s" in r else "      n/a"
        log(f"{where} {r['rps']:>10,.0f} req/s  p99 {r['p99_us'] / 1000:6.2f} ms  "
            f"{per_cpu} req/CPU-s  non-2xx {r['status']}  errors {r['errors']}  "
            f"cpu srv {r['server_cpu_pct']:.0f}% wrk {r['wrk_cpu_pct']:.0f}% "
            f"softirq {r['softirq_cpu_pct']:.0f}% others {r['other_cpu_pct']:.0f}%")


# ---------------------------------------------------------------- report

def median(values):
    return statistics.median(values) if values else float("nan")


def round_ratios(results, workload, server):
    """server's requests per CPU-second over the reference's, per round in
    which both were measured: {round: ratio}."""
    per = {(r["server"], r["round"]): r["req_per_cpu_s"] for r in results
           if r["workload"] == workload and "req_per_cpu_s" in r}
    return {rnd: per[(server, rnd)] / per[("reference", rnd)]
            for (s, rnd) in sorted(per) if s == server and ("reference", rnd) in per}


def summarize(results, names, workloads):
    rows = []
    for workload in workloads:
        for server in names:
            if server not in WORKLOADS[workload].servers:
                continue
            runs = [r for r in results if r["server"] == server and r["workload"] == workload]
            ok = [r for r in runs if "rps" in r]
            counted = [r for r in ok if "req_per_cpu_s" in r]
            ratios = round_ratios(results, workload, server)
            rows.append({
                "workload": workload, "server": server, "runs": len(runs), "ok": len(ok),
                "rps": median([r["rps"] for r in ok]),
                "p99_ms": median([r["p99_us"] / 1000 for r in ok]),
                "non2xx": sum(r["status"] for r in ok),
                "errors": sum(r["errors"] for r in ok),
                "error_detail": {k: sum(r[k] for r in ok)
                                 for k in ("connect", "read", "write", "timeout")},
                "server_cpu": median([r["server_cpu_pct"] for r in ok]),
                "cpu_us_per_req": median([r["cpu_us_per_req"] for r in counted]),
                "req_per_cpu_s": median([r["req_per_cpu_s"] for r in counted]),
                "req_per_cpu_s_by_round": {r["round"]: r["req_per_cpu_s"] for r in counted},
                "ratio": median(list(ratios.values())),
                "ratios": ratios,
                "wrk_cpu": median([r["wrk_cpu_pct"] for r in ok]),
                "other_cpu": max([r["other_cpu_pct"] for r in ok], default=float("nan")),
                "failures": [r["failure"] for r in runs if "failure" in r],
                "skipped": next((r["skipped"] for r in runs if "skipped" in r), None),
            })
    return rows


def lat(ms):
    # wrk reports 0 percentiles when its latency histogram is unusable.
    return "n/a" if ms == 0 else f"{ms:.2f}"


def num(x, fmt):
    return "n/a" if x != x else format(x, fmt)     # NaN: nothing measured


def fmt_table(rows):
    header = ("| workload | server | req/s | p99 ms | server CPU % | server CPU µs/req "
              "| req per server CPU-s | × reference (median of rounds) | × reference, min–max "
              "| non-2xx | socket errors | wrk CPU % | others' CPU % (worst run) |")
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if not r["ok"]:
            why = r["skipped"] or "; ".join(r["failures"]) or "no run"
            lines.append(f"| {r['workload']} | {r['server']} | — | {why} | | | | | | | | | |")
            continue
        err = str(r["errors"])
        if r["errors"]:
            err += " (" + ", ".join(f"{k} {v}" for k, v in r["error_detail"].items() if v) + ")"
        ratios = list(r["ratios"].values())
        spread = f"{min(ratios):.3f}–{max(ratios):.3f}" if ratios else "—"
        partial = f" ({r['ok']} of {r['runs']} rounds: {r['skipped']})" if r["skipped"] else ""
        lines.append(
            f"| {r['workload']} | {r['server']}{partial} | {r['rps']:,.0f} | {lat(r['p99_ms'])} | "
            f"{r['server_cpu']:.0f} | {num(r['cpu_us_per_req'], '.2f')} | "
            f"{num(r['req_per_cpu_s'], ',.0f')} | {num(r['ratio'], '.3f')} | {spread} | "
            f"{r['non2xx']} | {err} | {r['wrk_cpu']:.0f} | {r['other_cpu']:.0f} |")
    return "\n".join(lines)


def fmt_stability(rows, rounds):
    """Per workload: the reference's own figure per round and, per server, its
    ratio to the reference per round, with the spread (max - min) / median."""
    cols = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [f"| workload | server | {cols} | spread |", "|---|---|" + "---:|" * (rounds + 1)]
    for r in rows:
        if not r["ok"]:
            continue
        if r["server"] == "reference":
            by_round = r["req_per_cpu_s_by_round"]
            cells = [f"{by_round[i]:,.0f}" if i in by_round else "—" for i in range(rounds)]
            vals = list(by_round.values())
            what = "reference, req per CPU-s"
        else:
            cells = [f"{r['ratios'][i]:.3f}" if i in r["ratios"] else "—" for i in range(rounds)]
            vals = list(r["ratios"].values())
            what = f"{r['server']} × reference"
        spread = f"{100 * (max(vals) - min(vals)) / median(vals):.1f} %" if len(vals) > 1 else "—"
        lines.append(f"| {r['workload']} | {what} | " + " | ".join(cells) + f" | {spread} |")
    return "\n".join(lines)


def machine_facts(cc_version):
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return "?"
    cpu = "?"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    wrk_version = run_quiet(["wrk", "-v"]).stdout.strip().splitlines()[0].split(" Copyright")[0]
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
        "python": platform.python_version(), "wrk": wrk_version, "cc": cc_version,
        "ip_local_port_range": read("/proc/sys/net/ipv4/ip_local_port_range").replace("\t", "-"),
        "tcp_tw_reuse": read("/proc/sys/net/ipv4/tcp_tw_reuse"),
        "forkwsgi": forkwsgi_facts(),
    }


def extension_path(env=None):
    """The file of the forkwsgi extension that `python3 -c 'import forkwsgi'`
    loads in the environment `env` (default: this one), or None."""
    r = run_quiet([sys.executable, "-c", "import forkwsgi._forkwsgi as m; print(m.__file__)"], env=env)
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 else None


def forkwsgi_facts(env=None):
    """Where the forkwsgi under test comes from: the extension that
    `python3 -c 'import forkwsgi'` loads (in `env`, default this environment),
    its hash and build time, and the git state of the checkout it lives in."""
    so = extension_path(env)
    if so is None:
        return "?"
    with open(so, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    built = os.path.getmtime(so)
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(so)))   # .../python/forkwsgi/x.so
    head, dirty = git_state(checkout)
    # src/_forkwsgi.c is generated from the .pyx (a test run's sdist build
    # may regenerate it, unchanged): the .pyx stands for it.
    sources = [os.path.join(d, f) for d in (os.path.join(checkout, "cserver"), os.path.join(checkout, "src"))
               if os.path.isdir(d) for f in os.listdir(d)
               if f.endswith((".c", ".h", ".pyx")) and f != "_forkwsgi.c"]
    newer = [os.path.relpath(p, checkout) for p in sources if os.path.getmtime(p) > built]
    return (f"git {head or '?'}{' with uncommitted changes in ' + ', '.join(dirty) if dirty else ''} "
            f"in {checkout} (the extension `{os.path.basename(so)}` sha256 {digest}…, built "
            f"{datetime.datetime.fromtimestamp(built, datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
            + (f"; **older than** {', '.join(sorted(newer))} (stale build?))" if newer else
               ", newer than every C source)"))


def git_state(where=BENCH):
    head = git_head(where)
    top = run_quiet(["git", "-C", where, "rev-parse", "--show-toplevel"]).stdout.strip() or where
    dirty = run_quiet(["git", "-C", top, "status", "--porcelain", "--", "cserver", "src",
                       "python"]).stdout.split("\n")
    dirty = [ln[3:] for ln in dirty if ln.strip()]
    return head, dirty


def commands_md(server_caption, server_lines, workloads, duration, warmup):
    """The server commands (given) and the wrk commands of the workloads, as
    the Markdown code blocks of a RESULTS.md section."""
    wrk_lines = "\n".join(f"taskset -c {CLIENT_CPU} " + display_command(wrk_argv(w, "PORT", duration))
                          for w in workloads)
    return f"""{server_caption}

```
{server_lines}
```

wrk commands (each also run once for {warmup} s first, discarded; run from bench/):

```
{wrk_lines}
```"""


def problems_seen(results, facts_by_round):
    problems, told = [], set()
    for facts in facts_by_round:
        for name, f in facts.items():
            if f.get("keepalive") == "stalls" and name not in told:
                told.add(name)
                problems.append(f"- {name}: stalls under keep-alive: it answered the first request on a "
                                "connection, then not the second within 2 s (the connection stayed open); "
                                "measured in round 1 only")
    for rnd, facts in enumerate(facts_by_round):
        for name, f in facts.items():
            tag = f"round {rnd + 1}/{name}"
            why = f.get("failure") or f.get("crashed")
            if why:
                problems.append(f"- {tag}: **{why}**; server log tail:\n\n```\n{f['log_tail']}\n```")
            elif f.get("log_suspicious"):
                problems.append(f"- {tag}: server log lines: "
                                + "; ".join(f"`{ln.strip()}`" for ln in f["log_suspicious"]))
    for r in results:
        if "failure" in r:
            problems.append(f"- round {r['round'] + 1}/{r['workload']}/{r['server']}: **{r['failure']}**")
    return problems


def write_floor_section(floor_table, args, started, elapsed):
    section = f"""{FLOOR_SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `{invocation()}` at {git_head()} (took {elapsed / 60:.1f} min;
{args.rounds} round(s), {args.duration} s measured per cell after a {args.warmup} s warm-up; the cells are
the "Core" section's, server on CPU {SERVER_CPU}, wrk on CPU {CLIENT_CPU}).

forkwsgi's CPU per request less the reference's (the kernel's and a C server's share) less the
CPython floor of the same request, timed on the server's CPU after each round's cells by
`python3 bench/run_floor.py --json --number {FLOOR_CALLS} --repeat {FLOOR_REPEAT}` (the least
environ, the app, iterating its body, with no server around them): what forkwsgi's own work costs
beyond what any WSGI server must spend on this CPython and this kernel. Medians over rounds, each
round's figure from that round's three measurements. "Best possible" is reference ÷ (reference +
floor): a server whose only cost above the reference were the floor.

{floor_table}
"""
    write_section(RESULTS, FLOOR_SECTION, section)


def write_results(rows, results, facts_by_round, setup, args, started, elapsed):
    versions, unavailable, meinheld, facts = setup
    names = sorted({r["server"] for r in results}, key=SERVERS.index)
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in results)]
    heads = {}
    for facts_of_round in facts_by_round:
        for name, f in facts_of_round.items():
            if "probes" in f:
                heads.setdefault(name, f["probes"]["hello"])
    problems = problems_seen(results, facts_by_round)
    server_lines = "\n".join(display_command(["taskset", "-c", SERVER_CPU, *server_argv(s, "route", "PORT")])
                             for s in names)
    peers = ", ".join(f"{p} {v}" for p, v in versions.items())
    missing = "".join(f"\n- {p}: {why}" for p, why in unavailable.items())
    cells = "\n".join(f"- {w}: {WORKLOADS[w].desc}; servers: {', '.join(s for s in WORKLOADS[w].servers if s in names)}"
                      for w in workloads)
    section = f"""{SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `{invocation()}` (took {elapsed / 60:.1f} min;
{args.rounds} round(s), {args.duration} s measured per cell after a {args.warmup} s warm-up).

**Machine.** nproc {facts['nproc']} ({facts['cpu']}), kernel {facts['kernel']}, \
Python {facts['python']} (same interpreter for forkwsgi and the peers' venv), {facts['wrk']}, \
{facts['cc']}, ip_local_port_range {facts['ip_local_port_range']}, tcp_tw_reuse {facts['tcp_tw_reuse']}.
Server pinned to CPU {SERVER_CPU}, wrk to CPU {CLIENT_CPU}; everything on 127.0.0.1.

**Software.** forkwsgi from {facts['forkwsgi']}; peers in bench/.venv: {peers}.
The reference is `bench/refserver.c` built with `cc {' '.join(REFSERVER_CFLAGS)}`.
{meinheld}{missing}

**Method.** Every WSGI server serves `apps:route` (`bench/apps.py`): `GET /` hello (13-byte
body), `GET /4k` 4096-byte body, `POST /post` reads the 1 KiB JSON body through `wsgi.input`
and answers hello; all with Content-Type text/plain and an explicit Content-Length. The
reference answers the same paths with responses of the same size as forkwsgi's (same headers,
Date included; see the heads below), reads and discards request bodies, and answers all the
requests of one read with one write. Workloads:

{cells}

gunicorn costs ~100 µs of CPU per request, 10× the others: to keep the run short it has one
cell per worker type, gthread on keep-alive hello and sync on close-hello (sync has no
keep-alive). Each round starts every server afresh
(each on its own port, all idle but the one under load), checks the three responses, probes
keep-alive (two requests in turn on one connection) and pipelining ({PIPELINE_PROBE_DEPTH} requests in one
write, all answered within 2 s, else the pipelining cell is skipped), then runs every workload
on every server, the server order rotated each round; a cell waits (up to
{args.quiet_wait:.0f} s) for other processes to go idle, runs wrk for {args.warmup} s (discarded), then
measures {args.duration} s. A server that stalls in the keep-alive probe (the connection stays open,
the second response never comes) is measured in the first round only. Server CPU is the on-CPU
time of its process tree over the measured run, summed over its threads from
/proc/PID/task/TID/schedstat (exact, where utime/stime are clock-tick samples); "req per server
CPU-s" is requests ÷ that time, and
"× reference" is that figure over the reference's in the same workload and the same round: the
median over rounds, and its range. The req/s, p99 and CPU columns are medians over rounds;
non-2xx (wrk counts status ≥ 400) and socket errors are totals. wrk is near 100 % of its CPU in
most keep-alive cells, so req/s there is the load generator's ceiling, not the server's:
compare servers by CPU per request. Pipelined latency is per batch of 16. "Others' CPU" is
what other processes used during the worst run of the cell: above a few % that cell is
disturbed.

{commands_md("Server commands:", server_lines, workloads, args.duration, args.warmup)}

### Results (medians over rounds)

{fmt_table(rows)}

### Stability: the reference's figure and each ratio to it, per round

The reference's own requests per CPU-second moves with the machine from round to round; the
ratio to it, taken within a round, is what should hold still. Spread = (max − min) / median.

{fmt_stability(rows, args.rounds)}

### Response heads (`GET / HTTP/1.1`)

""" + "\n".join(f"- {s}: {p['head_bytes']} bytes — `{p['head'].replace(chr(13) + chr(10), ' ⏎ ')}`"
                for s, p in heads.items()) + f"""

### Problems seen

{chr(10).join(problems) if problems else 'None: every run completed, no server exited early, no error lines in server logs.'}
"""
    for old in OLD_SECTIONS:
        if os.path.exists(RESULTS) and old in open(RESULTS).read():
            write_section(RESULTS, old, section)
            return
    write_section(RESULTS, SECTION, section)


# ---------------------------------------------------------------- main

def pick(option, value, known):
    chosen = [v.strip() for v in value.split(",") if v.strip()] if value else list(known)
    unknown = [v for v in chosen if v not in known]
    if unknown:
        sys.exit(f"{option}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return [k for k in known if k in chosen]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", "--reps", type=int, default=5,
                    help="interleaved rounds; medians and ratio ranges are over these (default 5)")
    ap.add_argument("--duration", type=int, default=4, help="measured seconds per cell (default 4)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded warm-up seconds per cell (default 1)")
    ap.add_argument("--quiet-wait", type=float, default=15,
                    help="before each cell, wait up to this many seconds for other "
                         "processes to go idle")
    ap.add_argument("--only", metavar="SERVER[,..]",
                    help=f"servers to run (the reference is always added: it is the ratios' "
                         f"denominator); of {', '.join(SERVERS)}")
    ap.add_argument("--workloads", metavar="W[,..]", help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s cells (smoke test)")
    ap.add_argument("--floor-only", action="store_true",
                    help="only the reference and forkwsgi on keep-alive hello, 4k and post-1k: the section "
                         "\"CPU above the floor\", the \"Core\" section left as it is")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2, 1
    if args.floor_only:
        args.only, args.workloads = "reference,forkwsgi", ",".join(FLOOR_WORKLOADS)
    names = pick("--only", args.only, SERVERS)
    if "reference" not in names:
        names.insert(0, "reference")
    workloads = pick("--workloads", args.workloads, list(WORKLOADS))

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    os.makedirs(OUT, exist_ok=True)
    if run_quiet([sys.executable, "-c", "import forkwsgi"]).returncode != 0:
        sys.exit(f"forkwsgi is not importable from {sys.executable}; run this with the "
                 "Python where forkwsgi is installed")
    ensure_system_packages()
    cc_version = build_refserver()
    versions, unavailable, meinheld = ensure_venv()
    log(meinheld)
    for package, why in unavailable.items():
        log(f"{package}: {why}")
    facts = machine_facts(cc_version)

    cells = sum(1 for w in workloads for s in names if s in WORKLOADS[w].servers)
    per_cell = args.duration + args.warmup + 0.8
    log(f"{args.rounds} round(s) of {cells} cells, at most about "
        f"{args.rounds * (cells * per_cell + 3 * len(names)) / 60:.1f} min (cells a probe rules out are skipped)")

    results, facts_by_round, floors_by_round = [], [], []
    for rnd in range(args.rounds):
        round_results, round_facts = run_round(rnd, names, workloads, args, unavailable)
        results += round_results
        facts_by_round.append(round_facts)
        floors_by_round.append(measure_floor(workloads, args.quiet_wait) if "forkwsgi" in names else {})
    elapsed = time.monotonic() - t_start

    with open(os.path.join(OUT, "core-results.json"), "w") as f:
        json.dump({"facts": facts, "versions": versions, "unavailable": unavailable,
                   "meinheld": meinheld, "rounds": facts_by_round, "results": results,
                   "floors": floors_by_round}, f, indent=1)
    rows = summarize(results, names, workloads)
    floor_table = fmt_above_floor(above_floor(results, floors_by_round), args.rounds)
    log("\n" + fmt_table(rows) + "\n\n" + fmt_stability(rows, args.rounds) + "\n\n" + floor_table +
        "\n\n" + meinheld)
    if not args.no_write:
        if not args.floor_only:
            write_results(rows, results, facts_by_round, (versions, unavailable, meinheld, facts),
                          args, started, elapsed)
        if any(floors_by_round):
            write_floor_section(floor_table, args, started, elapsed)
        log(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
