"""`forkwsgi --ini uwsgi.ini` (issue 25, items 13 and 15): a uWSGI ini file's
options, checked on a running server where they can be seen (workers and
threads in the stats document, the bind, the environment the app sees, the
listen queue, a harakiri, the request line buffer-size lets through), and
the verdicts of --check-config / --print-config where they cannot.

On dac5946 `--ini uwsgi.ini` was read as --initgroups (argparse's
abbreviations) and the app as 'uwsgi.ini': every server here fails to start.
"""
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from conftest import HERE, ServerProc
from httpraw import Closed, Conn, free_port, unsanitized_env, wait_for

APP_MODES = ("inline",)

# A Django-shaped project: the package, its settings module, its wsgi.py.
WSGI_PY = '''
import json, os, sys, threading, time

def application(environ, start_response):
    if environ["PATH_INFO"] == "/sleep":
        time.sleep(float(environ["QUERY_STRING"]))
    body = json.dumps({
        "pid": os.getpid(), "cwd": os.getcwd(), "module": __name__,
        "settings": os.environ.get("DJANGO_SETTINGS_MODULE"), "from_env": os.environ.get("FROM_ENV"),
        "multithread": environ["wsgi.multithread"], "query_len": len(environ["QUERY_STRING"]),
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
'''

# What a Django project's uwsgi.ini looks like (placeholders, %d, $(VAR)
# included); the port is 0 so that tests do not collide.
DJANGO_INI = """\
[uwsgi]
# mysite's uWSGI configuration
project = mysite
chdir = %d
module = %(project).wsgi:application
master = true
processes = 2
threads = 3
enable-threads = true
http-socket = 127.0.0.1:0
harakiri = 30
max-requests = 5000
listen = 128
env = DJANGO_SETTINGS_MODULE=%(project).settings
env = FROM_ENV=$(UWSGI_INI_TEST_VALUE)
vacuum = true
die-on-term = true
stats = %dstats.sock
buffer-size = 32768
"""


def project(tmp_path, ini_text, name="uwsgi.ini"):
    """The project directory: mysite/ and the ini file; returns the ini's path."""
    pkg = tmp_path / "mysite"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text("DEBUG = False\n")
    (pkg / "wsgi.py").write_text(WSGI_PY)
    ini = tmp_path / name
    ini.write_text(ini_text)
    return str(ini)


def start(ini, *args, env=None):
    """A server from the ini alone: no app, no --bind on the command line."""
    return ServerProc(None, "--ini", ini, *args, bind=[], env=env)


