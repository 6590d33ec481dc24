#!/usr/bin/env python3
"""The floor of one WSGI request in CPython, against the budget the keep-alive
goal leaves (keep-alive hello at ≥ 0.95× the C reference's requests per
server CPU-second).

    python3 bench/run_floor.py --ref-us 3.60     # the reference's CPU µs per request
    python3 bench/run_floor.py                   # measure it: a short run_core.py of the reference
                               [--number N] [--repeat N] [--cpu N] [--no-write]

A server at 0.95× the reference may spend 1/0.95 − 1 = 5.3 % more CPU per
request than the reference, which spends nearly all of its time in the
kernel (read, write, epoll, waking the client). Even if a WSGI server's
kernel time and C work were exactly the reference's, that 5.3 % must pay
for all the Python a request needs. This measures the least of it, in one
process, pinned to one CPU, with no server around it:

    app      bench/apps.py's route (the app every server in run_core.py
             serves) called with a ready environ and a start_response that
             is a C builtin: the app's own bytecode, its header list and
             tuples, str(len(body)), the body list
    environ  the least PEP 3333 asks for a GET: a copy of the constant keys
             (SCRIPT_NAME, SERVER_NAME/PORT, wsgi.*) and six inserts of
             per-request values that already exist as str (REQUEST_METHOD,
             PATH_INFO, QUERY_STRING, SERVER_PROTOCOL, HTTP_HOST,
             wsgi.input), then its release
    body     iterating the returned list and taking each item's length
    request  the three together

With --json it prints instead the floor of each run_core.py workload that
forkwsgi's "CPU above the floor" is taken from (run_core.py calls it so in
every round, pinned to the server's CPU): keepalive-hello (the request
above), keepalive-4k (the same for /4k) and post-1k (a POST environ with
CONTENT_TYPE, CONTENT_LENGTH and a new io.BytesIO of the 1 KiB body as
wsgi.input, which the app reads).

Each is the median of --repeat timings of --number calls, less the same
loop run empty. The figures are lower than any server's: real servers also
build the str values, check the app's headers, and hold the GIL's hand-offs.
The summary goes to the terminal and to the section "## Core: the CPython
floor ..." of bench/RESULTS.md.
"""
import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import apps  # noqa: E402
from common import BENCH, RESULTS, SERVER_CPU, git_head, invocation, log, pin_self, write_section  # noqa: E402

GOAL = 0.95
TITLE = "## Core: the CPython floor of a WSGI request against the keep-alive goal"
PIECES = {"app": "the app (`apps.route` → `hello`, start_response a C builtin)",
          "environ": "the least PEP 3333 environ (a copy of the constant keys, six inserts)",
          "body": "iterating the body",
          "request": "all three together"}


def per_call_ns(fn, number, repeat):
    """Median ns per call of fn(number) (a loop of `number` calls), less an
    empty loop's."""
    def empty(n):
        for _ in range(n):
            pass

    def timed(f):
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            f(number)
            out.append(time.perf_counter_ns() - t0)
        return statistics.median(out) / number

    return timed(fn) - timed(empty)


# The constant keys of the least environ (copied into each request's).
CONST = {"SCRIPT_NAME": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "wsgi.version": (1, 0),
         "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr, "wsgi.multithread": False,
         "wsgi.multiprocess": True, "wsgi.run_once": False}


def make_cases():
    const = CONST
    method, path, query, proto, host, body = "GET", "/", "", "HTTP/1.1", "127.0.0.1:8000", io.BytesIO()
    ready = dict(const, REQUEST_METHOD=method, PATH_INFO=path, QUERY_STRING=query, SERVER_PROTOCOL=proto,
                 HTTP_HOST=host)
    ready["wsgi.input"] = body
    route, sr = apps.route, slice            # slice(status, headers): a C callable of two arguments
    result = route(ready, sr)

    def app(n):
        for _ in range(n):
            route(ready, sr)

    def environ(n):
        for _ in range(n):
            e = const.copy()
            e["REQUEST_METHOD"] = method
            e["PATH_INFO"] = path
            e["QUERY_STRING"] = query
            e["SERVER_PROTOCOL"] = proto
            e["HTTP_HOST"] = host
            e["wsgi.input"] = body

    def body_(n):
        for _ in range(n):
            for chunk in result:
                len(chunk)

    # The three together: keep-alive hello's whole request, as --json times it.
    request = make_workload_cases()["keepalive-hello"]
    return {"app": app, "environ": environ, "body": body_, "request": request}


POST_BODY = b'{"pad":"' + b"p" * (1024 - 10) + b'"}'     # run_core.py's probe body: 1 KiB


