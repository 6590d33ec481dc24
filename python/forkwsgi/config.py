"""One registry of settings drives the CLI, the config files and the environment.

Precedence, lowest first: defaults, a uWSGI ini file (``--ini FILE[:SECTION]``,
uwsgi_compat.py), the config file (``-c FILE``, a Python file assigning
settings by name; without -c, ./forkwsgi.conf.py or ./gunicorn.conf.py),
``GUNICORN_CMD_ARGS``, ``FORKWSGI_<FLAG>`` environment variables (the long
flag in capitals: ``FORKWSGI_KEEP_ALIVE``; the setting's name,
``FORKWSGI_KEEPALIVE``, works too), ``FORKWSGI_CMD_ARGS``, command line.
gunicorn's names and flags are taken everywhere (gunicorn_compat.py).
``forkwsgi --help`` lists every setting with its default.
"""
import argparse
import difflib
import importlib
import json
import ipaddress
import shlex
import types
import os
import runpy

from . import accesslog, gunicorn_compat, hooks, uwsgi_compat
from ._version import __version__
from .offload.records import topic_ok


class ConfigError(Exception):
    """A bad setting value: reported as one line, never a traceback."""


class ConfigFileError(ConfigError):
    """The config file cannot be read, or raises: --check-config says 1,
    as gunicorn's does, where other usage errors are 2."""


def _positive_int(v):
    n = int(v)
    if n < 1:
        raise ValueError("must be at least 1")
    return n


def _non_negative_int(v):
    n = int(v)
    if n < 0:
        raise ValueError("must not be negative")
    return n


def _umask(v):
    """gunicorn's forms: an int, or text in octal ("022", "0o22") or hex ("0x12")."""
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    else:
        s = str(v).strip().lower()
        n = int(s, 0) if s.startswith(("0o", "0x")) else int(s, 8) if s.startswith("0") else int(s)
    if not 0 <= n <= 0o777:
        raise ValueError("must be 0 to 0o777")
    return n


def _socket_mode(v):
    """A unix socket's mode: three octal digits (uWSGI's chmod-socket: 660,
    666), or the number itself (0o666 in a config file; what the master
    passes a worker)."""
    if isinstance(v, int) and not isinstance(v, bool):
        if not 0 <= v <= 0o7777:
            raise ValueError("a file mode, e.g. 0o660")
        return v
    s = str(v).strip().removeprefix("0o")
    if not (1 <= len(s) <= 4 and set(s) <= set("01234567")):
        raise ValueError("octal digits, e.g. 660")
    return int(s, 8)


def _statsd_address(v):
    """gunicorn's statsd_host: HOST:PORT, HOST (port 8125), [IPv6]:PORT, or
    unix:PATH (unix://PATH) for a datagram socket. "" is none."""
    s = str(v).strip()
    if not s:
        return None
    if s.startswith("unix:") and not s[5:].isdigit():     # unix:8125 is the host "unix", as in gunicorn
        path = s[5:].removeprefix("//")
        if not path:
            raise ValueError("unix: needs a path")
        return "unix:" + path
    if s.startswith("["):
        host, sep, port = s[1:].partition("]")
        if not sep or (port and not port.startswith(":")):
            raise ValueError("use [ADDR]:PORT")
        port = port[1:]
    else:
        host, _, port = s.partition(":")
    port = port or "8125"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("use HOST:PORT or unix:PATH")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _env_pair(v):
    key, sep, _ = str(v).partition("=")
    if not sep or not key:
        raise ValueError("use KEY=VALUE")
    return str(v)


def _root_path(v):
    p = str(v).strip().rstrip("/")
    if p and not p.startswith("/"):
        raise ValueError("must start with /")
    return p


def _addresses(v):
    """gunicorn's address lists: IPs and CIDR networks (host bits zero),
    comma-separated (or a list), '*' for any; blanks and empty entries are
    ignored."""
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out = []
    for item in items:
        a = str(item).strip()
        if not a:
            continue
        if a != "*":
            try:
                if "%" in a:
                    raise ValueError("no zone index")
                ipaddress.ip_network(a)
            except ValueError as e:
                raise ValueError(f"{a!r} is not an IP address or network ({e})") from None
        out.append(a)
    return out


PROXY_PROTOCOL_MODES = {"off": "off", "false": "off", "0": "off", "none": "off", "no": "off",
                        "auto": "auto", "true": "auto", "1": "auto", "yes": "auto", "on": "auto",
                        "v1": "v1", "v2": "v2"}


def _proxy_protocol(v):
    """gunicorn's forms: a bool (True: auto), or off, v1, v2, auto."""
    if isinstance(v, bool) or v is None:
        return "auto" if v else "off"
    mode = PROXY_PROTOCOL_MODES.get(str(v).strip().lower())
    if mode is None:
        raise ValueError("use off, v1, v2 or auto (or true, false)")
    return mode


def _scheme_headers(v):
    """gunicorn's dict of header name to the value that means https; as
    text (command line, environment): NAME=VALUE[,NAME=VALUE], '' for none."""
    if not isinstance(v, dict):
        pairs = [p for p in str(v).split(",") if p.strip()]
        v = {}
        for p in pairs:
            name, sep, value = p.partition("=")
            if not sep:
                raise ValueError(f"{p.strip()!r}: use NAME=VALUE")
            v[name] = value.strip()
    out = {}
    for name, value in v.items():
        name = str(name).strip().upper()
        if not name or not all(ch.isalnum() or ch in "!#$%&'*+-.^`|~" for ch in name) or not name.isascii():
            raise ValueError(f"{name!r} is not a header name (use '-', not '_')")
        if not isinstance(value, str) or not value.isascii() or any(ord(ch) < 0x20 for ch in value):
            raise ValueError(f"{name}: the value must be printable text")
        out[name] = value
    return out


