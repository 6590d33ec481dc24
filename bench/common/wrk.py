"""wrk runs pinned to the client CPU, and the figures of bench/stats.lua."""
import collections
import re
import subprocess

from .base import BENCH, CLIENT_CPU
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


class WrkLoad:
    """wrk running in the background (start_wrk); result() waits for it."""

    def __init__(self, argv, seconds):
        self.bound = seconds + 60
        self.cpu0 = children_cpu_seconds()
        self.proc = subprocess.Popen(argv, cwd=BENCH, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def result(self):
        """A WrkRun once wrk has finished (killed past its seconds + 60):
        stats (wrk_stats(); None if wrk failed or timed out), its output, its
        CPU seconds (with those of any child reaped meanwhile), timed_out."""
        try:
            out, _ = self.proc.communicate(timeout=self.bound)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return WrkRun(None, f"wrk did not finish within {self.bound} s", 0.0, True)
        cpu_s = children_cpu_seconds() - self.cpu0
        return WrkRun(wrk_stats(out) if self.proc.returncode == 0 else None, out, cpu_s, False)


def start_wrk(args, seconds, url, script="stats.lua", cpu=CLIENT_CPU, prefix=()):
    """`wrk ARGS -dSECONDS --latency -s SCRIPT URL` (script None: neither
    --latency nor -s) pinned to `cpu` (after `prefix`, e.g. chrt), from
    bench/, started in the background: a WrkLoad, whose result() waits."""
    extra = ["--latency", "-s", script] if script else []
    return WrkLoad([*prefix, *pinned(cpu, ["wrk", *args, f"-d{seconds}s", *extra, url])], seconds)


def run_wrk(args, seconds, url, script="stats.lua", cpu=CLIENT_CPU, prefix=()):
    """start_wrk(...).result(): wrk run to its end, bounded to seconds + 60."""
    return start_wrk(args, seconds, url, script, cpu, prefix).result()
