"""The uWSGI options that set no forkwsgi setting (uwsgi_compat.py
translates the others): what the server cannot do as configured (REFUSED,
it does not start), what is accepted with nothing to do (ACCEPTED), and
what has no counterpart here, with what to use instead (NO_COUNTERPART,
PREFIXES for families of options).

A leaf module: tables and one lookup.
"""

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

PREFORK = "--workers N (fixed; SIGTTIN / SIGTTOU add or remove one)"
STATIC = "serve static files from the proxy in front (nginx) or the app (whitenoise)"
RELOAD = "reload with SIGHUP (systemctl reload): new code, same PID"
LOGS = "the server logs to stderr (or --error-logfile); the access log is --access-logfile"
ROUTING = "routing and headers belong to the proxy in front (nginx) or the app"
SIDE = "run it as a process of its own (a systemd unit, a container); forkwsgi.offload() for side effects"

# uWSGI options forkwsgi has no counterpart for, and what to use instead.
NO_COUNTERPART = {
    **dict.fromkeys(("cheaper", "cheaper-initial", "cheaper-step", "cheaper-algo", "cheaper-overload",
                     "cheaper-rss-limit-soft", "cheaper-rss-limit-hard", "idle", "die-on-idle"), PREFORK),
    **dict.fromkeys(("static-map", "static-map2", "check-static", "static-index", "static-expires",
                     "static-expires-type", "static-expires-uri", "static-gzip-all", "static-skip-ext",
                     "offload-threads", "static-safe"), STATIC),
    **dict.fromkeys(("touch-reload", "touch-chain-reload", "py-autoreload", "py-auto-reload",
                     "python-autoreload", "fs-reload", "fs-brutal-reload"), RELOAD),
    **dict.fromkeys(("log-format", "logformat", "log-date", "log-x-forwarded-for", "log-4xx", "log-5xx",
                     "log-slow", "log-big", "log-zero", "log-sendfile", "log-ioerror", "req-logger", "logger",
                     "log-route", "log-encoder", "log-maxsize", "log-backupname", "logfile-chmod",
                     "log-micros", "log-format-strftime"),
                    LOGS + " (gunicorn's atoms: --access-logformat); rotate with logrotate and SIGUSR1"),
    **dict.fromkeys(("route", "route-if", "route-if-not", "route-run", "route-host", "route-uri",
                     "route-qs", "route-label", "response-route", "final-route", "error-route",
                     "add-header", "del-header", "pull-header", "collect-header"), ROUTING),
    **dict.fromkeys(("mule", "mules", "farm", "spooler", "spooler-processes", "spooler-import",
                     "cron", "cron2", "unique-cron", "legion-cron", "attach-daemon", "attach-daemon2",
                     "smart-attach-daemon", "smart-attach-daemon2", "attach-control-daemon"), SIDE),
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
    "cheaper-": PREFORK,
    "static-": STATIC,
    "route-": ROUTING,
    "emperor-": "no Emperor: run one forkwsgi per app (a systemd unit each)",
    "legion": "no clustering: use the load balancer in front",
    "subscribe": "no subscription server: use the load balancer in front",
    "spooler": SIDE,
    "mule": SIDE,
    "log-": LOGS,
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
