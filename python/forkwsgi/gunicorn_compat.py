"""gunicorn's names, so that its config files and command lines work as they are.

A setting forkwsgi has under another name is taken under gunicorn's
(ALIASES); one it has no counterpart for is named in a warning at start
(NO_COUNTERPART says what to do instead; it lists every setting of
gunicorn's that forkwsgi does not take), except the few it refuses: TLS
(certfile/keyfile: never plain HTTP where TLS was asked for) and worker
classes other than sync and gthread (an ASGI or async app would start and
answer 500). GUNICORN_FLAGS gives each of gunicorn's command-line flags the
same treatment as its config-file name. Hooks (on_starting, pre_fork, ...)
are in hooks.py. speaks_gunicorn tells a config file written for gunicorn
(config.py gives it gunicorn's defaults where forkwsgi's differ). A leaf
module: data and pure functions.
"""
import os

# gunicorn's name -> forkwsgi's setting.
ALIASES = {
    "loglevel": "log_level",
    "accesslog": "access_logfile",
    "access_log_format": "access_logformat",
    "worker_connections": "max_connections",
    "errorlog": "error_logfile",
    "logconfig": "log_config",
    "logconfig_json": "log_config",
    "logconfig_dict": "log_config_dict",
}

# gunicorn settings forkwsgi does not have, and why / what instead.
NO_COUNTERPART = {
    "syslog": "log to stderr and let journald or the container runtime collect it",
    "syslog_addr": "log to stderr and let journald or the container runtime collect it",
    "daemon": "forkwsgi stays in the foreground: run it under systemd or a container",
    "reload": "code reloads on SIGHUP (systemctl reload), in place, same PID",
    "reload_engine": "code reloads on SIGHUP (systemctl reload), in place, same PID",
    "reload_extra_files": "code reloads on SIGHUP (systemctl reload), in place, same PID",
    "certfile": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "keyfile": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "ca_certs": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "ssl_version": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "cert_reqs": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "ciphers": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "do_handshake_on_connect": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "suppress_ragged_eofs": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "worker_tmp_dir": "the master watches workers through shared memory, not a file",
    "tmp_upload_dir": "use --spool-dir",
    "limit_request_field_size": "the whole head is limited by --limit-request-head",
    "enable_stdio_inheritance": "the app's stdout and stderr are the server's",
    "strip_header_spaces": "headers with spaces before the colon are refused (400), never stripped",
    "permit_unconventional_http_method": "methods are any RFC 9110 token",
    "permit_unconventional_http_version": "HTTP/1.0 and 1.1 only",
    "casefold_http_method": "methods are case-sensitive (RFC 9110)",
    "forwarder_headers": "REMOTE_ADDR is the peer, or the client a PROXY header names",
    "header_map": "header names with '_' are dropped from the environ",
    "paste": "give the app as MODULE:APP",
    "print_config": "use --print-config",
    "check_config": "use --check-config",
    "spew": "no tracing mode",
    "sendfile": "sendfile is always used for wsgi.file_wrapper",
    "reuse_port": "use --balance reuseport",
    "syslog_prefix": "log to stderr and let journald or the container runtime collect it",
    "syslog_facility": "log to stderr and let journald or the container runtime collect it",
    "disable_redirect_access_to_syslog": "log to stderr and let journald or the container runtime collect it",
    "logger_class": "use --log-config or --log-config-dict (the server logs to the 'forkwsgi' logger)",
    "default_proc_name": "use proc_name (-n)",
    "raw_paste_global_conf": "give the app as MODULE:APP",
    "enable_backlog_metric": "--metrics reports forkwsgi_listen_queue, --stats the listen queue",
    "permit_obsolete_folding": "folded (obs-fold) header lines are refused (400), as RFC 9112 allows",
    "ssl_context": "terminate TLS in the proxy in front (nginx, HAProxy)",
    "http_protocols": "HTTP/1.x only: the proxy in front speaks HTTP/2 to the clients",
    "http2_cleartext": "HTTP/1.x only: the proxy in front speaks HTTP/2 to the clients",
    "http2_max_concurrent_streams": "HTTP/1.x only: the proxy in front speaks HTTP/2 to the clients",
    "http2_initial_window_size": "HTTP/1.x only: the proxy in front speaks HTTP/2 to the clients",
    "http2_max_frame_size": "HTTP/1.x only: the proxy in front speaks HTTP/2 to the clients",
    "http2_max_header_list_size": "HTTP/1.x only: the proxy in front speaks HTTP/2 to the clients",
    "http_parser": "the HTTP parser is forkwsgi's own, in C",
    "asgi_loop": "WSGI only: no ASGI worker",
    "asgi_lifespan": "WSGI only: no ASGI worker",
    "asgi_disconnect_grace_period": "WSGI only: no ASGI worker",
    "control_socket": "signals control the master (HUP, TTIN, TTOU, ...); --stats and --metrics show it",
    "control_socket_mode": "signals control the master (HUP, TTIN, TTOU, ...); --stats and --metrics show it",
    "control_socket_disable": "signals control the master (HUP, TTIN, TTOU, ...); --stats and --metrics show it",
    "dirty_apps": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_workers": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_threads": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_timeout": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_graceful_timeout": "no dirty (background) workers: run such jobs in a process of their own",
    "on_dirty_starting": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_post_fork": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_worker_init": "no dirty (background) workers: run such jobs in a process of their own",
    "dirty_worker_exit": "no dirty (background) workers: run such jobs in a process of their own",
    "websocket_max_message_size": "WSGI only: no websockets",
}

