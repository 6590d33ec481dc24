"""An environ kept for the next request (src/environ.c): a request whose
environ the app left untouched and unshared hands it to the next request
with the same header fields, which replaces its values. Whatever the app
did to its environ, and whatever the requests before it were, every
request gets the environ a new one would have: the one the same request
gets on a fresh connection to a fresh server."""
import json

import pytest

from conftest import ServerProc
from httpraw import Conn

MUTATIONS = ["add", "del", "set", "same", "pop", "clear", "update", "setdefault", "popitem", "keep"]


def get(path, fields=b"Host: t\r\n", target=None):
    version = b"HTTP/1.1" if fields else b"HTTP/1.0\r\nConnection: keep-alive"     # (1.1 needs a Host)
    return b"GET " + (target or path).encode() + b" " + version + b"\r\n" + fields + b"\r\n"


def env_of(c, req):
    c.send(req)
    r = c.read_response()
    assert r.status == 200, r
    return json.loads(r.body)


def comparable(env):
    """The entries that do not vary between two connections and servers
    (the ports do)."""
    return {k: v for k, v in env.items() if k not in ("REMOTE_PORT", "SERVER_PORT")}


@pytest.fixture
def srv(make_server):
    return make_server("environ_apps:app")


@pytest.mark.parametrize("what", MUTATIONS)
def test_the_request_after_an_app_changed_its_environ_gets_a_whole_new_one(srv, what):
    """Twice the same request, the first time the app does `what` to its
    environ: the second gets the entries the first got."""
    with Conn(srv.port) as c:
        first = env_of(c, get(f"/?m={what}"))["env"]
        env_of(c, get("/?m=none"))                      # (a kept environ, if any, in between)
        again = env_of(c, get(f"/?m={what}"))["env"]
        after = env_of(c, get(f"/?m={what}"))["env"]
    assert first == again == after


def test_an_environ_the_app_keeps_is_not_reused(srv):
    with Conn(srv.port) as c:
        kept = env_of(c, get("/?m=keep&n=1"))["env"]
        nxt = env_of(c, get("/?m=none&n=2"))
        assert not nxt["same_as_kept"]
        assert nxt["env"]["QUERY_STRING"] == "m=none&n=2"
        assert env_of(c, get("/?m=kept&n=3"))["env"] == kept      # the kept one still holds its request's


FIELDS = [
    b"Host: t\r\n",
    b"Host: t\r\nAccept: */*\r\n",
    b"Host: t\r\nAccept: a\r\naccept: b\r\n",               # one key, two spellings: joined
    b"Host: t\r\nAccept: a\r\nAccept: b\r\nAccept: c\r\n",
    b"Host: t\r\nContent-Type: text/plain\r\nUser-Agent: x\r\n",
    b"Host: u\r\nAccept: */*\r\n",
    b"",
]


def test_requests_of_other_fields_in_turn_get_the_environ_a_fresh_server_gives(make_server):
    """Requests of different header fields, targets and scheme headers,
    each sent twice and in turn on one connection (so each may get the
    environ the one before left): each gets exactly the environ it gets as
    the first request to a fresh server."""
    cases = []
    for f in FIELDS:
        cases.append(get("/a?q=1", f))
        cases.append(get("/b", f))
    cases.append(get("/", b"Host: t\r\n", target="http://other.example/abs"))
    # The same keys (HTTP_HOST twice): the Host field's value changes, the
    # target's host (HTTP_HOST's value) does not.
    cases.append(get("/", b"Host: u\r\n", target="http://other.example/abs"))
    # The same keys, one value of the request line changing at a time: the
    # method (one the server knows by name, and one it does not), the
    # protocol, a path that decodes to another's.
    for line in (b"DELETE /b HTTP/1.1", b"PURGE /b HTTP/1.1", b"GET /b HTTP/1.0", b"GET /x%41 HTTP/1.1",
                 b"GET /xA HTTP/1.1", b"GET /xA?q=1 HTTP/1.1"):
        cases.append(line + b"\r\nHost: t\r\nConnection: keep-alive\r\n\r\n")
    cases.append(get("/b", b"Host: t\r\nAccept: a\r\n"))     # a field's value only
    cases.append(get("/b", b"Host: t\r\nAccept: \r\n"))
    cases.append(get("/", b"Host: t\r\nX-Forwarded-Proto: https\r\n"))
    cases.append(get("/", b"Host: t\r\nX-Forwarded-Proto: http\r\n"))
    for args in ((), ("--forwarded-allow-ips", "127.0.0.1")):
        s = make_server("environ_apps:app", *args)
        order = cases + cases[::-1] + cases
        with Conn(s.port) as c:
            seen = [comparable(env_of(c, req)["env"]) for req in order]
        s.stop()
        want = {}
        for req in cases:
            fresh = make_server("environ_apps:app", *args)
            with Conn(fresh.port) as c:
                want[req] = comparable(env_of(c, req)["env"])
            fresh.stop()
        for i, req in enumerate(order):
            assert seen[i] == want[req], (args, i, req)


