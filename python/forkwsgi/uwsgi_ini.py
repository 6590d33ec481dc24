"""uWSGI's ini files, read as uWSGI 2.0 reads them: one section of the file
(`[uwsgi]`, or the one `FILE:SECTION` names) with uWSGI's value syntax:
magic variables (%d the file's directory, %n its name, ...) over the whole
text; then, option by option in file order, config logic (if-env ...
endif: the options of a block whose condition fails are dropped) and
includes (`ini = FILE[:SECTION]`, `include = FILE.ini`: the file's options
at that point, its own magic variables); then over every value `$(VAR)`
from the environment, `@(FILE)` a file's content (`@(exec://CMD)` a
command's output), `%(option)` references to other options. What the
options mean here is uwsgi_compat.py's.

A leaf module: it imports nothing of forkwsgi.
"""
import os
import re
import socket
import time

DEFAULT_SECTION = "uwsgi"
MAX_EXPANSIONS = 100          # placeholders expanded in one value at most (a = %(a) would loop)
MAX_INCLUDE_DEPTH = 10        # ini files included in one another at most (uWSGI loops until it crashes)


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



def magic_table(path, spec, section, first=None):
    """uWSGI's magic variables (%d, %n, ...) for the ini file `path`; the
    capital ones (%D, %N, ...) are those of the first file read (`first`,
    its table; None: this one)."""
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
    for k in "ODSPCENX":                                      # the first file's
        table[k] = (first or table)[k.lower()]
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


def _strip_newline(text):
    """uWSGI's @(...) drops one trailing newline (or carriage return) of
    what it reads, no more."""
    return text[:-1] if text[-1:] in ("\n", "\r") else text


def at_lookup(where):
    """@(FILE): the file's content (relative to the current directory, as
    uWSGI opens it); @(exec://CMD): what the command (sh -c) writes to its
    standard output. uWSGI's other schemes are refused."""
    def lookup(key):
        m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", key, flags=re.DOTALL)
        if m and m.group(1) == "exec":
            import subprocess
            try:
                p = subprocess.run(["/bin/sh", "-c", m.group(2)], stdout=subprocess.PIPE, check=False)
            except OSError as e:
                raise IniError(f"{where}: @({key}): cannot run it: {e.strerror}") from None
            if p.returncode:
                # uWSGI takes what it wrote; a command that fails is refused here.
                raise IniError(f"{where}: @({key}): the command exits with status {p.returncode}")
            return _strip_newline(p.stdout.decode("utf-8", "surrogateescape"))
        if m:
            raise IniError(f"{where}: @({key}): uWSGI's {m.group(1)}:// is not read here: put the value in a "
                           "file (@(PATH)), a command's output (@(exec://CMD)) or the environment ($(VAR))")
        try:
            with open(key, encoding="utf-8", errors="surrogateescape") as f:
                return _strip_newline(f.read())
        except OSError as e:
            raise IniError(f"{where}: @({key}): cannot read {key}: {e.strerror}") from None
    return lookup


# Config logic (uWSGI 2.0's "opt logic"): the test of each `if-*` form on
# its argument, as (holds, the value of %(_) in the block or None where
# uWSGI leaves %(_) as written).
def _env_test(arg, environ, _options):
    name, eq, want = arg.partition("=")
    have = environ.get(name)
    return have is not None and (not eq or have == want), have


def _opt_test(arg, _environ, options):
    name, eq, want = arg.partition("=")
    have = next((v for k, v in options if k == name), None)      # the first value given so far
    return have is not None and (not eq or have == want), have


def _negated(test):
    def negated(arg, environ, options):
        holds, _ = test(arg, environ, options)
        return not holds, None                                    # %(_) stays as written
    return negated


def _path_test(check):
    def test(arg, _environ, _options):
        return check(arg), arg
    return test


def _path_not_test(check):
    def test(arg, _environ, _options):
        return not check(arg), arg
    return test


LOGIC = {
    "if-env": _env_test, "if-not-env": _negated(_env_test),
    "if-opt": _opt_test, "if-not-opt": _negated(_opt_test),
    "if-exists": _path_test(os.path.exists), "if-not-exists": _path_not_test(os.path.exists),
    "if-file": _path_test(os.path.isfile), "if-not-file": _path_not_test(os.path.isfile),
    "if-dir": _path_test(os.path.isdir), "if-not-dir": _path_not_test(os.path.isdir),
}
LOGIC_END = ("endif", "end-if", "end", "endfor", "end-for")


