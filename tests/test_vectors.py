"""Public HTTP/1.1 parser test vectors, replayed through a real forkwsgi server.

The vectors (gunicorn, llhttp, h11, picohttpparser, smuggler; see
tests/vectors/README.md for origin and licences) are normalised into
tests/vectors/cases/*.json. Each case has an `id`, a `payload` (one char per
byte, latin-1) and an `expect` kind:

  valid            every declared request answered 200, fields as declared
  invalid          4xx/5xx or close, never a 200 for the bad part
  valid_or_reject  accepted exactly as declared, or 4xx/5xx/close
  limit            accepted exactly, or 414/431/400
  incomplete       (invalid + incomplete: true) no answer; the server waits,
                   then times out (408) or closes
  model            several RFC readings are legal (obs-fold, bare LF/CR, CTLs):
                   any of them, or a rejection; see MODEL below
  smuggle          a Transfer-Encoding gadget next to Content-Length: reject,
                   use CL, or use chunked and close; never serve /smuggled
  any              anything but a crash or a hang

forkwsgi policy encoded on top of the vectors:
  * HTTP/1.1 without Host -> 400. Cases with such requests run twice: as sent
    (the first host-less HTTP/1.1 request must not be served; for `valid`
    it must be exactly 400) and as "<id>+host" with "Host: vectors.test"
    inserted after each host-less HTTP/1.1 request line (then the declared
    parse must hold; HTTP_HOST is checked to be vectors.test and otherwise
    ignored). Invalid/model cases that are host-less get the +host variant
    too, so that their real defect is what gets tested, not the missing Host.
  * header names with '_' never reach the environ; repeated headers are
    joined with ", "; trailers never reach the environ.
  * a fragment is stripped from PATH_INFO/QUERY_STRING; RAW_URI keeps it.
  * errors are 400/413/414/417/431/501/505 (408 on a timeout) and the
    connection is closed after them.

Echo JSON (tests/apps.py echo; HEAD gets it in X-Echo, tests/vector_apps.py)
vs declared fields: method -> method, target -> raw_uri, path -> path after
one percent-decoding, query -> query, version -> protocol, headers ->
HTTP_*/CONTENT_TYPE/CONTENT_LENGTH, body -> body.
"""
import glob
import json
import os
import re
import socket
import time
import urllib.parse

import pytest

from conftest import ServerProc, mode_env
from httpraw import Closed, Conn

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "vectors", "cases")
HOST = "vectors.test"
ERROR_CODES = {400, 413, 414, 417, 431, 501, 505}
LIMIT_CODES = {400, 414, 431}
WAIT = 3.0          # seconds to wait for an answer or a close
APP = "vector_apps:echo"


# --------------------------------------------------------------------------
# servers


class Live:
    """A module-scoped server that is restarted if a case killed it (that case
    fails; the following ones get a fresh server instead of a cascade)."""

    def __init__(self, app_mode, *args):
        self.args = args
        self.env = mode_env(app_mode)
        self.proc = ServerProc(APP, *args, env=self.env)

    def get(self):
        if not self.proc.alive():
            self.proc.stop()
            self.proc = ServerProc(APP, *self.args, env=self.env)
        return self.proc

    def stop(self):
        self.proc.stop()


@pytest.fixture(scope="module")
def vserver(app_mode):
    """Default timeouts: complete payloads (valid, valid_or_reject, limit, smuggle, any)."""
    s = Live(app_mode)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def quick(app_mode):
    """Short timeouts: payloads the server may legitimately wait on (invalid, model, incomplete)."""
    s = Live(app_mode, "--header-timeout", "1", "--body-timeout", "1")
    yield s
    s.stop()


def health_problems(srv, log_mark):
    problems = []
    if not srv.alive():
        return [f"server process died (rc={srv.proc.returncode}); log tail:\n{srv.log()[-2000:]}"]
    try:
        r = srv.get("/health")
        if r.status != 200 or json.loads(r.body)["path"] != "/health":
            problems.append(f"normal GET after the case answered {r.status} {r.body[:200]!r}")
    except Exception as e:  # noqa: BLE001
        problems.append(f"normal GET after the case failed: {e!r}")
    new_log = srv.log()[log_mark:]
    if "Traceback" in new_log or "Segmentation" in new_log:
        problems.append("server log shows an error:\n" + new_log[-3000:])
    return problems


# --------------------------------------------------------------------------
# cases and variants


def load_cases():
    cases = []
    for path in sorted(glob.glob(os.path.join(CASES_DIR, "*.json"))):
        with open(path, encoding="utf-8") as f:
            cases.extend(json.load(f))
    return cases


