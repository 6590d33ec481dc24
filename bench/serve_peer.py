"""Run one app from bench/apps.py under a peer WSGI server that has no
command line of its own (or one that cannot pick the app by name):

    serve_peer.py SERVER APP PORT      SERVER: bjoern, fastpysgi, socketify, pyruvate,
                                       pyruvate-no-keepalive

Always one process and one thread serving, on 127.0.0.1, as run_core.py
compares them."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import apps  # noqa: E402

HOST = "127.0.0.1"


def serve(server, app, port):
    if server == "bjoern":
        import bjoern
        bjoern.run(app, HOST, port)
    elif server == "fastpysgi":
        import fastpysgi
        fastpysgi.run(app, HOST, port, workers=1)       # keep-alive is its default
    elif server == "socketify":
        from socketify import WSGI, AppListenOptions
        WSGI(app).listen(AppListenOptions(port=port, host=HOST)).run(workers=1)
    elif server in ("pyruvate", "pyruvate-no-keepalive"):
        import pyruvate
        # max_reuse_count 0, its default, closes every connection after one
        # request. The benchmark wants keep-alive on: 255 requests per
        # connection is the most it allows (the option is a u8). With it on,
        # pyruvate 1.6.1 answers the first request of a connection, even one
        # with "Connection: close", with "Connection: keep-alive", then
        # never answers the second.
        reuse = 255 if server == "pyruvate" else 0
        pyruvate.serve(app, f"{HOST}:{port}", 1, max_reuse_count=reuse)
    else:
        sys.exit(f"unknown server {server!r}")


if __name__ == "__main__":
    serve(sys.argv[1], getattr(apps, sys.argv[2]), int(sys.argv[3]))
