"""The access log's format: gunicorn's atoms compiled for the C writer.

forkwsgi writes the access log in C (cserver/fw_alog.c), from what the
connection holds, without calling Python per request. This module turns a
format in gunicorn's syntax ("%(h)s %(t)s "%(r)s" ...", the atoms of
--access-logformat) into the list of items the writer takes, once, and
opens the file. An atom gunicorn does not know either is written as "-",
as gunicorn writes it (unknown_atoms() names them, for a warning at start).
"""
import os
import re

from . import _forkwsgi

ATOMS = _forkwsgi.ACCESS_LOG_ATOMS

# gunicorn's default, Apache's combined log format.
DEFAULT_FORMAT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'
# --access-log-json with no format: the same fields, named; numbers unquoted.
DEFAULT_JSON_FORMAT = (
    '{"remote_addr": "%(h)s", "user": "%(u)s", "time": "%(t)s", "request": "%(r)s", '
    '"method": "%(m)s", "path": "%(U)s", "query": "%(q)s", "protocol": "%(H)s", "status": %(s)s, '
    '"bytes": %(B)s, "referer": "%(f)s", "user_agent": "%(a)s", "duration_us": %(D)s, "pid": "%(p)s"}')

# One-letter atoms: (atom, argument). b is B: gunicorn writes
# str(resp.sent) or '-', and its sent is a number, so '-' never shows (a
# body of none is "0"), unlike Apache's %b.
LETTERS = {
    "h": ("remote_addr", ""), "l": ("text", "-"), "u": ("user", ""), "t": ("time", ""),
    "r": ("request", ""), "m": ("method", ""), "U": ("path", ""), "q": ("query", ""),
    "H": ("protocol", ""), "s": ("status", ""), "B": ("bytes", ""), "b": ("bytes", ""),
    "f": ("request_header", "referer"), "a": ("request_header", "user-agent"),
    "T": ("seconds", ""), "M": ("millis", ""), "D": ("micros", ""), "L": ("decimal", ""),
    "p": ("pid", ""),
}

# {VAR}e: the environ variables the C core knows per request. Other names
# are constant in a worker's life: taken from the process environment once.
ENVIRON = {
    "REMOTE_ADDR": ("remote_addr", ""), "REMOTE_PORT": ("remote_port", ""),
    "REQUEST_METHOD": ("method", ""), "PATH_INFO": ("path", ""), "QUERY_STRING": ("query", ""),
    "SERVER_PROTOCOL": ("protocol", ""), "RAW_URI": ("uri", ""), "REQUEST_URI": ("uri", ""),
    "CONTENT_TYPE": ("request_header", "content-type"),
    "CONTENT_LENGTH": ("request_header", "content-length"),
}

_TOKEN = re.compile(r"%%|%\(([^)]*)\)s")
_HEADER_OR_VARIABLE = re.compile(r"\{([^{}]+)\}([ioe])")


def atom_of(name, environ):
    """(atom, argument) for an atom's name inside %(...)s."""
    if name in LETTERS:
        return LETTERS[name]
    m = _HEADER_OR_VARIABLE.fullmatch(name)
    if not m:
        return "text", "-"                  # unknown: gunicorn's SafeAtoms gives '-'
    arg, kind = m.groups()
    if kind == "i":
        return "request_header", arg.lower()
    if kind == "o":
        return "response_header", arg.lower()
    if arg in ENVIRON:
        return ENVIRON[arg]
    if arg.startswith("HTTP_"):
        return "request_header", arg[5:].replace("_", "-").lower()
    return "text", environ.get(arg, "-")


def compile_format(fmt, environ=None):
    """[(atom code, bytes argument)] for the C writer."""
    environ = os.environ if environ is None else environ
    items = []
    pos = 0

    def text(s):
        if s:
            if items and items[-1][0] == "text":
                items[-1] = ("text", items[-1][1] + s)
            else:
                items.append(("text", s))

    for m in _TOKEN.finditer(fmt):
        text(fmt[pos:m.start()])
        pos = m.end()
        if m.group(0) == "%%":
            text("%")
            continue
        atom, arg = atom_of(m.group(1), environ)
        if atom == "text":
            text(arg)
        else:
            items.append((atom, arg))
    text(fmt[pos:])
    return [(ATOMS[atom], arg.encode("latin-1", "replace")) for atom, arg in items]


def unknown_atoms(fmt):
    """The atoms of fmt that are none of gunicorn's, as written:
    ["%(zz)s", ...] (each is written as "-")."""
    return [m.group(0) for m in _TOKEN.finditer(fmt or "")
            if m.group(0) != "%%" and m.group(1) not in LETTERS and not _HEADER_OR_VARIABLE.fullmatch(m.group(1))]


def open_file(path):
    """A descriptor for the access log: '-' is standard output (a copy of
    it); a file is opened for appending, created 0644 if missing."""
    if path == "-":
        return os.dup(1)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)


def spec(cfg, fd):
    """What _forkwsgi.Server(access_log=...) takes, from the settings and an
    open descriptor (the log keeps its own copy)."""
    fmt = cfg["access_logformat"] or (DEFAULT_JSON_FORMAT if cfg["access_log_json"] else DEFAULT_FORMAT)
    path = None if cfg["access_logfile"] == "-" else os.path.abspath(cfg["access_logfile"])
    return fd, path, compile_format(fmt), bool(cfg["access_log_json"]), False
