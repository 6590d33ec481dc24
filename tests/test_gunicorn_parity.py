"""What a team moving from gunicorn sees, checked against the real gunicorn
(issue 25): the same requests to both, the same bytes or the same verdict
where the issue asks for them.

gunicorn comes from the test extra (pyproject.toml); each server is started
on 127.0.0.1 and stopped by PID.
"""
import os
import signal
import socket
import subprocess
import sys

import pytest

from conftest import HERE, ServerProc
from httpraw import free_port, wait_for

APP_MODES = ("inline",)

gunicorn = pytest.importorskip("gunicorn")


class Gunicorn:
    """gunicorn serving a test app on 127.0.0.1, its output in a file."""

    def __init__(self, app, *args, tmp_path):
        self.port = free_port()
        self.out = open(tmp_path / "gunicorn.out", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{self.port}",
                                      "--no-control-socket", *args, app], cwd=HERE, stdout=self.out,
                                     stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=HERE))
        assert wait_for(self.up, timeout=20), open(self.out.name).read()

    def up(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.out.close()


def send(port, raw):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        while s.recv(65536):
            pass


def last_line(path, timeout=10.0):
    def there():
        return os.path.exists(path) and open(path, "rb").read().endswith(b"\n")
    assert wait_for(there, timeout), path
    return open(path, "rb").read().splitlines()[-1]


def test_access_log_bytes_are_gunicorns(tmp_path):
    """Issue 25, item 11: the default access-log format writes the same
    bytes as gunicorn 27 for a request whose values need escaping (a quote,
    a backslash, a tab, a byte >= 0x80); only the time and the peer's port
    may differ, and they are not in the default format."""
    raw = (b'GET /a?q="x" HTTP/1.1\r\nHost: t\r\nUser-Agent: ev"il\\ x\r\nReferer: r\te\xe9f\r\n'
           b'Connection: close\r\n\r\n')
    g_log, f_log = str(tmp_path / "g.log"), str(tmp_path / "f.log")
    g = Gunicorn("apps:hello", "--access-logfile", g_log, tmp_path=tmp_path)
    try:
        send(g.port, raw)
        g_line = last_line(g_log)
    finally:
        g.stop()
    f = ServerProc("apps:hello", "--access-logfile", f_log)
    try:
        send(f.port, raw)
        f_line = last_line(f_log)
    finally:
        f.stop()

    def without_time(line):
        head, _, rest = line.partition(b"] ")
        return head.split(b" [")[0] + b" [TIME] " + rest
    assert without_time(f_line) == without_time(g_line), (f_line, g_line)