def _json_dict(v):
    """A dict, or its JSON text (from the command line or the environment)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as e:
            raise ValueError(f"not JSON: {e}") from None
    if not isinstance(v, dict):
        raise ValueError("a dict (logging's dictConfig schema)")
    return v


def _account(kind):
    """A converter for --user (kind "user") or --group ("group"): a name or
    a number that exists on this machine."""
    import grp
    import pwd
    by_id, by_name = (pwd.getpwuid, pwd.getpwnam) if kind == "user" else (grp.getgrgid, grp.getgrnam)

    def convert(v):
        s = str(v).strip()
        try:
            by_id(int(s)) if s.isdigit() else by_name(s)
        except KeyError:
            raise ValueError(f"no such {kind}") from None
        return s
    return convert


_user, _group = _account("user"), _account("group")


def _bool(v):
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def _seconds(v):
    x = float(v)
    if x < 0:
        raise ValueError("must not be negative")
    return x


def _size(v):
    """Bytes, with an optional K/M/G suffix (powers of 1024)."""
    s = str(v).strip().upper()
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suffix) or s.endswith(suffix + "B") or s.endswith(suffix + "IB"):
            s = s[: s.index(suffix)]
            mult = m
            break
    n = int(s) * mult
    if n < 0:
        raise ValueError("must not be negative")
    return n


def _nice(v):
    n = int(v)
    if not -20 <= n <= 19:
        raise ValueError("a nice level from -20 to 19")
    return n


BALANCE_MODES = ("least-busy", "reuseport", "shared")
OVERFLOW_MODES = ("block", "drop", "spill")


def _choice(options):
    """A converter accepting one of `options` (case-insensitive)."""
    def convert(v):
        v = str(v).strip().lower()
        if v not in options:
            raise ValueError("use " + ", ".join(options))
        return v
    return convert


_balance = _choice(BALANCE_MODES)
_overflow = _choice(OVERFLOW_MODES)
_fsync = _choice(("batch", "never"))
KAFKA_PRODUCERS = ("auto", "direct", "confluent")
_kafka_producer = _choice(KAFKA_PRODUCERS)


def _kafka_brokers(spec):
    """HOST:PORT[,HOST:PORT...] -> the same, checked (bootstrap.servers)."""
    hosts = [h.strip() for h in spec.split(",")]
    for h in hosts:
        host, sep, port = h.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"kafka://HOST:PORT[,HOST:PORT]: {h!r} is not HOST:PORT")
    return ",".join(hosts)


def _offload_sink(v):
    v = str(v).strip()
    kind, _, rest = v.partition(":")
    if kind == "jsonl" and rest:
        return v
    if kind == "python" and rest.count(":") == 1 and all(rest.split(":")):
        return v
    if kind == "kafka" and rest.startswith("//"):
        return "kafka://" + _kafka_brokers(rest[2:])
    raise ValueError("not an offload sink: use jsonl:PATH, kafka://HOST:PORT[,HOST:PORT] or python:MODULE:FACTORY")


def _kafka_option(v):
    key, sep, value = str(v).partition("=")
    if not sep or not key.strip():
        raise ValueError("KEY=VALUE (a librdkafka producer setting)")
    return f"{key.strip()}={value.strip()}"


def _topic(v):
    t = str(v).strip()
    if not topic_ok(t):
        raise ValueError(f"{t!r} is not a Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
    return t


def _log_level(v):
    s = str(v).upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("one of debug, info, warning, error, critical")
    return s


class Setting:
    def __init__(self, name, flags, default, convert=str, help="", metavar=None,
                 multiple=False, section="Server", split=True, const=None):
        self.name = name
        self.flags = flags
        self.default = default
        self.convert = convert
        self.help = help
        self.metavar = metavar
        self.multiple = multiple
        self.split = split            # multiple: a value may list several, comma-separated
        self.section = section
        self.const = const            # the flag may come without a value: then this one

    def parse(self, value, origin):
        try:
            if self.multiple:
                values = value if isinstance(value, (list, tuple)) else [value]
                if self.split:
                    values = [part for v in values for part in str(v).split(",")]
                return [self.convert(v) for v in values]
            return self.convert(value)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"invalid value for {self.flags[0]} ({origin}): {value!r}: {e}") from None


SETTINGS = [
    Setting("config", ["-c", "--config"], None, help="Python config file assigning settings by name", metavar="FILE", section="General"),
    Setting("ini", ["--ini"], None, metavar="FILE[:SECTION]", section="General",
            help="a uWSGI ini file: the options of its [uwsgi] section (or SECTION) that forkwsgi has "
                 "(module, processes, threads, http-socket, harakiri, ...); one it has no counterpart for "
                 "is named in a warning, one it cannot serve as asked (socket = without the uwsgi "
                 "protocol, https) stops it. -c, the environment and the command line override it"),
    Setting("check_config", ["--check-config"], False, _bool, section="General",
            help="check the settings and that the app imports, then exit: 0 if all is well, 1 with the "
                 "reason if not. What the server refuses (TLS settings, a worker class other than sync or "
                 "gthread) and a name in the config file that is a typo of a setting are errors here; a "
                 "gunicorn setting with no counterpart is a warning, as at start"),
    Setting("print_config", ["--print-config"], False, _bool, section="General",
            help="print the app, every setting in effect and the server hooks defined, with where each "
                 "came from, and the gunicorn settings given that are ignored or refused, then exit"),
    Setting("bind", ["-b", "--bind"], ["127.0.0.1:8000"], multiple=True, metavar="ADDR",
            help="where to listen, repeatable: HOST:PORT, [::1]:PORT, unix:/path, fd://N"),
    Setting("chmod_socket", ["--chmod-socket"], None, _socket_mode, metavar="MODE",
            help="the mode of the unix sockets --bind makes, octal (uWSGI's chmod-socket: 660); "
                 "default: what the umask leaves"),
    Setting("uwsgi_socket", ["--uwsgi-socket"], [], multiple=True, metavar="ADDR",
            help="also listen here for the uwsgi protocol (nginx uwsgi_pass, uWSGI's socket =), repeatable: "
                 "HOST:PORT, [::1]:PORT, unix:/path, fd://N. Given alone, no --bind default is opened"),
    Setting("protocol", ["--protocol"], "http", _choice(("http", "uwsgi")), metavar="http|uwsgi",
            help="what the --bind addresses speak: http, or uwsgi (gunicorn's protocol setting)"),
    Setting("uwsgi_allow_ips", ["--uwsgi-allow-from"], ["127.0.0.1", "::1"], _addresses, metavar="ADDRS",
            help="the peers (comma-separated IPs and CIDR networks, '*' for any) that may connect to a uwsgi "
                 "socket: a uwsgi request says who the client is and how it came (REMOTE_ADDR, HTTPS); others "
                 "are closed and logged. Unix-socket peers always may (gunicorn's uwsgi_allow_ips)"),
    Setting("backlog", ["--backlog"], 2048, _positive_int, "listen() backlog (capped by net.core.somaxconn)"),
    Setting("workers", ["-w", "--workers"], 1, _non_negative_int,
            "worker processes under a master; 0 serves from this process, with no master", section="Processes"),
    Setting("threads", ["--threads"], 1, _positive_int,
            "app threads per worker; 1 runs the app on the worker's I/O loop thread", section="Processes"),
    Setting("balance", ["--balance"], "least-busy", _balance,
            "how workers share connections: least-busy (the worker with the fewest requests in flight "
            "and a free thread accepts; kept-alive connections move to free workers), reuseport "
            "(a SO_REUSEPORT socket per worker, kernel hash), shared (every worker watches the socket)",
            section="Processes"),
    Setting("lazy_apps", ["--lazy-apps"], False, _bool,
            "import the app in each worker instead of once in the master before forking (gunicorn's "
            "preload_app = False): what the import starts (threads) then runs in every worker",
            section="Processes"),
    Setting("worker_nice", ["--worker-nice"], 0, _nice, "nice level of the workers", section="Processes"),
    Setting("max_requests", ["--max-requests"], 0, _non_negative_int,
            "a worker retires after this many requests (finishing those in flight); 0 = never", section="Processes"),
    Setting("max_requests_jitter", ["--max-requests-jitter"], 0, _non_negative_int,
            "add 0..N at random to --max-requests per worker, so workers do not retire together", section="Processes"),
    Setting("timeout", ["-t", "--timeout"], 30.0, _seconds,
            "a worker stuck this many seconds in one call into the app is killed and replaced, after "
            "its request line and Python stack are logged; 0 = never", section="Processes"),
    Setting("heartbeat_timeout", ["--heartbeat-timeout"], 30.0, _seconds,
            "a worker whose event loop has not turned for this many seconds while none of its "
            "threads is in the app is frozen (stopped, stuck in a system call): killed and replaced. "
            "Independent of --timeout, which measures the app; 0 = never", section="Processes"),
    Setting("max_rss", ["--max-rss"], 0, _non_negative_int,
            "recycle (gracefully) a worker whose resident memory exceeds this many MiB; 0 = never", section="Processes"),
    Setting("master_nice", ["--master-nice"], 0, _nice,
            "nice level of the master (higher than the workers' keeps it out of their way)", section="Processes"),
    Setting("chdir", ["--chdir"], None, help="change to this directory before loading the app", metavar="DIR", section="General"),
    Setting("pythonpath", ["--pythonpath"], None, metavar="DIRS", section="General",
            help="comma-separated directories put first on the import path before the app is loaded"),
    Setting("raw_env", ["-e", "--env"], [], _env_pair, multiple=True, split=False, metavar="KEY=VALUE",
            section="General", help="set an environment variable for the app (repeatable; the value may "
                                    "hold commas, as gunicorn's)"),
    Setting("pidfile", ["--pid"], None, metavar="FILE", section="General",
            help="write the master's PID to FILE once the sockets are bound (removed at exit)"),
    Setting("umask", ["--umask"], None, _umask, metavar="MASK", section="General",
            help="the file mode mask of the server's processes and of the unix sockets it binds (octal, "
                 "e.g. 027). Unset, the processes keep theirs and a unix socket is made under 0, gunicorn's "
                 "default: srwxrwxrwx, so a proxy running as another user (nginx as www-data) can connect "
                 "(the socket's directory decides who reaches it)"),
    Setting("user", ["-u", "--user"], None, _user, metavar="USER", section="Processes",
            help="workers and the offload sibling run as this user (name or uid), the master keeps its own "
                 "(needs root; with the default preload it imports the app as root: --lazy-apps does not); "
                 "the files they write (the logs, a unix socket, --offload-dir, the metrics directory) are "
                 "given to it"),
    Setting("group", ["-g", "--group"], None, _group, metavar="GROUP", section="Processes",
            help="workers run as this group (name or gid; default: the user's primary group)"),
    Setting("initgroups", ["--initgroups"], False, _bool, section="Processes",
            help="workers also get the user's supplementary groups (else none), as gunicorn's --initgroups"),
    Setting("proc_name", ["-n", "--name"], None, metavar="NAME", section="General",
            help="a name shown in the process titles: forkwsgi: worker 2 [NAME]"),
    Setting("preload_app", ["--preload"], False, _bool, section="Processes",
            help="gunicorn's name for the opposite of --lazy-apps: import the app once in the master. "
                 "Preloading is forkwsgi's default, but a gunicorn config file that does not set "
                 "preload_app gets gunicorn's default, no preload (the start-up log says which applies)"),
    Setting("log_level", ["--log-level"], "INFO", _log_level, "debug, info, warning, error or critical", section="General"),
    Setting("error_logfile", ["--error-logfile"], "-", metavar="FILE", section="Logging",
            help="the server's own log ('-': standard error, as gunicorn's errorlog); SIGUSR1 reopens the file"),
    Setting("log_json", ["--log-json"], False, _bool, section="Logging",
            help="the server's own log as JSON objects, one per line (time, level, pid, message, exception)"),
    Setting("log_config", ["--log-config"], None, metavar="FILE", section="Logging",
            help="configure logging from FILE: dictConfig from a .json file, fileConfig from an .ini one "
                 "(gunicorn's logconfig_json, logconfig); the server logs to the 'forkwsgi' logger"),
    Setting("log_config_dict", ["--log-config-dict"], None, _json_dict, metavar="JSON", section="Logging",
            help="logging's dictConfig as a dict (gunicorn's logconfig_dict in a config file) or JSON text"),
    Setting("access_logfile", ["--access-logfile"], None, metavar="FILE", section="Logging",
            help="write an access log line per response to FILE ('-': standard output); off by default. "
                 "Written in C by a thread of each worker, never blocking a request: lines that do not fit "
                 "a full buffer are dropped and counted. SIGUSR1 reopens the file (logrotate)"),
    Setting("access_logformat", ["--access-logformat"], None, metavar="FORMAT",
            section="Logging",
            help="the access log line, with gunicorn's atoms: %%(h)s remote address, %%(l)s '-', %%(u)s user "
                 "(Basic auth), %%(t)s time, %%(r)s request line, %%(m)s method, %%(U)s path, %%(q)s query, "
                 "%%(H)s protocol, %%(s)s status, %%(B)s and %%(b)s body bytes (0 for none), %%(f)s referer, "
                 "%%(a)s user agent, %%(T)s %%(M)s %%(D)s %%(L)s duration in s, ms, us, decimal s, %%(p)s "
                 "<pid>, %%({header}i)s request header, %%({header}o)s response header, %%({VAR}e)s "
                 "environ variable (default: gunicorn's, or a JSON object with --access-log-json); an atom "
                 "that is none of these is written as '-', as gunicorn does (with a warning at start)"),
    Setting("access_log_json", ["--access-log-json"], False, _bool, section="Logging",
            help="access log lines as JSON objects: values are JSON-escaped and numbers stay numbers"),
    Setting("stats", ["--stats"], None, metavar="ADDR", section="Observability",
            help="serve the server's statistics at ADDR (HOST:PORT, PORT or unix:/path; a bare port listens "
                 "on 127.0.0.1 only) as uWSGI's stats server does: one JSON document per connection "
                 "(uwsgitop ADDR shows it live); answered by the master from memory it shares with the "
                 "workers, so it answers when every worker is busy. Unauthenticated: in-flight requests "
                 "are shown without their query strings (see --stats-query-strings)"),
    Setting("stats_query_strings", ["--stats-query-strings"], False, _bool, section="Observability",
            help="show in-flight requests' query strings in --stats and forkwsgi top (they may carry "
                 "tokens: only where every reader of the stats socket may see them)"),
    Setting("metrics", ["--metrics"], None, metavar="ADDR", section="Observability",
            help="serve Prometheus metrics at http://ADDR/metrics (HOST:PORT, PORT or unix:/path; a bare "
                 "port listens on 127.0.0.1 only) and a health check at /healthz (200 while a worker "
                 "accepts, 'degraded' below --workers, 503 while draining or with none), from the master"),
    Setting("statsd_host", ["--statsd-host"], None, _statsd_address, metavar="ADDR", section="Observability",
            help="send gunicorn's statsd metrics (gunicorn.requests, gunicorn.request.duration, "
                 "gunicorn.request.status.NNN, gunicorn.workers, gunicorn.log.*) to ADDR (HOST:PORT, or "
                 "unix:PATH) over UDP: the master sends what the workers counted, every second; the "
                 "durations come from a histogram (see the README)"),
    Setting("statsd_prefix", ["--statsd-prefix"], "", section="Observability", metavar="PREFIX",
            help="put before each statsd metric's name (a '.' is added if missing)"),
    Setting("dogstatsd_tags", ["--dogstatsd-tags"], "", section="Observability", metavar="TAGS",
            help="datadog tags appended to each statsd metric, comma-separated: env:prod,app:shop"),
    Setting("limit_request_line", ["--limit-request-line"], 8190, _positive_int,
            "longest request line in bytes (414 past it)", section="Limits"),
    Setting("limit_request_fields", ["--limit-request-fields"], 100, _positive_int,
            "most header fields in a request (431 past it)", section="Limits"),
    Setting("limit_request_head", ["--limit-request-head"], 65536, _size,
            "largest request head (request line + headers) in bytes (431 past it)", section="Limits"),
    Setting("limit_request_body", ["--limit-request-body"], 1 << 30, _size,
            "largest request body in bytes, 1 GiB by default (413 past it)", section="Limits"),
    Setting("max_connections", ["--max-connections"], 10000, _positive_int,
            "open connections at most; past it new ones wait in the backlog", section="Limits"),
    Setting("header_timeout", ["--header-timeout"], 10.0, _seconds,
            "seconds from a request's first byte to the end of its head (408 past it)", section="Timeouts"),
    Setting("body_timeout", ["--body-timeout"], 30.0, _seconds,
            "longest pause in seconds while a request body arrives (408 past it)", section="Timeouts"),
    Setting("body_min_rate", ["--body-min-rate"], 500, _size,
            "bytes a second a request body must average once it has taken longer than --body-timeout "
            "(30 s when that is 0) (408 past it, as Apache's mod_reqtimeout MinRate); 0: no minimum. A body "
            "that trickles a byte now and then is cut at its next byte", section="Timeouts"),
    Setting("keepalive", ["--keep-alive"], 75.0, _seconds,
            "seconds an idle kept-alive connection stays open; 0 disables keep-alive. Behind a proxy, "
            "keep it above the proxy's upstream idle timeout (nginx, AWS ALB: 60 s): the proxy must be "
            "the one to close an idle connection, or a request may meet the server's close (a 502)",
            section="Timeouts"),
    Setting("write_timeout", ["--write-timeout"], 30.0, _seconds,
            "longest stall in seconds while the client does not read the response", section="Timeouts"),
    Setting("graceful_timeout", ["--graceful-timeout"], 30.0, _seconds,
            "seconds in-flight requests get to finish on SIGTERM", section="Timeouts"),
    Setting("spool_threshold", ["--spool-threshold"], 1 << 20, _size,
            "request bodies larger than this are buffered in a temp file", section="Limits"),
    Setting("spool_dir", ["--spool-dir"], None, help="directory for spooled request bodies (default: the temp dir)", metavar="DIR", section="Limits"),
    Setting("url_scheme", ["--url-scheme"], "http", help="wsgi.url_scheme (https behind a TLS proxy)"),
    Setting("forwarded_allow_ips", ["--forwarded-allow-ips"], ["127.0.0.1", "::1"], _addresses, metavar="ADDRS",
            section="Behind a proxy",
            help="the proxies (comma-separated IPs and CIDR networks, '*' for any) whose headers of "
                 "secure_scheme_headers and Forwarded proto= set wsgi.url_scheme; from other peers they are "
                 "plain headers. Unix-socket peers always count. Default: $FORWARDED_ALLOW_IPS, as gunicorn"),
    Setting("secure_scheme_headers", ["--secure-scheme-headers"],
            {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"},
            _scheme_headers, metavar="NAME=VALUE,...", section="Behind a proxy",
            help="headers (and their exact values) by which a proxy in --forwarded-allow-ips says the client "
                 "used https; the header with another value says http, and two that disagree get a 400 "
                 "(gunicorn's setting: a dict in a config file)"),
    Setting("proxy_protocol", ["--proxy-protocol"], "off", _proxy_protocol, metavar="MODE", const="auto",
            section="Behind a proxy",
            help="every connection starts with a PROXY protocol header (HAProxy send-proxy / send-proxy-v2, "
                 "AWS NLB): v1, v2, or auto (either; the flag alone); the client it names becomes "
                 "REMOTE_ADDR/REMOTE_PORT and the address in log lines. A connection without one, with a "
                 "malformed one, or from a peer not in --proxy-allow-from is closed and logged"),
    Setting("proxy_allow_ips", ["--proxy-allow-from"], ["127.0.0.1", "::1"], _addresses, metavar="ADDRS",
            section="Behind a proxy",
            help="the peers (comma-separated IPs and CIDR networks, '*' for any) that may connect with "
                 "--proxy-protocol; unix-socket peers always may"),
    Setting("root_path", ["--root-path"], "", _root_path, metavar="PREFIX",
            help="the prefix the app is mounted under behind a proxy: SCRIPT_NAME, taken off the front of "
                 "PATH_INFO (default: $SCRIPT_NAME, as gunicorn)"),
    Setting("offload_sink", ["--offload-sink"], None, _offload_sink, metavar="SINK", section="Offload",
            help="enable forkwsgi.offload(): a sibling process delivers the records to jsonl:PATH (JSON lines), "
                 "kafka://HOST:PORT[,HOST:PORT] (needs confluent-kafka: pip install 'forkwsgi[kafka]') "
                 "or python:MODULE:FACTORY (an object with send(batch), close())"),
    Setting("offload_dir", ["--offload-dir"], None, metavar="DIR", section="Offload",
            help="the offload journal and spill files: records not yet delivered survive restarts here "
                 "(default: $STATE_DIRECTORY/offload when systemd sets StateDirectory=, else "
                 "./forkwsgi-offload; the start-up log line gives the absolute path)"),
    Setting("offload_overflow", ["--offload-overflow"], "spill", _overflow, section="Offload",
            help="when the queue is full: spill (to a file the sibling collects), drop (counted and logged), "
                 "or block (wait up to --offload-block-timeout, then drop)"),
    Setting("offload_block_timeout", ["--offload-block-timeout"], 0.05, _seconds, section="Offload",
            help="longest wait of one offload() call for room in the queue (block)"),
    Setting("offload_max_record", ["--offload-max-record"], 16 << 20, _size, section="Offload",
            help="largest record (topic + key + value); larger ones raise ValueError"),
    Setting("offload_queue_bytes", ["--offload-queue-bytes"], 32 << 20, _size, section="Offload",
            help="the offload ring's size in bytes (a file under --offload-dir, rounded up to a power of two from 64K); past it the overflow policy applies"),
    Setting("offload_batch", ["--offload-batch"], 500, _positive_int, section="Offload",
            help="records per delivery to the sink at most"),
    Setting("offload_linger", ["--offload-linger"], 0.05, _seconds, section="Offload",
            help="seconds a record may wait for its batch to fill"),
    Setting("offload_max_pending", ["--offload-max-pending"], 100000, _positive_int, section="Offload",
            help="records the sibling holds undelivered in memory; past it they wait in the queue, then overflow"),
    Setting("offload_fsync", ["--offload-fsync"], "batch", _fsync, section="Offload",
            help="batch: fsync the journal and the jsonl sink after each batch; never: leave it to the kernel"),
    Setting("offload_nice", ["--offload-nice"], 0, _nice, section="Offload",
            help="nice level of the offload sibling when it must catch up (while it keeps up it runs "
                 "SCHED_IDLE: only on CPU time no request thread wants)"),
    Setting("offload_max_spill", ["--offload-max-spill"], 1 << 30, _size, section="Offload",
            help="bytes a worker's spill file may hold not yet collected by the sibling; past it records "
                 "are dropped (counted and logged)"),
    Setting("offload_kafka_timeout", ["--offload-kafka-timeout"], 30.0, _seconds, section="Offload",
            help="kafka sink: message.timeout.ms in seconds; a record not acknowledged by then is retried "
                 "by the sibling (it stays journaled)"),
    Setting("offload_kafka_topics", ["--offload-kafka-topics"], [], _topic, multiple=True, metavar="TOPIC",
            section="Offload", help="kafka sink: topics created at start if missing (others are created "
                                    "when first used), comma-separated or repeated"),
    Setting("offload_kafka_producer", ["--offload-kafka-producer"], "auto", _kafka_producer, section="Offload",
            metavar="|".join(KAFKA_PRODUCERS),
            help="kafka sink: direct drives librdkafka from C, a batch in one call (the librdkafka that "
                 "confluent-kafka ships); confluent uses confluent-kafka's Producer, a Python call and "
                 "callback per record; auto: direct when it loads, else confluent"),
    Setting("offload_kafka_option", ["--offload-kafka-option"], [], _kafka_option, multiple=True,
            metavar="KEY=VALUE", section="Offload", split=False,
            help="kafka sink: a librdkafka producer setting, repeatable (e.g. security.protocol=SSL); "
                 "acks=all and enable.idempotence=true are always set"),
]

BY_NAME = {s.name: s for s in SETTINGS}

# Settings of the process model (master, CLI), not of one server loop.
PROCESS_ONLY = ("config", "ini", "check_config", "print_config", "chdir", "pythonpath", "raw_env", "pidfile", "umask",
                "stats", "stats_query_strings", "metrics", "statsd_host", "statsd_prefix", "dogstatsd_tags",
                "error_logfile", "log_json", "log_config", "log_config_dict",
                "user", "group", "initgroups",
                "proc_name", "preload_app", "log_level", "workers", "lazy_apps", "worker_nice", "master_nice",
                "max_requests_jitter", "max_rss", "timeout", "heartbeat_timeout") + tuple(s.name for s in SETTINGS
                                                                      if s.name.startswith("offload_"))


def server_options(cfg):
    """The settings a Server takes, from a full settings dict."""
    return {k: v for k, v in cfg.items() if k not in PROCESS_ONLY}


def defaults():
    return {s.name: (list(s.default) if isinstance(s.default, list) else s.default) for s in SETTINGS}


def resolve(options, origin="argument"):
    """Validate a dict of settings (as keyword arguments of the embedding API)."""
    cfg = defaults()
    for k, v in options.items():
        if k not in BY_NAME:
            raise ConfigError(f"unknown setting {k!r}")
        cfg[k] = v if v is None else BY_NAME[k].parse(v, origin)
    return cfg


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def _argument_kwargs(s):
    """argparse's keywords for registry setting s (defaults suppressed: a
    flag not given is absent from the result, so lower sources show)."""
    if s.convert is _bool:
        return dict(dest=s.name, default=argparse.SUPPRESS, action="store_const", const=True)
    kw = dict(dest=s.name, metavar=s.metavar, default=argparse.SUPPRESS)
    if s.multiple:
        kw["action"] = "append"
    elif s.const is not None:
        kw.update(nargs="?", const=s.const)
    return kw


# The dest of a gunicorn flag with no setting here: GUNICORN_DEST + its name.
GUNICORN_DEST = "gunicorn:"


def _add_gunicorn_flags(p):
    """gunicorn's flags that forkwsgi does not define itself, hidden from
    --help: one whose name is a setting here (directly or by ALIASES) sets
    it; any other is kept under its gunicorn name, for load() to judge as
    the same name in a config file (a warning, or a refusal)."""
    for name, flags in gunicorn_compat.GUNICORN_FLAGS.items():
        flags = [f for f in flags if f not in p._option_string_actions]
        if not flags:
            continue
        ours = BY_NAME.get(gunicorn_compat.ALIASES.get(name, name))
        if ours is not None:
            kw = _argument_kwargs(ours)
        elif name in gunicorn_compat.GUNICORN_SWITCHES:
            kw = dict(dest=GUNICORN_DEST + name, default=argparse.SUPPRESS, action="store_const",
                      const=gunicorn_compat.GUNICORN_SWITCHES[name])
        else:
            kw = dict(dest=GUNICORN_DEST + name, default=argparse.SUPPRESS,
                      action="append" if name in gunicorn_compat.GUNICORN_REPEATED else "store")
        p.add_argument(*flags, help=argparse.SUPPRESS, **kw)


def build_parser():
    # No abbreviations: uWSGI's --ini must not be taken for --initgroups,
    # nor a typo for some other flag.
    p = _Parser(
        prog="forkwsgi",
        description="Serve a WSGI app with forkwsgi's C HTTP/1.1 core.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
        epilog="Every setting can also come from FORKWSGI_<FLAG> (e.g. FORKWSGI_KEEP_ALIVE=75 for "
               "--keep-alive) or a config file (-c; else ./forkwsgi.conf.py or ./gunicorn.conf.py). "
               "gunicorn's flags are taken too: those with a counterpart set it, the others are "
               "named in a warning at start; TLS settings and worker classes other than sync and "
               "gthread stop the server at start.",
    )
    p.add_argument("app", metavar="MODULE:APP", nargs="?",
                   help="the WSGI app, e.g. myproject.wsgi:application or pkg.app:create_app()")
    p.add_argument("-v", "--version", action="version", version=f"forkwsgi {__version__}")
    groups = {}
    for s in SETTINGS:
        g = groups.get(s.section) or groups.setdefault(s.section, p.add_argument_group(s.section))
        g.add_argument(*s.flags, help=s.help, **_argument_kwargs(s))
    _add_gunicorn_flags(p)
    # argparse prints defaults only when they are set; show the registry's.
    for action in p._actions:
        if action.dest in BY_NAME and action.help != argparse.SUPPRESS:
            d = BY_NAME[action.dest].default
            shown = (", ".join(d) or "none") if isinstance(d, list) else \
                ",".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else d
            action.help = f"{action.help} (default: {shown})"
    p.formatter_class = argparse.HelpFormatter
    return p


ENV_PREFIX = "FORKWSGI_"


def env_names(s):
    """The environment variables of setting s: FORKWSGI_ and its long flag
    in capitals (--keep-alive: FORKWSGI_KEEP_ALIVE), then its name as a
    config file spells it (FORKWSGI_KEEPALIVE) where that differs."""
    flag = s.flags[-1].lstrip("-").replace("-", "_").upper()
    return list(dict.fromkeys((ENV_PREFIX + flag, ENV_PREFIX + s.name.upper())))


# FORKWSGI_* variables that are no setting but the project's own: the
# offload sibling's hand-over (offload/supervisor.py), an in-place reload (reexec.py), the build (setup.py), the
# tests (and FORKWSGI_TEST_*) and scripts/kafka_broker.py. No warning for these.
OWN_VARIABLES = {"FORKWSGI_SIBLING", "FORKWSGI_SANITIZE", "FORKWSGI_WERROR", "FORKWSGI_NO_KAFKA",
                 "FORKWSGI_KAFKA_HOME", "FORKWSGI_HYPOTHESIS_EXAMPLES", "FORKWSGI_CMD_ARGS", "FORKWSGI_REEXEC",
                 "FORKWSGI_PROMETHEUS_DIR"}


def unknown_env(environ=None):
    """One warning for each FORKWSGI_* variable that is no setting (a typo
    would otherwise do nothing, silently), naming the closest setting's."""
    environ = os.environ if environ is None else environ
    known = [n.removeprefix(ENV_PREFIX) for s in SETTINGS for n in env_names(s)]
    warnings = []
    for name in sorted(environ):
        rest = name.removeprefix(ENV_PREFIX)
        if rest == name or rest in known or name in OWN_VARIABLES or rest.startswith("TEST_"):
            continue
        close = difflib.get_close_matches(rest, known, 1)
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else " (see forkwsgi --help)"
        warnings.append(f"environment variable {name} is not a setting: ignored{hint}")
    return warnings


