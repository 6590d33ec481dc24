"""WSGI apps used by the tests (served by real forkwsgi processes)."""
import hashlib
import json
import os
import sys
import threading
import time

# A slow import, for tests of workers that are still starting (--lazy-apps).
if os.environ.get("FW_TEST_IMPORT_DELAY"):
    time.sleep(float(os.environ["FW_TEST_IMPORT_DELAY"]))


def entered(environ):
    """Tell the test that the request is in the app now: create the file the
    X-Entered header names (httpraw.in_app_header). Tests wait for it
    instead of sleeping; a header, so that the request line the server logs
    stays as the test wrote it."""
    path = environ.get("HTTP_X_ENTERED")
    if path:
        with open(path, "w"):
            pass


def _headers(environ):
    return {k: v for k, v in environ.items() if k.startswith("HTTP_") or k in ("CONTENT_TYPE", "CONTENT_LENGTH")}


def echo(environ, start_response):
    """Everything the server parsed, as JSON (body as latin-1 text)."""
    body = environ["wsgi.input"].read()
    data = {
        "method": environ["REQUEST_METHOD"],
        "path": environ["PATH_INFO"],
        "query": environ["QUERY_STRING"],
        "raw_uri": environ["RAW_URI"],
        "protocol": environ["SERVER_PROTOCOL"],
        "script_name": environ["SCRIPT_NAME"],
        "server_software": environ.get("SERVER_SOFTWARE"),
        "server_name": environ["SERVER_NAME"],
        "server_port": environ["SERVER_PORT"],
        "remote_addr": environ.get("REMOTE_ADDR"),
        "remote_port": environ.get("REMOTE_PORT"),
        "headers": _headers(environ),
        "body": body.decode("latin-1"),
        "url_scheme": environ["wsgi.url_scheme"],
        "multithread": environ["wsgi.multithread"],
        "multiprocess": environ["wsgi.multiprocess"],
        "run_once": environ["wsgi.run_once"],
        "input_terminated": environ.get("wsgi.input_terminated"),
        "version": list(environ["wsgi.version"]),
        "types": {k: type(v).__name__ for k, v in environ.items() if not k.startswith("wsgi.")},
        "has_os_environ_keys": any(k in environ for k in ("PATH", "HOME", "PYTHONPATH")),
    }
    out = json.dumps(data).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def client(environ, start_response):
    """Who the server says the client is, and which worker answers (?t=SECONDS: after a sleep)."""
    entered(environ)
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    time.sleep(float(q.get("t", "0")))
    out = json.dumps({"pid": os.getpid(), "end": time.monotonic(), "remote_addr": environ.get("REMOTE_ADDR"),
                      "remote_port": environ.get("REMOTE_PORT"), "url_scheme": environ["wsgi.url_scheme"],
                      "x_forwarded_proto": environ.get("HTTP_X_FORWARDED_PROTO")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"Hello, World!"]


def stream(environ, start_response):
    """?n=lines&size=bytes-per-line&delay=seconds between chunks"""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    n, size, delay = int(q.get("n", 3)), int(q.get("size", 10)), float(q.get("delay", 0))
    start_response("200 OK", [("Content-Type", "text/plain")])

    def gen():
        for i in range(n):
            if delay:
                time.sleep(delay)
            line = b"%08d" % i + b"x" * max(0, size - 9)
            yield line[:max(size - 1, 0)] + b"\n"
    return gen()


class Tracked:
    """An iterable whose close() is recorded in a file named by ?mark=."""

    def __init__(self, mark, chunks, fail_at=None):
        self.mark, self.chunks, self.fail_at = mark, chunks, fail_at

    def __iter__(self):
        for i, c in enumerate(self.chunks):
            if self.fail_at is not None and i == self.fail_at:
                raise RuntimeError("boom mid-iteration")
            yield c

    def close(self):
        with open(self.mark, "w") as f:
            f.write("closed")


def closing(environ, start_response):
    """?mark=PATH&mode=ok|fail|big"""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    mode = q.get("mode", "ok")
    start_response("200 OK", [("Content-Type", "text/plain")])
    if mode == "fail":
        return Tracked(q["mark"], [b"a", b"b", b"c"], fail_at=1)
    if mode == "big":
        return Tracked(q["mark"], (b"z" * 65536 for _ in range(4000)))
    return Tracked(q["mark"], [b"a", b"b"])


def errors(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/raise":
        raise ValueError("app exploded before start_response")
    if path == "/raise-after-start":
        start_response("200 OK", [("Content-Type", "text/plain")])
        raise ValueError("app exploded after start_response")
    if path == "/raise-mid-body":
        start_response("200 OK", [("Content-Type", "text/plain")])

        def gen():
            yield b"first chunk"
            raise ValueError("app exploded mid-body")
        return gen()
    if path == "/crlf-header":
        start_response("200 OK", [("X-Bad", "a\r\nSet-Cookie: evil=1")])
        return [b"nope"]
    if path == "/crlf-status":
        start_response("200 OK\r\nX-Evil: 1", [])
        return [b"nope"]
    if path == "/nul-header":
        start_response("200 OK", [("X-Bad", "a\x00b")])
        return [b"nope"]
    if path == "/no-start":
        return [b"body without start_response"]
    if path == "/not-bytes":
        start_response("200 OK", [])
        return ["a str, not bytes"]
    if path == "/short":
        start_response("200 OK", [("Content-Length", "100")])
        return [b"only ten b"]
    if path == "/long":
        start_response("200 OK", [("Content-Length", "5")])
        return [b"more than five bytes"]
    if path == "/exc-info":
        try:
            raise KeyError("handled")
        except KeyError:
            start_response("200 OK", [("Content-Type", "text/plain")])
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"replaced"]
    if path == "/exc-info-late":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"sent")
        try:
            raise KeyError("too late")
        except KeyError:
            start_response("500 Error", [], sys.exc_info())
        return [b"unreachable"]
    if path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"written ")
        return [b"and returned"]
    if path == "/204":
        start_response("204 No Content", [])
        return [b"must not be sent"]
    if path == "/304":
        start_response("304 Not Modified", [("ETag", '"x"')])
        return [b"must not be sent"]
    if path == "/hop":
        start_response("200 OK", [("Connection", "close"), ("Keep-Alive", "timeout=5"), ("X-Ok", "1")])
        return [b"hop"]
    start_response("404 Not Found", [])
    return [b""]