def run_cli(*args, env=None, cwd=HERE):
    e = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "forkwsgi", *args], capture_output=True, text=True,
                       timeout=30, env=e, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def printed(out):
    """--print-config's lines: name -> (value text, origin)."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"(\w+)\s+= (.*)  \((.*)\)$", line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3))
    return found


def stats(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        with s.makefile("rb") as f:
            return json.load(f)


def get(port, target="/", timeout=10):
    with Conn(port, timeout=timeout) as c:
        c.send(f"GET {target} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        return c.read_response()


def test_a_django_uwsgi_ini_serves_as_configured(tmp_path):
    ini = project(tmp_path, DJANGO_INI)
    s = start(ini, env={"UWSGI_INI_TEST_VALUE": "from-the-environment"})
    try:
        r = get(s.port)
        assert r.status == 200
        seen = json.loads(r.body)
        assert seen["module"] == "mysite.wsgi"                      # module, with %(project)
        assert seen["cwd"] == str(tmp_path)                         # chdir = %d
        assert seen["settings"] == "mysite.settings"                # env, set before the import
        assert seen["from_env"] == "from-the-environment"           # $(VAR)
        assert seen["multithread"] is True                          # threads = 3
        doc = stats(str(tmp_path / "stats.sock"))                   # stats = %dstats.sock
        assert len(doc["workers"]) == 2                             # processes = 2
        # threads = 3: three cores, and the worker's loop thread once it ran
        # a request itself (--inline-first).
        assert all([c["id"] for c in w["cores"]] in ([0, 1, 2], [0, 1, 2, 3]) for w in doc["workers"])
        assert doc["sockets"][0]["name"] == f"http://127.0.0.1:{s.port}"    # http-socket
        assert doc["sockets"][0]["max_queue"] == 128                 # listen = 128
        # buffer-size = 32768: a 20 KB request line is served (uWSGI serves it).
        r = get(s.port, "/?" + "q" * 20000)
        assert r.status == 200 and json.loads(r.body)["query_len"] == 20000
        # uWSGI logs every request (no disable-logging): an access line.
        assert wait_for(lambda: '"GET / HTTP/1.1" 200' in s.log(), 5)
        assert "WARNING" not in s.log()                             # every option maps
    finally:
        s.stop()


def test_the_settings_of_the_django_ini(tmp_path):
    """What cannot be seen from outside (or takes too long to): the values
    and where each came from."""
    ini = project(tmp_path, DJANGO_INI)
    rc, out, err = run_cli("--ini", ini, "--print-config")
    assert rc == 0, err
    got = printed(out)
    where = f"ini file {ini}"
    assert got["app"] == ("'mysite.wsgi:application'", where)
    for name, value, key in (("workers", "2", "processes"), ("threads", "3", "threads"),
                             ("timeout", "30.0", "harakiri"), ("max_requests", "5000", "max-requests"),
                             ("backlog", "128", "listen"), ("bind", "['127.0.0.1:0']", "http-socket"),
                             ("limit_request_line", "32768", "buffer-size"),
                             ("limit_request_head", "65536", "buffer-size"),
                             ("chdir", repr(str(tmp_path) + "/"), "chdir"),
                             ("stats", repr(f"unix:{tmp_path}/stats.sock"), "stats")):
        assert got[name] == (value, f"{where}: {key}"), name
    assert got["ini"] == (repr(ini), "command line")


@pytest.mark.parametrize("buffer_size, status", [(None, 414), ("32768", 200), ("4096", 414)])
def test_buffer_size_covers_the_request_line(tmp_path, buffer_size, status):
    """Item 15: buffer-size bounds uWSGI's whole request head, the request
    line included: 32768 lets a 20 KB line through, where forkwsgi's
    --limit-request-line (8190) answers 414 (uWSGI itself: see
    test_the_same_ini_under_uwsgi_and_forkwsgi); a buffer-size below
    forkwsgi's limits leaves them as they are."""
    text = "[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nhttp-socket = 127.0.0.1:0\n"
    if buffer_size:
        text += f"buffer-size = {buffer_size}\n"
    s = start(project(tmp_path, text))
    try:
        assert get(s.port, "/?" + "q" * 20000).status == status
        assert get(s.port, "/?" + "q" * 8000).status == 200
    finally:
        s.stop()


def test_harakiri_retires_a_stuck_worker(tmp_path):
    text = ("[uwsgi]\nchdir = %d\nmodule = mysite.wsgi:application\nmaster = 1\nprocesses = 1\n"
            "http-socket = 127.0.0.1:0\nharakiri = 1\n")
    s = start(project(tmp_path, text))
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 1)
        first = s.worker_pids()
        answer = []

        def ask():
            try:
                answer.append(get(s.port, "/sleep?4", timeout=15).status)
            except (OSError, Closed) as e:
                answer.append(type(e).__name__)
        stuck = threading.Thread(target=ask)
        stuck.start()
        # The master logs the stuck request and starts a replacement at once.
        assert wait_for(lambda: "timed out" in s.log() and "(--timeout 1)" in s.log(), 8), s.log()
        assert wait_for(lambda: set(s.worker_pids()) - set(first), 5)
        r = get(s.port)
        assert r.status == 200 and json.loads(r.body)["pid"] not in first
        stuck.join(15)
        # uWSGI's harakiri kills the worker, the stuck request with it: so
        # does forkwsgi with one app thread (no 200 after the 4 s sleep).
        assert answer and answer[0] != 200, answer
    finally:
        s.stop()