def make_workload_cases():
    """{run_core.py workload: loop of n whole requests}: the least environ
    of that request, the app, iterating its body."""
    const = CONST
    route, sr = apps.route, slice
    proto, host, query, empty = "HTTP/1.1", "127.0.0.1:8000", "", io.BytesIO()

    def get(path):
        def loop(n):
            for _ in range(n):
                e = const.copy()
                e["REQUEST_METHOD"] = "GET"
                e["PATH_INFO"] = path
                e["QUERY_STRING"] = query
                e["SERVER_PROTOCOL"] = proto
                e["HTTP_HOST"] = host
                e["wsgi.input"] = empty
                for chunk in route(e, sr):
                    len(chunk)
        return loop

    def post(n):
        body, length, ctype = POST_BODY, str(len(POST_BODY)), "application/json"
        for _ in range(n):
            e = const.copy()
            e["REQUEST_METHOD"] = "POST"
            e["PATH_INFO"] = "/post"
            e["QUERY_STRING"] = query
            e["SERVER_PROTOCOL"] = proto
            e["HTTP_HOST"] = host
            e["CONTENT_TYPE"] = ctype
            e["CONTENT_LENGTH"] = length
            e["wsgi.input"] = io.BytesIO(body)
            for chunk in route(e, sr):
                len(chunk)

    assert b"".join(route(dict(const, REQUEST_METHOD="POST", PATH_INFO="/post", CONTENT_LENGTH=str(len(POST_BODY)),
                                 **{"wsgi.input": io.BytesIO(POST_BODY)}), sr)) == apps.HELLO
    return {"keepalive-hello": get("/"), "keepalive-4k": get("/4k"), "post-1k": post}


def workload_floors(number, repeat):
    """{run_core.py workload: ns per request of its CPython floor}."""
    return {name: per_call_ns(fn, number, repeat) for name, fn in make_workload_cases().items()}


def reference_us():
    """The C reference's CPU µs per keep-alive hello request, from a short
    run_core.py (reference only, 3 rounds of 4 s)."""
    out = subprocess.run([sys.executable, os.path.join(BENCH, "run_core.py"), "--only", "reference",
                          "--workloads", "keepalive-hello", "--rounds", "3", "--no-write"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900).stdout
    vals = [1e6 / float(v.replace(",", "")) for v in
            re.findall(r"keepalive-hello +reference .*? ([\d,]+) req/CPU-s", out)]
    if not vals:
        sys.exit("run_core.py gave no figure for the reference:\n" + out[-3000:])
    return statistics.median(vals)


def verdict(floor, ref):
    """(the ns per request the goal leaves for Python, the best ratio to the
    reference a server could reach whose only Python were this floor)."""
    return ref * 1000 * (1 / GOAL - 1), ref * 1000 / (ref * 1000 + floor["request"])


def report(floor, ref, args, when):
    """The RESULTS.md section: the pieces' ns per request against the budget."""
    budget, best = verdict(floor, ref)
    source = "given with --ref-us" if args.ref_us else \
        "measured in the same run (run_core.py: the reference only, keep-alive hello, 3 rounds of 4 s)"
    lines = [TITLE, "",
             f"Run on {when} by `{invocation()}` at {git_head()}: Python {sys.version.split()[0]}, one process "
             f"pinned to CPU {args.cpu} with no server around it, each piece the median of {args.repeat} timings "
             f"of {args.number:,} calls less an empty loop's; the reference's CPU per request {source}.", "",
             f"The keep-alive goal is keep-alive hello at ≥ {GOAL}× the C reference's requests per server "
             f"CPU-second: a server may spend 1/{GOAL} − 1 = {100 * (1 / GOAL - 1):.1f} % more CPU per request "
             "than the reference, and that must pay for all the Python a request needs.", "",
             "| piece | ns per request |", "|---|---:|"]
    lines += [f"| {label} | {floor[name]:,.0f} |" for name, label in PIECES.items()]
    lines += [f"| the reference's CPU per request | {ref * 1000:,.0f} |",
              f"| the budget at {GOAL}× ({100 * (1 / GOAL - 1):.1f} % of it) | {budget:,.0f} |", "",
              f"The app alone is {floor['app'] / budget:.2f}× the budget and the whole floor "
              f"{floor['request'] / budget:.2f}×. A server whose kernel and C work were exactly the reference's, "
              f"and whose Python were only this floor, would reach {ref * 1000:,.0f} / ({ref * 1000:,.0f} + "
              f"{floor['request']:,.0f}) = **{best:.3f}×**.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref-us", type=float, help="the reference's CPU µs per keep-alive hello request")
    ap.add_argument("--number", type=int, default=200_000, help="calls per timing")
    ap.add_argument("--repeat", type=int, default=7, help="timings per case (the median is kept)")
    ap.add_argument("--cpu", type=int, default=int(SERVER_CPU), help="the CPU to pin to")
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md as it is")
    ap.add_argument("--json", action="store_true",
                    help="print the floor of each run_core.py workload as JSON (ns per request), nothing else")
    args = ap.parse_args()
    if args.json:
        pin_self(args.cpu)
        print(json.dumps(workload_floors(args.number, args.repeat)))
        return
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ref = args.ref_us if args.ref_us else reference_us()
    pin_self(args.cpu)
    log(f"Python {sys.version.split()[0]}, CPU {args.cpu}, {args.repeat} x {args.number:,} calls per case")
    floor = {}
    for name, fn in make_cases().items():
        floor[name] = per_call_ns(fn, args.number, args.repeat)
        log(f"  {name:8} {floor[name]:7.1f} ns")
    budget, best = verdict(floor, ref)
    log(f"reference: {ref:.2f} µs of CPU per request; at {GOAL}x a server may spend {budget:.0f} ns more")
    log(f"the app alone: {floor['app']:.0f} ns = {floor['app'] / budget:.2f}x that budget; "
        f"a whole request's Python floor: {floor['request']:.0f} ns = {floor['request'] / budget:.2f}x")
    log(f"best possible ratio with the reference's kernel and C work and only this Python: {best:.3f}x")
    if not args.no_write:
        write_section(RESULTS, TITLE, report(floor, ref, args, when))
        log(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
