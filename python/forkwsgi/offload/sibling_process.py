"""The offload sibling's process: its entry points (run_sibling in a
child the master forked; main, `python -m forkwsgi.offload.sibling_process`,
in one a server without a master started), its signals, identity and
priority, around the Sibling's loop (sibling.py).
"""
import gc
import json
import logging
import mmap
import os
import signal
import time

from .. import _forkwsgi, logs, process
from .counters import counters_size, sibling_counters
from .priority import Priority, keep_leaving_idle
from .sibling import Sibling

log = logging.getLogger("forkwsgi")


def main():
    """Entry point of a sibling started as a program by a server without a
    master (supervisor.SpawnStarter); its settings and descriptors are in
    $FORKWSGI_SIBLING."""
    spec = json.loads(os.environ.pop("FORKWSGI_SIBLING"))
    cfg = spec["cfg"]
    process.setup_logging(cfg.get("log_level", "INFO"))
    counters = mmap.mmap(spec["counters_fd"], counters_size(1))
    run_sibling(cfg, spec["parent"], counters=sibling_counters(counters, 1))


def run_sibling(cfg, parent_pid, counters=None, owner=None):
    """Entry point in the sibling process; never returns. owner: --user
    (process.Owner), which it becomes before it reads anything the workers
    wrote or imports a python: sink."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        process.leave_to_the_master((signal.SIGTTIN, signal.SIGTTOU))
        signal.signal(signal.SIGUSR1, lambda signum, frame: logs.reopen())     # logrotate, via the master
        if owner and owner.needed():
            keep_leaving_idle(cfg["offload_nice"])
            owner.become()
        process.die_with_parent(parent_pid)         # after become(): a new identity clears it
        process.set_title("forkwsgi: offload")
        # Thousands of records a second are made and dropped: collect
        # cycles rarely, and never look at what the server made before.
        gc.freeze()
        gc.set_threshold(100_000, 50, 100)
        # Before the sink starts threads of its own (librdkafka's): they
        # inherit the policy and the nice level.
        priority = Priority(cfg["offload_nice"])
        sib = Sibling(cfg, counters, priority=priority)

        def drain(signum, frame):
            sib.request_stop(time.monotonic() + cfg["graceful_timeout"])

        def fast(signum, frame):
            sib.request_stop(time.monotonic())

        def hand_over(signum, frame):
            sib.request_stop(time.monotonic() + cfg["graceful_timeout"], read=False)

        signal.signal(signal.SIGHUP, hand_over)
        signal.signal(signal.SIGTERM, drain)
        signal.signal(signal.SIGINT, fast)
        signal.signal(signal.SIGQUIT, fast)
        # Whoever started us held these until now (a stop asked for
        # during start-up waits for the handlers instead of killing us).
        process.release_stop_signals()
        sib.take_over()
        priority.watch(_forkwsgi.ring_reader_stats()["capacity"])
        sib.run()
    except BaseException:
        log.exception("the offload sibling failed")
        code = 1
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