def upload(environ, start_response):
    """Streams the body in chunks and answers its length and sha256 (bounded memory)."""
    h = hashlib.sha256()
    n = 0
    inp = environ["wsgi.input"]
    mode = environ["QUERY_STRING"]
    if mode == "lines":
        for line in inp:
            h.update(line)
            n += len(line)
    else:
        while True:
            chunk = inp.read(65536)
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    out = json.dumps({"length": n, "sha256": h.hexdigest()}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [out]


def input_api(environ, start_response):
    """Exercises read(n), readline(n), readlines(), iteration on one body."""
    inp = environ["wsgi.input"]
    out = {
        "read3": inp.read(3).decode("latin-1"),
        "readline": inp.readline().decode("latin-1"),
        "readline2": inp.readline(2).decode("latin-1"),
        "readlines": [x.decode("latin-1") for x in inp.readlines()],
        "after": inp.read().decode("latin-1"),
        "read0": inp.read(0).decode("latin-1"),
    }
    body = json.dumps(out).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


def expect(environ, start_response):
    """Decides from the path whether to read the body (Expect: 100-continue)."""
    if environ["PATH_INFO"] == "/reject":
        start_response("403 Forbidden", [("Content-Type", "text/plain")])
        return [b"not reading that"]
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"got %d" % len(body)]


def sleep(environ, start_response):
    entered(environ)
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    time.sleep(float(q.get("t", "0.1")))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"slept"]


def spin(environ, start_response):
    """?t=SECONDS of pure Python work holding the GIL (no sleep: the call
    runs all along, as a CPU-bound view does)."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    end = time.perf_counter() + float(q.get("t", "0.005"))
    n = 0
    while time.perf_counter() < end:
        n += 1
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"spun %d" % n]


def files(environ, start_response):
    """wsgi.file_wrapper over ?path=...; &len=N sets Content-Length; &seek=N first."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    f = open(q["path"], "rb")
    if "seek" in q:
        f.seek(int(q["seek"]))
    headers = [("Content-Type", "application/octet-stream")]
    if "len" in q:
        headers.append(("Content-Length", q["len"]))
    start_response("200 OK", headers)
    return environ["wsgi.file_wrapper"](f, 65536)


