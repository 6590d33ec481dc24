"""A team switching from gunicorn to forkwsgi by changing one word (issue 25,
items 1, 2, 4, 7, 10): gunicorn 27's flags, ./gunicorn.conf.py,
GUNICORN_CMD_ARGS, TLS and worker classes, --check-config and
--print-config. Where a verdict is compared, gunicorn 27 itself runs on the
same config file or flags.

The flag table is checked in this process (config.load, and gunicorn's own
parser and validators for the sample values); the rest runs real
processes: forkwsgi servers on 127.0.0.1, stopped by PID at teardown.
"""
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from conftest import HERE, ServerProc
from httpraw import free_port, wait_for

from forkwsgi import config, gunicorn_compat

APP_MODES = ("inline",)

gunicorn_config = pytest.importorskip("gunicorn.config")


def clean_env(**extra):
    """The environment with no FORKWSGI_*/gunicorn variables of the caller's,
    the tests' apps and the tree under test importable."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("FORKWSGI_", "GUNICORN_")) and k not in ("PORT", "WEB_CONCURRENCY")}
    e["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    e.update(extra)
    return e


def run(tool, *args, cwd, env=None):
    """python -m forkwsgi|gunicorn ARGS in cwd: (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", tool, *args], capture_output=True, text=True, timeout=30,
                       cwd=cwd, env=clean_env(**(env or {})))
    return p.returncode, p.stdout, p.stderr


