"""The access log (--access-logfile): gunicorn's atoms checked field by
field, the JSON form, escaping, SIGUSR1 reopening, and a log that cannot be
written (a pipe nobody reads) neither stalling requests nor losing count.

Each test runs inline and with app threads (conftest's app_mode), since the
response ends on another path through the core in each.
"""
import json
import os
import re
import signal
import time

import pytest

from conftest import ServerProc, mode_env
from httpraw import Conn, wait_for

EVERY_ATOM = ("%(h)s|%(l)s|%(u)s|%(t)s|%(r)s|%(m)s|%(U)s|%(q)s|%(H)s|%(s)s|%(B)s|%(b)s|%(f)s|%(a)s|"
              "%(T)s|%(M)s|%(D)s|%(L)s|%(p)s|%({x-req}i)s|%({X-Resp}o)s|%({x-twice}o)s|%({x-none}o)s|"
              "%({REMOTE_PORT}e)s|%({HTTP_X_REQ}e)s|%({RAW_URI}e)s|%({FW_TEST_CONST}e)s|%%")
FIELDS = "h l u t r m U q H s B b f a T M D L p req resp twice none port env_req uri const pct".split()


def lines_of(path, n, timeout=10.0):
    """The first n lines of the log, waiting for the writer (it batches for
    up to 100 ms)."""
    def enough():
        return os.path.exists(path) and open(path, "rb").read().count(b"\n") >= n
    assert wait_for(enough, timeout), open(path, "rb").read() if os.path.exists(path) else "no log file"
    return open(path, "rb").read().decode("latin-1").splitlines()


def start(make_server, tmp_path, *args, app="apps:logged", name="access.log"):
    path = str(tmp_path / name)
    return make_server(app, "--access-logfile", path, *args, env={"FW_TEST_CONST": "const-value"}), path


def test_every_atom_field_by_field(make_server, tmp_path):
    s, path = start(make_server, tmp_path, "--access-logformat", EVERY_ATOM)
    with Conn(s.port) as c:
        c.send(b"GET /some/path?a=1&b=2 HTTP/1.1\r\nHost: t\r\nReferer: http://ref/x\r\nUser-Agent: agent/1.0\r\n"
               b"X-Req: req-value\r\nAuthorization: Basic YWxpY2U6c2VjcmV0\r\n\r\n")
        r = c.read_response()
        local_port = c.sock.getsockname()[1]
    assert r.status == 200
    (line,) = lines_of(path, 1)
    f = dict(zip(FIELDS, line.split("|")))
    assert len(line.split("|")) == len(FIELDS), line
    assert f["h"] == "127.0.0.1"
    assert f["l"] == "-"
    assert f["u"] == "alice"                      # the password is never shown
    assert "secret" not in line
    assert re.fullmatch(r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]", f["t"]), f["t"]
    assert f["r"] == "GET /some/path?a=1&b=2 HTTP/1.1"
    assert (f["m"], f["U"], f["q"], f["H"]) == ("GET", "/some/path", "a=1&b=2", "HTTP/1.1")
    assert (f["s"], f["B"], f["b"]) == ("200", "5", "5")
    assert (f["f"], f["a"]) == ("http://ref/x", "agent/1.0")
    assert int(f["T"]) == 0 and int(f["M"]) < 5000 and 0 < int(f["D"]) < 5_000_000
    assert re.fullmatch(r"\d+\.\d{6}", f["L"]) and abs(float(f["L"]) - int(f["D"]) / 1e6) < 1e-6
    assert f["p"] == f"<{f['p'][1:-1]}>" and int(f["p"][1:-1]) in s.worker_pids() + [s.pid]
    assert f["req"] == "req-value" and f["env_req"] == "req-value"
    assert f["resp"] == 'v \\"1\\"'              # a quote in a value is escaped, as gunicorn does
    assert f["twice"] == "first"                 # the first of a repeated header
    assert f["none"] == "-"
    assert f["port"] == str(local_port)
    assert f["uri"] == "/some/path?a=1&b=2"
    assert f["const"] == "const-value"           # other {VAR}e: the process environment
    assert f["pct"] == "%"


