"""--user / --group (issue 11, gunicorn's): workers drop privileges after
fork, the master keeps its own. Needs root (as CI runs)."""
import grp
import json
import os
import pwd
import subprocess
import sys

import pytest

from conftest import HERE, ServerProc
from httpraw import Conn, wait_for

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
        assert all(uid_of(p) == nobody.pw_uid for p in s.worker_pids())
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
