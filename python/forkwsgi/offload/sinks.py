"""Offload sinks: where the sibling delivers records.

A sink has send(batch) and, optionally, close(). batch: a list of Record.
send returns when the sink holds every record (None), or a list of
(index, reason) for records it refuses for good (they are set aside in
rejected.fwo, counted and logged, never retried); it raises for a failure
that may pass (the whole batch is retried, with back-off).

A sink that delivers in the background (KafkaSink) has submit(batch) and
poll(timeout) instead of send: submit hands the batch over and returns a
Ticket at once, poll serves the delivery reports, and the Ticket is done
once every record has its outcome. The sibling keeps several batches in
flight that way, so the round trip to the broker does not set its pace.

The sibling only ever calls submit and poll: make_sink wraps a sink that
has send() alone in SendSink, whose submit delivers at once (a Ticket
already done)."""
import base64
import importlib
import itertools
import json
import logging
import os
import time

from .. import _forkwsgi
from .._version import __version__

log = logging.getLogger("forkwsgi")


class SinkDiskError(Exception):
    """Records the sink refused could not be set aside (rejected.fwo): the
    cause is the OSError this is raised from."""


class SinkError(Exception):
    """The sink could not take the batch now; it is retried."""


class Ticket:
    """A batch handed to a sink: `left` records still without an outcome.
    outcome() (once done): None, or the (index, reason) of records refused
    for good; raises the failure when some record may be retried."""

    __slots__ = ("records", "left", "errors", "failure", "rejected")

    def __init__(self, records):
        self.records = records
        self.left = len(records)
        self.errors = []                   # records that failed: KafkaTicket's
        self.failure = None                # an exception for the whole batch
        self.rejected = None

    @property
    def done(self):
        return self.left <= 0

    def outcome(self):
        if self.failure is not None:
            raise self.failure
        return self.rejected

    def fail(self, exc):
        """Done: the whole batch failed with exc (it is retried)."""
        self.failure, self.left = exc, 0
        return self


class SendSink:
    """A sink that delivers in send() (jsonl, python:) seen as one that
    submits: submit calls send and returns a Ticket already done, so the
    sibling settles each batch before it hands over the next; poll has no
    reports to serve. prepare and close are the sink's own (None when it
    has none)."""

    def __init__(self, sink):
        self.sink = sink
        self.prepare = getattr(sink, "prepare", None)
        self.close = getattr(sink, "close", None)

    def submit(self, records):
        t = Ticket(records)
        try:
            t.rejected = self.sink.send(records)
        except Exception as e:  # noqa: BLE001 - any sink failure is retried
            return t.fail(e)
        t.left = 0
        return t

    def poll(self, timeout):
        """Nothing to serve: every Ticket was done in submit."""


def _text_or_b64(d, name, b):
    if b is None:
        d[name] = None
        return
    try:
        d[name] = b.decode("utf-8")
    except UnicodeDecodeError:
        d[name + "_b64"] = base64.b64encode(b).decode("ascii")


