"""The server's own log (issue 11): --error-logfile (gunicorn's errorlog)
reopened by SIGUSR1, --log-json, --log-config (dictConfig / fileConfig) and
gunicorn's logconfig_dict."""
import json
import os
import signal
import subprocess
import sys
import time

from conftest import HERE, ServerProc
from httpraw import Conn, wait_for

APP_MODES = ("inline",)


def text(path):
    return open(path).read() if os.path.exists(path) else ""


def test_error_logfile_and_sigusr1_reopen(tmp_path):
    path = str(tmp_path / "error.log")
    s = ServerProc("apps:hello", "--workers", "2", "--error-logfile", path, wait=False)
    try:
        assert wait_for(lambda: "Listening at" in text(path), 15)
        s.port = int(text(path).split("Listening at: http://127.0.0.1:")[1].split()[0])
        assert wait_for(lambda: text(path).count("Booted worker") == 2, 10)
        assert "Listening at" not in s.log()            # not on stderr
        os.rename(path, path + ".1")
        s.signal(signal.SIGUSR1)
        s.signal(signal.SIGTTIN)
        assert wait_for(lambda: "Received SIGTTIN" in text(path) and "Booted worker 3" in text(path), 10), \
            (text(path), text(path + ".1"))
        assert "Received SIGTTIN" not in text(path + ".1")
        # A worker's own lines go to the new file too after the rotation.
        victim = s.worker_pids()[0]
        os.kill(victim, signal.SIGUSR1)                   # as logrotate's postrotate may signal all
        with Conn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n")
            assert c.read_response().status == 400
        assert wait_for(lambda: "malformed request" in text(path), 5), text(path)
    finally:
        s.stop()


def test_log_json_lines_parse_with_the_exception(make_server):
    s = make_server("apps:errors", "--log-json", "--workers", "1")
    with Conn(s.port) as c:
        c.send(b"GET /raise HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().status == 500
    assert wait_for(lambda: "app exploded" in s.log(), 5)
    records = [json.loads(ln) for ln in s.log().splitlines() if ln.strip()]
    assert all({"time", "level", "pid", "message"} <= set(r) for r in records)
    assert any(r["message"].startswith("Listening at") and r["pid"] == s.pid for r in records)
    failed = [r for r in records if "exception" in r]
    assert failed and "ValueError: app exploded before start_response" in failed[0]["exception"]
    assert failed[0]["level"] == "ERROR" and failed[0]["pid"] != s.pid


def test_log_config_json_and_gunicorn_logconfig_dict(tmp_path):
    out = tmp_path / "via-dictconfig.log"
    schema = {"version": 1, "disable_existing_loggers": False,
              "formatters": {"f": {"format": "CUSTOM %(levelname)s %(message)s"}},
              "handlers": {"h": {"class": "logging.FileHandler", "filename": str(out), "formatter": "f"}},
              "loggers": {"forkwsgi": {"handlers": ["h"], "level": "INFO", "propagate": False}}}
    cfg_json = tmp_path / "logging.json"
    cfg_json.write_text(json.dumps(schema))
    s = ServerProc("apps:hello", "--workers", "1", "--log-config", str(cfg_json), wait=False)
    try:
        assert wait_for(lambda: "CUSTOM INFO Listening at" in text(out), 15), text(out)
    finally:
        s.stop()
    out.unlink()
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(f"logconfig_dict = {schema!r}\n")
    s = ServerProc("apps:hello", "-c", str(conf), "--workers", "1", wait=False)
    try:
        assert wait_for(lambda: "CUSTOM INFO Booted worker 1" in text(out), 15), text(out)
    finally:
        s.stop()


def test_bad_log_settings_are_one_line_errors(tmp_path):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for args, want in ((["--error-logfile", str(tmp_path / "no" / "dir" / "e.log")], "--error-logfile"),
                       (["--log-config", str(tmp_path / "missing.json")], "--log-config"),
                       (["--log-config-dict", "[1, 2]"], "a dict")):
        p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:hello", "--bind", "127.0.0.1:0", *args],
                           capture_output=True, text=True, env=env, timeout=30, cwd=HERE)
        assert p.returncode == 2 and want in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


def test_the_core_log_thread_starts_with_the_first_line():
    """The core's log lines go through a thread of their own (src/logq.c),
    started by the first line: until then an inline worker has one thread
    (the kernel's file lookups are cheaper so). The first line (a 400's)
    starts it and is logged, with the worker's pid; so is a line at stop."""
    s = ServerProc("apps:hello", "--workers", "1", "--log-level", "debug")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        pid = s.worker_pids()[0]
        with Conn(s.port) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
        assert len(os.listdir(f"/proc/{pid}/task")) == 1
        with Conn(s.port) as c:
            c.send(b"GARBAGE\r\n\r\n")
            assert c.read_response().status == 400
        assert wait_for(lambda: f"[{pid}] [INFO] 127.0.0.1:" in s.log() and "400 malformed request" in s.log())
        assert len(os.listdir(f"/proc/{pid}/task")) == 2
        s.signal(signal.SIGTERM)
        assert s.proc.wait(15) == 0
        assert f"[{pid}] [DEBUG] stopping: 0 connection(s) in flight" in s.log()
    finally:
        s.stop()


def test_capture_output_sends_the_apps_output_to_the_error_logfile(tmp_path):
    """Hostile review (gunicorn migration): capture_output was ignored, so
    the app's print()s and tracebacks stayed on standard output and error
    (lost where those go to /dev/null) instead of the error log file, as
    gunicorn's capture_output puts them. They follow the file through
    SIGUSR1 after logrotate moved it."""
    path = str(tmp_path / "error.log")
    s = ServerProc("apps:chatty", "--workers", "1", "--error-logfile", path, "--capture-output", wait=False)
    try:
        assert wait_for(lambda: "Listening at" in text(path), 15), s.log()[-2000:]
        s.port = int(text(path).split("Listening at: http://127.0.0.1:")[1].split()[0])
        assert wait_for(lambda: "Booted worker" in text(path), 10)
        with Conn(s.port) as c:
            c.send(b"GET /one HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
            c.send(b"GET /two?raise=1 HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 500
        assert wait_for(lambda: "chatty gives up" in text(path), 5), text(path)
        log = text(path)
        assert "chatty: printed to stdout /one" in log and "chatty: written to stderr" in log, log
        assert "chatty" not in s.log(), s.log()               # nothing on the process's own stdout/stderr
        os.rename(path, path + ".1")
        s.signal(signal.SIGUSR1)
        os.kill(s.worker_pids()[0], signal.SIGUSR1)
        time.sleep(0.5)
        with Conn(s.port) as c:
            c.send(b"GET /three HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
        assert wait_for(lambda: "chatty: printed to stdout /three" in text(path), 5), (text(path), s.log())
    finally:
        s.stop()
