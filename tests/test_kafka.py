"""The Kafka sink against a real Apache Kafka broker (scripts/kafka_broker.py
installs Kafka 4.3.1 from Maven Central and runs it single-node KRaft on
127.0.0.1). Records are read back with a real consumer.

Set FORKWSGI_NO_KAFKA=1 to leave these out on a machine without Java; they
are never skipped on their own: a broker that cannot start is a failure.
"""
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid

import pytest

from httpraw import request, wait_for

APP_MODES = ("inline",)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

if os.environ.get("FORKWSGI_NO_KAFKA") == "1":
    pytest.skip("FORKWSGI_NO_KAFKA=1", allow_module_level=True)

import kafka_broker  # noqa: E402
from confluent_kafka import Consumer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402


def free_port_pair():
    """A port p with p and p + 1 (the broker's controller) free on
    127.0.0.1, below the kernel's ephemeral range so that no client socket
    takes one meanwhile. A fixed port (19192 before) collided when two
    suite runs shared a machine (the suite and make asan-ext)."""
    for _ in range(200):
        p = random.randrange(20000, 32000)
        try:
            for q in (p, p + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        return p
    raise RuntimeError("no two consecutive free ports in 20000-32000")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    home = kafka_broker.install()
    port = int(os.environ.get("FORKWSGI_TEST_KAFKA_PORT") or free_port_pair())
    b = kafka_broker.Broker(home, str(tmp_path_factory.mktemp("kafka")), port)
    b.start(timeout=90)
    yield b
    b.stop()


@pytest.fixture
def live(broker):
    """The broker, up (a test before may have killed it)."""
    if not broker.running():
        broker.start(timeout=90)
    return broker


def get(s, path, timeout=30):
    return request(s.port, f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode(), timeout=timeout)


def emit(s, **q):
    r = get(s, "/emit?" + "&".join(f"{k}={v}" for k, v in q.items()))
    assert r.status == 200, r.body
    return json.loads(r.body)["results"]


def start(make_server, broker, tmp_path, *args, workers="2", threads="2", **kw):
    return make_server("apps:offloader", "--workers", workers, "--threads", threads,
                       "--offload-sink", f"kafka://{broker.bootstrap}",
                       "--offload-dir", str(tmp_path / "journal"), "--offload-linger", "0.02", *args, **kw)


def consume(broker, topics, want, timeout=60):
    """Every record in `topics` from the beginning, until `want` is there
    (or the timeout): a list of (topic, key, value, ts). `want` is a number
    of distinct values, or the set of values (bytes) that must all be there:
    where a topic may also hold records no client was told about (those of
    requests cut off by a kill), counting them would stop that many
    awaited records early."""
    # 16 MiB a fetch, not librdkafka's 1 MiB per partition: the topics have
    # one partition, and reading a million records back took ~8 s of
    # fetch round trips (5x less this way). A topic the sibling has not
    # created yet when this subscribes (it produces after the requests
    # return) is seen at the next metadata refresh: every 0.5 s here, not
    # librdkafka's 5 minutes (a CI run got none of a second topic in 60 s).
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "t-" + uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "max.partition.fetch.bytes": 16 << 20, "topic.metadata.refresh.interval.ms": 500})
    got, distinct = [], set()
    awaited = set(want) if isinstance(want, set) else None

    def done():
        return not awaited if awaited is not None else len(distinct) >= want

    try:
        c.subscribe(list(topics))
        end = time.monotonic() + timeout
        while time.monotonic() < end and not done():
            for m in c.consume(1000, 0.5):
                if m.error():
                    continue
                got.append((m.topic(), m.key(), m.value(), m.timestamp()[1]))
                distinct.add(m.value())
                if awaited is not None:
                    awaited.discard(m.value())
    finally:
        c.close()
    return got


def topic():
    return "t" + uuid.uuid4().hex[:12]


# --offload-kafka-producer, and what the sibling's log line says of it.
PRODUCERS = {"direct": "driven from C", "confluent": "Kafka producer: confluent-kafka's"}


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_every_record_arrives_with_key_and_timestamp(make_server, live, tmp_path, producer):
    t1, t2 = topic(), topic()                       # new topics: created on first use
    s = start(make_server, live, tmp_path, "--offload-kafka-producer", producer)
    sent = time.time()
    for i in range(20):
        assert emit(s, topic=t1, n=10, id=f"a{i}-", key=f"k{i}") == [True] * 10
        assert emit(s, topic=t2, n=5, id=f"b{i}-", size=1024) == [True] * 5
    got = consume(live, [t1, t2], 300)
    values = [m[2] for m in got]
    assert len(set(values)) == 300
    by_topic = {t: [m for m in got if m[0] == t] for t in (t1, t2)}
    assert len({m[2] for m in by_topic[t1]}) == 200 and len({m[2] for m in by_topic[t2]}) == 100
    for m in by_topic[t1]:
        i = m[2].split(b"-")[1]                    # value "<pid>-a<i>-<j>-"
        assert m[1] == b"k" + i[1:]
    assert all(m[1] is None and len(m[2]) == 1024 for m in by_topic[t2])
    assert all(abs(m[3] / 1000 - sent) < 60 for m in got)
    stats = json.loads(get(s, "/stats").body)
    assert wait_for(lambda: json.loads(get(s, "/stats").body)["sibling"]["delivered"] >= 300)
    assert stats["workers"]["queued"] == 300 and stats["workers"]["dropped"] == 0
    assert "created Kafka topic" in s.log()
    assert PRODUCERS[producer] in s.log()


