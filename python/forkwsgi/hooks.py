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
truly; a gunicorn attribute with no true counterpart here raises an
AttributeError that says what to use instead (resp.chunked: the C core
decides the framing as it sends). pre_request and post_request cost
nothing unless defined: only then is the app wrapped (one Python call
each per request).

A hook that raises does what it does in gunicorn (FAILURE below):
on_starting, when_ready and the first nworkers_changed stop the start
(exit 1); pre_fork, child_exit, on_reload and a later nworkers_changed
stop the master and its workers (exit 255: gunicorn's "Unhandled exception
in main loop"); post_fork and post_worker_init mean the worker cannot boot
(exit 3: before anything has served, the master stops with "failed to
boot", as gunicorn's; after, the master's back-off retries it while the
others serve on); pre_request answers 500 without calling the app;
on_exit makes the exit status 1; post_request, worker_exit, worker_int,
worker_abort and pre_exec are logged and the server goes on.

pre_request may change req.headers, .path, .query, .method, .uri,
.scheme, .version and .body: the app gets the environ as they are after
the hook (gunicorn builds the environ then), with the server's mapping
of header names (Request.apply).

At start, nworkers_changed(server, N, None) comes first, before
on_starting, as in gunicorn (which calls it when it first sets the
number of workers).
"""
import logging
import os
import socket
import sys

from . import binding, gunicorn_compat, process

# name -> number of positional arguments (gunicorn's).
SIGNATURES = {
    "on_starting": 1, "on_reload": 1, "when_ready": 1, "pre_fork": 2, "post_fork": 2,
    "post_worker_init": 1, "worker_int": 1, "worker_abort": 1, "pre_exec": 1, "pre_request": 2,
    "post_request": 4, "child_exit": 2, "worker_exit": 2, "nworkers_changed": 3, "on_exit": 1,
}


# What a hook that raises does (gunicorn's arbiter.py, workers/base.py):
#   start   the master does not start: exit 1 (the exception leaves gunicorn's Arbiter.run)
#   master  the master stops its workers now and exits 255 ("Unhandled exception in main loop")
#   fork    (in the worker, before worker.run) it cannot boot: worker_exit, exit 3
#   boot    (in worker.run) it cannot boot: raised on, worker.run exits 3 ("Worker failed to boot")
#   request raised on to the server: 500, the app is not called (Request, wrap)
#   exit    the master's exit status is 1
#   log     logged with its traceback; the server goes on
FAILURE = {
    "on_starting": "start", "when_ready": "start", "nworkers_changed": "master", "pre_fork": "master",
    "child_exit": "master", "on_reload": "master", "post_fork": "fork", "post_worker_init": "boot",
    "pre_request": "request", "on_exit": "exit", "post_request": "log", "worker_exit": "log",
    "worker_int": "log", "worker_abort": "log", "pre_exec": "log",
}

# The hooks whose first argument is the master (`server`): they get it as a
# MasterView.
SERVER_FIRST = ("on_starting", "when_ready", "on_reload", "pre_fork", "post_fork", "pre_exec", "child_exit",
                "nworkers_changed", "on_exit", "worker_exit")

BOOT_ERROR = 3          # worker.WORKER_BOOT_ERROR (gunicorn's number)
MAIN_LOOP_ERROR = 255   # gunicorn's sys.exit(-1) after "Unhandled exception in main loop"


class HookError(ValueError):
    pass


def _missing(obj, name, instead):
    """The AttributeError for gunicorn's attribute `name`, which has no
    true counterpart here: `instead` says what to use."""
    why = instead.get(name)
    if why is None:
        return AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
    return AttributeError(f"{name}: not in forkwsgi ({why})")


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

    @property
    def settings(self):
        """gunicorn's cfg.settings: {name: setting}, each with .name, .value
        and .get(); by forkwsgi's names and by gunicorn's that differ
        (loglevel, accesslog, ...), and worker_class and preload_app. A
        copy: changing it changes nothing."""
        out = {k: Setting(k, v) for k, v in self.items()}
        for gname, name in gunicorn_compat.ALIASES.items():
            if name in self:
                out[gname] = Setting(gname, self[name])
        for name in ("worker_class", "preload_app"):
            out[name] = Setting(name, getattr(self, name))
        return out

    @property
    def env(self):
        """gunicorn's cfg.env: raw_env (-e KEY=VALUE) as {KEY: VALUE}."""
        return dict(e.partition("=")[::2] for e in self.get("raw_env") or ())

    @property
    def uid(self):
        """The user id the workers run as (--user; else this process's)."""
        return process.Owner(self.get("user"), self.get("group")).uid

    @property
    def gid(self):
        """The group id the workers run as (--group; else --user's group,
        else this process's)."""
        return process.Owner(self.get("user"), self.get("group")).gid


class Setting:
    """One entry of cfg.settings (gunicorn's Setting: what hooks read of it)."""

    def __init__(self, name, value):
        self.name = name
        self.value = value

    def get(self):
        return self.value

    def __repr__(self):
        return f"<Setting {self.name}={self.value!r}>"


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


class MasterView:
    """What hooks get as `server`: the master itself (every attribute is
    the master's, GunicornServer's included, and what a hook sets on it is
    set on the master), plus what gunicorn's Arbiter has besides under
    names the master does not use: .app (gunicorn's Application), .timeout,
    .master_name, .reexec_pid."""

    __slots__ = ("_master",)

    master_name = "Master"      # gunicorn's "Master.2" is the new master of a USR2 upgrade:
                                # forkwsgi re-executes in place (same PID), there is no other
    reexec_pid = 0              # gunicorn's pid of that new master while both run: never here

    def __init__(self, master):
        object.__setattr__(self, "_master", master)

    def __getattr__(self, name):
        return getattr(self._master, name)

    def __setattr__(self, name, value):
        setattr(self._master, name, value)

    def __delattr__(self, name):
        delattr(self._master, name)

    def __repr__(self):
        return f"<forkwsgi master {getattr(self._master, 'pid', '?')}>"

    @property
    def app(self):
        return Application(self._master)

    @property
    def timeout(self):
        """--timeout, in seconds (gunicorn's server.timeout)."""
        return self._master.cfg["timeout"]


class Application:
    """server.app: what hooks use of gunicorn's Application (its settings and
    the WSGI app). The master itself keeps the WSGI app as its own .app."""

    INSTEAD = {"load": "the app is imported by the master (preloaded) or by each worker (--lazy-apps)",
               "reload": "SIGHUP reloads", "load_config": "the config is read at start and on SIGHUP"}

    def __init__(self, master):
        self._master = master

    def __getattr__(self, name):
        raise _missing(self, name, self.INSTEAD)

    @property
    def cfg(self):
        return self._master.cfg

    @property
    def app_uri(self):
        """The app as given (MODULE:APP)."""
        return self._master.app_spec

    @property
    def callable(self):
        """The WSGI app this process imported, or None: with --lazy-apps
        (preload_app = False) the master never imports it (worker.wsgi is
        each worker's)."""
        return self._master.app

    def wsgi(self):
        """The WSGI app this process imported. With --lazy-apps the master
        has none, and does not import it for a hook (gunicorn would, in
        the master): a RuntimeError says so."""
        if self._master.app is None:
            raise RuntimeError("server.app.wsgi(): the app is imported by each worker here (--lazy-apps, "
                               "preload_app = False), not by the master: use worker.wsgi in a worker's hook")
        return self._master.app


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

    def notify(self):
        """gunicorn's heartbeat (it touches worker.tmp): nothing to do here.
        The master does not time a worker's boot (a long post_worker_init
        is fine), and --timeout times each call into the app, which this
        does not extend."""

    INSTEAD = {
        "tmp": "no heartbeat file: the master watches the workers through shared memory (--timeout, "
               "--heartbeat-timeout); worker.notify() is there and has nothing to do",
        "wait_fds": "the C core's event loop waits on the sockets",
        "PIPE": "the C core's event loop waits on the sockets",
        "reloader": "no file reloader: SIGHUP reloads",
    }

    def __getattr__(self, name):
        raise _missing(self, name, self.INSTEAD)


class Hooks:
    def __init__(self, fns, log=None):
        self.fns = dict(fns)
        self.log = log or logging.getLogger("forkwsgi")
        self.exit_status = None         # a master hook failed during a stop: the exit status (on_exit)
        self.said_underscore = set()    # header names with '_' a pre_request added (said once each)

    def __contains__(self, name):
        return name in self.fns

    def call(self, name, *args):
        """Call hook `name` if defined. True when it returned (or is not
        defined); when it raised, what gunicorn does then (FAILURE): False
        once logged, or the exception, or the process's exit."""
        fn = self.fns.get(name)
        if fn is not None:
            given = args
            if name in SERVER_FIRST and args and args[0] is not None:
                given = (MasterView(args[0]),) + args[1:]
            try:
                fn(*given)
            except Exception:  # noqa: BLE001 - user code: what gunicorn does with it
                then = self._failed(name, args)
            else:
                then = None
            if then is not None:
                then()              # out of the except block: what fails there is not "during handling"
            ok = then is None
        else:
            ok = True
        if name == "on_exit" and self.exit_status is not None:
            self._exit(args[0], self.exit_status)
        return ok

    def _failed(self, name, args):
        """Hook `name` raised (the exception is being handled)."""
        how = FAILURE[name]
        if how == "start" or (how == "master" and name == "nworkers_changed" and args[2] is None):
            # nworkers_changed(server, N, None): gunicorn's Arbiter() sets
            # the number of workers before anything else.
            self.log.exception("hook %s raised: not starting (exit 1), as gunicorn", name)
            self._exit(args[0], 1)
        if how == "master":
            return self._stop_master(name, args[0])
        if how == "fork":
            self._cannot_boot(name, args[0], args[1])
        if how == "boot":
            self.log.error("hook %s raised: worker %s cannot boot (exit %d), as in gunicorn; the traceback follows",
                           name, getattr(args[0], "index", "?"), BOOT_ERROR)
            raise
        if how == "request":
            raise
        if how == "exit":
            self.log.exception("hook %s raised: exit status 1, as gunicorn's", name)
            self.exit_status = 1
            return _nothing
        self.log.exception("hook %s raised", name)
        return _nothing

    def _stop_master(self, name, master):
        """A master hook raised where gunicorn's arbiter stops for it: the
        workers stop now, the master exits 255 (what to do once out of the
        except block). During a stop, the stop goes on and the exit status
        says it."""
        if self.exit_status is None:
            self.exit_status = MAIN_LOOP_ERROR
        if getattr(master, "stopping", False):
            self.log.exception("hook %s raised during the stop: exit status %d, as gunicorn's", name,
                               self.exit_status)
            return _nothing
        self.log.exception("hook %s raised: the master stops now (exit %d), as gunicorn's", name, MAIN_LOOP_ERROR)

        def stop():
            master.stop(graceful=False)
            raise SystemExit(MAIN_LOOP_ERROR)
        return stop

    def _cannot_boot(self, name, master, worker):
        """post_fork raised, in the new worker (which has not run anything
        of its own yet): it ends as one that cannot boot (gunicorn: exit 3,
        worker_exit first), and never returns into the master's code."""
        try:
            self.log.exception("hook %s raised: worker %s cannot boot (exit %d), as in gunicorn", name,
                               getattr(worker, "index", "?"), BOOT_ERROR)
            if worker is not None:
                worker.alive = False
            self.call("worker_exit", master, worker)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError, AttributeError):
                    pass
        finally:
            os._exit(BOOT_ERROR)

    def _exit(self, master, status):
        """End the master with `status`: what it would still remove goes
        first (arbiter: discard)."""
        discard = getattr(master, "discard", None)
        if discard:
            try:
                discard()
            except Exception:  # noqa: BLE001 - the exit goes on
                self.log.exception("while stopping")
        raise SystemExit(status)


