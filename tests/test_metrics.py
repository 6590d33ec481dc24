"""Prometheus metrics and /healthz (--metrics, issue 12), answered by the
master; parsed with prometheus_client's own parser, counts checked exactly
against the requests the test makes."""
import os
import re
import signal
import time

import pytest

from prometheus_client.parser import text_string_to_metric_families

from conftest import ServerProc
from httpraw import Conn, free_port, get_each_on_a_new_connection, request, wait_for

APP_MODES = ("inline",)


def start(*args, app="apps:logged"):
    port = free_port()
    s = ServerProc(app, "--metrics", f"127.0.0.1:{port}", *args)
    s.metrics_port = port
    return s


def scrape(s, path="/metrics"):
    r = request(s.metrics_port, f"GET {path} HTTP/1.1\r\nHost: m\r\n\r\n".encode(), timeout=5)
    return r


def samples(s):
    """{(name, frozenset(labels)): value} of one scrape."""
    r = scrape(s)
    assert r.status == 200 and r.header("content-type").startswith("text/plain; version=0.0.4")
    out = {}
    for fam in text_string_to_metric_families(r.body.decode()):
        for smp in fam.samples:
            out[(smp.name, frozenset(smp.labels.items()))] = smp.value
    return out


def value(m, name, **labels):
    return m[(name, frozenset(labels.items()))]


def test_counts_and_histograms_are_exact():
    s = start("--workers", "2", "--threads", "2")
    try:
        conns = [Conn(s.port) for _ in range(5)]
        codes = {"2xx": 0, "4xx": 0, "5xx": 0}
        body = 0
        for i in range(90):
            status, n = (200, 404, 500)[i % 3], i % 11
            c = conns[i % 5]
            c.send(f"GET /?status={status}&len={n} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            assert c.read_response().status == status
            codes[f"{status // 100}xx"] += 1
            body += n
        for c in conns:
            c.close()
        # Counted once on the wire, by the loop after the app thread sent it:
        # the last may land a moment after the client read it.
        assert wait_for(lambda: value(samples(s), "forkwsgi_requests_total") == 90, 5)
        m = samples(s)
        assert value(m, "forkwsgi_requests_total") == 90
        for cls, n in codes.items():
            assert value(m, "forkwsgi_responses_total", code=cls) == n
        assert value(m, "forkwsgi_response_body_bytes_total") == body
        assert value(m, "forkwsgi_request_duration_seconds_count") == 90
        assert value(m, "forkwsgi_request_duration_seconds_bucket", le="+Inf") == 90
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in m.items()
                         if k[0] == "forkwsgi_request_duration_seconds_bucket")
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)         # cumulative
        assert value(m, "forkwsgi_app_duration_seconds_count") == 90
        assert 0 < value(m, "forkwsgi_request_duration_seconds_sum") < 90
        assert value(m, "forkwsgi_requests_in_flight") == 0
        # Two gauges, no overlapping labels: sum() over either counts each worker once.
        assert value(m, "forkwsgi_workers") == 2 and value(m, "forkwsgi_workers_accepting") == 2
        assert not [k for k in m if k[0].startswith("forkwsgi_workers") and k[1]]
        assert value(m, "forkwsgi_workers_configured") == 2
        pids = {dict(k[1])["pid"] for k in m if k[0] == "forkwsgi_worker_connections"}
        assert pids == {str(p) for p in s.worker_pids()}
        assert value(m, "forkwsgi_listen_queue", listener=f"http://127.0.0.1:{s.port}") == 0
        assert scrape(s, "/healthz").status == 200
        assert scrape(s, "/nope").status == 404
    finally:
        s.stop()


def test_restart_reasons_and_counters_that_never_go_back():
    s = start("--workers", "2", "--max-requests", "20", app="apps:hello")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        get_each_on_a_new_connection(s.port, 60)
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="max_requests") >= 2, 10), \
            scrape(s).body.decode() + "\n--- log ---\n" + s.log()    # a str: pytest prints it whole
        assert wait_for(lambda: value(samples(s), "forkwsgi_requests_total") == 60, 5)
        before = 60
        # Not a worker that served its 20th request: it retires by itself
        # (max_requests) and may be gone before a SIGKILL would make it a
        # crash. It logs so with that response, counted above.
        # Both may be retiring now, their replacements not forked yet (a
        # loaded machine): wait for a worker that is not.
        def not_retiring():
            retiring = set(re.findall(r"\[(\d+)\] \[INFO\] served \d+ requests \(max-requests\)", s.log()))
            return next((p for p in s.worker_pids() if str(p) not in retiring), None)
        assert wait_for(lambda: not_retiring() is not None, 20), s.log()[-3000:]
        victim = not_retiring()
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="crash") == 1, 10)
        assert value(samples(s), "forkwsgi_requests_total") >= before
        assert wait_for(lambda: len(s.worker_pids()) == 2, 10)     # the crashed one replaced
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="reload") == 2, 20), (
            scrape(s).body.decode()[-900:], s.log()[-3000:])
        m = samples(s)
        assert value(m, "forkwsgi_reloads_total") == 1 and value(m, "forkwsgi_requests_total") >= before
    finally:
        s.stop()