def edits(a, b):
    """How many one-letter edits (insert, delete, replace, or swap two
    neighbours) turn a into b (optimal string alignment distance)."""
    before, row = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cost = min(row[j] + 1, cur[j - 1] + 1, row[j - 1] + (ca != cb))
            if before is not None and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, before[j - 2] + 1)          # two letters swapped
            cur.append(cost)
        before, row = row, cur
    return row[-1]


def typo_of(name, known):
    """The name in `known` that `name` (from a config file) is a typo of,
    or None. Only a near miss counts: one edit away (two for names of six
    letters or more), so the helper names config files are full of
    (use_bind, workers_per_core, BASE_DIR) are not taken for typos.
    Settings and hooks are lowercase: a name with capitals is a constant."""
    if name.startswith("_") or name != name.lower():
        return None
    limit = 2 if len(name) >= 6 else 1
    best = min(known, key=lambda k: edits(name, k))
    return best if edits(name, best) <= limit else None


def _cmd_args(parser, argv, where):
    """The flags given in argv, by dest (only those given)."""
    try:
        return vars(parser.parse_args(argv))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if where != "command line" else str(e)) from None


def _env_cmd_args(parser, environ, var):
    """The flags in environment variable var (FORKWSGI_CMD_ARGS,
    GUNICORN_CMD_ARGS), split as a shell would, as gunicorn splits its."""
    if not environ.get(var, "").strip():
        return {}
    try:
        words = shlex.split(environ[var])
    except ValueError as e:
        raise ConfigError(f"{var}: {e}") from None
    return _cmd_args(parser, words, var)


