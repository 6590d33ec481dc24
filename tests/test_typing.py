"""The type hints of the public API (python/forkwsgi/__init__.pyi, py.typed).

- a typed user script (tests/typing/typed_app.py) passes `mypy --strict`,
  and so do the hints themselves, for the running Python and for 3.10 (the
  oldest supported);
- wrong uses (tests/typing/misuse.py) are reported on exactly the lines
  marked `# error`: the hints are in force, not Any;
- `mypy.stubtest` finds the hints consistent with the objects forkwsgi
  exports at run time (names, parameters, defaults);
- the typed script runs: it serves on 127.0.0.1 and fetches a page.

The hints are read from the checkout (MYPYPATH=python); the runtime objects
are those of the installed package.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPING = os.path.join(ROOT, "tests", "typing")
STUB = os.path.join(ROOT, "python", "forkwsgi", "__init__.pyi")

pytest.importorskip("mypy", reason="mypy is in the test extra: pip install '.[test]'")


def run_module(module, args, timeout=120):
    env = dict(os.environ, MYPYPATH=os.path.join(ROOT, "python"))
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def mypy(args, tmp_path):
    return run_module("mypy", ["--cache-dir", str(tmp_path / "mypy-cache"), *args])


# The package's own modules are not annotated: only the files named on the
# command line (the user's script and the hints) are held to --strict.
STRICT = ["--strict", "--follow-imports=silent"]


@pytest.mark.parametrize("version", [None, "3.10"])
def test_typed_user_script_and_hints_pass_mypy_strict(tmp_path, version):
    args = STRICT + (["--python-version", version] if version else [])
    rc, out = mypy(args + [os.path.join(TYPING, "typed_app.py"), STUB], tmp_path)
    assert rc == 0, out
    assert "Success: no issues found in 2 source files" in out, out


def test_misuse_is_reported_on_each_marked_line(tmp_path):
    path = os.path.join(TYPING, "misuse.py")
    with open(path) as f:
        marked = {i for i, line in enumerate(f, 1) if line.rstrip().endswith("# error")}
    assert len(marked) >= 8
    rc, out = mypy(STRICT + [path], tmp_path)
    assert rc == 1, out
    reported = {int(n) for n in re.findall(r"^tests/typing/misuse\.py:(\d+): error:", out, re.M)}
    assert reported == marked, out


# stubtest walks every submodule too; only the hints of __init__.pyi are
# ours to check: the rest are unannotated modules (whose attributes can
# look wrong to it: a module kept on an instance) and __main__, which runs
# the CLI on import. Allowlist entries are regular expressions.
NOT_THE_API = [
    r"forkwsgi\.(?!(Server|run|offload|offload_stats|config|__version__)$|Server\.)[^.]+(\..+)?",
    r"forkwsgi\.(offload|config)\..+",     # the offload subpackage (not the function), config's insides
]


def test_hints_match_the_runtime_objects(tmp_path):
    config = tmp_path / "stubtest.ini"
    config.write_text(f"[mypy]\ncache_dir = {tmp_path / 'mypy-cache'}\n"
                      "[mypy-forkwsgi.*]\nignore_errors = True\nignore_missing_imports = True\n")
    allow = tmp_path / "allowlist.txt"
    allow.write_text("\n".join(NOT_THE_API) + "\n")
    rc, out = run_module("mypy.stubtest", ["--mypy-config-file", str(config), "--allowlist", str(allow),
                                           "--ignore-unused-allowlist", "forkwsgi"])
    assert rc == 0, out


def test_typed_script_serves(tmp_path):
    proc = subprocess.Popen([sys.executable, os.path.join(TYPING, "typed_app.py")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text
    assert re.search(r"^ok \d+ 1$", text, re.M), text
