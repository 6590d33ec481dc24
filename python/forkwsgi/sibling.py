"""The offload sibling: takes records off the queue, journals them, delivers
them to a sink in batches, and remembers what the sink acknowledged.

Delivery is at least once. A record is in one of these places, and each
survives the death of any one process:

- the queue (a SOCK_SEQPACKET socket pair the master holds open), until the
  sibling has appended it to the journal: it peeks at a record, journals it,
  and only then takes it off the queue (a sibling killed in between journals
  it twice; the duplicate is recognised by its producer pid and sequence);
- a worker's spill file (overflow, or too large for the queue), until the
  sibling has copied it into the journal; the offset read so far is in the
  state file;
- the journal (segment files in --offload-dir), until the sink acknowledged
  it; the acknowledged position is in the state file, written atomically
  after each delivered batch, so a new sibling (after a crash, a reload, or
  the next start of the server) delivers again exactly what was not
  acknowledged.
"""
import base64
import collections
import contextlib
import errno
import fcntl
import importlib
import json
import logging
import os
import resource
import select
import signal
import socket
import struct
import time
import zlib

from . import _forkwsgi, proctitle

log = logging.getLogger("forkwsgi")

HDR = struct.Struct("<IIIIIIIIQ")        # cserver/fw_offload.h: fw_offload_hdr
MAGIC = 0x314F5746
FLAG_KEY = 1
SEGMENT_BYTES = 8 << 20                  # a journal segment is closed past this size
ROLL_DELIVERED = 1 << 20                 # no holes: a delivered segment this large is replaced
STATE = "state.fws"                      # the journal's state: two slots written in place
STATE_SLOT = 32 << 10
STATE_HDR = struct.Struct("<4sIQI")      # magic, payload length, generation, crc32 of the payload
STATE_MAGIC = b"FWS1"

Record = collections.namedtuple("Record", "topic key value ts pid seq")


class BadRecord(ValueError):
    pass


def parse(buf, off=0):
    """(Record, length) for the record at buf[off:], (None, 0) if it is not
    all there yet. Raises BadRecord for bytes that are not a record."""
    if len(buf) - off < HDR.size:
        return None, 0
    magic, total, flags, tlen, klen, vlen, pid, seq, ts = HDR.unpack_from(buf, off)
    if (magic != MAGIC or total != HDR.size + tlen + klen + vlen or flags & ~FLAG_KEY
            or (not flags & FLAG_KEY and klen) or not 0 < tlen <= 249):
        raise BadRecord("not an offload record")
    if len(buf) - off < total:
        return None, 0
    p = off + HDR.size
    topic = bytes(buf[p:p + tlen]).decode("ascii", "replace")
    p += tlen
    key = bytes(buf[p:p + klen]) if flags & FLAG_KEY else None
    p += klen
    value = bytes(buf[p:p + vlen])
    return Record(topic, key, value, ts / 1e9, pid, seq), total


def frame(rec):
    """The record's bytes in the queue's format (the inverse of parse)."""
    topic = rec.topic.encode("ascii")
    key = rec.key or b""
    flags = FLAG_KEY if rec.key is not None else 0
    total = HDR.size + len(topic) + len(key) + len(rec.value)
    return HDR.pack(MAGIC, total, flags, len(topic), len(key), len(rec.value), rec.pid, rec.seq,
                    int(rec.ts * 1e9)) + topic + key + rec.value


# ---- sinks ------------------------------------------------------------------
#
# A sink has send(batch) and, optionally, close(). batch: a list of Record.
# send returns when the sink holds every record (None), or a list of
# (index, reason) for records it refuses for good (they are set aside in
# rejected.fwo, counted and logged, never retried); it raises for a failure
# that may pass (the whole batch is retried, with back-off).

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


# ---- the journal -------------------------------------------------------------

