"""start_response called in the ways PEP 3333 allows (tests/test_start_response.py)."""


class Str(str):
    pass


kept = {}       # objects an app keeps past its request (/keep-write, /global-list)


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/kw":
        start_response(status="201 Created", headers=[("Content-Type", "text/plain")])
    elif path == "/kw-exc":
        start_response("202 Accepted", exc_info=None, headers=[("Content-Type", "text/plain")])
    elif path == "/three":
        start_response("200 OK", [("Content-Type", "text/plain")], None)
    elif path == "/tuple":
        start_response("200 OK", (("Content-Type", "text/plain"), ("X-T", "1")))
    elif path == "/mutate":
        headers = [("Content-Type", "text/plain"), ("X-Kept", "1")]
        start_response("200 OK", headers)
        headers[1] = ("X-Changed", "1")
        headers.append(("X-Late", "1"))
    elif path == "/global-list":
        # Held by a module global, not a local: still the app's to change.
        kept["headers"] = [("Content-Type", "text/plain"), ("X-Kept", "1")]
        start_response("200 OK", kept["headers"])
        kept["headers"].append(("X-Late", "1"))
    elif path == "/borrowed-list":
        # As a caller in C passes a list it still holds (Cython, mypyc, an
        # extension): a borrowed reference, so the list's reference count
        # says no one else holds it. The list lives in a ctypes array only.
        import ctypes
        args = (ctypes.py_object * 2)("200 OK", [("Content-Type", "text/plain")])
        call = ctypes.pythonapi.PyObject_Vectorcall
        call.restype = ctypes.py_object
        call.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        call(start_response, ctypes.addressof(args), 2, None)
        args[1].append(("X-Late", "1"))
        args[1].append(("X-Split", "a\r\nInjected: yes"))     # never checked, if kept
    elif path == "/keep-write":
        kept["write"] = start_response("200 OK", [("Content-Type", "text/plain")])
    elif path == "/old-write":
        # The write() of an ended request: it must raise, and never write
        # into this response.
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            kept["write"](b"stale bytes")
        except Exception as e:
            return [type(e).__name__.encode()]
        return [b"written"]
    elif path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"by ")
        write(b"write")
        return []
    elif path == "/subclass":
        start_response(Str("200 OK"), [(Str("X-Sub"), Str("v"))])
    elif path == "/latin1":
        start_response("200 OK", [("X-Latin", "caf\xe9")])
    elif path == "/nonlatin":
        start_response("200 OK", [("X-Euro", "\u20ac")])
    elif path == "/bytes":
        start_response("200 OK", [(b"X-Bytes", "1")])
    elif path == "/value-matrix":
        return value_matrix(start_response)
    elif path in ("/exc-bad-name", "/exc-bad-length"):
        # A second call with exc_info that raises: the app catches the
        # error and answers with its first head (a bad name), or with none
        # (a bad Content-Length: the first head is gone by then).
        start_response("200 OK", [("X-First", "1")])
        bad = ("Bad Name", "2") if path == "/exc-bad-name" else ("Content-Length", "zz")
        try:
            replace_with(start_response, "500 Oops", [bad])
        except ValueError:
            pass
    elif path == "/lazy-exc-bad":
        return lazy_exc_bad(start_response)
    elif path == "/status-nonlatin":
        start_response("200 \u20ac", [])
    else:
        start_response("404 Not Found", [])
    return [b"body"]


def value_matrix(start_response):
    """Header values of 1 to 24 characters with one byte to judge at each
    position: control characters must be refused (ValueError in the app),
    HTAB, space, printable and latin-1 bytes accepted. start_response is
    called again with exc_info (allowed until the head is sent). The body
    lists every case judged wrongly."""
    import sys
    bad, good = (0x00, 0x01, 0x0a, 0x0d, 0x1f, 0x7f), (0x09, 0x20, 0x7e, 0x80, 0xff)
    try:
        raise RuntimeError("to call start_response again")
    except RuntimeError:
        exc = sys.exc_info()
    wrong = []
    for n in range(1, 25):
        for pos in range(n):
            for b in bad + good:
                value = "v" * pos + chr(b) + "w" * (n - pos - 1)
                try:
                    start_response("200 OK", [("X-V", value)], exc)
                    accepted = True
                except ValueError:
                    accepted = False
                if accepted != (b in good):
                    wrong.append(f"len {n} at {pos}: {b:#04x}")
    start_response("200 OK", [("Content-Type", "text/plain")], exc)
    return [("wrong: " + "; ".join(wrong)).encode() if wrong else b"all judged right"]


def replace_with(start_response, status, headers):
    import sys
    try:
        raise RuntimeError("to call start_response again")
    except RuntimeError:
        start_response(status, headers, sys.exc_info())


def lazy_exc_bad(start_response):
    """start_response called in the body's first iteration (PEP 3333
    allows it), then again with exc_info and a value with a CR."""
    start_response("200 OK", [("X-First", "1")])
    try:
        replace_with(start_response, "500 Oops", [("X-Bad", "a\rb")])
    except ValueError:
        pass
    yield b"gbody"
