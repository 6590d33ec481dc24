"""Apps for tests/test_error_paths.py: an app that ends its process, one
whose iterable's close() raises, start_response misuse, a gated request
(it says when it is in the app, and waits for a file), a file sent with
wsgi.file_wrapper."""
import os
import sys
import time


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    if path == "/exit":
        sys.exit(int(query.get("code", "3")))
    if path == "/interrupt":
        raise KeyboardInterrupt
    if path == "/gate":
        # Marks "in the app" (query mark=PATH), then waits for the file
        # open=PATH to appear (at most 20 s).
        open(query["mark"], "w").close()
        end = time.monotonic() + 20
        while not os.path.exists(query["open"]) and time.monotonic() < end:
            time.sleep(0.01)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"gated " + query["mark"].rsplit("/", 1)[-1].encode()]
    if path == "/close-raises":
        class Body:
            def __iter__(self):
                return iter([b"a", b"b"])

            def close(self):
                raise RuntimeError("close() failed")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()
    if path == "/twice":
        start_response("200 OK", [])
        start_response("500 Again", [])
        return [b"never"]
    if path == "/status-int":
        start_response(200, [])
        return [b"never"]
    if path == "/header-int":
        start_response("200 OK", [("X-Count", 1)])
        return [b"never"]
    if path == "/no-reason":
        start_response("200", [])
        return [b"never"]
    if path == "/file":
        f = open(environ["HTTP_X_FILE"], "rb")
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](f, 1 << 16)
    if path == "/body":
        n = len(environ["wsgi.input"].read())
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(n).encode()]
    for prefix, paths in (("/input-", INPUT), ("/sr-", START_RESPONSE), ("/body-", BODIES)):
        if path.startswith(prefix) and path[len(prefix):] in paths:
            return paths[path[len(prefix):]](environ, start_response, query)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


# ---- misuse of the objects PEP 3333 gives the app --------------------------------
# /input-NAME, /sr-NAME and /body-NAME: the apps below, by NAME.

KEPT = {}       # objects of an ended request, for a later one to use


def error_text(call, *args):
    """What call(*args) raised, as "Type: message"."""
    try:
        call(*args)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def text_answer(start_response, lines):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return ["\n".join(lines).encode()]


def input_misuse(environ, start_response, query):
    """Bad arguments to wsgi.input's methods, then readlines(hint) and the
    rest; the stream is kept for /input-kept."""
    inp = environ["wsgi.input"]
    lines = [error_text(inp.read, 1, 2), error_text(inp.readline, 1, 2), error_text(inp.readlines, 1, 2),
             error_text(inp.read, "x"), error_text(inp.readline, "x"), error_text(inp.readlines, "x")]
    lines.append(repr(inp.readlines(5)))
    lines.append(repr(inp.read()))
    KEPT["input"] = inp
    KEPT["start_response"] = start_response
    KEPT["write"] = start_response("200 OK", [("Content-Type", "text/plain")])
    return ["\n".join(lines).encode()]


def input_kept(environ, start_response, query):
    """The wsgi.input and start_response of an ended request."""
    inp, sr, write = KEPT["input"], KEPT["start_response"], KEPT.pop("write")
    return text_answer(start_response, [error_text(inp.read), error_text(inp.readlines),
                                        error_text(sr, "200 OK", []), error_text(sr.write, b"late"),
                                        error_text(write, b"late")])


def input_spool_lost(environ, start_response, query):
    """Reads 10 bytes of a spooled body, writes its pid to mark, waits for
    open (the test truncates the spool file meanwhile), then reads on."""
    inp = environ["wsgi.input"]
    first = inp.read(10)
    with open(query["mark"], "w") as f:
        f.write(str(os.getpid()))
    end = time.monotonic() + 20
    while not os.path.exists(query["open"]) and time.monotonic() < end:
        time.sleep(0.01)
    return text_answer(start_response, [repr(first), error_text(inp.read), error_text(inp.readline)])


INPUT = {"misuse": input_misuse, "kept": input_kept, "spool-lost": input_spool_lost}


def sr_status(environ, start_response, query):
    from urllib.parse import unquote
    start_response(unquote(query["s"]), [])
    return [b"never"]


SR_HEADERS = {
    "not-a-tuple": [("X-A", "1"), "X-B: 2"],
    "one-item": [("X-A",)],
    "not-a-list": 5,
    "empty-name": [("", "v")],
    "space-in-name": [("X A", "v")],
    "bad-length": [("Content-Length", "12a")],
    "empty-length": [("Content-Length", "")],
    "two-lengths": [("Content-Length", "5"), ("Content-Length", "5")],
    "signed-length": [("Content-Length", "-5")],
    "huge-length": [("Content-Length", "1" * 20)],
}


def sr_headers(environ, start_response, query):
    start_response("200 OK", SR_HEADERS[query["case"]])
    return [b"never"]


def sr_one_arg(environ, start_response, query):
    start_response("200 OK")
    return [b"never"]


def sr_write_first(environ, start_response, query):
    start_response.write(b"early")              # (its method: no start_response yet)
    return [b"never"]


def sr_write_str(environ, start_response, query):
    start_response("200 OK", [])("text")
    return [b"never"]


def sr_write_bad_head(environ, start_response, query):
    start_response("200 OK", [("Content-Length", "x")])(b"body")
    return [b"never"]


