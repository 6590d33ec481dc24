"""The uWSGI options that set no forkwsgi setting (uwsgi_compat.py
translates the others): what the server cannot do as configured (REFUSED,
REFUSED_PREFIXES for families of options: it does not start), what is
accepted with nothing to do (ACCEPTED), and what has no counterpart here
but whose absence changes nothing a user relies on (NO_COUNTERPART,
PREFIXES: a warning), each with what to use instead.

The line between refused and warned: an option that changes what is
served, who may reach it, or work the app relies on (a route, a static
map, a mule, a hook, a touch-reload) is refused; one that only tunes how
(the cheaper's process count, process titles, the log's format) is warned.

A leaf module: tables and two lookups.
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
    "offload-threads": "the C core sends file responses itself (sendfile)",
    "strict": None,
    "set-placeholder": None,
    "set-ph": None,
}

PREFORK = "--workers N (fixed; SIGTTIN / SIGTTOU add or remove one)"
STATIC = "uWSGI's static file serving is not done here: serve them from the proxy in front (nginx) or the app " \
         "(whitenoise)"
RELOAD = "nothing here watches files to reload: reload with SIGHUP (systemctl reload; from the deploy " \
         "script: kill -HUP $(cat PIDFILE)): new code, same PID"
LOGS = "the server logs to stderr (or --error-logfile); the access log is --access-logfile"
ROUTING = "uWSGI's internal routing is not done here: access rules, rewrites and headers belong to the proxy " \
          "in front (nginx) or the app"
SIDE = "no mules, spoolers, crons or attached daemons here: run it as a process of its own (a systemd unit, " \
       "a container, a systemd timer); forkwsgi.offload() for side effects of a request"
HOOKS = "lifecycle commands are not run here: run it before starting forkwsgi (ExecStartPre=) or from a " \
        "server hook in -c conf.py (on_starting, post_fork, ...)"
IMPORT = "nothing is imported besides the app: import it from the app's module"
EMPEROR = "no Emperor here: run one forkwsgi per app (a systemd unit each)"
CACHE = "no shared cache here: use Redis or memcached"
DAEMON = "forkwsgi stays in the foreground (an init script waiting for it to fork would hang): run it under " \
         "systemd or in a container (logto sets the log file)"
ASYNC = "no async loop here (one request per thread: the concurrency it gives is lost): --threads N app " \
        "threads per worker, or an ASGI server"
CONFIG_FILES = "only ini files on disk are read here (ini = FILE.ini, include = FILE.ini): convert it to ini"

# What the server cannot do as configured: it does not start.
REFUSED.update({
    **dict.fromkeys(("static-map", "static-map2", "check-static", "check-static-docroot", "static-index",
                     "static-expires", "static-expires-type", "static-expires-uri", "static-expires-path",
                     "static-gzip-all", "static-gzip", "static-skip-ext", "static-safe",
                     "static-check", "static-offload-to-thread"), STATIC),
    **dict.fromkeys(("touch-reload", "touch-chain-reload", "touch-workers-reload", "touch-logreopen",
                     "touch-exec", "touch-signal", "py-autoreload", "py-auto-reload", "python-autoreload",
                     "python-auto-reload", "fs-reload", "fs-brutal-reload", "fs-signal"), RELOAD),
    **dict.fromkeys(("route", "route-if", "route-if-not", "route-run", "route-host", "route-uri",
                     "route-qs", "route-label", "route-remote-addr", "route-user-agent", "response-route",
                     "final-route", "error-route", "add-header", "del-header", "pull-header",
                     "collect-header", "http-to", "http-to-https"), ROUTING),
    **dict.fromkeys(("mule", "mules", "farm", "spooler", "spooler-processes", "spooler-import",
                     "cron", "cron2", "unique-cron", "legion-cron", "attach-daemon", "attach-daemon2",
                     "smart-attach-daemon", "smart-attach-daemon2", "attach-control-daemon"), SIDE),
    **dict.fromkeys(("gevent", "async", "ugreen", "greenlet", "asyncio", "tornado"), ASYNC),
    **dict.fromkeys(("emperor", "emperor-tyrant", "vassals-include", "vassal-set"), EMPEROR),
    **dict.fromkeys(("cache", "cache2", "sharedarea", "queue", "add-cache-item"), CACHE),
    **dict.fromkeys(("import", "pyimport", "py-import", "python-import", "shared-import", "shared-pyimport",
                     "shared-py-import", "shared-python-import"), IMPORT),
    **dict.fromkeys(("py", "pyrun", "python", "eval", "pyshell", "pyexec"),
                    "no Python is run at start besides the app: run it before starting forkwsgi, or import "
                    "it from the app's module"),
    **dict.fromkeys(("paste", "ini-paste", "paste-logger", "ini-paste-logged"),
                    "PasteDeploy is not read here: give the app as module = pkg.mod:app"),
    **dict.fromkeys(("daemonize", "daemonize2"), DAEMON),
    **dict.fromkeys(("ini", "include", "inherit", "yaml", "yml", "json", "js", "xml", "sqlite3", "ldap"),
                    CONFIG_FILES),
    "master-fifo": "no master FIFO here (commands written to it would reach nothing): signals: HUP reloads, "
                   "TERM stops, TTIN / TTOU add or remove a worker",
    "mount": "one app per server, served at /: give it with module, and --root-path PREFIX for a mount "
             "point (the prefix taken off PATH_INFO)",
    "manage-script-name": "--root-path PREFIX (SCRIPT_NAME taken off PATH_INFO)",
    "http-websockets": "WSGI only: no WebSockets here",
    "stats-http": "--stats serves the raw JSON (uwsgitop), not over HTTP: --metrics serves HTTP (Prometheus)",
    "shared-socket": "no shared sockets here (=N references are not taken): --bind ADDR (or fd://N from "
                     "systemd)",
    "unenv": "no variable is unset here: unset it before starting forkwsgi",
    "chdir2": "chdir (before the import) is the one forkwsgi has: use chdir",
    "pyargv": "sys.argv is forkwsgi's command line: read the values from the environment (env = ...)",
    "python-worker-override": "no worker override here",
    "logger": "no uWSGI loggers here (the log would not reach it): " + LOGS + "; syslog: run under systemd "
              "(the journal)",
    "logger-req": "no uWSGI loggers here (the request log would not reach it): " + LOGS,
    "req-logger": "no uWSGI loggers here (the request log would not reach it): " + LOGS,
    "log-route": "no uWSGI loggers here: " + LOGS,
    "log-maxsize": "the log is not rotated here (it would grow without bound): rotate with logrotate and "
                   "SIGUSR1",
    "log-backupname": "the log is not rotated here: rotate with logrotate and SIGUSR1",
})

# Families of options refused (by prefix).
REFUSED_PREFIXES = {
    "hook-": HOOKS, "exec-": HOOKS, "call-": HOOKS, "worker-exec": HOOKS,
    "static-": STATIC,
    "touch-": RELOAD,
    "route-": ROUTING, "response-route": ROUTING, "final-route": ROUTING, "error-route": ROUTING,
    "mule": SIDE, "spooler": SIDE, "cron": SIDE, "attach-": SIDE, "smart-attach-": SIDE,
    "emperor": EMPEROR, "vassal": EMPEROR,
    "cache-": CACHE, "sharedarea": CACHE, "queue-": CACHE,
    "legion": "no clustering here: use the load balancer in front",
    "subscribe": "no subscription server here (the router would send it nothing): use the load balancer in "
                 "front",
    "gevent-": ASYNC, "async-": ASYNC, "greenlet-": ASYNC, "asyncio-": ASYNC, "tornado-": ASYNC,
}
# Config logic (if-*, for*, else) never gets here: uwsgi_ini.py evaluates it, or refuses it.

# uWSGI options with no counterpart whose absence changes nothing a user
# relies on: a warning, and what to use instead.
NO_COUNTERPART = {
    **dict.fromkeys(("cheaper", "cheaper-initial", "cheaper-step", "cheaper-algo", "cheaper-overload",
                     "cheaper-rss-limit-soft", "cheaper-rss-limit-hard", "idle", "die-on-idle"),
                    PREFORK + ": every worker runs"),
    **dict.fromkeys(("log-format", "logformat", "log-date", "log-x-forwarded-for", "log-4xx", "log-5xx",
                     "log-slow", "log-big", "log-zero", "log-sendfile", "log-ioerror", "log-encoder",
                     "logfile-chmod", "log-micros", "log-format-strftime"),
                    LOGS + " (gunicorn's atoms: --access-logformat)"),
    **dict.fromkeys(("procname", "procname-prefix", "procname-prefix-spaced", "procname-append",
                     "procname-master"), "--name NAME (titles become forkwsgi: worker N [NAME])"),
    "max-requests-delta": "--max-requests-jitter N",
    "max-worker-lifetime": "--max-requests N or --max-rss MiB",
    "max-worker-lifetime-delta": "--max-requests-jitter N",
    "min-worker-lifetime": "workers are replaced as they retire, never in a loop (restarts back off)",
    "evil-reload-on-rss": "reload-on-rss (--max-rss), a graceful recycle",
    "reload-on-as": "reload-on-rss (--max-rss MiB)",
    "evil-reload-on-as": "reload-on-rss (--max-rss MiB)",
    "limit-as": "a memory limit of the unit or container (systemd MemoryMax=)",
    "socket-timeout": "--header-timeout, --body-timeout, --write-timeout",
    "http-timeout": "--keep-alive, --header-timeout, --write-timeout",
    "reuse-port": "--balance reuseport",
    "so-keepalive": "no TCP keepalive option",
    "stats-minified": "--stats serves the JSON document as uwsgitop reads it",
    "enable-metrics": "--metrics ADDR (Prometheus)",
    "carbon": "--metrics ADDR (Prometheus)",
    "optimize": "set PYTHONOPTIMIZE in the environment",
    "wsgi-disable-file-wrapper": "wsgi.file_wrapper is always offered (sendfile)",
    "py-tracebacker": "--timeout logs every thread's Python stack of a stuck worker",
}

# Families of options warned of (by prefix).
PREFIXES = {
    "cheaper-": PREFORK + ": every worker runs",
    "procname-": "--name NAME (titles become forkwsgi: worker N [NAME])",
    "log-": LOGS,
}


def refused(key):
    """Why uWSGI option `key` stops the server here, or None."""
    if key in REFUSED:
        return REFUSED[key]
    return next((why for prefix, why in REFUSED_PREFIXES.items() if key.startswith(prefix)), None)


def no_counterpart(key):
    """What to use instead of uWSGI option `key`, or None if it is not one
    we know to have no counterpart (refused() is asked first)."""
    if key in NO_COUNTERPART:
        return NO_COUNTERPART[key]
    return next((why for prefix, why in PREFIXES.items() if key.startswith(prefix)), None)
