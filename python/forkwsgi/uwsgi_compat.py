"""uWSGI's ini files, so that `forkwsgi --ini uwsgi.ini` serves what
`uwsgi --ini uwsgi.ini` served.

read() takes one section of the file (`[uwsgi]`, or the one `FILE:SECTION`
names) with uWSGI's value syntax: magic variables (%d the file's directory,
%n its name, ...) over the whole text, then `$(VAR)` from the environment,
then `%(option)` references to other options of the file. translate() turns
the options into forkwsgi settings (MAPPED says which), the app spec
(module / wsgi-file / callable), and warnings: an option with no counterpart
here names what to use instead (NO_COUNTERPART), a typo gets a "did you
mean", any other name is ignored with a warning (uWSGI takes it as a
placeholder: one that another option refers to is silent here too). What
cannot be served as configured (the uwsgi protocol without --uwsgi-socket,
TLS, FastCGI) is an IniError: the server does not start.

A leaf module: it imports nothing of forkwsgi (config.py applies what it
returns to the settings registry).
"""
import glob
import math
import os
import re
import socket
import sys
import time

DEFAULT_SECTION = "uwsgi"
MAX_EXPANSIONS = 100          # placeholders expanded in one value at most (a = %(a) would loop)


class IniError(Exception):
    """What makes the file unusable: one line, the server does not start."""


def split_spec(spec):
    """'FILE' or 'FILE:SECTION' -> (FILE, SECTION): uWSGI splits at the last
    colon; an empty section is the default one."""
    path, sep, section = str(spec).rpartition(":")
    if not sep:
        return str(spec), DEFAULT_SECTION
    if not path:
        raise IniError(f"--ini {spec}: no file before ':{section}'")
    return path, section or DEFAULT_SECTION


# ---- reading ----------------------------------------------------------------

def magic_table(path, spec, section):
    """uWSGI's magic variables (%d, %n, ...) for the ini file `path`."""
    full = os.path.abspath(path) if os.path.islink(path) else os.path.realpath(path)
    directory = os.path.dirname(full)
    base = os.path.basename(full)
    name, dot, ext = base.rpartition(".")
    if not dot:
        name, ext = base, ""
    table = {
        "o": spec, "p": full, "s": base, "n": name, "e": ext,
        "d": directory.rstrip("/") + "/",                   # uWSGI's %d ends with '/'
        "c": os.path.basename(directory), "x": "" if section == DEFAULT_SECTION else section,
        "v": os.getcwd(), "h": socket.gethostname(), "k": str(os.cpu_count() or 1),
        "u": str(os.getuid()), "g": str(os.getgid()),
        "t": str(int(time.time())), "T": str(int(time.time() * 1e6)),
        "%": "%", "(": "%(",                                  # %(option) is expanded later
    }
    try:
        import grp
        import pwd
        table["U"] = pwd.getpwuid(os.getuid()).pw_name
        table["G"] = grp.getgrgid(os.getgid()).gr_name
    except (KeyError, ImportError):
        table["U"], table["G"] = table["u"], table["g"]
    for i, part in enumerate([p for p in directory.split("/") if p][:10]):
        table[str(i)] = part                                 # %0..%9: the directory's parts
    for k in "ODSPCENX":                                      # the first file's: this one
        table[k] = table[k.lower()]
    return table


def expand_magic(text, table):
    """Every %X in the text: uWSGI replaces each one, an unknown X by nothing."""
    return re.sub(r"%(.)", lambda m: table.get(m.group(1), ""), text, flags=re.DOTALL)


def parse_lines(text, section):
    """(key, value) of the section, in file order, as uWSGI's ini reader
    takes them: blank lines and lines starting with ; or # are skipped, a
    key without '=' has the value ''. None if the section is missing; also
    the sections seen."""
    current, found, sections, options = "", False, [], []
    for line in text.split("\n"):
        line = line.strip(" \t\r")
        if not line or line[0] in ";#":
            continue
        if line[0] == "[":
            current = line[1:-1]
            sections.append(current)
            continue
        if current == section:
            found = True
            key, _, value = line.partition("=")
            options.append((key.rstrip(" \t\r"), value.strip(" \t\r")))
    return (options if found or section in sections else None), sections