def _nothing():
    pass


class Request:
    """What pre_request/post_request get as `req` (gunicorn's Request, the
    parts hooks use). What pre_request changes of it the app sees (apply)."""

    INSTEAD = {
        "req_number": "the server does not count requests per connection; worker.nr counts the worker's",
        "trailers": "the trailer fields of a chunked body are checked and dropped by the server, not kept",
        "proxy_protocol_info": "with --proxy-protocol, REMOTE_ADDR and REMOTE_PORT (req.peer_addr) are the "
                               "client the PROXY header names",
        "must_close": "req.should_close() says whether the client asked to close",
        "unreader": "the server's C core reads the request",
    }

    def __init__(self, environ):
        self.method = environ["REQUEST_METHOD"]
        self.uri = environ.get("RAW_URI") or environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        # As gunicorn's: the path of the request line as sent (percent-
        # encoded, with the --root-path prefix), not PATH_INFO.
        self.path = _path_of(self.uri)
        self.query = environ.get("QUERY_STRING", "")
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
        self._was = (self.method, self.uri, self.path, self.query, self.scheme, self.version, self.body,
                     list(self.headers))

    def __getattr__(self, name):
        raise _missing(self, name, self.INSTEAD)

    def should_close(self):
        """gunicorn's: does the client want the connection closed after
        this request (Connection: close, HTTP/1.0 without keep-alive,
        CONNECT)?"""
        if self.method == "CONNECT":
            return True
        for name, value in self.headers:
            if name.upper() == "CONNECTION":
                value = value.lower().strip(" \t")
                if value == "close":
                    return True
                if value == "keep-alive":
                    return False
                break
        return self.version <= (1, 0)

    def apply(self, environ, hooks):
        """What pre_request changed, into the environ the app gets (gunicorn
        builds the environ after pre_request). Only what changed is
        touched."""
        method, uri, path, query, scheme, version, body, headers = self._was
        if self.headers != headers:
            _put_headers(environ, self.headers, hooks)
        if self.path != path:
            _put_path(environ, self.path)
        if self.query != query:
            environ["QUERY_STRING"] = self.query
        if self.method != method:
            environ["REQUEST_METHOD"] = self.method
        if self.uri != uri:
            environ["RAW_URI"] = self.uri
        if self.scheme != scheme:
            environ["wsgi.url_scheme"] = self.scheme
        if self.version != version:
            environ["SERVER_PROTOCOL"] = "HTTP/%s" % ".".join(str(v) for v in self.version)
        if self.body is not body:
            environ["wsgi.input"] = self.body


