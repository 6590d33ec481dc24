"""uWSGI's ini files, read as uWSGI reads them: one section of the file
(`[uwsgi]`, or the one `FILE:SECTION` names) with uWSGI's value syntax:
magic variables (%d the file's directory, %n its name, ...) over the whole
text, then `$(VAR)` from the environment, then `%(option)` references to
other options of the file. What the options mean here is uwsgi_compat.py's.

A leaf module: it imports nothing of forkwsgi.
"""
import os
import re
import socket
import time

DEFAULT_SECTION = "uwsgi"
MAX_EXPANSIONS = 100          # placeholders expanded in one value at most (a = %(a) would loop)


class IniError(Exception):
    """What makes the file unusable: one line, the server does not start."""


def split_spec(spec):
    """'FILE' or 'FILE:SECTION' -> (FILE, SECTION): uWSGI splits at the last
    colon; an empty section is the default one."""
    path, sep, section = str(spec).rpartition(":")
    if not sep:
        return str(spec), DEFAULT_SECTION
    if not path:
        raise IniError(f"--ini {spec}: no file before ':{section}'")
    return path, section or DEFAULT_SECTION



def magic_table(path, spec, section):
    """uWSGI's magic variables (%d, %n, ...) for the ini file `path`."""
    full = os.path.abspath(path) if os.path.islink(path) else os.path.realpath(path)
    directory = os.path.dirname(full)
    base = os.path.basename(full)
    name, dot, ext = base.rpartition(".")
    if not dot:
        name, ext = base, ""
    table = {
        "o": spec, "p": full, "s": base, "n": name, "e": ext,
        "d": directory.rstrip("/") + "/",                   # uWSGI's %d ends with '/'
        "c": os.path.basename(directory), "x": "" if section == DEFAULT_SECTION else section,
        "v": os.getcwd(), "h": socket.gethostname(), "k": str(os.cpu_count() or 1),
        "u": str(os.getuid()), "g": str(os.getgid()),
        "t": str(int(time.time())), "T": str(int(time.time() * 1e6)),
        "%": "%", "(": "%(",                                  # %(option) is expanded later
    }
    try:
        import grp
        import pwd
        table["U"] = pwd.getpwuid(os.getuid()).pw_name
        table["G"] = grp.getgrgid(os.getgid()).gr_name
    except (KeyError, ImportError):
        table["U"], table["G"] = table["u"], table["g"]
    for i, part in enumerate([p for p in directory.split("/") if p][:10]):
        table[str(i)] = part                                 # %0..%9: the directory's parts
    for k in "ODSPCENX":                                      # the first file's: this one
        table[k] = table[k.lower()]
    return table


def expand_magic(text, table):
    """Every %X in the text: uWSGI replaces each one, an unknown X by nothing."""
    return re.sub(r"%(.)", lambda m: table.get(m.group(1), ""), text, flags=re.DOTALL)


def parse_lines(text, section):
    """(key, value) of the section, in file order, as uWSGI's ini reader
    takes them: blank lines and lines starting with ; or # are skipped, a
    key without '=' has the value ''. None if the section is missing; also
    the sections seen."""
    current, found, sections, options = "", False, [], []
    for line in text.split("\n"):
        line = line.strip(" \t\r")
        if not line or line[0] in ";#":
            continue
        if line[0] == "[":
            current = line[1:-1]
            sections.append(current)
            continue
        if current == section:
            found = True
            key, _, value = line.partition("=")
            options.append((key.rstrip(" \t\r"), value.strip(" \t\r")))
    return (options if found or section in sections else None), sections


def _placeholders(value, symbol, lookup):
    """uWSGI's $(...) and %(...) in one value: each one whose lookup gives a
    value is replaced, and the scan starts over (a replacement may hold
    more); one with none stays as written."""
    opener = symbol + "("
    start = 0
    for _ in range(MAX_EXPANSIONS):
        at = value.find(opener, start)
        if at < 0:
            return value
        depth, end = 0, None
        for i in range(at + 2, len(value)):
            if value[i] == "(":
                depth += 1
            elif value[i] == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
        if end is None:
            return value
        found = lookup(value[at + 2:end])
        if found is None:
            start = end + 1
            continue
        value, start = value[:at] + found + value[end + 1:], 0
    raise IniError(f"placeholders in {value[:60]!r} expand more than {MAX_EXPANSIONS} times (one refers to itself?)")


def env_lookup(environ):
    """$(VAR), $(VAR:-DEFAULT) (unset or empty), $(VAR-DEFAULT) (unset)."""
    def lookup(key):
        if ":-" in key:
            name, _, default = key.partition(":-")
            return environ.get(name) or default
        if "-" in key:
            name, _, default = key.partition("-")
            return environ.get(name, default)
        return environ.get(key)
    return lookup


class Ini:
    """One section of a uWSGI ini file, its values expanded."""

    def __init__(self, spec, environ=None):
        environ = os.environ if environ is None else environ
        self.spec = str(spec)
        self.path, self.section = split_spec(spec)
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as e:
            raise IniError(f"cannot read ini file {self.path}: {e.strerror}") from None
        text = expand_magic(text, magic_table(self.path, self.spec, self.section))
        options, sections = parse_lines(text, self.section)
        if options is None:
            have = ", ".join(f"[{s}]" for s in dict.fromkeys(sections)) or "none"
            raise IniError(f"ini file {self.path} has no [{self.section}] section (its sections: {have})")
        # set-placeholder / set-ph: a name for %(...) only, not an option.
        self.declared = {}
        for key, value in options:
            if key in ("set-placeholder", "set-ph"):
                name, sep, v = value.partition("=")
                if not sep:
                    raise IniError(f"{self.where()}: {key} = {value!r}: use NAME=VALUE")
                self.declared.setdefault(name, v)
        getenv = env_lookup(environ)
        options = [(k, _placeholders(v, "$", getenv)) for k, v in options]
        first = dict(reversed(options))              # %(name): the first value given
        first = {**self.declared, **first}
        self.referenced = set()

        def option(name):
            if name in first and " " not in name:
                self.referenced.add(name)
                return first[name]
            return None
        self.options = [(k, _placeholders(v, "%", option)) for k, v in options]

    def where(self):
        return f"ini file {self.spec}"
