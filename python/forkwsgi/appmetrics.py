"""The app's own Prometheus metrics, counted across every worker with no
set-up (with --metrics, when prometheus_client is installed).

prometheus_client's multiprocess mode keeps each process's values in files
of PROMETHEUS_MULTIPROC_DIR, one per process and kind, read together at a
scrape. The master makes a private directory and sets the variable before
the app is imported, so an app that just increments a Counter is counted
over all workers; /metrics (metrics.py) appends the merged values. When a
worker ends, its live gauges are removed (prometheus_client's
mark_process_dead) and its counters, histograms and summaries are added into
one archive file per kind, then its files removed: they never pile up with
worker recycles, and the totals never go back. Gauges of the other modes
describe processes that no longer exist: removed too.

Uses prometheus_client's file format (mmap_dict), as its own tools do; a
directory the operator set (PROMETHEUS_MULTIPROC_DIR given) is left as is.
"""
import glob
import importlib.util
import logging
import os
import shutil
import tempfile

log = logging.getLogger("forkwsgi")

ENV = "PROMETHEUS_MULTIPROC_DIR"
OURS = "FORKWSGI_PROMETHEUS_DIR"            # marks the directory as the server's (survives a re-exec)
FOLDED = ("counter", "histogram", "summary")


class AppMetrics:
    def __init__(self, directory, own):
        self.dir = directory
        self.own = own

    @classmethod
    def setup(cls, owner=None):
        """For the master, before the app is imported. None without
        prometheus_client. owner: --user/--group (process.Owner), whose
        workers write their files into our directory too."""
        # Not imported here: prometheus_client picks its value class (in
        # files or in memory) when first imported, from the variable below.
        if importlib.util.find_spec("prometheus_client") is None:
            return None
        mine = os.environ.get(OURS)
        if mine and os.environ.get(ENV) == mine and os.path.isdir(mine):
            return cls(mine, True)                       # a re-executed master: the same directory
        if os.environ.get(ENV):
            return cls(os.environ[ENV], False)          # the operator's
        d = tempfile.mkdtemp(prefix="forkwsgi-prometheus-")
        if owner:
            owner.share_dir(d)
        os.environ[ENV] = os.environ[OURS] = d
        return cls(d, True)

    def exposition(self):
        """The app's metrics, merged over the processes, as text."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.dir)
        return generate_latest(registry).decode()

    def worker_exited(self, pid):
        """Fold a dead worker's files into the archive, then remove them."""
        from prometheus_client.multiprocess import mark_process_dead
        try:
            mark_process_dead(pid, self.dir)
            for kind in FOLDED:
                dead = os.path.join(self.dir, f"{kind}_{pid}.db")
                if os.path.exists(dead):
                    self._fold(kind, dead)
                    os.unlink(dead)
            for f in glob.glob(os.path.join(self.dir, f"gauge_*_{pid}.db")):
                os.unlink(f)
        except (OSError, ValueError) as e:
            log.warning("app metrics: cannot fold the files of worker %d: %s", pid, e)

    def _fold(self, kind, dead):
        from prometheus_client.mmap_dict import MmapedDict
        archive = os.path.join(self.dir, f"{kind}_archive.db")
        sums = {}
        for path in (archive, dead):
            if os.path.exists(path):
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(path):
                    sums[key] = (sums.get(key, (0.0, 0.0))[0] + value, timestamp)
        tmp = archive + ".new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        # Under --user the workers may add files here: the master writes
        # only into a file it made (O_EXCL: a link left under that name is
        # not followed), opened again through its descriptor, whatever a
        # worker puts under the name meanwhile.
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            out = MmapedDict(f"/proc/self/fd/{fd}")
            try:
                for key, (value, timestamp) in sums.items():
                    out.write_value(key, value, timestamp)
            finally:
                out.close()
        finally:
            os.close(fd)
        os.replace(tmp, archive)          # a scrape (this same thread) never sees half of it

    def close(self):
        if self.own:
            shutil.rmtree(self.dir, ignore_errors=True)