# The config file read when none is named (-c, FORKWSGI_CONFIG), first found
# in the current directory: forkwsgi's own name, then gunicorn's default.
DEFAULT_CONFIG_FILES = ("forkwsgi.conf.py", "gunicorn.conf.py")


def find_config_file(layers, environ):
    """(path, where it was named) of the config file to read, or (None,
    None). Named by -c (on the command line, then FORKWSGI_CMD_ARGS),
    FORKWSGI_CONFIG, -c in GUNICORN_CMD_ARGS; else the first of
    DEFAULT_CONFIG_FILES in the current directory, as gunicorn reads
    ./gunicorn.conf.py."""
    named = {where: given.get("config") for where, given in layers}
    for where in ("command line", "FORKWSGI_CMD_ARGS"):
        if named.get(where):
            return named[where], where
    if environ.get("FORKWSGI_CONFIG"):
        return environ["FORKWSGI_CONFIG"], "FORKWSGI_CONFIG"
    if named.get("GUNICORN_CMD_ARGS"):
        return named["GUNICORN_CMD_ARGS"], "GUNICORN_CMD_ARGS"
    for name in DEFAULT_CONFIG_FILES:
        path = os.path.join(os.getcwd(), name)
        if os.path.isfile(path):
            return path, "no -c given: found in the current directory"
    return None, None


