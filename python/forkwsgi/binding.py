"""Listening sockets from --bind addresses.

The master side binds everything before any worker exists, so a port in use
is one clear error at start-up and never a half-started server.
"""
import os
import socket
import stat


class BindError(Exception):
    pass


def listeners(cfg):
    """What to listen on: (address, protocol) for the --bind addresses (they
    speak --protocol, http unless told), then the --uwsgi-socket ones."""
    return [(a, cfg["protocol"]) for a in cfg["bind"]] + [(a, "uwsgi") for a in cfg["uwsgi_socket"]]


def parse(addr, any_host="0.0.0.0"):
    """'HOST:PORT' (or gunicorn's tcp://HOST:PORT, or HOST alone: port
    8000), '[::1]:PORT', ':PORT', 'PORT', 'unix:/path' or 'fd://N' -> (kind, value).
    A port without a host listens on any_host (every address, for --bind)."""
    a = addr.strip()
    if a.startswith("tcp://"):            # gunicorn's spelling of HOST:PORT
        a = a[6:]
    if a.startswith("unix:"):
        path = a[5:]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise BindError(f"invalid bind address {addr!r}: empty unix socket path")
        return "unix", path
    if a.startswith("fd://"):
        try:
            fd = int(a[5:])
        except ValueError:
            raise BindError(f"invalid bind address {addr!r}: fd://N needs a number") from None
        return "fd", fd
    if a.startswith("["):
        host, sep, port = a[1:].partition("]")
        if not sep or (port and not port.startswith(":")):
            raise BindError(f"invalid bind address {addr!r}: use [ADDR]:PORT")
        port = port[1:]
        family = socket.AF_INET6
    elif a.count(":") == 1:
        host, _, port = a.partition(":")
        family = socket.AF_INET
    elif a.isdigit():
        host, port, family = any_host, a, socket.AF_INET
    elif a and ":" not in a and "/" not in a:
        host, port, family = a, "8000", socket.AF_INET    # a host alone: port 8000, as gunicorn
    else:
        raise BindError(f"invalid bind address {addr!r}: use HOST:PORT, [ADDR]:PORT, unix:/path or fd://N")
    try:
        port = int(port)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise BindError(f"invalid port in bind address {addr!r}") from None
    host = host or (any_host if family == socket.AF_INET else "::")
    if family == socket.AF_INET:
        try:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise BindError(f"cannot resolve {host!r} in bind address {addr!r}: {e.strerror}") from None
        family = infos[0][0]
        host = infos[0][4][0]
    return "tcp", (family, host, port)


def unix_umask(setting):
    """The umask a server's unix socket is made with: --umask when set,
    else 0 as gunicorn's default umask: mode 0777, so a proxy running as
    another user (nginx as www-data) may connect. Who can reach the socket
    is then up to the directory it is in."""
    return 0 if setting is None else setting


def create(addr, backlog, reuseport=False, any_host="0.0.0.0", umask=None, mode=None):
    """Bind and listen; returns a non-blocking socket.socket.

    reuseport: TCP only; the socket does not listen: it holds the port, and
    reuseport_peer() makes the listening sockets of the group. any_host:
    where a port given alone listens (see parse). umask: a unix socket is
    made under this one (see unix_umask), else under the process's; mode:
    its file mode outright (--chmod-socket), set before it listens."""
    kind, value = parse(addr, any_host)
    if reuseport and kind != "tcp":
        raise BindError(f"--balance reuseport needs HOST:PORT addresses, not {addr!r}")
    try:
        if kind == "fd":
            try:
                sock = socket.socket(fileno=value)
            except OSError as e:
                raise BindError(f"fd://{value} is not a usable socket: {e.strerror}") from None
            if sock.type != socket.SOCK_STREAM:
                raise BindError(f"fd://{value} is not a stream socket")
            sock.listen(backlog)
        elif kind == "unix" and value.startswith("@"):
            # Linux's abstract namespace (bjoern's and uWSGI's unix:@name):
            # no file, so no mode, no owner and nothing to remove.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind("\0" + value[1:])
            sock.listen(backlog)
        elif kind == "unix":
            try:
                if stat.S_ISSOCK(os.stat(value).st_mode):
                    os.unlink(value)   # a stale socket of an earlier run
            except FileNotFoundError:
                pass
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # bind() makes the file; its mode is 0777 less the umask.
            old = os.umask(umask) if umask is not None else None
            try:
                sock.bind(value)
            finally:
                if old is not None:
                    os.umask(old)
            if mode is not None:
                os.chmod(value, mode)
            sock.listen(backlog)
        else:
            family, host, port = value
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # IPV6_V6ONLY is left as the system has it, as gunicorn does:
            # on Linux (net.ipv6.bindv6only=0) [::] takes IPv4 clients too.
            sock.bind((host, port))
            if reuseport:
                # Only after bind(): bound with SO_REUSEPORT, the socket would
                # join the group of another server listening there with it
                # (same user) and take a share of its connections. Without
                # it, bind() refuses a taken port as in the other modes; the
                # workers' sockets (reuseport_peer) then join this one.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            else:
                sock.listen(backlog)
    except BindError:
        raise
    except OSError as e:
        raise BindError(f"cannot listen on {addr}: {e.strerror or e}") from None
    sock.setblocking(False)
    os.set_inheritable(sock.fileno(), True)
    return sock


def reuseport_peer(sock, backlog, listen=True):
    """A listening socket in the SO_REUSEPORT group of `sock` (made by
    create(..., reuseport=True)), for one worker. listen=False: bound only;
    it joins the group (the kernel gives it connections) once its owner
    calls listen(backlog)."""
    peer = socket.socket(sock.family, socket.SOCK_STREAM)
    try:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if sock.family == socket.AF_INET6:        # as the group's first socket has it
            peer.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY,
                            sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
        peer.bind(sock.getsockname()[:2])
        if listen:
            peer.listen(backlog)
    except OSError:
        peer.close()
        raise
    peer.setblocking(False)
    return peer


def describe(sock, protocol="http"):
    """(SERVER_NAME, SERVER_PORT, printable URL) for a listening socket that
    speaks `protocol` (http or uwsgi)."""
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        path = name if isinstance(name, str) else name.decode("latin-1")
        if path.startswith("\0"):
            path = "@" + path[1:]          # abstract, as it was written
        return path, "", f"unix:{path}" + (" (uwsgi)" if protocol == "uwsgi" else "")
    host, port = name[0], name[1]
    netloc = f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"
    return host, str(port), f"{protocol}://{netloc}"


def loopback_only(addr):
    """Question: does a listening address reach this machine's peers only (a
    unix socket, a passed fd, 127.0.0.0/8, ::1, localhost)?"""
    if addr.startswith(("unix:", "fd://")) or ":" not in addr:
        return True
    host = addr.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")