def simple_parse(payload):
    """Declared request for a well-formed `limit` case that lists none."""
    head, _, rest = payload.partition("\r\n\r\n")
    lines = head.split("\r\n")
    method, target, version = lines[0].split(" ")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append([name.upper(), value.strip(" \t")])
    cl = int(dict(headers).get("CONTENT-LENGTH", "0"))
    path, _, query = target.partition("?")
    return {"method": method, "target": target, "path": path, "query": query, "fragment": "",
            "version": version[len("HTTP/"):], "headers": headers, "body": rest[:cl]}


def hostless(req):
    return req["version"] == "1.1" and not any(h[0].upper() == "HOST" for h in req["headers"])


def insert_host_declared(payload, reqs):
    """Insert a Host line after the request line of each host-less HTTP/1.1
    declared request (request lines are located in order, at line starts)."""
    out, pos, added = payload, 0, set()
    for i, r in enumerate(reqs):
        pat = re.compile(re.escape(r["method"]) + " +" + re.escape(r["target"])
                         + " +HTTP/" + re.escape(r["version"]) + r"(\r\n|\n)")
        for m in pat.finditer(out, pos):
            if m.start() == 0 or out[m.start() - 1] == "\n":
                break
        else:
            raise LookupError(f"request line of request {i} not found in payload")
        end = m.end()
        if hostless(r):
            line = "Host: " + HOST + m.group(1)
            out = out[:end] + line + out[end:]
            end += len(line)
            added.add(i)
        pos = end
    return out, added


FIRST_LINE_11 = re.compile(r"[^\r\n]* HTTP/1\.1(\r\n|\n)")


def insert_host_generic(payload):
    """For cases without declared requests: insert Host after the first line
    if it is an HTTP/1.1 request line, the head shows no Host at all and the
    next line does not start with whitespace (that would change the case into
    an obs-fold of our Host). None if not applicable."""
    m = FIRST_LINE_11.match(payload)
    if not m:
        return None
    head = re.split(r"\r?\n\r?\n", payload, maxsplit=1)[0]
    if re.search(r"(?im)^[ \t]*host[ \t]*:", head):
        return None
    nxt = payload[m.end():m.end() + 1]
    if nxt in (" ", "\t"):
        return None
    return payload[:m.end()] + "Host: " + HOST + m.group(1) + payload[m.end():]


# Cases whose label is an upstream project's policy rather than RFC 9110/9112
# (the shared README promises the RFC's view): relabelled here, with the reason.
RELABEL = {
    "gunicorn/invalid/003c": dict(
        expect="valid_or_reject",
        requests=[{"method": "-bl", "target": "/foo", "path": "/foo", "query": "", "fragment": "",
                   "version": "1.1", "headers": [], "body": ""}],
        why="'-bl' is a legal method token (RFC 9110 9.1, tchar includes '-'); gunicorn rejects it by "
            "policy; gunicorn/valid/031compat ('-blargh') is already valid_or_reject"),
    "llhttp/uri:224": dict(
        expect="valid_or_reject",
        why="userinfo in an http(s) URI: RFC 9110 4.2.4 says a recipient SHOULD treat it as an error; "
            "gunicorn/valid/rfc9112_target_absolute_userinfo_01 is already valid_or_reject"),
}


def _unescape_llhttp_tab(case):
    """llhttp's log escapes a real TAB as the two characters '\\t'; the payload has a real TAB."""
    reqs = json.loads(json.dumps(case["requests"]))
    for r in reqs:
        r["headers"] = [[n, v.replace("\\t", "\t")] for n, v in r["headers"]]
    return reqs


for _id in ("llhttp/connection:266", "llhttp/connection:346"):
    RELABEL[_id] = dict(expect="valid", requests=_unescape_llhttp_tab,
                        why="expected 'Connection: close\\t' is llhttp's escaped log text for a real TAB "
                            "(OWS, so the field value is 'close')")


def relabel(case):
    fix = RELABEL.get(case["id"])
    if not fix:
        return case
    case = dict(case, expect=fix["expect"], note=(case.get("note") or "") + " | relabelled: " + fix["why"])
    if "requests" in fix:
        reqs = fix["requests"]
        case["requests"] = reqs(case) if callable(reqs) else reqs
    return case


def kind_of(case):
    return "incomplete" if case.get("incomplete") else case["expect"]