def big(environ, start_response):
    """?mb=N: a streamed response of N MiB in 64 KiB chunks."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    mb = int(q.get("mb", "100"))
    chunk = bytes(range(256)) * 256
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(mb * 16 * len(chunk)))])
    return (chunk for _ in range(mb * 16))


def where(environ, start_response):
    """?t=SECONDS: sleep, then say who ran it and when (CLOCK_MONOTONIC is
    system-wide, so intervals compare across processes)."""
    entered(environ)
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    start = time.monotonic()
    time.sleep(float(q.get("t", "0")))
    body = json.dumps({"pid": os.getpid(), "thread": threading.get_ident(), "start": start,
                       "end": time.monotonic(), "multithread": environ["wsgi.multithread"]})
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body.encode()]


def released_view():
    """A memoryview whose buffer was released: offload() cannot copy it."""
    m = memoryview(b"gone")
    m.release()
    return m


def offloader(environ, start_response):
    """/emit?topic=T&n=N&size=S&key=K&mark=PATH&t=SECONDS&spin=US&hold=PATH: N
    records of S bytes (value = "<pid>-<i>-" padded with x), with US
    microseconds of busy CPU before each, once the file hold (if given) is
    gone; writes PATH once they were handed over, then sleeps t.
    /bad?case=...: a wrong call, answering the exception. /stats: the
    offload counters."""
    import forkwsgi
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    path = environ["PATH_INFO"]
    if path == "/bad":
        case = q["case"]
        calls = {
            "topic-type": lambda: forkwsgi.offload(5, b"v"),
            "value-type": lambda: forkwsgi.offload("t", 5),
            "key-type": lambda: forkwsgi.offload("t", b"v", key=3.5),
            "topic-name": lambda: forkwsgi.offload("no spaces", b"v"),
            "topic-dots": lambda: forkwsgi.offload("..", b"v"),
            "too-big": lambda: forkwsgi.offload("t", b"x" * (int(q.get("size", "0")))),
            "missing": lambda: forkwsgi.offload("t"),
            "kw-unknown": lambda: forkwsgi.offload("t", b"v", kee=b"k"),
            "kw-twice": lambda: forkwsgi.offload("t", b"v", topic="u"),
            "too-many": lambda: forkwsgi.offload("t", b"v", b"k", b"x"),
            "kw-ok": lambda: forkwsgi.offload(value="by keyword", key="k", topic="kw"),
            "buffers": lambda: forkwsgi.offload("buf", bytearray(b"from a bytearray"), key=memoryview(b"mv")),
            "buffer-key-type": lambda: forkwsgi.offload("t", bytearray(b"v"), key=3.5),
            "missing-topic": lambda: forkwsgi.offload(value=b"v"),
            "topic-surrogate": lambda: forkwsgi.offload("t\ud800", b"v"),
            "value-surrogate": lambda: forkwsgi.offload("t", "\udcff"),
            "key-surrogate": lambda: forkwsgi.offload("t", bytearray(b"v"), key="\ud800"),
            "released-view": lambda: forkwsgi.offload("t", released_view()),
        }
        try:
            calls[case]()
            out = "no error"
        except Exception as e:  # noqa: BLE001 - the test reads the exception
            out = f"{type(e).__name__}: {e}"
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [out.encode()]
    if path == "/stats":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(forkwsgi.offload_stats()).encode()]
    n, size = int(q.get("n", "1")), int(q.get("size", "0"))
    topic, key = q.get("topic", "events"), q.get("key")
    results = []
    emit = environ["forkwsgi.offload"]
    spin = int(q.get("spin", "0")) * 1000
    while "hold" in q and os.path.exists(q["hold"]):
        time.sleep(0.02)
    for i in range(n):
        if spin:
            until = time.perf_counter_ns() + spin
            while time.perf_counter_ns() < until:
                pass
        v = f"{os.getpid()}-{q.get('id', '')}{i}-".encode()
        v += b"x" * max(0, size - len(v))
        results.append(emit(topic, v, key=key.encode() if key else None))
    if "mark" in q:
        with open(q["mark"], "w") as f:
            f.write("handed over")
    time.sleep(float(q.get("t", "0")))
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"pid": os.getpid(), "results": results}).encode()]


def pid(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]


def flask_app():
    from flask import Flask, Response, jsonify, request, stream_with_context

    app = Flask("forkwsgi_test")

    @app.post("/json")
    def j():
        data = request.get_json()
        return jsonify(received=data, n=len(data))

    @app.post("/form")
    def form():
        return jsonify(form=request.form.to_dict(), files={k: v.read().decode() for k, v in request.files.items()})

    @app.post("/upload")
    def up():
        data = request.get_data()
        return jsonify(length=len(data), head=data[:20].decode("latin-1"))

    @app.get("/stream")
    def st():
        n = int(request.args.get("n", 5))

        def gen():
            for i in range(n):
                yield f"part {i}\n"
        return Response(stream_with_context(gen()), mimetype="text/plain")

    @app.get("/hello/<name>")
    def hi(name):
        return f"hi {name}"

    return app


_counter_lock = threading.Lock()


# ---- added for test_wsgi.py (append-only) ----------------------------------

def _read_sized(inp, size=65536):
    """The whole body through read(size) calls only."""
    parts = []
    while True:
        b = inp.read(size)
        if not b:
            return b"".join(parts)
        parts.append(b)


class _SizedReads:
    """read() without a size on top of an input whose read() needs one.

    wsgiref.validate's InputWrapper asserts read() gets exactly one argument,
    so apps that call read() bare (echo, validated's inner app) fail under it
    whatever the server does. This adapter sits between the validator and
    such an app."""

    def __init__(self, inp):
        self._inp = inp

    def read(self, size=-1):
        if size is None or size < 0:
            return _read_sized(self._inp)
        return self._inp.read(size)

    def readline(self, *args):
        return self._inp.readline(*args)

    def readlines(self, *args):
        return self._inp.readlines(*args)

    def __iter__(self):
        return iter(self._inp)


# Said on stderr (the server's log) for each response of a validated app
# once the server let go of it.
RELEASED = "validated response released"


def _says_when_released(app):
    """app, each of whose responses has RELEASED said once the server let
    go of it: after wsgiref.validate's IteratorWrapper.__del__, which
    checks then that close() was called (weakref callbacks run after
    __del__), so a test can wait for that check."""
    import weakref

    def wrapped(environ, start_response):
        result = app(environ, start_response)
        weakref.finalize(result, print, RELEASED, file=sys.stderr, flush=True)
        return result
    return wrapped


def validated():
    """A small app under wsgiref.validate; it reads with read(size) as the
    validator demands and answers the body's length."""
    from wsgiref.validate import validator

    def inner(environ, start_response):
        n = len(_read_sized(environ["wsgi.input"]))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"validated %d" % n]
    return _says_when_released(validator(inner))


