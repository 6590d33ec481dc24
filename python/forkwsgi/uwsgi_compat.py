"""uWSGI's ini files, so that `forkwsgi --ini uwsgi.ini` serves what
`uwsgi --ini uwsgi.ini` served: translate() turns the options of an Ini
(uwsgi_ini.py reads the file) into forkwsgi settings (MAPPED says which),
the app spec (module / wsgi-file / callable), and warnings: an option with
no counterpart here whose absence changes nothing a user relies on names
what to use instead (uwsgi_unmapped.py), a typo gets a "did you mean", any
other name is ignored with a warning (uWSGI takes it as a placeholder: one
that another option refers to is silent here too). What cannot be served
as configured (the uwsgi protocol without --uwsgi-socket, TLS, FastCGI, a
route, a static map, a mule, a hook, ...) is an IniError: the server does
not start. Where uWSGI's default differs from forkwsgi's (no harakiri: no
timeout; unix sockets made under the process's umask; 60 s of reload
mercy), the translation sets uWSGI's, so that the command line still
overrides it.

It imports nothing of forkwsgi but its uwsgi_* siblings (config.py applies
what it returns to the settings registry).
"""
import glob
import math
import os
import re
import sys

from .uwsgi_ini import IniError
from .uwsgi_unmapped import ACCEPTED, LOGS, NO_COUNTERPART, REFUSED, no_counterpart, refused

UWSGI_FALSE = ("false", "off", "no", "0")


def flag(value):
    """uWSGI's booleans: false, off, no, 0 (any case) are false; anything
    else, the empty value too (`master` alone on a line), is true."""
    return value.strip().lower() not in UWSGI_FALSE


def address(value, key):
    """A uWSGI socket address as --bind takes it: ':8000' listens on every
    interface (as in uWSGI), a value without ':' is a unix socket path."""
    v = value.strip()
    if not v:
        raise IniError(f"{key} = (empty): give an address")
    if v[0] in "@=":
        raise IniError(f"{key} = {v}: abstract unix sockets and =N socket references are not taken: "
                       "give a path or HOST:PORT")
    if ":" not in v:
        return "unix:" + v
    host, _, port = v.rpartition(":")
    if host in ("", "*"):
        return f"0.0.0.0:{port}"
    return v


HTTP_PROTOCOLS = ("http", "http11")
NO_ADDRESS = ("no socket, http-socket or http: uWSGI does not start without one (\"The -s/--socket option "
              "is missing and stdin is not a socket.\"): add http-socket = HOST:PORT (or give --bind / "
              "--uwsgi-socket on the command line)")

UWSGI_PROTOCOL_MISSING = ("the uwsgi protocol is not available in this forkwsgi: use http-socket "
                          "(and nginx's proxy_pass instead of uwsgi_pass)")


class Translation:
    """forkwsgi settings from an Ini: values[setting] = (value, uWSGI key)
    (a list for a repeatable one), app (a spec or None), warnings."""

    def __init__(self, ini, settings):
        self.ini = ini
        self.settings = settings          # forkwsgi's settings: name -> default
        self.values = {}
        self.warnings = []
        self.module = self.wsgi_file = None
        self.callable = None
        self.logto = None
        self.logging = True
        self.app = None
        self.protocol = "uwsgi"           # of `socket` (protocol = http: HTTP there)
        self.mercy = []                   # (seconds, key) of reload-mercy, worker-reload-mercy
        # Set when the ini gives no address to serve on: uWSGI refuses to
        # start then, and so must forkwsgi unless an address comes from
        # elsewhere (--bind, --uwsgi-socket, FORKWSGI_BIND, PORT): the text
        # of that refusal, for the caller that knows (config.py).
        self.no_address = None

    def set(self, name, value, key):
        self.values[name] = (value, key)

    def add(self, name, value, key):
        old = self.values.get(name, ([], key))[0]
        self.values[name] = (old + [value], key)

    def warn(self, text):
        self.warnings.append(f"{self.ini.where()}: {text}")

    def fail(self, text):
        raise IniError(f"{self.ini.where()}: {text}")


