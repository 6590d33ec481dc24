"""WSGI apps for tests/test_user.py (--user nobody). The module imports
nothing at the top but os: a worker that became nobody imports it where
Python's own directory may be closed to nobody (an interpreter under
/root), so whatever else it needs is imported by the master first."""
import os


def everything():
    """Every feature a worker touches in one request: the app's own
    prometheus_client Counter, the body (spooled past --spool-threshold),
    forkwsgi.offload(); answers who it runs as and what it read."""
    import hashlib
    import json

    from prometheus_client import Counter
    hits = Counter("user_app_hits", "Requests to the app", ["path"])

    def app(environ, start_response):
        hits.labels(environ["PATH_INFO"]).inc()
        body = environ["wsgi.input"].read()
        offloaded = environ["forkwsgi.offload"]("events", f"{os.getpid()} {environ['PATH_INFO']}".encode())
        out = json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "pid": os.getpid(),
                          "length": len(body), "sha256": hashlib.sha256(body).hexdigest(),
                          "offloaded": offloaded}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [out]
    return app


# Import time: who imports the app, and whether it could read a file only
# root may read ($FW_SECRET), appended to $FW_IMPORTS.
if os.environ.get("FW_IMPORTS"):
    try:
        os.close(os.open(os.environ["FW_SECRET"], os.O_RDONLY))
        _read = "read"
    except OSError:
        _read = "denied"
    _fd = os.open(os.environ["FW_IMPORTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.write(_fd, f"{os.getuid()} {_read}\n".encode())
    os.close(_fd)


def who(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getuid()).encode()]