# Of NO_COUNTERPART, the settings whose absence would change what the user
# relies on, in silence but for a warning: the server does not start with
# them (a daemon that stays in the foreground hangs an init script; a
# logger class that filters or ships lines, and syslog, would lose them).
REFUSED = ("daemon", "logger_class", "syslog")

# Names only a config file written for gunicorn assigns (forkwsgi's own
# settings have other names): with ALIASES and NO_COUNTERPART, they mark
# such a file (speaks_gunicorn).
GUNICORN_ONLY = ("worker_class", "wsgi_app")


def speaks_gunicorn(path, names):
    """Is the config file at `path`, assigning `names`, written for
    gunicorn: named gunicorn*.py, or using a name only gunicorn has? Then
    gunicorn's defaults apply where forkwsgi's differ (config.py: preload)."""
    if os.path.basename(str(path)).startswith("gunicorn"):
        return True
    return any(n in ALIASES or n in NO_COUNTERPART or n in GUNICORN_ONLY for n in names)


# gunicorn 27's command-line flags (gunicorn/config.py, each setting's
# `cli`), by the setting's name. The parser (flags.build_parser) gives each
# one forkwsgi does not define itself to the setting that name stands for
# here (the registry, ALIASES), or else takes it as that gunicorn name,
# judged as the same name in a config file is. One spelling is added:
# --limit-request-field-size (gunicorn's own has an underscore). The last
# flag of each is the one warnings name.
GUNICORN_FLAGS = {
    "config": ("-c", "--config"),
    "bind": ("-b", "--bind"),
    "backlog": ("--backlog",),
    "workers": ("-w", "--workers"),
    "worker_class": ("-k", "--worker-class"),
    "threads": ("--threads",),
    "worker_connections": ("--worker-connections",),
    "max_requests": ("--max-requests",),
    "max_requests_jitter": ("--max-requests-jitter",),
    "timeout": ("-t", "--timeout"),
    "graceful_timeout": ("--graceful-timeout",),
    "keepalive": ("--keep-alive",),
    "limit_request_line": ("--limit-request-line",),
    "limit_request_fields": ("--limit-request-fields",),
    "limit_request_field_size": ("--limit-request-field-size", "--limit-request-field_size"),
    "reload": ("--reload",),
    "reload_engine": ("--reload-engine",),
    "reload_extra_files": ("--reload-extra-file",),
    "spew": ("--spew",),
    "check_config": ("--check-config",),
    "print_config": ("--print-config",),
    "preload_app": ("--preload",),
    "sendfile": ("--no-sendfile",),
    "reuse_port": ("--reuse-port",),
    "chdir": ("--chdir",),
    "daemon": ("-D", "--daemon"),
    "raw_env": ("-e", "--env"),
    "pidfile": ("-p", "--pid"),
    "worker_tmp_dir": ("--worker-tmp-dir",),
    "user": ("-u", "--user"),
    "group": ("-g", "--group"),
    "umask": ("-m", "--umask"),
    "initgroups": ("--initgroups",),
    "forwarded_allow_ips": ("--forwarded-allow-ips",),
    "accesslog": ("--access-logfile",),
    "disable_redirect_access_to_syslog": ("--disable-redirect-access-to-syslog",),
    "access_log_format": ("--access-logformat",),
    "errorlog": ("--error-logfile", "--log-file"),
    "capture_output": ("--capture-output",),
    "loglevel": ("--log-level",),
    "logger_class": ("--logger-class",),
    "logconfig": ("--log-config",),
    "logconfig_json": ("--log-config-json",),
    "syslog_addr": ("--log-syslog-to",),
    "syslog": ("--log-syslog",),
    "syslog_prefix": ("--log-syslog-prefix",),
    "syslog_facility": ("--log-syslog-facility",),
    "enable_stdio_inheritance": ("-R", "--enable-stdio-inheritance"),
    "statsd_host": ("--statsd-host",),
    "dogstatsd_tags": ("--dogstatsd-tags",),
    "statsd_prefix": ("--statsd-prefix",),
    "enable_backlog_metric": ("--enable-backlog-metric",),
    "proc_name": ("-n", "--name"),
    "pythonpath": ("--pythonpath",),
    "paste": ("--paste", "--paster"),
    "proxy_protocol": ("--proxy-protocol",),
    "proxy_allow_ips": ("--proxy-allow-from",),
    "protocol": ("--protocol",),
    "uwsgi_allow_ips": ("--uwsgi-allow-from",),
    "keyfile": ("--keyfile",),
    "certfile": ("--certfile",),
    "ssl_version": ("--ssl-version",),
    "cert_reqs": ("--cert-reqs",),
    "ca_certs": ("--ca-certs",),
    "suppress_ragged_eofs": ("--suppress-ragged-eofs",),
    "do_handshake_on_connect": ("--do-handshake-on-connect",),
    "ciphers": ("--ciphers",),
    "http_protocols": ("--http-protocols",),
    "http2_cleartext": ("--http2-cleartext",),
    "http2_max_concurrent_streams": ("--http2-max-concurrent-streams",),
    "http2_initial_window_size": ("--http2-initial-window-size",),
    "http2_max_frame_size": ("--http2-max-frame-size",),
    "http2_max_header_list_size": ("--http2-max-header-list-size",),
    "raw_paste_global_conf": ("--paste-global",),
    "permit_obsolete_folding": ("--permit-obsolete-folding",),
    "strip_header_spaces": ("--strip-header-spaces",),
    "permit_unconventional_http_method": ("--permit-unconventional-http-method",),
    "permit_unconventional_http_version": ("--permit-unconventional-http-version",),
    "casefold_http_method": ("--casefold-http-method",),
    "forwarder_headers": ("--forwarder-headers",),
    "header_map": ("--header-map",),
    "asgi_loop": ("--asgi-loop",),
    "asgi_lifespan": ("--asgi-lifespan",),
    "asgi_disconnect_grace_period": ("--asgi-disconnect-grace-period",),
    "websocket_max_message_size": ("--websocket-max-message-size",),
    "http_parser": ("--http-parser",),
    "root_path": ("--root-path",),
    "dirty_apps": ("--dirty-app",),
    "dirty_workers": ("--dirty-workers",),
    "dirty_timeout": ("--dirty-timeout",),
    "dirty_threads": ("--dirty-threads",),
    "dirty_graceful_timeout": ("--dirty-graceful-timeout",),
    "control_socket": ("--control-socket",),
    "control_socket_mode": ("--control-socket-mode",),
    "control_socket_disable": ("--no-control-socket",),
}