def _path_of(uri):
    """The path of a request target, as gunicorn splits it (its query and
    fragment off; the absolute form's scheme and host off)."""
    if uri.startswith("/") or uri == "*":
        return uri.partition("#")[0].partition("?")[0]
    from urllib.parse import urlsplit       # the absolute form (a proxy's): rare
    return urlsplit(uri).path


def _put_headers(environ, headers, hooks):
    """The environ's header entries from req.headers, mapped as the server
    maps a request's fields: CONTENT_TYPE and CONTENT_LENGTH, else HTTP_
    and the name upper-cased with '-' as '_'; a name with '_' left out (so
    it cannot pose as its '-' twin, as the server does for a client's);
    a repeated name's values joined with ", "."""
    for key in [k for k in environ if k.startswith("HTTP_") or k in ("CONTENT_TYPE", "CONTENT_LENGTH")]:
        del environ[key]
    for name, value in headers:
        name = str(name).upper()
        if "_" in name:
            if name not in hooks.said_underscore:
                hooks.said_underscore.add(name)
                hooks.log.warning("pre_request put the header %r in req.headers: a name with '_' is left out of "
                                  "the environ, as the server leaves out a client's (gunicorn's header_map = "
                                  "'drop'); use '-'", name)
            continue
        key = ("CONTENT_TYPE" if name == "CONTENT-TYPE" else "CONTENT_LENGTH" if name == "CONTENT-LENGTH"
               else "HTTP_" + name.replace("-", "_"))
        environ[key] = environ[key] + ", " + value if key in environ else value


