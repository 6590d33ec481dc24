"""systemd's two protocols for services, without libsystemd:

- socket activation: the sockets a .socket unit (or systemd-socket-activate)
  passes as fds 3.. with LISTEN_FDS and LISTEN_PID; used when no --bind is
  given anywhere;
- sd_notify: datagrams to $NOTIFY_SOCKET saying READY=1 once the workers
  serve, RELOADING=1 / READY=1 around a reload, STOPPING=1, and WATCHDOG=1
  every half WATCHDOG_USEC (Type=notify, WatchdogSec=).

A leaf: it imports nothing else of forkwsgi.
"""
import logging
import os
import socket
import time

log = logging.getLogger("forkwsgi")

SD_LISTEN_FDS_START = 3


def listen_fds(environ=None):
    """The fds systemd passed to this process (empty if none, or if they were
    meant for another process). The variables are removed, so processes we
    start do not take the fds for theirs, and the fds are made
    close-on-exec (the workers are forked, not exec'd: they keep them)."""
    environ = os.environ if environ is None else environ
    try:
        pid = int(environ.get("LISTEN_PID", ""))
        n = int(environ.get("LISTEN_FDS", ""))
    except ValueError:
        return []
    if pid != os.getpid() or n < 1:
        return []
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(var, None)
    fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + n))
    for fd in fds:
        os.set_inheritable(fd, False)
    return fds


class Notifier:
    """sd_notify for the serving process (the master, or the one process
    with --workers 0). Does nothing when NOTIFY_SOCKET is not set."""

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        self.addr = self.given = environ.pop("NOTIFY_SOCKET", None) or None
        if self.addr and self.addr.startswith("@"):
            self.addr = "\0" + self.addr[1:]            # abstract namespace
        self.sock = None
        self.watchdog = None                            # seconds between WATCHDOG=1
        self.next_watchdog = 0.0
        try:
            usec = int(environ.get("WATCHDOG_USEC", "0"))
            wpid = int(environ.get("WATCHDOG_PID", str(os.getpid())))
        except ValueError:
            usec, wpid = 0, 0
        if self.addr and usec > 0 and wpid == os.getpid():
            self.watchdog = usec / 2e6
        for var in ("WATCHDOG_USEC", "WATCHDOG_PID"):
            environ.pop(var, None)
        if self.addr:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            except OSError as e:
                log.warning("systemd: cannot make a socket for NOTIFY_SOCKET: %s", e.strerror)
                self.addr = None

    def environ(self):
        """The variables it was given, for a master that re-executes itself
        in place (reexec.py): the new image notifies, and keeps the watchdog."""
        env = {"NOTIFY_SOCKET": self.given} if self.sock else {}
        if self.sock and self.watchdog:
            env.update(WATCHDOG_USEC=str(round(self.watchdog * 2e6)), WATCHDOG_PID=str(os.getpid()))
        return env

    def send(self, **fields):
        """One notification: send(READY=1, STATUS="...")."""
        if not self.sock:
            return
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            self.sock.sendto(msg, self.addr)
        except OSError as e:
            log.warning("systemd: cannot notify %s: %s", self.addr.replace("\0", "@"), e.strerror)

    def ready(self, status):
        self.send(READY=1, STATUS=status)

    def reloading(self):
        self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000,
                  STATUS="reloading")

    def stopping(self):
        self.send(STOPPING=1, STATUS="stopping")

    def tick(self):
        """Call often (at least every second): sends WATCHDOG=1 when due.
        Returns the seconds until the next one (None: no watchdog)."""
        if self.watchdog is None:
            return None
        now = time.monotonic()
        if now >= self.next_watchdog:
            self.send(WATCHDOG=1)
            self.next_watchdog = now + self.watchdog
        return self.next_watchdog - now

    def close(self):
        if self.sock:
            self.sock.close()
            self.sock = None