def read_config_file(location):
    """The names a config file defines. gunicorn's forms: a path (file:PATH
    too), or python:MODULE for a module on the import path."""
    try:
        if location.startswith("python:"):
            return dict(vars(importlib.import_module(location[len("python:"):])))
        return runpy.run_path(location.removeprefix("file:"))
    except OSError as e:
        raise ConfigFileError(f"cannot read config file {location}: {e.strerror}") from None
    except Exception as e:  # the file is user code
        raise ConfigFileError(f"error in config file {location}: {type(e).__name__}: {e}") from None


def load(argv, environ=None, origins=None, warnings=None, hook_fns=None, ignored=None, refused=None):
    """Settings, from the least to the most authoritative (gunicorn's order,
    with forkwsgi's own names above gunicorn's):
    defaults (WEB_CONCURRENCY, PORT, SCRIPT_NAME and FORWARDED_ALLOW_IPS change those of
    --workers, --bind, --root-path and --forwarded-allow-ips, as on Heroku-style platforms and in
    gunicorn), a uWSGI ini file (--ini), the config file (find_config_file),
    GUNICORN_CMD_ARGS, FORKWSGI_* variables, FORKWSGI_CMD_ARGS (command-line
    flags in one variable), the command line. Returns (app_spec, cfg).
    gunicorn's names are taken from each of them: a setting here under its
    name or another (ALIASES) is set; one with no counterpart is judged by
    gunicorn_compat.judge.
    origins: a dict to fill with where each setting that is not a default
    came from (and "app" the app, "hooks" the server hooks, "preload" the
    start-up log's line on where the app is imported: settle_preload);
    warnings: a list to fill with names in the config file that look like a
    setting's (a typo); ignored: a list to fill with the gunicorn settings
    ignored, as (name, value, where, why) (None: they go to warnings as
    text); refused: a list to fill with the settings that stop the server,
    one line each (None: the first raises ConfigError); hook_fns: a dict to
    fill with the config file's server hooks (hooks.py), by name."""
    environ = os.environ if environ is None else environ
    origins = {} if origins is None else origins
    warnings = [] if warnings is None else warnings
    parser = build_parser()
    # The flag sources, most authoritative first.
    layers = [("command line", _cmd_args(parser, argv, "command line"))]
    layers += [(var, _env_cmd_args(parser, environ, var)) for var in ("FORKWSGI_CMD_ARGS", "GUNICORN_CMD_ARGS")]
    app_spec = None
    for where, given in layers:
        app = given.pop("app", None)
        if app and not app_spec:
            app_spec, origins["app"] = app, where
    cfg = defaults()
    for var, name, value in (("WEB_CONCURRENCY", "workers", lambda v: v),
                             ("PORT", "bind", lambda v: f"0.0.0.0:{v}"),
                             ("SCRIPT_NAME", "root_path", lambda v: v),
                             ("FORWARDED_ALLOW_IPS", "forwarded_allow_ips", lambda v: v)):
        # gunicorn reads FORWARDED_ALLOW_IPS when set at all ('' allows no address).
        if environ.get(var, "").strip() or (var == "FORWARDED_ALLOW_IPS" and var in environ):
            cfg[name] = BY_NAME[name].parse(value(environ[var].strip()), var)
            origins[name] = var
    gunicorn_given = {}           # gunicorn's settings with no counterpart: name -> (value, where)
    by_where = dict(layers)
    ini_file = by_where["command line"].get("ini") or by_where["FORKWSGI_CMD_ARGS"].get("ini") or \
        environ.get("FORKWSGI_INI")
    ini_app = apply_ini(ini_file, cfg, origins, warnings, environ) if ini_file else None
    if ini_file:
        origins["ini"] = next((w for w in ("command line", "FORKWSGI_CMD_ARGS") if by_where[w].get("ini")),
                              "FORKWSGI_INI")
    gunicorn_file = None          # the config file, if written for gunicorn (settle_preload)
    config_file, named_by = find_config_file(layers, environ)
    if config_file:
        cfg["config"], origins["config"] = config_file, named_by
        app_spec, speaks = _apply_config_file(config_file, cfg, origins, warnings, hook_fns, gunicorn_given,
                                              app_spec)
        if speaks:
            gunicorn_file = config_file
    if not app_spec and ini_app:
        app_spec, origins["app"] = ini_app
    _apply_flags("GUNICORN_CMD_ARGS", by_where["GUNICORN_CMD_ARGS"], cfg, origins, gunicorn_given)
    for s in SETTINGS:
        found = [n for n in env_names(s) if n in environ]
        if len(found) > 1:
            raise ConfigError(f"{' and '.join(found)} are both set: use one")
        if found and s.name not in ("config", "ini"):
            cfg[s.name] = s.parse(environ[found[0]], found[0])
            origins[s.name] = found[0]
    for where in ("FORKWSGI_CMD_ARGS", "command line"):
        _apply_flags(where, by_where[where], cfg, origins, gunicorn_given)
    _judge_gunicorn(gunicorn_given, warnings, ignored, refused)
    origins["preload"] = settle_preload(cfg, origins, gunicorn_file)
    if cfg["uwsgi_socket"] and "bind" not in origins:
        cfg["bind"] = []          # uwsgi sockets alone: no HTTP address nobody asked for
    unknown_atoms = accesslog.unknown_atoms(cfg["access_logformat"])
    if unknown_atoms:
        # gunicorn starts with them (and writes '-'): a warning, not an error.
        warnings.append(f"--access-logformat ({origins['access_logformat']}): unknown atom(s) "
                        f"{' '.join(unknown_atoms)}, written as '-' (see forkwsgi --help)")
    return app_spec, cfg