def _placeholders(value, symbol, lookup):
    """uWSGI's $(...) and %(...) in one value: each one whose lookup gives a
    value is replaced, and the scan starts over (a replacement may hold
    more); one with none stays as written."""
    opener = symbol + "("
    start = 0
    for _ in range(MAX_EXPANSIONS):
        at = value.find(opener, start)
        if at < 0:
            return value
        depth, end = 0, None
        for i in range(at + 2, len(value)):
            if value[i] == "(":
                depth += 1
            elif value[i] == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
        if end is None:
            return value
        found = lookup(value[at + 2:end])
        if found is None:
            start = end + 1
            continue
        value, start = value[:at] + found + value[end + 1:], 0
    raise IniError(f"placeholders in {value[:60]!r} expand more than {MAX_EXPANSIONS} times (one refers to itself?)")


def env_lookup(environ):
    """$(VAR), $(VAR:-DEFAULT) (unset or empty), $(VAR-DEFAULT) (unset)."""
    def lookup(key):
        if ":-" in key:
            name, _, default = key.partition(":-")
            return environ.get(name) or default
        if "-" in key:
            name, _, default = key.partition("-")
            return environ.get(name, default)
        return environ.get(key)
    return lookup


class Ini:
    """One section of a uWSGI ini file, its values expanded."""

    def __init__(self, spec, environ=None):
        environ = os.environ if environ is None else environ
        self.spec = str(spec)
        self.path, self.section = split_spec(spec)
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as e:
            raise IniError(f"cannot read ini file {self.path}: {e.strerror}") from None
        text = expand_magic(text, magic_table(self.path, self.spec, self.section))
        options, sections = parse_lines(text, self.section)
        if options is None:
            have = ", ".join(f"[{s}]" for s in dict.fromkeys(sections)) or "none"
            raise IniError(f"ini file {self.path} has no [{self.section}] section (its sections: {have})")
        # set-placeholder / set-ph: a name for %(...) only, not an option.
        self.declared = {}
        for key, value in options:
            if key in ("set-placeholder", "set-ph"):
                name, sep, v = value.partition("=")
                if not sep:
                    raise IniError(f"{self.where()}: {key} = {value!r}: use NAME=VALUE")
                self.declared.setdefault(name, v)
        getenv = env_lookup(environ)
        options = [(k, _placeholders(v, "$", getenv)) for k, v in options]
        first = dict(reversed(options))              # %(name): the first value given
        first = {**self.declared, **first}
        self.referenced = set()

        def option(name):
            if name in first and " " not in name:
                self.referenced.add(name)
                return first[name]
            return None
        self.options = [(k, _placeholders(v, "%", option)) for k, v in options]

    def where(self):
        return f"ini file {self.spec}"


# ---- translating -------------------------------------------------------------

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


# What the server cannot do as configured: it does not start.
REFUSED = {
    "https-socket": "TLS is not served here: terminate it in the proxy in front (nginx, HAProxy) and use "
                    "http-socket behind it",
    "https": "TLS is not served here: terminate it in the proxy in front (nginx, HAProxy) and use "
             "http-socket behind it",
    "ssl-socket": "TLS is not served here: terminate it in the proxy in front",
    "suwsgi-socket": "TLS is not served here: terminate it in the proxy in front",
    "fastcgi-socket": "FastCGI is not spoken here: use http-socket (nginx: proxy_pass)",
    "fastcgi-nph-socket": "FastCGI is not spoken here: use http-socket (nginx: proxy_pass)",
    "scgi-socket": "SCGI is not spoken here: use http-socket (nginx: proxy_pass)",
    "scgi-nph-socket": "SCGI is not spoken here: use http-socket (nginx: proxy_pass)",
    "raw-socket": "raw sockets are not served here: use http-socket",
    "puwsgi-socket": "the persistent uwsgi protocol is not spoken here: use http-socket (nginx: proxy_pass)",
}

UWSGI_PROTOCOL_MISSING = ("the uwsgi protocol is not available in this forkwsgi: use http-socket "
                          "(and nginx's proxy_pass instead of uwsgi_pass)")

# Options accepted with nothing to do: what they ask for is how forkwsgi always is.
ACCEPTED = {
    "enable-threads": "app threads and threads the app starts always run",
    "thunder-lock": "workers never race for accept(): the least busy one takes the connection",
    "single-interpreter": "one interpreter per process",
    "auto-procname": "process titles are always set (forkwsgi: worker N)",
    "no-orphans": "workers die with their master",
    "harakiri-verbose": "--timeout always logs the request and every thread's stack",
    "http-keepalive": "keep-alive is on (--keep-alive 75)",
    "post-buffering-bufsize": "request bodies are read by the C core",
    "ignore-sigpipe": "the C core writes the responses: a client gone raises nothing in the app",
    "ignore-write-errors": "the C core writes the responses: a client gone raises nothing in the app",
    "disable-write-exception": "the C core writes the responses: a client gone raises nothing in the app",
    "log-master": "the server's processes log to one stderr",
    "threaded-logger": "the access log is written by a thread of each worker, never blocking a request",
    "log-reopen": "SIGUSR1 reopens the log files",
    "logfile-chown": "the log files are given to --user",
    "memory-report": "--stats and --metrics show each worker's resident memory",
    "vacuum": "the pid file is removed at exit; a stale unix socket is replaced at start",
    "strict": None,
    "set-placeholder": None,
    "set-ph": None,
}