def test_a_kept_environ_changed_while_it_waited_is_not_reused(srv):
    """An app that finds the environ the server keeps (through gc) and
    changes it: the next request with its fields does not get the change."""
    accept = fields(("Host", "t"), ("Accept", "a"))
    with Conn(srv.port) as c:
        assert env_of(c, get("/?m=none", accept))["env"]["HTTP_ACCEPT"] == "a"          # kept
        env_of(c, get("/?m=poke", accept + b"X-Poke: 1\r\n"))   # other fields: a new one, which pokes
        assert env_of(c, get("/?m=none", accept))["env"]["HTTP_ACCEPT"] == "a"


def test_requests_of_two_connections_in_turn_get_their_own_peer(srv):
    """The same request on two connections in turn (one process: the
    second may get the environ the first left): each gets its own
    connection's REMOTE_PORT."""
    with Conn(srv.port) as a, Conn(srv.port) as b:
        for _ in range(3):
            for c in (a, b, b, a):
                env = env_of(c, get("/?m=none"))["env"]
                assert (env["REMOTE_ADDR"], int(env["REMOTE_PORT"])) == c.sock.getsockname()


# src/strcache.c's slot of a string (sc_hash & (FW_STRCACHE_SLOTS - 1)),
# mirrored here to evict one entry of the key cache on purpose.
_M64 = (1 << 64) - 1


def _strcache_slot(p):
    def load(size, i):
        return int.from_bytes(p[i:i + size], "little")
    n = len(p)
    if n >= 8:
        a, b, i = load(8, 0), load(8, n - 8), 8
        while i + 8 < n:
            a = ((a ^ load(8, i)) * 0x9E3779B97F4A7C15) & _M64
            i += 8
    elif n >= 4:
        a, b = load(4, 0), load(4, n - 4)
    else:
        a, b = (p[0] | p[n // 2] << 8 | p[n - 1] << 16) if n else 0, 0
    h = ((a * 0xff51afd7ed558ccd) & _M64) ^ ((b * 0xc4ceb9fe1a85ec53) & _M64) ^ n
    return (h ^ (h >> 31)) & 127


def fields(*pairs):
    return b"".join(k.encode() + b": " + v.encode() + b"\r\n" for k, v in pairs)


def test_a_repeated_field_spelled_otherwise_then_evicted_from_the_key_cache(srv):
    """Accept and ACCEPT have a key str each in the key cache; the kept
    environ holds the first. At 5bdf557 its key list named the second,
    which a colliding name then evicted and freed; a new key str took its
    address, and a request with that field matched the kept environ by
    pointer, grew it, and was answered 500 (357 of 400 rounds, found by
    review). Each round: the repeated field (kept), a request of 25 fields
    (never kept) that evicts "ACCEPT" and makes new keys, then one of them
    with Accept."""
    evictor = next(n for n in (f"X-N{i}" for i in range(10000))
                   if _strcache_slot(n.encode()) == _strcache_slot(b"ACCEPT"))
    taken = {_strcache_slot(b"Accept"), _strcache_slot(b"ACCEPT"), _strcache_slot(evictor.encode())}
    names = [m for m in (f"X-M{i}" for i in range(100000)) if _strcache_slot(m.encode()) not in taken][:150]
    filler = [(f"F{j:02d}", "1") for j in range(22)]
    with Conn(srv.port) as c:
        for name in names:
            for req in (get("/", fields(("Host", "t"), ("Accept", "a"), ("ACCEPT", "b"))),
                        get("/", fields(("Host", "t"), (evictor, "1"), (name, "1"), *filler)),
                        get("/", fields(("Host", "t"), ("Accept", "x"), (name, "y")))):
                env = env_of(c, req)["env"]
            assert env["HTTP_ACCEPT"] == "x" and env[f"HTTP_{name.upper().replace('-', '_')}"] == "y"
