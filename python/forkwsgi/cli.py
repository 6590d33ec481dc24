"""forkwsgi MODULE:APP [options]: the command line."""
import logging
import os
import signal
import sys

from . import appload, binding, config
from .server import Server

log = logging.getLogger("forkwsgi")


def setup_logging(level):
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s",
                                           "%Y-%m-%d %H:%M:%S %z"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def fail(msg):
    print(f"forkwsgi: error: {msg}", file=sys.stderr)
    return 2


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        app_spec, cfg = config.load(argv)
    except config.ConfigError as e:
        return fail(e)
    setup_logging(cfg["log_level"])
    if cfg["chdir"]:
        try:
            os.chdir(cfg["chdir"])
        except OSError as e:
            return fail(f"cannot change to {cfg['chdir']}: {e.strerror}")
        sys.path.insert(0, os.getcwd())
    try:
        app = appload.load(app_spec)
    except appload.AppImportError as e:
        return fail(e)
    except Exception:
        log.exception("error while importing the app %r", app_spec)
        return 1
    options = {k: v for k, v in cfg.items() if k not in ("config", "chdir", "log_level")}
    try:
        server = Server(app, logger=log, **options)
    except binding.BindError as e:
        return fail(e)
    except (config.ConfigError, ValueError) as e:
        return fail(e)

    def graceful(signum, frame):
        log.info("Received %s: stopping gracefully", signal.Signals(signum).name)
        server.stop(graceful=True)

    def fast(signum, frame):
        log.info("Received %s: stopping now", signal.Signals(signum).name)
        server.stop(graceful=False)

    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGQUIT, fast)
    signal.signal(signal.SIGINT, fast)
    with server:
        server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
