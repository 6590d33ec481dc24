"""--user / --group (issue 11, gunicorn's): workers drop privileges after
fork, the master keeps its own. Needs root (as CI runs)."""
import grp
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from conftest import HERE, ServerProc
from httpraw import Conn, free_port, wait_for

APP_MODES = ("inline",)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def uid_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("Uid:")).split()[1])


def test_workers_run_as_the_user_and_the_master_as_root(tmp_path):
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid).gr_name
    access = tmp_path / "access.log"          # in root's own 0700 directory: opened before the drop
    s = ServerProc("apps:ids", "--workers", "2", "--user", "nobody", "--group", group,
                   "--access-logfile", str(access), "--access-logformat", "%(s)s")
    try:
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        seen = set()
        for _ in range(6):
            with Conn(s.port) as c:
                c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                r = c.read_response()
            d = json.loads(r.body)
            assert (d["uid"], d["gid"], d["groups"]) == (nobody.pw_uid, nobody.pw_gid, [])
            seen.add(d["pid"])
        assert uid_of(s.pid) == 0
        # A worker is root from its fork until it has opened what it needs;
        # one still booting (a slow machine) drops within moments.
        assert wait_for(lambda: all(uid_of(p) == nobody.pw_uid for p in s.worker_pids()), 10)
        assert wait_for(lambda: access.exists() and access.read_text().count("200") == 6, 5)
        assert os.stat(access).st_uid == nobody.pw_uid          # theirs to reopen after logrotate
    finally:
        s.stop()


def test_an_unknown_user_is_a_one_line_error():
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for args, want in ((["--user", "no-such-user-here"], "no such user"),
                       (["--group", "no-such-group-here"], "no such group"),
                       (["--user", "nobody", "--workers", "0"], "need a master")):
        p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:ids", "--bind", "127.0.0.1:0", *args],
                           capture_output=True, text=True, env=env, timeout=30, cwd=HERE)
        assert p.returncode == 2 and want in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr


# ---- every feature at once under --user nobody (issue 24, items 3 and 4) -----

NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def open_dir():
    """A directory nobody can reach (pytest's tmp_path is in root's 0700
    /tmp/pytest-of-root), removed afterwards."""
    d = tempfile.mkdtemp(prefix="forkwsgi-user-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def status_of(pid):
    """/proc/PID/status as {field: value}."""
    with open(f"/proc/{pid}/status") as f:
        return dict(ln.rstrip("\n").split(":\t", 1) for ln in f if ":\t" in ln)


def assert_nobody(pid):
    st = status_of(pid)
    want = f"{NOBODY.pw_uid}\t" * 3 + f"{NOBODY.pw_uid}"
    assert st["Uid"] == want and st["Gid"] == f"{NOBODY.pw_gid}\t" * 3 + f"{NOBODY.pw_gid}", (pid, st)
    assert st["Groups"].strip() == ""
    for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(st[caps], 16) == 0, (pid, caps, st[caps])


def title(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")[0].decode()


def settled(s, workers=2):
    """Its workers and sibling all started, each past its switch to nobody
    (a child that just forked is still root for a moment)."""
    want = sorted(["forkwsgi: offload"] + [f"forkwsgi: worker {i}" for i in range(1, workers + 1)])

    def children():
        try:
            kids = s.worker_pids()
            return sorted(title(p) for p in kids if uid_of(p) == NOBODY.pw_uid)
        except (OSError, StopIteration):
            return None
    return wait_for(lambda: children() == want, 20)


def http(port=None, path="/", body=b"", unix=None):
    head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with Conn(port, path=unix) as c:
        c.send(head.encode() + body)
        return c.read_response("POST")


def scrape(port):
    with Conn(port) as c:
        c.send(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        return c.read_response().body.decode()


def stats(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s, s.makefile("rb") as f:
        return json.load(f)


def test_every_feature_works_under_user_nobody_through_a_reload_and_a_respawn(open_dir):
    """As users run it: root starts the server with --user nobody and every
    feature on. Before, the app's prometheus_client Counter answered 500 on
    every request (its directory was root's 0700), and the offload sibling
    ran as root with every capability. Now each request through each way in
    works, before and after a reload (the master re-executes itself) and a
    worker respawn, and every process but the master is nobody, with no
    capability."""
    d = open_dir
    spool = os.path.join(d, "spool")
    os.mkdir(spool)
    os.chown(spool, NOBODY.pw_uid, NOBODY.pw_gid)          # as an operator gives the app its spool
    os.mkdir(os.path.join(d, "logs"))                      # root's: the master opens the logs there
    sock, pidfile = os.path.join(d, "app.sock"), os.path.join(d, "app.pid")
    access, errors = os.path.join(d, "logs", "access.log"), os.path.join(d, "logs", "error.log")
    out = os.path.join(d, "events.jsonl")
    mport, sport = free_port(), free_port()
    s = ServerProc("user_apps:everything()", "--workers", "2", "--user", "nobody", "--bind", f"unix:{sock}",
                   "--pid", pidfile, "--metrics", f"127.0.0.1:{mport}", "--stats", f"127.0.0.1:{sport}",
                   "--access-logfile", access, "--access-logformat", "%(s)s %(U)s",
                   "--error-logfile", errors, "--spool-dir", spool, "--spool-threshold", "1000",
                   "--offload-sink", f"jsonl:{out}", "--offload-dir", os.path.join(d, "offload"),
                   "--offload-linger", "0.02", wait=False)
    try:
        assert wait_for(lambda: os.path.exists(errors) and "Listening at: http" in open(errors).read(), 20)
        s.port = int(re.search(r"Listening at: http://127.0.0.1:(\d+)", open(errors).read()).group(1))
        body = os.urandom(5000)                           # past --spool-threshold: a spool file
        sent = []

        def through_each(tag):
            for path, how in ((f"/{tag}/tcp", {"port": s.port}), (f"/{tag}/unix", {"unix": sock}),
                              (f"/{tag}/spooled", {"port": s.port, "body": body})):
                r = http(path=path, **how)
                assert r.status == 200, (path, r.status, r.body, open(errors).read()[-3000:])
                got = json.loads(r.body)
                assert (got["uid"], got["gid"], got["groups"]) == (NOBODY.pw_uid, NOBODY.pw_gid, [])
                assert got["offloaded"] is True
                assert got["length"] == len(how.get("body", b""))
                sent.append(path)
            text = scrape(mport)
            for path in sent:
                assert f'user_app_hits_total{{path="{path}"}} 1.0' in text, (path, text)
            assert stats(sport)["pid"] == s.pid
            assert wait_for(lambda: sorted(open(access).read().split("\n")[:-1]) ==
                            sorted(f"200 {p}" for p in sent), 5)
            assert wait_for(lambda: os.path.exists(out) and
                            sorted(json.loads(x)["value"].split()[1] for x in open(out)) == sorted(sent), 10)

        def everyone_is_nobody():
            for p in s.worker_pids():
                assert_nobody(p)
            assert status_of(s.pid)["Uid"].split()[0] == "0"
            with open(pidfile) as f:
                assert f.read().strip() == str(s.pid)

        assert wait_for(lambda: len(s.worker_pids()) == 3)
        through_each("start")
        assert settled(s)
        everyone_is_nobody()
        # gunicorn's: the unix socket and the log files are the user's.
        for path in (sock, access, errors, out):
            assert os.stat(path).st_uid == NOBODY.pw_uid, path

        before = set(s.worker_pids())
        s.signal(signal.SIGHUP)
        assert wait_for(lambda: "Reloaded in place" in open(errors).read(), 20)
        assert wait_for(lambda: not before & set(s.worker_pids()), 20) and settled(s)
        through_each("reloaded")
        everyone_is_nobody()

        victim = next(p for p in s.worker_pids() if title(p) == "forkwsgi: worker 1")
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: victim not in s.worker_pids(), 10) and settled(s)
        # The new worker 1 is ready: the master says both accept.
        assert wait_for(lambda: [w["accepting"] for w in stats(sport)["workers"]] == [1, 1], 20)
        through_each("respawned")                # its dead predecessor's counts are still in /metrics
        everyone_is_nobody()
        assert "Traceback" not in open(errors).read()
        metrics_dir = re.search(r"multiprocess files in (\S+)", open(errors).read()).group(1)
    finally:
        s.stop()
    assert s.proc.returncode == 0
    assert not os.path.exists(pidfile) and not os.path.exists(metrics_dir)


def test_workers_and_the_sibling_die_with_a_killed_master(open_dir, servers):
    """The kernel forgets a process's parent-death signal when its identity
    changes. Workers asked for it before they became nobody: a SIGKILLed
    master left them serving, holding the port, for ever (without --user
    they went within a second). Now they ask once they are nobody."""
    s = ServerProc("apps:ids", "--workers", "2", "--user", "nobody", "--offload-sink",
                   f"jsonl:{open_dir}/out.jsonl", "--offload-dir", f"{open_dir}/offload")
    servers.append(s)
    assert settled(s)
    kids = s.worker_pids()
    for p in kids:
        assert_nobody(p)
    s.signal(signal.SIGKILL)
    s.proc.wait(5)
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in kids), 3), \
        [title(p) for p in kids if os.path.exists(f"/proc/{p}")]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", s.port))         # nobody holds the port


def test_a_directory_the_user_cannot_write_in_is_one_line_at_start(open_dir):
    """A --spool-dir only root may write in: before, the server started and
    answered 500 to every request with a body past --spool-threshold; now it
    says so and exits 2 (and leaves no metrics directory behind)."""
    spool = os.path.join(open_dir, "spool")
    os.mkdir(spool)                                 # root's, 0755
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TMPDIR=open_dir)
    p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:ids", "--bind", "127.0.0.1:0", "--user", "nobody",
                        "--spool-dir", spool, "--metrics", f"127.0.0.1:{free_port()}"],
                       capture_output=True, text=True, env=env, timeout=30, cwd=HERE)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last == (f"forkwsgi: error: --spool-dir {spool}: uid {NOBODY.pw_uid} gid {NOBODY.pw_gid} "
                    "(--user/--group) cannot write there"), p.stderr
    assert os.listdir(open_dir) == ["spool"]        # the metrics directory (in $TMPDIR) is gone