def apply_ini(spec, cfg, origins, warnings, environ):
    """The settings of uWSGI ini file `spec` (FILE or FILE:SECTION) into
    cfg, below everything else (uwsgi_compat.py reads and translates it).
    Returns (app spec, where) from its module / wsgi-file, or None."""
    try:
        ini = uwsgi_compat.Ini(spec, environ)
        t = uwsgi_compat.translate(ini, defaults(), typo_of)
    except uwsgi_compat.IniError as e:
        raise ConfigError(str(e)) from None
    cfg["ini"] = spec
    for name, (value, key) in t.values.items():
        where = f"{ini.where()}: {key}"
        cfg[name] = value if value is None else BY_NAME[name].parse(value, where)
        origins[name] = where
    warnings += t.warnings
    return (t.app, ini.where()) if t.app else None


def _authority(origin):
    """How much a setting's origin weighs: the command line most, then the
    *_CMD_ARGS variables, FORKWSGI_* variables, the config file."""
    if origin == "command line":
        return 4
    if origin.endswith("_CMD_ARGS"):
        return 3
    if origin.startswith("ini file"):
        return 0
    return 1 if origin.startswith("config file") else 2


def settle_preload(cfg, origins, gunicorn_file=None):
    """--lazy-apps and gunicorn's preload_app (--preload) are one choice
    under two names: make them agree, from the most authoritative of the
    two that is set (a tie that contradicts itself is a ConfigError). With
    neither set, forkwsgi preloads (gc.freeze: the workers share the app's
    pages and start fast), but a config file written for gunicorn gets
    gunicorn's default, no preload: what the app starts at import (a
    thread) then runs in each worker, as it did under gunicorn. Returns
    the line the start-up log gives for the choice."""
    lazy_from, pre_from = origins.get("lazy_apps"), origins.get("preload_app")
    if lazy_from and pre_from and cfg["lazy_apps"] == cfg["preload_app"]:
        if _authority(lazy_from) == _authority(pre_from):
            raise ConfigError(f"--lazy-apps = {cfg['lazy_apps']} ({lazy_from}) and --preload / preload_app = "
                              f"{cfg['preload_app']} ({pre_from}) contradict each other: set one")
        if _authority(lazy_from) > _authority(pre_from):
            pre_from = None
        else:
            lazy_from = None
    if pre_from:
        lazy, why = not cfg["preload_app"], f"preload_app = {cfg['preload_app']} ({pre_from})"
        origins["lazy_apps"] = f"preload_app ({pre_from})"
    elif lazy_from:
        lazy, why = cfg["lazy_apps"], f"--lazy-apps = {cfg['lazy_apps']} ({lazy_from})"
        origins["preload_app"] = f"--lazy-apps ({lazy_from})"
    elif gunicorn_file:
        lazy, why = True, (f"the gunicorn config file {gunicorn_file} does not set preload_app: gunicorn's "
                           "default, no preload (preload_app = True preloads)")
        origins["lazy_apps"] = origins["preload_app"] = f"gunicorn's default for config file {gunicorn_file}"
    else:
        lazy, why = False, "forkwsgi's default (--lazy-apps or preload_app = False imports it in each worker)"
    cfg["lazy_apps"], cfg["preload_app"] = lazy, not lazy
    return ("App imported in each worker: " if lazy else "App imported once, in the master: ") + why


