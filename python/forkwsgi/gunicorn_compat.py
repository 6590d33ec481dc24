"""gunicorn's config-file names, so that `-c gunicorn.conf.py` works as is.

A setting forkwsgi has under another name is taken under gunicorn's
(ALIASES); one it has no counterpart for is named in a warning at start and
is an error under --check-config (NO_COUNTERPART says what to do instead;
it lists every setting of gunicorn's that forkwsgi does not take);
a typo gets a "did you mean". Any other name (a helper variable, a
constant) is the file's own business, ignored as gunicorn ignores it. Hooks (on_starting, pre_fork, ...) are in
hooks.py. A leaf module: data only.
"""

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
    "statsd_host": "use --metrics (Prometheus) or --stats",
    "statsd_prefix": "use --metrics (Prometheus) or --stats",
    "dogstatsd_tags": "use --metrics (Prometheus) or --stats",
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
    "capture_output": "the app's stdout and stderr are the server's (journald, docker logs)",
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
}

# worker_class values forkwsgi's model covers (a worker with --threads app threads).
WORKER_CLASSES_COVERED = ("sync", "gthread", "gunicorn.workers.sync.SyncWorker",
                          "gunicorn.workers.gthread.ThreadWorker")


def worker_class_warning(value):
    """None for a worker class forkwsgi's workers stand in for, else why not."""
    if str(value) in WORKER_CLASSES_COVERED:
        return None
    return (f"worker_class {value!r}: forkwsgi's workers are one C event loop with --threads app threads "
            "(gunicorn's sync and gthread); async workers have no counterpart")