def validated_echo():
    """echo under wsgiref.validate, with bare read() adapted to read(size)."""
    from wsgiref.validate import validator

    def adapter(environ, start_response):
        environ["wsgi.input"] = _SizedReads(environ["wsgi.input"])
        return echo(environ, start_response)
    return _says_when_released(validator(adapter))


def _digest(b):
    return [len(b), hashlib.sha256(b).hexdigest()[:16]]


def input_ops(environ, start_response):
    """?ops=read:3,readline,readline:2,readlines,iter,next,read:0,read,chunks:N

    Runs the operations in order on wsgi.input; answers a JSON list with one
    entry per operation: [length, sha256 prefix] of the bytes it returned, a
    list of those for readlines/iter/chunks, or null for next at EOF."""
    inp = environ["wsgi.input"]
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    results = []
    for op in filter(None, q.get("ops", "").split(",")):
        name, _, arg = op.partition(":")
        n = int(arg) if arg else None
        if name == "read":
            results.append(_digest(inp.read() if n is None else inp.read(n)))
        elif name == "readline":
            results.append(_digest(inp.readline() if n is None else inp.readline(n)))
        elif name == "readlines":
            results.append([_digest(x) for x in inp.readlines()])
        elif name == "iter":
            results.append([_digest(x) for x in inp])
        elif name == "next":
            try:
                results.append(_digest(next(iter(inp))))
            except StopIteration:
                results.append(None)
        elif name == "chunks":
            out = []
            while True:
                b = inp.read(n)
                if not b:
                    break
                out.append(_digest(b))
            results.append(out)
        else:
            raise ValueError(f"unknown op {op!r}")
    body = json.dumps(results).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


_hoard = []


def hog(environ, start_response):
    """Keeps 20 MiB more per request (for --max-rss)."""
    _hoard.append(bytearray(20 << 20))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]


