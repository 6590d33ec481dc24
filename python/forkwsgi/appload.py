"""Import the WSGI app from 'MODULE:APP' or 'MODULE:factory(args)' (or
'PATH/FILE:APP': a file, uWSGI's wsgi-file)."""
import ast
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
import traceback


class AppImportError(Exception):
    pass


def load(spec):
    if not spec:
        raise AppImportError("no app given: forkwsgi MODULE:APP (see --help)")
    module, _, attr = spec.partition(":")
    attr = attr or "application"
    if not module:
        raise AppImportError(f"invalid app {spec!r}: use MODULE:APP")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")     # the current directory is importable
    call_args = None
    if attr.endswith(")") and "(" in attr:
        attr, _, rest = attr.partition("(")
        try:
            parsed = ast.parse(f"f({rest}", mode="eval").body
            call_args = [ast.literal_eval(a) for a in parsed.args]
            call_kwargs = {k.arg: ast.literal_eval(k.value) for k in parsed.keywords}
        except (SyntaxError, ValueError):
            raise AppImportError(f"invalid factory call in {spec!r}: only literal arguments are allowed") from None
    if "/" in module:                  # a module name has none: a file
        mod = import_file(module, spec)
    else:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and (module == e.name or module.startswith(e.name + ".")):
                raise AppImportError(f"no module named {module!r} (from app {spec!r})") from None
            raise
    obj = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppImportError(f"module {module!r} has no attribute {attr!r}") from None
    if call_args is not None:
        obj = obj(*call_args, **call_kwargs)
    if not callable(obj):
        raise AppImportError(f"{spec!r} is not callable (got {type(obj).__name__})")
    return obj


def import_file(path, spec):
    """A Python file as a module, whatever its suffix (.py, .wsgi), named as
    uWSGI names a wsgi-file's: uwsgi_file_ and its path."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise AppImportError(f"no file {full} (from app {spec!r})")
    name = "uwsgi_file_" + re.sub(r"\W", "_", full.lstrip("/"))
    loader = importlib.machinery.SourceFileLoader(name, full)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    sys.modules[name] = mod
    try:
        loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def describe_error(e):
    """One line for an exception the app's import raised, saying where: a
    SyntaxError's own file and line (its traceback ends in the importer,
    not in the file with the mistake) and the offending source line; for
    any other exception, the file and line of its last frame."""
    if isinstance(e, SyntaxError):
        text = (e.text or "").strip()
        return f"{type(e).__name__}: {e.msg} ({e.filename}, line {e.lineno})" + (f": {text}" if text else "")
    frames = traceback.extract_tb(e.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"