def start_expecting_exit(*args, cwd, timeout=15):
    """Start forkwsgi with args, for a server that must not start: its exit
    code and output. One that runs anyway is stopped (its process group)
    and fails the test."""
    p = subprocess.Popen([sys.executable, "-m", "forkwsgi", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=cwd, env=clean_env(), start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate(timeout=10)
        pytest.fail(f"the server started: {err}")
    return p.returncode, out, err


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------
# Item 1: every flag gunicorn 27 defines.

# What each gunicorn setting that has a flag gets here, the same from its
# flag as from its name in a config file:
#   set       it sets forkwsgi's setting of that name (or ALIASES')
#   accepted  taken, nothing to do (forkwsgi does it anyway)
#   ignored   a warning at start saying what to use instead
#   refused   the server does not start (one line)
# A name that is (or becomes, on another branch: statsd_host, ...) a
# setting here is expected to set it, whatever this table says.
OUTCOME = {
    "config": "set", "bind": "set", "backlog": "set", "workers": "set", "worker_class": "accepted",
    "threads": "set", "worker_connections": "set", "max_requests": "set", "max_requests_jitter": "set",
    "timeout": "set", "graceful_timeout": "set", "keepalive": "set", "limit_request_line": "set",
    "limit_request_fields": "set", "limit_request_field_size": "ignored", "reload": "ignored",
    "reload_engine": "ignored", "reload_extra_files": "ignored", "spew": "ignored", "check_config": "set",
    "print_config": "set", "preload_app": "set", "sendfile": "ignored", "reuse_port": "ignored",
    "chdir": "set", "daemon": "refused", "raw_env": "set", "pidfile": "set", "worker_tmp_dir": "ignored",
    "user": "set", "group": "set", "umask": "set", "initgroups": "set", "forwarded_allow_ips": "set",
    "accesslog": "set", "disable_redirect_access_to_syslog": "ignored", "access_log_format": "set",
    "errorlog": "set", "loglevel": "set", "capture_output": "set", "logger_class": "refused",
    "logconfig": "set", "logconfig_json": "set", "syslog_addr": "ignored", "syslog": "refused",
    "syslog_prefix": "ignored", "syslog_facility": "ignored", "enable_stdio_inheritance": "ignored",
    "statsd_host": "ignored", "dogstatsd_tags": "ignored", "statsd_prefix": "ignored",
    "enable_backlog_metric": "ignored", "proc_name": "set", "pythonpath": "set", "paste": "ignored",
    "proxy_protocol": "set", "proxy_allow_ips": "set", "protocol": "ignored", "uwsgi_allow_ips": "ignored",
    "keyfile": "refused", "certfile": "refused", "ssl_version": "ignored", "cert_reqs": "ignored",
    "ca_certs": "ignored", "suppress_ragged_eofs": "ignored", "do_handshake_on_connect": "ignored",
    "ciphers": "ignored", "http_protocols": "ignored", "http2_cleartext": "ignored",
    "http2_max_concurrent_streams": "ignored", "http2_initial_window_size": "ignored",
    "http2_max_frame_size": "ignored", "http2_max_header_list_size": "ignored",
    "raw_paste_global_conf": "ignored", "permit_obsolete_folding": "ignored", "strip_header_spaces": "ignored",
    "permit_unconventional_http_method": "ignored", "permit_unconventional_http_version": "ignored",
    "casefold_http_method": "ignored", "forwarder_headers": "ignored", "header_map": "ignored",
    "asgi_loop": "ignored", "asgi_lifespan": "ignored", "asgi_disconnect_grace_period": "ignored",
    "websocket_max_message_size": "ignored", "http_parser": "ignored", "root_path": "set",
    "dirty_apps": "ignored", "dirty_workers": "ignored", "dirty_timeout": "ignored", "dirty_threads": "ignored",
    "dirty_graceful_timeout": "ignored", "control_socket": "ignored", "control_socket_mode": "ignored",
    "control_socket_disable": "accepted",
}

# A value gunicorn 27 accepts for each flag that takes one (its own
# validators check them below); "x" where any text does.
SAMPLE = {
    "bind": "127.0.0.1:0", "backlog": "64", "workers": "2", "worker_class": "gthread", "threads": "2",
    "worker_connections": "100", "max_requests": "10", "max_requests_jitter": "5", "timeout": "5",
    "graceful_timeout": "5", "keepalive": "5", "chdir": "/tmp", "limit_request_line": "4094",
    "limit_request_fields": "50",
    "limit_request_field_size": "8190", "reload_engine": "poll", "raw_env": "A=1", "pidfile": "app.pid",
    "worker_tmp_dir": "/dev/shm", "user": str(os.getuid()), "group": str(os.getgid()), "umask": "0o22",
    "forwarded_allow_ips": "127.0.0.1", "accesslog": "-", "access_log_format": "%(h)s %(r)s",
    "errorlog": "-", "loglevel": "debug", "logger_class": "gunicorn.glogging.Logger",
    "syslog_addr": "udp://localhost:514", "syslog_facility": "user", "statsd_host": "127.0.0.1:8125",
    "dogstatsd_tags": "env:test", "statsd_prefix": "app", "proc_name": "shop", "pythonpath": "/tmp",
    "proxy_protocol": "v1", "proxy_allow_ips": "127.0.0.1", "protocol": "uwsgi", "uwsgi_allow_ips": "127.0.0.1",
    "ssl_version": "2", "cert_reqs": "0", "http_protocols": "h1", "http2_cleartext": "off",
    "http2_max_concurrent_streams": "50", "http2_initial_window_size": "65535", "http2_max_frame_size": "16384",
    "http2_max_header_list_size": "65536", "raw_paste_global_conf": "a=b", "forwarder_headers": "SCRIPT_NAME",
    "header_map": "refuse", "asgi_loop": "asyncio", "asgi_lifespan": "off", "asgi_disconnect_grace_period": "3",
    "websocket_max_message_size": "1000", "http_parser": "python", "root_path": "/shop", "dirty_apps": "a.b:C",
    "dirty_workers": "1", "dirty_timeout": "10", "dirty_threads": "1", "dirty_graceful_timeout": "10",
    "control_socket_mode": "384",
}


def gunicorn_settings_with_flags():
    return {s.name: s for s in gunicorn_config.KNOWN_SETTINGS if s.cli}


def flag_cases():
    return [(name, flag) for name, s in gunicorn_settings_with_flags().items() for flag in s.cli]


def test_the_outcome_table_covers_every_flag_of_gunicorn_27():
    """A gunicorn that adds a flag fails here until OUTCOME and
    gunicorn_compat.GUNICORN_FLAGS say what it gets."""
    assert set(OUTCOME) == set(gunicorn_settings_with_flags())
    for name, s in gunicorn_settings_with_flags().items():
        assert set(s.cli) <= set(gunicorn_compat.GUNICORN_FLAGS[name]), name


def sample_args(name, flag, tmp_path):
    s = gunicorn_settings_with_flags()[name]
    if s.action in ("store_true", "store_const"):
        return [flag]
    value = SAMPLE.get(name, "x")
    if name == "config":
        value = str(tmp_path / "empty.conf.py")
        (tmp_path / "empty.conf.py").write_text("")
    return [flag, value]


def gunicorn_accepts(args):
    """gunicorn 27's own parser and validators take args (SystemExit or an
    exception if not)."""
    cfg = gunicorn_config.Config()
    ns = cfg.parser().parse_args([*args, "apps:hello"])
    for k, v in vars(ns).items():
        if v is not None and k != "args":
            cfg.set(k.lower(), v)


def outcome(name, argv, where):
    """What forkwsgi makes of gunicorn setting `name` given in argv."""
    origins, warnings, ignored, refused = {}, [], [], []
    config.load(["apps:hello", *argv], environ={}, origins=origins, warnings=warnings,
                ignored=ignored, refused=refused)
    assert not warnings, warnings
    if refused:
        assert len(refused) == 1 and refused[0].startswith(where), refused
        return "refused"
    if ignored:
        assert [i[0] for i in ignored] == [name] and ignored[0][2] == where, ignored
        assert gunicorn_compat.ignored_line(*ignored[0]).startswith(where)
        return "ignored"
    ours = gunicorn_compat.ALIASES.get(name, name)
    if origins.get(ours) == where:
        return "set"
    return "accepted"


@pytest.mark.parametrize("name,flag", flag_cases())
def test_every_gunicorn_flag_gets_what_its_config_file_name_gets(name, flag, tmp_path, monkeypatch):
    """Item 1: each of gunicorn 27's flags parses (no "unrecognized
    arguments"), with a value gunicorn accepts, and gets the same outcome as
    its name in a config file: it sets our setting, is accepted, ignored with
    a warning, or refused."""
    monkeypatch.chdir(tmp_path)               # no ./gunicorn.conf.py here
    (tmp_path / "x").write_text("")           # for gunicorn's validators that want a file
    args = sample_args(name, flag, tmp_path)
    gunicorn_accepts(args)
    got = outcome(name, args, "command line")
    ours = gunicorn_compat.ALIASES.get(name, name)
    assert got == ("set" if ours in config.BY_NAME else OUTCOME[name]), (flag, got)
    if name == "config":
        return                                # a config file names no other
    s = gunicorn_settings_with_flags()[name]
    value = True if len(args) == 1 else [args[1]] if s.action == "append" else args[1]
    if s.action == "store_const":
        value = s.const
    conf = tmp_path / "named.conf.py"
    conf.write_text(f"{name} = {value!r}\n")
    assert outcome(name, ["-c", str(conf)], f"config file {conf}") == got, name


def test_flags_forkwsgi_spells_as_gunicorn_go_to_the_same_setting():
    """A flag forkwsgi defines itself that gunicorn defines too means the
    same setting in both (after ALIASES)."""
    parser = config.build_parser()
    for name, flags in gunicorn_compat.GUNICORN_FLAGS.items():
        for flag in flags:
            action = parser._option_string_actions[flag]
            assert action.dest in (gunicorn_compat.ALIASES.get(name, name), config.GUNICORN_DEST + name), flag


def test_abbreviated_flags_are_refused(tmp_path):
    """Abbreviations are off: `--keep 5` is no --keep-alive, and uWSGI's
    `--ini FILE` can never be taken for --initgroups."""
    rc, out, err = run("forkwsgi", "apps:hello", "--keep", "5", "--print-config", cwd=tmp_path)
    assert rc == 2 and "unrecognized arguments: --keep 5" in err, (rc, err)
    rc, out, err = run("forkwsgi", "apps:hello", "--initgroup", "--print-config", cwd=tmp_path)
    assert rc == 2 and "unrecognized arguments: --initgroup" in err, (rc, err)


# The flags of the issue, as a gunicorn command line has them.
ISSUE_FLAGS = ["-k", "gthread", "--worker-class", "gthread", "--threads", "2", "--worker-tmp-dir", "/dev/shm",
               "--log-file", "-", "--capture-output", "--reload", "--statsd-host", "127.0.0.1:9",
               "--limit-request-field_size", "8190"]


def test_gunicorn_command_line_starts_the_server(tmp_path, servers):
    """Item 1: the issue's gunicorn flags, each a hard error before: gunicorn
    and forkwsgi both pass --check-config with them, and forkwsgi serves, with
    one warning for each flag it ignores saying what to use instead."""
    for tool in ("gunicorn", "forkwsgi"):
        rc, out, err = run(tool, *ISSUE_FLAGS, "--check-config", "apps:hello", cwd=tmp_path)
        assert rc == 0, (tool, out, err)
    s = ServerProc("apps:hello", *ISSUE_FLAGS, cwd=tmp_path)
    servers.append(s)
    assert s.get("/").status == 200
    warned = [ln for ln in s.log().splitlines() if "WARNING" in ln]
    expected = [("--worker-tmp-dir", "shared memory"), ("--reload", "SIGHUP"),
                ("--limit-request-field_size", "--limit-request-head")]
    if "statsd_host" not in config.BY_NAME:             # not (yet) a setting here
        expected.append(("--statsd-host", "--metrics"))
    for flag, instead in expected:
        assert any(flag in ln and instead in ln for ln in warned), (flag, warned)
    assert len(warned) == len(expected), warned


# ---------------------------------------------------------------------------
# Items 1 and 7: what stops the server at start.

REFUSED = {
    "tls-flags": (["--certfile", "{cert}", "--keyfile", "{key}"], "", "terminate TLS in the proxy in front"),
    "tls-config": ([], "certfile = {cert!r}\nkeyfile = {key!r}\n", "terminate TLS in the proxy in front"),
    "asgi-flag": (["-k", "uvicorn.workers.UvicornWorker"], "", "is an ASGI worker"),
    "asgi-config": ([], "worker_class = 'uvicorn.workers.UvicornWorker'\n", "is an ASGI worker"),
    "gunicorn-asgi": (["--worker-class", "asgi"], "", "is an ASGI worker"),
    "gevent": (["-k", "gevent"], "", "use -k gthread --threads N"),
}


@pytest.fixture
def tls_files(tmp_path):
    """A real certificate and key, as a gunicorn TLS config names them."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-keyout", str(key), "-out", str(cert)], check=True,
                   capture_output=True, timeout=60)
    return {"cert": str(cert), "key": str(key)}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_at_start_with_one_line(case, tmp_path, tls_files):
    """Items 1 and 7: TLS settings and worker classes forkwsgi's workers do
    not stand in for stop the server at start with one line (exit 2), from
    the command line or the config file; nothing listens. --check-config
    says the same line and exits 1. Before, TLS gave plain HTTP on the
    port clients reach with https://, an ASGI class a 500 to every request."""
    flags, conf_text, needle = REFUSED[case]
    flags = [f.format(**tls_files) for f in flags]
    (tmp_path / "gunicorn.conf.py").write_text(conf_text.format(**tls_files))
    port = free_port()
    rc, out, err = start_expecting_exit("apps:hello", "-b", f"127.0.0.1:{port}", *flags, cwd=tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("forkwsgi: error:") and needle in lines[0], \
        (rc, out, err)
    assert not listening(port)
    rc, out, err = run("forkwsgi", "apps:hello", *flags, "--check-config", cwd=tmp_path)
    assert rc == 1 and needle in err and "configuration OK" not in out, (rc, out, err)


def test_a_reload_to_a_tls_config_keeps_the_workers(tmp_path, servers, tls_files):
    """Item 7, on reload: certfile added to ./gunicorn.conf.py, then SIGHUP.
    The reload's check refuses it with the same line; the master and its
    workers serve on as they were."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("workers = 2\n")
    s = ServerProc("apps:hello", "-c", "gunicorn.conf.py", cwd=tmp_path)
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2, timeout=10)
    before = sorted(s.worker_pids())
    conf.write_text(f"workers = 2\ncertfile = {tls_files['cert']!r}\nkeyfile = {tls_files['key']!r}\n")
    s.signal(signal.SIGHUP)
    assert wait_for(lambda: "reload: the new code does not load" in s.log(), timeout=20), s.log()
    assert "terminate TLS in the proxy in front" in s.log()
    assert s.alive() and sorted(s.worker_pids()) == before
    assert s.get("/").status == 200


def test_tls_settings_without_a_certificate_are_ignored_as_gunicorn_ignores_them(tmp_path):
    """gunicorn serves TLS only when certfile or keyfile is set; its other TLS
    settings alone change nothing there, and are a warning here, not a
    refusal. `certfile = None` asks for nothing."""
    (tmp_path / "gunicorn.conf.py").write_text("certfile = None\nciphers = 'HIGH'\n")
    for tool in ("gunicorn", "forkwsgi"):
        rc, out, err = run(tool, "--check-config", "apps:hello", cwd=tmp_path)
        assert rc == 0, (tool, out, err)
    assert "'ciphers' (gunicorn) has no counterpart here: ignored; gunicorn uses it only with certfile" in err
    assert "'certfile'" not in err and "forkwsgi: error" not in err, err


# ---------------------------------------------------------------------------
# Item 10: --check-config and --print-config, beside gunicorn's.

IGNORED_CONF = """workers = 2
threads = 4
worker_class = "gthread"
worker_tmp_dir = "/dev/shm"
capture_output = True
reload = True
reuse_port = True
limit_request_field_size = 8190
sendfile = False
"""

# (config file, flags, app) -> gunicorn's verdict, forkwsgi's (0: OK).
VERDICTS = {
    "plain": ("workers = 2\nthreads = 4\nworker_class = 'gthread'\n", [], "apps:hello", 0, 0),
    "ignored-names": (IGNORED_CONF, [], "apps:hello", 0, 0),
    "ignored-flags": ("", ["--worker-tmp-dir", "/dev/shm", "--capture-output", "--reload",
                           "--reuse-port", "--log-file", "-", "--no-sendfile"], "apps:hello", 0, 0),
    "bad-value": ("workers = 'many'\n", [], "apps:hello", 1, 1),
    "bad-flag-value": ("", ["--workers", "many"], "apps:hello", 1, 1),
    "no-such-app": ("workers = 2\n", [], "apps:no_such_app", 1, 1),
    # gunicorn accepts these and would serve TLS / an ASGI worker; forkwsgi refuses them.
    "tls": ("certfile = '/etc/ssl/app.pem'\nkeyfile = '/etc/ssl/app.key'\n", [], "apps:hello", 0, 1),
    "asgi": ("worker_class = 'uvicorn.workers.UvicornWorker'\n", [], "apps:hello", 0, 1),
}


@pytest.mark.parametrize("case", list(VERDICTS))
def test_check_config_verdicts_beside_gunicorns(case, tmp_path):
    """Item 10: --check-config passes what gunicorn 27's passes (a setting
    forkwsgi ignores is a warning, printed, not a failure) and fails what it
    fails; beyond it, what forkwsgi refuses to start with fails. Both read
    the same ./gunicorn.conf.py and flags."""
    conf_text, flags, app, gunicorn_ok, forkwsgi_ok = VERDICTS[case]
    (tmp_path / "gunicorn.conf.py").write_text(conf_text)
    got = {}
    for tool in ("gunicorn", "forkwsgi"):
        rc, out, err = run(tool, "--check-config", *flags, app, cwd=tmp_path)
        got[tool] = (0 if rc == 0 else 1, out, err)
    assert (got["gunicorn"][0], got["forkwsgi"][0]) == (gunicorn_ok, forkwsgi_ok), got
    rc, out, err = got["forkwsgi"]
    if not case.startswith("bad"):
        assert f"config file {tmp_path}/gunicorn.conf.py" in out, out
    if case.startswith("ignored"):
        warned = [ln for ln in err.splitlines() if ln.startswith("forkwsgi: warning:")]
        assert len(warned) == {"ignored-names": 5, "ignored-flags": 4}[case], err
        assert all("has no counterpart here: ignored; " in ln for ln in warned), err
        assert "forkwsgi: error" not in err and "configuration OK" in out, (out, err)


def test_print_config_lists_the_names_it_ignores(tmp_path):
    """Item 10: every setting the config file sets is in --print-config, as
    in gunicorn's: a setting here (with the file as its origin), or in the
    block of ignored names, each with what to use instead."""
    (tmp_path / "gunicorn.conf.py").write_text(IGNORED_CONF)
    rc, g_out, err = run("gunicorn", "--print-config", "apps:hello", cwd=tmp_path)
    assert rc == 0, err
    rc, f_out, err = run("forkwsgi", "--print-config", "apps:hello", cwd=tmp_path)
    assert rc == 0, err
    block = f_out.split("# ignored: ", 1)[1].splitlines()[1:]
    ignored = {ln.split()[1]: ln for ln in block if ln.startswith("#   ")}
    origin = f"(config file {tmp_path}/gunicorn.conf.py)"
    for line in IGNORED_CONF.splitlines():
        name = line.split(" = ")[0]
        assert re.search(rf"^{name}\s+= ", g_out, re.M), name      # gunicorn shows it
        if name == "worker_class":
            continue                                                # accepted: nothing to show
        ours = gunicorn_compat.ALIASES.get(name, name)
        if ours in config.BY_NAME:
            assert re.search(rf"^{ours}\s+= .*  {re.escape(origin)}$", f_out, re.M), name
        else:
            assert origin in ignored[name] and gunicorn_compat.NO_COUNTERPART[name] in ignored[name], name
    assert set(ignored) == {"worker_tmp_dir", "reload", "reuse_port",
                            "limit_request_field_size", "sendfile"}


# ---------------------------------------------------------------------------
# Item 2: ./gunicorn.conf.py without -c.

def test_gunicorn_conf_py_in_the_current_directory_is_read(tmp_path, servers):
    """Item 2: started with no -c in a directory holding gunicorn.conf.py, as
    gunicorn reads it: 3 workers, bound where the file says, its hook ran,
    and the log names the file."""
    port = free_port()
    ready = tmp_path / "when_ready.out"
    (tmp_path / "gunicorn.conf.py").write_text(
        f"workers = 3\nbind = '127.0.0.1:{port}'\n"
        f"def when_ready(server):\n    open({str(ready)!r}, 'w').write('ready %d' % server.num_workers)\n")
    rc, out, err = run("gunicorn", "--print-config", "apps:hello", cwd=tmp_path)
    assert rc == 0 and re.search(r"^workers\s+= 3$", out, re.M), (out, err)        # gunicorn reads it
    s = ServerProc("apps:hello", bind=[], cwd=tmp_path)
    servers.append(s)
    assert s.port == port
    assert wait_for(lambda: len(s.worker_pids()) == 3, timeout=10), s.worker_pids()
    assert s.get("/").status == 200
    assert wait_for(ready.exists, timeout=10) and ready.read_text() == "ready 3"
    assert re.search(rf"INFO.*Config file: {re.escape(str(tmp_path))}/gunicorn.conf.py "
                     r"\(no -c given: found in the current directory\)", s.log()), s.log()


def test_which_config_file_is_read(tmp_path):
    """Item 2: ./forkwsgi.conf.py is read before ./gunicorn.conf.py; a file
    named by -c (a path, or gunicorn's python:MODULE), FORKWSGI_CONFIG or -c
    in GUNICORN_CMD_ARGS instead of either. --print-config and
    --check-config name the file read."""
    (tmp_path / "gunicorn.conf.py").write_text("workers = 3\n")
    rc, out, err = run("forkwsgi", "apps:hello", "--check-config", cwd=tmp_path)
    assert rc == 0 and f"forkwsgi: config file {tmp_path}/gunicorn.conf.py (no -c given" in out, (out, err)
    (tmp_path / "forkwsgi.conf.py").write_text("workers = 2\n")
    (tmp_path / "other.py").write_text("workers = 4\n")
    (tmp_path / "gconf.py").write_text("workers = 5\n")
    cases = [([], {}, "2", f"{tmp_path}/forkwsgi.conf.py"),
             (["-c", "other.py"], {}, "4", "other.py"),
             (["-c", "python:gconf"], {}, "5", "python:gconf"),             # gunicorn's module form
             ([], {"FORKWSGI_CONFIG": "other.py"}, "4", "other.py"),
             ([], {"GUNICORN_CMD_ARGS": "-c other.py"}, "4", "other.py")]
    for flags, env, workers, path in cases:
        rc, out, err = run("forkwsgi", "apps:hello", *flags, "--print-config", cwd=tmp_path, env=env)
        assert rc == 0, err
        assert re.search(rf"^workers\s+= {workers}  \(config file {re.escape(path)}\)$", out, re.M), (flags, env, out)
        assert re.search(rf"^config\s+= '{re.escape(path)}'", out, re.M), out


# ---------------------------------------------------------------------------
# Item 4: GUNICORN_CMD_ARGS.

def test_gunicorn_cmd_args_and_the_order_of_the_sources(tmp_path):
    """Item 4: GUNICORN_CMD_ARGS is read, over the config file as in gunicorn
    (whose --print-config shows the same values); forkwsgi's own names win
    over it: FORKWSGI_<FLAG>, FORKWSGI_CMD_ARGS, then the command line."""
    (tmp_path / "gunicorn.conf.py").write_text("workers = 2\nbacklog = 100\nthreads = 3\nkeepalive = 5\n"
                                              "timeout = 7\ngraceful_timeout = 8\n")
    env = {"GUNICORN_CMD_ARGS": "--workers 3 --backlog 200 --threads 4 --keep-alive 6 --timeout 9 "
                                "--worker-tmp-dir /dev/shm"}
    rc, out, err = run("gunicorn", "--print-config", "apps:hello", cwd=tmp_path, env=env)
    assert rc == 0 and re.search(r"^workers\s+= 3$", out, re.M) and re.search(r"^backlog\s+= 200$", out, re.M), out
    env.update(FORKWSGI_THREADS="5", FORKWSGI_CMD_ARGS="--keep-alive 10 --timeout 11")
    rc, out, err = run("forkwsgi", "apps:hello", "--timeout", "12", "--print-config", cwd=tmp_path, env=env)
    assert rc == 0, err
    got = {m[0]: (m[1], m[2]) for m in re.findall(r"^(\w+)\s+= (.*?)  \((.*)\)$", out, re.M)}
    assert got["graceful_timeout"] == ("8.0", f"config file {tmp_path}/gunicorn.conf.py")
    assert got["workers"] == ("3", "GUNICORN_CMD_ARGS")
    assert got["backlog"] == ("200", "GUNICORN_CMD_ARGS")
    assert got["threads"] == ("5", "FORKWSGI_THREADS")
    assert got["keepalive"] == ("10.0", "FORKWSGI_CMD_ARGS")
    assert got["timeout"] == ("12.0", "command line")
    assert "#   worker_tmp_dir = '/dev/shm'  (GUNICORN_CMD_ARGS): " in out, out


def test_a_server_started_with_gunicorn_cmd_args(tmp_path, servers):
    """Item 4: the settings of GUNICORN_CMD_ARGS are the server's."""
    s = ServerProc("apps:hello", cwd=tmp_path, env={"GUNICORN_CMD_ARGS": "-w 2 -k gthread --threads 2"})
    servers.append(s)
    assert wait_for(lambda: len(s.worker_pids()) == 2, timeout=10), s.worker_pids()
    assert s.get("/").status == 200


def test_gunicorn_cmd_args_with_a_bad_flag_is_one_line(tmp_path):
    rc, out, err = run("forkwsgi", "apps:hello", "--check-config", cwd=tmp_path,
                       env={"GUNICORN_CMD_ARGS": "--no-such-flag"})
    assert rc == 2 and err.strip() == "forkwsgi: error: GUNICORN_CMD_ARGS: unrecognized arguments: --no-such-flag"
