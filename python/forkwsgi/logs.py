"""The server's own log (the "forkwsgi" logger): where it goes and how it
looks. By default one line per event on stderr in gunicorn's format;
--error-logfile FILE (gunicorn's errorlog), --log-json (one JSON object
per line), or --log-config FILE (logging's dictConfig from .json, fileConfig
from .ini/.conf, as gunicorn's logconfig_json and logconfig) and
logconfig_dict in a config file. SIGUSR1 reopens the files (reopen()).

A logging configuration written for gunicorn names gunicorn's loggers: one
that configures "gunicorn.error" (and not "forkwsgi") gets the server's
records there, under that name (Alias); one that configures
"gunicorn.access" (or "forkwsgi.access") gets the access lines as log
records there, with gunicorn's atoms (access_logger(), accessrecords.py),
instead of the C writer's lines.
"""
import json
import logging
import os
import sys
import time

from .config import ConfigError

log = logging.getLogger("forkwsgi")

TEXT_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, pid, message, and the
    exception's traceback when there is one."""

    def format(self, record):
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
               + f".{int(record.msecs):03d}" + time.strftime("%z", time.localtime(record.created)),
               "level": record.levelname, "pid": record.process, "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class Alias(logging.Handler):
    """Hands the server's records to the handlers of another logger (that
    of gunicorn's name the logging configuration sets up), under its name,
    as if they had been logged there."""

    def __init__(self, target):
        super().__init__()
        self.target = target

    def emit(self, record):
        moved = logging.makeLogRecord(record.__dict__)
        moved.name = self.target.name
        self.target.handle(moved)


def configured_loggers(path, as_dict):
    """The names of the loggers a logging configuration sets up: its
    "loggers" (dictConfig), or the qualnames of its [loggers] (fileConfig)."""
    import configparser              # here, as logging.config: only --log-config needs it
    try:
        if as_dict:
            return set(as_dict.get("loggers") or ())
        if path and path.endswith(".json"):
            with open(path) as f:
                return set(json.load(f).get("loggers") or ())
        if path:
            cp = configparser.ConfigParser(interpolation=None)
            cp.read(path)
            keys = [k.strip() for k in cp.get("loggers", "keys", fallback="").split(",") if k.strip()]
            return {cp.get(f"logger_{k}", "qualname", fallback=k) for k in keys if k != "root"}
    except (OSError, ValueError, AttributeError, configparser.Error):
        pass                         # setup() has said what is wrong with it
    return set()


def access_logger(cfg):
    """The logger the access lines go to as records, or None (the C
    writer's lines, --access-logfile): "gunicorn.access" or
    "forkwsgi.access" when the logging configuration sets one up."""
    if not (cfg.get("log_config") or cfg.get("log_config_dict")):
        return None
    names = configured_loggers(cfg.get("log_config"), cfg.get("log_config_dict"))
    return next((n for n in ("gunicorn.access", "forkwsgi.access") if n in names), None)


def setup(cfg):
    """The logger as the settings say. ConfigError (one line) for a file that
    cannot be opened or a logging configuration that does not apply."""
    level = cfg.get("log_level", "INFO")
    if cfg.get("log_config") or cfg.get("log_config_dict"):
        # gunicorn's levels before the configuration, which may change them.
        logging.getLogger("gunicorn.error").setLevel(level)
        logging.getLogger("gunicorn.access").setLevel(logging.INFO)
        _from_logging_config(cfg.get("log_config"), cfg.get("log_config_dict"))
        names = configured_loggers(cfg.get("log_config"), cfg.get("log_config_dict"))
        if "gunicorn.error" in names and "forkwsgi" not in names:
            target = logging.getLogger("gunicorn.error")
            log.handlers[:] = [Alias(target)]
            log.propagate = False
            log.disabled = False
            log.setLevel(target.getEffectiveLevel())
        else:
            if not log.level:
                log.setLevel(level)
            # disable_existing_loggers: True in the user's configuration
            # would silence the server (its errors included); a logger the
            # configuration does not name is not the user's to turn off.
            if "forkwsgi" not in names:
                log.disabled = False
        _say_where_access_goes(cfg)
        return
    path = cfg.get("error_logfile") or "-"
    if path == "-":
        handler = logging.StreamHandler(sys.stderr)
    else:
        try:
            handler = logging.FileHandler(os.path.abspath(path), mode="a", encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"--error-logfile {path}: {e.strerror}") from None
    handler.setFormatter(JsonFormatter() if cfg.get("log_json") else logging.Formatter(TEXT_FORMAT, DATE_FORMAT))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    if cfg.get("capture_output") and path != "-":
        _captured[:] = [os.path.abspath(path)]
        capture()


# --capture-output: the file standard output and error go to (none: empty).
_captured = []


def capture():
    """--capture-output: file descriptors 1 and 2 of this process (the
    workers inherit them) point at the error log file, opened anew at its
    path (SIGUSR1 calls this again after logrotate moved it)."""
    if not _captured:
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    try:
        fd = os.open(_captured[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ConfigError(f"--capture-output: --error-logfile {_captured[0]}: {e.strerror}") from None
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _say_where_access_goes(cfg):
    name = access_logger(cfg)
    if not name:
        return
    log.info("Access log: a log record per response to logger %r (the logging configuration sets it up), "
             "with gunicorn's atoms", name)
    if cfg.get("access_logfile"):
        log.warning("--access-logfile %s is not written: the logging configuration sets up %r, which gets "
                    "the access lines (as gunicorn does with a logging configuration)", cfg["access_logfile"],
                    name)


def _from_logging_config(path, as_dict):
    # Imported here: it brings configparser, logging.handlers and pickle
    # (~3 ms), which the servers with no --log-config would load at every start.
    import logging.config
    try:
        if as_dict:
            # gunicorn's default: the loggers that exist go on (the
            # server's among them).
            logging.config.dictConfig({"disable_existing_loggers": False, **as_dict})
        elif path.endswith(".json"):
            with open(path) as f:
                logging.config.dictConfig({"disable_existing_loggers": False, **json.load(f)})
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except OSError as e:
        raise ConfigError(f"--log-config {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
        raise ConfigError(f"logging configuration {'(logconfig_dict)' if as_dict else path}: {e}") from None


def reopen():
    """SIGUSR1 (logrotate): files are reopened at their paths on the next
    line, those of every logger (a logging configuration may give any its own)."""
    loggers = [logging.getLogger()] + [x for x in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(x, logging.Logger)]
    for logger in loggers:
        for h in logger.handlers:
            if isinstance(h, logging.FileHandler):
                h.close()
    try:
        capture()
    except ConfigError as e:
        log.warning("%s: standard output and error still go to the file they went to", e)
