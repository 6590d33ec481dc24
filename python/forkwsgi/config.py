"""Where the settings come from and how they merge: the one registry
(settings.py) drives the CLI (flags.py), the config files and the environment.

Precedence, lowest first: defaults, a uWSGI ini file (``--ini FILE[:SECTION]``,
uwsgi_ini.py, uwsgi_compat.py), the config file (``-c FILE``, a Python file assigning
settings by name; without -c, ./forkwsgi.conf.py or ./gunicorn.conf.py),
``GUNICORN_CMD_ARGS``, ``FORKWSGI_<FLAG>`` environment variables (the long
flag in capitals: ``FORKWSGI_KEEP_ALIVE``; the setting's name,
``FORKWSGI_KEEPALIVE``, works too), ``FORKWSGI_CMD_ARGS``, command line.
gunicorn's names and flags are taken everywhere (gunicorn_compat.py).
``forkwsgi --help`` lists every setting with its default.
"""
import importlib
import os
import runpy
import types

from . import accesslog, gunicorn_compat, hooks
from .flags import GUNICORN_DEST, build_parser, env_names, parse_env_flags, parse_flags, typo_of
from .settings import BY_NAME, SETTINGS, ConfigError, defaults

# forkwsgi.config is the package's face for settings (embedders catch
# config.ConfigError): the registry's and the parser's names used outside
# are importable from here too.
from .flags import unknown_env  # noqa: F401
from .settings import resolve, server_options  # noqa: F401
from .valuetypes import BALANCE_MODES  # noqa: F401


class ConfigFileError(ConfigError):
    """The config file cannot be read, or raises: --check-config says 1,
    as gunicorn's does, where other usage errors are 2."""


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
    layers = _flag_layers(environ, argv)
    by_where = dict(layers)
    app_spec = _app_of_layers(layers, origins)
    cfg = defaults()
    _apply_platform_env(environ, cfg, origins)
    ini_app = _apply_ini_named(by_where, environ, cfg, origins, warnings)
    gunicorn_given = {}           # gunicorn's settings with no counterpart: name -> (value, where)
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
    _apply_env(environ, cfg, origins)
    for where in ("FORKWSGI_CMD_ARGS", "command line"):
        _apply_flags(where, by_where[where], cfg, origins, gunicorn_given)
    _judge_gunicorn(gunicorn_given, warnings, ignored, refused)
    origins["preload"] = settle_preload(cfg, origins, gunicorn_file)
    _settle_the_rest(cfg, origins, warnings)
    return app_spec, cfg


def _flag_layers(environ, argv):
    """The flag sources as (where, flags given by dest), most
    authoritative first: the command line, FORKWSGI_CMD_ARGS,
    GUNICORN_CMD_ARGS."""
    parser = build_parser()
    layers = [("command line", parse_flags(parser, argv, "command line"))]
    layers += [(var, parse_env_flags(parser, environ, var)) for var in ("FORKWSGI_CMD_ARGS", "GUNICORN_CMD_ARGS")]
    return layers


def _app_of_layers(layers, origins):
    """The app named by the most authoritative flag source that names one,
    or None; taken out of each layer (it is no setting)."""
    app_spec = None
    for where, given in layers:
        app = given.pop("app", None)
        if app and not app_spec:
            app_spec, origins["app"] = app, where
    return app_spec


def _apply_platform_env(environ, cfg, origins):
    """Defaults that Heroku-style platforms and gunicorn take from the
    environment: WEB_CONCURRENCY, PORT, SCRIPT_NAME, FORWARDED_ALLOW_IPS."""
    for var, name, value in (("WEB_CONCURRENCY", "workers", lambda v: v),
                             ("PORT", "bind", lambda v: f"0.0.0.0:{v}"),
                             ("SCRIPT_NAME", "root_path", lambda v: v),
                             ("FORWARDED_ALLOW_IPS", "forwarded_allow_ips", lambda v: v)):
        # gunicorn reads FORWARDED_ALLOW_IPS when set at all ('' allows no address).
        if environ.get(var, "").strip() or (var == "FORWARDED_ALLOW_IPS" and var in environ):
            cfg[name] = BY_NAME[name].parse(value(environ[var].strip()), var)
            origins[name] = var


def _apply_ini_named(by_where, environ, cfg, origins, warnings):
    """The uWSGI ini file named by --ini (command line, FORKWSGI_CMD_ARGS)
    or FORKWSGI_INI, if any: apply_ini's result, else None."""
    ini_file = by_where["command line"].get("ini") or by_where["FORKWSGI_CMD_ARGS"].get("ini") or \
        environ.get("FORKWSGI_INI")
    if not ini_file:
        return None
    ini_app = apply_ini(ini_file, cfg, origins, warnings, environ)
    origins["ini"] = next((w for w in ("command line", "FORKWSGI_CMD_ARGS") if by_where[w].get("ini")),
                          "FORKWSGI_INI")
    return ini_app


def _apply_env(environ, cfg, origins):
    """The FORKWSGI_<FLAG> (or FORKWSGI_<NAME>) variables, one per setting."""
    for s in SETTINGS:
        found = [n for n in env_names(s) if n in environ]
        if len(found) > 1:
            raise ConfigError(f"{' and '.join(found)} are both set: use one")
        if found and s.name not in ("config", "ini"):
            cfg[s.name] = s.parse(environ[found[0]], found[0])
            origins[s.name] = found[0]


def _settle_the_rest(cfg, origins, warnings):
    """What follows from the settings as a whole, once all are in."""
    no_address = origins.pop("ini_no_address", None)
    if no_address and "bind" not in origins and "uwsgi_socket" not in origins:
        raise ConfigError(no_address)          # uWSGI does not start without a socket either
    if cfg["uwsgi_socket"] and "bind" not in origins:
        cfg["bind"] = []          # uwsgi sockets alone: no HTTP address nobody asked for
    unknown_atoms = accesslog.unknown_atoms(cfg["access_logformat"])
    if unknown_atoms:
        # gunicorn starts with them (and writes '-'): a warning, not an error.
        warnings.append(f"--access-logformat ({origins['access_logformat']}): unknown atom(s) "
                        f"{' '.join(unknown_atoms)}, written as '-' (see forkwsgi --help)")


def apply_ini(spec, cfg, origins, warnings, environ):
    """The settings of uWSGI ini file `spec` (FILE or FILE:SECTION) into
    cfg, below everything else (uwsgi_ini.py reads it, uwsgi_compat.py translates it).
    Returns (app spec, where) from its module / wsgi-file, or None."""
    from . import uwsgi_compat, uwsgi_ini    # here: only --ini needs them, and they cost every start ~3 ms
    try:
        ini = uwsgi_ini.Ini(spec, environ)
        t = uwsgi_compat.translate(ini, defaults(), typo_of)
    except uwsgi_ini.IniError as e:
        raise ConfigError(str(e)) from None
    cfg["ini"] = spec
    for name, (value, key) in t.values.items():
        where = f"{ini.where()}: {key}"
        cfg[name] = value if value is None else BY_NAME[name].parse(value, where)
        origins[name] = where
    warnings += t.warnings
    if t.no_address:
        origins["ini_no_address"] = t.no_address
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