def _set_as(name, convert=None):
    """A handler setting forkwsgi's `name` to the value (converted)."""
    def handle(t, key, value):
        t.set(name, convert(value) if convert else value, key)
    return handle


def _megabytes(value):
    """reload-on-rss: MiB as uWSGI reads them (a fraction too); --max-rss is
    whole MiB, rounded up."""
    try:
        mib = float(value)
    except ValueError:
        return value                        # the registry says what is wrong with it
    return str(math.ceil(mib))


def _octal(value):
    """umask: uWSGI reads it in octal; --umask takes 0-prefixed octal."""
    v = value.strip()
    return "0o" + v if v and set(v) <= set("01234567") else v


def _socket_mode(value):
    """chmod-socket: nothing (or 1) is 666; else three octal digits."""
    v = value.strip()
    if v in ("", "1"):
        return "666"
    return v


def _bind(t, key, value):
    t.add("bind", address(value, key), key)


def _socket(t, key, value):
    """socket speaks the default protocol: uwsgi, or HTTP under protocol = http."""
    if t.protocol in HTTP_PROTOCOLS:
        _bind(t, key, value)
    else:
        _uwsgi_socket(t, key, value)


def _protocol(t, key, value):
    pass                                  # read before the other options: translate()


def _mercy(t, key, value):
    """reload-mercy (the whole reload or shutdown) and worker-reload-mercy
    (each worker's): seconds the workers get to finish before they are
    killed; forkwsgi's --graceful-timeout bounds them both."""
    try:
        t.mercy.append((float(value), key))
    except ValueError:
        t.fail(f"{key} = {value!r}: a number of seconds")


def _uwsgi_socket(t, key, value):
    # The uwsgi protocol is served when this forkwsgi has a uwsgi_socket
    # setting (--uwsgi-socket); looked up by name so that it is used as
    # soon as it exists.
    if "uwsgi_socket" not in t.settings:
        t.fail(f"{key} = {value}: {UWSGI_PROTOCOL_MISSING}")
    t.add("uwsgi_socket", address(value, key), key)


def _pythonpath(t, key, value):
    # uWSGI takes a glob too; a directory that matches nothing is taken as written.
    found = sorted(glob.glob(value)) if re.search(r"[*?[]", value) else [value]
    for p in found or [value]:
        t.add("pythonpath", p, key)


def _env(t, key, value):
    t.add("raw_env", value, key)


def _module(t, key, value):
    t.module = value


def _wsgi_file(t, key, value):
    t.wsgi_file = value


def _callable(t, key, value):
    t.callable = value


def _master(t, key, value):
    if not flag(value):
        t.warn(f"{key} = {value}: forkwsgi's workers always run under a master (processes = 0 serves "
               "from one process, with none)")


def _need_app(t, key, value):
    if not flag(value):
        t.warn(f"{key} = {value}: forkwsgi never starts without its app (an import error stops it)")


def _die_on_term(t, key, value):
    if not flag(value):
        t.warn(f"{key} = {value}: SIGTERM stops forkwsgi gracefully; SIGHUP reloads")


def _lazy_apps(t, key, value):
    t.set("lazy_apps", flag(value), key)


def _buffer_size(t, key, value):
    """buffer-size bounds the whole request head in uWSGI, the request line
    included: both limits are raised to it (never lowered below forkwsgi's
    own)."""
    try:
        n = int(value)
    except ValueError:
        t.fail(f"{key} = {value!r}: a number of bytes")
    for name in ("limit_request_line", "limit_request_head"):
        t.set(name, max(n, t.settings[name]), key)


def _post_buffering(t, key, value):
    try:
        n = int(value)
    except ValueError:
        t.fail(f"{key} = {value!r}: a number of bytes")
    if n > 0:                       # 0: uWSGI's default, no buffering
        t.set("spool_threshold", n, key)


def _limit_post(t, key, value):
    try:
        n = int(value)
    except ValueError:
        t.fail(f"{key} = {value!r}: a number of bytes")
    if n > 0:                       # 0: uWSGI's default, no limit (forkwsgi's is 1 GiB)
        t.set("limit_request_body", n, key)


