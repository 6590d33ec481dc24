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
    elif path == "/status-nonlatin":
        start_response("200 \u20ac", [])
    else:
        start_response("404 Not Found", [])
    return [b"body"]