# gunicorn's flags that take no value, and the value they set.
GUNICORN_SWITCHES = {
    "reload": True, "spew": True, "check_config": True, "print_config": True, "preload_app": True,
    "sendfile": False, "reuse_port": True, "daemon": True, "initgroups": True,
    "disable_redirect_access_to_syslog": True, "syslog": True,
    "enable_stdio_inheritance": True, "enable_backlog_metric": True, "suppress_ragged_eofs": True,
    "do_handshake_on_connect": True, "permit_obsolete_folding": True, "strip_header_spaces": True,
    "permit_unconventional_http_method": True, "permit_unconventional_http_version": True,
    "casefold_http_method": True, "control_socket_disable": True,
}

# gunicorn's flags that may be given more than once (a list).
GUNICORN_REPEATED = ("bind", "reload_extra_files", "raw_env", "raw_paste_global_conf", "dirty_apps")

# gunicorn serves TLS when either is set (its Config.is_ssl); the other TLS
# settings it uses only then.
TLS_ON = ("certfile", "keyfile")
TLS_ONLY = ("ca_certs", "ssl_version", "cert_reqs", "ciphers", "do_handshake_on_connect",
            "suppress_ragged_eofs", "ssl_context")

# worker_class values forkwsgi's workers stand in for: one C event loop with
# --threads app threads, as gunicorn's sync (threads 1) and gthread workers.
WORKER_CLASSES_COVERED = ("sync", "gthread", "gunicorn.workers.sync.SyncWorker",
                          "gunicorn.workers.gthread.ThreadWorker", "egg:gunicorn#sync", "egg:gunicorn#gthread")


