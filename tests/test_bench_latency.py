"""bench/run_latency.py without a benchmark: the command of each server in
each layout (workers and threads where each server takes them), the usage
error for a server not in a layout, the "x best peer" ratios of its table,
and uWSGI's command serving two kept-alive connections at once on one
thread (a real uWSGI from bench/.venv-uwsgi; skipped without it). ~3 s."""
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench")
SCRIPT = os.path.join(BENCH, "run_latency.py")


@pytest.fixture(scope="module")
def rl():
    sys.path.insert(0, BENCH)
    try:
        import run_latency
        yield run_latency
    finally:
        sys.path.remove(BENCH)


def flag(argv, name):
    """The value after `name` in argv."""
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("layout,n", [("1x1", "1"), ("4x4", "4")])
def test_every_server_of_a_layout_gets_its_workers_and_threads(rl, layout, n):
    got = {s: rl.command(s, "apps:route", 9999, layout) for s in rl.SERVERS[layout]}
    fw = got["forkwsgi"]
    assert (flag(fw, "--workers"), flag(fw, "--threads"), flag(fw, "--bind")) == (n, n, "127.0.0.1:9999")
    gu = got["gunicorn-gthread"]
    assert (flag(gu, "-w"), flag(gu, "--threads"), flag(gu, "-k")) == (n, n, "gthread")
    gr = got["granian"]
    assert (flag(gr, "--workers"), flag(gr, "--blocking-threads"), flag(gr, "--interface")) == (n, n, "wsgi")
    uw = got["uwsgi"]
    assert (flag(uw, "--processes"), flag(uw, "--threads"), flag(uw, "--http")) == (n, n, "127.0.0.1:9999")
    assert "--http-keepalive" in uw and "--master" in uw and uw[0].endswith(".venv-uwsgi/bin/uwsgi")
    if layout == "1x1":
        assert {"bjoern", "fastpysgi"} <= set(got)
    else:
        assert not {"bjoern", "fastpysgi"} & set(got)


@pytest.mark.parametrize("server", ["bjoern", "fastpysgi"])
def test_single_process_peers_have_no_4x4(rl, server):
    assert f"{server}.run(" in " ".join(rl.command(server, "apps:route", 9999, "1x1"))
    with pytest.raises(ValueError):
        rl.command(server, "apps:route", 9999, "4x4")


def test_a_server_not_in_the_layout_is_a_usage_error():
    r = subprocess.run([sys.executable, SCRIPT, "--layout", "4x4", "--only", "forkwsgi,bjoern", "--no-write"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "not in layout 4x4: bjoern" in r.stderr


def test_best_peer_ratio_is_per_round_over_the_lowest_other_server(rl):
    # Round 1: lowest peer p99.9 is b's 2.0 -> forkwsgi 1.0 / 2.0 = 0.5;
    # round 2: lowest is c's 4.0 -> 8.0 / 4.0 = 2.0; round 3: 3.0 / 1.0.
    # Median over rounds 2.0 (the median of the medians would be 3.0 / 3.0).
    def cell(p999):
        return {"p50_us": 1, "p99_us": 1000, "p999_us": p999 * 1000, "max_us": 1, "connects": 50}
    rows = {"forkwsgi": [cell(1.0), cell(8.0), cell(3.0)],
            "b": [cell(2.0), cell(9.0), cell(1.0)],
            "c": [cell(5.0), cell(4.0), cell(3.0)]}
    lines = rl.table(rows, ["forkwsgi", "b", "c"], with_bjoern=False)
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    fw = [c.strip() for c in lines[2].strip("|").split("|")]
    assert fw[head.index("p99.9 x best peer")] == "2.00"
    assert fw[head.index("p99 x best peer")] == "1.00"
    assert fw[head.index("p99.9")] == "3.00"


def get(sock):
    """One GET / on `sock` (kept alive); the response's status line."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"Hello, World!"):
        chunk = sock.recv(4096)
        assert chunk, f"closed after {data!r}"
        data += chunk
    assert b"connection: close" not in data.lower(), data
    return data.split(b"\r\n", 1)[0]


def test_uwsgi_command_serves_two_kept_alive_connections_on_one_thread(rl, tmp_path):
    from common import UWSGI_BIN, ServerTree, free_port
    if not os.path.exists(UWSGI_BIN):
        pytest.skip("no bench/.venv-uwsgi (bench/run_uwsgi_pass.py or run_latency.py makes it)")
    port = free_port()
    srv = ServerTree(rl.command("uwsgi", "apps:route", port, "1x1"), port, str(tmp_path / "uwsgi.log"), cpu=None)
    try:
        assert srv.wait_ready("/", timeout=20), srv.log_text()[-500:]
        # --http11-socket keeps `a` on the one thread and leaves `b` in the
        # accept queue until --socket-timeout (4 s) closes `a`; --http-socket
        # closes `a` after one answer. Both fail here.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as a, \
                socket.create_connection(("127.0.0.1", port), timeout=5) as b:
            for _ in range(3):
                assert get(a) == b"HTTP/1.1 200 OK"
                assert get(b) == b"HTTP/1.1 200 OK"
    finally:
        srv.stop()