def test_wsgi_file_callable_pythonpath_and_a_unix_socket(tmp_path):
    """wsgi-file (any suffix) with callable; pythonpath (repeated) before
    the import; http-socket on a path with chmod-socket."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "greeting.py").write_text("TEXT = b'hello from lib'\n")
    (tmp_path / "app.wsgi").write_text(
        "import greeting\n"
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Length', str(len(greeting.TEXT)))])\n"
        "    return [greeting.TEXT]\n")
    sock = tmp_path / "app.sock"
    text = ("[uwsgi]\nwsgi-file = %dapp.wsgi\ncallable = app\npythonpath = %dnothing-here\n"
            f"pythonpath = %dlib\nhttp-socket = {sock}\nchmod-socket = 660\nprocesses = 1\n")
    s = start(project(tmp_path, text))
    try:
        assert s.unix_path == str(sock)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        with Conn(None, path=str(sock)) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            r = c.read_response()
        assert r.status == 200 and r.body == b"hello from lib"
    finally:
        s.stop()


def test_logto_takes_the_server_log_and_the_request_lines(tmp_path):
    """logto = FILE: the server's log and, as uWSGI logs each request, the
    access lines in that file; and, as uWSGI, what the app writes to its
    standard output and error (it stayed on the console before)."""
    text = "[uwsgi]\nchdir = %d\nmodule = printing\nhttp-socket = 127.0.0.1:0\nlogto = %dlogs/app.log\n"
    (tmp_path / "printing.py").write_text(
        "import sys\n"
        "print('PRINTED-AT-IMPORT', flush=True)\n"
        "def application(environ, start_response):\n"
        "    print('PRINTED-BY-REQUEST', flush=True)\n"
        "    sys.stderr.write('WRITTEN-TO-STDERR\\n')\n"
        "    start_response('200 OK', [('Content-Length', '2')])\n"
        "    return [b'ok']\n")
    (tmp_path / "logs").mkdir()
    logfile = tmp_path / "logs" / "app.log"
    s = ServerProc(None, "--ini", project(tmp_path, text), bind=[], wait=False)
    try:
        def port():
            m = re.search(r"Listening at: http://127.0.0.1:(\d+)", logfile.read_text() if logfile.exists() else "")
            return int(m.group(1)) if m else None
        assert wait_for(port, 20)
        assert get(port()).status == 200
        assert wait_for(lambda: '"GET / HTTP/1.1" 200' in logfile.read_text(), 5)
        assert wait_for(lambda: "WRITTEN-TO-STDERR" in logfile.read_text(), 5), logfile.read_text()
        log = logfile.read_text()
        assert "PRINTED-AT-IMPORT" in log and "PRINTED-BY-REQUEST" in log, log
        assert "Listening at" not in s.log() and "PRINTED" not in s.log(), s.log()
    finally:
        s.stop()


def test_another_section(tmp_path):
    """uWSGI's FILE:SECTION; a section the file does not have stops it."""
    text = DJANGO_INI + ("\n[staging]\nchdir = %d\nmodule = mysite.wsgi\nprocesses = 1\n"
                         "http-socket = 127.0.0.1:0\nenv = DJANGO_SETTINGS_MODULE=staging.settings\n")
    ini = project(tmp_path, text)
    s = start(ini + ":staging")
    try:
        assert json.loads(get(s.port).body)["settings"] == "staging.settings"
        assert len(s.worker_pids()) == 1
    finally:
        s.stop()
    rc, out, err = run_cli("--ini", ini + ":production", "--check-config")
    assert rc == 2
    assert err.strip() == f"forkwsgi: error: ini file {ini} has no [production] section (its sections: " \
                          "[uwsgi], [staging])"


