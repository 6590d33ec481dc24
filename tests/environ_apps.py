"""Apps for test_environ_keep.py: what an app may do to its environ.

    /?m=WHAT[&...]   answers the environ's entries as JSON (the str ones,
                     and the type names of the others), as the app got it,
                     then does WHAT to it:
        add          environ["x.added"] = 1
        del          del environ["SCRIPT_NAME"]
        set          environ["PATH_INFO"] = "/changed"
        same         environ["PATH_INFO"] = environ["PATH_INFO"] (the same value)
        pop          environ.pop("QUERY_STRING")
        clear        environ.clear()
        update       environ.update(SERVER_NAME="elsewhere")
        setdefault   environ.setdefault("x.default", 1)
        popitem      environ.popitem()
        keep         keeps the environ (a module list) and answers as usual
        kept         answers the environ the last "keep" kept, instead
        poke         changes HTTP_ACCEPT of the other environs it finds through gc
        none         nothing
"""
import gc
import json

_kept = []


def dump(environ):
    return {k: v if isinstance(v, str) else type(v).__name__ for k, v in environ.items()}


def app(environ, start_response):
    q = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
    what = q.get("m", "none")
    body = json.dumps({"env": dump(_kept[-1] if what == "kept" and _kept else environ),
                       "same_as_kept": bool(_kept) and _kept[-1] is environ}).encode()
    if what == "add":
        environ["x.added"] = 1
    elif what == "del":
        del environ["SCRIPT_NAME"]
    elif what == "set":
        environ["PATH_INFO"] = "/changed"
    elif what == "same":
        environ["PATH_INFO"] = environ["PATH_INFO"]
    elif what == "pop":
        environ.pop("QUERY_STRING")
    elif what == "clear":
        environ.clear()
    elif what == "update":
        environ.update(SERVER_NAME="elsewhere")
    elif what == "setdefault":
        environ.setdefault("x.default", 1)
    elif what == "popitem":
        environ.popitem()
    elif what == "keep":
        _kept.append(environ)
    elif what == "poke":
        # Another environ the process holds (one the server keeps for a
        # later request), found through gc: its HTTP_ACCEPT changed. This
        # one changes too, so that it is not kept in its place.
        for o in gc.get_objects():
            if type(o) is dict and o is not environ and "wsgi.input" in o and "HTTP_ACCEPT" in o:
                o["HTTP_ACCEPT"] = "poked"
        environ["x.poked"] = 1
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
