"""Measurement for `make coverage`, in every Python process of a test run.

On PYTHONPATH (the Makefile copies it into build/cov), so the servers the
tests start, their forked workers and the offload sibling are measured too:
coverage.py starts from COVERAGE_PROCESS_START (tests/coverage/coverage.rc,
whose patches follow forks and save at os._exit), and os._exit writes the C
extension's gcov counters first (libgcov's exit handler does not run then).
"""
import os
import sys

if os.environ.get("COVERAGE_PROCESS_START"):
    import coverage

    coverage.process_startup()

_real_exit = os._exit


def _exit_with_counters(code):
    core = sys.modules.get("forkwsgi._forkwsgi")
    if core is not None:
        core._coverage_dump()
    _real_exit(code)


os._exit = _exit_with_counters