def test_options_without_counterpart_typos_and_unknown_names_are_warned_of(tmp_path):
    text = ("[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nhttp-socket = 127.0.0.1:0\n"
            "proccesses = 4\n"                       # a typo
            "cheaper = 2\n"                          # uWSGI's, no counterpart (every worker runs)
            "offload-threads = 4\n"                  # accepted: the C core sends files itself
            "frobnicate = 1\n"                       # nobody's
            "base = shop\nprocname = %(base)\n"      # a placeholder in use: silent
            "disable-logging = true\n")
    ini = project(tmp_path, text)
    s = start(ini)
    try:
        assert get(s.port).status == 200
        log = s.log()
        warnings = [l for l in log.splitlines() if "[WARNING]" in l]
        assert any("'proccesses' is not a uWSGI option: ignored (did you mean processes?)" in l for l in warnings)
        assert any("'cheaper' (uWSGI) has no counterpart here: ignored; --workers N" in l for l in warnings)
        assert any("'procname' (uWSGI) has no counterpart here: ignored; --name NAME" in l for l in warnings)
        assert any("'frobnicate' is no uWSGI option forkwsgi takes: ignored" in l for l in warnings)
        assert not any("'base'" in l or "offload-threads" in l for l in warnings)
        assert len(warnings) == 4, warnings
        time.sleep(0.5)
        assert "GET / HTTP/1.1" not in s.log()               # disable-logging: no access log
    finally:
        s.stop()
    # --check-config: what start-up warns of is an error there (exit 1).
    rc, out, err = run_cli("--ini", ini, "--check-config")
    assert rc == 1
    assert "did you mean processes?" in err and "'cheaper'" in err


def test_check_config_verdicts(tmp_path):
    ini = project(tmp_path, DJANGO_INI)
    rc, out, err = run_cli("--ini", ini, "--check-config")
    assert (rc, err) == (0, "")
    assert out.strip() == "forkwsgi: configuration OK (mysite.wsgi:application)"

    def verdict(extra):
        path = tmp_path / "bad.ini"
        path.write_text(DJANGO_INI + extra)
        return run_cli("--ini", str(path), "--check-config")

    for extra, needle in (("processes = many\n", "invalid value for -w (ini file"),
                          ("https-socket = :8443,cert.pem,key.pem\n", "terminate it in the proxy in front"),
                          # strict: uWSGI's too refuses a name that is no option (a placeholder
                          # must be declared with set-placeholder)
                          ("strict = true\n", "'project' is not a uWSGI option (strict = true"),
                          ("wsgi-file = app.py\n", "module and wsgi-file are both given")):
        rc, out, err = verdict(extra)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and needle in lines[0], (extra, err)
    rc, out, err = verdict("master = false\n")
    assert rc == 1 and "always run under a master" in err


def test_socket_is_the_uwsgi_protocol(tmp_path):
    """socket = speaks the uwsgi protocol: the uwsgi_socket setting when
    this forkwsgi has one, else a refusal at start (never HTTP where nginx's
    uwsgi_pass would talk uwsgi to it)."""
    from forkwsgi import config
    ini = project(tmp_path, DJANGO_INI + f"socket = {tmp_path}/uwsgi.sock\n")
    if "uwsgi_socket" in config.BY_NAME:
        rc, out, err = run_cli("--ini", ini, "--print-config")
        assert rc == 0 and f"{tmp_path}/uwsgi.sock" in printed(out)["uwsgi_socket"][0]
        return
    rc, out, err = run_cli("--ini", ini)
    assert rc == 2
    assert err.strip() == (f"forkwsgi: error: ini file {ini}: socket = {tmp_path}/uwsgi.sock: the uwsgi protocol is "
                           "not available in this forkwsgi: use http-socket (and nginx's proxy_pass instead of "
                           "uwsgi_pass)")