def test_auto_drives_librdkafka_from_c(make_server, live, tmp_path):
    """The default producer is the direct one, on the librdkafka that
    confluent-kafka ships."""
    import confluent_kafka
    s = start(make_server, live, tmp_path, workers="1", threads="1")
    t = topic()
    assert emit(s, topic=t, n=5, id="auto-") == [True] * 5
    assert len({m[2] for m in consume(live, [t], 5)}) == 5
    version = confluent_kafka.libversion()[0]
    assert wait_for(lambda: f"Kafka producer: librdkafka {version} driven from C" in s.log())
    assert "confluent_kafka.libs/librdkafka" in s.log() or "librdkafka.so" in s.log()


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_librdkafkas_queue_full_loses_and_repeats_nothing(make_server, live, tmp_path, producer):
    """librdkafka's own queue holds 20 messages, a batch 100: the producer
    waits for room record by record, never gives up a batch half produced
    (which would repeat its first records on every retry, and never get past
    them)."""
    t = topic()
    s = start(make_server, live, tmp_path, "--offload-kafka-producer", producer, "--offload-batch", "100",
              "--offload-kafka-option", "queue.buffering.max.messages=20", workers="1", threads="1")
    for i in range(3):
        assert emit(s, topic=t, n=100, id=f"q{i}-") == [True] * 100
    got = consume(live, [t], 300, timeout=60)
    values = [m[2] for m in got]
    assert len(set(values)) == 300
    assert len(values) == 300, f"{len(values) - len(set(values))} duplicates"
    stats = json.loads(get(s, "/stats").body)["sibling"]
    assert stats["sink_errors"] == 0 and stats["retried"] == 0


def test_topics_listed_are_created_at_start(make_server, live, tmp_path):
    t1, t2 = topic(), topic()
    s = start(make_server, live, tmp_path, "--offload-kafka-topics", f"{t1},{t2}", workers="1", threads="1")
    admin = AdminClient({"bootstrap.servers": live.bootstrap})
    assert wait_for(lambda: {t1, t2} <= set(admin.list_topics(timeout=5).topics), timeout=30)
    assert s.alive()


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_record_over_the_brokers_limit_is_set_aside_not_retried(make_server, live, tmp_path, producer):
    """Kafka refuses a record over message.max.bytes (1 MB by default) for
    good: it goes to rejected.fwo, is counted and logged; the others flow."""
    t = topic()
    s = start(make_server, live, tmp_path, "--offload-max-record", "4M", "--offload-kafka-producer", producer,
              workers="1", threads="1")
    assert emit(s, topic=t, n=3, id="small") == [True] * 3
    assert emit(s, topic=t, n=1, id="huge", size=2_000_000) == [True]
    assert emit(s, topic=t, n=3, id="after") == [True] * 3
    got = consume(live, [t], 6)
    assert sorted(m[2].split(b"-")[1] for m in got) == [b"after0", b"after1", b"after2",
                                                       b"small0", b"small1", b"small2"]
    assert wait_for(lambda: json.loads(get(s, "/stats").body)["sibling"]["rejected"] == 1)
    assert (tmp_path / "journal" / "rejected.fwo").stat().st_size > 2_000_000
    assert "refused 1 record(s) for good" in s.log()


def test_sibling_sigkilled_mid_batch_loses_nothing(make_server, live, tmp_path):
    t = topic()
    s = start(make_server, live, tmp_path, "--offload-batch", "50")
    from test_offload import sibling_pid
    assert wait_for(lambda: sibling_pid(s) is not None)
    results, errors = [], []

    def load():
        try:
            for i in range(60):
                results.extend(emit(s, topic=t, n=50, id=f"r{i}-", size=200))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def sibling():
        return json.loads(get(s, "/stats").body)["sibling"]

    def mid_batch(before):
        # The sibling now running has delivered records and holds more
        # (or the load is over: then it is killed with what it holds).
        now = sibling()
        return (now["delivered"] > before and now["pending"] > 0) or not th.is_alive()

    th = threading.Thread(target=load)
    th.start()
    kills = 0
    for _ in range(3):
        before = sibling()["delivered"]
        assert wait_for(lambda: mid_batch(before), timeout=30)
        pid = sibling_pid(s)
        if pid:
            os.kill(pid, signal.SIGKILL)
            kills += 1
            assert wait_for(lambda: sibling_pid(s) not in (None, pid), timeout=20)
    th.join(120)
    assert not errors and results == [True] * 3000 and kills == 3
    got = consume(live, [t], 3000, timeout=90)
    values = [m[2] for m in got]
    assert len(set(values)) == 3000
    print(f"duplicates after 3 sibling SIGKILLs: {len(values) - len(set(values))}")


