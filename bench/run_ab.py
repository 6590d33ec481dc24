#!/usr/bin/env python3
"""A/B benchmark: forkwsgi against an older git revision of itself, interleaved.

    python3 bench/run_ab.py --rev ed7fc55                 # 5 rounds of 4 s cells, all workloads
    python3 bench/run_ab.py --rev HEAD~3 --threads 1,2 --workloads pipeline16-hello,keepalive-hello
    python3 bench/run_ab.py --rev ed7fc55 --quick         # 1 round of 2 s cells
    python3 bench/run_ab.py --rev HEAD~1 --workers 2 --threads 2 --workloads close-hello   # the balancer
    python3 bench/run_ab.py --rev a921102 --floor --workloads keepalive-hello,keepalive-4k,post-1k --rounds 20
                                  # each side's CPU above the CPython floor, and whether it halved

"Before" is REV, checked out into a temporary detached `git worktree` and
built there (`python3 setup.py -q build_ext --inplace`); the worktree is
removed at the end, also on an error or Ctrl-C. "After" is this checkout
as it is, with the extension built in it (nothing is built here; the
results say if the build is older than a C source). Each side's server is
`python3 -m forkwsgi apps:route` with PYTHONPATH set to its checkout's
python/ directory, run from bench/ (the same bench/apps.py for both).

Workloads are run_core.py's (same wrk arguments and Lua scripts, 1 wrk
thread, 50 connections); the server is pinned to CPU 0, wrk to CPU 1, all
on 127.0.0.1. Per --threads setting both servers are started once and stay
up for every round; a round runs each workload on both, the order before /
after swapped from one round to the next, each cell a discarded warm-up and
a measured wrk run (run_core.measure: server CPU from schedstat of its
process tree). Reported per workload and threads setting: median req/s and
server CPU µs per request of each side, and the after ÷ before ratios of
req/s and of CPU per request taken within each round, their median and
min–max over the rounds. The summary goes to the terminal and, unless
--no-write, to the section "## A/B: REV → HEAD" of bench/RESULTS.md; wrk
output, server logs, the build log and ab-results.json go to bench/out/.
"""
import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_core  # noqa: E402
from common import free_port, invocation, log, median_ci, rotated, run_quiet, stop_all, write_section  # noqa: E402
from run_core import (BENCH, CLIENT_CPU, OUT, RESULTS, SERVER_CPU, WORKLOADS, display_command,  # noqa: E402
                      median, num)

ROOT = os.path.dirname(BENCH)
SIDES = ("before", "after")
REFERENCE, FLOOR = "reference", "floor"     # --floor: the C reference server, the CPython floor
BUILD = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
BUILD_TIMEOUT = 900            # seconds; the build takes well under a minute here
GIT_TIMEOUT = 120


def git(*args):
    r = run_quiet(["git", "-C", ROOT, *args], timeout=GIT_TIMEOUT)
    return r.stdout.strip() if r.returncode == 0 else None


@contextlib.contextmanager
def built_checkout(rev):
    """A detached worktree of `rev` in a temporary directory, its extension
    built; removed (worktree and directory) however the block ends."""
    tmp = tempfile.mkdtemp(prefix="forkwsgi-ab-")
    tree = os.path.join(tmp, "tree")
    try:
        r = run_quiet(["git", "-C", ROOT, "worktree", "add", "--detach", tree, rev], timeout=GIT_TIMEOUT)
        if r.returncode != 0:
            sys.exit(f"git worktree add {rev} failed:\n{r.stdout}")
        log(f"building {rev} in {tree}: {display_command(BUILD)}")
        t0 = time.monotonic()
        r = run_quiet(BUILD, cwd=tree, timeout=BUILD_TIMEOUT)
        with open(os.path.join(OUT, "ab-build.log"), "w") as f:
            f.write(r.stdout)
        if r.returncode != 0:
            sys.exit(f"building {rev} failed (bench/out/ab-build.log):\n{r.stdout[-2000:]}")
        log(f"built in {time.monotonic() - t0:.0f} s")
        yield tree
    finally:
        run_quiet(["git", "-C", ROOT, "worktree", "remove", "--force", tree], timeout=GIT_TIMEOUT)
        shutil.rmtree(tmp, ignore_errors=True)
        run_quiet(["git", "-C", ROOT, "worktree", "prune"], timeout=GIT_TIMEOUT)