def logged(environ, start_response):
    """For the access log: ?status=CODE&len=N&sleep=S; answers N bytes with
    the response headers X-Resp (a value with a quote) and, twice, X-Twice.
    ?raise=1: raises after start_response (the server answers 500)."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    if "sleep" in q:
        time.sleep(float(q["sleep"]))
    code = int(q.get("status", 200))
    body = b"x" * int(q.get("len", 5))
    start_response(f"{code} Whatever", [("Content-Type", "text/plain"), ("X-Resp", 'v "1"'),
                                        ("X-Twice", "first"), ("X-Twice", "second")])
    if "raise" in q:
        raise RuntimeError("the app gives up after start_response")
    return [body]


def ids(environ, start_response):
    """Who the worker runs as: uid, gid, supplementary groups."""
    body = json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                       "pid": os.getpid()}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


def prom_app():
    """An app with its own prometheus_client Counter and Histogram, as apps
    write them: no multiprocess set-up of their own."""
    from prometheus_client import Counter, Histogram
    hits = Counter("myapp_hits", "Hits of the app", ["path"])
    sizes = Histogram("myapp_body_bytes", "Body sizes", buckets=(1, 10, 100))

    def app(environ, start_response):
        hits.labels(environ["PATH_INFO"]).inc()
        sizes.observe(5)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"counted"]
    return app


def ticker(environ, start_response):
    """?n=N&every=S: N chunks, one every S seconds, each saying when it was
    yielded (CLOCK_MONOTONIC, system-wide: the client compares its own
    reading). Streamed chunked, as Server-Sent Events and progress streams
    are."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    n, every = int(q.get("n", "3")), float(q.get("every", "1"))
    start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])

    def chunks():
        for i in range(n):
            if i:
                time.sleep(every)
            yield f"data: {i} {time.monotonic():.6f}\n\n".encode()
    return chunks()


def writes(environ, start_response):
    """?mb=N: N MiB sent with the legacy write() callable, 64 KiB at a time."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    mb = int(q.get("mb", "16"))
    piece = bytes(range(256)) * 256
    write = start_response("200 OK", [("Content-Type", "application/octet-stream"),
                                      ("Content-Length", str(mb << 20))])
    for _ in range(mb * 16):
        write(piece)
    return []


def blob(environ, start_response):
    """?kb=N: a list body of N KiB with a Content-Length (pipelined batches)."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    body = b"x" * (int(q.get("kb", "64")) << 10)
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [body]


def sized(environ, start_response):
    """?n=BYTES&parts=K: a list body of n bytes in k parts; each 8-byte
    word holds its own offset, so a byte out of place shows where."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    n, k = int(q.get("n", "0")), max(1, int(q.get("parts", "1")))
    body = sized_body(n)
    cut = [n * i // k for i in range(k + 1)]
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return [body[cut[i]:cut[i + 1]] for i in range(k)]


def sized_body(n):
    return b"".join(b"%07x|" % i for i in range(0, n + 8, 8))[:n]


def thread_name(environ, start_response):
    """The name of the thread the app runs on; ?server=X sends its own Server
    header; ?t=SECONDS sleeps first (saying it is in: apps.entered)."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    entered(environ)
    time.sleep(float(q.get("t", "0")))
    headers = [("Content-Type", "text/plain")] + ([("Server", q["server"])] if "server" in q else [])
    start_response("200 OK", headers)
    return [threading.current_thread().name.encode()]


def crash_on(environ, start_response):
    """/crash: the worker process ends at once (os._exit(5)), as one whose
    C extension segfaults on a request; anything else: 200 and the pid."""
    if environ["PATH_INFO"] == "/crash":
        os._exit(5)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]


def forks(environ, start_response):
    """?t=SECONDS: fork a process that lives that long holding every
    descriptor of the worker (the client's socket too), as an app that
    forks (multiprocessing's fork start method) does; then answer."""
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    child = os.fork()
    if child == 0:
        if os.fork() == 0:            # the grandchild: orphaned, no zombie for the worker
            time.sleep(float(q.get("t", "2")))
        os._exit(0)
    os.waitpid(child, 0)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]


def where_gated(environ, start_response):
    """apps.where, and ?gate=PATH: wait (up to 10 s) until that file exists,
    so a test ends the request at a moment of its choosing."""
    entered(environ)
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    start = time.monotonic()
    deadline = start + 10
    while "gate" in q and not os.path.exists(q["gate"]) and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(float(q.get("t", "0")))
    body = json.dumps({"pid": os.getpid(), "start": start, "end": time.monotonic()})
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body.encode()]


def chatty(environ, start_response):
    """Writes to standard output and error as apps do (print, a warning to
    sys.stderr); ?raise=1 raises after that (a traceback in the log)."""
    print("chatty: printed to stdout", environ["PATH_INFO"], flush=True)
    sys.stderr.write("chatty: written to stderr\n")
    sys.stderr.flush()
    if "raise=1" in environ.get("QUERY_STRING", ""):
        raise RuntimeError("chatty gives up")
    if "big=1" in environ.get("QUERY_STRING", ""):
        for _ in range(200):
            print("x" * 1000)
        sys.stdout.flush()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"chatty"]
