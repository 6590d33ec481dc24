#!/usr/bin/env python3
"""nginx `uwsgi_pass` in front of forkwsgi --uwsgi-socket and of uWSGI
--socket: the cost of a connection per request (nginx keeps no uwsgi
upstream connection alive).

    flock /tmp/bench.lock python3 bench/run_uwsgi_pass.py             # 3 rounds of 5 s (~2 minutes)
    flock /tmp/bench.lock python3 bench/run_uwsgi_pass.py --quick     # 1 round of 2 s

Run it with the Python where forkwsgi is installed (or PYTHONPATH set to a
checkout's python/). uWSGI is pip-installed (it compiles) into its own
virtualenv, bench/.venv-uwsgi, which this script creates.

Three upstreams, each one master and one worker process with one thread,
serving bench/apps.py's hello (13 bytes, with Content-Length), pinned to
CPU 0:

    forkwsgi --uwsgi-socket     nginx: include uwsgi_params; uwsgi_pass
    uWSGI --socket              the same nginx config
    forkwsgi --bind (HTTP)      nginx: proxy_pass with a keepalive 32 upstream
                                (for scale: what an upstream kept alive saves)

nginx (one worker) and wrk (keep-alive, 50 connections) share CPU 1. Each
run starts a fresh upstream and a fresh nginx; a round runs the three in
turn (the order rotates), a discarded warm-up then a measured wrk run each.
Reported: req/s through nginx, the upstream's CPU per request (its process
tree, from /proc/PID/task/TID/schedstat), nginx's; medians over rounds, and
forkwsgi's ratios to uWSGI. The summary goes to the terminal and to the
"uwsgi_pass" section of bench/RESULTS.md; logs to bench/out/.
"""
import argparse
import datetime
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_core  # noqa: E402
import common  # noqa: E402
from common import (UWSGI_BIN, CpuMeter, ServerTree, ensure_uwsgi, free_port, invocation, log, rotated,  # noqa: E402
                    run_quiet, wait_http, wait_until_quiet, write_section)

SECTION = "## uwsgi_pass: forkwsgi --uwsgi-socket vs uWSGI behind nginx"
BENCH = run_core.BENCH
OUT = run_core.OUT
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_CPU = run_core.CLIENT_CPU          # with wrk: the upstream has CPU 0 to itself
WORKLOAD = "nginx-hello"
run_core.WORKLOADS[WORKLOAD] = run_core.Workload("keep-alive to nginx, 50 connections, hello", "/", "stats.lua",
                                                 ["-t1", "-c50"], [])

NGINX_HTTP = """
    upstream http_app {{
        server 127.0.0.1:{upstream};
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
{location}
        }}
    }}"""
UWSGI_LOCATION = "            include uwsgi_params;\n            uwsgi_pass 127.0.0.1:{upstream};"
HTTP_LOCATION = ("            proxy_pass http://http_app;\n            proxy_http_version 1.1;\n"
                 "            proxy_set_header Connection \"\";")


def upstreams():
    py = sys.executable
    return {
        "forkwsgi --uwsgi-socket": (UWSGI_LOCATION, lambda port: [
            py, "-m", "forkwsgi", "apps:hello", "--uwsgi-socket", f"127.0.0.1:{port}", "--workers", "1",
            "--threads", "1", "--backlog", "1024"]),
        "uWSGI --socket": (UWSGI_LOCATION, lambda port: [
            UWSGI_BIN, "--socket", f"127.0.0.1:{port}", "--master", "--processes", "1", "--pythonpath", BENCH,
            "--module", "apps:hello", "--listen", "1024", "--disable-logging", "--die-on-term", "--need-app"]),
        "forkwsgi --bind (HTTP, keepalive upstream)": (HTTP_LOCATION, lambda port: [
            py, "-m", "forkwsgi", "apps:hello", "--bind", f"127.0.0.1:{port}", "--workers", "1",
            "--threads", "1", "--backlog", "1024"]),
    }


