"""A typed user of forkwsgi's public API.

tests/test_typing.py runs `mypy --strict` on this file, and runs it: it
serves its app with forkwsgi.Server on 127.0.0.1 (an ephemeral port) on a
thread, fetches a page, prints "ok <port> <requests>" and stops.
"""
from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterable
from typing import TYPE_CHECKING

import forkwsgi

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from forkwsgi import OffloadStats


def delivered(stats: OffloadStats | None) -> int:
    if stats is None:
        return 0
    return stats["sibling"]["delivered"] + stats["workers"]["queued"]


def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    if "forkwsgi.offload" in environ:
        queued: bool = forkwsgi.offload("page-views", environ["PATH_INFO"], key=b"k")
        assert isinstance(queued, bool)
    body = f"hello {delivered(forkwsgi.offload_stats())}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def main() -> None:
    with forkwsgi.Server(app, bind="127.0.0.1:0", threads=2, keepalive=2) as server:
        address = server.addresses[0]
        assert isinstance(address, tuple)
        port: int = address[1]
        thread = threading.Thread(target=server.serve, kwargs={"announce": False})
        thread.start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
                assert resp.read() == b"hello 0\n"
        finally:
            server.stop(graceful=True)
            thread.join(10)
        requests: int = server.stats()["requests"]
        print("ok", port, requests)


def run_forever(port: int) -> None:
    forkwsgi.run(app, host="127.0.0.1", port=port, workers=1)


if __name__ == "__main__":
    main()
