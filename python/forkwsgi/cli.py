"""forkwsgi MODULE:APP [options]: the command line."""
import logging
import os
import signal
import sys
import threading
import time

from . import accesslog, appload, arbiter, binding, config, gunicorn_compat, logs, systemd
from . import process
from .server import Server

log = logging.getLogger("forkwsgi")


def fail(msg):
    print(f"forkwsgi: error: {msg}", file=sys.stderr)
    return 2


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["top"]:                  # forkwsgi top ADDR: a view of a server's --stats
        from . import top
        return top.main(argv[1:])
    started_in = os.getcwd()         # where an in-place reload re-executes (before --chdir)
    origins, unknown, hook_fns, ignored, refused = {}, [], {}, [], []
    try:
        app_spec, cfg = config.load(argv, origins=origins, warnings=unknown, hook_fns=hook_fns,
                                    ignored=ignored, refused=refused)
    except config.ConfigError as e:
        if isinstance(e, config.ConfigFileError) and "--check-config" in argv:
            # The verdict gunicorn's --check-config gives a config file that
            # cannot be read or raises: 1, as for any other failed check.
            print(f"forkwsgi: error: {e}", file=sys.stderr)
            return 1
        return fail(e)
    unknown += config.unknown_env()
    if cfg["print_config"]:
        print(config.describe(cfg, origins, app_spec, hook_fns, ignored, refused))
        return 0
    if refused and not cfg["check_config"]:
        for line in refused:         # TLS, a worker class: never start half of what was asked
            print(f"forkwsgi: error: {line}", file=sys.stderr)
        return 2
    try:
        logs.setup(cfg)
    except config.ConfigError as e:
        return fail(e)
    if not cfg["check_config"]:
        if cfg["config"]:
            log.info("Config file: %s (%s)", cfg["config"], origins["config"])
        for warning in unknown + [gunicorn_compat.ignored_line(*i) for i in ignored]:
            log.warning("%s", warning)
    take_passed_sockets(cfg, origins)
    try:
        process.prepare_import(cfg)
    except OSError as e:
        return fail(f"cannot change to {cfg['chdir']}: {e.strerror}")
    if cfg["umask"] is not None and origins.get("umask", "").startswith("ini file"):
        os.umask(cfg["umask"])        # uWSGI's umask is the process's; gunicorn's, the unix sockets' only
    process.set_name(cfg["proc_name"])
    if cfg["check_config"]:
        return check(app_spec, cfg, origins, unknown, ignored, refused)
    problem = log_file_problem(cfg)
    if problem:
        return fail(problem)
    try:
        owner = workers_owner(cfg)
    except config.ConfigError as e:
        return fail(e)
    if cfg["workers"] > 0:
        return run_master(app_spec, cfg, systemd.Notifier(), argv, started_in, hook_fns, owner, origins["preload"])
    return run_alone(app_spec, cfg, hook_fns, owner)


def take_passed_sockets(cfg, origins):
    """systemd socket activation: the passed sockets, and no others, as
    gunicorn serves them whatever its bind says (the socket unit is where
    clients connect; a --bind of a unix path would even replace its file).
    They speak uwsgi when --uwsgi-socket alone was given (nginx's
    uwsgi_pass to the socket unit), else HTTP."""
    passed = systemd.listen_fds()
    if not passed:
        return
    fds = [f"fd://{fd}" for fd in passed]
    uwsgi = bool(cfg["uwsgi_socket"]) and "bind" not in origins
    given = [f"{name} ({origins[key]})" for name, key in (("--bind", "bind"), ("--uwsgi-socket", "uwsgi_socket"))
             if key in origins]
    if given:
        log.warning("systemd passed %d socket(s) (LISTEN_FDS): serving them%s, as gunicorn does; %s not used",
                    len(passed), " as uwsgi sockets" if uwsgi else "", " and ".join(given))
    cfg["bind"], cfg["uwsgi_socket"] = ([], fds) if uwsgi else (fds, [])