def _logto(t, key, value):
    v = value.strip()
    if ":" in v and "/" not in v:
        t.fail(f"{key} = {v}: logging over UDP is not done here (the log would not reach it): " + LOGS)
    t.logto = v


def _disable_logging(t, key, value):
    t.logging = not flag(value)


def _plugins(t, key, value):
    # Python is built in; so is HTTP (http-socket, and what `http` becomes).
    others = [p for p in re.split(r"[,\s]+", value)
              if p and not re.fullmatch(r"python\d*|http|corerouter", p)]
    if others:
        t.warn(f"{key} = {value}: plugin(s) {', '.join(others)} have no counterpart here: ignored")


def _home(t, key, value):
    # Nothing to say when it is the Python forkwsgi runs in.
    if os.path.realpath(value) != os.path.realpath(sys.prefix):
        t.warn(f"{key} = {value}: forkwsgi runs in the Python it is started with ({sys.prefix}): start "
               "the virtualenv's (VENV/bin/forkwsgi); ignored")


def _stats(t, key, value):
    t.set("stats", address(value, key), key)


# uWSGI option -> handler(translation, key, value).
MAPPED = {
    "module": _module, "wsgi": _module,
    "wsgi-file": _wsgi_file, "file": _wsgi_file,
    "callable": _callable,
    "master": _master,
    "processes": _set_as("workers"), "workers": _set_as("workers"),
    "threads": _set_as("threads"),
    "harakiri": _set_as("timeout"),
    "max-requests": _set_as("max_requests"),
    "reload-on-rss": _set_as("max_rss", _megabytes),
    "http-socket": _bind, "http": _bind, "http11-socket": _bind,
    "socket": _socket, "uwsgi-socket": _uwsgi_socket,
    "protocol": _protocol, "socket-protocol": _protocol,
    "reload-mercy": _mercy, "worker-reload-mercy": _mercy,
    "chown-socket": _set_as("chown_socket"),
    "chmod-socket": _set_as("chmod_socket", _socket_mode), "chmod": _set_as("chmod_socket", _socket_mode),
    "stats": _stats, "stats-server": _stats,
    "buffer-size": _buffer_size,
    "post-buffering": _post_buffering,
    "limit-post": _limit_post,
    "listen": _set_as("backlog"),
    "chdir": _set_as("chdir"),
    "pythonpath": _pythonpath, "python-path": _pythonpath, "pp": _pythonpath,
    "env": _env,
    "uid": _set_as("user"), "gid": _set_as("group"),
    "lazy-apps": _lazy_apps, "lazy": _lazy_apps,
    "home": _home, "virtualenv": _home, "venv": _home, "pyhome": _home,
    "need-app": _need_app,
    "die-on-term": _die_on_term,
    "logto": _logto, "logto2": _logto,
    "disable-logging": _disable_logging,
    "plugins": _plugins, "plugin": _plugins,
    "pidfile": _set_as("pidfile"), "pidfile2": _set_as("pidfile"),
    "umask": _set_as("umask", _octal),
}

# Every name translate() knows (for "did you mean").
KNOWN = (*MAPPED, *ACCEPTED, *REFUSED, *NO_COUNTERPART)


