"""The embedding API: forkwsgi.Server / forkwsgi.run, several servers per process."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

import forkwsgi
from conftest import HERE
from httpraw import request, serves_on_unix, wait_for

sys.path.insert(0, HERE)
import apps  # noqa: E402


def serve_in_thread(server):
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    return t


def test_server_object_serve_and_stop():
    with forkwsgi.Server(apps.echo, bind="127.0.0.1:0", keepalive=2) as srv:
        port = srv.addresses[0][1]
        t = serve_in_thread(srv)
        assert wait_for(lambda: _ok(port))
        r = request(port, b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        assert json.loads(r.body)["path"] == "/x"
        srv.stop()
        t.join(10)
        assert not t.is_alive()


def test_several_servers_in_one_process():
    servers = [forkwsgi.Server(apps.pid if i else apps.echo, host="127.0.0.1", port=0) for i in range(3)]
    threads = [serve_in_thread(s) for s in servers]
    try:
        for s in servers:
            port = s.addresses[0][1]
            assert wait_for(lambda: _ok(port))
            assert request(port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").status == 200
    finally:
        for s in servers:
            s.stop()
        for t in threads:
            t.join(10)
        for s in servers:
            s.close()
    assert not any(t.is_alive() for t in threads)


def test_bad_options_raise_clearly():
    with pytest.raises(forkwsgi.config.ConfigError, match="unknown setting 'nope'"):
        forkwsgi.Server(apps.echo, bind="127.0.0.1:0", nope=1)
    with pytest.raises(forkwsgi.config.ConfigError, match="invalid value for --keep-alive"):
        forkwsgi.Server(apps.echo, bind="127.0.0.1:0", keepalive="x")
    with pytest.raises(TypeError):
        forkwsgi.Server("not callable")


def test_run_in_a_process_stops_on_sigterm(tmp_path):
    script = tmp_path / "embedded.py"
    script.write_text(
        "import sys, logging\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "import forkwsgi, apps\n"
        "forkwsgi.run(apps.echo, host='127.0.0.1', port=int(sys.argv[1]), keepalive=1)\n"
        "print('returned', flush=True)\n")
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _ok(port), timeout=15)
        assert request(port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").status == 200
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=10)
        assert p.returncode == 0 and "returned" in out, err
    finally:
        if p.poll() is None:
            p.kill()


def _ok(port):
    try:
        return request(port, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", timeout=2).status == 200
    except OSError:
        return False


def test_failed_construction_releases_the_port():
    import socket
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    try:
        forkwsgi.Server(apps.echo, bind=f"127.0.0.1:{port}", limit_request_line=10)   # below the C minimum
    except ValueError as e:
        held = e    # kept, as a logger's exc_info would: its frames keep the half-built Server alive
    else:
        raise AssertionError("no ValueError")
    with forkwsgi.Server(apps.echo, bind=f"127.0.0.1:{port}"):   # the port is free all the same
        pass
    assert "invalid limits" in str(held)


@pytest.mark.parametrize("call", ['forkwsgi.run(apps.echo, "unix:" + sys.argv[1])',
                                  'forkwsgi.run(apps.echo, bind="unix:" + sys.argv[1])'],
                         ids=["bjoern-form", "bind-keyword"])
def test_run_on_a_unix_socket_opens_nothing_else(tmp_path, call):
    """Issue 25, item 17: bjoern's forkwsgi.run(app, "unix:/path") raised
    "cannot listen on [unix:/path]:8000", and run(app, bind="unix:/path")
    served the socket and also 127.0.0.1:8000, which nobody asked for."""
    import socket
    path = str(tmp_path / "app.sock")
    script = tmp_path / "bjoern_style.py"
    script.write_text("import sys\n"
                      f"sys.path.insert(0, {HERE!r})\n"
                      "import forkwsgi, apps\n"
                      f"{call}\n")
    p = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert wait_for(lambda: serves_on_unix(path, 2), timeout=15), \
            p.stderr.read() if p.poll() is not None else "not serving"
        listening = open(f"/proc/{p.pid}/net/tcp").read().splitlines()[1:]
        mine = {line.split()[9] for line in listening if line.split()[3] == "0A"}    # LISTEN, by inode
        fds = {os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{p.pid}/fd")}
        assert not any(f"socket:[{inode}]" in fds for inode in mine), "a TCP port nobody asked for"
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def test_run_with_bjoerns_host_and_port():
    """bjoern.run(app, host, port) by position works as it is."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with forkwsgi.Server(apps.echo, host="127.0.0.1", port=port) as srv:
        assert srv.addresses == [("127.0.0.1", port)]
    assert forkwsgi.server.address("::1", 9000) == "[::1]:9000"
    assert forkwsgi.server.address("unix:/run/a.sock", 9000) == "unix:/run/a.sock"


