"""What the benchmark scripts share: machine load readings and the writer of
their sections of bench/RESULTS.md."""
import os
import re
import subprocess
import time


def log(msg=""):
    print(msg, flush=True)


def run_quiet(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def apt_install(*packages):
    """Debian packages the benchmark needs (as root); what fails is logged."""
    log(f"installing with apt-get: {' '.join(packages)}")
    try:
        run_quiet(["apt-get", "update"])
        r = run_quiet(["apt-get", "install", "-y", *packages])
        if r.returncode != 0:
            log(r.stdout[-2000:])
    except OSError as e:
        log(f"apt-get unavailable: {e}")


def cpu_times():
    """(process time, irq+softirq time) in seconds, summed over all CPUs.

    Process time is user+nice+system; with IRQ time accounting (as here) the
    kernel's network softirq work is counted apart from any process."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system) / hz, (irq + softirq) / hz


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


def write_section(path, title, section):
    """Replace the section headed `title` in the Markdown file at `path` (up to
    the next "## " heading), or append it; the other sections stay as they are."""
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if not text.strip():
        text = "# forkwsgi benchmarks\n\n"
    if title in text:
        start = text.index(title)
        nxt = re.search(r"^## ", text[start + len(title):], re.M)
        end = start + len(title) + nxt.start() if nxt else len(text)
        text = text[:start] + section.rstrip() + "\n\n" + text[end:].lstrip()
    else:
        text = text.rstrip() + "\n\n" + section
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")
