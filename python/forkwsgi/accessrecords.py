"""Access lines as log records, for a logging configuration that sets up
the access logger (gunicorn.access, or forkwsgi.access: logs.access_logger).

Its handlers and formatters (JSON ones) get each response as gunicorn gives
it: a record of level INFO whose msg is the access log format
(--access-logformat, gunicorn's by default) and whose args are gunicorn's
atoms, {"h": ..., "s": "200", "B": 1234, "{user-agent}i": ..., ...}
(Atoms), so record.getMessage() is the line gunicorn would log.

The C writer (cserver/fw_alog.c) still takes each response's values off
the request path, without the GIL: here it writes them as a JSON array per
response into a pipe that a thread of this module reads, which makes the
records and hands them to the logger, with the GIL. The loop never waits
for that thread: when it falls behind, the pipe fills, the C writer waits
on it, and lines that find the C writer's buffer full are dropped and
counted, as with a slow disk. This path costs a Python call per response;
the C writer's alone (--access-logfile) costs none.
"""
import datetime
import json
import logging
import os
import re
import threading

from . import accesslog

# gunicorn's atoms, in the order they are asked of the C writer; 'l' is
# always '-'. Numbers are numbers, as gunicorn's are.
LETTERS = ("h", "u", "t", "r", "s", "m", "U", "q", "H", "b", "B", "f", "a", "T", "D", "M", "L", "p")
NUMBERS = ("B", "T", "D", "M")
_NAMED = re.compile(r"%\((\{[^{}()]+\}[ioe])\)s")


class Atoms(dict):
    """gunicorn's atoms as its access log record carries them: a '"' in a
    text value is written \\", a {header}i / {header}o / {VAR}e key is
    found in any case, and an atom there is no value for is '-'."""

    def __init__(self, atoms):
        super().__init__((k, v.replace('"', '\\"') if isinstance(v, str) else v) for k, v in atoms.items())

    def __getitem__(self, k):
        if k.startswith("{"):
            k = k.lower()
        return super().__getitem__(k) if k in self else "-"


def plan(fmt, environ):
    """What to ask of the C writer for a format: [atom names] it fills in
    (gunicorn's letters, and the {..}i/o/e atoms the format names that
    vary per request), and {atom: value} of the {VAR}e atoms that do not
    (taken once from the process environment, as the C writer does)."""
    names, fixed = list(LETTERS), {"l": "-"}
    for name in dict.fromkeys(_NAMED.findall(fmt)):
        atom, arg = accesslog.atom_of(name, environ)
        if atom == "text":
            fixed[name.lower()] = arg
        else:
            names.append(name)
    return names, fixed


def gunicorn_time(iso):
    """The C writer's time in JSON (ISO 8601) as gunicorn's %(t)s."""
    try:
        return datetime.datetime.fromisoformat(iso).strftime("[%d/%b/%Y:%H:%M:%S %z]")
    except ValueError:
        return iso


class AccessRecords:
    """One worker's access records: the pipe the C writer writes to, and
    the thread that reads it."""

    def __init__(self, logger_name, settings, environ=None):
        self.logger = logging.getLogger(logger_name)
        self.fmt = settings["access_logformat"] or accesslog.DEFAULT_FORMAT
        self.names, self.fixed = plan(self.fmt, os.environ if environ is None else environ)
        read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        self.thread = threading.Thread(target=self._run, args=(read_fd,), name="forkwsgi access records",
                                       daemon=True)
        self.thread.start()

    def spec(self):
        """What _forkwsgi.Server(access_log=...) takes: a JSON array of the
        atoms' values per line, into the pipe (never reopened), read by a
        thread that needs the GIL for each line (the loop lets it go before
        each response's write)."""
        fmt = "[" + ",".join(f'"%({name})s"' for name in self.names) + "]"
        return self.write_fd, None, accesslog.compile_format(fmt), True, True

    def close_write_end(self):
        """Ours: the C writer keeps a copy of its own, and the thread ends
        once that one is closed too (its last lines read)."""
        if self.write_fd is not None:
            os.close(self.write_fd)
            self.write_fd = None

    def join(self, timeout):
        self.close_write_end()
        self.thread.join(timeout)

    def _run(self, read_fd):
        with open(read_fd, "rb") as pipe:
            for line in pipe:
                try:
                    self.logger.info(self.fmt, self.atoms(json.loads(line)))
                except Exception:  # noqa: BLE001 - a handler's or a formatter's: the next line still goes
                    logging.getLogger("forkwsgi").exception("access log record to %r", self.logger.name)

    def atoms(self, values):
        atoms = dict(self.fixed)
        for name, value in zip(self.names, values):
            atoms[name.lower() if name.startswith("{") else name] = value
        for n in NUMBERS:
            atoms[n] = int(atoms[n]) if atoms[n].isdigit() else atoms[n]
        atoms["t"] = gunicorn_time(atoms["t"])
        return Atoms(atoms)