def build_params():
    params = []
    for case in map(relabel, load_cases()):
        kind = kind_of(case)
        cid = case["id"]
        reqs = case.get("requests")
        if kind == "limit" and not reqs:
            reqs = [simple_parse(case["payload"])]
        declared = kind in ("valid", "valid_or_reject", "limit") or (kind == "model" and reqs)
        if declared:
            v = {"kind": kind, "payload": case["payload"], "reqs": reqs, "added": set(), "plus_host": False,
                 "first_hostless": next((i for i, r in enumerate(reqs) if hostless(r)), None)}
            params.append(pytest.param(case, v, id=cid))
            if v["first_hostless"] is not None:
                payload, added = insert_host_declared(case["payload"], reqs)
                params.append(pytest.param(case, dict(v, payload=payload, added=added, plus_host=True,
                                                      first_hostless=None), id=cid + "+host"))
            continue
        v = {"kind": kind, "payload": case.get("payload"), "reqs": None, "added": set(), "plus_host": False,
             "first_hostless": None}
        if kind == "model":
            assert cid in MODEL, f"model case {cid} has no entry in MODEL"
        params.append(pytest.param(case, v, id=cid))
        if kind in ("invalid", "model"):
            payload = insert_host_generic(case["payload"])
            if payload is not None:
                if kind == "model":
                    assert "host" in MODEL[cid], f"model case {cid} needs MODEL[...]['host'] readings"
                params.append(pytest.param(case, dict(v, payload=payload, plus_host=True), id=cid + "+host"))
    return params


# --------------------------------------------------------------------------
# wire helpers

CLOSED = "closed"
TIMEOUT = "timeout"


class Garbage:
    def __init__(self, data, err):
        self.data, self.err = data, err

    def __repr__(self):
        return f"<unparseable answer {self.data[:300]!r}: {self.err!r}>"


TRACE = []   # what the server answered in the current case (for VECTORS_REPORT)


def next_event(conn, method="GET"):
    """The next final response, or CLOSED / TIMEOUT / Garbage."""
    ev = _next_event(conn, method)
    if isinstance(ev, (str, Garbage)):
        TRACE.append(repr(ev))
    elif ev.status == 200:
        try:
            e = echo_of(ev, method)
            TRACE.append(f"200 {e['method']} {e['raw_uri']!r} path={e['path']!r} body={e['body'][:60]!r} "
                         f"headers={e['headers']}")
        except Exception:  # noqa: BLE001
            TRACE.append(f"200 (no echo) {ev.body[:100]!r}")
    else:
        TRACE.append(f"{ev.status}")
    return ev


def _next_event(conn, method):
    try:
        while True:
            r = conn.read_response(method)
            if not 100 <= r.status < 200:
                break
    except Closed:
        return Garbage(conn.buf, "closed mid-response") if conn.buf else CLOSED
    except ConnectionResetError:
        return CLOSED
    except socket.timeout:
        return Garbage(conn.buf, "timeout mid-response") if conn.buf else TIMEOUT
    except (ValueError, IndexError, AssertionError) as e:
        return Garbage(conn.buf, e)
    return r


def assert_closes(conn, what):
    closed = conn.is_closed(WAIT)
    assert closed, f"connection not closed within {WAIT}s after {what}"
    assert conn.buf == b"", f"more data after {what}: {conn.buf[:300]!r}"


def echo_of(r, method):
    if method == "HEAD":
        raw = r.header("x-echo")
        assert raw is not None, f"HEAD response without X-Echo: {r.raw_head!r}"
        return json.loads(raw)
    return json.loads(r.body)


def guess_method(payload):
    return "HEAD" if payload.startswith("HEAD ") else "GET"


def describe(r):
    if isinstance(r, str) or isinstance(r, Garbage):
        return repr(r)
    return f"{r.status} {r.reason} {r.body[:300]!r}"


# --------------------------------------------------------------------------
# field comparison


def env_key(name):
    n = name.upper()
    if n in ("CONTENT-TYPE", "CONTENT-LENGTH"):
        return n.replace("-", "_")
    return "HTTP_" + n.replace("-", "_")


def expected_env(headers):
    env = {}
    for name, value in headers:
        if "_" in name:
            continue          # dropped by the server, must be absent
        value = value.strip(" \t")   # OWS is not part of a field value (RFC 9112 5)
        k = env_key(name)
        env[k] = env[k] + ", " + value if k in env else value
    return env


def ws(v):
    return " ".join(v.split())


def expected_path(target, path):
    """Acceptable PATH_INFO values for a declared target/path (None: no check)."""
    if target == "*":
        return {"*", ""}
    if not target.startswith("/") and "://" not in target:
        return None               # authority-form (CONNECT): no path in WSGI terms
    p = urllib.parse.unquote_to_bytes(path).decode("latin-1")
    if "://" in target and p == "":
        return {"", "/"}          # empty path of an http(s) URI is "/" (RFC 3986 6.2.3)
    return {p}


