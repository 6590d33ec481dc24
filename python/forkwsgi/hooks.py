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

`server` is the master (arbiter.Arbiter: .pid, .log, .cfg, .num_workers),
`worker` a Worker below. A hook that raises is logged with its traceback;
the server goes on. pre_request and post_request cost nothing unless
defined: only then is the app wrapped (one Python call each per request).
"""
import inspect
import logging
import os

from . import gunicorn_compat

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
    try:
        inspect.signature(fn).bind(*range(SIGNATURES[name]))
    except TypeError:
        raise HookError(f"{name} must take {SIGNATURES[name]} argument(s), as in gunicorn") from None
    except ValueError:
        pass                          # a builtin without a signature: trust it
    return fn


class Cfg(dict):
    """The settings dict, readable as hooks read gunicorn's: attributes, by
    forkwsgi's names or gunicorn's (server.cfg.workers, .bind, .loglevel)."""

    def __getattr__(self, name):
        key = gunicorn_compat.ALIASES.get(name, name)
        if key in self:
            return self[key]
        raise AttributeError(name)


class Worker:
    """A worker as hooks see it (gunicorn's Worker, what hooks use of it)."""

    def __init__(self, index, age, log, cfg, pid=None, ppid=None, app=None):
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

    def in_child(self):
        self.pid, self.ppid = os.getpid(), os.getppid()
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
        proto = environ.get("SERVER_PROTOCOL", "HTTP/1.1")
        self.version = (1, 1) if proto.endswith("1.1") else (1, 0)
        self.headers = [(k[5:].replace("_", "-"), v) for k, v in environ.items() if k.startswith("HTTP_")]
        for k in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if k in environ:
                self.headers.append((k.replace("_", "-"), environ[k]))
        self.remote_addr = environ.get("REMOTE_ADDR")


class Response:
    """`resp` of post_request: the status and headers the app gave, the body
    bytes it produced (sent)."""

    def __init__(self):
        self.status = None
        self.status_code = None
        self.headers = []
        self.sent = 0


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