def start_nginx(location, upstream, tag):
    d = os.path.join(OUT, f"nginx-{tag}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copy("/etc/nginx/uwsgi_params", os.path.join(d, "uwsgi_params"))
    port = free_port()
    http = NGINX_HTTP.format(port=port, upstream=upstream, location=location.format(upstream=upstream))
    return common.start_nginx(d, http, port, NGINX_CPU)


def error_lines(path):
    try:
        with open(path, errors="replace") as f:
            return [ln for ln in f if "[error]" in ln or "[crit]" in ln or "[alert]" in ln]
    except OSError:
        return []


def one_run(name, location, argv_of, duration, warmup, tag):
    wait_until_quiet(15)
    up_port = free_port()
    env = dict(os.environ)
    upstream = ServerTree(argv_of(up_port), up_port, os.path.join(OUT, f"uwsgi-pass.{tag}.log"), env,
                          run_core.SERVER_CPU, BENCH)
    nginx = start_nginx(location, up_port, tag)
    try:
        # nginx answers the app's hello once the upstream is up
        if not wait_http(nginx.port, "/", timeout=20.0, conn_timeout=2, body=run_core.HELLO):
            return {"failure": f"no hello through nginx; upstream log: {upstream.log_text()[-500:]}; "
                               f"nginx: {''.join(error_lines(nginx.error_log))[-500:]}"}
        errors_before = len(error_lines(nginx.error_log))     # the readiness poll's "connection refused"
        run_core.run_wrk(WORKLOAD, nginx.port, warmup)
        meter = CpuMeter(upstream=upstream.sched_cpu_seconds, nginx=nginx.sched_cpu_seconds)
        stats, text, _ = run_core.run_wrk(WORKLOAD, nginx.port, duration)
        used = meter.stop().used
        up_cpu, ng_cpu = used["upstream"], used["nginx"]
        if stats is None:
            return {"failure": "wrk failed: " + text.strip()[-300:]}
        n = max(1, stats["requests"])
        return {"rps": stats["rps"], "errors": stats["errors"], "non2xx": stats["status"],
                "p99_ms": stats["p99_us"] / 1000, "up_us": 1e6 * up_cpu / n, "nginx_us": 1e6 * ng_cpu / n,
                "nginx_errors": len(error_lines(nginx.error_log)) - errors_before}
    finally:
        nginx.stop()
        upstream.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2, 1
    os.makedirs(OUT, exist_ok=True)
    run_core.ensure_system_packages()
    if not os.path.exists("/etc/nginx/uwsgi_params"):
        run_core.apt_install("nginx")
    uwsgi_version, why = ensure_uwsgi()
    cfgs = upstreams()
    if why:
        log(f"uWSGI unavailable: {why}")
        del cfgs["uWSGI --socket"]
    names = list(cfgs)
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {n: [] for n in names}
    for rnd in range(args.rounds):
        for k, name in enumerate(rotated(names, rnd)):
            location, argv_of = cfgs[name]
            r = one_run(name, location, argv_of, args.duration, args.warmup, f"{rnd}.{k}")
            results[name].append(r)
            if "rps" in r:
                log(f"[{rnd + 1}/{args.rounds}] {name:42} {r['rps']:>8,.0f} req/s  upstream {r['up_us']:.1f} µs/req"
                    f"  nginx {r['nginx_us']:.1f} µs/req  p99 {r['p99_ms']:.2f} ms  errors {r['errors']}"
                    f"  non-2xx {r['non2xx']}  nginx errors {r['nginx_errors']}")
            else:
                log(f"[{rnd + 1}/{args.rounds}] {name:42} FAILED: {r['failure']}")

    def med(name, key):
        vals = [r[key] for r in results.get(name, []) if key in r]
        return statistics.median(vals) if vals else float("nan")

    rows = ["| upstream behind nginx | req/s (median) | req/s (each round) | upstream CPU µs/req | "
            "nginx CPU µs/req | p99 ms | errors, non-2xx, nginx errors |", "|---|---:|---|---:|---:|---:|---:|"]
    for n in names:
        each = " / ".join(f"{r['rps']:,.0f}" for r in results[n] if "rps" in r) or "failed"
        bad = sum(r.get("errors", 0) + r.get("non2xx", 0) + r.get("nginx_errors", 0) for r in results[n])
        rows.append(f"| {n} | {med(n, 'rps'):,.0f} | {each} | {med(n, 'up_us'):.1f} | {med(n, 'nginx_us'):.1f} | "
                    f"{med(n, 'p99_ms'):.2f} | {bad} |")
    table = "\n".join(rows)
    fw, uw, ka = names[0], "uWSGI --socket", "forkwsgi --bind (HTTP, keepalive upstream)"
    ratios = ["| compared | req/s | upstream CPU per request |", "|---|---:|---:|"]
    if uw in results:
        ratios.append(f"| forkwsgi --uwsgi-socket / uWSGI --socket | {med(fw, 'rps') / med(uw, 'rps'):.2f} | "
                      f"{med(fw, 'up_us') / med(uw, 'up_us'):.2f} |")
    ratios.append(f"| forkwsgi --uwsgi-socket / forkwsgi HTTP kept alive | {med(fw, 'rps') / med(ka, 'rps'):.2f} | "
                  f"{med(fw, 'up_us') / med(ka, 'up_us'):.2f} |")
    ratio_table = "\n".join(ratios)
    log("\n" + table + "\n\n" + ratio_table)
    if args.no_write:
        return
    head, dirty = run_core.git_state()
    nginx_v = run_quiet([NGINX, "-v"]).stdout.strip().replace("nginx version: ", "")
    uwsgi_line = f"uWSGI {uwsgi_version} (pip, bench/.venv-uwsgi)" if uwsgi_version else f"uWSGI: {why}"
    root = os.path.dirname(BENCH) + os.sep
    commands = "\n".join(f"taskset -c {run_core.SERVER_CPU} " +
                         run_core.display_command(argv_of("PORT")).replace(root, "")
                         for _, argv_of in cfgs.values())
    section = f"""{SECTION}

Run on {started:%Y-%m-%d %H:%M} UTC by `{invocation()}`
(under `flock /tmp/bench.lock`), forkwsgi from git {head}{' (uncommitted changes)' if dirty else ''};
nginx {nginx_v} (one worker), {uwsgi_line}. `wrk -t1 -c50` keep-alive to nginx, nginx to the
upstream: `include uwsgi_params; uwsgi_pass` (a new connection per request: nginx keeps no uwsgi
upstream alive), or for scale `proxy_pass` to a `keepalive 32` HTTP upstream. The upstream (one
master, one worker process, one thread, bench/apps.py's hello) on CPU {run_core.SERVER_CPU}; nginx and
wrk on CPU {NGINX_CPU}. {args.rounds} round(s) of {args.duration} s after {args.warmup} s of warm-up, a fresh
upstream and nginx each run, the order rotated each round. CPU per request: the process tree's
on-CPU time (schedstat) over the measured run ÷ requests.

```
{commands}
```

{table}

{ratio_table}
"""
    write_section(run_core.RESULTS, SECTION, section)
    log(f"wrote {run_core.RESULTS}")


if __name__ == "__main__":
    main()