def absolute_authority(target):
    """host[:port] of an absolute-form target, else None."""
    m = re.match(r"(?i)https?://([^/?#]*)", target)
    return m.group(1) if m else None


def request_errors(exp, got, host_added=False, fold=False):
    errs = []

    def chk(field, want, have):
        if want != have:
            errs.append(f"{field}: want {want!r}, got {have!r}")

    chk("method", exp["method"], got["method"])
    chk("raw_uri", exp["target"], got["raw_uri"])
    paths = expected_path(exp["target"], exp["path"])
    if paths is not None:
        if got["path"] not in paths:
            errs.append(f"path: want one of {sorted(paths)!r}, got {got['path']!r}")
        chk("query", exp["query"], got["query"])
    chk("protocol", "HTTP/" + exp["version"], got["protocol"])
    have = dict(got["headers"])
    want = expected_env(exp["headers"])
    authority = absolute_authority(exp["target"])
    if authority is not None:
        # RFC 9112 3.2.2: an absolute-form target names the host; the
        # server ignores Host (present, or inserted by this runner).
        want.pop("HTTP_HOST", None)
        chk("HTTP_HOST (the absolute-form target's)", authority, have.pop("HTTP_HOST", None))
    elif host_added:
        chk("HTTP_HOST (inserted)", HOST, have.pop("HTTP_HOST", None))
    if fold:
        want = {k: ws(v) for k, v in want.items()}
        have = {k: ws(v) for k, v in have.items()}
    for k in sorted(set(want) | set(have)):
        if want.get(k) != have.get(k):
            errs.append(f"env {k}: want {want.get(k)!r}, got {have.get(k)!r}")
    chk("body", exp["body"], got["body"])
    return errs


# --------------------------------------------------------------------------
# runners, one per expect kind


def run_valid(srv, case, v):
    reqs, k = v["reqs"], v["first_hostless"]
    min_resp = case.get("min_responses", len(reqs))
    n = len(reqs) if k is None else k + 1
    with srv.conn(timeout=WAIT) as c:
        c.send(v["payload"].encode("latin-1"))
        for i in range(n):
            r = next_event(c, reqs[i]["method"])
            if r is CLOSED and i >= min_resp:
                return        # the server may close here (e.g. after an HTTP/1.0 request)
            assert not isinstance(r, (str, Garbage)), f"request {i}: expected a response, got {describe(r)}"
            if i == k:
                assert r.status == 400, (f"request {i} is HTTP/1.1 without Host: want 400, got {describe(r)}")
                assert_closes(c, "the 400")
                return
            assert r.status == 200, f"request {i}: want 200, got {describe(r)}"
            errs = request_errors(reqs[i], echo_of(r, reqs[i]["method"]), host_added=i in v["added"])
            assert not errs, f"request {i} parsed differently:\n  " + "\n  ".join(errs)
        if case.get("after") == "close":
            assert_closes(c, f"response {n - 1} (after: close)")


def run_lenient(srv, case, v, codes, fold=False):
    """valid_or_reject / limit / model with declared requests: each request is
    accepted exactly as declared, or rejected (then the connection closes)."""
    reqs, k = v["reqs"], v["first_hostless"]
    with srv.conn(timeout=WAIT) as c:
        c.send(v["payload"].encode("latin-1"))
        for i, req in enumerate(reqs):
            r = next_event(c, req["method"])
            if r is CLOSED:
                return
            assert not isinstance(r, (str, Garbage)), f"request {i}: no answer and no close: {describe(r)}"
            if r.status != 200:
                assert r.status in codes, f"request {i}: status {r.status} not in {sorted(codes)}: {describe(r)}"
                assert_closes(c, f"the {r.status}")
                return
            assert k is None or i < k, f"request {i} is HTTP/1.1 without Host but was served: {describe(r)}"
            got = echo_of(r, req["method"])
            errs = request_errors(req, got, host_added=i in v["added"], fold=fold)
            for key, bad in (case.get("forbid_env") or {}).items():
                if got["headers"].get(key) == bad:
                    errs.append(f"forbidden environ {key}={bad!r}")
            assert not errs, f"request {i} accepted but parsed differently:\n  " + "\n  ".join(errs)
        if case.get("after") == "close":
            assert_closes(c, "the last response (after: close)")