def _take(name, value, where, cfg, origins, gunicorn_given):
    """Set the setting a name (forkwsgi's, or gunicorn's) stands for; True
    if it is one. gunicorn's settings with no counterpart are kept for
    _judge_gunicorn."""
    ours = gunicorn_compat.ALIASES.get(name, name)
    if ours in BY_NAME:
        # None is "not set" (gunicorn's example config assigns user = None,
        # pidfile = None): the default, not the text "None".
        cfg[ours] = BY_NAME[ours].default if value is None else BY_NAME[ours].parse(value, where)
        origins[ours] = where
        return True
    if name in gunicorn_compat.NO_COUNTERPART or name in gunicorn_compat.GUNICORN_FLAGS:
        gunicorn_given[name] = (value, where)
        return True
    return False


def _apply_flags(where, given, cfg, origins, gunicorn_given):
    """The flags of one source (the command line, *_CMD_ARGS), by dest."""
    for k, v in given.items():
        if k in ("config", "ini"):          # find_config_file and load chose the files
            continue
        _take(k.removeprefix(GUNICORN_DEST), v, where, cfg, origins, gunicorn_given)


def _apply_config_file(config_file, cfg, origins, warnings, hook_fns, gunicorn_given, app_spec):
    """Take the settings and hooks config_file defines. Returns (the app:
    app_spec, or the file's wsgi_app when there is none; whether the file
    is written for gunicorn: gunicorn_compat.speaks_gunicorn)."""
    where = f"config file {config_file}"
    values = read_config_file(config_file)
    for k, v in values.items():
        if k == "config":
            continue                          # the file does not name another
        if _take(k, v, where, cfg, origins, gunicorn_given):
            continue
        if k in ("app", "wsgi_app"):
            if not isinstance(v, str):
                raise ConfigError(f"{where}: {k} must be a string MODULE:APP")
            if not app_spec:
                app_spec, origins["app"] = v, where
        elif k in hooks.SIGNATURES:
            try:
                (hook_fns if hook_fns is not None else {})[k] = hooks.check(k, v)
            except hooks.HookError as e:
                raise ConfigError(f"{where}: {e}") from None
            origins["hooks"] = where
        elif isinstance(v, types.ModuleType):
            continue                  # the file's imports
        elif callable(v):
            meant = typo_of(k, hooks.SIGNATURES)
            if meant:
                warnings.append(f"{where}: function {k!r} is no server hook: never called "
                                f"(did you mean {meant}?)")
        else:
            # A name of neither forkwsgi's nor gunicorn's: a typo of one
            # is named; any other (a helper variable, a constant) is the
            # file's own business, ignored as gunicorn ignores it.
            meant = typo_of(k, [*BY_NAME, *gunicorn_compat.ALIASES, *gunicorn_compat.NO_COUNTERPART,
                                *hooks.SIGNATURES])
            if meant:
                warnings.append(f"{where}: {k!r} is not a setting: ignored (did you mean {meant}?)")
    return app_spec, gunicorn_compat.speaks_gunicorn(config_file, values)


