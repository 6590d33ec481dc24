"""forkwsgi: a WSGI server with a C HTTP/1.1 core.

Command line: ``forkwsgi MODULE:APP --bind 127.0.0.1:8000``.
Embedded: ``forkwsgi.run(app, host="127.0.0.1", port=8000)`` or
``forkwsgi.Server(app, bind=[...]).serve()``.
Side effects out of the request: ``forkwsgi.offload(topic, value, key=None)``
(with ``--offload-sink``), ``forkwsgi.offload_stats()``.
"""
__version__ = "0.1.0"

from . import config  # noqa: E402
from ._forkwsgi import offload  # noqa: E402
from .server import Server, run  # noqa: E402
from .sibling import stats as offload_stats  # noqa: E402

__all__ = ["Server", "run", "offload", "offload_stats", "__version__"]
