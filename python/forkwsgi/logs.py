"""The server's own log (the "forkwsgi" logger): where it goes and how it
looks. By default one line per event on stderr in gunicorn's format;
--error-logfile FILE (gunicorn's errorlog), --log-json (one JSON object
per line), or --log-config FILE (logging's dictConfig from .json, fileConfig
from .ini/.conf, as gunicorn's logconfig_json and logconfig) and
logconfig_dict in a config file. SIGUSR1 reopens the file (reopen()).
"""
import json
import logging
import logging.config
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


def setup(cfg):
    """The logger as the settings say. ConfigError (one line) for a file that
    cannot be opened or a logging configuration that does not apply."""
    level = cfg.get("log_level", "INFO")
    if cfg.get("log_config") or cfg.get("log_config_dict"):
        _from_logging_config(cfg.get("log_config"), cfg.get("log_config_dict"))
        if not log.level:
            log.setLevel(level)
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


def _from_logging_config(path, as_dict):
    try:
        if as_dict:
            logging.config.dictConfig(as_dict)
        elif path.endswith(".json"):
            with open(path) as f:
                logging.config.dictConfig(json.load(f))
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except OSError as e:
        raise ConfigError(f"--log-config {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
        raise ConfigError(f"logging configuration {'(logconfig_dict)' if as_dict else path}: {e}") from None


def reopen():
    """SIGUSR1 (logrotate): files are reopened at their paths on the next line."""
    for logger in (log, logging.getLogger()):
        for h in logger.handlers:
            if isinstance(h, logging.FileHandler):
                h.close()