def side_env(checkout):
    """The environment whose `import forkwsgi` is that checkout's (only it on PYTHONPATH)."""
    return dict(os.environ, PYTHONPATH=os.path.join(checkout, "python"))


def check_import(side, checkout, env):
    """Exit unless the extension `env` imports lives in `checkout`."""
    so = run_core.extension_path(env)
    if so is None or not os.path.realpath(so).startswith(os.path.realpath(checkout) + os.sep):
        sys.exit(f"{side}: forkwsgi with its extension does not import from {checkout}/python "
                 f"(it imports {so or 'nothing'}); build it there: {display_command(BUILD)}")


WORKERS = [1]                  # --workers, the same for every setting and side (set from the command line)


def server_argv(port, threads):
    return [*run_core.server_argv("forkwsgi", "route", port), "--workers", str(WORKERS[0]), "--threads", str(threads)]


def sides(args):
    """The servers of a round: both sides, and with --floor the C reference."""
    return SIDES + (REFERENCE,) if args.floor else SIDES


def start_pair(threads, envs, names):
    """The servers `names` for one threads setting, each on a free port and
    checked (run_core.check_server: ready, responses, keep-alive; then the
    pipelining probe). Ports are picked one after the other, each once the
    previous server listens."""
    pair = {}
    for side in names:
        port = free_port()
        argv = run_core.server_argv(REFERENCE, "route", port) if side == REFERENCE else server_argv(port, threads)
        srv = run_core.Server(f"{side} t{threads}", "route", port, os.path.join(OUT, f"ab.{side}.t{threads}.log"),
                              argv=argv, env=envs.get(side))
        facts = run_core.check_server(srv)
        if "failure" not in facts:
            facts["pipelined"] = srv.probe_pipelining()
        pair[side] = (srv, facts)
        log(f"{srv.name}: {facts['command']}" + (f": {facts['failure']}" if "failure" in facts else ""))
    return pair


def run_setting(threads, envs, workloads, args):
    """Every round of one threads setting on one pair of servers."""
    results, problems = [], []
    pair = start_pair(threads, envs, sides(args))
    try:
        for rnd in range(args.rounds):
            order = rotated(sides(args), rnd)     # before/after (/reference) rotated every round
            for workload in workloads:
                for side in order:
                    srv, facts = pair[side]
                    r = {"threads": threads, "workload": workload, "side": side, "round": rnd,
                         "server": srv.name}
                    why = run_core.skip_reason(workload, facts, rnd)
                    if why is None and srv.exited():
                        why = "server exited"
                    if why:
                        r["skipped"] = why
                    else:
                        r.update(run_core.measure(srv, workload, f"ab.{workload}.{side}.t{threads}.round{rnd + 1}",
                                                  args.duration, args.warmup, args.quiet_wait))
                    results.append(r)
                    run_core.log_cell(r, args.rounds)
            if args.floor:
                floor = run_core.measure_floor(workloads, args.quiet_wait)
                results += [{"threads": threads, "workload": w, "side": FLOOR, "round": rnd, "floor_ns": ns}
                            for w, ns in floor.items()]
    finally:
        for side, (srv, facts) in pair.items():
            crashed, code = srv.stop()
            if crashed or "failure" in facts:
                tail = srv.log_text()[-1500:]
                why = facts.get("failure") or f"server exited during the run (code {code})"
                problems.append(f"- {srv.name}: **{why}**; server log tail:\n\n```\n{tail}\n```")
    return results, problems