class JsonlSink:
    """jsonl:PATH: one JSON object per line (topic, key, value, ts; key and
    value as text when they are UTF-8, else key_b64 / value_b64).
    fsync: "batch" (after each batch, the default), "always" (same: a batch
    is one write), or "never" (the page cache is enough)."""

    def __init__(self, path, fsync="batch"):
        self.path = path
        self.fsync = fsync
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def send(self, batch):
        lines = []
        for r in batch:
            d = {"topic": r.topic}
            _text_or_b64(d, "key", r.key)
            _text_or_b64(d, "value", r.value)
            d["ts"] = round(r.ts, 6)
            lines.append(json.dumps(d, separators=(",", ":")))
        data = ("\n".join(lines) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
            if self.fsync != "never":
                os.fsync(self.fd)
        except OSError as e:
            raise SinkError(f"{self.path}: {e.strerror}") from None

    def close(self):
        os.close(self.fd)


class KafkaSink:
    """kafka://HOST:PORT[,HOST:PORT]: a producer with acks=all and
    idempotence. submit() produces a batch and returns its ticket; the
    ticket is done once every record has its delivery report (served by
    poll()): delivered, failed for now (SinkError: the sibling retries the
    batch; at least once, so a retry may repeat records the broker already
    has), or refused for good (returned, kept aside by the sibling). Topics
    are created when first seen (or at start, listed in
    --offload-kafka-topics) with the broker's default partitions and
    replication; when creation fails the records are produced anyway (the
    broker may create the topic itself) and creation is tried again later.

    The producer (--offload-kafka-producer): DirectProducer drives
    librdkafka from C, ConfluentProducer goes through confluent-kafka's
    Producer; both use the librdkafka confluent-kafka ships."""

    # Errors no retry can fix: the record is set aside, not retried.
    PERMANENT = {"MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE", "INVALID_MSG", "INVALID_RECORD",
                 "RECORD_LIST_TOO_LARGE", "TOPIC_AUTHORIZATION_FAILED", "TOPIC_EXCEPTION", "INVALID_TIMESTAMP",
                 "POLICY_VIOLATION", "UNSUPPORTED_FOR_MESSAGE_FORMAT", "_INVALID_ARG"}
    # Settings of the producer only; the admin client gets the rest.
    PRODUCER_ONLY = ("acks", "enable.idempotence", "linger.ms", "message.timeout.ms", "compression.",
                     "batch.", "queue.buffering.", "retries", "retry.", "delivery.", "max.in.flight")
    CREATE_RETRY = 30.0                 # seconds between attempts to create a topic that failed

    def __init__(self, brokers, cfg, stopping=lambda: False):
        kafka = import_confluent()
        from confluent_kafka import admin
        self.kafka = kafka
        self.admin_mod = admin
        self.stopping = stopping          # true when the sibling must give up waiting
        self.conf = kafka_config(brokers, cfg)
        self.kind = cfg.get("offload_kafka_producer", "auto")
        self.producer = self._new_producer()
        self.admin = admin.AdminClient({k: v for k, v in self.conf.items()
                                        if not k.startswith(self.PRODUCER_ONLY)})
        self.topics = set()               # known to exist (or left to the broker)
        self.create_after = {}            # topic -> monotonic time of the next creation attempt
        self.at_start = set(cfg.get("offload_kafka_topics") or [])

    def _new_producer(self):
        why = "--offload-kafka-producer confluent"
        if self.kind != "confluent":
            try:
                p = DirectProducer(self.conf)
                log.info("offload: Kafka producer: librdkafka %s driven from C (%s)", p.version, p.lib)
                return p
            except ValueError as e:
                if self.kind == "direct":
                    raise
                why = f"librdkafka cannot be driven from C: {e}"
                self.kind = "confluent"
        log.info("offload: Kafka producer: confluent-kafka's, librdkafka %s (%s)", self.kafka.libversion()[0], why)
        return ConfluentProducer(self.kafka, self.conf)

    def prepare(self):
        """At the sibling's start (its stop signals work by then)."""
        self.ensure_topics(self.at_start)

    def ensure_topics(self, topics):
        now = time.monotonic()
        new = {t for t in topics - self.topics if self.create_after.get(t, 0.0) <= now}
        if not new:
            return
        try:
            futures = self.admin.create_topics([self.admin_mod.NewTopic(t) for t in sorted(new)],
                                               request_timeout=5.0)
        except Exception as e:  # noqa: BLE001 - creation is a convenience; delivery goes on
            futures, failure = {}, e
            for t in new:
                self.create_after[t] = now + self.CREATE_RETRY
            log.warning("offload: could not create Kafka topics %s (%s): producing anyway", sorted(new), failure)
        for topic, fut in futures.items():
            try:
                fut.result(timeout=10)
                log.info("offload: created Kafka topic %s", topic)
            except Exception as e:  # noqa: BLE001 - KafkaException or a future that timed out
                err = e.args[0] if e.args and isinstance(e.args[0], self.kafka.KafkaError) else None
                if err is None or err.code() != self.kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                    self.create_after[topic] = now + self.CREATE_RETRY
                    log.warning("offload: Kafka topic %s not created (%s): producing anyway, creation "
                                "tried again in %.0f s", topic, err.str() if err else e, self.CREATE_RETRY)
                    continue
            self.topics.add(topic)
            self.create_after.pop(topic, None)

    def submit(self, batch):
        """Produce the batch; returns its Ticket at once. Its delivery
        reports arrive through poll(); outcome() then sorts failures: a
        refused record is returned (set aside), any other failure raises
        SinkError (the batch is retried: at least once, so a retry may repeat
        records the broker already has)."""
        fatal = self.producer.fatal()
        if fatal is not None:
            self._replace_producer(fatal)
        self.ensure_topics(self.at_start | {r.topic for r in batch})
        t = KafkaTicket(batch, self.PERMANENT)
        self.producer.produce(t)
        return t

    def poll(self, timeout):
        """Serve delivery reports, waiting up to `timeout` seconds for the first."""
        self.producer.poll(timeout)

    def _replace_producer(self, why):
        """After a fatal error (the idempotent producer lost its sequence):
        the journal still holds the batch, so drop what the old producer
        holds and start a new one."""
        log.error("offload: Kafka producer failed for good (%s): starting a new one", why)
        self.producer.close(fail=SinkError(f"producer replaced: {why}"))
        # Raises if the new one cannot start: the batch is retried, and the
        # closed producer's fatal() has this tried again then.
        self.producer = self._new_producer()

    def close(self):
        # Past the stop deadline there is no time to wait: what has no
        # delivery report stays journaled and is sent again at the next start.
        if self.stopping():
            self.producer.purge()
        left = self.producer.flush(0 if self.stopping() else 5.0)
        if left:
            log.warning("offload: %d Kafka record(s) without a delivery report at close (they stay journaled)",
                        left)
        self.producer.close()


class KafkaTicket(Ticket):
    """A Kafka batch: errors are (index or the report's message, error name,
    error text); a refusal for good is set aside, any other failure has the
    batch retried."""

    __slots__ = ("permanent",)

    def __init__(self, records, permanent):
        super().__init__(records)
        self.permanent = permanent

    def report(self, err, msg):
        """A delivery report (confluent-kafka's on_delivery)."""
        self.left -= 1
        if err is not None:
            self.errors.append((msg, err.name(), err.str()))

    def outcome(self):
        if self.failure is not None:
            raise self.failure
        failed = [text for _, name, text in self.errors if name not in self.permanent]
        if failed:
            raise SinkError(f"{len(failed)} of {len(self.records)} record(s) not acknowledged: {failed[0]}")
        named = set()
        return [(self._index(where, named), text) for where, _, text in self.errors] or None

    def _index(self, where, named):
        """The batch index of a refused record: given by the producer, else
        found from the report's message (its topic, key and value; of
        identical records, the first not yet named)."""
        if isinstance(where, int):
            return where
        for i, r in enumerate(self.records):
            if i not in named and r.topic == where.topic() and r.key == where.key() and r.value == where.value():
                named.add(i)
                return i
        raise SinkError("a refused record is not in its batch")


# librdkafka's log levels (syslog's) as logging's.
_LOG_LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR,
               4: logging.WARNING, 5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}


