"""Apps for tests/test_write_coalesce.py: requests that take a known time
in the app, so that several finish in one pass of the worker's loop."""
import time
from urllib.parse import parse_qs

from apps import entered

BODY = b"coalesced\n"


def app(environ, start_response):
    """?ms=N: N ms in the app. ?gen=1: the body comes from a generator that,
    after yielding it (the whole Content-Length), works on for ?after=N ms
    and then creates the file the X-Done header names."""
    entered(environ)
    q = parse_qs(environ["QUERY_STRING"])
    time.sleep(int(q.get("ms", ["0"])[0]) / 1000)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    if "gen" not in q:
        return [BODY]
    after = int(q.get("after", ["0"])[0]) / 1000
    done = environ.get("HTTP_X_DONE")

    def body():
        yield BODY
        time.sleep(after)
        if done:
            with open(done, "w"):
                pass
    return body()
