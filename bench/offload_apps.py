"""The apps of bench/run_offload.py: "hello" plus one 1 KiB record per request,
emitted five ways. Every variant is served by forkwsgi, 1 worker x 2 threads;
only the way the app emits differs.

    none        builds the record, emits nothing (the baseline; its "emit cost"
                is the floor of the timing itself: two perf_counter_ns calls)
    forkwsgi    forkwsgi.offload(topic, value): one sendmsg to the offload
                sibling (needs --offload-sink kafka://...)
    confluent   a confluent_kafka.Producer in the worker (created at the first
                request, i.e. after the fork): produce() + poll(0) per request,
                acks=all, idempotence, linger.ms=5 (as the sibling's producer)
    kafkapy     a kafka-python KafkaProducer in the worker: send() per request,
                acks="all", idempotence, linger_ms=5; its sender thread runs in
                the worker and takes the GIL
    mpqueue     multiprocessing.Queue to a sender process the worker starts at
                its first request ("spawn" context: a fresh interpreter, no
                fork of a threaded worker); q.put() per request (the queue's
                feeder thread pickles and writes in the worker); the sender
                produces with confluent-kafka like `confluent`

Each record's value is "<pid>-<n>|" padded with "x" to 1024 bytes: n counts
from 1 in each worker process, so the benchmark can check that every record
emitted arrived exactly once. The emit call is timed with perf_counter_ns and
the samples kept in a preallocated array (reservoir sampling past its size).

GET /_bench_stats (only between load runs): JSON with the number of records
emitted, emit errors, the emit-cost percentiles (ns), and the variant's own
counters; ?reset=1 also starts a new sample set.

Environment: OFFLOAD_BENCH_TOPIC (the cell's topic), OFFLOAD_BENCH_BOOTSTRAP
(host:port of the broker).
"""
import array
import atexit
import itertools
import json
import os
import queue
import random
import threading
import time

TOPIC = os.environ.get("OFFLOAD_BENCH_TOPIC", "offload-bench")
BOOTSTRAP = os.environ.get("OFFLOAD_BENCH_BOOTSTRAP", "127.0.0.1:19092")
RECORD_BYTES = 1024
PAD = b"x" * RECORD_BYTES
BODY = b"hello"
HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))]
SAMPLE_CAP = 1 << 19            # 4 MiB of int64: more than one 30 s run needs

# The same producer settings for every confluent-kafka producer here (the
# in-worker one and the mp.Queue sender), matching the offload sibling's.
CONFLUENT_CONF = {"bootstrap.servers": BOOTSTRAP, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "client.id": "bench"}


class Samples:
    """Emit-call durations in ns: the first SAMPLE_CAP kept, then reservoir
    sampling, so the percentiles stay unbiased over a long run."""

    def __init__(self):
        self.buf = array.array("q", bytes(8 * SAMPLE_CAP))
        self.slot = itertools.count()

    def add(self, ns):
        i = next(self.slot)              # atomic under the GIL
        if i < SAMPLE_CAP:
            self.buf[i] = ns
        else:
            j = random.randrange(i + 1)
            if j < SAMPLE_CAP:
                self.buf[j] = ns

    def summary(self, reset=False):
        n = int(repr(self.slot)[6:-1])          # "count(N)": N slots used
        vals = sorted(self.buf[:min(n, SAMPLE_CAP)])
        if reset:
            self.slot = itertools.count()

        def pct(q):
            return vals[min(len(vals) - 1, int(q / 100 * len(vals)))] if vals else None
        return {"n": n, "kept": len(vals), "p50": pct(50), "p90": pct(90), "p99": pct(99),
                "p999": pct(99.9), "max": vals[-1] if vals else None,
                "mean": sum(vals) / len(vals) if vals else None}


class Emitter:
    """How one variant emits a record; extra() adds its own counters to the stats."""
    name = "?"

    def emit(self, value):
        raise NotImplementedError

    def extra(self):
        return {}


class NoEmit(Emitter):
    name = "none"

    def emit(self, value):
        return True


class ForkwsgiEmit(Emitter):
    name = "forkwsgi"

    def __init__(self):
        import forkwsgi
        self.forkwsgi = forkwsgi
        self.offload = forkwsgi.offload

    def emit(self, value):
        return self.offload(TOPIC, value)      # True (queued or spilled) or False (dropped)

    def extra(self):
        return {"offload_stats": self.forkwsgi.offload_stats()}