def workers_owner(cfg):
    """--user/--group (process.Owner), given the log files; None if not
    set. ConfigError: switching needs root and this is not."""
    if not cfg["user"] and not cfg["group"]:
        return None
    owner = process.Owner(cfg["user"], cfg["group"], cfg["initgroups"])
    if owner.needed() and os.geteuid() != 0:
        raise config.ConfigError(f"--user/--group: switching to uid {owner.uid} gid {owner.gid} needs root")
    for path in (cfg["access_logfile"], cfg["error_logfile"]):
        if path and path != "-":
            owner.give(os.path.abspath(path))     # workers reopen them on SIGUSR1
    return owner


def run_alone(app_spec, cfg, hook_fns, owner):
    """--workers 0: serve from this process, with no master (and, with
    --offload-sink, the sibling this process supervises)."""
    if hook_fns:
        log.warning("server hooks (%s) need a master (--workers 1 or more): not called", ", ".join(hook_fns))
    if owner:
        return fail("--user/--group need a master (--workers 1 or more): its workers drop privileges")
    host = None
    if cfg["offload_sink"]:           # before the app, which may offload at import
        from .offload.supervisor import Host     # here: most servers never offload (~20 ms of imports)
        try:
            host = Host(cfg, log)
        except config.ConfigError as e:
            return fail(e)
        except (OSError, ValueError) as e:
            return fail(f"offload: {e}")
    how = {"graceful": True}
    try:
        return serve_here(app_spec, cfg, host, how, systemd.Notifier())
    finally:
        if host is not None:
            host.stop(graceful=how["graceful"])


def log_file_problem(cfg):
    """Why the access log file cannot be written, or None. Checked once at
    start, so a typo is one line here, not a worker failing to boot."""
    path = cfg["access_logfile"]
    if not path:
        return None
    try:
        os.close(accesslog.open_file(path))
    except OSError as e:
        return f"--access-logfile {path}: {e.strerror}"
    return None


def check(app_spec, cfg, origins, problems, ignored=(), refused=()):
    """--check-config, the strict mode: exit 0 or 1. Fails on: a setting the
    server refuses (TLS, a worker class other than sync/gthread), a name in
    the config file that is a typo of a setting, a FORKWSGI_* variable that
    is no setting, a bind address, the app's import. A gunicorn setting
    forkwsgi ignores is printed as a warning and does not fail (gunicorn
    accepts it too). Names the config file read, as the server logs it."""
    problems = [*refused, *problems]
    problems += filter(None, [log_file_problem(cfg)])
    for addr, _ in binding.listeners(cfg):
        try:
            binding.parse(addr)
        except binding.BindError as e:
            problems.append(str(e))
    if not app_spec:
        problems.append("no app given: forkwsgi MODULE:APP (see --help)")
    else:
        try:
            appload.load(app_spec)
        except appload.AppImportError as e:
            problems.append(str(e))
        except Exception as e:  # noqa: BLE001 - the app's own error, reported
            problems.append(f"error while importing the app {app_spec!r}: {appload.describe_error(e)}")
    if cfg["config"]:
        print(f"forkwsgi: config file {cfg['config']} ({origins['config']})")
    for i in ignored:
        print(f"forkwsgi: warning: {gunicorn_compat.ignored_line(*i)}", file=sys.stderr)
    for p in problems:
        print(f"forkwsgi: error: {p}", file=sys.stderr)
    if not problems:
        print(f"forkwsgi: configuration OK ({app_spec})")
    return 1 if problems else 0


