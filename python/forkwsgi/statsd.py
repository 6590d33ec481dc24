"""gunicorn's statsd metrics (--statsd-host, --statsd-prefix,
--dogstatsd-tags), with gunicorn's names and forms.

gunicorn's workers send one datagram per metric per request. Here the
master sends them, once a second, from the counters the workers keep
anyway in memory shared with it (slots.py, cserver/fw_stats.h): nothing is
added to the request path, and a statsd that is slow or gone costs a
request nothing. What is sent, each line PREFIX + name ... + |#TAGS:

- gunicorn.requests:N|c|@1.0: responses completed since the last send
  (gunicorn sends :1 per request; a counter adds them up the same).
- gunicorn.request.status.NNN:N|c|@1.0: the same, by status code.
- gunicorn.workers:N|g: worker processes, when their number changes.
- gunicorn.request.duration:MS|ms: one sample per request, as gunicorn's,
  but the workers keep a histogram of durations, not each one: a request's
  sample is the bucket it fell in (duration_samples()), so percentiles are
  as fine as the buckets (0.1 ms to 30 s), and the values are scaled
  toward the measured total so the mean is right. Past MAX_TIMERS samples
  in a second, each bucket sends a share of its samples with a sample
  rate (|@0.25) that statsd counts back up.
- gunicorn.log.critical, .error, .warning, .exception:1|c|@1.0: sent by
  the process that logs the line (LogCounter), as gunicorn's are.

Lines go out packed into datagrams of at most DATAGRAM bytes, one line per
metric separated by newlines (statsd, the Datadog agent, Telegraf and
statsd_exporter read them so), on a non-blocking socket: a send that fails
is counted and dropped, never retried and never waited for.
"""
import logging
import math
import socket
import threading
import time

from . import _forkwsgi
from .slots import add_counters, empty_totals, totals_from_state

INTERVAL = 1.0
MAX_TIMERS = 1000
DATAGRAM = 1432            # fits an Ethernet MTU with IPv6 and UDP headers
RETRY = 30.0               # seconds between attempts to reach an address that did not resolve


def prefix_of(prefix):
    """gunicorn's: a prefix ends in exactly one '.'; none stays none."""
    p = prefix.rstrip(".")
    return p + "." if p else ""


def open_socket(addr):
    """A non-blocking datagram socket connected to addr ("unix:PATH" or
    "HOST:PORT", as config checked it). OSError if it cannot be."""
    if addr.startswith("unix:"):
        family, target = socket.AF_UNIX, addr[5:]
    else:
        host, _, port = addr.rpartition(":")
        info = socket.getaddrinfo(host.strip("[]"), int(port), 0, socket.SOCK_DGRAM)[0]
        family, target = info[0], info[4]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.connect(target)
    except OSError:
        sock.close()
        raise
    return sock


def duration_samples(hist, total_us):
    """[(milliseconds, requests)] for a histogram of request durations
    (counts per bucket, bounds _forkwsgi.STATS_BOUNDS) whose durations sum
    to total_us. Each bucket's value starts at its middle (its lower bound
    for the last, open one) and all are scaled by one factor so that their
    sum is the measured total, each kept within its own bucket."""
    highs = [b * 1e6 for b in _forkwsgi.STATS_BOUNDS]
    lows = [0.0] + highs[:-1]
    middles = [lo if math.isinf(hi) else (lo + hi) / 2 for lo, hi in zip(lows, highs)]
    guess = sum(n * m for n, m in zip(hist, middles))
    scale = total_us / guess if guess > 0 and total_us > 0 else 1.0
    return [(min(max(m * scale, lo), hi) / 1000.0, n)
            for n, lo, hi, m in zip(hist, lows, highs, middles) if n > 0]


def sampled(samples, limit=MAX_TIMERS):
    """[(milliseconds, lines to send, sample rate)]: every sample while
    there are at most `limit`; past it, each bucket sends its share of
    `limit` (one at least) with the rate that counts it back to its total."""
    total = sum(n for _, n in samples)
    if total <= limit:
        return [(ms, n, 1.0) for ms, n in samples]
    out = []
    for ms, n in samples:
        k = max(1, round(n * limit / total))
        out.append((ms, k, k / n))
    return out


def packed(lines, size=DATAGRAM):
    """Lines joined by newlines into datagrams of at most `size` bytes."""
    out, cur = [], b""
    for line in lines:
        b = line.encode("ascii", "replace")
        if cur and len(cur) + 1 + len(b) > size:
            out.append(cur)
            cur = b""
        cur = cur + b"\n" + b if cur else b
    if cur:
        out.append(cur)
    return out