def run_invalid(srv, case, v):
    payload = v["payload"]
    with srv.conn(timeout=WAIT) as c:
        c.send(payload.encode("latin-1"))
        for i in range(case.get("ok_prefix") or 0):
            r = next_event(c)
            assert not isinstance(r, (str, Garbage)) and r.status == 200, f"prefix request {i}: {describe(r)}"
        r = next_event(c, guess_method(payload))
        if r is CLOSED:
            return
        assert r is not TIMEOUT, f"neither an answer nor a close within {WAIT}s (server timeouts are 1 s)"
        assert not isinstance(r, Garbage), describe(r)
        if r.status == 200:
            try:
                got = echo_of(r, guess_method(payload))
            except Exception:  # noqa: BLE001
                got = r.body[:300]
            pytest.fail(f"invalid request was served: {r.status}, echo {got!r}")
        assert r.status in ERROR_CODES | {408}, f"unexpected status {describe(r)}"
        assert_closes(c, f"the {r.status}")


def run_incomplete(srv, case, v):
    with srv.conn(timeout=WAIT + 1) as c:
        t0 = time.monotonic()
        c.send(v["payload"].encode("latin-1"))
        r = next_event(c, guess_method(v["payload"]))
        took = time.monotonic() - t0
        assert r is not TIMEOUT, "no close within 4 s although the header/body timeout is 1 s"
        assert not isinstance(r, Garbage), describe(r)
        if r is not CLOSED:
            assert r.status == 408, f"a request that was not fully sent got {describe(r)} after {took:.2f}s"
            assert_closes(c, "the 408")
        assert took >= 0.8, f"server gave up after {took:.2f}s instead of waiting for the rest ({describe(r)})"


SMUGGLE_BODY = "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
SENTINEL = f"GET /sentinel HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"


def smuggle_payload(gadget):
    return (f"POST /gadget HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(SMUGGLE_BODY)}\r\n"
            f"{gadget}\r\n\r\n{SMUGGLE_BODY}{SENTINEL}")


def run_smuggle(srv, case, v):
    payload = smuggle_payload(case["gadget"])
    events = []
    with srv.conn(timeout=WAIT) as c:
        c.send(payload.encode("latin-1"))
        for _ in range(4):
            r = next_event(c)
            events.append(r)
            if isinstance(r, (str, Garbage)):
                break
            if r.status != 200:
                events.append(CLOSED if c.is_closed(WAIT) and not c.buf else f"open/extra data {c.buf[:200]!r}")
                break
    served = []
    for r in events:
        if not isinstance(r, (str, Garbage)) and r.status == 200:
            served.append(json.loads(r.body))
    for e in served:
        assert "smuggled" not in e["raw_uri"], f"SMUGGLED REQUEST SERVED: {[x['raw_uri'] for x in served]}"
    trail = [describe(r) for r in events]
    first = events[0]
    if first is CLOSED:
        return
    assert not isinstance(first, (str, Garbage)), f"no answer: {trail}"
    if first.status != 200:
        assert first.status in ERROR_CODES, f"unexpected status: {trail}"
        assert events[1:] == [CLOSED], f"not closed after the error: {trail}"
        return
    post = served[0]
    assert post["path"] == "/gadget", trail
    if post["body"] == SMUGGLE_BODY:       # framed by Content-Length
        assert "HTTP_TRANSFER_ENCODING" not in post["headers"], (
            "Content-Length used although a Transfer-Encoding header reached the environ: "
            f"{post['headers']['HTTP_TRANSFER_ENCODING']!r} (policy: chunked, or 400/501)")
        assert len(served) == 2 and served[1]["path"] == "/sentinel" and events[2:] == [CLOSED], trail
    elif post["body"] == "":               # framed as chunked: must close at once
        assert events[1:] == [CLOSED], f"chunked reading without closing the connection: {trail}"
    else:
        pytest.fail(f"body framed neither by CL nor chunked: {post['body']!r}")


def run_any(srv, case, v):
    with srv.conn(timeout=WAIT) as c:
        c.send(v["payload"].encode("latin-1"))
        r = next_event(c, guess_method(v["payload"]))
        assert r is not TIMEOUT, f"neither an answer nor a close within {WAIT}s"
        assert not isinstance(r, Garbage), describe(r)


# --------------------------------------------------------------------------
# model: the legal readings of each case, as sent and with Host inserted.
# A reading is a list of requests; the server may serve any prefix of one
# reading (then reject or close), or reject at once. Spec fields: method,
# path (PATH_INFO), body, headers {env key: value or tuple of allowed
# values}, absent (keys that must not be set), exact (the complete header
# dict apart from HTTP_HOST), fold (compare values whitespace-normalised),
# close (the connection must close after this response).