class ConfluentEmit(Emitter):
    name = "confluent"

    def __init__(self):
        self.producer = None
        self.lock = threading.Lock()
        self.delivered = 0
        self.failed = 0
        self.buffer_full = 0
        self.first_error = None

    def _on_delivery(self, err, msg):
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1
            self.first_error = self.first_error or err.str()

    def _make(self):
        with self.lock:
            if self.producer is None:
                from confluent_kafka import Producer
                p = Producer(CONFLUENT_CONF)
                atexit.register(p.flush, 10)
                self.producer = p
        return self.producer

    def emit(self, value):
        p = self.producer or self._make()
        while True:
            try:
                p.produce(TOPIC, value, on_delivery=self._on_delivery)
                break
            except BufferError:                # librdkafka's queue is full: let it drain
                self.buffer_full += 1
                p.poll(0.05)
        p.poll(0)
        return True

    def extra(self):
        return {"delivered": self.delivered, "failed": self.failed, "buffer_full": self.buffer_full,
                "first_error": self.first_error,
                "in_queue": len(self.producer) if self.producer is not None else None}


class KafkaPythonEmit(Emitter):
    name = "kafkapy"

    def __init__(self):
        self.producer = None
        self.lock = threading.Lock()

    def _make(self):
        with self.lock:
            if self.producer is None:
                from kafka import KafkaProducer
                p = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all", enable_idempotence=True,
                                  linger_ms=5, client_id="bench")
                atexit.register(p.close, 10)
                self.producer = p
        return self.producer

    def emit(self, value):
        (self.producer or self._make()).send(TOPIC, value)
        return True

    def extra(self):
        return {"threads": threading.active_count()}


def _mp_sender(q, topic, conf, counters, parent):
    """The mp.Queue variant's sender process: queue -> confluent-kafka."""
    from confluent_kafka import Producer
    p = Producer(conf)

    def on_delivery(err, msg):
        counters[0 if err is None else 1] += 1

    while True:
        try:
            item = q.get(timeout=0.2)
        except queue.Empty:
            p.poll(0)
            if os.getppid() != parent:         # the worker is gone
                break
            continue
        if item is None:
            break
        while True:
            try:
                p.produce(topic, item, on_delivery=on_delivery)
                break
            except BufferError:
                counters[2] += 1
                p.poll(0.05)
        p.poll(0)
    p.flush(30)


class MpQueueEmit(Emitter):
    name = "mpqueue"

    def __init__(self):
        self.q = None
        self.lock = threading.Lock()

    def _make(self):
        with self.lock:
            if self.q is None:
                import multiprocessing
                ctx = multiprocessing.get_context("spawn")
                q = ctx.Queue(maxsize=100_000)
                self.counters = ctx.RawArray("q", 3)     # delivered, failed, buffer full
                self.proc = ctx.Process(target=_mp_sender, daemon=True, name="bench-mp-sender",
                                        args=(q, TOPIC, CONFLUENT_CONF, self.counters, os.getpid()))
                self.proc.start()
                self.q = q
        return self.q

    def emit(self, value):
        (self.q or self._make()).put(value)
        return True

    def extra(self):
        if self.q is None:
            return {}
        return {"sender_pid": self.proc.pid, "sender_alive": self.proc.is_alive(),
                "delivered": self.counters[0], "failed": self.counters[1],
                "buffer_full": self.counters[2]}


def make_app(emitter):
    seq = itertools.count(1)            # record numbers; next() is atomic under the GIL
    samples = Samples()
    errors = {"n": 0, "first": None}
    lock = threading.Lock()
    perf = time.perf_counter_ns

    def stats(environ, start_response):
        reset = "reset=1" in environ.get("QUERY_STRING", "")
        issued = int(repr(seq)[6:-1]) - 1          # "count(N)": N is the next number
        out = {"variant": emitter.name, "pid": os.getpid(), "topic": TOPIC,
               "issued": issued, "emitted": issued - errors["n"], "emit_errors": errors["n"],
               "first_error": errors["first"], "emit_ns": samples.summary(reset),
               **emitter.extra()}
        body = json.dumps(out).encode()
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/_bench_stats":
            return stats(environ, start_response)
        head = b"%d-%d|" % (os.getpid(), next(seq))
        value = head + PAD[len(head):]
        t0 = perf()
        try:
            ok = emitter.emit(value)
        except Exception as e:  # noqa: BLE001 - counted and reported by the benchmark
            ok = False
            errors["first"] = errors["first"] or f"{type(e).__name__}: {e}"
        samples.add(perf() - t0)
        if not ok:
            with lock:
                errors["n"] += 1
        start_response("200 OK", HEADERS)
        return [BODY]

    return app


VARIANTS = {"none": NoEmit, "forkwsgi_offload": ForkwsgiEmit, "confluent": ConfluentEmit,
            "kafkapy": KafkaPythonEmit, "mpqueue": MpQueueEmit}
_apps = {}


def __getattr__(name):
    """offload_apps:NAME builds only the app served (one sample array each)."""
    if name in VARIANTS:
        if name not in _apps:
            _apps[name] = make_app(VARIANTS[name]())
        return _apps[name]
    raise AttributeError(name)
