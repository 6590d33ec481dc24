#!/usr/bin/env python3
"""Offload benchmark: one 1 KiB record per request to Kafka, five ways.

    python3 bench/run_offload.py            # full run: 3 interleaved rounds (~25 min)
    python3 bench/run_offload.py --quick    # 1 round of 5 s loads (~3 min)

A hello app that emits one 1 KiB record per request, served by forkwsgi with
1 worker x 2 threads in every variant (the server is the constant, only how
the app emits differs; the apps are in bench/offload_apps.py):

    no offload            the record is built, not emitted (the baseline)
    forkwsgi.offload      forkwsgi.offload() -> the offload sibling -> Kafka
    confluent in-worker   a confluent-kafka Producer in the worker
    kafka-python in-worker  a kafka-python KafkaProducer in the worker
    mp.Queue sibling      multiprocessing.Queue -> a process the worker starts,
                          which produces with confluent-kafka

Each cell (one variant, one round) starts a fresh server pinned to CPU 0 and
a fresh topic, checks the variant (20 requests answered "hello", their 20
records in Kafka with the expected ids), then measures
  fixed rate  bench/openloop.c (built into bench/out/): open loop at --rate
              req/s for --duration s on kept-alive connections, latency from
              each request's scheduled send time (no coordinated omission)
  saturation  wrk -t1 -c8 for --duration s (closed loop), wrk's latency
              percentiles (bench/stats.lua adds p99.9)
each after a discarded warm-up, and after each load: the app's emit-call
timings (GET /_bench_stats, only between loads), the time until every record
emitted is in Kafka (high watermark), and at the end of the cell a full read
of the topic: every record id the worker emitted must be there (missing) and
once (duplicates). Load generators are pinned to CPU 1 at SCHED_FIFO priority
(--client-prio); the broker runs on CPU 1 too (--broker-cpu; bench/README.md
says why: on CPU 0 it takes the server's CPU). Rounds visit the variants in a
rotated order; the tables give per-metric medians over the rounds.

Needs Java 17+ and Maven for the broker (scripts/kafka_broker.py), wrk (apt),
a C compiler. Creates bench/.venv if missing and installs the pinned
confluent-kafka, kafka-python and setproctitle there; forkwsgi comes from this
checkout through a .pth file (nothing is built). Raw output goes to bench/out/
(gitignored); the summary to the terminal and to the "Offload" section of
bench/RESULTS.md.
"""
import argparse
import datetime
import hashlib
import http.client
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import openloop  # noqa: E402
from common import (BENCH, CLIENT_CPU, HOST, OUT, RESULTS, ROOT, SERVER_CPU, CpuMeter, ServerTree,  # noqa: E402
                    apt_install, children_cpu_seconds, free_port, git_head, invocation, log, pid_cpu_seconds,
                    pin_self, pinned_self, rotated, run_quiet, self_cpu_seconds, stop_all, wait_http,
                    wait_until_quiet, write_section)

VENV = os.path.join(BENCH, ".venv")
VENV_PY = os.path.join(VENV, "bin", "python")
OPENLOOP = openloop.OPENLOOP
SECTION = "## Offload: one 1 KiB record per request to Kafka"

# Pinned benchmark dependencies (bench/.venv only; never package metadata).
PINS = {"confluent-kafka": "2.16.1", "kafka-python": "3.0.12", "setproctitle": "1.3.8"}

RECORD_BYTES = 1024
CHECK_REQUESTS = 20
OPENLOOP_CONNS = 16
WRK_ARGS = ["-t1", "-c8"]

# key -> (label, app in offload_apps, emits to Kafka)
VARIANTS = {
    "none": ("no offload", "none", False),
    "offload": ("forkwsgi.offload", "forkwsgi_offload", True),
    "offload-py": ("forkwsgi.offload, confluent sink", "forkwsgi_offload", True),
    "confluent": ("confluent-kafka in worker", "confluent", True),
    "kafkapy": ("kafka-python in worker", "kafkapy", True),
    "mpqueue": ("mp.Queue to a sibling", "mpqueue", True),
}
IN_WORKER = ("confluent", "kafkapy", "mpqueue")
OFFLOAD_EXTRA = []        # --offload-args: more forkwsgi flags for the forkwsgi.offload variants
# The sibling's Kafka producer: librdkafka driven from C, or (offload-py, the
# way before it) confluent-kafka's Producer, a Python call per record.
OFFLOAD_PRODUCER = {"offload": "direct", "offload-py": "confluent"}


def server_argv(key, port, bootstrap, offload_dir, topic):
    argv = [VENV_PY, "-m", "forkwsgi", f"offload_apps:{VARIANTS[key][1]}",
            "--workers", "1", "--threads", "2", "--bind", f"{HOST}:{port}",
            "--chdir", BENCH, "--keep-alive", "75", "--graceful-timeout", "20"]
    if key in OFFLOAD_PRODUCER:
        argv += ["--offload-sink", f"kafka://{bootstrap}", "--offload-dir", offload_dir,
                 "--offload-kafka-topics", topic, "--offload-kafka-producer", OFFLOAD_PRODUCER[key],
                 *OFFLOAD_EXTRA]
    return argv


def display_command(argv):
    out = []
    for a in argv:
        a = {VENV_PY: "bench/.venv/bin/python", BENCH: "bench", OPENLOOP: "bench/out/openloop"}.get(a, a)
        a = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", a)
        a = re.sub(r"kafka://127\.0\.0\.1:PORT", "kafka://127.0.0.1:KPORT", a)
        out.append(f'"{a}"' if " " in a else a)
    return " ".join(out)


# ---------------------------------------------------------------- processes

