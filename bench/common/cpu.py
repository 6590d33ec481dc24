"""CPU accounting: the machine's, a process's, this process's and its
children's; CpuMeter over a span; the wait for a quiet machine."""
import collections
import os
import resource
import time


def cpu_times():
    """(process time, irq+softirq time) in seconds, summed over all CPUs.

    Process time is user+nice+system; with IRQ time accounting (as here) the
    kernel's network softirq work is counted apart from any process."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system) / hz, (irq + softirq) / hz


def steal_seconds():
    """Time the hypervisor gave this VM's CPUs to others, summed over all CPUs."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[7] / os.sysconf("SC_CLK_TCK") if len(fields) > 7 else 0.0


def self_cpu_seconds():
    """CPU of this process (the Python clients' threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def children_cpu_seconds():
    """CPU of this process's reaped children (wrk and other load generators)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pid_cpu_seconds(pid):
    """utime+stime of one process (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    except (OSError, TypeError):
        return 0.0


def proc_table():
    """pid -> (ppid, CPU ticks incl. reaped children, its own CPU ticks) for
    every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]),
                                     int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                pass
    return table


class CpuSpan(collections.namedtuple("CpuSpan", "wall used others irq steal")):
    """What CpuMeter.stop() measured, in seconds: wall time, CPU of each
    part (used), of every other process (others), IRQ+softirq, steal."""

    def pct(self, seconds):
        """CPU seconds over the span as % of one CPU."""
        return 100 * seconds / self.wall


class CpuMeter:
    """CPU seconds used by named parts between start (construction) and
    stop(), and by everyone else (the machine's process time minus the parts).

        meter = CpuMeter(server=srv.cpu_seconds, client=self_cpu_seconds)
        ...load...
        span = meter.stop()     # span.used["server"], span.others, span.wall

    Each part is a function returning CPU seconds so far."""

    def __init__(self, **parts):
        self.parts = parts
        self.t0 = time.monotonic()
        self.start = {name: fn() for name, fn in parts.items()}
        (self.all0, self.irq0), self.steal0 = cpu_times(), steal_seconds()

    def stop(self):
        wall = time.monotonic() - self.t0
        used = {name: fn() - self.start[name] for name, fn in self.parts.items()}
        proc, irq = cpu_times()
        return CpuSpan(wall=wall, used=used, others=proc - self.all0 - sum(used.values()),
                       irq=irq - self.irq0, steal=steal_seconds() - self.steal0)


def wait_until_quiet(max_wait, threshold_pct=10.0):
    """Wait (at most max_wait s) until other processes use under threshold_pct
    of one CPU over a 0.5 s sample; returns (seconds waited, last busy %).
    Other jobs on this 2-core machine (test suites, builds) skew the figures."""
    t0 = time.monotonic()
    while True:
        before = cpu_times()[0]
        time.sleep(0.5)
        busy = 100 * (cpu_times()[0] - before) / 0.5
        waited = time.monotonic() - t0
        if busy < threshold_pct or waited >= max_wait:
            return waited, busy
