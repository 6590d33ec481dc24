"""How the settings are spelled outside a config file: the command-line
parser built from the registry (with gunicorn's flags beside forkwsgi's),
the FORKWSGI_* environment variables, and the near misses of either or of a
config file's names (a typo is named, never silently ignored).
"""
import argparse
import difflib
import os
import shlex

from . import gunicorn_compat
from ._version import __version__
from .settings import BY_NAME, SETTINGS, ConfigError
from .valuetypes import boolean


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def _argument_kwargs(s):
    """argparse's keywords for registry setting s (defaults suppressed: a
    flag not given is absent from the result, so lower sources show)."""
    if s.convert is boolean:
        return dict(dest=s.name, default=argparse.SUPPRESS, action="store_const", const=True)
    kw = dict(dest=s.name, metavar=s.metavar, default=argparse.SUPPRESS)
    if s.multiple:
        kw["action"] = "append"
    elif s.const is not None:
        kw.update(nargs="?", const=s.const)
    return kw


# The dest of a gunicorn flag with no setting here: GUNICORN_DEST + its name.
GUNICORN_DEST = "gunicorn:"


def _add_gunicorn_flags(p):
    """gunicorn's flags that forkwsgi does not define itself, hidden from
    --help: one whose name is a setting here (directly or by ALIASES) sets
    it; any other is kept under its gunicorn name, for load() to judge as
    the same name in a config file (a warning, or a refusal)."""
    for name, flags in gunicorn_compat.GUNICORN_FLAGS.items():
        flags = [f for f in flags if f not in p._option_string_actions]
        if not flags:
            continue
        ours = BY_NAME.get(gunicorn_compat.ALIASES.get(name, name))
        if ours is not None:
            kw = _argument_kwargs(ours)
        elif name in gunicorn_compat.GUNICORN_SWITCHES:
            kw = dict(dest=GUNICORN_DEST + name, default=argparse.SUPPRESS, action="store_const",
                      const=gunicorn_compat.GUNICORN_SWITCHES[name])
        else:
            kw = dict(dest=GUNICORN_DEST + name, default=argparse.SUPPRESS,
                      action="append" if name in gunicorn_compat.GUNICORN_REPEATED else "store")
        p.add_argument(*flags, help=argparse.SUPPRESS, **kw)


def build_parser():
    # No abbreviations: uWSGI's --ini must not be taken for --initgroups,
    # nor a typo for some other flag.
    p = _Parser(
        prog="forkwsgi",
        description="Serve a WSGI app with forkwsgi's C HTTP/1.1 core.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
        epilog="Every setting can also come from FORKWSGI_<FLAG> (e.g. FORKWSGI_KEEP_ALIVE=75 for "
               "--keep-alive) or a config file (-c; else ./forkwsgi.conf.py or ./gunicorn.conf.py). "
               "gunicorn's flags are taken too: those with a counterpart set it, the others are "
               "named in a warning at start; TLS settings and worker classes other than sync and "
               "gthread stop the server at start.",
    )
    p.add_argument("app", metavar="MODULE:APP", nargs="?",
                   help="the WSGI app, e.g. myproject.wsgi:application or pkg.app:create_app()")
    p.add_argument("-v", "--version", action="version", version=f"forkwsgi {__version__}")
    groups = {}
    for s in SETTINGS:
        g = groups.get(s.section) or groups.setdefault(s.section, p.add_argument_group(s.section))
        g.add_argument(*s.flags, help=s.help, **_argument_kwargs(s))
    _add_gunicorn_flags(p)
    # argparse prints defaults only when they are set; show the registry's.
    for action in p._actions:
        if action.dest in BY_NAME and action.help != argparse.SUPPRESS:
            d = BY_NAME[action.dest].default
            shown = (", ".join(d) or "none") if isinstance(d, list) else \
                ",".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else d
            action.help = f"{action.help} (default: {shown})"
    p.formatter_class = argparse.HelpFormatter
    return p


ENV_PREFIX = "FORKWSGI_"


def env_names(s):
    """The environment variables of setting s: FORKWSGI_ and its long flag
    in capitals (--keep-alive: FORKWSGI_KEEP_ALIVE), then its name as a
    config file spells it (FORKWSGI_KEEPALIVE) where that differs."""
    flag = s.flags[-1].lstrip("-").replace("-", "_").upper()
    return list(dict.fromkeys((ENV_PREFIX + flag, ENV_PREFIX + s.name.upper())))


# FORKWSGI_* variables that are no setting but the project's own: the
# offload sibling's hand-over (offload/supervisor.py), an in-place reload (reexec.py), the build (setup.py), the
# tests (and FORKWSGI_TEST_*) and scripts/kafka_broker.py. No warning for these.
OWN_VARIABLES = {"FORKWSGI_SIBLING", "FORKWSGI_SANITIZE", "FORKWSGI_WERROR", "FORKWSGI_NO_KAFKA",
                 "FORKWSGI_KAFKA_HOME", "FORKWSGI_HYPOTHESIS_EXAMPLES", "FORKWSGI_CMD_ARGS", "FORKWSGI_REEXEC",
                 "FORKWSGI_PROMETHEUS_DIR"}


def unknown_env(environ=None):
    """One warning for each FORKWSGI_* variable that is no setting (a typo
    would otherwise do nothing, silently), naming the closest setting's."""
    environ = os.environ if environ is None else environ
    known = [n.removeprefix(ENV_PREFIX) for s in SETTINGS for n in env_names(s)]
    warnings = []
    for name in sorted(environ):
        rest = name.removeprefix(ENV_PREFIX)
        if rest == name or rest in known or name in OWN_VARIABLES or rest.startswith("TEST_"):
            continue
        close = difflib.get_close_matches(rest, known, 1)
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else " (see forkwsgi --help)"
        warnings.append(f"environment variable {name} is not a setting: ignored{hint}")
    return warnings


def edits(a, b):
    """How many one-letter edits (insert, delete, replace, or swap two
    neighbours) turn a into b (optimal string alignment distance)."""
    before, row = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cost = min(row[j] + 1, cur[j - 1] + 1, row[j - 1] + (ca != cb))
            if before is not None and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, before[j - 2] + 1)          # two letters swapped
            cur.append(cost)
        before, row = row, cur
    return row[-1]


def typo_of(name, known):
    """The name in `known` that `name` (from a config file) is a typo of,
    or None. Only a near miss counts: one edit away (two for names of six
    letters or more), so the helper names config files are full of
    (use_bind, workers_per_core, BASE_DIR) are not taken for typos.
    Settings and hooks are lowercase: a name with capitals is a constant."""
    if name.startswith("_") or name != name.lower():
        return None
    limit = 2 if len(name) >= 6 else 1
    best = min(known, key=lambda k: edits(name, k))
    return best if edits(name, best) <= limit else None


def parse_flags(parser, argv, where):
    """The flags given in argv, by dest (only those given)."""
    try:
        return vars(parser.parse_args(argv))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if where != "command line" else str(e)) from None


def parse_env_flags(parser, environ, var):
    """The flags in environment variable var (FORKWSGI_CMD_ARGS,
    GUNICORN_CMD_ARGS), split as a shell would, as gunicorn splits its."""
    if not environ.get(var, "").strip():
        return {}
    try:
        words = shlex.split(environ[var])
    except ValueError as e:
        raise ConfigError(f"{var}: {e}") from None
    return parse_flags(parser, words, var)