class Server(ServerTree):
    """forkwsgi pinned to SERVER_CPU; stop() by PID, then SIGKILL to its
    process group (which holds the mp.Queue sender too)."""

    def __init__(self, argv, port, log_path, env):
        super().__init__(argv, port, log_path, env, SERVER_CPU, BENCH)

    def cpu_by_role(self):
        """{role: CPU seconds} over the tree: master, worker, helper (the
        offload sibling or the mp.Queue sender process)."""
        pids, table = self.tree()
        out = {"master": 0.0, "worker": 0.0, "helper": 0.0}
        for p in pids:
            if p not in table:
                continue
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ")
            except OSError:
                continue
            role = ("worker" if b"forkwsgi: worker" in cmd else
                    "helper" if b"forkwsgi: offload" in cmd or b"multiprocessing" in cmd else "master")
            out[role] += table[p][1] / os.sysconf("SC_CLK_TCK")
        return out

    def get(self, path, timeout=10):
        c = http.client.HTTPConnection(HOST, self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def wait_ready(self, timeout=30.0):
        return wait_http(self.port, "/_bench_stats", timeout, alive=self.alive, conn_timeout=5)

    def stop(self, term_wait=20.0):
        return super().stop(term_wait)


class Meter:
    """CPU in % of one CPU over a load: server tree, broker, load generator
    (children rusage), everyone else; and the VM's steal time."""

    def __init__(self, srv, broker_pid):
        self.srv = srv
        self.roles0 = srv.cpu_by_role()
        self.cpu = CpuMeter(server=srv.cpu_seconds, broker=lambda: pid_cpu_seconds(broker_pid),
                            client=children_cpu_seconds, me=self_cpu_seconds)

    def stop(self):
        span = self.cpu.stop()
        roles = {k: v - self.roles0.get(k, 0.0) for k, v in self.srv.cpu_by_role().items()}
        used = span.used
        return {"server_cpu_pct": span.pct(used["server"]), "broker_cpu_pct": span.pct(used["broker"]),
                "client_cpu_pct": span.pct(used["client"]), "other_cpu_pct": max(0.0, span.pct(span.others)),
                "steal_pct": span.pct(span.steal), "server_cpu_s": used["server"],
                "role_cpu_s": roles}


# ---------------------------------------------------------------- Kafka

class Kafka:
    """The broker (scripts/kafka_broker.py) and the benchmark's admin and
    consumer clients (confluent-kafka of this Python)."""

    def __init__(self, broker_cpu):
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import kafka_broker
        self.kb = kafka_broker
        self.home = kafka_broker.install()
        self.data = f"/tmp/forkwsgi-bench-offload-kafka-{os.getpid()}"
        shutil.rmtree(self.data, ignore_errors=True)
        self.broker = kafka_broker.Broker(self.home, self.data, free_port(pair=True))
        # The broker JVM inherits this process's CPU affinity (every thread
        # it creates then inherits its creator's): set it around start().
        cpus = set(range(os.cpu_count())) if broker_cpu == "all" else {int(broker_cpu)}
        with pinned_self(cpus):
            self.broker.start(timeout=90)
        self.pid = self.broker.pid
        from confluent_kafka import Consumer, TopicPartition
        from confluent_kafka.admin import AdminClient, NewTopic
        self.Consumer, self.TopicPartition, self.NewTopic = Consumer, TopicPartition, NewTopic
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.wm = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-watermarks",
                            "enable.auto.commit": False})

    @property
    def bootstrap(self):
        return self.broker.bootstrap

    def version(self):
        return self.kb.KAFKA_VERSION

    def create_topic(self, topic):
        fut = self.admin.create_topics([self.NewTopic(topic, num_partitions=1, replication_factor=1)])
        fut[topic].result(timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:      # until the partition has a leader
            try:
                self.watermark(topic)
                return
            except Exception:  # noqa: BLE001 - not there yet
                time.sleep(0.1)

    def delete_topic(self, topic):
        try:
            self.admin.delete_topics([topic])[topic].result(timeout=30)
        except Exception as e:  # noqa: BLE001 - only disk space is at stake
            log(f"    could not delete topic {topic}: {e}")

    def watermark(self, topic):
        return self.wm.get_watermark_offsets(self.TopicPartition(topic, 0), timeout=5)[1]

    def wait_count(self, topic, want, timeout, poll=0.05):
        """Until the topic's high watermark reaches want: (count, monotonic
        time it was seen, or None if it was not within timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                n = self.watermark(topic)
            except Exception:  # noqa: BLE001 - a slow broker: try again
                n = -1
            now = time.monotonic()
            if n >= want:
                return n, now
            if now >= deadline:
                return n, None
            time.sleep(poll)

    def read_all(self, topic, end):
        """Every record of the topic up to offset `end`: {pid: [n, ...]},
        values of the wrong size, unparseable values."""
        c = self.Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-verify-{topic}",
                           "enable.auto.commit": False, "auto.offset.reset": "earliest",
                           "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
        c.assign([self.TopicPartition(topic, 0, 0)])
        ids, bad_size, bad, seen = {}, 0, 0, 0
        deadline = time.monotonic() + 120
        try:
            while seen < end and time.monotonic() < deadline:
                for m in c.consume(num_messages=10000, timeout=1.0):
                    if m.error():
                        continue
                    seen += 1
                    v = m.value()
                    if len(v) != RECORD_BYTES:
                        bad_size += 1
                    try:
                        pid, n = v[:v.index(b"|")].split(b"-")
                        ids.setdefault(int(pid), []).append(int(n))
                    except ValueError:
                        bad += 1
        finally:
            c.close()
        return ids, bad_size, bad, seen

    def stop(self):
        try:
            self.wm.close()
        except Exception:  # noqa: BLE001
            pass
        self.broker.stop()
        shutil.rmtree(self.data, ignore_errors=True)


# ---------------------------------------------------------------- load

CLIENT_PRIO = []          # ["chrt", "-f", N] when --client-prio N (set in main)


def run_openloop(port, rate, seconds, out_path):
    return openloop.run_openloop(port, rate, seconds, out_path, OPENLOOP_CONNS, prefix=CLIENT_PRIO)


def run_wrk(port, seconds, out_path):
    r = common.run_wrk(WRK_ARGS, seconds, f"http://{HOST}:{port}/", prefix=CLIENT_PRIO)
    if r.timed_out:
        return {"failure": "wrk did not finish"}
    with open(out_path, "w") as f:
        f.write(r.output)
    if r.stats is None:
        return {"failure": "wrk failed: " + r.output.strip()[-300:]}
    return r.stats


# ---------------------------------------------------------------- one cell

def cell_failure(result, why, srv=None):
    result["failure"] = why
    if srv is not None:
        result["log_tail"] = srv.log_text()[-1500:]
    return result


def check_variant(srv, kafka, topic, emits):
    """20 requests answered "hello"; their records in Kafka, with the ids
    the worker gave them. Returns None if all is well, else what is not."""
    for i in range(CHECK_REQUESTS):
        status, body = srv.get("/")
        if status != 200 or body != b"hello":
            return f"request {i + 1}: HTTP {status} {body[:80]!r}"
    st = json.loads(srv.get("/_bench_stats")[1])
    if st["issued"] != CHECK_REQUESTS or st["emit_errors"]:
        return f"the app counted {st['issued']} records, {st['emit_errors']} emit errors ({st['first_error']})"
    if not emits:
        return None
    n, seen = kafka.wait_count(topic, CHECK_REQUESTS, 30)
    if seen is None:
        return f"{n} of {CHECK_REQUESTS} records in Kafka after 30 s ({st})"
    ids, bad_size, bad, _ = kafka.read_all(topic, n)
    want = set(range(1, CHECK_REQUESTS + 1))
    got = ids.get(st["pid"], [])
    if bad_size or bad or set(got) != want or len(got) != CHECK_REQUESTS or len(ids) != 1:
        return (f"records in Kafka: {len(got)} ids of worker {st['pid']} "
                f"(want 1..{CHECK_REQUESTS} once), other pids {sorted(set(ids) - {st['pid']})}, "
                f"{bad_size} of the wrong size, {bad} unparseable")
    return None


def measure_phase(kind, srv, kafka, topic, emits, args, tag, meter_pid):
    """One load (fixed rate or saturation) after a discarded warm-up; then the
    emit-call timings and the time until its records are all in Kafka."""
    base = json.loads(srv.get("/_bench_stats")[1])["issued"]
    # "issued": records the app asked to emit (one per request); "emitted":
    # those the emitter accepted (forkwsgi.offload() returns False for a
    # record its overflow policy dropped: counted apart as "dropped").
    if kind == "fixed":
        warm = run_openloop(srv.port, args.rate, args.warmup, os.path.join(OUT, f"offload-{tag}.warm.lat"))
    else:
        warm = run_wrk(srv.port, args.warmup, os.path.join(OUT, f"offload-{tag}.warm.wrk.txt"))
    if "failure" in warm:
        return {"failure": f"warm-up: {warm['failure']}"}
    st = json.loads(srv.get("/_bench_stats?reset=1")[1])
    # Start with nothing in flight: the warm-up's records delivered, the machine quiet.
    if emits:
        kafka.wait_count(topic, st["emitted"], 60)
    wait_until_quiet(args.phase_quiet_wait)
    before, errors_before = st["issued"], st["emit_errors"]
    meter = Meter(srv, meter_pid)
    t0 = time.monotonic()
    if kind == "fixed":
        res = run_openloop(srv.port, args.rate, args.duration, os.path.join(OUT, f"offload-{tag}.lat"))
    else:
        res = run_wrk(srv.port, args.duration, os.path.join(OUT, f"offload-{tag}.wrk.txt"))
    t_load = time.monotonic() - t0
    res.update(meter.stop())
    st = json.loads(srv.get("/_bench_stats?reset=1")[1])
    res["emit_ns"] = st["emit_ns"]
    res["issued"] = st["issued"] - before
    res["dropped"] = res["emit_errors"] = st["emit_errors"] - errors_before
    res["emitted"] = res["issued"] - res["dropped"]
    res["app_stats"] = st
    res["warmup_records"] = before - base
    res["load_s"] = t_load
    n = res.get("issued")
    res["server_cpu_us_per_req"] = 1e6 * res["server_cpu_s"] / n if n else None
    res["worker_cpu_us_per_req"] = 1e6 * res["role_cpu_s"]["worker"] / n if n else None
    res["helper_cpu_us_per_req"] = 1e6 * res["role_cpu_s"]["helper"] / n if n else None
    if emits:
        n, seen = kafka.wait_count(topic, st["emitted"], args.delivery_timeout)
        res["in_kafka_after"] = n
        if seen is None:
            res["delivered_all"] = False
            res["delivery_s"] = None
            res["delivered_per_s"] = None
        else:
            res["delivered_all"] = True
            res["delivery_s"] = seen - t0
            res["drain_s"] = max(0.0, seen - t0 - t_load)
            res["delivered_per_s"] = res["emitted"] / (seen - t0)
    return res


def run_cell(key, rnd, kafka, args, runid):
    label, _app, emits = VARIANTS[key]
    tag = f"{key}-r{rnd}"
    topic = f"bench-{runid}-{key}-r{rnd}"
    waited, busy = wait_until_quiet(args.quiet_wait)
    result = {"variant": key, "round": rnd, "topic": topic, "quiet_wait_s": round(waited, 1),
              "busy_before_pct": round(busy, 1), "phases": {}}
    if busy >= 10.0:
        log(f"    machine still busy ({busy:.0f}% of a CPU used by others) after {waited:.0f} s; "
            "running anyway")
    kafka.create_topic(topic)
    ofl_dir = os.path.join(args.scratch, f"offload-{tag}")
    shutil.rmtree(ofl_dir, ignore_errors=True)
    env = dict(os.environ, OFFLOAD_BENCH_TOPIC=topic, OFFLOAD_BENCH_BOOTSTRAP=kafka.bootstrap,
               PYTHONPATH=SNAPSHOT)
    srv = None
    try:
        for attempt in range(2):
            port = free_port()
            argv = server_argv(key, port, kafka.bootstrap, ofl_dir, topic)
            srv = Server(argv, port, os.path.join(OUT, f"offload-{tag}.server.log"), env)
            result["command"] = display_command(srv.argv)
            if srv.wait_ready():
                break
            srv.stop()
            if attempt or "in use" not in srv.log_text():
                return cell_failure(result, "server did not become ready", srv)
        why = check_variant(srv, kafka, topic, emits)
        result["check"] = why or "ok"
        if why:
            return cell_failure(result, f"correctness check: {why}", srv)
        for kind in ("fixed", "saturation"):
            ph = measure_phase(kind, srv, kafka, topic, emits, args, f"{tag}-{kind}", kafka.pid)
            result["phases"][kind] = ph
            if "failure" in ph:
                return cell_failure(result, f"{kind}: {ph['failure']}", srv)
        final = json.loads(srv.get("/_bench_stats")[1])
        result["final_stats"] = final
        issued, wpid = final["issued"], final["pid"]
        result["issued"] = issued
        result["dropped"] = final["emit_errors"]
        if emits:
            end = kafka.watermark(topic)
            ids, bad_size, bad, seen = kafka.read_all(topic, end)
            got = ids.get(wpid, [])
            distinct = set(got)
            result.update({
                "in_kafka": seen, "distinct": len(distinct),
                "missing": len(set(range(1, issued + 1)) - distinct),
                "duplicates": len(got) - len(distinct),
                "unexpected": len(distinct - set(range(1, issued + 1))) +
                sum(len(v) for p, v in ids.items() if p != wpid) + bad,
                "bad_size": bad_size})
    finally:
        if srv is not None:
            crashed, code = srv.stop()
            if crashed and "failure" not in result:
                result["failure"] = f"server exited during the cell (code {code})"
            text = srv.log_text()
            result["log_tail"] = text[-1500:]
            result["log_suspicious"] = [ln for ln in text.splitlines() if re.search(
                r"error|traceback|exception|critical|warn|dropped|spill", ln, re.I)][:10]
        kafka.delete_topic(topic)
        shutil.rmtree(ofl_dir, ignore_errors=True)
    return result


# ---------------------------------------------------------------- setup

def ensure_tools():
    missing = [p for p, b in (("wrk", "wrk"), ("util-linux", "taskset")) if not shutil.which(b)]
    if missing:
        apt_install(*missing)
    for b in ("wrk", "taskset", "java", "mvn"):
        if not shutil.which(b):
            sys.exit(f"{b} is required (wrk/taskset from apt; java 17+ and mvn for the Kafka broker)")
    openloop.build_openloop()


def ensure_venv():
    """bench/.venv with the pinned clients; forkwsgi from this checkout via a
    .pth file (the extension already built in python/forkwsgi is used as is)."""
    if not os.path.exists(VENV_PY):
        log(f"creating {VENV}")
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    site = run_quiet([VENV_PY, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    pth = os.path.join(site, "forkwsgi-checkout.pth")
    want = os.path.join(ROOT, "python") + "\n"
    if not os.path.exists(pth) or open(pth).read() != want:
        with open(pth, "w") as f:
            f.write(want)
    check = ("import importlib.metadata as m, sys; "
             f"sys.exit(0 if all(m.version(n) == v for n, v in {PINS!r}.items()) else 1)")
    if run_quiet([VENV_PY, "-c", check]).returncode != 0:
        log("installing " + ", ".join(f"{n}=={v}" for n, v in PINS.items()) + " into bench/.venv")
        r = run_quiet([VENV_PY, "-m", "pip", "--disable-pip-version-check", "install",
                       *(f"{n}=={v}" for n, v in PINS.items())])
        if r.returncode != 0:
            sys.exit("pip install failed:\n" + r.stdout[-2000:])
    r = run_quiet([VENV_PY, "-c", "import forkwsgi, os, confluent_kafka, kafka; "
                   "print(os.path.dirname(forkwsgi.__file__)); print(confluent_kafka.libversion()[0])"],
                  cwd=BENCH)
    if r.returncode != 0:
        sys.exit("bench/.venv cannot import forkwsgi/confluent_kafka/kafka:\n" + r.stdout[-1500:])
    where, librdkafka = r.stdout.split()[:2]
    return {**PINS, "librdkafka": librdkafka, "forkwsgi_dir": where}


SNAPSHOT = os.path.join(OUT, "forkwsgi-snapshot")


def snapshot_forkwsgi():
    """Copy python/forkwsgi (its .py files and the built extension) to
    bench/out/forkwsgi-snapshot/ once per run; every server imports it from
    there (PYTHONPATH), so edits or rebuilds in the checkout during the run
    cannot change the code under test half-way. Returns a description."""
    src = os.path.join(ROOT, "python", "forkwsgi")
    shutil.rmtree(SNAPSHOT, ignore_errors=True)
    shutil.copytree(src, os.path.join(SNAPSHOT, "forkwsgi"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = run_quiet([VENV_PY, "-c", "import forkwsgi, forkwsgi._forkwsgi; print(forkwsgi.__file__)"],
                  cwd=BENCH, env=dict(os.environ, PYTHONPATH=SNAPSHOT))
    if r.returncode != 0 or not r.stdout.strip().startswith(SNAPSHOT):
        sys.exit("the forkwsgi snapshot does not import:\n" + r.stdout[-1500:])
    return so_digest(os.path.join(SNAPSHOT, "forkwsgi"))


def so_digest(pkg=os.path.join(ROOT, "python", "forkwsgi")):
    so = [f for f in os.listdir(pkg) if f.endswith(".so")]
    if not so:
        return None
    with open(os.path.join(pkg, so[0]), "rb") as f:
        return f"{so[0]} sha256 {hashlib.sha256(f.read()).hexdigest()[:12]}"


def git_state():
    head = git_head()
    dirty = run_quiet(["git", "-C", ROOT, "status", "--porcelain", "--", "cserver", "src",
                       "python"]).stdout.splitlines()
    return head, [ln[3:] for ln in dirty if ln.strip()]


def machine_facts():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    java = run_quiet(["java", "-version"]).stdout.strip().splitlines()
    wrk = run_quiet(["wrk", "-v"]).stdout.strip().splitlines()[0].split(" Copyright")[0]
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "java": java[0] if java else "?", "wrk": wrk}


# ---------------------------------------------------------------- report

def med(values):
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def summarize(results):
    """Per variant: per-metric medians over its successful rounds."""
    rows = {}
    for key in VARIANTS:
        runs = [r for r in results if r["variant"] == key]
        if not runs:                      # not in this run (--only)
            continue
        ok = [r for r in runs if "failure" not in r]

        def m(kind, *path):
            vals = []
            for r in ok:
                x = r["phases"].get(kind, {})
                for p in path:
                    x = x.get(p) if isinstance(x, dict) else None
                vals.append(x)
            return med(vals)

        row = {"runs": len(runs), "ok": len(ok), "failures": [r["failure"] for r in runs if "failure" in r]}
        for kind in ("fixed", "saturation"):
            row[kind] = {k: m(kind, k) for k in (
                "p50_us", "p99_us", "p999_us", "rps", "delivered_per_s", "drain_s", "server_cpu_pct",
                "broker_cpu_pct", "client_cpu_pct", "other_cpu_pct", "steal_pct", "server_cpu_us_per_req",
                "worker_cpu_us_per_req", "helper_cpu_us_per_req", "lag_p99_us")}
            row[kind]["emit_p50_ns"] = m(kind, "emit_ns", "p50")
            row[kind]["emit_p99_ns"] = m(kind, "emit_ns", "p99")
            row[kind]["each_p99"] = [r["phases"].get(kind, {}).get("p99_us") for r in ok]
            row[kind]["each_rps"] = [r["phases"].get(kind, {}).get("rps") for r in ok]
        row["missing"] = sum(r.get("missing", 0) for r in ok) if VARIANTS[key][2] else None
        row["duplicates"] = sum(r.get("duplicates", 0) for r in ok) if VARIANTS[key][2] else None
        row["unexpected"] = sum(r.get("unexpected", 0) + r.get("bad_size", 0) for r in ok)
        row["issued"] = sum(r.get("issued", 0) for r in ok)
        row["dropped"] = sum(r.get("dropped", 0) for r in ok)
        row["errors"] = sum((r["phases"].get("fixed", {}).get("errors", 0) or 0)
                            + (r["phases"].get("fixed", {}).get("timeouts", 0) or 0)
                            + (r["phases"].get("fixed", {}).get("non200", 0) or 0)
                            + (r["phases"].get("saturation", {}).get("errors", 0) or 0)
                            + (r["phases"].get("saturation", {}).get("status", 0) or 0)
                            for r in ok)
        row["emit_errors"] = sum(r.get("final_stats", {}).get("emit_errors", 0) for r in ok)
        rows[key] = row
    return rows


def f_us(x):
    if x is None:
        return "—"
    return f"{x / 1000:.2f}" if x >= 1000 else f"{x / 1000:.3f}"


def f_num(x, nd=0):
    return "—" if x is None else f"{x:,.{nd}f}"


def f_ns(x):
    return "—" if x is None else f"{x:,.0f}"


def main_table(rows):
    lines = ["| variant | fixed-rate p50 ms | p99 ms | p99.9 ms | saturation req/s | p50 ms | p99 ms "
             "| p99.9 ms | emit call p50 ns | p99 ns | records delivered/s (saturation) | missing |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, (label, _, emits) in VARIANTS.items():
        if key not in rows:
            continue
        r = rows[key]
        if not r["ok"]:
            lines.append(f"| {label} | FAILED: {'; '.join(r['failures'])[:300]} | | | | | | | | | | |")
            continue
        fx, sa = r["fixed"], r["saturation"]
        lines.append(
            f"| {label} | {f_us(fx['p50_us'])} | {f_us(fx['p99_us'])} | {f_us(fx['p999_us'])} "
            f"| {f_num(sa['rps'])} | {f_us(sa['p50_us'])} | {f_us(sa['p99_us'])} | {f_us(sa['p999_us'])} "
            f"| {f_ns(fx['emit_p50_ns'])} | {f_ns(fx['emit_p99_ns'])} "
            f"| {f_num(sa['delivered_per_s']) if emits else '—'} "
            f"| {missing_cell(r) if emits else '—'} |")
    return "\n".join(lines)


def missing_cell(r):
    if not r["missing"]:
        return "0"
    return (f"**{r['missing']:,}** ({r['dropped']:,} dropped at the emit call)" if r["dropped"]
            else f"**{r['missing']:,}**")


def detail_table(rows, kind):
    lines = ["| variant | req/s | p50 ms | p99 ms | p99.9 ms | p99 ms of each round | emit p50 ns "
             "| emit p99 ns | delivered/s | last record in Kafka after load end, s | server CPU % "
             "| server CPU µs/req (worker + helper) | broker CPU % | load generator CPU % "
             "| others' CPU % | steal % " + ("| client lag p99 ms |" if kind == "fixed" else "|"),
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|" if kind == "fixed" else "")]
    for key, (label, _, emits) in VARIANTS.items():
        if key not in rows:
            continue
        r = rows[key]
        if not r["ok"]:
            continue
        x = r[kind]
        each = " / ".join(f_us(v) for v in x["each_p99"])
        lines.append(
            f"| {label} | {f_num(x['rps'])} | {f_us(x['p50_us'])} | {f_us(x['p99_us'])} | {f_us(x['p999_us'])} "
            f"| {each} | {f_ns(x['emit_p50_ns'])} | {f_ns(x['emit_p99_ns'])} "
            f"| {f_num(x['delivered_per_s']) if emits else '—'} "
            f"| {f_num(x['drain_s'], 2) if emits else '—'} "
            f"| {f_num(x['server_cpu_pct'])} | {f_num(x['server_cpu_us_per_req'], 1)} "
            f"({f_num(x['worker_cpu_us_per_req'], 1)} + {f_num(x['helper_cpu_us_per_req'], 1)}) "
            f"| {f_num(x['broker_cpu_pct'])} | {f_num(x['client_cpu_pct'])} | {f_num(x['other_cpu_pct'])} "
            f"| {f_num(x['steal_pct'], 1)} |"
            + (f" {f_us(x['lag_p99_us'])} |" if kind == "fixed" else ""))
    return "\n".join(lines)


def verdicts(rows):
    out = []

    def p99(key, kind, metric="p99_us"):
        r = rows.get(key)
        return r[kind][metric] if r and r["ok"] else None

    def check(desc, num, den, limit, strict=False, at_least=False):
        if num is None or den is None or not den:
            return (desc, None, "n/a")
        ratio = num / den
        ok = ratio >= limit if at_least else ratio < limit if strict else ratio <= limit
        return (desc, ratio, "PASS" if ok else "FAIL")

    out.append(check("(a) fixed rate: p99 forkwsgi.offload / no offload ≤ 1.10",
                     p99("offload", "fixed"), p99("none", "fixed"), 1.10))
    sat = check("(a') saturation (reported, not a criterion): p99 forkwsgi.offload / no offload",
                p99("offload", "saturation"), p99("none", "saturation"), 1.10)
    out.append((sat[0], sat[1], "info" if sat[1] is not None else "n/a"))
    out.append(check("(d) saturation: req/s forkwsgi.offload / confluent-kafka in worker ≥ 1",
                     p99("offload", "saturation", "rps"), p99("confluent", "saturation", "rps"), 1.0,
                     at_least=True))
    for key in [k for k in IN_WORKER if k in rows]:
        out.append(check(f"(b) fixed rate: p99 forkwsgi.offload / {VARIANTS[key][0]} < 1",
                         p99("offload", "fixed"), p99(key, "fixed"), 1.0, strict=True))
    for key in [k for k in IN_WORKER if k in rows]:
        out.append(check(f"(b') saturation: p99 forkwsgi.offload / {VARIANTS[key][0]} < 1",
                         p99("offload", "saturation"), p99(key, "saturation"), 1.0, strict=True))
    for key, (label, _, emits) in VARIANTS.items():
        if not emits or key not in rows:
            continue
        r = rows[key]
        if not r["ok"] or r["ok"] < r["runs"]:
            out.append((f"(c) {label}: every record delivered", None, "n/a (a cell failed)"))
            continue
        undelivered = r["missing"]
        out.append((f"(c) {label}: missing records = 0 (of {r['issued']:,} emitted over all rounds; "
                    f"{r['dropped']:,} of them dropped at the emit call; {r['duplicates']} duplicates)",
                    float(undelivered),
                    "PASS" if undelivered == 0 else "FAIL"))
    return out


def verdict_table(vs):
    lines = ["| criterion | value | verdict |", "|---|---:|---|"]
    for desc, v, verdict in vs:
        lines.append(f"| {desc} | {'—' if v is None else (f'{v:.3f}' if v % 1 else f'{v:.0f}')} | {verdict} |")
    return "\n".join(lines)


def problems(results):
    out = []
    for r in results:
        tag = f"{VARIANTS[r['variant']][0]} round {r['round'] + 1}"
        if "failure" in r:
            out.append(f"- {tag}: **{r['failure']}**; server log tail:\n\n```\n"
                       f"{r.get('log_tail', '').strip()[-800:]}\n```")
        for kind, ph in r.get("phases", {}).items():
            errs = {k: ph.get(k) for k in ("errors", "timeouts", "non200", "status") if ph.get(k)}
            if errs:
                out.append(f"- {tag} {kind}: request errors {errs}")
            if ph.get("emit_errors"):
                ofl = (ph["app_stats"].get("offload_stats") or {}).get("workers") or {}
                out.append(f"- {tag} {kind}: {ph['emit_errors']:,} records not accepted by the emit call "
                           + (f"(forkwsgi.offload() returned False: dropped; worker counters since start: "
                              f"queued {ofl.get('queued', 0):,}, spilled {ofl.get('spilled', 0):,}, "
                              f"dropped {ofl.get('dropped', 0):,})" if ofl else
                              f"({ph['app_stats'].get('first_error')})"))
            if ph.get("delivered_all") is False:
                out.append(f"- {tag} {kind}: not every accepted record in Kafka within the wait "
                           f"({ph.get('in_kafka_after')} of {ph['app_stats']['emitted']})")
        if r.get("duplicates") or r.get("unexpected") or r.get("bad_size"):
            out.append(f"- {tag}: {r.get('duplicates')} duplicate, {r.get('unexpected')} unexpected, "
                       f"{r.get('bad_size')} wrong-size records in Kafka")
        if r.get("log_suspicious"):
            out.append(f"- {tag}: server log lines: "
                       + "; ".join(f"`{ln.strip()[:200]}`" for ln in r["log_suspicious"][:4]))
    return out


def write_results(tables, results, args, ctx):
    head, dirty = ctx["git"]
    v = ctx["versions"]
    f = ctx["facts"]
    cmd = invocation()
    so_note = ctx["snapshot"] + (
        "" if ctx["so_start"] == ctx["so_end"] else
        f"; the checkout's extension changed during the run ({ctx['so_end']}), which the snapshot kept out")
    commands = "\n".join(f"{VARIANTS[k][0]:28} " + display_command(
        ["taskset", "-c", SERVER_CPU, *server_argv(k, 1, "127.0.0.1:1", "DIR", "TOPIC")])
        for k in VARIANTS)
    probs = problems(results)
    broker_where = {"0": "pinned to CPU 0 with the server", "1": "pinned to CPU 1 with the load generators",
                    "all": "not pinned (either CPU)"}[args.broker_cpu]
    section = f"""{SECTION}

Run on {ctx['started']:%Y-%m-%d %H:%M} UTC by `{cmd}` (took {ctx['elapsed'] / 60:.1f} min):
{args.rounds} round(s) × {len({r["variant"] for r in results})} variants, each cell a fresh server and topic; fixed rate {args.rate} req/s
for {args.duration} s and saturation for {args.duration} s, each after a {args.warmup} s warm-up.
Figures are per-metric medians over the rounds.

**Machine.** nproc {f['nproc']} ({f['cpu']}), kernel {f['kernel']}, Python {f['python']}, {f['java']},
{f['wrk']}. Server (master, worker, offload sibling or mp.Queue sender) pinned to CPU {SERVER_CPU};
load generators (bench/openloop, wrk) and this script to CPU {CLIENT_CPU}, the load generators at
{'SCHED_FIFO priority ' + str(args.client_prio) + ' (`chrt -f`)' if args.client_prio else 'normal priority'};
Kafka {ctx['kafka']} broker (scripts/kafka_broker.py, one KRaft node, 127.0.0.1) {broker_where}
(why: bench/README.md).

**Software.** forkwsgi from git {head}{' with uncommitted changes in ' + ', '.join(dirty) if dirty else ''}
(copied at the start of the run to bench/out/forkwsgi-snapshot, which every server imports:
extension {so_note}), served from bench/.venv with confluent-kafka {v['confluent-kafka']}
(librdkafka {v['librdkafka']}), kafka-python {v['kafka-python']}, setproctitle {v['setproctitle']}.

**Method.** Apps: `bench/offload_apps.py` — every variant answers `hello` and emits one 1024-byte
record (`<pid>-<n>|xxx…`) per request to the cell's topic; the emit call is timed with
`perf_counter_ns` (the "no offload" figure is that timing's own floor). Producers: acks=all,
idempotence, linger 5 ms everywhere (forkwsgi's sibling: its defaults, `--offload-fsync batch`).
Fixed rate: `bench/openloop.c`, open loop, {OPENLOOP_CONNS} kept-alive connections, latency from each
request's scheduled send time (coordinated-omission free); "client lag" is how late it actually
sent. Saturation: `wrk {' '.join(WRK_ARGS)} --latency` with `bench/stats.lua` (p99.9), closed loop.
Delivered/s = records the emit call accepted during the load ÷ (time from the load's start until
the last of them is in Kafka: high watermark, polled every 50 ms). Missing = record ids the app
tried to emit over the whole cell (check, warm-ups, both loads: one per request) that a full read
of the topic did not find, including records the emit call refused (forkwsgi.offload() returns
False when its overflow policy drops one: "dropped at the emit call"); each id once, duplicates
counted apart. CPU columns are % of one CPU during the load (server process tree; broker;
load generator; everything else), steal = time the hypervisor took from this VM.

Server commands (cwd bench/; KPORT = the broker):

```
{commands}
```

### Summary (medians over rounds)

{tables['main']}

### Fixed rate: {args.rate} req/s, open loop

{tables['fixed']}

### Saturation: wrk {' '.join(WRK_ARGS)}

{tables['saturation']}

### Pass/fail (the issue's criteria)

{tables['verdicts']}

### Problems seen

{chr(10).join(probs) if probs else 'None: every cell passed its check, no request or emit errors, every record delivered once.'}
"""
    write_section(RESULTS, SECTION, section)


# ---------------------------------------------------------------- main

def _sigterm(signum, frame):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 5 s loads (smoke test)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --quick 1)")
    ap.add_argument("--duration", type=int, help="seconds per load (default 30, --quick 5)")
    ap.add_argument("--warmup", type=int, help="discarded warm-up seconds per load (default 2, --quick 1)")
    ap.add_argument("--rate", type=int, default=1000, help="fixed request rate, req/s (default 1000)")
    ap.add_argument("--broker-cpu", default="1", choices=("0", "1", "all"),
                    help="where the Kafka broker runs (default 1: with the load generators)")
    ap.add_argument("--client-prio", type=int, default=20,
                    help="SCHED_FIFO priority of the load generators (chrt -f), so that the broker "
                         "sharing their CPU cannot delay them; 0 = normal scheduling (default 20)")
    ap.add_argument("--offload-args", default="",
                    help="extra forkwsgi flags for the forkwsgi.offload variant, e.g. "
                         "'--offload-nice 10' (default none: forkwsgi's defaults)")
    ap.add_argument("--only", help="comma-separated variants: " + ", ".join(VARIANTS))
    ap.add_argument("--delivery-timeout", type=float, default=120.0,
                    help="longest wait for a load's records to be in Kafka (s)")
    ap.add_argument("--quiet-wait", type=float, help="wait up to S s for an idle machine before each "
                                                     "cell (default 20, --quick 5)")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    args = ap.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or (5 if args.quick else 30)
    if args.warmup is None:
        args.warmup = 1 if args.quick else 2
    if args.quiet_wait is None:
        args.quiet_wait = 5 if args.quick else 20
    args.phase_quiet_wait = min(5.0, args.quiet_wait)
    OFFLOAD_EXTRA[:] = args.offload_args.split()
    if args.client_prio:
        CLIENT_PRIO[:] = ["chrt", "-f", str(args.client_prio)]
    keys = list(VARIANTS)
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        bad = [k for k in keys if k not in VARIANTS]
        if bad:
            ap.error(f"unknown variant(s) {', '.join(bad)}")

    started = datetime.datetime.now(datetime.timezone.utc)
    t_start = time.monotonic()
    os.makedirs(OUT, exist_ok=True)
    ensure_tools()
    versions = ensure_venv()
    log("bench/.venv: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    ctx = {"facts": machine_facts(), "versions": versions, "git": git_state(), "started": started,
           "so_start": so_digest()}
    ctx["snapshot"] = snapshot_forkwsgi()
    log(f"forkwsgi {ctx['git'][0]}{' + uncommitted changes' if ctx['git'][1] else ''} "
        f"snapshot in bench/out/forkwsgi-snapshot ({ctx['snapshot']})")
    runid = f"{int(time.time()) % 100000}"
    args.scratch = f"/tmp/forkwsgi-bench-offload-{os.getpid()}"
    os.makedirs(args.scratch, exist_ok=True)

    # This script (the Kafka checks between loads) and its load generators on the client CPU.
    pin_self(CLIENT_CPU)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    plan = []
    for rnd in range(args.rounds):
        plan += [(key, rnd) for key in rotated(keys, rnd)]
    per_cell = 2 * (args.duration + args.warmup) + 14
    log(f"{len(plan)} cells, about {len(plan) * per_cell / 60:.1f} min plus the broker's start "
        "and waits for an idle machine")

    results, interrupted, kafka = [], False, None
    try:
        log(f"starting the Kafka broker (CPU {args.broker_cpu})")
        kafka = Kafka(args.broker_cpu)
        ctx["kafka"] = kafka.version()
        log(f"broker at {kafka.bootstrap}, pid {kafka.pid}")
        for i, (key, rnd) in enumerate(plan):
            t_cell = time.monotonic()
            r = run_cell(key, rnd, kafka, args, runid)
            r["cell_s"] = round(time.monotonic() - t_cell, 1)
            results.append(r)
            head = f"[{i + 1}/{len(plan)}] {VARIANTS[key][0]:26} r{rnd + 1} ({r['cell_s']:.0f} s)"
            if "failure" in r:
                log(f"{head} FAILED: {r['failure']}")
                continue
            fx, sa = r["phases"]["fixed"], r["phases"]["saturation"]
            log(f"{head} fixed p50 {f_us(fx['p50_us'])} p99 {f_us(fx['p99_us'])} "
                f"p99.9 {f_us(fx['p999_us'])} ms (lag p99 {f_us(fx['lag_p99_us'])}) "
                f"emit p50/p99 {f_ns(fx['emit_ns']['p50'])}/{f_ns(fx['emit_ns']['p99'])} ns | "
                f"sat {sa['rps']:,.0f} req/s p99 {f_us(sa['p99_us'])} ms "
                f"emit {f_ns(sa['emit_ns']['p50'])}/{f_ns(sa['emit_ns']['p99'])} ns "
                f"delivered/s {f_num(sa.get('delivered_per_s'))} | missing {r.get('missing', '—')} "
                f"dup {r.get('duplicates', '—')} | others {fx['other_cpu_pct']:.0f}/{sa['other_cpu_pct']:.0f}% "
                f"broker {fx['broker_cpu_pct']:.0f}/{sa['broker_cpu_pct']:.0f}% | µs/req worker+helper "
                f"{f_num(fx['worker_cpu_us_per_req'])}+{f_num(fx['helper_cpu_us_per_req'])} / "
                f"{f_num(sa['worker_cpu_us_per_req'])}+{f_num(sa['helper_cpu_us_per_req'])}")
    except KeyboardInterrupt:
        interrupted = True
        log("\ninterrupted: stopping servers and the broker")
    finally:
        stop_all(term_wait=2.0)
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(args.scratch, ignore_errors=True)
    ctx["elapsed"] = time.monotonic() - t_start
    ctx["so_end"] = so_digest()
    ctx.setdefault("kafka", "?")

    rows = summarize(results)
    vs = verdicts(rows)
    tables = {"main": main_table(rows), "fixed": detail_table(rows, "fixed"),
              "saturation": detail_table(rows, "saturation"), "verdicts": verdict_table(vs)}
    with open(os.path.join(OUT, "offload-results.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "facts": ctx["facts"],
                   "versions": versions, "git": ctx["git"], "so": [ctx["so_start"], ctx["so_end"]],
                   "started": started.isoformat(), "elapsed_s": round(ctx["elapsed"]),
                   "interrupted": interrupted, "rows": rows,
                   "verdicts": [{"criterion": d, "value": v, "verdict": x} for d, v, x in vs],
                   "results": results}, f, indent=1)
    log("\nSummary (medians over rounds)\n\n" + tables["main"])
    log("\nFixed rate\n\n" + tables["fixed"])
    log("\nSaturation\n\n" + tables["saturation"])
    log("\nPass/fail\n\n" + tables["verdicts"])
    for p in problems(results):
        log(p.split("\n")[0])
    if ctx["so_start"] != ctx["so_end"]:
        log(f"note: the checkout's forkwsgi extension changed during the run ({ctx['so_start']} -> "
            f"{ctx['so_end']}); the servers ran the snapshot taken at the start")
    if interrupted:
        sys.exit(130)
    if not args.no_write:
        write_results(tables, results, args, ctx)
        log(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
