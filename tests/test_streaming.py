"""Streamed bytes leave when the app yields them (issue 23, item 7).

Each chunk of a chunked response leaves whole, its terminating CRLF
included, when the app yields it. At dac5946 the CRLF went out only in
front of the next chunk, and urllib3 (python-requests' iter_content and
iter_lines) waits for it: every Server-Sent Event arrived one interval
late, with the next one. The clients here are the real ones: requests,
and http.client as the standard library has it.
"""
import socket
import time

import requests


def arrivals_with_requests(port, n, every):
    """(index, yielded at, received at) per event, read with python-requests."""
    out = []
    with requests.get(f"http://127.0.0.1:{port}/?n={n}&every={every}", stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["Transfer-Encoding"] == "chunked"
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                i, stamp = line[6:].split()
                out.append((int(i), float(stamp), time.monotonic()))
    return out


def test_each_event_reaches_python_requests_when_yielded(make_server):
    s = make_server("apps:ticker")
    got = arrivals_with_requests(s.port, 4, 1.0)
    assert [i for i, _, _ in got] == [0, 1, 2, 3]
    delays = [round(received - yielded, 3) for _, yielded, received in got]
    print("delays (s):", delays)
    # One interval late (1 s) was the bug; on time is milliseconds.
    assert max(delays) < 0.5, delays


def test_each_chunk_is_complete_on_the_wire_when_yielded(make_server):
    """The raw bytes: within the interval after a yield, that chunk and its
    CRLF have arrived, and nothing of the next one (the CRLF used to wait
    for the next chunk's size line)."""
    s = make_server("apps:ticker")
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
        c.sendall(b"GET /?n=3&every=1 HTTP/1.1\r\nHost: t\r\n\r\n")
        buf = b""
        for i in range(3):
            want = f"data: {i} ".encode()
            deadline = time.monotonic() + 0.8 + (1.0 if i else 0.0)
            chunk = None
            while chunk is None:
                at = buf.find(want)
                if at >= 0:
                    size = int(buf[:at - 2].rsplit(b"\r\n", 1)[-1], 16)
                    if len(buf) >= at + size + 2:
                        chunk = buf[at:at + size]
                        assert buf[at + size:at + size + 2] == b"\r\n", buf[-80:]
                        buf = buf[at + size + 2:]
                        break
                c.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    d = c.recv(65536)
                except socket.timeout:
                    raise AssertionError(f"chunk {i} incomplete: {buf[-80:]!r}") from None
                assert d, buf
                buf += d
            if i < 2:
                assert buf == b"", buf          # nothing of the next chunk yet
        c.settimeout(5)
        while not buf.endswith(b"0\r\n\r\n"):
            buf += c.recv(65536)
        assert buf == b"0\r\n\r\n"