class DirectProducer:
    """librdkafka driven from C (_forkwsgi.KafkaProducer, cserver/fw_kafka.c):
    a batch goes to librdkafka in one C loop, its delivery reports are
    counted in C and the ticket is settled once per batch, not once per
    record. The library is the one confluent-kafka loaded (librdkafka_path).
    ValueError when it cannot be used."""

    def __init__(self, conf):
        self.lib = librdkafka_path()
        if self.lib is None:
            raise ValueError("confluent-kafka loaded no librdkafka shared library")
        # What the broker's client metrics name it (confluent-kafka's Producer
        # says confluent-kafka-python); a setting given overrides it.
        conf = dict({"client.software.name": "forkwsgi", "client.software.version": __version__}, **conf)
        self.p = _forkwsgi.KafkaProducer(self.lib, [(k, _conf_text(v)) for k, v in conf.items()])
        self.version = self.p.version
        self.open = {}                    # batch id -> KafkaTicket not yet done
        self.ids = itertools.count(1)

    def produce(self, ticket):
        if not ticket.records:
            ticket.left = 0
            return
        bid = next(self.ids)
        self.open[bid] = ticket
        try:
            self.p.produce(ticket.records, bid)
        except BaseException:
            del self.open[bid]            # its records all failed in C: nothing more comes for it
            raise

    def poll(self, timeout):
        self._settle(self.p.poll(timeout))

    def _settle(self, finished):
        for bid, errors in finished:
            t = self.open.pop(bid, None)
            if t is not None:
                t.errors, t.left = errors, 0
        lines, dropped = self.p.logs()
        for level, fac, text in lines:
            log.log(_LOG_LEVELS.get(level, logging.INFO), "offload: librdkafka %s: %s", fac, text)
        if dropped:
            log.warning("offload: %d librdkafka log line(s) dropped", dropped)

    def fatal(self):
        return self.p.fatal()

    def purge(self):
        self.p.purge()

    def flush(self, timeout):
        left, finished = self.p.flush(timeout)
        self._settle(finished)
        return left

    def close(self, fail=None):
        """Drop what librdkafka holds and end it; tickets not done fail with
        `fail` (the journal still holds their records)."""
        self.p.purge()
        self._settle(self.p.poll(0))
        for t in self.open.values():
            t.fail(fail or SinkError("the Kafka producer was closed"))
        self.open = {}
        self.p.close()


