"""The master without an app to fork from (a mixin of arbiter.Arbiter):
a reload's new image, or a --lazy-apps worker, could not import the app.
Stopping would take the running workers down too, so they serve on (none
is replaced as old, none retires by itself) and the import is tried again,
in a child, with a growing pause; once it imports, the master re-executes
itself in place (reexec.py), as in a reload.
"""
import time

from . import reexec


class HeldImport:
    """Uses the arbiter's workers, slots, argv, cwd and no_app/import_* state."""

    def lost_the_app(self, w):
        """A new worker could not import the app (--lazy-apps: the code on
        disk broke after the server started). Stopping would take the
        running workers down too: they serve on, none retires by itself,
        and the import is tried again (retry_import), as after a reload
        whose new image does not import."""
        self.hold_for_import(f"worker {w.index} could not import the app {self.app_spec!r} (its error is above)")
        serving = sum(1 for x in self.workers.values() if x.ready and not x.retiring)
        self.log.error("%s: the %d running worker(s) serve on with the code they have and do not retire by "
                       "themselves meanwhile; the import is tried again in %.0f s (or fix it and send SIGHUP)",
                       self.no_app, serving, max(0.0, self.import_retry_at - time.monotonic()))

    def hold_for_import(self, why):
        """No app to fork from (why): the workers that serve keep serving
        (none is replaced as old, none retires by itself) and the import is
        tried again (retry_import), from now on if not already."""
        if not self.no_app:
            self.import_retry_at = time.monotonic() + self.import_delay
        self.no_app = why
        for x in self.workers.values():
            if not x.retiring:
                x.old = False
        self.hold_workers(True)

    def hold_workers(self, on):
        """Ask every worker not to retire by itself while on (the master
        could not replace it), or let them again."""
        for w in self.workers.values():
            if w.slot is not None:
                self.slots.hold(w.slot, on)

    IMPORT_RETRY_MAX = 30.0

    def retry_import(self):
        """A reloaded master whose app did not import tries again, with a
        growing pause: in a child first (an import that hangs must not hang
        the master). Once it imports, the master re-executes itself in place:
        new workers start and the ones kept serving retire one by one, as in
        a reload."""
        if not self.no_app or self.stop_pending():
            return
        if self.import_check is None:
            if time.monotonic() >= self.import_retry_at:
                try:
                    self.import_check = reexec.Preflight(self.argv, self.cwd)
                except OSError as e:
                    self.log.error("cannot start the import check: %s; trying again later", e)
                    self.import_retry_at = time.monotonic() + 10.0
            return
        result = self.import_check.result()
        if result is None:
            return
        self.import_check = None
        self.import_attempts += 1
        ok, output = result
        if not ok:
            self.no_app = output.splitlines()[-1] if output else "(no output)"
            self.import_delay = min(self.import_delay * 2, self.IMPORT_RETRY_MAX)
            self.import_retry_at = time.monotonic() + self.import_delay
            self.log.error("the app still does not import (try %d): %s; the workers of the code before serve "
                           "on; next try in %.0f s", self.import_attempts, self.no_app, self.import_delay)
            return
        if not self.same_layout(output):
            self.import_retry_at = time.monotonic() + self.IMPORT_RETRY_MAX
            return
        # Not imported here: modules of the failed tries are still in
        # sys.modules, and would mix old code with new. A fresh image
        # imports it all, as on any reload.
        self.log.info("the app imports now (try %d): the master re-executes itself in place, then new "
                      "workers start and each worker of the code before retires once a new one is ready",
                      self.import_attempts)
        self.re_execute()