def R(method, path, body="", headers=None, absent=(), exact=None, fold=False, close=False):
    return {"method": method, "path": path, "body": body, "headers": headers or {}, "absent": absent,
            "exact": exact, "fold": fold, "close": close}


CHUNKED = {"HTTP_TRANSFER_ENCODING": "chunked"}
MODEL = {
    # declared requests (run_lenient with fold): listed for completeness
    "gunicorn/valid/compat_obs_fold": {"declared": True},
    "gunicorn/valid/compat_obs_fold_huge": {"declared": True},
    "gunicorn/invalid/chunked_05": {"sent": [[R("POST", "/chunked_HTTP_1.0", "hello world", CHUNKED,
                                              absent=("HTTP_VARY", "CONTENT_TYPE"), close=True)]]},
    "gunicorn/invalid/obs_fold_01": {"sent": [[R("GET", "/", "", {"HTTP_LONG": "one two", "HTTP_HOST": "localhost"},
                                               fold=True)]]},
    "gunicorn/invalid/rfc9110_field_value_ctl_bel_01": {"sent": [[R("GET", "/foo", "", {
        "HTTP_X_VALUE": ("plain\x07injected", "plain injected")})]]},
    "gunicorn/invalid/rfc9110_field_value_ctl_del_01": {"sent": [[R("GET", "/foo", "", {
        "HTTP_X_VALUE": ("plain\x7finjected", "plain injected")})]]},
    "gunicorn/invalid/rfc9110_trailer_forbidden_cl_01": {"sent": [[R("POST", "/p", "hello", CHUNKED)]],
                                                         "forbid": {"CONTENT_LENGTH": "99"}},
    "gunicorn/invalid/rfc9110_trailer_forbidden_host_01": {"sent": [[R("POST", "/p", "hello", dict(
        CHUNKED, HTTP_HOST="example.com"))]]},
    "gunicorn/invalid/rfc9110_trailer_forbidden_te_01": {"sent": [[R("POST", "/p", "hello", CHUNKED)]]},
    "gunicorn/invalid/rfc9112_smuggle_cl_te_chunked_01": {"sent": [[R("POST", "/p", "", close=True)]]},
    "h11/obs_fold_multi": {"sent": [[R("HEAD", "/foo", "", {
        "HTTP_SOME": "multi-line header nonsense I guess", "HTTP_MORE_NONSENSE": "in the last header"},
        fold=True, close=True)]]},
    # ignoring the indented line leaves an HTTP/1.1 request without Host
    "h11/folded_first_line": {"sent": []},
    "h11/nul_in_header_value": {"sent": [[R("HEAD", "/foo", "", {"HTTP_HOST": "foo bar"})]]},
    "h11/ctl_in_cookie_value": {"sent": [[R("HEAD", "/foo", "", {"HTTP_SET_COOKIE": (
        "___utmvafIumyLc=kUd\x01UpAt; path=/; Max-Age=900", "___utmvafIumyLc=kUd UpAt; path=/; Max-Age=900")})]]},
    # bare LF accepted as line end and obs-fold unfolded; otherwise reject
    "llhttp/sample:396": {"sent": [], "host": [[R("GET", "/", "", {
        "HTTP_LINE1": "abc def ghi jkl mno qrs", "HTTP_LINE2": "line2", "HTTP_LINE3": "line3",
        "HTTP_LINE4": "", "HTTP_CONNECTION": "close"}, fold=True, close=True)]]},
    "llhttp/sample:434": {"sent": []},
    "llhttp/connection:210": {"sent": [], "host": [[R("PUT", "/url", "", {"HTTP_CONNECTION": "keep alive"})]]},
    # "\rabc" cannot become a body; as SP it folds into Content-Length ("3 abc")
    "llhttp/content-length:495": {"sent": [], "host": []},
    # "5\r\r;ABCD": bare CRs as SP give "5  ;ABCD" (BWS before a chunk-ext)
    "llhttp/transfer-encoding:978": {"sent": [[R("GET", "/", "34\r\nE", close=True)]]},
    "llhttp/transfer-encoding:1099": {"sent": []},
    "llhttp/invalid:68": {"sent": [[R("ANNOUNCE", "/music/sweet/music", "", {"HTTP_HOST": "example.com"})]]},
    "llhttp/invalid:89": {"sent": [], "host": [[R("GET", "/", "", {"HTTP_FOO": "1 Bar: 2"})]]},
    # LF as a line end: chunked body "A"; LF inside the value -> SP: no body
    "llhttp/invalid:115": {"sent": [[R("POST", "/", "A", dict(CHUNKED, HTTP_X="x"))],
                                    [R("POST", "/", "", {"HTTP_X": "x Transfer-Encoding: chunked"},
                                       absent=("HTTP_TRANSFER_ENCODING",))]]},
    # "\rZGET /evil..." can only be invalid, or (CR as SP) an obs-fold of Host followed by a second Host
    "llhttp/invalid:149": {"sent": []},
    "llhttp/invalid:218": {"sent": [[R("POST", "/", "", {"HTTP_X": "Transfer-Encoding: chunked"},
                                       absent=("HTTP_TRANSFER_ENCODING",), close=True)]]},
    "llhttp/invalid:358": {"sent": [], "host": [[R("MKCOLA", "/")]]},
    "llhttp/invalid:456": {"sent": [
        [R("GET", "/", "GET / HTTP/1.1\r\nDummy: ", {"HTTP_DUMMY": "x", "CONTENT_LENGTH": "23"}),
         R("GET", "/admin", "", {"HTTP_HOST": "localhost"})],
        [R("GET", "/", "", {"HTTP_DUMMY": "x Content-Length: 23"}, absent=("CONTENT_LENGTH",)),
         R("GET", "/", "", {"HTTP_DUMMY": "GET /admin HTTP/1.1", "HTTP_HOST": "localhost"})]]},
    "llhttp/invalid:511": {"sent": []},
    "llhttp/invalid:533": {"sent": [], "host": [[R("POST", "/", "ABCD", dict(
        CHUNKED, HTTP_TRAILER="Baz", HTTP_FOO="abc", HTTP_BAR="def"), absent=("HTTP_BAZ",))]]},
    "llhttp/invalid:652": {"sent": [[
        R("POST", "/hello", "", {"HTTP_FOO": "bar Content-Length: 38"}, absent=("CONTENT_LENGTH",), fold=True),
        R("GET", "/bye", "", {"HTTP_HOST": "localhost"})]]},
    "picohttpparser/multiline": {"sent": [[R("GET", "/", "", {"HTTP_FOO": (", b c", "b c")}, fold=True)]]},
    "picohttpparser/space_only_header_name": {"sent": [[R("GET", "/", "", exact={})]]},
    "picohttpparser/nul_in_header_value": {"sent": [[R("GET", "/", "", {"HTTP_AB": "c d"})]]},
    "picohttpparser/ctl_in_header_value": {"sent": [[R("GET", "/", "", {"HTTP_AB": ("c\x1b", "c ", "c")})]]},
}