def test_a_worker_that_retires_before_the_master_reads_its_ready_byte_is_no_crash(tmp_path):
    """A worker that came ready, served its --max-requests and exited while
    the master was busy between two looks at the readiness pipes (here: in
    the nworkers_changed hook of a second SIGTTIN; in the fresh-clone CI: a
    loaded machine) was counted as a crash at start-up: the master closed
    the pipe unread, "died (exit code 0)", the back-off, and
    restarts_total{reason="crash"} for a worker that retired."""
    conf = tmp_path / "conf.py"
    in_hook = tmp_path / "in-hook"
    conf.write_text("import time\n"
                    "def nworkers_changed(server, new, old):\n"
                    "    if new == 3:\n"
                    f"        open({str(in_hook)!r}, 'w').close()\n"
                    "        time.sleep(4)\n"
                    "def post_fork(server, worker):\n"
                    "    if worker.age == 2:\n"
                    "        time.sleep(0.5)      # ready only once the master is in the hook above\n")
    s = start("--workers", "1", "--max-requests", "3", "-c", str(conf), app="apps:pid")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        s.signal(signal.SIGTTIN)
        assert wait_for(lambda: "Booted worker 2" in s.log()), s.log()
        s.signal(signal.SIGTTIN)        # not with the first: two pending SIGTTINs are one
        assert wait_for(lambda: in_hook.exists()), s.log()
        get_each_on_a_new_connection(s.port, 6)     # 3 each: both retire
        assert wait_for(lambda: "Booted worker 3" in s.log(), 15), s.log()
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="max_requests") == 2, 10), \
            scrape(s).body.decode() + "\n--- log ---\n" + s.log()
        assert value(samples(s), "forkwsgi_worker_restarts_total", reason="crash") == 0
        assert "died" not in s.log() and "die at start-up" not in s.log(), s.log()
    finally:
        s.stop()


def test_timeout_kills_are_counted():
    s = start("--workers", "1", "--timeout", "1", app="apps:sleep")
    try:
        with Conn(s.port, timeout=10) as c:
            c.send(b"GET /?t=4 HTTP/1.1\r\nHost: t\r\n\r\n")
            assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="timeout") == 1, 10)
    finally:
        s.stop()


def test_answers_while_every_worker_is_busy_and_healthz_503_while_draining():
    s = start("--workers", "1", "--threads", "1", "--graceful-timeout", "10", app="apps:sleep")
    try:
        c = Conn(s.port, timeout=20)
        c.send(b"GET /?t=2 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert wait_for(lambda: value(samples(s), "forkwsgi_requests_in_flight") == 1, 5)
        m = samples(s)
        assert value(m, "forkwsgi_worker_oldest_request_seconds", worker="1", pid=str(s.worker_pids()[0])) > 0
        s.signal(signal.SIGTERM)          # the request in flight finishes; meanwhile the server drains
        assert wait_for(lambda: scrape(s, "/healthz").status == 503, 5)
        assert c.read_response().status == 200
        c.close()
        s.proc.wait(15)
    finally:
        s.stop()


def test_the_apps_own_prometheus_metrics_are_summed_over_workers_and_recycles():
    """An app's prometheus_client Counter, with no set-up, counted over 2
    workers that --max-requests recycles: every increment is in /metrics, and
    no file of a dead worker is left behind."""
    s = start("--workers", "2", "--max-requests", "15", app="apps:prom_app()")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        get_each_on_a_new_connection(s.port, 70, "/a")
        get_each_on_a_new_connection(s.port, 10, "/b")
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="max_requests") >= 4, 10)
        m = samples(s)
        assert value(m, "myapp_hits_total", path="/a") == 70
        assert value(m, "myapp_hits_total", path="/b") == 10
        assert value(m, "myapp_body_bytes_count") == 80
        assert value(m, "myapp_body_bytes_bucket", le="10.0") == 80
        d = s.log().split("prometheus_client's multiprocess files in ")[1].split()[0]

        def strays():
            # A worker that has just exited keeps its files until the master
            # reaps it (and archives them) a moment later: asked again until then.
            live = {str(p) for p in s.worker_pids()} | {str(s.pid)}
            return [f for f in os.listdir(d) if f.rsplit("_", 1)[-1][:-3] not in live | {"archive"}]
        assert wait_for(lambda: not strays(), 5), strays()
    finally:
        s.stop()
    assert not os.path.exists(d)                  # the server's directory, removed at exit