class Journal:
    """Segment files journal-N.fwo in `directory`, plus the state: the
    acknowledged position (segment, offset) and how far each spill file was
    collected. Only the sibling writes here, one at a time.

    The disk may fill up (or fail) at any write. Every method that writes
    raises OSError and leaves things as they were: a half-written record is
    taken back, and the state is written in place, into two slots
    allocated when the file was made (the newer valid one counts), so
    saving the acknowledged position never needs a free block: delivered
    records are never sent again because the disk was full. Delivered bytes
    give their blocks back (a hole punched in the segment, or the segment
    deleted), so the journal holds about what is not yet delivered."""

    def __init__(self, directory, fsync):
        self.dir = directory
        self.fsync = fsync
        os.makedirs(directory, exist_ok=True)
        self.state = {"segment": 0, "offset": 0, "spill": {}}
        self.state_gen = 0
        self.state_fd = None
        self.state_dirty = False
        self._load_state()
        segs = self.segments()
        self.seg = max(segs) if segs else self.state["segment"]
        self.fd = self._open_segment(self.seg)
        self.size = os.fstat(self.fd).st_size
        self.dirty = False
        self.can_forget = True                # False once the file system refused to punch holes

    def seg_path(self, n):
        return os.path.join(self.dir, f"journal-{n:08d}.fwo")

    def _open_segment(self, n):
        return os.open(self.seg_path(n), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def segments(self):
        out = []
        for name in os.listdir(self.dir):
            if name.startswith("journal-") and name.endswith(".fwo"):
                try:
                    out.append(int(name[8:-4]))
                except ValueError:
                    pass
        return sorted(out)

    def roll(self):
        """Start the next segment if this one is full."""
        if self.size >= SEGMENT_BYTES:
            self._next_segment()

    def _next_segment(self):
        fd = self._open_segment(self.seg + 1)       # may fail (ENOSPC): the old one stays in use
        os.close(self.fd)
        self.fd, self.seg, self.size, self.dirty = fd, self.seg + 1, 0, False

    def append(self, data):
        """Append one framed record; returns its (segment, end offset). On a
        write error nothing of it stays and OSError is raised."""
        self.roll()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:
            self.recover()
            raise
        self.size += len(data)
        self.dirty = True
        return self.seg, self.size

    def recover(self):
        """After a failed append: the segment must end where the last whole
        record does. If the half record cannot be cut off, the next record
        goes to a new segment (a reader stops at the torn tail and moves on)."""
        with contextlib.suppress(OSError):
            if os.fstat(self.fd).st_size != self.size:
                os.ftruncate(self.fd, self.size)
            if os.fstat(self.fd).st_size != self.size:
                self._next_segment()

    def sync(self):
        if self.dirty and self.fsync != "never":
            os.fsync(self.fd)
        self.dirty = False

    def unacked(self):
        """Every journaled record after the acknowledged position, in order,
        as (Record, segment, end offset)."""
        for n in self.segments():
            if n < self.state["segment"]:
                continue
            with open(self.seg_path(n), "rb") as f:
                off = self.state["offset"] if n == self.state["segment"] else 0
                f.seek(off)                   # before it: delivered (maybe a hole)
                data = f.read()
            pos = 0
            while pos < len(data):
                try:
                    rec, size = parse(data, pos)
                except BadRecord:
                    log.error("offload journal %s is damaged at offset %d: skipping the rest of it",
                              self.seg_path(n), off + pos)
                    break
                if rec is None:
                    break             # a torn tail: the sibling died while appending
                pos += size
                yield rec, n, off + pos

    def ack(self, seg, off):
        """Everything up to (seg, off) was delivered: record it, then give
        the room it took back. OSError if the state could not be saved (it
        is saved with the next ack, or by save_state)."""
        self.state["segment"], self.state["offset"] = seg, off
        self.state_dirty = True
        self.save_state()
        # Only once the state says so: a successor must never start reading
        # inside a hole or a deleted segment.
        for n in self.segments():
            if n < seg:
                os.unlink(self.seg_path(n))
        if seg != self.seg:
            return
        if self.can_forget and not _forkwsgi.offload_forget(self.fd, off):
            self.can_forget = False           # no holes here: delivered segments go whole
        if not self.can_forget and off == self.size and self.size >= ROLL_DELIVERED:
            # All of it delivered: a successor starts after it, from the new one.
            self._next_segment()
            os.unlink(self.seg_path(seg))

    def save_state(self):
        """Write the state into the older of the two slots (in place: no new
        block needed). OSError (EIO, or ENOSPC if the file could not be made
        yet) leaves state_dirty set."""
        if self.state_fd is None:
            self.state_fd = self._make_state_file()
        payload = json.dumps(self.state, separators=(",", ":")).encode()
        if len(payload) > STATE_SLOT - STATE_HDR.size:
            # Thousands of half-collected spill files: forget the offsets of
            # some (collected again from the start: duplicates, not losses).
            log.error("offload: the journal state is too large for its slot; spill offsets are forgotten")
            spill = dict(list(self.state["spill"].items())[:STATE_SLOT // 64])
            payload = json.dumps(dict(self.state, spill=spill), separators=(",", ":")).encode()
        gen = self.state_gen + 1
        data = STATE_HDR.pack(STATE_MAGIC, len(payload), gen, zlib.crc32(payload)) + payload
        if os.pwrite(self.state_fd, data, (gen % 2) * STATE_SLOT) != len(data):
            raise OSError(errno.EIO, "short write of the journal state")
        if self.fsync != "never":
            os.fdatasync(self.state_fd)
        self.state_gen = gen
        self.state_dirty = False

    def _make_state_file(self):
        path = os.path.join(self.dir, STATE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size < 2 * STATE_SLOT:
                os.posix_fallocate(fd, 0, 2 * STATE_SLOT)
        except OSError:
            os.close(fd)
            raise
        return fd

    def _load_state(self):
        """The newer valid slot of the state file; else the JSON file of
        earlier versions; else the start."""
        path = os.path.join(self.dir, STATE)
        best = None
        if os.path.exists(path):
            self.state_fd = self._make_state_file()
            for slot in (0, 1):
                raw = os.pread(self.state_fd, STATE_SLOT, slot * STATE_SLOT)
                if len(raw) < STATE_HDR.size:
                    continue
                magic, n, gen, crc = STATE_HDR.unpack_from(raw)
                payload = raw[STATE_HDR.size:STATE_HDR.size + n]
                if magic == STATE_MAGIC and len(payload) == n and zlib.crc32(payload) == crc and \
                        (best is None or gen > best[0]):
                    best = (gen, payload)
        old = os.path.join(self.dir, "state.json")
        if best is not None:
            self.state_gen = best[0]
            self.state.update(json.loads(best[1]))
        elif os.path.exists(old):
            with open(old) as f:
                self.state.update(json.load(f))


# ---- counters ----------------------------------------------------------------
#
# Shared memory made by the master: one 64-byte block per worker slot (the
# producer counters of cserver/fw_offload.h, written by that worker), then
# one block for the sibling (SIB, written by the sibling).

COUNTER_BLOCK = 64
PRODUCER = struct.Struct("<QQQQQ")       # queued, spilled, dropped, blocked_ns, bytes
PRODUCER_NAMES = ("queued", "spilled", "dropped", "blocked_ns", "bytes")
SIB = struct.Struct("<QQQQQQQdQQQ")
SIB_NAMES = ("delivered", "retried", "in_flight", "journaled", "pending", "batches", "sink_errors",
             "oldest_ts", "rejected", "dequeued", "disk_errors")
# What a new sibling carries on from its predecessor (the rest describes now).
SIB_CUMULATIVE = ("delivered", "retried", "journaled", "batches", "sink_errors", "rejected", "dequeued",
                  "disk_errors")
SIB_BLOCKS = 2                           # the sibling's counters take two blocks

# ---- the queue and the producers' settings (for the master, or an embedded server)

def default_offload_dir():
    """Where the journal lives when --offload-dir is not given: the state
    directory systemd made for the service (StateDirectory=; the first one
    if several), else ./forkwsgi-offload."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(state, "offload") if state else "forkwsgi-offload"


def sibling_config(cfg):
    """The settings the sibling and the producers use, from the server's:
    absolute paths (the sibling may run elsewhere), the spill directory."""
    out = dict(cfg, offload_dir=os.path.abspath(cfg["offload_dir"] or default_offload_dir()))
    out["offload_spill_dir"] = os.path.join(out["offload_dir"], "spill")
    return out


def queued_record_max(cfg):
    """A buffer size that holds any record of the queue: a queued record is
    at most about the queue's size (larger ones are spilled by the producer)."""
    return min(cfg["offload_max_record"], cfg["offload_queue_bytes"] * 2) + HDR.size


def check_config(cfg):
    """Settings the sibling could not work with, as config.ConfigError (one
    line at start), plus a warning for a spill bound below the record size."""
    from .config import ConfigError
    try:
        check_sink(cfg)
    except ValueError as e:
        raise ConfigError(f"--offload-sink: {e}") from None
    if cfg["offload_max_spill"] < cfg["offload_max_record"]:
        log.warning("offload: --offload-max-spill (%d) is below --offload-max-record (%d): records too large "
                    "for the queue and the spill file are dropped", cfg["offload_max_spill"],
                    cfg["offload_max_record"])


def make_queue(cfg):
    """The queue: a SOCK_SEQPACKET pair (see cserver/fw_offload.h), (send, receive)."""
    os.makedirs(cfg["offload_spill_dir"], exist_ok=True)
    send, recv = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    want = cfg["offload_queue_bytes"]
    try:     # as root, past net.core.wmem_max
        send.setsockopt(socket.SOL_SOCKET, 32, want)      # SO_SNDBUFFORCE
    except OSError:
        send.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, want)
    return send, recv


STOP_SIGNALS = {signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT}


@contextlib.contextmanager
def stop_signals_held():
    """Around starting a sibling (fork or spawn): the child inherits the
    calling thread's mask, so a stop signal waits until the sibling has its
    own handlers (run_sibling unblocks them) instead of killing it or being
    swallowed by handlers inherited from the parent."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def close_out(recv, cfg, counters, nslots, logger):
    """The server's last step once its sibling is gone: what is still queued
    goes to a spill file for the next start, and the totals go to the log."""
    try:
        rescue_queue(recv, cfg)
    except OSError as e:
        logger.error("offload: could not move the records left in the queue to disk: %s", e)
    totals = read_counters(counters, nslots)
    logger.info("offload totals: %s", ", ".join(f"{k} {v}" for part in totals.values() for k, v in part.items()))


def rescue_queue(recv, cfg):
    """After the last sibling is gone (the server stops): records still in
    the queue would die with it, so move them to a spill file of this
    process's, which the next start collects. Returns how many."""
    recv.setblocking(False)
    path = os.path.join(cfg["offload_spill_dir"], f"spill-{os.getpid()}.fwo")
    buf = bytearray(queued_record_max(cfg))
    n, fd = 0, None
    try:
        while True:
            try:
                got = recv.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                break
            if not got:
                break
            if fd is None:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            view = memoryview(buf)[:got]
            while view:
                view = view[os.write(fd, view):]
            n += 1
        if fd is not None:
            os.fsync(fd)
    finally:
        if fd is not None:
            os.close(fd)
    if n:
        log.warning("offload: %d record(s) were still queued at exit: kept in %s for the next start", n, path)
    return n


def producer_options(cfg, send, counters, slot):
    """Keyword arguments of _forkwsgi.offload_setup for the producer in slot."""
    return {"sock": send.fileno(),
            "overflow": {"block": 0, "drop": 1, "spill": 2}[cfg["offload_overflow"]],
            "block_ms": int(cfg["offload_block_timeout"] * 1000),
            "max_record": cfg["offload_max_record"], "spill_dir": cfg["offload_spill_dir"],
            "spill_max": cfg["offload_max_spill"],
            "counters": memoryview(counters)[slot * COUNTER_BLOCK:(slot + 1) * COUNTER_BLOCK]}


# In a worker: the shared counters, for stats() (set by attach()).
_shared = None
_drops = {"last": 0.0, "count": 0}


def counters_size(nslots):
    return COUNTER_BLOCK * (nslots + SIB_BLOCKS)


def sibling_counters(buf, nslots):
    """The sibling's part of the shared counters."""
    return memoryview(buf)[nslots * COUNTER_BLOCK:(nslots + SIB_BLOCKS) * COUNTER_BLOCK]


def read_counters(buf, nslots):
    """{"workers": producer counters summed over every slot ever used,
    "sibling": the sibling's}, from the shared counters."""
    workers = dict.fromkeys(PRODUCER_NAMES, 0)
    for i in range(nslots):
        for name, v in zip(PRODUCER_NAMES, PRODUCER.unpack_from(buf, i * COUNTER_BLOCK)):
            workers[name] += v
    sib = dict(zip(SIB_NAMES, SIB.unpack_from(buf, nslots * COUNTER_BLOCK)))
    oldest = sib.pop("oldest_ts")
    sib["oldest_age"] = round(max(0.0, time.time() - oldest), 3) if oldest else 0.0
    # Records handed to the queue and not yet taken off it by a sibling.
    sib["queue_depth"] = max(0, workers["queued"] - sib.pop("dequeued"))
    return {"workers": workers, "sibling": sib}


def attach(buf, nslots):
    """Make stats() read `buf` (None: offload is off in this process)."""
    global _shared
    _shared = (buf, nslots) if buf is not None else None


def stats():
    """The offload counters of the whole server (every worker's and the
    sibling's), or None when offload is not enabled in this process:
    workers: queued, spilled, dropped, blocked_ns, bytes;
    sibling: delivered, retried, in_flight, journaled, pending (held by the
    sibling), queue_depth (records in the queue), batches, sink_errors,
    rejected (refused for good by the sink: kept in rejected.fwo),
    disk_errors (writes to --offload-dir that failed: a full disk, EIO),
    oldest_age (seconds the oldest record the sibling holds has waited).
    The sibling's totals carry on across its restarts."""
    if _shared is None:
        return None
    return read_counters(*_shared)


def on_drop(topic, err=errno.EAGAIN):
    """Called by the C producer for every record the overflow policy drops,
    with the reason (an errno): counted there; logged here, at most once a
    second with the count."""
    _drops["count"] += 1
    now = time.monotonic()
    if now - _drops["last"] >= 1.0:
        if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
            why = "no room in the queue (--offload-overflow)"
        elif err == errno.EFBIG:
            why = "the spill file is full (--offload-max-spill)"
        else:
            why = f"the spill file cannot be written ({os.strerror(err)})"
        log.warning("offload: dropped %d record(s) (topic %r last): %s", _drops["count"], topic, why)
        _drops["last"], _drops["count"] = now, 0


# ---- the sibling -------------------------------------------------------------

class Priority:
    """The sibling's share of the CPU, which it shares with request threads.

    While it keeps up, every thread of the sibling runs SCHED_IDLE: it gets
    the CPU only when no request thread wants it, and a request thread that
    wakes up preempts it at once, so offloading adds nothing to a request's
    latency. When it falls behind (the oldest record it holds waited more
    than BEHIND seconds, or records wait in the queue or spill files beyond
    what it holds: the CPU is saturated) it switches to SCHED_BATCH at
    --offload-nice and takes its fair share until it has caught up (nothing
    waits beyond it, and its oldest is under CAUGHT_UP). Leaving SCHED_IDLE needs root, CAP_SYS_NICE or RLIMIT_NICE;
    without them the sibling stays SCHED_BATCH (never preempting a request
    thread on wake-up, but taking its share all the time)."""

    BEHIND = 1.0
    CAUGHT_UP = 0.2

    def __init__(self, nice):
        self.nice = nice
        self.mode = None
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        self.can_idle = os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - nice
        self.set("idle" if self.can_idle else "share")

    def set(self, mode):
        policy = os.SCHED_IDLE if mode == "idle" else os.SCHED_BATCH
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setscheduler(int(tid), policy, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, int(tid), self.nice)    # per thread on Linux
            except OSError:
                pass
        self.mode = mode

    def update(self, lag, backlog):
        """lag: seconds the oldest record the sibling holds has waited;
        backlog: records wait beyond what it holds (queue, spill files)."""
        if not self.can_idle:
            return
        if self.mode == "idle" and (lag > self.BEHIND or backlog):
            log.info("offload: falling behind (%s): taking a share of the CPU",
                     f"a record waited {lag:.1f} s" if lag > self.BEHIND else "records wait in the queue or on disk")
            self.set("share")
        elif self.mode == "share" and lag < self.CAUGHT_UP and not backlog:
            log.info("offload: caught up: back to idle priority")
            self.set("idle")


class DiskTrouble:
    """Writes to --offload-dir that fail (a full disk, EIO). The sibling
    goes on: records stay where they wait (the queue, spill files), each
    failure is counted, logged at most once a second, and the write is tried
    again after a pause (0.1 s, doubling up to 1 s) until it works."""

    def __init__(self, stats, directory):
        self.stats = stats
        self.dir = directory
        self.since = None              # when the current run of failures began
        self.failures = 0              # in this run
        self.unlogged = 0
        self.logged_at = 0.0
        self.retry_at = 0.0

    @property
    def failing(self):
        return self.since is not None

    def wait(self):
        """Seconds until the next try (0: go ahead)."""
        return max(0.0, self.retry_at - time.monotonic())

    def failed(self, what, err):
        now = time.monotonic()
        self.stats["disk_errors"] += 1
        if self.since is None:
            self.since = now
        self.failures += 1
        self.unlogged += 1
        self.retry_at = now + min(0.1 * 2 ** min(self.failures - 1, 4), 1.0)
        if now - self.logged_at >= 1.0:
            log.error("offload: cannot write %s in %s (%s): %d failed write(s); records wait in the queue "
                      "and spill files and are journaled once there is room",
                      what, self.dir, err.strerror or err, self.unlogged)
            self.logged_at, self.unlogged = now, 0

    def ok(self):
        """A journal write worked."""
        if self.since is not None:
            log.warning("offload: %s is writable again (%d failed write(s) in %.1f s)",
                        self.dir, self.failures, time.monotonic() - self.since)
            self.since, self.failures, self.unlogged, self.retry_at = None, 0, 0, 0.0


class Sibling:
    def __init__(self, sock, cfg, counters=None, producers_alive=None, priority=None):
        self.sock = sock                  # receiving end of the queue (socket.socket)
        self.cfg = cfg
        self.counters = counters          # shared mmap region (SIB layout) or None
        self.producers_alive = producers_alive or _pid_alive
        self.rbuf = bytearray(queued_record_max(cfg))     # peeked into again and again
        self.batch_size = cfg["offload_batch"]
        self.linger = cfg["offload_linger"]
        self.spill_dir = cfg["offload_spill_dir"]
        self.journal = Journal(cfg["offload_dir"], cfg["offload_fsync"])
        self.sink = make_sink(cfg["offload_sink"], cfg, stopping=self._past_deadline)
        self.pending = collections.deque()      # (Record, segment, end offset)
        self.stop_at = None
        self.stop_reading = False
        self.stats = dict.fromkeys(SIB_NAMES, 0)
        if counters is not None:      # a replacement sibling: the totals go on
            prev = dict(zip(SIB_NAMES, SIB.unpack_from(counters, 0)))
            self.stats.update({n: prev[n] for n in SIB_CUMULATIVE})
        self.retry_at = 0.0
        self.backoff = 0.1
        self.last_journaled = None               # (pid, seq) of the newest journaled record
        self.next_spill_scan = 0.0
        self.queue_gone = False
        self.priority = priority
        self.spill_backlog = False               # records wait in spill files
        self.queue_backlog = False               # the last read stopped before the queue was empty
        self.disk = DiskTrouble(self.stats, cfg["offload_dir"])
        self.sent_direct = 0                     # delivered straight from the queue (a stop on a full disk)

    # -- reading ------------------------------------------------------------

    def resume(self):
        n = 0
        for rec, seg, off in self.journal.unacked():
            self.pending.append((rec, seg, off))
            self.last_journaled = (rec.pid, rec.seq)
            n += 1
        if n:
            log.info("offload: %d journaled record(s) not yet delivered: delivering them", n)

    def read_queue(self, limit=4096):
        """Move up to `limit` records from the queue into the journal: each
        is peeked at, appended to the journal, and only then taken off (in
        C: _forkwsgi.offload_take). Returns how many were taken.

        A stop on a full disk takes them off without journaling (pending
        with no journal position): the queue dies with the master, so the
        sink straight from memory is their only way out."""
        n = 0
        direct = self.disk.failing and self.stop_at is not None
        while n < limit:
            j = self.journal
            try:
                if not direct:
                    j.roll()
                taken, state, bad = _forkwsgi.offload_take(self.sock.fileno(), -1 if direct else j.fd, self.rbuf,
                                                           limit - n, SEGMENT_BYTES - j.size, self.last_journaled)
            except OSError as e:
                self.disk.failed("the journal", e)          # the record stays queued
                if not direct:
                    j.recover()
                break
            if bad:
                log.error("offload: dropped %d malformed record(s) from the queue", bad)
                self.stats["dequeued"] += bad
            for topic, key, value, ts, pid, seq, size, fresh in taken:
                if not fresh:                  # journaled by our predecessor, pending since resume()
                    continue
                rec = Record(topic, key, value, ts, pid, seq)
                if direct:
                    self.pending.append((rec, None, None))
                    continue
                j.size += size
                j.dirty = True
                self.pending.append((rec, j.seg, j.size))
                self.stats["journaled"] += 1
            if taken:
                self.last_journaled = taken[-1][4:6]
                if not direct:
                    self.disk.ok()
            self.stats["dequeued"] += len(taken)
            n += len(taken)
            if state == "eof" and not self.queue_gone:
                # No record is empty: every sending end is closed (the
                # process holding the queue is gone).
                log.warning("offload: the queue was closed (its holder exited): delivering what is left")
                self.queue_gone = True
            if state != "more":
                break
        return n

    SPILL_CHUNK = 8 << 20                        # bytes read from one spill file per scan

    def collect_spills(self):
        """Copy whole records from the workers' spill files into the journal,
        as far as --offload-max-pending allows (the rest waits in the file).
        Returns True if records were left waiting in a file.

        A file read to the end is deleted, also while its worker lives. The
        producer takes the file's lock for every append; the sibling takes
        it only to read a chunk and, once that chunk is journaled, to check
        that nothing came since and unlink. A producer that finds its file
        unlinked starts a new one under a new name, so the offsets kept here
        by name never meet another file."""
        try:
            names = [n for n in os.listdir(self.spill_dir) if n.startswith("spill-") and n.endswith(".fwo")]
        except FileNotFoundError:
            return False
        state = self.journal.state["spill"]
        for gone in set(state) - set(names):        # deleted, and the state not saved after
            state.pop(gone)
        left = False
        for name in names:
            if len(self.pending) >= self.cfg["offload_max_pending"] or self.disk.wait():
                return True
            try:
                pid = int(name[6:-4].split("-")[0])
            except ValueError:
                continue
            left |= self._collect_one(os.path.join(self.spill_dir, name), name, self.producers_alive(pid))
        return left

    def _collect_one(self, path, name, alive):
        done = self.journal.state["spill"].get(name, 0)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            with _Locked(fd, wait=False):             # not locked (being appended): read what is whole
                data = os.pread(fd, self.SPILL_CHUNK, done)
            off = 0
            while off < len(data) and len(self.pending) < self.cfg["offload_max_pending"]:
                try:
                    rec, size = parse(data, off)
                except BadRecord:
                    log.error("offload: spill file %s is damaged at offset %d: skipping the rest of it",
                              path, done + off)
                    off = len(data)
                    break
                if rec is None:
                    break
                try:
                    seg, end = self.journal.append(data[off:off + size])
                except OSError as e:
                    self.disk.failed("the journal", e)   # the rest waits in the spill file
                    break
                self.disk.ok()
                self.pending.append((rec, seg, end))
                self.stats["journaled"] += 1
                off += size
            if off:
                # Journaled before the file forgets them; if that cannot be
                # made sure, they are collected again (twice, never lost).
                try:
                    self.journal.sync()
                    self.journal.state["spill"][name] = done + off
                    self.journal.save_state()
                except OSError as e:
                    self.journal.state["spill"][name] = done
                    self.disk.failed("the journal state", e)
                    return True
            # Read to the end: delete it if nothing came meanwhile (checked
            # under the lock, which a live producer holds while appending).
            with _Locked(fd, wait=False) as locked:
                if (locked or not alive) and os.fstat(fd).st_size == done + off:
                    os.unlink(path)
                    deleted = True
                else:
                    deleted = False
            if deleted:
                self.journal.state["spill"].pop(name, None)
                self._save_state()
                return False
            return os.fstat(fd).st_size > done + off
        finally:
            os.close(fd)

    # -- delivering ---------------------------------------------------------

    def deliver(self, force=False):
        """Send one batch if it is full, old enough, or forced. Returns True if
        something was delivered."""
        if not self.pending or time.monotonic() < self.retry_at:
            return False
        oldest = self.pending[0][0].ts
        if not force and len(self.pending) < self.batch_size and time.time() - oldest < self.linger:
            return False
        batch = [self.pending[i] for i in range(min(self.batch_size, len(self.pending)))]
        try:
            self.journal.sync()
        except OSError as e:                     # sent all the same: the sink is what matters now
            self.disk.failed("the journal", e)
        self.stats["in_flight"] = len(batch)
        try:
            rejected = self.sink.send([r for r, _, _ in batch])
            if rejected:
                self.set_aside([(batch[i][0], reason) for i, reason in rejected])
        except SinkDiskError as e:
            # Refused records that cannot be set aside are not lost: the
            # batch is sent again (its accepted records twice).
            self.disk.failed("rejected.fwo", e.__cause__)
            self.stats["retried"] += len(batch)
            self.retry_at = time.monotonic() + max(self.disk.wait(), 0.1)
            self.stats["in_flight"] = 0
            return False
        except Exception as e:  # noqa: BLE001 - any sink failure is retried
            self.stats["sink_errors"] += 1
            self.stats["retried"] += len(batch)
            self.retry_at = time.monotonic() + self.backoff
            log.warning("offload: sink failed (%s); %d record(s) retried in %.1f s", e, len(batch), self.backoff)
            self.backoff = min(self.backoff * 2, 5.0)
            self.stats["in_flight"] = 0
            return False
        self.backoff = 0.1
        for _ in batch:
            self.pending.popleft()
        journaled = [x for x in batch if x[1] is not None]
        if journaled:
            _, seg, off = journaled[-1]
            try:
                self.journal.ack(seg, off)
            except OSError as e:                  # kept in memory; saved with the next ack
                self.disk.failed("the journal state", e)
        self.sent_direct += len(batch) - len(journaled)
        self.stats["delivered"] += len(batch)
        self.stats["batches"] += 1
        self.stats["in_flight"] = 0
        return True

    def set_aside(self, refused):
        """Records the sink refused for good: appended to rejected.fwo (the
        queue's format, so they can be replayed once the cause is fixed)."""
        path = os.path.join(self.journal.dir, "rejected.fwo")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise SinkDiskError() from e
        start = os.fstat(fd).st_size
        try:
            for rec, _ in refused:
                data = memoryview(frame(rec))
                while data:
                    data = data[os.write(fd, data):]
            if self.cfg["offload_fsync"] != "never":
                os.fsync(fd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)          # all of them or none
            raise SinkDiskError() from e
        finally:
            os.close(fd)
        self.stats["rejected"] += len(refused)
        log.error("offload: the sink refused %d record(s) for good (topic %r: %s): kept in %s",
                  len(refused), refused[0][0].topic, refused[0][1], path)

    def _save_state(self):
        try:
            self.journal.save_state()
        except OSError as e:
            self.disk.failed("the journal state", e)

    def _past_deadline(self):
        return self.stop_at is not None and time.monotonic() >= self.stop_at

    def publish(self):
        self.stats["pending"] = len(self.pending)
        self.stats["oldest_ts"] = self.pending[0][0].ts if self.pending else 0.0
        if self.counters is not None:
            SIB.pack_into(self.counters, 0, *(int(self.stats[n]) if n != "oldest_ts" else float(self.stats[n])
                                               for n in SIB_NAMES))

    # -- the loop -----------------------------------------------------------

    def request_stop(self, deadline, read=True):
        """Stop by `deadline`. read: drain the queue first (the whole server
        stops); else only deliver what was taken (a successor takes over)."""
        self.stop_at = deadline
        self.stop_reading = not read

    def run(self):
        prepare = getattr(self.sink, "prepare", None)
        if prepare:
            prepare()
        self.resume()
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while True:
            now = time.monotonic()
            if self.journal.state_dirty and not self.disk.wait():
                self._save_state()
            if now >= self.next_spill_scan and not self.disk.wait():
                self.spill_backlog = self.collect_spills()
                self.next_spill_scan = now + (0.05 if self.spill_backlog else 0.5)
            room = self.cfg["offload_max_pending"] - len(self.pending)
            self.queue_backlog = room <= 0
            # A full disk: the journal is tried again after a pause, except
            # in a stop (then records go to the sink straight from the queue).
            disk_ok = not self.disk.wait() or (self.stop_at is not None and self.disk.failing)
            if room > 0 and not self.stop_reading and disk_ok:
                limit = min(room, 4096)
                self.queue_backlog = self.read_queue(limit) >= limit
                self.publish()
                if self.queue_gone and self.stop_at is None:
                    self.request_stop(time.monotonic() + self.cfg["graceful_timeout"], read=False)
            if self.priority is not None:
                self.priority.update(time.time() - self.pending[0][0].ts if self.pending else 0.0,
                                     self.spill_backlog or self.queue_backlog)
            delivered = self.deliver(force=self.stop_at is not None)
            self.publish()
            if self.stop_at is not None:
                # Draining: read what is queued, deliver it, stop when both
                # are empty or the graceful timeout is up (what is left stays
                # journaled for the next start).
                queued = not self.stop_reading and not self.queue_gone and self._queue_has_data()
                if not self.pending and not queued or time.monotonic() >= self.stop_at:
                    break
                if not delivered and self.pending and time.monotonic() < self.retry_at:
                    time.sleep(min(0.05, max(0.0, self.retry_at - time.monotonic())))
                continue
            if self.pending:
                # A batch is forming: sleep until it is due, without waking
                # for each record that arrives meanwhile (they wait in the
                # queue and are read in one go). One wake-up per batch, not
                # per record: the request threads share the CPU with us.
                due = self.pending[0][0].ts + self.linger - time.time()
                if time.monotonic() < self.retry_at:
                    due = self.retry_at - time.monotonic()
                time.sleep(min(max(due, 0.001), 0.05 if room <= 0 else self.linger))
                continue
            if self.disk.failing:
                time.sleep(max(self.disk.wait(), 0.01))   # records wait in the queue for room
                continue
            try:
                poller.poll(500)                 # idle: the first record wakes us
            except InterruptedError:
                pass
        if not self.disk.failing:
            self.collect_spills()
        try:
            self.journal.sync()
        except OSError as e:
            self.disk.failed("the journal", e)
        if self.sent_direct:
            log.warning("offload: %d record(s) sent straight from the queue: the journal's disk was full",
                        self.sent_direct)
        left = sum(1 for _, seg, _ in self.pending if seg is not None)
        if left:
            log.warning("offload: %d record(s) not delivered before the stop: kept in %s for the next start",
                        left, self.journal.dir)
        if len(self.pending) > left:
            log.error("offload: %d record(s) taken from the queue on a full disk could not be delivered "
                      "before the stop: lost", len(self.pending) - left)
        log.info("offload: %s", ", ".join(f"{n} {self.stats[n]}" for n in SIB_NAMES if n != "oldest_ts"))
        close = getattr(self.sink, "close", None)
        if close:
            close()

    def _queue_has_data(self):
        r, _, _ = select.select([self.sock], [], [], 0)
        return bool(r)


class _Locked:
    """flock(LOCK_EX | LOCK_NB) on fd for a with-block; as the value: whether
    the lock was had (the block runs either way)."""

    def __init__(self, fd, wait=False):
        self.fd = fd
        self.flags = fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)
        self.locked = False

    def __enter__(self):
        try:
            fcntl.flock(self.fd, self.flags)
            self.locked = True
        except BlockingIOError:
            pass
        return self.locked

    def __exit__(self, *exc):
        if self.locked:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main():
    """Entry point of a sibling started as a program by an embedded server
    (offload_host.py); its settings and descriptors are in $FORKWSGI_SIBLING."""
    import mmap
    from .cli import setup_logging
    spec = json.loads(os.environ.pop("FORKWSGI_SIBLING"))
    cfg = spec["cfg"]
    setup_logging(cfg.get("log_level", "INFO"))
    counters = mmap.mmap(spec["counters_fd"], counters_size(1))
    sock = socket.socket(fileno=spec["fd"])
    run_sibling(sock, cfg, spec["parent"], counters=sibling_counters(counters, 1))


def run_sibling(sock, cfg, master_pid, counters=None):
    """Entry point in the forked sibling; never returns."""
    from .worker import _die_with_parent
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent(master_pid)
        proctitle.set("forkwsgi: offload")
        # Before the sink starts threads of its own (librdkafka's): they
        # inherit the policy and the nice level.
        priority = Priority(cfg["offload_nice"])
        sib = Sibling(sock, cfg, counters, priority=priority)

        def drain(signum, frame):
            sib.request_stop(time.monotonic() + cfg["graceful_timeout"])

        def fast(signum, frame):
            sib.request_stop(time.monotonic())

        def hand_over(signum, frame):
            sib.request_stop(time.monotonic() + cfg["graceful_timeout"], read=False)

        signal.signal(signal.SIGHUP, hand_over)
        signal.signal(signal.SIGTERM, drain)
        signal.signal(signal.SIGINT, fast)
        signal.signal(signal.SIGQUIT, fast)
        # Whoever started us blocked these until now (a stop asked for
        # during start-up waits for the handlers instead of killing us).
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        sib.run()
    except BaseException:
        log.exception("the offload sibling failed")
        code = 1
    finally:
        os._exit(code)
