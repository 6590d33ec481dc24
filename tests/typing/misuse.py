"""Wrong uses of forkwsgi's public API: mypy must report an error on each
line marked `# error` (tests/test_typing.py), and on no other line: the
hints are in force, not Any."""
import forkwsgi


def not_an_app(environ: dict[str, str]) -> list[bytes]:
    return []


forkwsgi.offload(1, b"value")  # error
forkwsgi.offload("topic", 3.5)  # error
forkwsgi.offload("topic", b"value", key=7)  # error
dropped: str = forkwsgi.offload("topic", b"value")  # error
forkwsgi.run(not_an_app)  # error
forkwsgi.run(lambda e, s: [b""], port="8000")  # error
forkwsgi.Server(lambda e, s: [b""], bind=8000)  # error
forkwsgi.Server(lambda e, s: [b""]).stop(graceful="yes")  # error
forkwsgi.Server(lambda e, s: [b""]).stats()["no_such_counter"]  # error
stats = forkwsgi.offload_stats()
stats["workers"]["queued"]  # error