def sr_no_call(environ, start_response, query):
    return []


def sr_write_two(environ, start_response, query):
    start_response("200 OK", [])(b"a", b"b")
    return [b"never"]


def sr_late_exc_info(environ, start_response, query):
    """exc_info after the head left: a malformed one (case=bad), or one
    without a traceback (case=no-tb), which is re-raised."""
    start_response("200 OK", [("Content-Type", "text/plain")])

    def body():
        yield b"head sent"
        if query["case"] == "bad":
            start_response("500 Oops", [], "not a tuple")
        try:
            raise ValueError("raised late")
        except ValueError:
            t, v, _ = sys.exc_info()
        start_response("500 Oops", [], (t, v, None))
    return body()


START_RESPONSE = {"status": sr_status, "headers": sr_headers, "one-arg": sr_one_arg, "write-first": sr_write_first,
                  "write-str": sr_write_str, "write-two": sr_write_two,
                  "write-bad-head": sr_write_bad_head, "no-call": sr_no_call, "late-exc-info": sr_late_exc_info}


# ---- bodies the server frames ------------------------------------------------------

def body_pieces(environ, start_response, query):
    """20 list items of 60000 bytes (more than the server queues before it
    writes) with empty ones between."""
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [b"", *([b"p" * 59999 + b"\n", b""] * 20)]


def body_tuple(environ, start_response, query):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return (b"a tuple ", b"of bytes")


def body_not_bytes(environ, start_response, query):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"bytes first", "then a str"]


def body_not_iterable(environ, start_response, query):
    start_response("200 OK", [])
    return 5


def body_close_attr_raises(environ, start_response, query):
    class Body:
        def __iter__(self):
            return iter([b"body"])

        @property
        def close(self):
            raise RuntimeError("no close today")
    start_response("200 OK", [("Content-Type", "text/plain")])
    return Body()


def body_past_length(environ, start_response, query):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
    return iter([b"abc", b"def"])


def body_informational(environ, start_response, query):
    start_response("103 Early Hints", [("Link", "</a.css>; rel=preload"), ("Content-Length", "0")])
    return [b""]


def body_no_content_length(environ, start_response, query):
    start_response("204 No Content", [("Content-Length", "0")])
    return [b""]


def body_app_headers(environ, start_response, query):
    """Hop-by-hop headers the server drops, and a second Date and Server
    (only the app's first of each is sent)."""
    start_response("200 OK", [("TE", "trailers"), ("Trailer", "X-T"), ("Upgrade", "h2c"),
                              ("Proxy-Connection", "keep-alive"), ("Transfer-Encoding", "chunked"),
                              ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"), ("Date", "Tue, 02 Jan 2024 00:00:00 GMT"),
                              ("Server", "app/1"), ("Server", "app/2"), ("Connection", "upgrade"),
                              ("Xy", "2"), ("X-Trace-Id", "10"), ("X-Request-Origin", "16"),
                              ("X-Request-Origins", "17"), ("X-Kept", "1")])
    return [b"headers"]


class NoFileno:
    """A file-like object whose fileno() says -1."""

    def __init__(self, data):
        import io
        self.f = io.BytesIO(data)

    def read(self, n):
        return self.f.read(n)

    def fileno(self):
        return -1


class NoTell:
    """A real file whose tell() fails: the server asks the fd."""

    def __init__(self, path):
        self.f = open(path, "rb")
        self.f.seek(5)

    def read(self, n):
        return self.f.read(n)

    def fileno(self):
        return self.f.fileno()

    def tell(self):
        raise OSError("tell() is not for you")

    def close(self):
        self.f.close()


def body_file(environ, start_response, query):
    """wsgi.file_wrapper over X-File: kind=bytesio (no fileno), minus-one
    (fileno() -1), no-tell (tell() fails, at offset 5), length (the app's
    Content-Length of 1000 bytes), bad-length (a malformed one)."""
    import io
    path = environ["HTTP_X_FILE"]
    kind = query["kind"]
    headers = [("Content-Type", "application/octet-stream")]
    if kind == "bytesio":
        with open(path, "rb") as f:
            filelike = io.BytesIO(f.read())
    elif kind == "minus-one":
        with open(path, "rb") as f:
            filelike = NoFileno(f.read())
    elif kind == "no-tell":
        filelike = NoTell(path)
    else:
        filelike = open(path, "rb")
        headers.append(("Content-Length", "1000" if kind == "length" else "1e3"))
    start_response("200 OK", headers)
    return environ["wsgi.file_wrapper"](filelike, 1 << 16)


def body_write_flood(environ, start_response, query):
    """write() 1 MiB at a time, mb=N of them (100 by default)."""
    n = int(query.get("mb", "100"))
    write = start_response("200 OK", [("Content-Type", "application/octet-stream"),
                                      ("Content-Length", str(n << 20))])
    block = b"w" * (1 << 20)
    for _ in range(n):
        write(block)
    return [b""]


BODIES = {"pieces": body_pieces, "tuple": body_tuple, "not-bytes": body_not_bytes, "not-iterable": body_not_iterable,
          "close-attr-raises": body_close_attr_raises, "past-length": body_past_length,
          "informational": body_informational, "no-content-length": body_no_content_length,
          "app-headers": body_app_headers, "file": body_file, "write-flood": body_write_flood}
