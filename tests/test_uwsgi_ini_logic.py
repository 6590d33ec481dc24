"""`forkwsgi --ini`: what a migrating user's uWSGI ini relies on, where
forkwsgi served differently behind a warning (or none). Every uWSGI option
gets uWSGI 2.0's behaviour here, or stops the server at start with one
line: @(FILE) / @(exec://CMD) placeholders, config logic (if-env ...
endif), ini includes, protocol = http, uWSGI's defaults where they differ
from forkwsgi's (no harakiri: no timeout; 60 s of reload mercy; unix
sockets under the process's umask; no address: no start), and the options
refused because what they do would silently not be done (routes, static
maps, mules, hooks, touch-reload, ...). uWSGI itself (2.0.21) is the
reference where it is installed: see test_uwsgi_reads_the_same_values.
"""
import json
import os
import re
import shutil
import signal
import stat
import subprocess

import pytest

from httpraw import Conn, free_port, unsanitized_env
from test_uwsgi_ini import get, printed, project, run_cli, start

from forkwsgi import config, uwsgi_compat, uwsgi_ini

APP_MODES = ("inline",)

BASE = "[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nprocesses = 1\nhttp-socket = 127.0.0.1:0\n"


def settings_of(ini, *args, env=None):
    """--print-config's values and origins for the ini file."""
    rc, out, err = run_cli("--ini", ini, *args, "--print-config", env=env)
    assert rc == 0, err
    return printed(out)


def refusal(ini, *args, env=None):
    """The one line the server stops with (exit 2) on --check-config and
    on a plain start."""
    for mode in (("--check-config",), ()):
        rc, out, err = run_cli("--ini", ini, *args, *mode, env=env)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("forkwsgi: error: "), (mode, rc, err)
    return lines[0]


def translated(ini, environ=None):
    """translate() of the ini file on disk."""
    return uwsgi_compat.translate(uwsgi_ini.Ini(ini, environ or {}), config.defaults(), config.typo_of)


# 1. @(FILE), @(exec://CMD)

def test_at_file_is_the_file_content_on_a_running_server(tmp_path):
    """env = FROM_ENV=@(FILE): the app sees the file's content, less one
    trailing newline (uWSGI's), not the text '@(...)'."""
    (tmp_path / "secret").write_text("s3cret-pw\n")
    ini = project(tmp_path, BASE + "env = FROM_ENV=@(%dsecret)\n")
    s = start(ini)
    try:
        assert json.loads(get(s.port).body)["from_env"] == "s3cret-pw"
    finally:
        s.stop()


def test_at_placeholders_in_uwsgi_order(tmp_path):
    """$() is expanded before @() (@($(VAR)) reads the file the variable
    names), %() after it; one trailing newline is dropped, no more;
    @(exec://CMD) is the command's output (sh -c)."""
    (tmp_path / "two").write_text("line1\nline2\n\n")
    (tmp_path / "name").write_text("shop\n")
    text = ("[uwsgi]\nhttp-socket = 127.0.0.1:0\nmodule = mysite.wsgi\n"
            "env = A=@($(SECRET_FILE))\nenv = B=@(exec://echo out a b | tr ' ' -)\n"
            "base = @(%dname)\nenv = C=%(base)\n")
    got = settings_of(project(tmp_path, text), env={"SECRET_FILE": str(tmp_path / "two")})
    assert got["raw_env"][0] == repr(["A=line1\nline2\n", "B=out-a-b", "C=shop"])


@pytest.mark.parametrize("value, needle", [
    ("@(%dmissing.txt)", "missing.txt: No such file or directory"),
    ("@(http://example.com/pw)", "uWSGI's http:// is not read here"),
    ("@(data://cGFzcw==)", "uWSGI's data:// is not read here"),
    ("@(sym://secret)", "uWSGI's sym:// is not read here"),
    ("@(section://other)", "uWSGI's section:// is not read here"),
    ("@(fd://3)", "uWSGI's fd:// is not read here"),
    ("@(exec://exit 3)", "the command exits with status 3"),
])
def test_at_placeholders_that_cannot_be_read_stop_the_server(tmp_path, value, needle):
    ini = project(tmp_path, BASE + f"env = SECRET={value}\n")
    line = refusal(ini)
    assert needle in line and f"ini file {ini}" in line, line