# ---------------------------------------------------------------- report

def round_ratios(by_round, key):
    """{round: after ÷ before} for `key`, over the rounds where both sides have it."""
    return {rnd: sides["after"][key] / sides["before"][key] for rnd, sides in sorted(by_round.items())
            if all(key in sides.get(s, {}) for s in SIDES)}


def summarize(results, threads_list, workloads):
    rows = []
    for threads in threads_list:
        for workload in workloads:
            runs = [r for r in results if r["threads"] == threads and r["workload"] == workload]
            by_round = {}
            for r in runs:
                if "rps" in r:
                    by_round.setdefault(r["round"], {})[r["side"]] = r
            row = {"threads": threads, "workload": workload,
                   "rps_ratios": round_ratios(by_round, "rps"),
                   "cpu_ratios": round_ratios(by_round, "cpu_us_per_req"),
                   "problems": sorted({r.get("skipped") or r["failure"] for r in runs
                                       if "skipped" in r or "failure" in r}),
                   "other_cpu": max([r["other_cpu_pct"] for r in runs if "rps" in r], default=float("nan"))}
            for side in SIDES:
                ok = [r for r in runs if r["side"] == side and "rps" in r]
                row[side] = {"rps": median([r["rps"] for r in ok]),
                             "cpu_us": median([r["cpu_us_per_req"] for r in ok if "cpu_us_per_req" in r]),
                             "bad": sum(r["status"] + r["errors"] for r in ok)}
            row["rps_ratio"] = median(list(row["rps_ratios"].values()))
            row["cpu_ratio"] = median(list(row["cpu_ratios"].values()))
            rows.append(row)
    return rows


def above_floor(results, threads_list, workloads):
    """--floor: per threads setting and workload, each round's CPU per
    request of both sides less the reference's less the round's CPython
    floor, in ns, and `margin` = after - before / 2 (below 0: halved)."""
    rows = []
    for threads in threads_list:
        for w in workloads:
            per = {}
            for r in results:
                if r["threads"] != threads or r["workload"] != w:
                    continue
                if r["side"] == FLOOR:
                    per.setdefault(r["round"], {})[FLOOR] = r["floor_ns"]
                elif "cpu_us_per_req" in r:
                    per.setdefault(r["round"], {})[r["side"]] = r["cpu_us_per_req"] * 1000
            rounds = {}
            for rnd, v in sorted(per.items()):
                if all(k in v for k in (*SIDES, REFERENCE, FLOOR)):
                    over = {side: v[side] - v[REFERENCE] - v[FLOOR] for side in SIDES}
                    rounds[rnd] = over | {"margin": over["after"] - over["before"] / 2,
                                          REFERENCE: v[REFERENCE], FLOOR: v[FLOOR]}
            if rounds:
                rows.append({"threads": threads, "workload": w, "rounds": rounds})
    return rows


def verdict(ci):
    if ci is None:
        return "too few rounds"
    if ci[1] < 0:
        return "**halved**"
    return "**not halved**" if ci[0] > 0 else "undecided"


