"""wrk runs pinned to the client CPU, and the figures of bench/stats.lua."""
import collections
import re
import subprocess

from .base import BENCH, CLIENT_CPU, run_quiet
from .cpu import children_cpu_seconds
from .servers import pinned


def wrk_stats(output):
    """The figures of bench/stats.lua's "BENCH-STATS k=v ..." line, with
    rps and errors (socket errors of all kinds) added; None without it."""
    m = re.search(r"^BENCH-STATS (.*)$", output, re.M)
    if not m:
        return None
    stats = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    stats["rps"] = stats["requests"] / (stats["duration_us"] / 1e6)
    stats["errors"] = stats["connect"] + stats["read"] + stats["write"] + stats["timeout"]
    return stats


WrkRun = collections.namedtuple("WrkRun", "stats output cpu timed_out")


def run_wrk(args, seconds, url, script="stats.lua", cpu=CLIENT_CPU, prefix=()):
    """`wrk ARGS -dSECONDS --latency -s SCRIPT URL` pinned to `cpu` (after
    `prefix`, e.g. chrt), from bench/, bounded to seconds + 60. Returns a
    WrkRun: stats (wrk_stats(); None if wrk failed or timed out), its
    output, its CPU seconds, timed_out."""
    argv = [*prefix, *pinned(cpu, ["wrk", *args, f"-d{seconds}s", "--latency", "-s", script, url])]
    before = children_cpu_seconds()
    try:
        r = run_quiet(argv, cwd=BENCH, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return WrkRun(None, f"wrk did not finish within {seconds + 60} s", 0.0, True)
    cpu_s = children_cpu_seconds() - before
    return WrkRun(wrk_stats(r.stdout) if r.returncode == 0 else None, r.stdout, cpu_s, False)