def spec_errors(spec, got, forbid=None):
    errs = []
    if got["method"] != spec["method"]:
        errs.append(f"method {got['method']!r} != {spec['method']!r}")
    if got["path"] != spec["path"]:
        errs.append(f"path {got['path']!r} != {spec['path']!r}")
    if got["body"] != spec["body"]:
        errs.append(f"body {got['body']!r} != {spec['body']!r}")
    have = dict(got["headers"])
    norm = ws if spec["fold"] else (lambda x: x)
    for k, want in spec["headers"].items():
        allowed = want if isinstance(want, tuple) else (want,)
        if k not in have or norm(have[k]) not in [norm(a) for a in allowed]:
            errs.append(f"env {k}={have.get(k)!r}, want {' or '.join(map(repr, allowed))}")
    for k in spec["absent"]:
        if k in have:
            errs.append(f"env {k}={have[k]!r} must be absent")
    if spec["exact"] is not None:
        rest = {k: val for k, val in have.items() if k != "HTTP_HOST"}
        if rest != spec["exact"]:
            errs.append(f"headers {rest!r} != {spec['exact']!r}")
    for k, bad in (forbid or {}).items():
        if have.get(k) == bad:
            errs.append(f"forbidden env {k}={bad!r}")
    return errs


def run_model(srv, case, v):
    entry = MODEL[case["id"]]
    readings = entry["host" if v["plus_host"] else "sent"]
    payload = v["payload"]
    with srv.conn(timeout=WAIT) as c:
        c.send(payload.encode("latin-1"))
        cands, i = readings, 0
        while True:
            live = [r for r in cands if len(r) > i]
            done = [r for r in cands if len(r) == i]
            if not live and i > 0:
                break                       # a legal reading was served completely
            method = live[0][i]["method"] if live and live[0][i]["method"] == "HEAD" else guess_method(payload)
            r = next_event(c, method)
            if r is CLOSED:
                return                      # rejected (or a legal prefix, then closed)
            if r is TIMEOUT:
                assert done and not any(d[-1]["close"] for d in done), (
                    f"after {i} responses: neither an answer nor a close within {WAIT}s")
                return
            assert not isinstance(r, Garbage), describe(r)
            if r.status != 200:
                assert r.status in ERROR_CODES | {408}, f"response {i}: unexpected status {describe(r)}"
                assert_closes(c, f"the {r.status}")
                return
            got = echo_of(r, method)
            why = {}
            matching = []
            for n, reading in enumerate(live):
                errs = spec_errors(reading[i], got, entry.get("forbid"))
                if errs:
                    why[n] = errs
                else:
                    matching.append(reading)
            assert matching, (f"response {i} fits no legal reading (legal: reject or close"
                              f"{', or ' + str(len(readings)) + ' reading(s)' if readings else ' only'}); "
                              f"served {got['method']} {got['raw_uri']!r} body={got['body']!r} "
                              f"headers={got['headers']!r}; mismatches: {why}")
            cands, i = matching, i + 1
        if cands and all(r[-1]["close"] for r in cands):
            assert_closes(c, "the last response of the reading")