def serve_here(app_spec, cfg, host, how, notifier):
    """--workers 0: serve from this process."""
    try:
        app = appload.load(app_spec)
    except appload.AppImportError as e:
        return fail(e)
    except Exception:
        log.exception("error while importing the app %r", app_spec)
        return 1
    options = config.server_options(cfg)
    if options["max_requests"] or cfg["max_rss"]:
        log.warning("--max-requests and --max-rss need a master (--workers 1 or more): ignored")
        options["max_requests"] = 0
    for name in ("stats", "metrics", "statsd_host"):
        if cfg[name]:
            log.warning("--%s needs a master (--workers 1 or more): ignored", name.replace("_", "-"))
    try:
        server = Server(app, logger=log, _offload_host=host, _unix_umask=binding.unix_umask(cfg["umask"]),
                        _access_logger=logs.access_logger(cfg), **options)
    except binding.BindError as e:
        return fail(e)
    except (config.ConfigError, ValueError) as e:
        return fail(e)

    def end_anyway(seconds):
        # No master ends this process when a request never returns (a
        # worker is killed 1 s after --graceful-timeout, or after a fast
        # stop): the stop's own deadline does.
        def run():
            time.sleep(seconds)
            log.error("the stop did not end within %g s (a request is still in the app): exiting now",
                      seconds)
            os._exit(0)
        threading.Thread(target=run, name="forkwsgi stop deadline", daemon=True).start()

    def graceful(signum, frame):
        log.info("Received %s: stopping gracefully", signal.Signals(signum).name)
        notifier.stopping()
        server.stop(graceful=True)
        end_anyway(cfg["graceful_timeout"] + 1.0)

    def fast(signum, frame):
        log.info("Received %s: stopping now", signal.Signals(signum).name)
        notifier.stopping()
        how["graceful"] = False
        server.stop(graceful=False)
        end_anyway(1.0)

    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGQUIT, fast)
    signal.signal(signal.SIGINT, fast)
    def reopen(signum, frame):
        server.reopen_logs()
        logs.reopen()

    signal.signal(signal.SIGUSR1, reopen)

    def needs_master(signum, frame):
        log.warning("Received %s: reloads and changes of the worker count need a master "
                    "(--workers 1 or more); ignored", signal.Signals(signum).name)

    # Left at their defaults, SIGHUP and SIGUSR2 (a reload: systemctl reload,
    # gunicorn's upgrade) would end the process, and SIGTTIN/SIGTTOU
    # (gunicorn's one worker more or less) would stop it.
    for signum in (signal.SIGHUP, signal.SIGUSR2, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, needs_master)
    # Ready: the sockets are bound and the loop starts at once (watchdog
    # keep-alives need a master: --workers 1 or more).
    try:
        pidfile = process.PidFile(cfg["pidfile"]) if cfg["pidfile"] else None
    except OSError as e:
        server.close()
        return fail(f"--pid {cfg['pidfile']}: {e.strerror}")
    try:
        server.start_threads()
    except OSError as e:
        server.close()
        return fail(e.strerror)
    notifier.ready(f"serving {', '.join(server.urls)}")
    try:
        with server:
            server.serve()
    finally:
        if pidfile:
            pidfile.remove()
    return 0


def run_master(app_spec, cfg, notifier, argv=None, cwd=None, hook_fns=None, owner=None, preload_note=None):
    """The pre-fork master: bind, preload, fork workers, supervise."""
    if not app_spec:
        return fail("no app given: forkwsgi MODULE:APP (see --help)")
    master = arbiter.Arbiter(app_spec, cfg, log, notifier=notifier, argv=argv, cwd=cwd, hook_fns=hook_fns,
                             owner=owner, preload_note=preload_note)
    try:
        master.start()
    except (binding.BindError, appload.AppImportError, config.ConfigError) as e:
        master.discard()
        return fail(e)
    except Exception:
        master.discard()
        log.exception("error while importing the app %r", app_spec)
        return 1
    try:
        pidfile = process.PidFile(cfg["pidfile"]) if cfg["pidfile"] else None
    except OSError as e:
        master.discard()
        return fail(f"--pid {cfg['pidfile']}: {e.strerror}")
    try:
        return master.run()
    finally:
        if pidfile:
            pidfile.remove()


if __name__ == "__main__":
    sys.exit(main())
