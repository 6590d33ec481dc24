"""Type hints for forkwsgi's public API (the package is typed: PEP 561).

forkwsgi.run(), forkwsgi.Server, forkwsgi.offload(), forkwsgi.offload_stats()
and forkwsgi.config.ConfigError. The TypedDicts below describe the dicts
that Server.stats() and offload_stats() return; they exist for type checkers
only (use them under ``if TYPE_CHECKING:`` or in quoted annotations).
Settings (``workers=2``, ``keepalive=5``, ...) are the names of
``forkwsgi --help`` in Python spelling and stay untyped here: config.py
checks them at run time.
"""
import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict, type_check_only

from _typeshed.wsgi import WSGIApplication
from typing_extensions import NotRequired, Self, TypeAlias

from . import config as config

__version__: str

__all__ = ["Server", "listen", "run", "config", "offload", "offload_stats", "__version__"]

# What offload() takes as a record's value or key (str is sent as UTF-8).
_Payload: TypeAlias = str | bytes | bytearray | memoryview
# A listening socket's address: (host, port) for IPv4, (host, port,
# flowinfo, scope_id) for IPv6, a path for a unix socket (bytes when abstract).
_Address: TypeAlias = tuple[str, int] | tuple[str, int, int, int] | str | bytes

@type_check_only
class ServerStats(TypedDict):
    connections: int
    serving: bool
    requests: int
    inflight: int
    accepted: int
    handed_in: int
    handed_out: int
    # with --access-logfile
    access_log_lines: NotRequired[int]
    access_log_dropped: NotRequired[int]
    access_log_write_errors: NotRequired[int]

@type_check_only
class OffloadWorkerStats(TypedDict):
    queued: int
    spilled: int
    dropped: int
    blocked_ns: int
    bytes: int

@type_check_only
class OffloadSiblingStats(TypedDict):
    delivered: int
    retried: int
    in_flight: int
    journaled: int
    pending: int
    batches: int
    sink_errors: int
    rejected: int
    disk_errors: int
    oldest_age: float
    queue_depth: int

@type_check_only
class OffloadStats(TypedDict):
    workers: OffloadWorkerStats
    sibling: OffloadSiblingStats

class Server:
    """Serve `app` on `bind` addresses (or host/port, or ready sockets)."""

    settings: dict[str, Any]
    log: logging.Logger
    sockets: list[socket.socket]
    protocols: list[str]        # what each socket speaks: "http" or "uwsgi"
    urls: list[str]
    def __init__(
        self,
        app: WSGIApplication,
        bind: str | Sequence[str] | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        sockets: Iterable[socket.socket] | None = None,
        logger: logging.Logger | None = None,
        **options: Any,
    ) -> None: ...
    def stats(self) -> ServerStats: ...
    @property
    def addresses(self) -> list[_Address]: ...
    def start_threads(self) -> None: ...
    def serve(self, announce: bool = True) -> None: ...
    def reopen_logs(self) -> None: ...
    def stop(self, graceful: bool = True) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...

def listen(app: WSGIApplication, host: str | None = None, port: int | None = None, reuse_port: bool = False,
           listen_backlog: int | None = None, **options: Any) -> socket.socket:
    """bjoern's listen(): bind now and return the listening socket; run()
    with no app serves it (in this process, or in each child forked since).
    Once per process: RuntimeError the second time."""

def run(app: WSGIApplication | None = None, host: str | None = None, port: int | None = None, *,
        bind: str | Sequence[str] | None = None, reuse_port: bool = False, **options: Any) -> None:
    """Serve `app` until SIGTERM (graceful) or SIGINT (immediate): bjoern's
    forms (host, port; "unix:/path"; listen() then run()), or bind= alone;
    127.0.0.1:8000 when given nothing."""

def offload(topic: str, value: _Payload, key: _Payload | None = None) -> bool:
    """Hand a record to the offload sibling: True if queued or spilled, False
    if the overflow policy dropped it. Raises RuntimeError without
    --offload-sink, ValueError for a topic that is not a valid Kafka name."""

def offload_stats() -> OffloadStats | None:
    """The offload counters of the whole server, or None when offload is not
    enabled in this process."""