# bjoern's pre-fork pattern and SO_REUSEPORT: each process serves with a loop
# of its own. The script prints each response body (the serving pid), and
# how each child ended.
BJOERN_PREFORK = """
import http.client, os, signal, sys, threading, time
sys.path.insert(0, {here!r})
import forkwsgi, apps
form, port = sys.argv[1], int(sys.argv[2])
kids = []
if form == "listen-fork":
    sock = forkwsgi.listen(apps.pid, "127.0.0.1", port)
    assert sock.getsockname() == ("127.0.0.1", port), sock     # bjoern returns the socket
    for call in (lambda: forkwsgi.listen(apps.pid, "127.0.0.1", port + 1),
                 lambda: forkwsgi.run(apps.pid, "127.0.0.1", port + 1)):
        try:
            call()
            raise SystemExit("a second listen() (or a run() with an app) was taken")
        except RuntimeError:
            pass
for i in range(2):
    pid = os.fork()
    if pid == 0:
        try:
            if form == "listen-fork":
                forkwsgi.run()
            else:
                forkwsgi.run(apps.pid, "127.0.0.1", port, reuse_port=True)
        finally:
            os._exit(0)
    kids.append(pid)
seen, lock = {{}}, threading.Lock()
def client():
    for _ in range(25):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            for _ in range(3):
                c.request("GET", "/")
                body = c.getresponse().read().decode()
            c.close()
        except (OSError, http.client.HTTPException) as e:
            body = type(e).__name__
        with lock:
            seen[body] = seen.get(body, 0) + 1
deadline = time.monotonic() + 15
while time.monotonic() < deadline:
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/")
        break
    except OSError:
        time.sleep(0.05)
threads = [threading.Thread(target=client) for _ in range(8)]
[t.start() for t in threads]
[t.join(30) for t in threads]
ends = []
for k in kids:
    os.kill(k, signal.SIGTERM)
    ends.append(os.waitpid(k, 0)[1])
print(repr((sorted(seen.items()), ends)))
"""


@pytest.mark.parametrize("form", ["listen-fork", "reuse-port"])
def test_bjoern_prefork_forms_serve_from_every_process(tmp_path, form):
    """bjoern's listen() then fork() then run() in each child, and run(...,
    reuse_port=True) in independent processes: every process serves, none
    crashes, no request fails. listen() used to build the C loop (its epoll
    set) before the fork, which the children then shared: one served it
    all and the other died of a segfault under 8 keep-alive clients; and
    reuse_port changed nothing, so the second process could not bind."""
    import ast
    from httpraw import free_port
    script = tmp_path / "prefork.py"
    script.write_text(BJOERN_PREFORK.format(here=HERE))
    p = subprocess.run([sys.executable, str(script), form, str(free_port())], capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, p.stderr[-2000:]
    seen, ends = ast.literal_eval(p.stdout.strip().splitlines()[-1])
    bodies = dict(seen)
    assert sum(bodies.values()) == 200 and all(b.isdigit() for b in bodies), seen
    assert len(bodies) == 2, f"not every process served: {seen}"
    assert ends == [0, 0], f"a child did not end cleanly (wait statuses {ends}): {p.stderr[-2000:]}"


def test_run_removes_its_unix_socket_file_when_it_ends(tmp_path):
    """bjoern unlinks a unix socket's file when run() ends; so does forkwsgi.run."""
    import socket
    path = str(tmp_path / "app.sock")
    script = tmp_path / "unix_run.py"
    script.write_text(f"import sys\nsys.path.insert(0, {HERE!r})\nimport forkwsgi, apps\n"
                      "forkwsgi.run(apps.echo, 'unix:' + sys.argv[1])\n")
    p = subprocess.Popen([sys.executable, str(script), path], stderr=subprocess.PIPE, text=True)
    try:
        def up():
            try:
                with socket.socket(socket.AF_UNIX) as c:
                    c.connect(path)
                    return True
            except OSError:
                return False
        assert wait_for(up, timeout=15)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(15)
    assert p.returncode == 0, p.stderr.read()[-1000:]
    assert not os.path.exists(path)