def test_the_histograms_p99_is_the_clients():
    """Durations spread over two buckets (9 in 10 fast, 1 in 10 about 30 ms):
    the p99 Prometheus computes from the histogram (the bucket's upper
    bound) is the bucket where the client's own p99 falls."""
    s = start("--workers", "1", app="apps:sleep")
    try:
        times = []
        with Conn(s.port) as c:
            for i in range(100):
                t = 0.03 if i % 10 == 0 else 0
                t0 = time.monotonic()
                c.send(f"GET /?t={t} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                assert c.read_response().status == 200
                times.append(time.monotonic() - t0)
        client_p99 = sorted(times)[98]
        assert wait_for(lambda: value(samples(s), "forkwsgi_request_duration_seconds_count") == 100, 5)
        m = samples(s)
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in m.items()
                         if k[0] == "forkwsgi_request_duration_seconds_bucket")
        server_p99 = next(le for le, n in buckets if n >= 99)            # the bucket holding the 99th
        below = max([le for le, _ in buckets if le < server_p99], default=0.0)
        assert below < client_p99 <= server_p99 + 0.005, (client_p99, server_p99, buckets)
        assert 85 <= value(m, "forkwsgi_request_duration_seconds_bucket", le="0.025") <= 90
    finally:
        s.stop()


def test_idle_kept_alive_connections_are_counted():
    s = start("--workers", "1", app="apps:hello")
    try:
        conns = [Conn(s.port) for _ in range(3)]
        for c in conns:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
        label = {"worker": "1", "pid": str(s.worker_pids()[0])}
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_idle_connections", **label) == 3, 5)
        assert value(samples(s), "forkwsgi_worker_connections", **label) == 3
        conns[0].close()
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_idle_connections", **label) == 2, 5)
        for c in conns[1:]:
            c.close()
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_connections", **label) == 0, 5)
        assert value(samples(s), "forkwsgi_worker_idle_connections", **label) == 0
    finally:
        s.stop()


def test_each_family_is_whole_and_typed(tmp_path):
    """The whole /metrics, read by prometheus_client's parser: every family
    once, typed, with its samples (its HELP, TYPE and samples together: a
    family split in two reads as a typed family with no samples and an
    'unknown' one). With 2 workers and 2 listeners, so that the families
    with a sample per worker or per listener have several, and with
    --offload-sink, so that the offload families are there too."""
    port = free_port()
    s = ServerProc("apps:prom_app()", "--metrics", f"127.0.0.1:{port}", "--workers", "2",
                   "--offload-sink", f"jsonl:{tmp_path / 'out.jsonl'}", "--offload-dir", str(tmp_path / "offload"),
                   bind=["127.0.0.1:0", "127.0.0.1:0"])
    s.metrics_port = port
    try:
        assert wait_for(lambda: value(samples(s), "forkwsgi_workers_accepting") == 2)
        get_each_on_a_new_connection(s.port, 4, "/a")
        r = scrape(s)
        assert r.status == 200
        families = list(text_string_to_metric_families(r.body.decode()))
        names = [f.name for f in families]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
        assert [f.name for f in families if f.type == "unknown"] == []
        assert [f.name for f in families if not f.samples] == []
        by_name = {f.name: f for f in families}
        for name in ("forkwsgi_worker_connections", "forkwsgi_worker_requests_in_flight"):
            assert len(by_name[name].samples) == 2, by_name[name]
        assert len(by_name["forkwsgi_worker_handoffs"].samples) == 4        # in and out, per worker
        assert len(by_name["forkwsgi_listen_queue"].samples) == 2
        assert len(by_name["forkwsgi_listen_queue_max"].samples) == 2
        assert by_name["myapp_hits"].type == "counter"                    # the app's own, after ours
        assert by_name["forkwsgi_offload_queue_depth"].type == "gauge"
    finally:
        s.stop()


@pytest.mark.parametrize("max_requests", [None, "100000"], ids=["plain", "with-max-requests"])
def test_a_worker_sent_a_stop_signal_from_outside_is_counted_as_such(max_requests):
    """`kill PID` of one worker (an operator, a process manager), not the
    master's doing: the worker finishes, is replaced, and is counted and
    logged for what happened, a stop signal, whether --max-requests is set
    or not (it was counted as the app's sys.exit() or as --max-requests)."""
    s = start("--workers", "2", *(["--max-requests", max_requests] if max_requests else []))
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        get_each_on_a_new_connection(s.port, 4, "/")
        victim = s.worker_pids()[0]
        os.kill(victim, signal.SIGTERM)
        assert wait_for(lambda: value(samples(s), "forkwsgi_worker_restarts_total", reason="signal") == 1, 10), \
            s.log()
        m = samples(s)
        assert value(m, "forkwsgi_worker_restarts_total", reason="app_exit") == 0
        assert value(m, "forkwsgi_worker_restarts_total", reason="max_requests") == 0
        # "retires (...)" when the master sees the slot drain first, "exited
        # (exit code 0) (...)" when the worker's exit is reaped first.
        assert re.search(rf"Worker \d \(pid {victim}\) (retires|exited \(exit code 0\)) "
                         r"\(sent a stop signal, not by the master\)", s.log()), s.log()
        assert wait_for(lambda: len(s.worker_pids()) == 2 and victim not in s.worker_pids())
        get_each_on_a_new_connection(s.port, 4, "/")
    finally:
        s.stop()
