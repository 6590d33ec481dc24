"""python -m forkwsgi.preflight ARGS: would a master started with ARGS load?

Run by a master before it re-executes itself for a reload (reexec.py): the
settings load (a config file that no longer parses fails here), the master
mode still applies, and the app imports in a fresh interpreter. Exit 0 if
so; otherwise 1 with the reason on stderr, and the master keeps its workers.
Unlike --check-config, what start-up only warns of (a typo of a setting
in the config file, a gunicorn setting with no counterpart) stays a
warning: it did not stop the server from starting either. What start-up
refuses (TLS settings, a worker class other than sync/gthread) fails here:
config.load raises it.
"""
import sys

from . import appload, config, process, slots


def main(argv):
    try:
        app_spec, cfg = config.load(argv)
    except config.ConfigError as e:
        print(f"settings: {e}", file=sys.stderr)
        return 1
    if cfg["workers"] < 1:
        print("--workers 0 (no master) takes a restart, not a reload", file=sys.stderr)
        return 1
    if not app_spec:
        print("no app given", file=sys.stderr)
        return 1
    try:
        process.prepare_import(cfg)
    except OSError as e:
        print(f"cannot change to {cfg['chdir']}: {e.strerror}", file=sys.stderr)
        return 1
    if cfg["lazy_apps"] and (cfg["user"] or cfg["group"]):
        # Only the workers import the app then, as --user: so does the
        # check (root never runs the app's code; a file only root may read
        # fails here as it would in them).
        try:
            process.Owner(cfg["user"], cfg["group"], cfg["initgroups"]).become()
        except OSError as e:
            print(f"--user/--group: cannot switch: {e.strerror}", file=sys.stderr)
            return 1
    try:
        appload.load(app_spec)
    except appload.AppImportError as e:
        print(e, file=sys.stderr)
        return 1
    except BaseException as e:  # noqa: BLE001 - the app's own error, reported
        print(f"error while importing the app {app_spec!r}: {appload.describe_error(e)}", file=sys.stderr)
        return 1
    # The running master compares it with its own (reexec.layout_of).
    print(f"{LAYOUT_SAYS}{slots.LAYOUT}")
    return 0


LAYOUT_SAYS = "shared memory layout: "


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
