"""Prometheus metrics and a health check, served by the master
(--metrics ADDR): GET /metrics (text exposition format 0.0.4) and
GET /healthz (200 while a worker accepts, 503 while the server drains or
has none).

The master answers from the memory it shares with the workers (slots.py,
cserver/fw_stats.h) and its own bookkeeping, so a scrape succeeds when every
worker is busy and costs the workers nothing. Counters are the server's
since it started: the counts of workers that ended are kept (slots.fold),
so they never go back over restarts and in-place reloads.
"""
import time

from . import _forkwsgi, binding, observer, stats
from ._version import __version__
from .offload.counters import read_counters
from .slots import add_counters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labels(**kw):
    if not kw:
        return ""
    esc = {k: str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in kw.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


class _Out:
    """The exposition text, built family by family.

    family() declares a metric family (its HELP and TYPE), sample() adds a
    sample to the family it belongs to, and text() writes each family's
    HELP, TYPE and samples together, in the order the families were
    declared. Prometheus' text format needs a family's samples right after
    its TYPE line: a family split in two is read (by prometheus_client's
    parser, among others) as a typed family with no samples and a second,
    'unknown' one holding them. Building the text here, not line by line
    in exposition(), keeps that true however the samples are gathered (per
    worker, per listener, ...). A sample of no declared family, or a family
    declared twice, is a bug: it raises."""

    # A histogram's samples carry these suffixes on its name.
    HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

    def __init__(self):
        self.families = {}          # name -> [HELP line, TYPE line, samples...], in declaration order

    def family(self, name, kind, help_text):
        if name in self.families:
            raise ValueError(f"metric family {name} declared twice")
        self.families[name] = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def _family_of(self, sample_name):
        if sample_name in self.families:
            return self.families[sample_name]
        for suffix in self.HISTOGRAM_SUFFIXES:
            base = sample_name[:-len(suffix)]
            if sample_name.endswith(suffix) and self.families.get(base, ["", ""])[1].endswith(" histogram"):
                return self.families[base]
        raise ValueError(f"sample {sample_name} belongs to no declared metric family")

    def sample(self, name, value, **labels):
        self._family_of(name).append(f"{name}{_labels(**labels)} {value}")

    def histogram(self, name, help_text, buckets, total_seconds):
        """buckets: per-bucket counts (not cumulative), bounds from the core."""
        self.family(name, "histogram", help_text)
        running = 0
        for bound, n in zip(_forkwsgi.STATS_BOUNDS, buckets):
            running += n
            self.sample(f"{name}_bucket", running, le="+Inf" if bound == float("inf") else repr(bound))
        self.sample(f"{name}_sum", round(total_seconds, 6))
        self.sample(f"{name}_count", running)

    def text(self):
        return "".join(line + "\n" for lines in self.families.values() for line in lines)


def exposition(master):
    """The Prometheus text for the arbiter `master`: its families in a
    fixed order, then the app's own (prometheus_client's, --metrics)."""
    o = _Out()
    totals, live = _live_workers(master)
    _request_totals(o, totals)
    _per_worker(o, master, live)
    _worker_counts(o, master, live)
    _listen_queues(o, master)
    if master.offload:
        _offload(o, master.offload.queue)
    text = o.text()
    if master.app_metrics:
        text += master.app_metrics.exposition()      # the app's own, over every worker
    return text


def _live_workers(master):
    """(the server's counters: the ended workers' plus the live ones',
    [(worker, its counters, its app threads)] of the live workers)."""
    totals = stats.dict_copy(master.slots.retired)
    live = []
    for w in sorted(master.workers.values(), key=lambda w: (w.index, w.pid)):
        if w.slot is None:
            continue
        c = master.slots.counters(w.slot)
        add_counters(totals, c)
        threads = master.slots.threads_of(w.slot)
        live.append((w, c, threads))
    return totals, live


def _request_totals(o, totals):
    """Requests, responses and their durations, since the server started."""
    o.family("forkwsgi_info", "gauge", "The server's version.")
    o.sample("forkwsgi_info", 1, version=__version__)
    o.family("forkwsgi_requests_total", "counter", "Responses completed, since the server started.")
    o.sample("forkwsgi_requests_total", totals["requests"])
    o.family("forkwsgi_responses_total", "counter", "Responses completed, by status class.")
    for i, cls in enumerate(("other", "1xx", "2xx", "3xx", "4xx", "5xx")):
        o.sample("forkwsgi_responses_total", totals["status"][i], code=cls)
    o.family("forkwsgi_response_body_bytes_total", "counter", "Response body bytes sent.")
    o.sample("forkwsgi_response_body_bytes_total", totals["bytes_out"])
    o.family("forkwsgi_app_exceptions_total", "counter", "Calls into the app that raised or returned no valid response.")
    o.sample("forkwsgi_app_exceptions_total", totals["exceptions"])
    o.histogram("forkwsgi_request_duration_seconds",
                "From the end of the request head to the response on the wire.",
                totals["total_hist"], totals["total_us"] / 1e6)
    o.histogram("forkwsgi_app_duration_seconds", "Time inside the app, per call (the app and its response iterable).",
                totals["app_hist"], totals["app_us"] / 1e6)


def _per_worker(o, master, live):
    """What each live worker is doing now, and the requests in flight."""
    o.family("forkwsgi_requests_in_flight", "gauge", "Requests being served (in an app thread or waiting for one).")
    o.family("forkwsgi_worker_requests_in_flight", "gauge", "Requests being served, per worker.")
    o.family("forkwsgi_worker_connections", "gauge", "Connections open, per worker.")
    o.family("forkwsgi_worker_idle_connections", "gauge",
             "Kept-alive connections waiting for their next request, per worker (part of the open ones).")
    o.family("forkwsgi_worker_resident_memory_bytes", "gauge", "Resident memory of each worker.")
    o.family("forkwsgi_worker_oldest_request_seconds", "gauge", "Age of the oldest request in the app, per worker.")
    o.family("forkwsgi_worker_handoffs_total", "counter",
             "Connections handed between workers (least-busy balancing, retiring workers), per worker process.")
    o.family("forkwsgi_worker_balancer_kicks_total", "counter",
             "Wake-ups this worker sent its peers to re-check their share of new connections (least-busy).")
    o.family("forkwsgi_worker_listener_changes_total", "counter",
             "Times this worker started or stopped watching the shared listening sockets (least-busy).")
    board = _forkwsgi.sb_read(master.slots.scoreboard)
    now_ns = time.monotonic_ns()
    in_flight_total = 0
    for w, c, threads in live:
        busy = [began for _, began, _, _ in threads if began]
        n = max(board[w.slot]["inflight"], len(busy))
        in_flight_total += n
        label = {"worker": str(w.index), "pid": str(w.pid)}
        o.sample("forkwsgi_worker_requests_in_flight", n, **label)
        o.sample("forkwsgi_worker_connections", c["conns_open"], **label)
        o.sample("forkwsgi_worker_idle_connections", c["conns_idle"], **label)
        o.sample("forkwsgi_worker_resident_memory_bytes", stats.process_memory(w.pid)[0], **label)
        o.sample("forkwsgi_worker_oldest_request_seconds",
                 round((now_ns - min(busy)) / 1e9, 6) if busy else 0, **label)
        o.sample("forkwsgi_worker_handoffs_total", board[w.slot]["handed_in"], direction="in", **label)
        o.sample("forkwsgi_worker_handoffs_total", board[w.slot]["handed_out"], direction="out", **label)
        o.sample("forkwsgi_worker_balancer_kicks_total", board[w.slot]["kicks_sent"], **label)
        o.sample("forkwsgi_worker_listener_changes_total", board[w.slot]["arms"], **label)
    o.sample("forkwsgi_requests_in_flight", in_flight_total)


def _worker_counts(o, master, live):
    """How many workers there are, and how many were replaced."""
    # Two gauges, not one with a state label: the accepting workers are
    # among the alive ones, and sum() over overlapping label values would
    # count them twice.
    o.family("forkwsgi_workers", "gauge", "Workers alive (starting, serving or retiring).")
    o.sample("forkwsgi_workers", len(live))
    o.family("forkwsgi_workers_accepting", "gauge", "Workers taking new connections: ready and not retiring.")
    o.sample("forkwsgi_workers_accepting", sum(1 for w, _, _ in live if w.ready and not w.retiring and not w.old))
    o.family("forkwsgi_workers_configured", "gauge", "Workers the master keeps (--workers, SIGTTIN/TTOU).")
    o.sample("forkwsgi_workers_configured", master.num_workers)
    o.family("forkwsgi_threads_per_worker", "gauge", "App threads per worker (--threads).")
    o.sample("forkwsgi_threads_per_worker", master.threads)
    o.family("forkwsgi_worker_restarts_total", "counter", "Workers replaced, by reason.")
    for reason in ("crash", "max_requests", "max_rss", "timeout", "frozen", "reload", "app_exit", "signal"):
        o.sample("forkwsgi_worker_restarts_total", master.restarts[reason], reason=reason)
    o.family("forkwsgi_reloads_total", "counter", "Reloads in place (SIGHUP, SIGUSR2) since the first start.")
    o.sample("forkwsgi_reloads_total", master.reloads)


def _listen_queues(o, master):
    """Each listening socket's accept queue."""
    o.family("forkwsgi_listen_queue", "gauge", "Connections waiting in the kernel's accept queue.")
    o.family("forkwsgi_listen_queue_max", "gauge", "Size of the accept queue (--backlog, capped by somaxconn).")
    for s, proto in zip(master.sockets, master.protocols):
        queued, size = stats.listen_queue(s)
        name = binding.describe(s, proto)[2]
        o.sample("forkwsgi_listen_queue", queued, listener=name)
        o.sample("forkwsgi_listen_queue_max", size or master.cfg["backlog"], listener=name)


def _offload(o, q):
    """The offload queue's counters (--offload-sink)."""
    off = read_counters(q.counters, q.nslots)
    for name in ("queued", "spilled", "dropped", "bytes"):
        o.family(f"forkwsgi_offload_{name}_total", "counter", f"Offload records {name} by the workers.")
        o.sample(f"forkwsgi_offload_{name}_total", off["workers"][name])
    for name in ("delivered", "retried", "rejected", "sink_errors", "disk_errors"):
        o.family(f"forkwsgi_offload_{name}_total", "counter", f"Offload records {name} by the sibling.")
        o.sample(f"forkwsgi_offload_{name}_total", off["sibling"][name])
    o.family("forkwsgi_offload_queue_depth", "gauge", "Offload records queued, not yet taken by the sibling.")
    o.sample("forkwsgi_offload_queue_depth", off["sibling"]["queue_depth"])
    used, cap = q.usage()
    o.family("forkwsgi_offload_ring_bytes", "gauge", "Bytes of offload records in the ring, not yet journaled.")
    o.sample("forkwsgi_offload_ring_bytes", used)
    o.family("forkwsgi_offload_ring_capacity_bytes", "gauge", "Size of the offload ring.")
    o.sample("forkwsgi_offload_ring_capacity_bytes", cap)
    o.family("forkwsgi_offload_oldest_age_seconds", "gauge", "Age of the oldest record not yet delivered.")
    o.sample("forkwsgi_offload_oldest_age_seconds", off["sibling"]["oldest_age"])


def health(master):
    """/healthz: (ok, what to say). Not ok while the server stops or no
    worker accepts; ok but "degraded" while fewer workers serve than
    --workers (one died and cannot be replaced yet, say)."""
    if master.stopping:
        return False, "draining"
    serving = sum(1 for w in master.workers.values() if w.ready and not w.retiring)
    if serving == 0:
        return False, "no worker serving"
    # What the import said stays in the server's log: an exception from a
    # database or secret store often quotes a DSN or a credential.
    why = "; the app does not import (see the server's log)" if master.no_app else ""
    if serving < master.num_workers:
        return True, f"degraded: {serving} of {master.num_workers} worker(s) serving{why}"
    if master.no_app:
        return True, f"ok: {serving} worker(s) serving the code before the reload{why}"
    return True, "ok"


class MetricsServer(observer.Observer):
    """The --metrics socket: one HTTP answer per connection (then close)."""

    name = "metrics"

    def announcement(self):
        return f"Metrics at {binding.describe(self.sock)[2]}"            # HTTP: /metrics, /healthz

    def request_complete(self, request):
        return b"\r\n\r\n" in request or b"\n\n" in request

    def answer_for(self, request, master):
        parts = request.split(b"\r\n", 1)[0].split()
        method, path = (parts[0], parts[1].split(b"?")[0]) if len(parts) >= 2 else (b"", b"")
        if method not in (b"GET", b"HEAD"):
            status, body, ctype = "405 Method Not Allowed", "GET or HEAD\n", "text/plain"
        elif path == b"/metrics":
            status, body, ctype = "200 OK", exposition(master), CONTENT_TYPE
        elif path == b"/healthz":
            ok, said = health(master)
            status = "200 OK" if ok else "503 Service Unavailable"
            body, ctype = said + "\n", "text/plain"
        else:
            status, body, ctype = "404 Not Found", "/metrics or /healthz\n", "text/plain"
        data = body.encode()
        return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                f"Connection: close\r\n\r\n".encode() + (b"" if method == b"HEAD" else data))