class Statsd:
    """The master's sender. flush(master) sends what the workers counted
    since the last one; LogCounter sends the log lines' counts (in any
    process: the workers inherit it)."""

    def __init__(self, cfg, logger, sent=None):
        self.addr = cfg["statsd_host"]
        self.prefix = prefix_of(cfg["statsd_prefix"] or "")
        self.tags = "|#" + cfg["dogstatsd_tags"] if cfg["dogstatsd_tags"] else ""
        self.log = logger
        # What was sent so far (the server's totals then): an in-place
        # reload carries it, so nothing is sent twice.
        self.sent = totals_from_state(sent) if sent is not None else None
        self.workers = None          # the last gauge sent
        self.next_at = 0.0
        self.sock = None
        self.ready = None            # a socket a lookup aside has made (_connect_aside)
        self.connecting = False
        self.retry_at = 0.0
        self.failed = 0              # datagrams that could not be sent
        self._connect(quiet=False)

    def announcement(self):
        return f"statsd: gunicorn's metrics to {self.addr} every {INTERVAL:g} s (prefix {self.prefix!r}" \
               f"{', tags ' + self.tags[2:] if self.tags else ''})"

    def _connect(self, quiet=True):
        try:
            self.sock = open_socket(self.addr)
        except (OSError, UnicodeError) as e:
            self.retry_at = time.monotonic() + RETRY
            if not quiet:
                self.log.warning("statsd %s: %s; tried again every %g s", self.addr, e.strerror or e, RETRY)

    def _connect_aside(self):
        """Try again on a thread of its own: a name lookup may take seconds
        (a DNS server that does not answer), which the master's loop must
        never wait for. The socket is taken up at a later flush."""
        self.retry_at = time.monotonic() + RETRY
        if self.connecting:
            return
        self.connecting = True

        def attempt():
            try:
                self.ready = open_socket(self.addr)
            except (OSError, UnicodeError):
                pass
            finally:
                self.connecting = False
        threading.Thread(target=attempt, name="forkwsgi statsd lookup", daemon=True).start()

    def line(self, name, value, kind, rate=None):
        return f"{self.prefix}{name}:{value}|{kind}" + (f"|@{round(rate, 6)}" if rate is not None else "") + self.tags

    def send(self, lines):
        sock = self.sock
        if sock is None:
            return
        for datagram in packed(lines):
            try:
                sock.send(datagram)
            except OSError:
                # A full buffer, nobody listening (ICMP refused), a unix
                # peer gone: dropped, counted; never waited for.
                self.failed += 1

    # ---- the master's side --------------------------------------------------

    def tick(self, master):
        """From the master's loop: a send once a second."""
        now = time.monotonic()
        if now >= self.next_at:
            self.next_at = now + INTERVAL
            self.flush(master)

    def flush(self, master, gauge=True):
        """Send what changed. gauge=False: not the number of workers (at
        the stop, when none is left: gunicorn sends no 0 either)."""
        if self.sock is None:
            self.sock, self.ready = self.ready, None
        if self.sock is None and time.monotonic() >= self.retry_at:
            self._connect_aside()
        totals = current_totals(master)
        if self.sent is None:           # started now: count from here
            self.sent = totals
        lines = self.lines(totals, len(master.workers) if gauge else self.workers)
        self.sent = totals
        self.send(lines)

    def lines(self, totals, workers):
        """The lines for what changed since self.sent."""
        out = []
        if workers != self.workers:
            self.workers = workers
            out.append(self.line("gunicorn.workers", workers, "g"))
        # Each count on its own: a worker counts a request, its status and
        # its duration one after the other, and a flush may read between
        # them; what it did not see yet goes with the next one (self.sent
        # moves to these totals whatever changed).
        sent = self.sent
        n = totals["requests"] - sent["requests"]
        if n > 0:
            out.append(self.line("gunicorn.requests", n, "c", 1.0))
        for code, count in sorted(totals["codes"].items()):
            d = count - sent["codes"].get(code, 0)
            if d > 0:
                out.append(self.line(f"gunicorn.request.status.{code}", d, "c", 1.0))
        hist = [max(0, a - b) for a, b in zip(totals["total_hist"], sent["total_hist"])]
        for ms, k, rate in sampled(duration_samples(hist, totals["total_us"] - sent["total_us"])):
            one = self.line("gunicorn.request.duration", f"{ms:.3f}", "ms", rate if rate < 1.0 else None)
            out += [one] * k
        return out


def current_totals(master):
    """The server's counters since the start: of the workers that ended,
    and of those alive now (as --stats and --metrics count them)."""
    totals = add_counters(empty_totals(), master.slots.retired)
    for w in master.workers.values():
        if w.slot is not None:
            add_counters(totals, master.slots.counters(w.slot))
    return totals


class LogCounter(logging.Handler):
    """gunicorn's gunicorn.log.* counters: one line per warning, error,
    exception (an error with a traceback) and critical line the server
    logs."""

    NAMES = {logging.WARNING: "warning", logging.ERROR: "error", logging.CRITICAL: "critical"}

    def __init__(self, client):
        super().__init__(logging.WARNING)
        self.client = client

    def emit(self, record):
        kind = "exception" if record.levelno == logging.ERROR and record.exc_info else \
            self.NAMES.get(record.levelno)
        if kind:
            self.client.send([self.client.line(f"gunicorn.log.{kind}", 1, "c", 1.0)])