class ConfluentProducer:
    """confluent-kafka's Producer: a Python produce() call and a Python
    delivery callback per record."""

    version = None

    def __init__(self, kafka, conf):
        self.kafka = kafka
        self.fatal_err = None             # set by librdkafka's error callback (or close)
        self.open = []                    # tickets not yet done
        self.p = kafka.Producer(dict(conf, error_cb=self._on_error), logger=log)

    def _on_error(self, err):
        if err.fatal():
            self.fatal_err = err

    def produce(self, ticket):
        produce, report = self.p.produce, ticket.report
        for i, r in enumerate(ticket.records):
            while True:
                try:
                    produce(r.topic, r.value, r.key, timestamp=int(r.ts * 1000), on_delivery=report)
                    break
                except BufferError:               # librdkafka's own queue is full: let it drain
                    self.p.poll(0.05)
                except self.kafka.KafkaException as e:
                    ticket.errors.append((i, e.args[0].name(), e.args[0].str()))
                    ticket.left -= 1
                    break
        self.open.append(ticket)

    def poll(self, timeout):
        self.p.poll(timeout)
        self.open = [t for t in self.open if not t.done]

    def fatal(self):
        if self.fatal_err is None:
            return None
        return self.fatal_err if isinstance(self.fatal_err, str) else self.fatal_err.str()

    def purge(self):
        self.p.purge()

    def flush(self, timeout):
        return self.p.flush(timeout)

    def close(self, fail=None):
        self.p.purge()
        self.p.flush(0)
        for t in self.open:                   # reports this producer will never give
            if not t.done:
                t.fail(fail or SinkError("the Kafka producer was closed"))
        self.open = []
        self.fatal_err = "the producer is closed"


def _conf_text(v):
    """A librdkafka setting's value as its text (True -> "true")."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def import_confluent():
    try:
        import confluent_kafka
    except ImportError:
        raise ValueError("the kafka sink needs confluent-kafka: pip install 'forkwsgi[kafka]'") from None
    return confluent_kafka


def librdkafka_path():
    """The path of the librdkafka shared library confluent-kafka loaded into
    this process (the copy its wheel ships, or the system's it was built
    against), from /proc/self/maps; None if none is mapped."""
    import_confluent()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.rstrip("\n").split(None, 5)[5:]
            if path and os.path.basename(path[0]).startswith("librdkafka") and ".so" in path[0]:
                return path[0]
    return None


def kafka_config(brokers, cfg):
    """The librdkafka settings of the Kafka sink."""
    conf = {"bootstrap.servers": brokers, "client.id": "forkwsgi-offload", "linger.ms": 5,
            "message.timeout.ms": max(1, int(cfg.get("offload_kafka_timeout", 30.0) * 1000))}
    for opt in cfg.get("offload_kafka_option") or []:
        k, _, v = opt.partition("=")
        conf[k] = v
    conf.update({"acks": "all", "enable.idempotence": True})
    return conf


def sink_file(spec):
    """The file a jsonl:PATH sink appends to (absolute), else None."""
    kind, _, rest = spec.partition(":")
    return os.path.abspath(rest) if kind == "jsonl" and rest else None


def check_sink(cfg):
    """Fail at start, with one line, for a sink the sibling could never
    make (it would only die and be restarted forever): confluent-kafka
    missing or rejecting a setting, a jsonl file that cannot be opened.
    Raises ValueError."""
    kind, _, rest = cfg["offload_sink"].partition(":")
    if kind == "kafka":
        confluent_kafka = import_confluent()
        conf = kafka_config(rest[2:], cfg)
        try:
            confluent_kafka.Producer(conf).flush(0)
        except confluent_kafka.KafkaException as e:
            raise ValueError(f"kafka sink: {e.args[0].str()}") from None
        if cfg.get("offload_kafka_producer") == "direct":
            try:
                DirectProducer(conf).close()
            except ValueError as e:
                raise ValueError(f"kafka sink: --offload-kafka-producer direct: {e}") from None
    elif kind == "jsonl":
        path = os.path.abspath(rest)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError as e:
            raise ValueError(f"jsonl sink: cannot open {path}: {e.strerror}") from None


def make_sink(spec, cfg, stopping=lambda: False):
    """jsonl:PATH, kafka://HOSTS or python:MODULE:FACTORY (valuetypes.offload_sink validated
    the form). stopping: tells a sink that waits when to give up."""
    kind, _, rest = spec.partition(":")
    if kind == "jsonl" and rest:
        return SendSink(JsonlSink(rest, cfg.get("offload_fsync", "batch")))
    if kind == "kafka" and rest.startswith("//"):
        return KafkaSink(rest[2:], cfg, stopping)
    if kind == "python" and rest.count(":") == 1:
        mod, factory = rest.split(":")
        obj = getattr(importlib.import_module(mod), factory)()
        if not callable(getattr(obj, "send", None)):
            raise ValueError(f"{spec}: the sink has no send(batch)")
        if getattr(obj, "submit", None) is None:
            return SendSink(obj)
        if not callable(getattr(obj, "poll", None)):
            raise ValueError(f"{spec}: the sink has submit(batch) but no poll(timeout)")
        return obj
    raise ValueError(f"unknown offload sink {spec!r}: use jsonl:PATH, kafka://HOST:PORT or python:MODULE:FACTORY")