def test_authority_command_line_then_environment_then_ini(tmp_path):
    ini = project(tmp_path, DJANGO_INI)
    conf = tmp_path / "conf.py"
    conf.write_text("threads = 7\n")

    def setting(name, *args, env=None):
        rc, out, err = run_cli("--ini", ini, *args, "--print-config", env=env)
        assert rc == 0, err
        return printed(out)[name]

    assert setting("workers") == ("2", f"ini file {ini}: processes")
    assert setting("workers", env={"FORKWSGI_WORKERS": "3"}) == ("3", "FORKWSGI_WORKERS")
    assert setting("workers", "--workers", "4", env={"FORKWSGI_WORKERS": "3"}) == ("4", "command line")
    assert setting("threads", "-c", str(conf)) == ("7", f"config file {conf}")     # -c over the ini
    assert setting("app", "apps:echo") == ("'apps:echo'", "command line")


def test_uwsgi_value_syntax(tmp_path):
    """Booleans (anything but false/off/no/0 is true, the bare name too),
    repeated keys (the last one wins; lists add up), magic variables, $(VAR)
    with defaults, %(option) references, comments."""
    text = ("[uwsgi]\n; a comment\n# another\nchdir = %d\nmodule = mysite.wsgi\n"
            "lazy-apps\n"                                      # no '=': true
            "processes = 2\nprocesses = 3\n"
            "http-socket = 127.0.0.1:0\nhttp = 127.0.0.1:0\n"
            "env = A=$(UNSET_VAR_FOR_TEST:-fallback)\nenv = B=%n.%e\n"
            "name = shop\npidfile = /tmp/%(name).pid\n"
            "uid = 0\ngid = 0\nreload-on-rss = 200.5\nthunder-lock = yes\n")
    ini = project(tmp_path, text, name="site.ini")
    rc, out, err = run_cli("--ini", ini, "--print-config")
    assert rc == 0, err
    got = {k: v for k, (v, _) in printed(out).items()}
    assert got["lazy_apps"] == "True" and got["workers"] == "3"
    assert got["bind"] == "['127.0.0.1:0', '127.0.0.1:0']"
    assert got["raw_env"] == "['A=fallback', 'B=site.ini']"
    assert got["pidfile"] == "'/tmp/shop.pid'"
    assert (got["user"], got["group"], got["max_rss"]) == ("'0'", "'0'", "201")


def test_ini_in_forkwsgi_ini_variable(tmp_path):
    ini = project(tmp_path, DJANGO_INI)
    rc, out, err = run_cli("--print-config", env={"FORKWSGI_INI": ini})
    assert rc == 0, err
    assert printed(out)["ini"] == (repr(ini), "FORKWSGI_INI")
    assert printed(out)["workers"][0] == "2"


def test_abbreviations_are_off():
    """argparse took --ini for --initgroups, and --back for --backlog: each
    flag is only its own full name now."""
    rc, out, err = run_cli("apps:echo", "--back", "64", "--print-config")
    assert rc == 2 and "unrecognized arguments: --back" in err


UWSGI = shutil.which("uwsgi")


class Uwsgi:
    """The real uWSGI (Debian's uwsgi-core and uwsgi-plugin-python3) on an ini file."""

    def __init__(self, ini, port):
        self.log = open(ini + ".uwsgi.log", "wb")
        # Not under `make asan-ext`'s preloaded ASan: it reports uWSGI's own
        # overreads (magic_sub reading its ini path) and aborts it.
        self.proc = subprocess.Popen([UWSGI, "--ini", ini], stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=os.path.dirname(ini), env=unsanitized_env())
        self.port = port
        ok = wait_for(lambda: self.proc.poll() is not None or _accepts(port), 20)
        if not ok or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"uWSGI did not start: {open(ini + '.uwsgi.log').read()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)          # uWSGI stops at once on SIGINT
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def _accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def status_of(port, target):
    """The status of a GET, or None where the server closes without one."""
    try:
        return get(port, target).status
    except (OSError, Closed):
        return None


