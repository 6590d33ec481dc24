"""forkwsgi: a WSGI server with a C HTTP/1.1 core.

Command line: ``forkwsgi MODULE:APP --bind 127.0.0.1:8000``.
Embedded: ``forkwsgi.run(app, host="127.0.0.1", port=8000)`` or
``forkwsgi.Server(app, bind=[...]).serve()``.
Side effects out of the request: ``forkwsgi.offload(topic, value, key=None)``
(with ``--offload-sink``), ``forkwsgi.offload_stats()``.
"""
from . import config  # noqa: F401 - forkwsgi.config.ConfigError for embedders
from ._forkwsgi import offload
from ._version import __version__
from .offload.counters import stats as offload_stats
from .server import Server, listen, run

__all__ = ["Server", "listen", "run", "config", "offload", "offload_stats", "__version__"]