# 2. Config logic

LOGIC_INI = BASE + """\
harakiri = 30
if-env = DEV
processes = 3
harakiri = 0
env = MODE=dev-%(_)
endif =
if-not-env = DEV
env = MODE=production
endif
if-env = STAGE=blue
env = COLOUR=%(_)
endif
if-exists = %dmysite
env = HAS_PKG=%(_)
end-if =
if-not-file = %dmysite
env = NOT_FILE=yes
endif
if-dir = %dnowhere
env = NEVER=1
endif
if-opt = harakiri=30
env = OPT=%(_)
endif
"""


def test_if_blocks_apply_only_when_their_condition_holds(tmp_path):
    """A dev-only block (processes = 3, harakiri = 0) is not applied in
    production: the options of a block whose condition fails are dropped,
    as uWSGI drops them; %(_) in a block is the value tested."""
    ini = project(tmp_path, LOGIC_INI)
    prod = settings_of(ini)
    assert prod["workers"][0] == "1" and prod["timeout"][0] == "30.0"
    assert prod["raw_env"][0] == repr(["MODE=production", f"HAS_PKG={tmp_path}/mysite", "NOT_FILE=yes",
                                       "OPT=30"])
    dev = settings_of(ini, env={"DEV": "yes", "STAGE": "blue"})
    assert dev["workers"][0] == "3" and dev["timeout"][0] == "0.0"
    assert dev["raw_env"][0] == repr(["MODE=dev-yes", "COLOUR=blue", f"HAS_PKG={tmp_path}/mysite", "NOT_FILE=yes",
                                      "OPT=30"])
    # if-env VAR holds when VAR is set, empty too (uWSGI's getenv()).
    assert settings_of(ini, env={"DEV": ""})["workers"][0] == "3"
    assert settings_of(ini, env={"STAGE": "green"})["raw_env"][0].count("COLOUR") == 0


def test_if_env_on_a_running_server(tmp_path):
    ini = project(tmp_path, BASE + "if-env = UWSGI_TEST_DEV\nenv = FROM_ENV=dev\nendif\n")
    s = start(ini)
    try:
        assert json.loads(get(s.port).body)["from_env"] is None
    finally:
        s.stop()


@pytest.mark.parametrize("block, needle", [
    ("if-env = HOME\nprocesses = 2\n", "if-env = HOME has no endif"),
    ("if-env = HOME\nif-env = PATH\nprocesses = 2\nendif\nendif\n", "uWSGI nests no config logic"),
    ("if-env = NOPE\nif-env = PATH\nendif\nendif\n", "uWSGI nests no config logic"),
    ("if-env = HOME\nprocesses = 2\nelse\nprocesses = 3\nendif\n", "uWSGI 2.0 has no else"),
    ("for = a b\nenv = X=%(_)\nendfor\n", "for = a b: this config logic is not evaluated here"),
    ("if-reload =\nprocesses = 2\nendif\n", "if-reload = : this config logic is not evaluated here"),
    ("if-hostname = web1\nprocesses = 2\nendif\n", "if-hostname = web1: this config logic"),
])
def test_config_logic_not_evaluated_stops_the_server(tmp_path, block, needle):
    line = refusal(project(tmp_path, BASE + block))
    assert needle in line, line


# 3. Options whose absence would change what is served: refused