@pytest.mark.skipif(not UWSGI, reason="needs uWSGI (Debian: uwsgi-core uwsgi-plugin-python3)")
def test_the_same_ini_under_uwsgi_and_forkwsgi(tmp_path):
    """One ini, the real uWSGI and forkwsgi each on it: the same app, the
    same environment, and a 12 KB request line served by both with
    buffer-size = 32768 (item 15: forkwsgi answered 414 where uWSGI served
    it). uWSGI's buffer holds the line about twice (REQUEST_URI, and
    QUERY_STRING or PATH_INFO): 32768 serves up to some 16 KB there, and
    forkwsgi, whose limit becomes 32768 for the line itself, serves more."""
    text = ("[uwsgi]\nplugins = python3\nchdir = %d\nmodule = mysite.wsgi\nmaster = true\nprocesses = 1\n"
            "http-socket = 127.0.0.1:{port}\nenv = DJANGO_SETTINGS_MODULE=mysite.settings\n"
            "buffer-size = 32768\ndie-on-term = true\n")
    answers = {}
    for server in ("uwsgi", "forkwsgi"):
        port = free_port()
        ini = project(tmp_path, text.format(port=port), name=f"{server}.ini")
        s = Uwsgi(ini, port) if server == "uwsgi" else start(ini)
        try:
            r = get(port)
            seen = json.loads(r.body)
            answers[server] = (r.status, seen["settings"], seen["cwd"], seen["module"],
                               status_of(port, "/?" + "q" * 12000), status_of(port, "/?" + "q" * 9000))
        finally:
            s.stop()
    assert answers["uwsgi"] == answers["forkwsgi"] == (200, "mysite.settings", str(tmp_path), "mysite.wsgi",
                                                      200, 200)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a socket to another user needs root")
def test_chown_socket_gives_the_socket_to_nginxs_user(tmp_path):
    """Hostile review (uWSGI migration): chown-socket = www-data:www-data
    with chmod-socket = 660 was warned of and ignored, so the socket stayed
    root's and nginx (as www-data) got 502 on every request. Now the socket
    is theirs (--chown-socket), and such a user connects."""
    import pwd
    import shutil
    import tempfile
    open_dir = tempfile.mkdtemp(prefix="forkwsgi-chown-")      # nobody reaches it (tmp_path's parents: no)
    os.chmod(open_dir, 0o755)
    sock = os.path.join(open_dir, "app.sock")
    text = ("[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nprocesses = 1\n"
            f"http-socket = {sock}\nchmod-socket = 660\nchown-socket = nobody:nogroup\n")
    s = ServerProc(None, "--ini", project(tmp_path, text), bind=[], wait=False)
    try:
        assert wait_for(lambda: os.path.exists(sock) and "Booted worker" in s.log(), 20), s.log()
        st = os.stat(sock)
        nobody = pwd.getpwnam("nobody")
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (nobody.pw_uid, nobody.pw_gid, 0o660)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                        # the client, as nobody (nginx as www-data)
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                c = socket.socket(socket.AF_UNIX)
                c.settimeout(10)
                c.connect(sock)
                c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                os.write(w, c.recv(12))
            except BaseException as e:
                os.write(w, repr(e).encode()[:200])
            finally:
                os._exit(0)
        os.close(w)
        got = b""
        while True:
            chunk = os.read(r, 256)
            if not chunk:
                break
            got += chunk
        os.close(r)
        os.waitpid(pid, 0)
        assert got.startswith(b"HTTP/1.1 200"), got
    finally:
        s.stop()
        shutil.rmtree(open_dir, ignore_errors=True)
    rc, out, err = run_cli("--ini", project(tmp_path, text.replace("nobody:nogroup", "no-such-user")),
                           "--check-config")
    assert rc != 0 and "chown" in err and "no such user" in err, (rc, err)
