"""Apps that do what frameworks do at the edges of the WSGI contract: set
their own Date, answer HEAD with an empty body, crash mid-request
(tests/test_response.py, tests/test_prefork.py)."""
import os
import signal
import time

import apps

APP_DATE = "Tue, 01 Jan 2019 00:00:00 GMT"


def own_date(environ, start_response):
    """Sends its own Date (as Werkzeug's make_conditional does): /list has a
    list body, any other path streams."""
    start_response("200 OK", [("Content-Type", "text/plain"), ("date", APP_DATE)])
    if environ["PATH_INFO"] == "/list":
        return [b"dated"]
    return iter([b"dat", b"ed"])


def head_like_werkzeug(environ, start_response):
    """GET streams with no length; HEAD gets an empty body with the same
    headers, as Werkzeug's Response.get_app_iter does: / returns an empty
    list, /iter an exhausted iterator."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    if environ["REQUEST_METHOD"] == "HEAD":
        return [] if environ["PATH_INFO"] == "/" else iter(())
    return iter([b"streamed ", b"body"])


def flask_files():
    """Flask's send_file (its conditional responses carry a Date) and a
    streamed response, for the Date and HEAD rules with a real framework."""
    from flask import Flask, Response, request, send_file

    app = Flask("forkwsgi_quirks")

    @app.get("/file")
    def file():
        return send_file(request.args["path"])

    @app.get("/stream")
    def stream():
        return Response(iter([b"part 1\n", b"part 2\n"]), mimetype="text/plain")

    return app


def crash(environ, start_response):
    """/kill: the worker is SIGKILLed mid-request; /exit: it exits with 5;
    /wait?t=S: sleeps S seconds (at most 30) first."""
    apps.entered(environ)
    if environ["PATH_INFO"] == "/wait":
        time.sleep(min(float(environ["QUERY_STRING"].partition("t=")[2] or 1), 30))
    if environ["PATH_INFO"] == "/kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if environ["PATH_INFO"] == "/exit":
        os._exit(5)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"alive"]
