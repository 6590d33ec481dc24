"""The registry of settings: one Setting per setting (its name, flags,
default, value type, help and --help section), from which the command line
(flags.py), the environment, config files (config.py) and the embedding API
(resolve) all take theirs.
"""
from .valuetypes import (KAFKA_PRODUCERS, addresses, balance, boolean, brief_seconds, choice, env_pair, fsync, group, json_dict, socket_owner,
                         kafka_option, kafka_producer, log_level, nice, non_negative_int, offload_sink, overflow,
                         positive_int, proxy_protocol, rate, root_path, scheme_headers, seconds, size, socket_mode,
                         statsd_address, topic, umask, user)


class ConfigError(Exception):
    """A bad setting value: reported as one line, never a traceback."""


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
    Setting("check_config", ["--check-config"], False, boolean, section="General",
            help="check the settings and that the app imports, then exit: 0 if all is well, 1 with the "
                 "reason if not. What the server refuses (TLS settings, a worker class other than sync or "
                 "gthread) and a name in the config file that is a typo of a setting are errors here; a "
                 "gunicorn setting with no counterpart is a warning, as at start"),
    Setting("print_config", ["--print-config"], False, boolean, section="General",
            help="print the app, every setting in effect and the server hooks defined, with where each "
                 "came from, and the gunicorn settings given that are ignored or refused, then exit"),
    Setting("bind", ["-b", "--bind"], ["127.0.0.1:8000"], multiple=True, metavar="ADDR",
            help="where to listen, repeatable: HOST:PORT, [::1]:PORT, unix:/path, fd://N"),
    Setting("chmod_socket", ["--chmod-socket"], None, socket_mode, metavar="MODE",
            help="the mode of the unix sockets --bind makes, octal (uWSGI's chmod-socket: 660); "
                 "default: what the umask leaves"),
    Setting("uwsgi_socket", ["--uwsgi-socket"], [], multiple=True, metavar="ADDR",
            help="also listen here for the uwsgi protocol (nginx uwsgi_pass, uWSGI's socket =), repeatable: "
                 "HOST:PORT, [::1]:PORT, unix:/path, fd://N. Given alone, no --bind default is opened"),
    Setting("protocol", ["--protocol"], "http", choice(("http", "uwsgi")), metavar="http|uwsgi",
            help="what the --bind addresses speak: http, or uwsgi (gunicorn's protocol setting)"),
    Setting("uwsgi_allow_ips", ["--uwsgi-allow-from"], ["127.0.0.1", "::1"], addresses, metavar="ADDRS",
            help="the peers (comma-separated IPs and CIDR networks, '*' for any) that may connect to a uwsgi "
                 "socket: a uwsgi request says who the client is and how it came (REMOTE_ADDR, HTTPS); others "
                 "are closed and logged. Unix-socket peers always may (gunicorn's uwsgi_allow_ips)"),
    Setting("backlog", ["--backlog"], 2048, positive_int, "listen() backlog (capped by net.core.somaxconn)"),
    Setting("workers", ["-w", "--workers"], 1, non_negative_int,
            "worker processes under a master; 0 serves from this process, with no master", section="Processes"),
    Setting("threads", ["--threads"], 1, positive_int,
            "app threads per worker; 1 runs the app on the worker's I/O loop thread", section="Processes"),
    Setting("write_coalesce", ["--write-coalesce"], 0.001, brief_seconds,
            "with --threads 1: the responses finished in one pass of the worker's loop leave together at "
            "its end, so that the client side (a proxy, a load balancer) is woken once per pass and not "
            "once per response, which costs the worker less CPU under load. A response waits at most "
            "this many seconds plus the app call running then, and only while other requests of the "
            "pass wait; after an app call twice as long as this, each is written at once for a "
            "second (a response that waits behind a slow call waits all of it). 0 writes each at once", section="Processes"),
    Setting("inline_first", ["--inline-first"], "on", choice(("on", "off")), metavar="on|off",
            help="with --threads above 1: the worker's loop thread runs the requests of a pass itself, one "
                 "after the other, while its calls are quick, and the app threads sleep: a request then "
                 "costs no thread wake-up (half the CPU of a small request). A standby thread watches: "
                 "when the pass's run of calls blocks for 1 to 2 ms (a sleep, I/O, a lock) or runs for "
                 "50 ms, the standby takes the loop over, the rest of the run goes to the app threads, and "
                 "for a second after that every request does, as with off. off: every request is handed "
                 "to an app thread", section="Processes"),
    Setting("balance", ["--balance"], "least-busy", balance,
            "how workers share connections: least-busy (the worker with the fewest requests in flight "
            "and a free thread accepts; kept-alive connections move to free workers), reuseport "
            "(a SO_REUSEPORT socket per worker, kernel hash), shared (every worker watches the socket)",
            section="Processes"),
    Setting("lazy_apps", ["--lazy-apps"], False, boolean,
            "import the app in each worker instead of once in the master before forking (gunicorn's "
            "preload_app = False): what the import starts (threads) then runs in every worker",
            section="Processes"),
    Setting("worker_nice", ["--worker-nice"], 0, nice, "nice level of the workers", section="Processes"),
    Setting("max_requests", ["--max-requests"], 0, non_negative_int,
            "a worker retires after this many requests (finishing those in flight); 0 = never", section="Processes"),
    Setting("max_requests_jitter", ["--max-requests-jitter"], 0, non_negative_int,
            "add 0..N at random to --max-requests per worker, so workers do not retire together", section="Processes"),
    Setting("timeout", ["-t", "--timeout"], 30.0, seconds,
            "a worker stuck this many seconds in one call into the app is killed and replaced, after "
            "its request line and Python stack are logged; 0 = never", section="Processes"),
    Setting("heartbeat_timeout", ["--heartbeat-timeout"], 30.0, seconds,
            "a worker whose event loop has not turned for this many seconds while none of its "
            "threads is in the app is frozen (stopped, stuck in a system call): killed and replaced. "
            "Independent of --timeout, which measures the app; 0 = never", section="Processes"),
    Setting("max_rss", ["--max-rss"], 0, non_negative_int,
            "recycle (gracefully) a worker whose resident memory exceeds this many MiB; 0 = never", section="Processes"),
    Setting("master_nice", ["--master-nice"], 0, nice,
            "nice level of the master (higher than the workers' keeps it out of their way)", section="Processes"),
    Setting("chdir", ["--chdir"], None, help="change to this directory before loading the app", metavar="DIR", section="General"),
    Setting("pythonpath", ["--pythonpath"], None, metavar="DIRS", section="General",
            help="comma-separated directories put first on the import path before the app is loaded"),
    Setting("raw_env", ["-e", "--env"], [], env_pair, multiple=True, split=False, metavar="KEY=VALUE",
            section="General", help="set an environment variable for the app (repeatable; the value may "
                                    "hold commas, as gunicorn's)"),
    Setting("pidfile", ["--pid"], None, metavar="FILE", section="General",
            help="write the master's PID to FILE once the sockets are bound (removed at exit)"),
    Setting("umask", ["--umask"], None, umask, metavar="MASK", section="General",
            help="the file mode mask of the unix sockets the server binds (octal, e.g. 027), as gunicorn's; "
                 "the processes keep theirs (a uWSGI ini's umask is the processes' too, as in uWSGI). Unset, "
                 "a unix socket is made under 0, gunicorn's default: srwxrwxrwx, so a proxy running as "
                 "another user (nginx as www-data) can connect (the socket's directory decides who reaches it)"),
    Setting("chown_socket", ["--chown-socket"], None, socket_owner, metavar="USER[:GROUP]", section="General",
            help="the owner of the unix sockets the server binds (uWSGI's chown-socket; needs root), e.g. "
                 "www-data:www-data with --chmod-socket 660: only nginx's user and group connect"),
    Setting("user", ["-u", "--user"], None, user, metavar="USER", section="Processes",
            help="workers and the offload sibling run as this user (name or uid), the master keeps its own "
                 "(needs root; with the default preload it imports the app as root: --lazy-apps does not); "
                 "the files they write (the logs, a unix socket, --offload-dir, the metrics directory) are "
                 "given to it"),
    Setting("group", ["-g", "--group"], None, group, metavar="GROUP", section="Processes",
            help="workers run as this group (name or gid; default: the user's primary group)"),
    Setting("initgroups", ["--initgroups"], False, boolean, section="Processes",
            help="workers also get the user's supplementary groups (else none), as gunicorn's --initgroups"),
    Setting("proc_name", ["-n", "--name"], None, metavar="NAME", section="General",
            help="a name shown in the process titles: forkwsgi: worker 2 [NAME]"),
    Setting("preload_app", ["--preload"], False, boolean, section="Processes",
            help="gunicorn's name for the opposite of --lazy-apps: import the app once in the master. "
                 "Preloading is forkwsgi's default, but a gunicorn config file that does not set "
                 "preload_app gets gunicorn's default, no preload (the start-up log says which applies)"),
    Setting("log_level", ["--log-level"], "INFO", log_level, "debug, info, warning, error or critical", section="General"),
    Setting("error_logfile", ["--error-logfile"], "-", metavar="FILE", section="Logging",
            help="the server's own log ('-': standard error, as gunicorn's errorlog); SIGUSR1 reopens the file"),
    Setting("capture_output", ["--capture-output"], False, boolean, section="Logging",
            help="the standard output and error of the server's processes (the app's print() and "
                 "tracebacks) go to --error-logfile, as gunicorn's capture_output (a file only; SIGUSR1 "
                 "reopens it)"),
    Setting("log_json", ["--log-json"], False, boolean, section="Logging",
            help="the server's own log as JSON objects, one per line (time, level, pid, message, exception)"),
    Setting("log_config", ["--log-config"], None, metavar="FILE", section="Logging",
            help="configure logging from FILE: dictConfig from a .json file, fileConfig from an .ini one "
                 "(gunicorn's logconfig_json, logconfig); the server logs to the 'forkwsgi' logger"),
    Setting("log_config_dict", ["--log-config-dict"], None, json_dict, metavar="JSON", section="Logging",
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
    Setting("access_log_json", ["--access-log-json"], False, boolean, section="Logging",
            help="access log lines as JSON objects: values are JSON-escaped and numbers stay numbers"),
    Setting("stats", ["--stats"], None, metavar="ADDR", section="Observability",
            help="serve the server's statistics at ADDR (HOST:PORT, PORT or unix:/path; a bare port listens "
                 "on 127.0.0.1 only) as uWSGI's stats server does: one JSON document per connection "
                 "(uwsgitop ADDR shows it live); answered by the master from memory it shares with the "
                 "workers, so it answers when every worker is busy. Unauthenticated: in-flight requests "
                 "are shown without their query strings (see --stats-query-strings)"),
    Setting("stats_query_strings", ["--stats-query-strings"], False, boolean, section="Observability",
            help="show in-flight requests' query strings in --stats and forkwsgi top (they may carry "
                 "tokens: only where every reader of the stats socket may see them)"),
    Setting("metrics", ["--metrics"], None, metavar="ADDR", section="Observability",
            help="serve Prometheus metrics at http://ADDR/metrics (HOST:PORT, PORT or unix:/path; a bare "
                 "port listens on 127.0.0.1 only) and a health check at /healthz (200 while a worker "
                 "accepts, 'degraded' below --workers, 503 while draining or with none), from the master"),
    Setting("statsd_host", ["--statsd-host"], None, statsd_address, metavar="ADDR", section="Observability",
            help="send gunicorn's statsd metrics (gunicorn.requests, gunicorn.request.duration, "
                 "gunicorn.request.status.NNN, gunicorn.workers, gunicorn.log.*) to ADDR (HOST:PORT, or "
                 "unix:PATH) over UDP: the master sends what the workers counted, every second; the "
                 "durations come from a histogram (see docs/observability.md)"),
    Setting("statsd_prefix", ["--statsd-prefix"], "", section="Observability", metavar="PREFIX",
            help="put before each statsd metric's name (a '.' is added if missing)"),
    Setting("dogstatsd_tags", ["--dogstatsd-tags"], "", section="Observability", metavar="TAGS",
            help="datadog tags appended to each statsd metric, comma-separated: env:prod,app:shop"),
    Setting("limit_request_line", ["--limit-request-line"], 8190, positive_int,
            "longest request line in bytes (414 past it)", section="Limits"),
    Setting("limit_request_fields", ["--limit-request-fields"], 100, positive_int,
            "most header fields in a request (431 past it)", section="Limits"),
    Setting("limit_request_head", ["--limit-request-head"], 65536, size,
            "largest request head (request line + headers) in bytes (431 past it)", section="Limits"),
    Setting("limit_request_body", ["--limit-request-body"], 1 << 30, size,
            "largest request body in bytes, 1 GiB by default (413 past it)", section="Limits"),
    Setting("max_connections", ["--max-connections"], 10000, positive_int,
            "open connections at most; past it new ones wait in the backlog", section="Limits"),
    Setting("header_timeout", ["--header-timeout"], 10.0, seconds,
            "seconds from a request's first byte to the end of its head (408 past it)", section="Timeouts"),
    Setting("body_timeout", ["--body-timeout"], 30.0, seconds,
            "longest pause in seconds while a request body arrives (408 past it)", section="Timeouts"),
    Setting("body_min_rate", ["--body-min-rate"], 500, rate,
            "bytes a second a request body must average once it has taken longer than --body-timeout "
            "(30 s when that is 0) (408 past it, as Apache's mod_reqtimeout MinRate); 0: no minimum. A body "
            "that trickles a byte now and then is cut at its next byte", section="Timeouts"),
    Setting("keepalive", ["--keep-alive"], 75.0, seconds,
            "seconds an idle kept-alive connection stays open; 0 disables keep-alive. Behind a proxy, "
            "keep it above the proxy's upstream idle timeout (nginx, AWS ALB: 60 s): the proxy must be "
            "the one to close an idle connection, or a request may meet the server's close (a 502)",
            section="Timeouts"),
    Setting("write_timeout", ["--write-timeout"], 30.0, seconds,
            "longest stall in seconds while the client does not read the response", section="Timeouts"),
    Setting("graceful_timeout", ["--graceful-timeout"], 30.0, seconds,
            "seconds in-flight requests get to finish on SIGTERM", section="Timeouts"),
    Setting("spool_threshold", ["--spool-threshold"], 1 << 20, size,
            "request bodies larger than this are buffered in a temp file", section="Limits"),
    Setting("spool_dir", ["--spool-dir"], None, help="directory for spooled request bodies (default: the temp dir)", metavar="DIR", section="Limits"),
    Setting("url_scheme", ["--url-scheme"], "http", help="wsgi.url_scheme (https behind a TLS proxy)"),
    Setting("forwarded_allow_ips", ["--forwarded-allow-ips"], ["127.0.0.1", "::1"], addresses, metavar="ADDRS",
            section="Behind a proxy",
            help="the proxies (comma-separated IPs and CIDR networks, '*' for any) whose headers of "
                 "secure_scheme_headers (and Forwarded proto=, with --forwarded-proto) set wsgi.url_scheme; "
                 "from other peers they are "
                 "plain headers. Unix-socket peers always count. Default: $FORWARDED_ALLOW_IPS, as gunicorn"),
    Setting("secure_scheme_headers", ["--secure-scheme-headers"],
            {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"},
            scheme_headers, metavar="NAME=VALUE,...", section="Behind a proxy",
            help="headers (and their exact values) by which a proxy in --forwarded-allow-ips says the client "
                 "used https; the header with another value says http, and two that disagree get a 400 "
                 "(gunicorn's setting: a dict in a config file)"),
    Setting("forwarded_proto", ["--forwarded-proto"], False, boolean, section="Behind a proxy",
            help="the proto= of the last element of a Forwarded header (RFC 7239) from a proxy in "
                 "--forwarded-allow-ips sets wsgi.url_scheme too. Off by default, as gunicorn reads no "
                 "Forwarded: nginx and HAProxy pass a client's own Forwarded on unless told to replace it"),
    Setting("proxy_protocol", ["--proxy-protocol"], "off", proxy_protocol, metavar="MODE", const="detect",
            section="Behind a proxy",
            help="connections start with a PROXY protocol header (HAProxy send-proxy / send-proxy-v2, AWS "
                 "NLB); the client it names becomes REMOTE_ADDR/REMOTE_PORT and the address in log lines. "
                 "detect (the flag alone, gunicorn's): a connection may also come without one (a health "
                 "check, a probe), its peer then the client; v1, v2, auto (either): every connection must "
                 "start with one. A malformed header, or one from a peer not in --proxy-allow-from, is "
                 "closed and logged"),
    Setting("proxy_allow_ips", ["--proxy-allow-from"], ["127.0.0.1", "::1"], addresses, metavar="ADDRS",
            section="Behind a proxy",
            help="the peers (comma-separated IPs and CIDR networks, '*' for any) that may connect with "
                 "--proxy-protocol; unix-socket peers always may"),
    Setting("root_path", ["--root-path"], "", root_path, metavar="PREFIX",
            help="the prefix the app is mounted under behind a proxy: SCRIPT_NAME, taken off the front of "
                 "PATH_INFO (default: $SCRIPT_NAME, as gunicorn)"),
    Setting("offload_sink", ["--offload-sink"], None, offload_sink, metavar="SINK", section="Offload",
            help="enable forkwsgi.offload(): a sibling process delivers the records to jsonl:PATH (JSON lines), "
                 "kafka://HOST:PORT[,HOST:PORT] (needs confluent-kafka: pip install 'forkwsgi[kafka]') "
                 "or python:MODULE:FACTORY (an object with send(batch), close())"),
    Setting("offload_dir", ["--offload-dir"], None, metavar="DIR", section="Offload",
            help="the offload journal and spill files: records not yet delivered survive restarts here "
                 "(default: $STATE_DIRECTORY/offload when systemd sets StateDirectory=, else "
                 "./forkwsgi-offload; the start-up log line gives the absolute path)"),
    Setting("offload_overflow", ["--offload-overflow"], "spill", overflow, section="Offload",
            help="when the queue is full: spill (to a file the sibling collects), drop (counted and logged), "
                 "or block (wait up to --offload-block-timeout, then drop)"),
    Setting("offload_block_timeout", ["--offload-block-timeout"], 0.05, seconds, section="Offload",
            help="longest wait of one offload() call for room in the queue (block)"),
    Setting("offload_max_record", ["--offload-max-record"], 16 << 20, size, section="Offload",
            help="largest record (topic + key + value); larger ones raise ValueError"),
    Setting("offload_queue_bytes", ["--offload-queue-bytes"], 32 << 20, size, section="Offload",
            help="the offload ring's size in bytes (a file under --offload-dir, rounded up to a power of two from 64K); past it the overflow policy applies"),
    Setting("offload_batch", ["--offload-batch"], 500, positive_int, section="Offload",
            help="records per delivery to the sink at most"),
    Setting("offload_linger", ["--offload-linger"], 0.05, seconds, section="Offload",
            help="seconds a record may wait for its batch to fill"),
    Setting("offload_max_pending", ["--offload-max-pending"], 100000, positive_int, section="Offload",
            help="records the sibling holds undelivered in memory; past it they wait in the queue, then overflow"),
    Setting("offload_fsync", ["--offload-fsync"], "batch", fsync, section="Offload",
            help="batch: fsync the journal and the jsonl sink after each batch; never: leave it to the kernel"),
    Setting("offload_nice", ["--offload-nice"], 0, nice, section="Offload",
            help="nice level of the offload sibling when it must catch up (while it keeps up it runs "
                 "SCHED_IDLE: only on CPU time no request thread wants)"),
    Setting("offload_max_spill", ["--offload-max-spill"], 1 << 30, size, section="Offload",
            help="bytes a worker's spill file may hold not yet collected by the sibling; past it records "
                 "are dropped (counted and logged)"),
    Setting("offload_kafka_timeout", ["--offload-kafka-timeout"], 30.0, seconds, section="Offload",
            help="kafka sink: message.timeout.ms in seconds; a record not acknowledged by then is retried "
                 "by the sibling (it stays journaled)"),
    Setting("offload_kafka_topics", ["--offload-kafka-topics"], [], topic, multiple=True, metavar="TOPIC",
            section="Offload", help="kafka sink: topics created at start if missing (others are created "
                                    "when first used), comma-separated or repeated"),
    Setting("offload_kafka_producer", ["--offload-kafka-producer"], "auto", kafka_producer, section="Offload",
            metavar="|".join(KAFKA_PRODUCERS),
            help="kafka sink: direct drives librdkafka from C, a batch in one call (the librdkafka that "
                 "confluent-kafka ships); confluent uses confluent-kafka's Producer, a Python call and "
                 "callback per record; auto: direct when it loads, else confluent"),
    Setting("offload_kafka_option", ["--offload-kafka-option"], [], kafka_option, multiple=True,
            metavar="KEY=VALUE", section="Offload", split=False,
            help="kafka sink: a librdkafka producer setting, repeatable (e.g. security.protocol=SSL); "
                 "acks=all and enable.idempotence=true are always set"),
]

BY_NAME = {s.name: s for s in SETTINGS}

# Settings of the process model (master, CLI), not of one server loop.
PROCESS_ONLY = ("config", "ini", "check_config", "print_config", "chdir", "pythonpath", "raw_env", "pidfile", "umask",
                "stats", "stats_query_strings", "metrics", "statsd_host", "statsd_prefix", "dogstatsd_tags",
                "error_logfile", "capture_output", "log_json", "log_config", "log_config_dict",
                "user", "group", "initgroups", "chown_socket",
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

