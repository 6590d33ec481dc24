"""The sections of bench/RESULTS.md (each benchmark's latest run) and the
history they move to when replaced (bench/HISTORY.md)."""
import math
import os
import re
import time


HISTORY_HEAD = """# forkwsgi benchmark history

Runs that a newer run of the same benchmark replaced in RESULTS.md, and the
hand-written notes on runs, newest first; each heading starts with the date
(UTC) of the run it is about.

"""


def _heading_span(text, prefix):
    """(start, end) of the section whose "## " heading starts with `prefix`
    (up to the next "## " heading), or None."""
    m = re.search(r"^" + re.escape(prefix), text, re.M)
    if not m:
        return None
    nxt = re.search(r"^## ", text[m.end():], re.M)
    return m.start(), (m.end() + nxt.start() if nxt else len(text))


def _insert_by_date(text, entry, date):
    """`text` (a history file) with `entry` put before the first "## "
    heading older than `date` ("YYYY-MM-DD HH:MM"; headings compared by the
    date they start with), so the file stays newest first."""
    for m in re.finditer(r"^## (\d{4}-\d\d-\d\d(?: \d\d:\d\d)?)", text, re.M):
        if m.group(1) < date:
            return text[:m.start()] + entry + text[m.start():]
    return text.rstrip() + "\n\n" + entry


def _to_history(history_path, old):
    """Put a replaced section in the history file at its date (newest first),
    its heading prefixed with the date of the run it shows."""
    when = re.search(r"Run on (\d{4}-\d\d-\d\d \d\d:\d\d) UTC", old)
    date = when.group(1) if when else time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    entry = "## " + date + " · " + old.strip()[3:] + "\n\n"
    text = HISTORY_HEAD
    if os.path.exists(history_path):
        with open(history_path) as f:
            text = f.read() or HISTORY_HEAD
    text = _insert_by_date(text, entry, date)
    with open(history_path, "w") as f:
        f.write(text.rstrip() + "\n")


def write_section(path, title, section, replaces=None):
    """Put `section` (headed `title`) in the Markdown file at `path` in place
    of the section whose heading starts with `replaces` (default: `title`), or
    append it; the other sections stay as they are. The section replaced
    moves to HISTORY.md beside `path` (at its date), so RESULTS.md holds each
    benchmark's latest run and no run is lost."""
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if not text.strip():
        text = "# forkwsgi benchmarks\n\n"
    span = _heading_span(text, replaces or title)
    if span:
        start, end = span
        _to_history(os.path.join(os.path.dirname(os.path.abspath(path)), "HISTORY.md"), text[start:end])
        text = text[:start] + section.rstrip() + "\n\n" + text[end:].lstrip()
    else:
        text = text.rstrip() + "\n\n" + section
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")


def median_ci(values, level=0.95):
    """A distribution-free interval for the median of `values`: the order
    statistics k and n-k+1, k the largest with P(Binom(n, 1/2) < k) within
    (1 - level) / 2. None with fewer than 6 values (no such k)."""
    xs, n = sorted(values), len(values)
    k, tail = 0, 0.0
    while k < n:
        p = math.comb(n, k) / 2 ** n
        if tail + p > (1 - level) / 2:
            break
        tail, k = tail + p, k + 1
    return (xs[k - 1], xs[n - k]) if k else None