def test_with_lazy_apps_root_never_runs_the_apps_code(open_dir, servers):
    """With the default preload the master imports the app as root (as
    gunicorn --preload does): a file only root may read is read, and what
    the app opened is inherited by the workers. With --lazy-apps only the
    workers import it, as the user; so does the check before an in-place
    reload (SIGUSR2), which imported it as root before."""
    secret = os.path.join(open_dir, "secret")
    with open(secret, "w") as f:
        f.write("root's")
    os.chmod(secret, 0o600)
    imports = os.path.join(open_dir, "imports")

    def run(*args):
        with open(imports, "w"):
            pass
        os.chmod(imports, 0o666)
        s = ServerProc("user_apps:who", "--workers", "2", "--user", "nobody", *args,
                       env={"FW_IMPORTS": imports, "FW_SECRET": secret})
        servers.append(s)
        assert wait_for(lambda: len(s.worker_pids()) == 2)
        return s

    s = run()
    assert open(imports).read() == "0 read\n"                 # preload: root, once
    s.stop()

    s = run("--lazy-apps")
    assert wait_for(lambda: open(imports).read() == f"{NOBODY.pw_uid} denied\n" * 2)
    s.signal(signal.SIGUSR2)
    assert wait_for(lambda: "Reloaded in place" in s.log(), 20), s.log()
    assert wait_for(lambda: open(imports).read().count("\n") == 5, 20), open(imports).read()   # check + 2 new
    assert set(open(imports).read().splitlines()) == {f"{NOBODY.pw_uid} denied"}
    with Conn(s.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert c.read_response().body == str(NOBODY.pw_uid).encode()


def test_an_offload_dir_a_root_run_left_is_taken_over_and_links_in_it_give_nothing_away(open_dir, servers):
    """The sibling journals as nobody now, in --offload-dir, which becomes
    nobody's, with what a run as root left there (its journal, state and
    ring were root's 0600). A user who may write there could leave a link,
    or a second name, of a file of root's: neither is given away, and the
    master opens no link for its own files."""
    d, out = os.path.join(open_dir, "offload"), os.path.join(open_dir, "out.jsonl")

    def start(*args):
        s = ServerProc("apps:offloader", "--workers", "1", "--offload-sink", f"jsonl:{out}", "--offload-dir", d,
                       "--offload-linger", "0.02", *args)
        servers.append(s)
        return s

    def emitted(s, tag, n):
        with Conn(s.port) as c:
            c.send(f"GET /emit?n={n}&id={tag} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            assert json.loads(c.read_response().body)["results"] == [True] * n

    s = start()
    emitted(s, "root", 5)
    assert wait_for(lambda: os.path.exists(out) and len(open(out).readlines()) == 5)
    assert s.stop() == 0
    assert {os.stat(os.path.join(d, n)).st_uid for n in os.listdir(d)} == {0}
    victim = os.path.join(open_dir, "victim")
    with open(victim, "w") as f:
        f.write("root's")
    os.chmod(victim, 0o600)
    os.symlink(victim, os.path.join(d, "link"))
    os.link(victim, os.path.join(d, "twin"))

    s = start("--user", "nobody")
    emitted(s, "nobody", 5)
    assert wait_for(lambda: len(open(out).readlines()) == 10)
    assert settled(s, workers=1)
    sibling = next(p for p in s.worker_pids() if title(p) == "forkwsgi: offload")
    assert_nobody(sibling)
    # As nobody, leaving SCHED_IDLE takes RLIMIT_NICE 20 (root raises it
    # before the switch, where it may): it idles only if it can leave.
    with open(f"/proc/{sibling}/limits") as f:
        nice_limit = int(next(ln for ln in f if ln.startswith("Max nice priority")).split()[3])
    assert os.sched_getscheduler(sibling) == (os.SCHED_IDLE if nice_limit >= 20 else os.SCHED_BATCH)
    st = os.stat(victim)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o600)
    assert f"{d}/twin has 2 names (hard links): not given to uid {NOBODY.pw_uid}" in s.log()
    owners = {n: os.stat(os.path.join(d, n), follow_symlinks=False).st_uid for n in os.listdir(d)}
    assert owners.pop("server.lock") == 0 and owners.pop("twin") == 0 and owners.pop("link") == 0
    assert set(owners.values()) == {NOBODY.pw_uid}, owners       # journal, state, ring, spill
    assert "sibling failed" not in s.log()
    assert s.stop() == 0

    os.unlink(os.path.join(d, "server.lock"))
    os.symlink(victim, os.path.join(d, "server.lock"))      # the master's own file: never opened through a link
    p = subprocess.run([sys.executable, "-m", "forkwsgi", "apps:offloader", "--bind", "127.0.0.1:0", "--user",
                        "nobody", "--offload-sink", f"jsonl:{out}", "--offload-dir", d],
                       capture_output=True, text=True, timeout=30, cwd=HERE,
                       env=dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert p.returncode == 2 and f"{d}/server.lock is a symbolic link" in p.stderr, p.stderr
    assert open(victim).read() == "root's"
