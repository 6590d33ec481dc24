"""An app that sets SIGPIPE back to its default at import, as command-line
code often does (so that `prog | head` ends quietly): a write to a socket
whose client has reset then kills the writing process, unless the server
keeps SIGPIPE ignored while it serves (tests/test_robustness.py)."""
import os
import signal
import tempfile

signal.signal(signal.SIGPIPE, signal.SIG_DFL)

FILE = os.path.join(tempfile.gettempdir(), "forkwsgi-sigpipe-16m.bin")
SIZE = 16 << 20
with open(FILE, "ab") as f:
    f.truncate(SIZE)                    # sparse: 16 MiB to send, no disk used


def app(environ, start_response):
    if environ["PATH_INFO"] == "/file":
        f = open(FILE, "rb")
        start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(SIZE))])
        return environ["wsgi.file_wrapper"](f)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