def class_name(value):
    """A worker_class as text: a class object by its dotted path."""
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def worker_class_refusal(value):
    """None for a worker class forkwsgi's workers stand in for, else why
    the server will not start with it."""
    name = class_name(value)
    if name in WORKER_CLASSES_COVERED:
        return None
    if any(word in name.lower() for word in ("asgi", "uvicorn", "hypercorn")):
        return (f"worker class {name!r} is an ASGI worker: forkwsgi serves WSGI apps only "
                "(serve an ASGI app with uvicorn, or gunicorn with this worker class)")
    return (f"worker class {name!r} has no counterpart: forkwsgi's workers are one C event loop with "
            "--threads app threads, as gunicorn's sync and gthread (use -k gthread --threads N)")


def asks_nothing(name, value):
    """True when `value` asks for nothing forkwsgi does not do anyway:
    unset (None, empty), a switch left off, gunicorn's control socket
    turned off (forkwsgi has none). Those are taken without a warning."""
    if value is None or (isinstance(value, (str, list, tuple, dict)) and not value):
        return True
    if value is False and GUNICORN_SWITCHES.get(name) is True:
        return True
    return name == "control_socket_disable" and value is True


def label(name, where):
    """How the user wrote gunicorn's setting `name`: its flag on a command
    line (or in *_CMD_ARGS), its name in a config file."""
    if where.startswith("config file") or name not in GUNICORN_FLAGS:
        return repr(name)
    return GUNICORN_FLAGS[name][-1]


def judge(given):
    """What forkwsgi makes of the gunicorn settings it has no setting of
    its own for. given: {gunicorn name: (value, where)}, each from its most
    authoritative source. Returns (ignored, refused): ignored, a list of
    (name, value, where, why), each a warning at start; refused, a list of
    lines, each of which stops the server at start."""
    ignored, refused = [], []
    tls = [n for n in TLS_ON if n in given and not asks_nothing(n, given[n][0])]
    if tls:
        value, where = given[tls[0]]
        refused.append(f"{where}: {label(tls[0], where)} {value!r}: forkwsgi does not serve TLS, and will "
                       "not serve plain HTTP where TLS is configured: terminate TLS in the proxy in front "
                       "(nginx, HAProxy) and drop certfile/keyfile here")
    if "worker_class" in given and not asks_nothing("worker_class", given["worker_class"][0]):
        value, where = given["worker_class"]
        why = worker_class_refusal(value)
        if why:
            refused.append(f"{where}: {why}")
    for name, (value, where) in given.items():
        if name == "worker_class" or name in TLS_ON or (tls and name in TLS_ONLY) or asks_nothing(name, value):
            continue
        why = NO_COUNTERPART.get(name, "forkwsgi has no counterpart")
        if name in REFUSED:
            refused.append(f"{where}: {label(name, where)} = {value!r} (gunicorn) has no counterpart here, and "
                           f"running without it would differ: {why}")
            continue
        if name in TLS_ONLY:
            why = "gunicorn uses it only with certfile/keyfile, which are not set; " + why
        ignored.append((name, value, where, why))
    return ignored, refused


def ignored_line(name, value, where, why):
    """The warning for one ignored gunicorn setting."""
    return f"{where}: {label(name, where)} (gunicorn) has no counterpart here: ignored; {why}"