def translate(ini, settings, suggest):
    """A Translation of the Ini `ini`. settings: forkwsgi's settings, name ->
    default (a uwsgi_socket one is used when there); suggest(name, names):
    the name a typo was meant to be, or None."""
    t = Translation(ini, settings)
    strict = any(k == "strict" and flag(v) for k, v in ini.options)
    _read_protocol(t, ini.options)
    unknown = []
    for key, value in ini.options:
        if key in MAPPED:
            MAPPED[key](t, key, value)
        elif refused(key):
            t.fail(f"{key} = {value}: {refused(key)}")
        elif key in ACCEPTED:
            continue
        elif no_counterpart(key):
            t.warn(f"{key!r} (uWSGI) has no counterpart here: ignored; {no_counterpart(key)}")
        else:
            unknown.append(key)
    for key in dict.fromkeys(unknown):
        meant = suggest(key, KNOWN)
        if strict:
            # uWSGI's strict mode: an unknown name (placeholders too) stops it.
            t.fail(f"{key!r} is not a uWSGI option (strict = true: a placeholder is declared with "
                   "set-placeholder)" + (f"; did you mean {meant}?" if meant else ""))
        if meant:
            t.warn(f"{key!r} is not a uWSGI option: ignored (did you mean {meant}?)")
        elif key not in ini.referenced:
            t.warn(f"{key!r} is no uWSGI option forkwsgi takes: ignored (uWSGI would take it as a "
                   "placeholder, and no %(...) refers to it)")
    if "pythonpath" in t.values:                 # --pythonpath: one comma-separated value
        paths, key = t.values["pythonpath"]
        t.set("pythonpath", ",".join(paths), key)
    if "uwsgi_socket" in t.values and not isinstance(settings["uwsgi_socket"], list):
        addresses, key = t.values["uwsgi_socket"]      # a setting of one address
        if len(addresses) > 1:
            t.fail(f"{len(addresses)} uwsgi sockets ({key}): this forkwsgi serves one")
        t.set("uwsgi_socket", addresses[0], key)
    _finish_app(t)
    _finish_logs(t)
    _uwsgi_defaults(t)
    return t


def _read_protocol(t, options):
    """protocol (socket-protocol): the protocol of every `socket`, wherever
    it is in the file (the last one given, as uWSGI takes it)."""
    given = [(k, v.strip().lower()) for k, v in options if k in ("protocol", "socket-protocol")]
    if not given:
        return
    key, value = given[-1]
    if value in HTTP_PROTOCOLS:
        t.protocol = "http"
    elif value not in ("uwsgi", ""):
        t.fail(f"{key} = {value}: only the uwsgi and http protocols are spoken here "
               "(http-socket for HTTP, terminate TLS in the proxy in front)")


def _uwsgi_defaults(t):
    """uWSGI's defaults where they differ from forkwsgi's, as settings of
    the ini (the command line, the environment, -c still override them)."""
    if "timeout" not in t.values:
        t.set("timeout", "0", "uWSGI's default: no harakiri")
    if t.mercy:
        seconds, key = min(t.mercy)       # both given: each worker's bound, within the whole one
        t.set("graceful_timeout", str(seconds), key)
    else:
        t.set("graceful_timeout", "60", "uWSGI's default: worker-reload-mercy 60")
    if "chmod_socket" not in t.values and "umask" not in t.values:
        # uWSGI makes its unix sockets under the process's umask (0777 less
        # it), where forkwsgi's default is 0 (0777: any local user could
        # write uwsgi variables into the app). Read without changing it.
        current = os.umask(0o022)
        os.umask(current)
        t.set("umask", f"0o{current:03o}", "uWSGI's default: the process's umask (no chmod-socket, no umask)")
    if "bind" not in t.values and "uwsgi_socket" not in t.values:
        t.no_address = f"{t.ini.where()}: {NO_ADDRESS}"


def _finish_app(t):
    """module (pkg.mod:app, or pkg.mod and callable), or wsgi-file (and
    callable); uWSGI's default callable is `application`."""
    if t.module and t.wsgi_file:
        t.fail("module and wsgi-file are both given: forkwsgi serves one app (keep one)")
    name = t.callable or "application"
    if t.module:
        t.app = t.module if ":" in t.module else f"{t.module}:{name}"
    elif t.wsgi_file:
        path = t.wsgi_file if "/" in t.wsgi_file else "./" + t.wsgi_file    # a path, for appload
        t.app = f"{path}:{name}"


def _finish_logs(t):
    """uWSGI logs every request unless disable-logging, to logto's file (or
    stderr) with its own lines: here the access log (gunicorn's format) goes
    to the same file (or standard output), and so does what the app writes
    to its standard output and error (capture_output), as in uWSGI."""
    if t.logto:
        t.set("error_logfile", t.logto, "logto")
        t.set("capture_output", True, "logto")
    if t.logging:
        t.set("access_logfile", t.logto or "-", "logto" if t.logto else
              "request logging, uWSGI's default (disable-logging turns it off)")
    else:
        t.set("access_logfile", None, "disable-logging")
