"""What the benchmark scripts share, so each script holds only its own
workload and report (`from common import ...`; one module per job: base,
cpu, servers, uwsgi, wrk, results):

- places and pins: BENCH, ROOT, OUT, RESULTS, HOST, SERVER_CPU, CLIENT_CPU;
  pinned() (taskset for a command), pin_self() (this process) and
  pinned_self() (this process inside a with block: what it starts inherits);
- servers: ServerTree (a process tree started pinned in its own session,
  ready checks, wait_workers() (every worker booted), CPU of the tree,
  stop by PID then by group), stop_all(),
  wait_http() and wait_listening() (readiness of a port), free_port();
- wrk: run_wrk() (pinned, bounded, its CPU from rusage), start_wrk() (the
  same in the background: a WrkLoad, .result() waits) and wrk_stats() (the
  BENCH-STATS line of stats.lua);
- CPU accounting: cpu_times(), steal_seconds(), self_cpu_seconds(),
  children_cpu_seconds(), pid_cpu_seconds(), proc_table(), CpuMeter (CPU of
  named parts and of everyone else over a span); wait_until_quiet();
- the peers' virtualenv and system packages: ensure_peers() (pinned
  versions, PINS, into bench/.venv, PEER_PY), ensure_system_packages(),
  peers_ready() (both, for the servers a script runs);
- peers: peer_command() (a peer server's argv in a layout of LAYOUTS),
  uwsgi_command(); uWSGI's virtualenv: ensure_uwsgi(), UWSGI_BIN;
- nginx in front: nginx_conf(), start_nginx();
- reports: write_section() (a section of bench/RESULTS.md, the replaced one
  moved to bench/HISTORY.md), median_ci() (a distribution-free interval for
  a median over rounds), git_head(), invocation(), log(), run_quiet(),
  apt_install(), first_error_line(); rotated() (the order of a round's runs);
  wait_until() (a bounded wait for an observable event).
"""
from .base import (BENCH, CLIENT_CPU, HOST, OUT, RESULTS, ROOT, SERVER_CPU, apt_install, first_error_line,
                   git_head, invocation, log, rotated, run_quiet, wait_until)
from .cpu import (CpuMeter, CpuSpan, children_cpu_seconds, cpu_times, pid_cpu_seconds, proc_table,
                  self_cpu_seconds, steal_seconds, wait_until_quiet)
from .peers import FRAMEWORKS, PEER_PY, PEER_VENV, PINS, ensure_peers, ensure_system_packages, peers_ready
from .results import median_ci, write_section
from .servers import (LAYOUTS, LIVE, ServerTree, free_port, nginx_conf, peer_command, pin_self,
                      pinned, pinned_self, start_nginx, stop_all, uwsgi_command, wait_http, wait_listening)
from .uwsgi import UWSGI_BIN, UWSGI_VENV, UWSGI_VERSION, ensure_uwsgi
from .wrk import WrkLoad, WrkRun, run_wrk, start_wrk, wrk_stats

__all__ = [
    "BENCH", "CLIENT_CPU", "HOST", "OUT", "RESULTS", "ROOT", "SERVER_CPU", "apt_install",
    "first_error_line", "git_head", "invocation", "log", "rotated", "run_quiet", "wait_until", "CpuMeter",
    "CpuSpan", "children_cpu_seconds", "cpu_times", "pid_cpu_seconds", "proc_table",
    "self_cpu_seconds", "steal_seconds", "wait_until_quiet", "median_ci", "write_section", "FRAMEWORKS", "PEER_PY",
    "PEER_VENV", "PINS", "ensure_peers", "ensure_system_packages", "peers_ready", "LIVE", "ServerTree",
    "free_port", "nginx_conf", "peer_command", "pin_self", "pinned", "pinned_self", "start_nginx", "stop_all",
    "wait_http", "wait_listening", "WrkLoad", "WrkRun", "run_wrk", "start_wrk", "wrk_stats", "LAYOUTS", "uwsgi_command",
    "UWSGI_BIN", "UWSGI_VENV", "UWSGI_VERSION", "ensure_uwsgi",
]
