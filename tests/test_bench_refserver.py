"""bench/refserver.c, the benchmark's C reference server: it parses bytes
from the network, so it gets a test of its own. Built into a temporary
directory with the benchmark's flags, started on 127.0.0.1 on a port it picks
(PORT 0), stopped by PID."""
import os
import select
import shutil
import signal
import subprocess

import pytest

from httpraw import Conn

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "bench", "refserver.c")
# As bench/run_core.py builds it (REFSERVER_CFLAGS; not imported: bench/ on
# sys.path would shadow the tests' own apps.py).
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]
HELLO = b"Hello, World!"


@pytest.fixture(scope="module")
def refserver(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc)")
    binary = str(tmp_path_factory.mktemp("refserver") / "refserver")
    subprocess.run(["cc", *CFLAGS, "-o", binary, SOURCE],
                   check=True, capture_output=True, timeout=60)
    proc = subprocess.Popen([binary, "0", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 5)
        line = proc.stdout.readline().decode() if ready else ""
        assert line.startswith("listening on 127.0.0.1:"), line
        yield int(line.rsplit(":", 1)[1])
        assert proc.poll() is None, "the reference server exited during the tests"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(5)


def test_keepalive_and_response_size(refserver):
    with Conn(refserver, timeout=5) as c:
        for path, body in [(b"/", HELLO), (b"/4k", b"x" * 4096), (b"/", HELLO)]:
            c.send(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n")
            r = c.read_response()
            assert (r.status, r.body) == (200, body)
            # The same head as forkwsgi's answer to bench/apps.py's apps.
            assert [k for k, _ in r.headers] == ["content-type", "content-length", "date"]
            assert r.header("content-type") == "text/plain"
            assert len(r.header("date")) == len("Wed, 25 Nov 2026 04:13:07 GMT")
        assert not c.is_closed(timeout=0.2)


def test_pipelined_batch_answered_in_order(refserver):
    paths = [b"/4k" if i % 3 == 0 else b"/" for i in range(16)]
    with Conn(refserver, timeout=5) as c:
        c.send(b"".join(b"GET " + p + b" HTTP/1.1\r\nHost: t\r\n\r\n" for p in paths))
        for p in paths:
            r = c.read_response()
            assert r.status == 200
            assert len(r.body) == (4096 if p == b"/4k" else len(HELLO))


def test_post_body_read_before_the_next_request(refserver):
    body = b'{"pad":"' + b"p" * 1014 + b'"}'
    head = b"POST /post HTTP/1.1\r\nHost: t\r\ncontent-length: %d\r\n\r\n" % len(body)
    with Conn(refserver, timeout=5) as c:
        c.send(head + body[:100])            # the body arrives in two parts
        assert not c.is_closed(timeout=0.1)  # no answer (nor close) before all of it
        assert c.buf == b""
        c.send(body[100:] + b"GET /4k HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == HELLO
        assert len(c.read_response().body) == 4096


def test_connection_close(refserver):
    with Conn(refserver, timeout=5) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\nGET /4k HTTP/1.1\r\n\r\n")
        r = c.read_response()
        assert (r.status, r.body, r.header("connection")) == (200, HELLO, "close")
        assert c.is_closed(timeout=2)
        assert c.buf == b""                  # the request after it is not answered


@pytest.mark.parametrize("request_bytes, status", [
    (b"NOT HTTP\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: 12x\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
])
def test_bad_requests_answered_and_closed(refserver, request_bytes, status):
    with Conn(refserver, timeout=5) as c:
        c.send(request_bytes)
        r = c.read_response()
        assert (r.status, r.header("connection")) == (status, "close")
        assert c.is_closed(timeout=2)