_PREFORK = "--workers N (fixed; SIGTTIN / SIGTTOU add or remove one)"
_STATIC = "serve static files from the proxy in front (nginx) or the app (whitenoise)"
_RELOAD = "reload with SIGHUP (systemctl reload): new code, same PID"
_LOGS = "the server logs to stderr (or --error-logfile); the access log is --access-logfile"
_ROUTING = "routing and headers belong to the proxy in front (nginx) or the app"
_SIDE = "run it as a process of its own (a systemd unit, a container); forkwsgi.offload() for side effects"

# uWSGI options forkwsgi has no counterpart for, and what to use instead.
NO_COUNTERPART = {
    **dict.fromkeys(("cheaper", "cheaper-initial", "cheaper-step", "cheaper-algo", "cheaper-overload",
                     "cheaper-rss-limit-soft", "cheaper-rss-limit-hard", "idle", "die-on-idle"), _PREFORK),
    **dict.fromkeys(("static-map", "static-map2", "check-static", "static-index", "static-expires",
                     "static-expires-type", "static-expires-uri", "static-gzip-all", "static-skip-ext",
                     "offload-threads", "static-safe"), _STATIC),
    **dict.fromkeys(("touch-reload", "touch-chain-reload", "py-autoreload", "py-auto-reload",
                     "python-autoreload", "fs-reload", "fs-brutal-reload"), _RELOAD),
    **dict.fromkeys(("log-format", "logformat", "log-date", "log-x-forwarded-for", "log-4xx", "log-5xx",
                     "log-slow", "log-big", "log-zero", "log-sendfile", "log-ioerror", "req-logger", "logger",
                     "log-route", "log-encoder", "log-maxsize", "log-backupname", "logfile-chmod",
                     "log-micros", "log-format-strftime"),
                    _LOGS + " (gunicorn's atoms: --access-logformat); rotate with logrotate and SIGUSR1"),
    **dict.fromkeys(("route", "route-if", "route-if-not", "route-run", "route-host", "route-uri",
                     "route-qs", "route-label", "response-route", "final-route", "error-route",
                     "add-header", "del-header", "pull-header", "collect-header"), _ROUTING),
    **dict.fromkeys(("mule", "mules", "farm", "spooler", "spooler-processes", "spooler-import",
                     "cron", "cron2", "unique-cron", "legion-cron", "attach-daemon", "attach-daemon2",
                     "smart-attach-daemon", "smart-attach-daemon2", "attach-control-daemon"), _SIDE),
    **dict.fromkeys(("procname", "procname-prefix", "procname-prefix-spaced", "procname-append",
                     "procname-master"), "--name NAME (titles become forkwsgi: worker N [NAME])"),
    **dict.fromkeys(("gevent", "async", "ugreen", "greenlet", "asyncio", "tornado"),
                    "no async loop: --threads N app threads per worker"),
    **dict.fromkeys(("emperor", "emperor-tyrant", "vassals-include", "vassal-set"),
                    "no Emperor: run one forkwsgi per app (a systemd unit each)"),
    **dict.fromkeys(("cache", "cache2", "sharedarea", "queue"), "no shared cache: use Redis or memcached"),
    "max-requests-delta": "--max-requests-jitter N",
    "max-worker-lifetime": "--max-requests N or --max-rss MiB",
    "max-worker-lifetime-delta": "--max-requests-jitter N",
    "min-worker-lifetime": "workers are replaced as they retire, never in a loop (restarts back off)",
    "evil-reload-on-rss": "reload-on-rss (--max-rss), a graceful recycle",
    "reload-on-as": "reload-on-rss (--max-rss MiB)",
    "evil-reload-on-as": "reload-on-rss (--max-rss MiB)",
    "limit-as": "a memory limit of the unit or container (systemd MemoryMax=)",
    "reload-mercy": "--graceful-timeout SECONDS",
    "worker-reload-mercy": "--graceful-timeout SECONDS",
    "socket-timeout": "--header-timeout, --body-timeout, --write-timeout",
    "http-timeout": "--keep-alive, --header-timeout, --write-timeout",
    "http-to": "no HTTP router: the http address serves this server's app; put nginx in front for more",
    "http-websockets": "WSGI only: no WebSockets",
    "shared-socket": "--bind ADDR (or fd://N from systemd)",
    "reuse-port": "--balance reuseport",
    "so-keepalive": "no TCP keepalive option",
    "stats-http": "--stats serves the raw JSON (uwsgitop); --metrics serves HTTP (Prometheus)",
    "stats-minified": "--stats serves the JSON document as uwsgitop reads it",
    "enable-metrics": "--metrics ADDR (Prometheus)",
    "carbon": "--metrics ADDR (Prometheus)",
    "master-fifo": "signals: HUP reloads, TERM stops, TTIN / TTOU add or remove a worker",
    "daemonize": "forkwsgi stays in the foreground: run it under systemd or in a container (logto sets "
                 "the log file)",
    "daemonize2": "forkwsgi stays in the foreground: run it under systemd or in a container",
    "ini": "ini files are not included from one another: put the options in one file",
    "include": "ini files are not included from one another: put the options in one file",
    "mount": "one app per server: give it with module; --root-path PREFIX for a mount point",
    "manage-script-name": "--root-path PREFIX (SCRIPT_NAME taken off PATH_INFO)",
    "import": "import it from the app's module",
    "pyimport": "import it from the app's module",
    "shared-import": "import it from the app's module",
    "optimize": "set PYTHONOPTIMIZE in the environment",
    "unenv": "unset it before starting forkwsgi",
    "wsgi-disable-file-wrapper": "wsgi.file_wrapper is always offered (sendfile)",
    "chown-socket": "--user USER: the unix sockets --bind makes are given to it",
    "py-tracebacker": "--timeout logs every thread's Python stack of a stuck worker",
    "paste": "give the app as module = pkg.mod:app",
    "ini-paste": "give the app as module = pkg.mod:app",
    "python-worker-override": "no worker override",
    "pyargv": "sys.argv is forkwsgi's command line",
    "add-cache-item": "no shared cache: use Redis or memcached",
    "chdir2": "chdir (before the import) is the one forkwsgi has",
    **dict.fromkeys(("py", "pyrun", "python", "eval", "pyshell"),
                    "run it before starting forkwsgi, or import it from the app's module"),
}

