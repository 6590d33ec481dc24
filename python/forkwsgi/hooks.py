"""Server hooks with gunicorn's names and signatures, defined as functions
in the config file (-c), called in the process and at the moment gunicorn
calls them:

    master:  on_starting(server), when_ready(server), on_reload(server),
             pre_fork(server, worker), pre_exec(server), child_exit(server, worker),
             nworkers_changed(server, new_value, old_value), on_exit(server)
    worker:  post_fork(server, worker), post_worker_init(worker),
             worker_int(worker), worker_abort(worker),
             pre_request(worker, req), post_request(worker, req, environ, resp),
             worker_exit(server, worker)

`server` is the master (arbiter.Arbiter, with GunicornServer's attributes
below): .pid, .log, .cfg, .num_workers, .address, .LISTENERS, .WORKERS,
.proc_name. `worker` is a Worker below, `req` a Request, `resp` a
Response: what gunicorn's hooks use of its own, where forkwsgi can say it
truly (resp.chunked cannot be: the C core decides the framing after the
app returns). A hook that raises is logged with its traceback; the
server goes on. pre_request and post_request cost nothing unless
defined: only then is the app wrapped (one Python call each per request).

At start, nworkers_changed(server, N, None) comes first, before
on_starting, as in gunicorn (which calls it when it first sets the
number of workers).
"""
import logging
import os
import socket
import sys

from . import binding, gunicorn_compat

# name -> number of positional arguments (gunicorn's).
SIGNATURES = {
    "on_starting": 1, "on_reload": 1, "when_ready": 1, "pre_fork": 2, "post_fork": 2,
    "post_worker_init": 1, "worker_int": 1, "worker_abort": 1, "pre_exec": 1, "pre_request": 2,
    "post_request": 4, "child_exit": 2, "worker_exit": 2, "nworkers_changed": 3, "on_exit": 1,
}


class HookError(ValueError):
    pass


def check(name, fn):
    """A hook from the config file, with the number of arguments gunicorn
    passes (gunicorn's check too): HookError if not."""
    if not callable(fn):
        raise HookError(f"{name} must be a function")
    import inspect                    # here: only config files with hooks need it (~3 ms to import)
    try:
        inspect.signature(fn).bind(*range(SIGNATURES[name]))
    except TypeError:
        raise HookError(f"{name} must take {SIGNATURES[name]} argument(s), as in gunicorn") from None
    except ValueError:
        pass                          # a builtin without a signature: trust it
    return fn


def gunicorn_address(kind, value):
    """An address as gunicorn's cfg.address and server.address give it:
    (host, port) for TCP, the path of a unix socket, the number of an
    inherited descriptor."""
    if kind == "tcp":
        return value[-2], value[-1]
    return value


class Cfg(dict):
    """The settings dict, readable as hooks read gunicorn's: attributes, by
    forkwsgi's names or gunicorn's (server.cfg.workers, .bind, .loglevel),
    and the derived ones gunicorn's Config has."""

    def __getattr__(self, name):
        key = gunicorn_compat.ALIASES.get(name, name)
        if key in self:
            return self[key]
        raise AttributeError(name)

    @property
    def worker_class(self):
        """What gunicorn would run: its threaded worker with --threads > 1."""
        return "gthread" if self["threads"] > 1 else "sync"

    worker_class_str = worker_class

    @property
    def preload_app(self):
        """True when the master imports the app before forking; False with
        --lazy-apps (config.settle_preload makes the two settings agree)."""
        return not self["lazy_apps"]

    @property
    def address(self):
        """The --bind addresses, as configured (port 0 stays 0)."""
        return [gunicorn_address(*binding.parse(a)) for a in self["bind"]]


class Listener:
    """A listening socket as gunicorn's LISTENERS hold them: str() is its
    URL (http://127.0.0.1:8000, unix:/path), and the socket's own methods
    (fileno(), getsockname(), ...) are there."""

    def __init__(self, sock):
        self.sock = sock
        # Now, while it is open: a worker closes its listeners as it stops
        # (before worker_exit), and a closed socket has no name.
        self.url = binding.describe(sock)[2]

    def __str__(self):
        return self.url

    def __getattr__(self, name):
        return getattr(self.sock, name)


class GunicornServer:
    """What gunicorn's Arbiter gives hooks as `server`, over forkwsgi's
    master (mixed into arbiter.Arbiter): computed when a hook asks, from
    the master's sockets, workers and settings."""

    @property
    def address(self):
        """The addresses bound, as gunicorn gives them (a port 0 in --bind
        is the port the kernel chose)."""
        out = []
        for s in self.sockets:
            name = s.getsockname()
            out.append(name if s.family == socket.AF_UNIX else (name[0], name[1]))
        return out

    @property
    def LISTENERS(self):  # noqa: N802 - gunicorn's name
        return [Listener(s) for s in self.sockets]

    @property
    def WORKERS(self):  # noqa: N802 - gunicorn's name
        """{pid: worker} of the workers alive."""
        return {pid: w.hook_worker or Worker(w.index, 0, self.log, self.cfg, pid, self.pid)
                for pid, w in self.workers.items()}

    @property
    def proc_name(self):
        """-n/--name, else the app (gunicorn's default_proc_name)."""
        return self.cfg["proc_name"] or self.app_spec


