"""The value types of settings: each converter takes what a source gives
(text from the command line, the environment or an ini file; any Python
value from a config file) and returns the setting's value, or raises
ValueError saying what is wanted (settings.Setting.parse makes that the
one-line ConfigError). gunicorn's forms are taken where it has the setting.
"""
import ipaddress
import json

from .offload.records import topic_ok


# Counts and limits end up in C ints (the core's fw_config): a number past
# this is refused here, in one line, not by the worker that would store it.
INT_MAX = 0x7fffffff


def _c_int(n):
    if n > INT_MAX:
        raise ValueError(f"must be at most {INT_MAX}")
    return n


def positive_int(v):
    n = int(v)
    if n < 1:
        raise ValueError("must be at least 1")
    return _c_int(n)


def non_negative_int(v):
    n = int(v)
    if n < 0:
        raise ValueError("must not be negative")
    return _c_int(n)


def umask(v):
    """gunicorn's forms: an int, or text in octal ("022", "0o22") or hex ("0x12")."""
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    else:
        s = str(v).strip().lower()
        n = int(s, 0) if s.startswith(("0o", "0x")) else int(s, 8) if s.startswith("0") else int(s)
    if not 0 <= n <= 0o777:
        raise ValueError("must be 0 to 0o777")
    return n


def socket_mode(v):
    """A unix socket's mode: three octal digits (uWSGI's chmod-socket: 660,
    666), or the number itself (0o666 in a config file; what the master
    passes a worker)."""
    if isinstance(v, int) and not isinstance(v, bool):
        if not 0 <= v <= 0o7777:
            raise ValueError("a file mode, e.g. 0o660")
        return v
    s = str(v).strip().removeprefix("0o")
    if not (1 <= len(s) <= 4 and set(s) <= set("01234567")):
        raise ValueError("octal digits, e.g. 660")
    return int(s, 8)


def statsd_address(v):
    """gunicorn's statsd_host: HOST:PORT, HOST (port 8125), [IPv6]:PORT, or
    unix:PATH (unix://PATH) for a datagram socket. "" is none."""
    s = str(v).strip()
    if not s:
        return None
    if s.startswith("unix:") and not s[5:].isdigit():     # unix:8125 is the host "unix", as in gunicorn
        path = s[5:].removeprefix("//")
        if not path:
            raise ValueError("unix: needs a path")
        return "unix:" + path
    if s.startswith("["):
        host, sep, port = s[1:].partition("]")
        if not sep or (port and not port.startswith(":")):
            raise ValueError("use [ADDR]:PORT")
        port = port[1:]
    else:
        host, _, port = s.partition(":")
    port = port or "8125"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("use HOST:PORT or unix:PATH")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def env_pair(v):
    key, sep, _ = str(v).partition("=")
    if not sep or not key:
        raise ValueError("use KEY=VALUE")
    return str(v)


def root_path(v):
    p = str(v).strip().rstrip("/")
    if p and not p.startswith("/"):
        raise ValueError("must start with /")
    return p


def addresses(v):
    """gunicorn's address lists: IPs and CIDR networks (host bits zero),
    comma-separated (or a list), '*' for any; blanks and empty entries are
    ignored."""
    items = v if isinstance(v, (list, tuple)) else str(v).split(",")
    out = []
    for item in items:
        a = str(item).strip()
        if not a:
            continue
        if a != "*":
            try:
                if "%" in a:
                    raise ValueError("no zone index")
                ipaddress.ip_network(a)
            except ValueError as e:
                raise ValueError(f"{a!r} is not an IP address or network ({e})") from None
        out.append(a)
    return out


PROXY_PROTOCOL_MODES = {"off": "off", "false": "off", "0": "off", "none": "off", "no": "off",
                        "detect": "detect", "true": "detect", "1": "detect", "yes": "detect", "on": "detect",
                        "auto": "auto", "v1": "v1", "v2": "v2"}


def proxy_protocol(v):
    """gunicorn's forms: a bool (True: detect, as gunicorn's, which serves a
    connection without a header too), or off, v1, v2, auto (a header of
    either version on every connection), detect."""
    if isinstance(v, bool) or v is None:
        return "detect" if v else "off"
    mode = PROXY_PROTOCOL_MODES.get(str(v).strip().lower())
    if mode is None:
        raise ValueError("use off, v1, v2, auto or detect (or true, false)")
    return mode