@pytest.mark.parametrize("option, needle", [
    ("route = ^/admin break:403", "access rules, rewrites and headers belong to the proxy"),
    ("route-if = equal:${REMOTE_ADDR};1.2.3.4 break:403", "uWSGI's internal routing"),
    ("route-uri = ^/x break:403", "uWSGI's internal routing"),
    ("route-host = ^a$ break:403", "uWSGI's internal routing"),
    ("response-route = ^/ addheader:X-A: 1", "uWSGI's internal routing"),
    ("final-route = ^/ log:x", "uWSGI's internal routing"),
    ("error-route = ^/ log:x", "uWSGI's internal routing"),
    ("add-header = X-Frame-Options: DENY", "uWSGI's internal routing"),
    ("del-header = Server", "uWSGI's internal routing"),
    ("static-map = /static=%dstatic", "static file serving is not done here"),
    ("static-map2 = /static=%dstatic", "static file serving"),
    ("check-static = %dpublic", "static file serving"),
    ("static-index = index.html", "static file serving"),
    ("mule = %dmule.py", "no mules, spoolers, crons"),
    ("spooler = %dspool", "no mules, spoolers, crons"),
    ("cron = 0 -1 -1 -1 -1 /bin/true", "no mules, spoolers, crons"),
    ("attach-daemon = celery worker", "no mules, spoolers, crons"),
    ("smart-attach-daemon = /tmp/x.pid x", "no mules, spoolers, crons"),
    ("hook-pre-app = exec:migrate", "lifecycle commands are not run here"),
    ("exec-pre-app = python manage.py migrate", "lifecycle commands are not run here"),
    ("call-asap = setup", "lifecycle commands are not run here"),
    ("import = mysite.tasks", "import it from the app's module"),
    ("pyimport = mysite.tasks", "import it from the app's module"),
    ("shared-import = mysite.tasks", "import it from the app's module"),
    ("mount = /shop=mysite.wsgi:application", "--root-path PREFIX"),
    ("paste = config:%dprod.ini", "PasteDeploy is not read here"),
    ("ini-paste = %dprod.ini", "PasteDeploy is not read here"),
    ("cache2 = name=c,items=100", "no shared cache here"),
    ("sharedarea = 4", "no shared cache here"),
    ("queue = 10", "no shared cache here"),
    ("emperor = /etc/uwsgi/vassals", "no Emperor here"),
    ("master-fifo = /tmp/fifo", "no master FIFO here"),
    ("daemonize = /var/log/uwsgi.log", "an init script waiting for it to fork would hang"),
    ("daemonize2 = /var/log/uwsgi.log", "stays in the foreground"),
    ("touch-reload = %dreload.txt", "nothing here watches files to reload: reload with SIGHUP"),
    ("touch-chain-reload = %dreload.txt", "reload with SIGHUP"),
    ("py-autoreload = 1", "reload with SIGHUP"),
    ("gevent = 100", "no async loop here"),
    ("logto = 127.0.0.1:1717", "logging over UDP is not done here"),
    ("http-to = /tmp/other.sock", "uWSGI's internal routing"),
])
def test_options_that_change_what_is_served_stop_the_server(tmp_path, option, needle):
    key = option.split(" =")[0]
    line = refusal(project(tmp_path, BASE + option + "\n"))
    assert f": {key} = " in line and needle in line, line


def test_offload_threads_alone_is_accepted(tmp_path):
    rc, out, err = run_cli("--ini", project(tmp_path, BASE + "offload-threads = 4\n"), "--check-config")
    assert (rc, err) == (0, "")


# 4. Includes