# Prefixes of families of options (hooks, config logic): what to use instead.
PREFIXES = {
    "hook-": "server hooks: -c conf.py with gunicorn's hook functions (on_starting, post_fork, ...)",
    "exec-": "run it before starting forkwsgi (ExecStartPre=) or from a hook in -c conf.py",
    "call-": "server hooks: -c conf.py with gunicorn's hook functions",
    "if-": "config logic is not evaluated here: write the options out",
    "for": "config logic is not evaluated here: write the options out",
    "end": "config logic is not evaluated here: write the options out",
    "else": "config logic is not evaluated here: write the options out",
    "cheaper-": _PREFORK,
    "static-": _STATIC,
    "route-": _ROUTING,
    "emperor-": "no Emperor: run one forkwsgi per app (a systemd unit each)",
    "legion": "no clustering: use the load balancer in front",
    "subscribe": "no subscription server: use the load balancer in front",
    "spooler": _SIDE,
    "mule": _SIDE,
    "log-": _LOGS,
    "cache-": "no shared cache: use Redis or memcached",
}


def no_counterpart(key):
    """What to use instead of uWSGI option `key`, or None if it is not one
    we know to have no counterpart."""
    if key in NO_COUNTERPART:
        return NO_COUNTERPART[key]
    for prefix, why in PREFIXES.items():
        if key.startswith(prefix):
            return why
    return None


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
        t.warn(f"{key} = {v}: logging over UDP has no counterpart here: ignored; " + _LOGS)
        return
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
    "socket": _uwsgi_socket, "uwsgi-socket": _uwsgi_socket,
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
    unknown = []
    for key, value in ini.options:
        if key in MAPPED:
            MAPPED[key](t, key, value)
        elif key in REFUSED:
            t.fail(f"{key} = {value}: {REFUSED[key]}")
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
    return t


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
    to the same file (or standard output)."""
    if t.logto:
        t.set("error_logfile", t.logto, "logto")
    if t.logging:
        t.set("access_logfile", t.logto or "-", "logto" if t.logto else
              "request logging, uWSGI's default (disable-logging turns it off)")
    else:
        t.set("access_logfile", None, "disable-logging")