class Worker:
    """A worker as hooks see it (gunicorn's Worker, what hooks use of it)."""

    def __init__(self, index, age, log, cfg, pid=None, ppid=None, app=None, max_requests=0, sockets=()):
        self.index = index              # 1..N, stable across its replacements
        self.age = age                  # a count of workers started by this master
        self.log = log
        self.cfg = cfg
        self.pid = pid                  # None in pre_fork (not forked yet)
        self.ppid = ppid
        self.wsgi = self.app = app
        self.alive = True
        self.booted = False
        self.aborted = False
        # Its --max-requests with the jitter drawn for it; as gunicorn,
        # sys.maxsize for none, so that nr >= max_requests reads right.
        self.max_requests = max_requests or sys.maxsize
        self.timeout = cfg["timeout"] if cfg else None     # --timeout, seconds in one call into the app
        self.sockets = [Listener(s) for s in sockets]      # the listening sockets it serves
        self._count = None              # reads its count of requests (count_requests)
        self._counted = 0

    @property
    def nr(self):
        """Requests it has answered (responses completed), from the
        counters it shares with the master: read when asked, so it costs
        the worker nothing. In post_request, the current one is not yet
        among them (it is counted once on the wire)."""
        return self._count() if self._count else self._counted

    def count_requests(self, read):
        """Where nr comes from: read() -> the count; None: stop reading
        (the worker ended; nr keeps its last value)."""
        if read is None and self._count:
            self._counted = self._count()
        self._count = read

    def in_child(self):
        self.pid, self.ppid = os.getpid(), os.getppid()
        self._count = None              # the master's reader: the worker sets its own
        return self


class Hooks:
    def __init__(self, fns, log=None):
        self.fns = dict(fns)
        self.log = log or logging.getLogger("forkwsgi")

    def __contains__(self, name):
        return name in self.fns

    def call(self, name, *args):
        fn = self.fns.get(name)
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - user code: logged, the server goes on
            self.log.exception("hook %s raised", name)


class Request:
    """What pre_request/post_request get as `req` (gunicorn's Request, the
    parts hooks use)."""

    def __init__(self, environ):
        self.method = environ["REQUEST_METHOD"]
        self.path = environ.get("PATH_INFO", "")
        self.query = environ.get("QUERY_STRING", "")
        self.uri = environ.get("RAW_URI", self.path)
        self.fragment = self.uri.partition("#")[2]
        self.scheme = environ.get("wsgi.url_scheme", "http")
        # The body stream the app reads (reading it here takes it from the
        # app, as with gunicorn's req.body).
        self.body = environ.get("wsgi.input")
        proto = environ.get("SERVER_PROTOCOL", "HTTP/1.1")
        self.version = (1, 1) if proto.endswith("1.1") else (1, 0)
        self.headers = [(k[5:].replace("_", "-"), v) for k, v in environ.items() if k.startswith("HTTP_")]
        for k in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if k in environ:
                self.headers.append((k.replace("_", "-"), environ[k]))
        self.remote_addr = environ.get("REMOTE_ADDR")
        # (host, port) of the client: the connection's peer, or with
        # --proxy-protocol the client its PROXY header names; a unix
        # socket's peer has no port: its address alone.
        port = environ.get("REMOTE_PORT", "")
        self.peer_addr = (self.remote_addr, int(port)) if port.isdigit() else self.remote_addr


class Response:
    """`resp` of post_request: the status and headers the app gave, the body
    bytes it produced (sent), and the length its Content-Length header
    announced (response_length, None without one)."""

    def __init__(self):
        self.status = None
        self.status_code = None
        self.headers = []
        self.sent = 0
        self.response_length = None


def wrap(app, hooks, worker):
    """The app with pre_request/post_request around it (only called when one
    of them is defined). post_request runs when the response is done (the
    server closes its iterable)."""
    def with_hooks(environ, start_response):
        req = Request(environ)
        hooks.call("pre_request", worker, req)
        resp = Response()

        def start(status, headers, exc_info=None):
            resp.status, resp.headers = status, list(headers)
            resp.status_code = int(status.split(" ", 1)[0])
            length = next((v for k, v in resp.headers if k.lower() == "content-length"), None)
            resp.response_length = int(length) if length and length.strip().isdigit() else None
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)
        try:
            body = app(environ, start)
        except BaseException:
            hooks.call("post_request", worker, req, environ, resp)
            raise
        return _Body(body, lambda: hooks.call("post_request", worker, req, environ, resp), resp)
    return with_hooks


class _Body:
    def __init__(self, body, done, resp):
        self.body, self.done, self.resp = body, done, resp

    def __iter__(self):
        for chunk in self.body:
            self.resp.sent += len(chunk)
            yield chunk

    def close(self):
        try:
            close = getattr(self.body, "close", None)
            if close:
                close()
        finally:
            self.done()