def fmt_above_floor(rows, rounds):
    def cell(key, per):
        vals = [v[key] for v in per.values()]
        ci = median_ci(vals)
        return f"{median(vals):,.0f}" + (f" ({ci[0]:,.0f} to {ci[1]:,.0f})" if ci else "")
    lines = ["| workload | threads | reference ns/req | CPython floor | above the floor, before | "
             "above the floor, after | after - before / 2 | halved? |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        per = r["rounds"]
        ci = median_ci([v["margin"] for v in per.values()])
        lines.append(f"| {r['workload']} | {r['threads']} | {median([v[REFERENCE] for v in per.values()]):,.0f} | "
                     f"{median([v[FLOOR] for v in per.values()]):,.0f} | {cell('before', per)} | "
                     f"{cell('after', per)} | {cell('margin', per)} | {verdict(ci)} |")
    cols = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines += ["", f"| above the floor, ns per request | threads | side | {cols} |", "|---|---:|---|" + "---:|" * rounds]
    for r in rows:
        for side in SIDES:
            lines.append(f"| {r['workload']} | {r['threads']} | {side} | " + " | ".join(
                f"{r['rounds'][i][side]:,.0f}" if i in r["rounds"] else "—" for i in range(rounds)) + " |")
    return "\n".join(lines)


def ratio_text(median_ratio, ratios):
    if not ratios:
        return "n/a"
    vals = ratios.values()
    return f"{median_ratio:.3f} ({min(vals):.3f}–{max(vals):.3f})"


def fmt_table(rows):
    lines = ["| workload | threads | req/s before | req/s after | req/s after ÷ before (min–max) "
             "| CPU µs/req before | CPU µs/req after | CPU/req after ÷ before (min–max) "
             "| non-2xx + errors (before / after) | others' CPU % (worst cell) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b, a = r["before"], r["after"]
        note = f" ({'; '.join(r['problems'])})" if r["problems"] else ""
        lines.append(f"| {r['workload']}{note} | {r['threads']} | {num(b['rps'], ',.0f')} | {num(a['rps'], ',.0f')} | "
                     f"{ratio_text(r['rps_ratio'], r['rps_ratios'])} | {num(b['cpu_us'], '.2f')} | "
                     f"{num(a['cpu_us'], '.2f')} | {ratio_text(r['cpu_ratio'], r['cpu_ratios'])} | "
                     f"{b['bad']} / {a['bad']} | {num(r['other_cpu'], '.0f')} |")
    return "\n".join(lines)


def fmt_rounds(rows, rounds):
    """Each ratio per round: how stable it is."""
    cols = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [f"| workload | threads | after ÷ before | {cols} |", "|---|---:|---|" + "---:|" * rounds]
    for r in rows:
        for what, key in (("req/s", "rps_ratios"), ("CPU/req", "cpu_ratios")):
            cells = " | ".join(num(r[key].get(i, float("nan")), ".3f") for i in range(rounds))
            lines.append(f"| {r['workload']} | {r['threads']} | {what} | {cells} |")
    return "\n".join(lines)


def ratio_lines(rows):
    return "\n".join(f"{r['workload']}, threads {r['threads']}: req/s × {ratio_text(r['rps_ratio'], r['rps_ratios'])}, "
                     f"CPU/req × {ratio_text(r['cpu_ratio'], r['cpu_ratios'])}" for r in rows)


def write_results(title, rows, problems, ctx, args):
    facts, rev, head = ctx["facts"], ctx["rev"], ctx["head"]
    server_lines = "\n".join(f"PYTHONPATH={ctx['shown'][side]}/python taskset -c {SERVER_CPU} "
                             + display_command(server_argv("PORT", t)) for t in args.threads for side in SIDES)
    cells = "\n".join(f"- {w}: {WORKLOADS[w].desc}" for w in ctx["workloads"])
    floor_md = ""
    if args.floor:
        server_lines += f"\ntaskset -c {SERVER_CPU} " + display_command(run_core.server_argv(REFERENCE, "route", "PORT"))
        floor_md = f"""### Above the CPython floor (--floor)

Each round also measures the C reference (`bench/refserver.c`, the kernel's and a C server's share)
as a third server in the rotation, and times the CPython floor of each request on the server's CPU
(`python3 bench/run_floor.py --json --number {run_core.FLOOR_CALLS} --repeat {run_core.FLOOR_REPEAT}`:
the least environ, the app, iterating its body). "Above the floor" is a side's CPU per request less
the reference's less the floor, in ns, per round. Medians over the rounds, with a distribution-free
95 % interval for the median in brackets (order statistics). "after - before / 2" is taken per round:
when its whole interval is below 0, the after side spends at most half the before side's CPU above
the floor ("halved"); above 0, it does not; across 0, the run cannot tell.

{ctx['floor_table']}

"""
    section = f"""{title}

Run on {ctx['started']:%Y-%m-%d %H:%M} UTC by `{invocation()}` (took {ctx['elapsed'] / 60:.1f} min;
{args.rounds} round(s), {args.duration} s measured per cell after a {args.warmup} s warm-up).
Before: {rev} ({ctx['rev_full']}, "{ctx['rev_subject']}"); after: {head}.

**Machine.** nproc {facts['nproc']} ({facts['cpu']}), kernel {facts['kernel']}, \
Python {facts['python']}, {facts['wrk']}, {facts['cc']}, \
ip_local_port_range {facts['ip_local_port_range']}, tcp_tw_reuse {facts['tcp_tw_reuse']}.
Server pinned to CPU {SERVER_CPU}, wrk to CPU {CLIENT_CPU}; everything on 127.0.0.1.

**Software.** Before: forkwsgi from {ctx['software']['before']}, built by
`git worktree add --detach TMP {ctx['rev_full']}; cd TMP; {display_command(BUILD)}`
(the worktree removed afterwards). After: forkwsgi from {ctx['software']['after']}.

**Method.** Both servers serve `apps:route` (`bench/apps.py` of the after checkout), each with
PYTHONPATH set to its own checkout's python/. Per threads setting both are started once, checked
(responses, keep-alive, pipelining) and kept up for every round; a round runs each workload on
both, the order {rev} / {head} swapped every round; a cell waits (up to {args.quiet_wait:.0f} s) for
other processes to go idle, runs wrk for {args.warmup} s (discarded), then measures {args.duration} s.
Server CPU is the on-CPU time of the server's process tree over the measured run, from
/proc/PID/task/TID/schedstat. The ratios are after ÷ before within a round (a CPU/req ratio
below 1 is a saving), their median over the rounds and min–max; req/s and µs/req are medians.
Workloads:

{cells}

{run_core.commands_md(f"Server commands, run from bench/ (TMP: the worktree of {rev}; PORT: a free port):",
                      server_lines, ctx["workloads"], args.duration, args.warmup)}

### Results

Before: {rev}; after: {head}.

{fmt_table(rows)}

### Each ratio per round

{fmt_rounds(rows, args.rounds)}

{floor_md}### Problems seen

{chr(10).join(problems) if problems else 'None: every cell ran, no server failed its checks or exited early.'}
"""
    write_section(RESULTS, title, section, replaces="## A/B: ")   # the latest A/B run only


# ---------------------------------------------------------------- main

def shorten(text, limit):
    return text if len(text) <= limit else text[:limit - 1] + "…"


def threads_list(value):
    try:
        values = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"positive integers separated by commas, not {value!r}")
    return list(dict.fromkeys(values))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True, help="the git revision to compare with (the before side)")
    ap.add_argument("--threads", type=threads_list, default=[1], metavar="N[,N..]",
                    help="forkwsgi --threads settings, one pair of servers each (default 1)")
    ap.add_argument("--workers", type=int, default=1,
                    help="forkwsgi --workers for every setting (default 1; 2 or more exercise the balancer: "
                         "the scoreboard, placement at accept, kicks)")
    ap.add_argument("--workloads", metavar="W[,..]", help=f"of {', '.join(WORKLOADS)} (default all)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("--duration", type=int, default=4, help="measured seconds per cell (default 4)")
    ap.add_argument("--warmup", type=int, default=1, help="discarded warm-up seconds per cell (default 1)")
    ap.add_argument("--quiet-wait", type=float, default=15,
                    help="before each cell, wait up to this many seconds for other processes to go idle")
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s cells (smoke test)")
    ap.add_argument("--floor", action="store_true",
                    help="also run the C reference in every round and time the CPython floor: each side's CPU "
                         "above the floor, and whether after halves before's (keepalive-hello, keepalive-4k, "
                         "post-1k)")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2, 1
    if args.rounds < 1 or args.duration < 1 or args.warmup < 0:
        ap.error("--rounds and --duration must be at least 1, --warmup at least 0")
    return args


def main():
    args = parse_args()
    WORKERS[0] = args.workers
    workloads = run_core.pick("--workloads", args.workloads, list(WORKLOADS))
    for tool in ("wrk", "taskset", "git"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is required (apt-get install {'util-linux' if tool == 'taskset' else tool})")
    if (os.cpu_count() or 1) < 2:
        sys.exit(f"two CPUs are needed (server on CPU {SERVER_CPU}, wrk on CPU {CLIENT_CPU})")
    rev_full = git("rev-parse", "--verify", "--quiet", f"{args.rev}^{{commit}}")
    if not rev_full:
        sys.exit(f"--rev {args.rev}: not a commit of {ROOT}")
    head, dirty = run_core.git_state(ROOT)
    ctx = {"rev": git("rev-parse", "--short", rev_full), "rev_full": rev_full,
           "rev_subject": shorten(git("log", "-1", "--format=%s", rev_full), 100),
           "head": head + ("-dirty" if dirty else ""), "workloads": workloads,
           "started": datetime.datetime.now(datetime.timezone.utc)}
    title = f"## A/B: {ctx['rev']} → {ctx['head']}" + (f" (--workers {args.workers})" if args.workers > 1 else "")
    envs = {"after": side_env(ROOT)}
    check_import("after", ROOT, envs["after"])
    os.makedirs(OUT, exist_ok=True)
    # SIGTERM and SIGHUP unwind like Ctrl-C: servers stopped, worktree removed.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))

    t_start = time.monotonic()
    results, problems = [], []
    try:
        with built_checkout(rev_full) as tree:
            envs["before"] = side_env(tree)
            check_import("before", tree, envs["before"])
            cc = run_quiet(["cc", "--version"]).stdout.splitlines()
            ctx["facts"] = run_core.machine_facts(cc[0] if cc else "cc ?")
            ctx["software"] = {"before": run_core.forkwsgi_facts(envs["before"]),
                               "after": run_core.forkwsgi_facts(envs["after"])}
            ctx["shown"] = {"before": "TMP", "after": ".."}
            for side in SIDES:
                log(f"{side}: {ctx['software'][side]}")
            if args.floor:
                run_core.build_refserver()
            cells = len(args.threads) * args.rounds * len(workloads) * len(sides(args))
            log(f"{cells} cells of {args.warmup} + {args.duration} s: at least "
                f"{cells * (args.warmup + args.duration + 0.6) / 60:.1f} min")
            for threads in args.threads:
                r, p = run_setting(threads, envs, workloads, args)
                results += r
                problems += p
    finally:
        stop_all()
    ctx["elapsed"] = time.monotonic() - t_start

    rows = summarize(results, args.threads, workloads)
    if args.floor:
        ctx["floor_table"] = fmt_above_floor(above_floor(results, args.threads, workloads), args.rounds)
    with open(os.path.join(OUT, "ab-results.json"), "w") as f:
        json.dump({k: v for k, v in ctx.items() if k != "started"} | {"results": results}, f, indent=1)
    log(f"\n{title}\n\nbefore: {ctx['rev']} ({ctx['rev_subject']}); after: {ctx['head']}\n\n"
        + fmt_table(rows) + "\n\n"
        + fmt_rounds(rows, args.rounds) + "\n\n" + ratio_lines(rows)
        + ("\n\n" + ctx["floor_table"] if args.floor else ""))
    for p in problems:
        log(p)
    if not args.no_write:
        write_results(title, rows, problems, ctx, args)
        log(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: servers stopped, worktree removed", file=sys.stderr)
        sys.exit(130)