def record_outcome(case_id, lines):
    """With VECTORS_REPORT=path set, append what the server answered (for reviews)."""
    path = os.environ.get("VECTORS_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": case_id, "answers": lines}) + "\n")


def run_case(srv, case, v):
    kind = v["kind"]
    if kind == "valid":
        run_valid(srv, case, v)
    elif kind == "valid_or_reject":
        run_lenient(srv, case, v, ERROR_CODES)
    elif kind == "limit":
        run_lenient(srv, case, v, LIMIT_CODES)
    elif kind == "model" and v["reqs"]:
        run_lenient(srv, case, v, ERROR_CODES, fold=True)
    elif kind == "model":
        run_model(srv, case, v)
    elif kind == "invalid":
        run_invalid(srv, case, v)
    elif kind == "incomplete":
        run_incomplete(srv, case, v)
    elif kind == "smuggle":
        run_smuggle(srv, case, v)
    elif kind == "any":
        run_any(srv, case, v)
    else:
        raise AssertionError(f"unknown expect kind {kind!r}")


# Cases the server gets wrong at the moment, id -> reason: marked
# xfail(strict=True) so a fix shows up as XPASS. None at present.
KNOWN_SERVER_BUGS = {}


def _params():
    out = []
    for p in build_params():
        reason = KNOWN_SERVER_BUGS.get(p.id)
        if reason:
            p = pytest.param(*p.values, id=p.id, marks=pytest.mark.xfail(strict=True, reason="server bug: " + reason))
        out.append(p)
    return out


@pytest.mark.parametrize("case,variant", _params())
def test_vector(case, variant, vserver, quick):
    live = quick if variant["kind"] in ("invalid", "incomplete", "model") else vserver
    srv = live.get()
    mark = len(srv.log())
    TRACE.clear()
    try:
        run_case(srv, case, variant)
    except BaseException as e:
        problems = health_problems(srv, mark)
        if problems and hasattr(e, "add_note"):
            e.add_note("after the case: " + "\n".join(problems))
        raise
    finally:
        record_outcome(case["id"] + ("+host" if variant["plus_host"] else ""), list(TRACE))
    problems = health_problems(srv, mark)
    assert not problems, "\n".join(problems)


def test_head_error_response_has_no_body(vserver):
    """Found while replaying the h11 HEAD vectors: the server's own 400 to a
    HEAD request carries a body ("Bad Request\\n"). RFC 9110 9.3.2: the server
    MUST NOT send content in a response to HEAD; RFC 9112 6.3: such a response
    ends with its header section, so those bytes would be read as the start of
    the next response by a client or proxy."""
    srv = vserver.get()
    for payload in (b"HEAD /foo HTTP/1.1\r\nHost: a\r\nfoo  : line\r\n\r\n",   # h11/space_before_colon
                    b"HEAD /foo HTTP/1.1\r\n\r\n"):                              # no Host
        with srv.conn(timeout=WAIT) as c:
            c.send(payload)
            r = c.read_response("HEAD")
            assert r.status == 400
            assert c.is_closed(WAIT)
            assert c.buf == b"", f"body after the 400 to HEAD: {c.buf!r}"


def test_vector_files_present():
    """The data travels with the suite (no ../shared at test time)."""
    for name in ("gunicorn", "h11", "llhttp", "picohttpparser", "smuggler"):
        assert os.path.exists(os.path.join(CASES_DIR, name + ".json"))
    for lic in ("gunicorn/LICENSE", "gunicorn/NOTICE", "llhttp/LICENSE", "h11/LICENSE.txt",
                "picohttpparser/LICENSE", "smuggler/LICENSE", "README.md"):
        assert os.path.exists(os.path.join(HERE, "vectors", lic)), lic