def _judge_gunicorn(given, warnings, ignored, refused):
    """gunicorn_compat.judge's verdicts into the caller's lists (see load)."""
    was_ignored, was_refused = gunicorn_compat.judge(given)
    if ignored is None:
        warnings += [gunicorn_compat.ignored_line(*i) for i in was_ignored]
    else:
        ignored += was_ignored
    if refused is None:
        if was_refused:
            raise ConfigError(was_refused[0])
    else:
        refused += was_refused


def describe(cfg, origins, app_spec=None, hook_fns=(), ignored=(), refused=()):
    """What the server would run with, one line each: name = value  (where
    from): the app, every setting, and the server hooks defined; then the
    gunicorn settings given that it ignores, and why, and those that stop
    it from starting."""
    width = max(len(s.name) for s in SETTINGS)
    lines = [f"{'app':<{width}} = {app_spec!r}  ({origins.get('app', 'not given')})"]
    lines += [f"{s.name:<{width}} = {cfg[s.name]!r}  ({origins.get(s.name, 'default')})" for s in SETTINGS]
    lines.append(f"{'hooks':<{width}} = {', '.join(hook_fns) or 'none'}  ({origins.get('hooks', 'none defined')})")
    if ignored:
        lines.append("# ignored: gunicorn settings given that forkwsgi has no counterpart for")
        lines += [f"#   {name} = {value!r}  ({where}): {why}" for name, value, where, why in ignored]
    if refused:
        lines.append("# refused: the server will not start with these")
        lines += [f"#   {line}" for line in refused]
    return "\n".join(lines)