def test_ini_includes_take_effect_where_they_are(tmp_path):
    """ini = FILE and ini = FILE:SECTION: the included options at that
    point (a later option overrides them, an earlier one is overridden),
    the included file's own %d; a relative path is taken from the current
    directory, as uWSGI takes it; include = FILE.ini too."""
    sub = tmp_path / "conf"
    sub.mkdir()
    (sub / "common.ini").write_text("[uwsgi]\nprocesses = 4\nthreads = 2\nenv = INC_DIR=%d\n"
                                    "ini = %dmore.ini\n[staging]\nmax-requests = 77\n")
    (sub / "more.ini").write_text("[uwsgi]\nenv = MORE=%n\nlisten = 99\n")
    text = BASE + "ini = conf/common.ini\nthreads = 5\ninclude = conf/common.ini:staging\n"
    ini = project(tmp_path, text)
    # run_cli's current directory is the tests' directory: conf/common.ini is not there.
    rc, out, err = run_cli("--ini", ini, "--check-config")
    assert rc == 2 and "cannot read the included ini file conf/common.ini" in err and "current directory" in err
    rc, out, err = run_cli("--ini", ini, "--print-config", cwd=str(tmp_path))
    assert rc == 0, err
    got = printed(out)
    assert got["workers"][0] == "4"                      # the include after processes = 1
    assert got["threads"][0] == "5"                      # threads = 5 after the include
    assert got["max_requests"][0] == "77"                # :staging
    assert got["backlog"][0] == "99"                     # nested include, with the included %d
    assert got["raw_env"][0] == repr([f"INC_DIR={sub}/", "MORE=more"])


def test_include_loops_and_other_config_types_stop_the_server(tmp_path):
    ini = project(tmp_path, BASE + "ini = %duwsgi.ini\n")
    assert "ini files included more than 10 deep" in refusal(ini)
    (tmp_path / "extra.yaml").write_text("uwsgi:\n  processes: 2\n")
    for option in ("include = %dextra.yaml", "yaml = %dextra.yaml", "json = %dx.json", "xml = %dx.xml",
                   "ini = http://config.example/uwsgi.ini"):
        line = refusal(project(tmp_path, BASE + option + "\n", name="other.ini"))
        assert "only ini files on disk are read here" in line, line


# 5. protocol = http

def test_protocol_http_makes_socket_an_http_address(tmp_path):
    """uWSGI speaks HTTP on `socket` addresses under protocol = http
    (uwsgi-socket stays uwsgi): a server answering HTTP there."""
    port = free_port()
    text = f"[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nprocesses = 1\nprotocol = http\nsocket = 127.0.0.1:{port}\n"
    s = start(project(tmp_path, text))
    try:
        assert s.port == port
        assert get(port).status == 200
    finally:
        s.stop()
    line = refusal(project(tmp_path, text.replace("protocol = http", "protocol = fastcgi"), name="f.ini"))
    assert "protocol = fastcgi: only the uwsgi and http protocols are spoken here" in line


# 6. No address

NO_ADDRESS_INI = "[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nprocesses = 1\n"


def test_an_ini_with_no_address_is_flagged(tmp_path):
    t = translated(project(tmp_path, NO_ADDRESS_INI))
    assert t.no_address and "The -s/--socket option is missing" in t.no_address
    assert translated(project(tmp_path, BASE, name="b.ini")).no_address is None
    assert translated(project(tmp_path, NO_ADDRESS_INI + "protocol = http\nsocket = :9000\n",
                              name="c.ini")).no_address is None


CONFIG_TAKES_NO_ADDRESS = "no_address" in open(config.__file__).read()


@pytest.mark.xfail(not CONFIG_TAKES_NO_ADDRESS, strict=True,
                   reason="config.py does not yet refuse an ini's Translation.no_address (see the report)")
def test_an_ini_with_no_address_does_not_start(tmp_path):
    """uWSGI: "The -s/--socket option is missing and stdin is not a
    socket." forkwsgi served 127.0.0.1:8000 instead; an address from the
    command line or the environment still serves."""
    ini = project(tmp_path, NO_ADDRESS_INI)
    assert "The -s/--socket option is missing" in refusal(ini)
    assert settings_of(ini, "--bind", "127.0.0.1:0")["bind"][0] == "['127.0.0.1:0']"
    assert settings_of(ini, env={"FORKWSGI_BIND": "127.0.0.1:0"})["bind"][0] == "['127.0.0.1:0']"


# 7, 8. uWSGI's defaults: no harakiri, reload mercy

def test_no_harakiri_is_no_timeout(tmp_path):
    ini = project(tmp_path, BASE)
    assert settings_of(ini)["timeout"] == ("0.0", f"ini file {ini}: uWSGI's default: no harakiri")
    assert settings_of(ini, "--timeout", "5")["timeout"] == ("5.0", "command line")
    assert settings_of(project(tmp_path, BASE + "harakiri = 20\n", name="h.ini"))["timeout"][0] == "20.0"