def _put_path(environ, path):
    """PATH_INFO from a path a pre_request set: percent-decoded once, as a
    WSGI (latin-1) str, the --root-path prefix (SCRIPT_NAME) taken off the
    front as the server does."""
    from urllib.parse import unquote_to_bytes
    decoded = unquote_to_bytes(path).decode("latin-1")
    prefix = environ.get("SCRIPT_NAME", "")
    n = len(prefix)
    if prefix and decoded.startswith(prefix) and (len(decoded) == n or decoded[n] == "/"):
        decoded = decoded[n:]
    environ["PATH_INFO"] = decoded


class Response:
    """`resp` of post_request: the status and headers the app gave, the body
    bytes it produced (sent), the length its Content-Length header
    announced (response_length, None without one), its request (req) and
    the server's name (version: what the Server header says)."""

    version = "forkwsgi"

    INSTEAD = {
        "chunked": "the C core chooses the framing as it sends (it gives a body it has whole a "
                   "Content-Length); resp.response_length is the app's own Content-Length",
        "should_close": "the C core decides whether the connection stays open; req.should_close() says "
                        "whether the client asked to close",
        "headers_sent": "post_request runs once the response is done",
        "must_close": "the C core decides whether the connection stays open",
    }

    def __init__(self, req=None):
        self.req = req
        self.status = None
        self.status_code = None
        self.headers = []
        self.sent = 0
        self.response_length = None

    def __getattr__(self, name):
        raise _missing(self, name, self.INSTEAD)


def wrap(app, hooks, worker):
    """The app with pre_request/post_request around it (only called when one
    of them is defined). post_request runs when the response is done (the
    server closes its iterable). A pre_request that raises: the app is not
    called, post_request gets ({}, None) as in gunicorn, and the exception
    goes on to the server, which logs it ("Error handling request") and
    answers 500."""
    def with_hooks(environ, start_response):
        req = Request(environ)
        try:
            hooks.call("pre_request", worker, req)
        except Exception:
            hooks.call("post_request", worker, req, {}, None)
            raise
        req.apply(environ, hooks)
        resp = Response(req)

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