def test_sighup_and_sigterm_of_the_server_lose_nothing(make_server, live, tmp_path):
    """A rolling reload (SIGHUP) under load, then a graceful stop (SIGTERM)
    right after more records: every record is in Kafka."""
    from test_offload import sibling_pid
    t = topic()
    s = start(make_server, live, tmp_path)
    assert wait_for(lambda: sibling_pid(s) is not None)
    results = []
    for i in range(30):
        results += emit(s, topic=t, n=20, id=f"h{i}-")
        if i == 10:
            old = sibling_pid(s)
            s.signal(signal.SIGHUP)
    assert wait_for(lambda: sibling_pid(s) not in (None, old), timeout=20)
    for i in range(10):
        results += emit(s, topic=t, n=20, id=f"t{i}-")
    s.signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    assert results == [True] * 800
    got = consume(live, [t], 800, timeout=60)
    assert len({m[2] for m in got}) == 800


def test_broker_down_for_20_seconds_loses_nothing(make_server, live, tmp_path):
    """The broker is SIGKILLed; requests go on for 20 s (offload() returns at
    once); the sibling holds at most --offload-max-pending records, the rest
    wait in the queue and the spill file; the broker comes back and every
    record arrives."""
    t = topic()
    s = start(make_server, live, tmp_path, "--offload-max-pending", "300", "--offload-queue-bytes", "128K",
              "--offload-kafka-timeout", "120")
    assert emit(s, topic=t, n=10, id="before-") == [True] * 10
    assert len(consume(live, [t], 10)) >= 10
    live.kill()
    down_at = time.monotonic()
    n, worst, pending_max = 0, 0.0, 0
    while time.monotonic() - down_at < 20:
        t0 = time.monotonic()
        assert emit(s, topic=t, n=20, id=f"d{n}-", size=1024) == [True] * 20
        worst = max(worst, time.monotonic() - t0)
        stats = json.loads(get(s, "/stats").body)
        pending_max = max(pending_max, stats["sibling"]["pending"])
        n += 1
        time.sleep(0.05)
    stats = json.loads(get(s, "/stats").body)
    assert stats["sibling"]["delivered"] <= 10 + 0 and pending_max <= 300
    assert stats["workers"]["spilled"] > 0            # 128 KB of queue could not hold it all
    assert worst < 2.0                                 # requests never waited on the broker
    live.start(timeout=90)
    total = 10 + 20 * n
    got = consume(live, [t], total, timeout=120)
    values = [m[2] for m in got]
    assert len(set(values)) == total
    assert wait_for(lambda: json.loads(get(s, "/stats").body)["sibling"]["pending"] == 0, timeout=30)
    print(f"broker down 20 s: {total} records, {len(values) - len(set(values))} duplicates, "
          f"sibling pending at most {pending_max}, slowest request {worst * 1000:.0f} ms")


def test_sigterm_with_the_broker_down_keeps_records_for_the_next_start(make_server, live, tmp_path):
    t = topic()
    s = start(make_server, live, tmp_path, "--graceful-timeout", "3", workers="1", threads="1")
    assert emit(s, topic=t, n=5, id="up-") == [True] * 5
    assert len(consume(live, [t], 5)) >= 5
    live.kill()
    assert emit(s, topic=t, n=40, id="down-") == [True] * 40
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.proc.wait(20) == 0
    assert time.monotonic() - t0 < 12                  # graceful timeout, not the Kafka timeout
    assert "kept in" in s.log()
    live.start(timeout=90)
    s2 = start(make_server, live, tmp_path, workers="1", threads="1")
    got = consume(live, [t], 45, timeout=90)
    assert len({m[2] for m in got}) == 45
    assert s2.alive()


def test_sigkill_of_the_whole_group_under_load_three_times_loses_nothing(make_server, live, tmp_path):
    """Three times in a row: 4 kept-alive clients on 2 workers x 2 threads,
    records flowing to Kafka through the direct producer, then SIGKILL to
    the whole process group (every forkwsgi process at once, librdkafka's
    batches in flight included), then a start on the same --offload-dir.
    At the end every record whose request was answered 200 is in Kafka."""
    from test_offload_ring import load_then_kill_group
    t = topic()
    acked, per_round = set(), []
    for rnd in range(3):
        s = start(make_server, live, tmp_path, "--offload-kafka-topics", t, "--offload-linger", "0.05",
                  new_session=True)
        per_round.append(load_then_kill_group(s, f"r{rnd}", 2.0, acked, t))
        assert per_round[-1] > 500, (per_round, s.log()[-3000:])
    s = start(make_server, live, tmp_path, workers="1", threads="1")
    # Records of the requests each kill cut off are in Kafka too (offload()
    # had queued them) but not in `acked`: wait for the acked ones by value.
    got = consume(live, [t], {v.encode() for v in acked}, timeout=120)
    values = {m[2].decode() for m in got}
    missing = acked - values
    assert not missing, (len(missing), len(acked), len(got), sorted(missing)[:5], s.log()[-3000:])
    print(f"group SIGKILL x3 under load: {per_round} records answered per round, {len(acked)} in all, "
          f"0 missing, {len(got) - len(values)} duplicates")
