"""Offload sinks: where the sibling delivers records.

A sink has send(batch) and, optionally, close(). batch: a list of Record.
send returns when the sink holds every record (None), or a list of
(index, reason) for records it refuses for good (they are set aside in
rejected.fwo, counted and logged, never retried); it raises for a failure
that may pass (the whole batch is retried, with back-off)."""
import base64
import importlib
import json
import logging
import os
import time

log = logging.getLogger("forkwsgi")


class SinkDiskError(Exception):
    """Records the sink refused could not be set aside (rejected.fwo): the
    cause is the OSError this is raised from."""


class SinkError(Exception):
    """The sink could not take the batch now; it is retried."""


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
    """kafka://HOST:PORT[,HOST:PORT]: a confluent-kafka producer with acks=all
    and idempotence. send() returns only when every record of the batch has
    its delivery report: delivered, failed for now (SinkError: the sibling
    retries the batch; at least once, so a retry may repeat records the
    broker already has), or refused for good (returned, kept aside by the
    sibling). Topics are created when first seen (or at start, listed in
    --offload-kafka-topics) with the broker's default partitions and
    replication; when creation fails the records are produced anyway (the
    broker may create the topic itself) and creation is tried again later."""

    # Errors no retry can fix: the record is set aside, not retried.
    PERMANENT = {"MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE", "INVALID_MSG", "INVALID_RECORD",
                 "RECORD_LIST_TOO_LARGE", "TOPIC_AUTHORIZATION_FAILED", "TOPIC_EXCEPTION", "INVALID_TIMESTAMP",
                 "POLICY_VIOLATION", "UNSUPPORTED_FOR_MESSAGE_FORMAT", "_INVALID_ARG"}
    # Settings of the producer only; the admin client gets the rest.
    PRODUCER_ONLY = ("acks", "enable.idempotence", "linger.ms", "message.timeout.ms", "compression.",
                     "batch.", "queue.buffering.", "retries", "retry.", "delivery.", "max.in.flight")
    CREATE_RETRY = 30.0                 # seconds between attempts to create a topic that failed

    def __init__(self, brokers, cfg, stopping=lambda: False):
        try:
            import confluent_kafka
            from confluent_kafka import admin
        except ImportError:
            raise ValueError("the kafka sink needs confluent-kafka: pip install 'forkwsgi[kafka]'") from None
        self.kafka = confluent_kafka
        self.admin_mod = admin
        self.stopping = stopping          # true when the sibling must give up waiting
        self.conf = kafka_config(brokers, cfg)
        self.fatal = None                 # a fatal producer error: the producer must be replaced
        self.producer = self._new_producer()
        self.admin = admin.AdminClient({k: v for k, v in self.conf.items()
                                        if not k.startswith(self.PRODUCER_ONLY)})
        self.topics = set()               # known to exist (or left to the broker)
        self.create_after = {}            # topic -> monotonic time of the next creation attempt
        self.at_start = set(cfg.get("offload_kafka_topics") or [])

    def _new_producer(self):
        def on_error(err):
            if err.fatal():
                self.fatal = err
        return self.kafka.Producer(dict(self.conf, error_cb=on_error), logger=log)

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

    def send(self, batch):
        if self.fatal is not None:
            self._replace_producer()
        self.ensure_topics(self.at_start | {r.topic for r in batch})
        left = [len(batch)]
        failed, rejected = [], []

        def report(i):
            def on_delivery(err, msg):
                left[0] -= 1
                if err is not None:
                    (rejected if err.name() in self.PERMANENT else failed).append((i, err.str()))
            return on_delivery

        for i, r in enumerate(batch):
            while True:
                try:
                    self.producer.produce(r.topic, r.value, r.key, timestamp=int(r.ts * 1000),
                                          on_delivery=report(i))
                    break
                except BufferError:               # librdkafka's own queue is full: let it drain
                    self._wait(0.05)
                except self.kafka.KafkaException as e:
                    left[0] -= 1
                    err = e.args[0]
                    (rejected if err.name() in self.PERMANENT else failed).append((i, err.str()))
                    break
        while left[0] > 0:
            self._wait(0.1)
        if failed:
            raise SinkError(f"{len(failed)} of {len(batch)} record(s) not acknowledged: {failed[0][1]}")
        return rejected or None

    def _wait(self, seconds):
        self.producer.poll(seconds)
        if self.fatal is not None:
            raise SinkError(f"fatal producer error: {self.fatal.str()}")
        if self.stopping():
            raise SinkError("stopping before every delivery report arrived")

    def _replace_producer(self):
        """After a fatal error (the idempotent producer lost its sequence):
        the journal still holds the batch, so drop what the old producer
        holds and start a new one."""
        log.error("offload: Kafka producer failed for good (%s): starting a new one", self.fatal.str())
        self.producer.purge()
        self.producer.flush(0)
        self.fatal = None
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


def kafka_config(brokers, cfg):
    """The librdkafka settings of the Kafka sink."""
    conf = {"bootstrap.servers": brokers, "client.id": "forkwsgi-offload", "linger.ms": 5,
            "message.timeout.ms": max(1, int(cfg.get("offload_kafka_timeout", 30.0) * 1000))}
    for opt in cfg.get("offload_kafka_option") or []:
        k, _, v = opt.partition("=")
        conf[k] = v
    conf.update({"acks": "all", "enable.idempotence": True})
    return conf


def check_sink(cfg):
    """Fail at start, with one line, for a sink the sibling could never
    make (it would only die and be restarted forever): confluent-kafka
    missing or rejecting a setting, a jsonl file that cannot be opened.
    Raises ValueError."""
    kind, _, rest = cfg["offload_sink"].partition(":")
    if kind == "kafka":
        try:
            import confluent_kafka
        except ImportError:
            raise ValueError("the kafka sink needs confluent-kafka: pip install 'forkwsgi[kafka]'") from None
        try:
            confluent_kafka.Producer(kafka_config(rest[2:], cfg)).flush(0)
        except confluent_kafka.KafkaException as e:
            raise ValueError(f"kafka sink: {e.args[0].str()}") from None
    elif kind == "jsonl":
        path = os.path.abspath(rest)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644))
        except OSError as e:
            raise ValueError(f"jsonl sink: cannot open {path}: {e.strerror}") from None


def make_sink(spec, cfg, stopping=lambda: False):
    """jsonl:PATH, kafka://HOSTS or python:MODULE:FACTORY (config.py validated
    the form). stopping: tells a sink that waits when to give up."""
    kind, _, rest = spec.partition(":")
    if kind == "jsonl" and rest:
        return JsonlSink(rest, cfg.get("offload_fsync", "batch"))
    if kind == "kafka" and rest.startswith("//"):
        return KafkaSink(rest[2:], cfg, stopping)
    if kind == "python" and rest.count(":") == 1:
        mod, factory = rest.split(":")
        obj = getattr(importlib.import_module(mod), factory)()
        if not callable(getattr(obj, "send", None)):
            raise ValueError(f"{spec}: the sink has no send(batch)")
        return obj
    raise ValueError(f"unknown offload sink {spec!r}: use jsonl:PATH, kafka://HOST:PORT or python:MODULE:FACTORY")