def scheme_headers(v):
    """gunicorn's dict of header name to the value that means https; as
    text (command line, environment): NAME=VALUE[,NAME=VALUE], '' for none."""
    if not isinstance(v, dict):
        pairs = [p for p in str(v).split(",") if p.strip()]
        v = {}
        for p in pairs:
            name, sep, value = p.partition("=")
            if not sep:
                raise ValueError(f"{p.strip()!r}: use NAME=VALUE")
            v[name] = value.strip()
    out = {}
    for name, value in v.items():
        name = str(name).strip().upper()
        if not name or not all(ch.isalnum() or ch in "!#$%&'*+-.^`|~" for ch in name) or not name.isascii():
            raise ValueError(f"{name!r} is not a header name (use '-', not '_')")
        if not isinstance(value, str) or not value.isascii() or any(ord(ch) < 0x20 for ch in value):
            raise ValueError(f"{name}: the value must be printable text")
        out[name] = value
    return out


def json_dict(v):
    """A dict, or its JSON text (from the command line or the environment)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as e:
            raise ValueError(f"not JSON: {e}") from None
    if not isinstance(v, dict):
        raise ValueError("a dict (logging's dictConfig schema)")
    return v


def account(kind):
    """A converter for --user (kind "user") or --group ("group"): a name or
    a number that exists on this machine."""
    import grp
    import pwd
    by_id, by_name = (pwd.getpwuid, pwd.getpwnam) if kind == "user" else (grp.getgrgid, grp.getgrnam)

    def convert(v):
        s = str(v).strip()
        try:
            by_id(int(s)) if s.isdigit() else by_name(s)
        except KeyError:
            raise ValueError(f"no such {kind}") from None
        return s
    return convert


user, group = account("user"), account("group")


def socket_owner(v):
    """--chown-socket USER[:GROUP] (uWSGI's chown-socket): names or numbers
    that exist here; returned as written."""
    s = str(v).strip()
    name, sep, grp_name = s.partition(":")
    if not name and not grp_name:
        raise ValueError("USER, USER:GROUP or :GROUP")
    if name:
        user(name)
    if sep and grp_name:
        group(grp_name)
    return s


def boolean(v):
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("true or false")


def seconds(v):
    x = float(v)
    if x < 0:
        raise ValueError("must not be negative")
    return x


def brief_seconds(v):
    """Seconds, at most 0.1: a wait every response may add."""
    x = seconds(v)
    if x > 0.1:
        raise ValueError("at most 0.1 (100 ms)")
    return x


def size(v):
    """Bytes, with an optional K/M/G suffix (powers of 1024)."""
    s = str(v).strip().upper()
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suffix) or s.endswith(suffix + "B") or s.endswith(suffix + "IB"):
            s = s[: s.index(suffix)]
            mult = m
            break
    n = int(s) * mult
    if n < 0:
        raise ValueError("must not be negative")
    if n >= 1 << 62:
        raise ValueError("too large")
    return n


def rate(v):
    """Bytes a second (a size, as above), kept in a C int."""
    return _c_int(size(v))


def nice(v):
    n = int(v)
    if not -20 <= n <= 19:
        raise ValueError("a nice level from -20 to 19")
    return n


BALANCE_MODES = ("least-busy", "reuseport", "shared")
OVERFLOW_MODES = ("block", "drop", "spill")


def choice(options):
    """A converter accepting one of `options` (case-insensitive)."""
    def convert(v):
        v = str(v).strip().lower()
        if v not in options:
            raise ValueError("use " + ", ".join(options))
        return v
    return convert


balance = choice(BALANCE_MODES)
overflow = choice(OVERFLOW_MODES)
fsync = choice(("batch", "never"))
KAFKA_PRODUCERS = ("auto", "direct", "confluent")
kafka_producer = choice(KAFKA_PRODUCERS)


def kafka_brokers(spec):
    """HOST:PORT[,HOST:PORT...] -> the same, checked (bootstrap.servers)."""
    hosts = [h.strip() for h in spec.split(",")]
    for h in hosts:
        host, sep, port = h.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"kafka://HOST:PORT[,HOST:PORT]: {h!r} is not HOST:PORT")
    return ",".join(hosts)


def offload_sink(v):
    v = str(v).strip()
    kind, _, rest = v.partition(":")
    if kind == "jsonl" and rest:
        return v
    if kind == "python" and rest.count(":") == 1 and all(rest.split(":")):
        return v
    if kind == "kafka" and rest.startswith("//"):
        return "kafka://" + kafka_brokers(rest[2:])
    raise ValueError("not an offload sink: use jsonl:PATH, kafka://HOST:PORT[,HOST:PORT] or python:MODULE:FACTORY")


def kafka_option(v):
    key, sep, value = str(v).partition("=")
    if not sep or not key.strip():
        raise ValueError("KEY=VALUE (a librdkafka producer setting)")
    return f"{key.strip()}={value.strip()}"


def topic(v):
    t = str(v).strip()
    if not topic_ok(t):
        raise ValueError(f"{t!r} is not a Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)")
    return t


def log_level(v):
    s = str(v).upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("one of debug, info, warning, error, critical")
    return s