def test_reload_mercy_is_the_graceful_timeout(tmp_path):
    ini = project(tmp_path, BASE)
    assert settings_of(ini)["graceful_timeout"] == ("60.0", f"ini file {ini}: uWSGI's default: "
                                                            "worker-reload-mercy 60")
    ini = project(tmp_path, BASE + "worker-reload-mercy = 15\n", name="w.ini")
    assert settings_of(ini)["graceful_timeout"] == ("15.0", f"ini file {ini}: worker-reload-mercy")
    ini = project(tmp_path, BASE + "reload-mercy = 8\nworker-reload-mercy = 15\n", name="r.ini")
    assert settings_of(ini)["graceful_timeout"] == ("8.0", f"ini file {ini}: reload-mercy")
    assert settings_of(ini, "--graceful-timeout", "3")["graceful_timeout"] == ("3.0", "command line")


# 9. Unix sockets under the process's umask

def test_a_unix_socket_gets_the_process_umask(tmp_path):
    """uWSGI makes its unix sockets 0777 less the umask (srwxr-x--- under
    027) unless chmod-socket; forkwsgi's default was 0777, writable by
    any local user."""
    sock = tmp_path / "app.sock"
    ini = project(tmp_path, f"[uwsgi]\nchdir = %d\nmodule = mysite.wsgi\nprocesses = 1\nhttp-socket = {sock}\n")
    old = os.umask(0o027)
    try:
        s = start(ini)
    finally:
        os.umask(old)
    try:
        assert s.unix_path == str(sock)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o750
        with Conn(None, path=str(sock)) as c:
            c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert c.read_response().status == 200
    finally:
        s.stop()


# uWSGI itself on the same file

UWSGI = shutil.which("uwsgi")


def uwsgi_show_config(ini, env):
    """The options uWSGI ends up with (--show-config), in order."""
    p = subprocess.Popen([UWSGI, "--plugin", "python3", "--ini", ini, "--show-config"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, cwd=os.path.dirname(ini), env={**unsanitized_env(), **env},
                         text=True)
    lines = []
    try:
        for line in p.stdout:
            if line.startswith(";end of configuration"):
                break
            lines.append(line.rstrip("\n"))
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(10)
    start_at = lines.index("[uwsgi]") + 1
    return [tuple(l.split(" = ", 1)) for l in lines[start_at:] if " = " in l]


@pytest.mark.skipif(not UWSGI, reason="needs uWSGI (Debian: uwsgi-core uwsgi-plugin-python3)")
@pytest.mark.parametrize("env", [{}, {"DEV": "1", "STAGE": "blue"}])
def test_uwsgi_reads_the_same_values(tmp_path, env):
    """uWSGI 2.0's --show-config and forkwsgi's reading of one file agree:
    config logic, %(_), @(FILE) (one newline dropped), @(exec://),
    includes (the included file's %d), $() and %()."""
    (tmp_path / "secret").write_text("pw\n")
    (tmp_path / "inc.ini").write_text("[uwsgi]\nincluded = %d%n\n")
    text = (LOGIC_INI.replace("http-socket = 127.0.0.1:0", f"http-socket = 127.0.0.1:{free_port()}")
            + "secret = @(%dsecret)\ncmd = @(exec://echo hi)\nini = %dinc.ini\nref = %(secret)-$(HOME)\n")
    ini = project(tmp_path, text)
    theirs = [(k, v) for k, v in uwsgi_show_config(ini, env)
              if k not in ("plugin", "ini", "show-config") and not re.fullmatch(r"if-.*|endif|end-if", k)]
    ours = uwsgi_ini.Ini(ini, {**os.environ, **env}).options
    assert [(k, v.rstrip()) for k, v in ours] == [(k, v.rstrip()) for k, v in theirs]