def test_a_response_the_app_gives_up_logs_none_of_its_headers(make_server, tmp_path):
    """start_response queues the app's headers at once; when the app then
    raises, the 500 sent instead carries none of them, and its log line
    shows none of them either."""
    s, path = start(make_server, tmp_path, "--access-logformat", "%(s)s|%({X-Resp}o)s|%({x-twice}o)s")
    with Conn(s.port) as c:
        c.send(b"GET /?raise=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        r = c.read_response()
    assert r.status == 500 and r.header("x-resp") is None
    assert lines_of(path, 1) == ["500|-|-"]


def test_default_format_is_gunicorns(make_server, tmp_path):
    s, path = start(make_server, tmp_path)
    # One connection: lines of different connections may be written in
    # either order (with app threads), those of one connection in order.
    with Conn(s.port) as c:
        c.send(b"GET /p?q=1 HTTP/1.1\r\nHost: t\r\nUser-Agent: ua\r\n\r\n")
        assert c.read_response().status == 200
        c.send(b"GET /missing?status=404&len=0 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 404
        c.send(b"HEAD /h?len=7 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response(method="HEAD").status == 200
    lines = lines_of(path, 3)
    combined = re.compile(r'(\S+) (\S+) (\S+) (\[[^]]+\]) "([^"]*)" (\d{3}) (\S+) "([^"]*)" "([^"]*)"')
    got = [combined.fullmatch(ln).groups() for ln in lines]
    assert [g[0] for g in got] == ["127.0.0.1"] * 3
    # %(b)s of no body is 0, as gunicorn writes it (str(resp.sent) or '-': never '-').
    assert [(g[4], g[5], g[6]) for g in got] == [("GET /p?q=1 HTTP/1.1", "200", "5"),
                                                 ("GET /missing?status=404&len=0 HTTP/1.1", "404", "0"),
                                                 ("HEAD /h?len=7 HTTP/1.1", "200", "0")]
    assert got[0][8] == "ua" and got[0][7] == "-"


def test_json_lines_parse_and_escape(make_server, tmp_path):
    s, path = start(make_server, tmp_path, "--access-log-json")
    ua = 'evil"\\ \t caf\xe9'.encode("latin-1")
    with Conn(s.port) as c:
        c.send(b"POST /j?status=201&len=3 HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nUser-Agent: " + ua +
               b"\r\n\r\nhi")
        assert c.read_response().status == 201
    (line,) = lines_of(path, 1)
    rec = json.loads(line)
    assert rec["status"] == 201 and rec["bytes"] == 3 and isinstance(rec["duration_us"], int)
    assert (rec["method"], rec["path"], rec["query"], rec["protocol"]) == ("POST", "/j", "status=201&len=3",
                                                                            "HTTP/1.1")
    assert rec["user_agent"] == 'evil"\\ \t caf\xe9'
    assert rec["referer"] == "-" and rec["remote_addr"] == "127.0.0.1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", rec["time"])


@pytest.mark.parametrize("json_form", [True, False], ids=["json", "text"])
def test_a_60_kb_header_value_is_shortened_and_the_line_stays_whole(make_server, tmp_path, json_form):
    """Issue 24, item 8: a 60 KB User-Agent cut the line at 16,383 bytes:
    invalid JSON, later fields lost. Now a long value is shortened with
    "..." and every field follows it."""
    s, path = start(make_server, tmp_path, *(["--access-log-json"] if json_form else []))
    with Conn(s.port) as c:
        c.send(b"GET /long?status=202 HTTP/1.1\r\nHost: t\r\nUser-Agent: " + b"u" * 60000 +
               b"\r\nReferer: http://ref.test/\r\n\r\n")
        assert c.read_response().status == 202
    (line,) = lines_of(path, 1)
    assert len(line) < 16 * 1024
    if json_form:
        rec = json.loads(line)
        assert rec["user_agent"] == "u" * 4093 + "..."
        assert rec["status"] == 202 and rec["referer"] == "http://ref.test/"
    else:
        assert line.endswith('"http://ref.test/" "' + "u" * 4093 + '..."')
        assert " 202 " in line


def test_text_lines_cannot_be_forged(make_server, tmp_path):
    """A header value with a byte a log reader would take for a field's end
    is escaped; the line stays one line. The bytes are gunicorn's for the
    same request (issue 25, item 11: forkwsgi wrote \\x22 where gunicorn 27
    writes \\", and a byte >= 0x80 as UTF-8, as gunicorn does)."""
    s, path = start(make_server, tmp_path)
    s.get("/", headers=b"User-Agent: a\"b\\c\xe9\tend\r\n")
    with open(path, "rb") as f:
        assert wait_for(lambda: f.seek(0) == 0 and f.read().count(b"\n") >= 1)
        f.seek(0)
        line = f.read().splitlines()[0]
    assert line.endswith(b'"a\\"b\\c\xc3\xa9\tend"'), line


def test_keep_alive_pipelined_and_rejected_requests(make_server, tmp_path):
    s, path = start(make_server, tmp_path, "--access-logformat", "%(r)s %(s)s %(B)s")
    with Conn(s.port) as c:
        c.send(b"".join(b"GET /n%d?len=%d HTTP/1.1\r\nHost: t\r\n\r\n" % (i, i) for i in range(5)))
        for _ in range(5):
            c.read_response()
    with Conn(s.port) as c:
        c.send(b"GET /bad HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n")
        assert c.read_response().status == 400
    lines = lines_of(path, 6)
    # In order on one connection; the other connection's line may come
    # first (an app thread's response is on the wire before the loop logs it).
    rejected = [ln for ln in lines if ln.startswith("- ")]
    assert [ln for ln in lines if ln not in rejected] == [f"GET /n{i}?len={i} HTTP/1.1 200 {i}" for i in range(5)]
    assert len(rejected) == 1 and re.fullmatch(r"- 400 \d+", rejected[0]), lines


def test_duration_is_measured(make_server, tmp_path):
    s, path = start(make_server, tmp_path, "--access-logformat", "%(D)s %(M)s %(T)s")
    s.get("/?sleep=0.3")
    (line,) = lines_of(path, 1)
    us, ms, sec = map(int, line.split())
    assert us >= 300_000 and ms == us // 1000 and sec == us // 1_000_000


@pytest.mark.parametrize("workers", [0, 2])
def test_sigusr1_reopens_the_file(tmp_path, app_mode, workers):
    """logrotate moves the file away and sends SIGUSR1 to the master: the
    next lines go to a new file at the same path."""
    path = str(tmp_path / "access.log")
    s = ServerProc("apps:logged", "--access-logfile", path, "--workers", str(workers),
                   "--access-logformat", "%(U)s", env=mode_env(app_mode))
    try:
        with Conn(s.port) as c:           # one kept-alive connection across the rotation
            for i in range(3):
                c.send(b"GET /before%d HTTP/1.1\r\nHost: t\r\n\r\n" % i)
                c.read_response()
            assert lines_of(path, 3) == ["/before0", "/before1", "/before2"]
            os.rename(path, path + ".1")
            s.signal(signal.SIGUSR1)
            assert wait_for(lambda: os.path.exists(path), 10), "the file was not reopened"
            for i in range(3):
                c.send(b"GET /after%d HTTP/1.1\r\nHost: t\r\n\r\n" % i)
                c.read_response()
        assert lines_of(path, 3) == ["/after0", "/after1", "/after2"]
        assert open(path + ".1").read().split() == ["/before0", "/before1", "/before2"]
    finally:
        s.stop()


def test_a_pipe_nobody_reads_drops_lines_and_never_stalls_requests(tmp_path, app_mode):
    """The access log is a FIFO whose reader does not read: the writer thread
    blocks, lines that do not fit the buffer are dropped and counted, and
    every request is still answered. Once the reader drains the pipe the
    writer catches up; at the stop the worker reports what it dropped, and
    the lines read plus the lines dropped are every request."""
    fifo = str(tmp_path / "access.fifo")
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    ua = b"u" * 2000              # ~2 KB lines: the pipe (64 KiB) and the buffer fill quickly
    total = 3000
    s = ServerProc("apps:hello", "--access-logfile", fifo, "--workers", "1", "--access-logformat",
                   "%(U)s %(a)s", env=mode_env(app_mode))
    try:
        with Conn(s.port) as c:
            for i in range(total):
                c.send(b"GET /%d HTTP/1.1\r\nHost: t\r\nUser-Agent: %s\r\n\r\n" % (i, ua))
                assert c.read_response().status == 200
        data = b""
        quiet_since = time.monotonic()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and time.monotonic() - quiet_since < 1.0:
            try:
                chunk = os.read(reader, 1 << 16)
            except BlockingIOError:
                time.sleep(0.02)
                continue
            if chunk:
                data += chunk
                quiet_since = time.monotonic()
        s.signal(signal.SIGTERM)
        s.proc.wait(15)
        log = s.log()
    finally:
        s.stop()
        os.close(reader)
    got = data.decode("latin-1").splitlines()
    assert all(ln.endswith(" " + "u" * 2000) for ln in got)
    m = re.search(r"access log .*: (\d+) of (\d+) line\(s\) dropped", log)
    assert m, log
    dropped, counted = int(m.group(1)), int(m.group(2))
    assert counted == total and dropped > 0
    assert len(got) + dropped == total
    # The lines that made it are in order, none twice.
    nums = [int(ln.split()[0][1:]) for ln in got]
    assert nums == sorted(set(nums))


def test_bad_settings_are_one_line_errors(tmp_path):
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    # The caller's PYTHONPATH after it, so the tree under test is the one run.
    env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for args, want in (
        (["--access-logfile", str(tmp_path / "no" / "such" / "dir.log")], "--access-logfile"),
    ):
        p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:hello", "--bind", "127.0.0.1:0", *args],
                           capture_output=True, text=True, env=env, timeout=30)
        assert p.returncode == 2, p.stderr
        assert want in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_an_unknown_atom_is_written_as_a_dash_with_one_warning(make_server, tmp_path):
    """As gunicorn: an atom it does not know either does not stop the start;
    it is written as '-'. One warning at start names them all; under
    --check-config (the strict mode, where a name that means nothing is an
    error) it is an error."""
    import subprocess
    import sys
    fmt = "%(h)s %(zz)s %(s)s %(yy)s %({x-a}i)s"
    s, path = start(make_server, tmp_path, "--access-logformat", fmt)
    with Conn(s.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\nX-A: a\r\n\r\n")
        assert c.read_response().status == 200
    assert lines_of(path, 1) == ["127.0.0.1 - 200 - a"]
    warned = [ln for ln in s.log().splitlines() if "WARNING" in ln]
    assert len(warned) == 1 and "unknown atom(s) %(zz)s %(yy)s, written as '-'" in warned[0], s.log()
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:hello", "--access-logformat", fmt, "--check-config"],
                       capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert p.returncode == 1 and p.stderr.startswith("forkwsgi: error: --access-logformat (command line): "
                                                     "unknown atom(s) %(zz)s %(yy)s"), p.stderr


def test_off_by_default(make_server, tmp_path):
    """No --access-logfile: nothing is written, and stats carry no counters."""
    s = make_server("apps:logged")
    assert s.get("/").status == 200
    assert "access log" not in s.log()


def test_unix_socket_client(make_server, tmp_path):
    sock_path = str(tmp_path / "s.sock")
    path = str(tmp_path / "access.log")
    make_server("apps:logged", "--access-logfile", path, "--access-logformat", "[%(h)s] %(s)s",
                bind=[f"unix:{sock_path}"])
    with Conn(None, path=sock_path) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200
    assert lines_of(path, 1) == ["[-] 200"]


def test_the_client_a_proxy_names_is_the_one_logged(make_server, tmp_path):
    """Behind HAProxy's send-proxy (--proxy-protocol): %(h)s and
    %({REMOTE_PORT}e)s are the client the PROXY header names, not the proxy."""
    s, path = start(make_server, tmp_path, "--proxy-protocol=v1", "--access-logformat",
                    "%(h)s %({REMOTE_PORT}e)s %(s)s")
    with Conn(s.port) as c:
        c.send(b"PROXY TCP4 203.0.113.9 127.0.0.1 40123 80\r\n"
               b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 200 and c.read_response().status == 200
    assert lines_of(path, 2) == ["203.0.113.9 40123 200"] * 2
