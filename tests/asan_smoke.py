"""A short run of a real server built with ASan/UBSan: `make asan-smoke`.

Not a pytest module. Run from tests/ with the sanitizer build first on
PYTHONPATH and the ASan runtime preloaded (the Makefile sets both):

    python asan_smoke.py

Starts `python -m forkwsgi apps:echo --bind 127.0.0.1:0`, sends valid,
pipelined, chunked and bad requests over raw sockets, stops the server with
SIGTERM, and exits non-zero if a request went wrong or a sanitizer report
appears on the server's stderr (with ASAN_OPTIONS=log_path=..., reports go
to files instead; the Makefile checks those).
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from httpraw import Closed, Conn  # noqa: E402

REPORT = re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:|SUMMARY: \w+Sanitizer")

CHUNKED = (b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;name=value\r\nhello\r\n1A ; a=1 ; b=\"x y\"\r\nabcdefghijklmnopqrstuvwxyz\r\n"
           b"0\r\nX-Checksum: 1\r\n\r\n")

BAD = [
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    (b"GET /\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a=\"x\r\nhello\r\n0\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", 413),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n", 400),
    (b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nHost: a\r\n" + b"X-Big: " + b"v" * 70000 + b"\r\n\r\n", 431),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nExpect: nope\r\n\r\n", 417),
]

failures = []


def expect(what, cond):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def start():
    log = tempfile.NamedTemporaryFile(prefix="forkwsgi-asan-", suffix=".log", delete=False)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "forkwsgi", "apps:echo", "--bind", "127.0.0.1:0"],
                            cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        text = open(log.name, "rb").read().decode("utf-8", "replace")
        m = re.search(r"Listening at: http://127\.0\.0\.1:(\d+)", text)
        if m:
            return proc, log.name, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    print(open(log.name, "rb").read().decode("utf-8", "replace"))
    raise SystemExit("the server did not start")


def main():
    proc, logname, port = start()
    try:
        with Conn(port) as c:
            c.send(b"GET /a?b=c HTTP/1.1\r\nHost: a\r\n\r\n")
            expect("GET", c.read_response().status == 200)
            c.send(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world")
            r = c.read_response()
            expect("POST with Content-Length", r.status == 200 and b'"body": "hello world"' in r.body)
            c.send(CHUNKED)
            r = c.read_response()
            expect("chunked POST with extensions and trailers",
                   r.status == 200 and b"helloabcdefghijklmnopqrstuvwxyz" in r.body)
            # chunked, a byte at a time
            for i in range(len(CHUNKED)):
                c.send(CHUNKED[i:i + 1])
            r = c.read_response()
            expect("chunked POST one byte per send", r.status == 200 and b"helloabcdef" in r.body)
            # pipelined
            c.send(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n" + CHUNKED + b"HEAD /3 HTTP/1.1\r\nHost: a\r\n\r\n")
            rs = [c.read_response(), c.read_response(), c.read_response("HEAD")]
            expect("three pipelined requests", [x.status for x in rs] == [200, 200, 200])
        with Conn(port) as c:
            c.send(b"PUT /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
            r = c.read_response()
            expect("100 Continue", r.status == 100)
            c.send(b"body")
            r = c.read_response()
            expect("body after 100 Continue", r.status == 200 and b'"body": "body"' in r.body)
        # A body larger than the in-place threshold (spooled to memory/file).
        with Conn(port, timeout=30) as c:
            body = b"x" * (3 << 20)
            c.send(b"POST /big HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            expect("3 MiB Content-Length body", c.read_response().status == 200)
            chunks = b"".join(b"%x\r\n" % 65536 + b"y" * 65536 + b"\r\n" for _ in range(40)) + b"0\r\n\r\n"
            c.send(b"POST /bigc HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
            expect("2.5 MiB chunked body", c.read_response().status == 200)
        for raw, status in BAD:
            with Conn(port) as c:
                try:
                    c.send(raw)
                    got = c.read_response().status
                except (Closed, ConnectionError) as e:
                    got = repr(e)
                expect(f"{raw[:40]!r}... -> {status} (got {got})", got == status)
        # Known issue: the CR of an empty line before a request, arriving
        # alone, is answered 400 (see tests/c/test_http.c). Reported, not failed.
        with Conn(port) as c:
            c.send(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n\r")
            first = c.read_response().status
            time.sleep(0.3)
            try:
                c.send(b"\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n")
                second = c.read_response().status
            except (Closed, ConnectionError) as e:
                second = repr(e)
            print(f"note: CRLF split before a pipelined request: {first}, then {second}"
                  f"{' (known issue)' if second != 200 else ''}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = open(logname, "rb").read().decode("utf-8", "replace")
    os.unlink(logname)
    reports = [line for line in log.splitlines() if REPORT.search(line)]
    expect("server exited cleanly (%s)" % proc.returncode, proc.returncode == 0)
    expect("no sanitizer report on stderr", not reports)
    if reports:
        print(log[-20000:])
    print(f"asan_smoke: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