def is_logic(key):
    """A config logic form of uWSGI's (if-*, for*), or `else`."""
    return key.startswith("if-") or key == "for" or key.startswith("for-") or key == "else"


class Ini:
    """One section of a uWSGI ini file (and of those it includes), its
    config logic evaluated and its values expanded."""

    def __init__(self, spec, environ=None):
        environ = os.environ if environ is None else environ
        self.environ = environ
        self.spec = str(spec)
        self.path, self.section = split_spec(spec)
        self.files = []                   # every file read, the included ones too
        self._first = None                # the magic table of the first file
        self._block = None                # the open if-*: (key, arg, holds, %(_) or None)
        options = []
        self._read(self.spec, options, 0)
        # set-placeholder / set-ph: a name for %(...) only, not an option.
        self.declared = {}
        for key, value in options:
            if key in ("set-placeholder", "set-ph"):
                name, sep, v = value.partition("=")
                if not sep:
                    raise IniError(f"{self.where()}: {key} = {value!r}: use NAME=VALUE")
                self.declared.setdefault(name, v)
        # uWSGI's passes over every value, in its order: $(), @(), %().
        getenv = env_lookup(environ)
        options = [(k, _placeholders(v, "$", getenv)) for k, v in options]
        read = at_lookup(self.where())
        options = [(k, _placeholders(v, "@", read)) for k, v in options]
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

    def _read(self, spec, options, depth):
        """The options of one file's section, in order, into `options`."""
        path, section = split_spec(spec)
        where = self.where() if depth == 0 else f"ini file {spec} (included by {self.spec})"
        if depth > MAX_INCLUDE_DEPTH:
            raise IniError(f"{self.where()}: ini files included more than {MAX_INCLUDE_DEPTH} deep "
                           f"({spec} again: does a file include itself?)")
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as e:
            if depth == 0:
                raise IniError(f"cannot read ini file {path}: {e.strerror}") from None
            raise IniError(f"{self.where()}: cannot read the included ini file {path} (a relative path is "
                           f"taken from the current directory, {os.getcwd()}, as uWSGI does): {e.strerror}") from None
        self.files.append(path)
        table = magic_table(path, spec, section, self._first)
        self._first = self._first or table
        found, sections = parse_lines(expand_magic(text, table), section)
        if found is None:
            have = ", ".join(f"[{s}]" for s in dict.fromkeys(sections)) or "none"
            raise IniError(f"ini file {path} has no [{section}] section (its sections: {have})")
        outer, self._block = self._block, None      # a block around an include stays outside it
        for key, value in found:
            self._add(key, value, options, depth, where)
        if self._block is not None:
            key, arg = self._block[:2]
            raise IniError(f"{where}: {key} = {arg} has no endif (uWSGI would drop every option after it, "
                           "those of the command line too)")
        self._block = outer

    def _add(self, key, value, options, depth, where):
        """One option as uWSGI adds it: config logic, an include, or kept."""
        if key == "else":
            raise IniError(f"{where}: else: uWSGI 2.0 has no else (it would apply the options after it with "
                           "those before it): use the if-not-* form of the condition")
        if self._block is not None:
            if key in LOGIC_END:
                self._block = None
                return
            if is_logic(key):
                raise IniError(f"{where}: {key} = {value} inside {self._block[0]} = {self._block[1]}: uWSGI "
                               "nests no config logic (an inner endif ends the outer block): write the "
                               "conditions out one after the other")
            holds, underscore = self._block[2:]
            if not holds:
                return
            if underscore is not None:
                value = value.replace("%(_)", underscore)
        elif key in LOGIC_END:
            return                                     # uWSGI: an endif outside a block does nothing
        elif key in LOGIC:
            holds, underscore = LOGIC[key](value, self.environ, options)
            self._block = (key, value, holds, underscore)
            return
        elif is_logic(key):
            raise IniError(f"{where}: {key} = {value}: this config logic is not evaluated here (if-env, "
                           "if-not-env, if-opt, if-not-opt, if-exists, if-not-exists, if-file, if-not-file, "
                           "if-dir, if-not-dir are): write the options out")
        if self._is_include(key, value):
            self._read(value, options, depth + 1)
            return
        options.append((key, value))

    @staticmethod
    def _is_include(key, value):
        """ini = FILE[:SECTION], include = FILE.ini[:SECTION]: an ini file
        on disk (others stay options, and uwsgi_compat refuses them)."""
        if "://" in value or not value.strip():
            return False
        if key == "ini":
            return True
        return key == "include" and split_spec(value)[0].endswith(".ini")
