"""forkwsgi top ADDR: a live view of a server's stats server (--stats ADDR).

Every second: totals and the listen queue on top, then one row per worker
(PID, state, requests, req/s, p50 and p99 of the interval, in flight, RSS,
restarts, the oldest request in its app and its age). q quits.
`--once --json` prints one sample (with the interval's figures) for scripts.
"""
import argparse
import curses
import json
import socket
import sys
import time



def human_bytes(n):
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024


def fetch(addr, timeout=3.0):
    """One document from the stats server at 'HOST:PORT' or 'unix:/path' (or a path)."""
    if addr.startswith("unix:") or addr.startswith("/"):
        family, target = socket.AF_UNIX, addr[5:] if addr.startswith("unix:") else addr
    else:
        host, _, port = addr.rpartition(":")
        family, target = socket.AF_INET6 if host.startswith("[") else socket.AF_INET, \
            (host.strip("[]") or "127.0.0.1", int(port))
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(target)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return json.loads(data)
            data += chunk


def quantile(counts, bounds, q):
    """The upper bound of the bucket holding quantile q of a histogram of
    per-bucket counts (None for the open bucket; 0.0 when it is empty)."""
    total = sum(counts)
    if not total:
        return 0.0
    rank, seen = q * total, 0
    for n, bound in zip(counts, bounds):
        seen += n
        if seen >= rank:
            return bound
    return bounds[-1]


def sample(addr, before=None, elapsed=None):
    """The rows of the view: one document, with the figures of the interval
    since `before` (an earlier sample's document) when given."""
    doc = fetch(addr)
    bounds = doc["forkwsgi"]["histogram_bounds"]
    prev = {w["pid"]: w for w in (before or {}).get("workers", [])}
    rows = []
    for w in doc["workers"]:
        p = prev.get(w["pid"])
        hist = w["forkwsgi"]["durations"]
        if p:
            hist = [a - b for a, b in zip(hist, p["forkwsgi"]["durations"])]
        busy = [c for c in w["cores"] if c["in_request"]]
        # request_age, not uWSGI's request_start: that one is in whole
        # seconds, and now - request_start overstates the age by up to 1 s.
        oldest = max(busy, key=lambda c: c["req_info"]["request_age"]) if busy else None
        rows.append({
            "worker": w["id"], "pid": w["pid"], "state": "retiring" if w["forkwsgi"]["retiring"] else w["status"],
            "requests": w["requests"],
            "rps": round((w["requests"] - p["requests"]) / elapsed, 1) if p and elapsed else None,
            "p50_s": quantile(hist, bounds, 0.5), "p99_s": quantile(hist, bounds, 0.99),
            "in_flight": w["forkwsgi"]["in_flight"], "rss": w["rss"], "restarts": w["respawn_count"],
            "oldest_request": oldest["req_info"]["request"] if oldest else None,
            "oldest_age_s": round(oldest["req_info"]["request_age"], 1) if oldest else None,
        })
    totals = doc["forkwsgi"]["totals"]
    head = {"pid": doc["pid"], "version": doc["version"].replace(" (forkwsgi)", ""), "requests": totals["requests"],
            "rps": round(sum(r["rps"] or 0 for r in rows), 1) if elapsed else None,
            "listen_queue": doc["listen_queue"], "in_flight": doc["load"],
            "workers": len(rows), "restarts": totals["respawns"], "reloads": doc["forkwsgi"]["reloads"]}
    return doc, head, rows


def _ms(s):
    return "-" if s is None else f"{s * 1000:.1f}" if s < 1 else f"{s:.1f}s"


def render(head, rows, width):
    lines = [f"forkwsgi {head['version']} master {head['pid']} - requests {head['requests']} - "
             f"req/s {head['rps'] if head['rps'] is not None else '-'} - in flight {head['in_flight']} - "
             f"listen queue {head['listen_queue']} - restarts {head['restarts']} - reloads {head['reloads']}",
             "",
             f"{'WID':>4} {'PID':>8} {'STATE':<9} {'REQ':>9} {'REQ/S':>8} {'P50ms':>7} {'P99ms':>7} "
             f"{'INFL':>5} {'RSS':>8} {'RST':>4}  OLDEST REQUEST"]
    for r in sorted(rows, key=lambda r: (r["worker"], r["pid"])):
        oldest = f"{r['oldest_request']} ({r['oldest_age_s']}s)" if r["oldest_request"] else ""
        lines.append(f"{r['worker']:>4} {r['pid']:>8} {r['state']:<9} {r['requests']:>9} "
                     f"{'-' if r['rps'] is None else r['rps']:>8} {_ms(r['p50_s']):>7} {_ms(r['p99_s']):>7} "
                     f"{r['in_flight']:>5} {human_bytes(r['rss']):>8} {r['restarts']:>4}  {oldest}")
    return [ln[:max(1, width - 1)] for ln in lines]


def live(screen, addr, interval):
    curses.curs_set(0)
    screen.nodelay(True)
    before, t0 = None, None
    while True:
        try:
            t = time.monotonic()
            doc, head, rows = sample(addr, before, t - t0 if t0 else None)
            before, t0 = doc, t
            lines = render(head, rows, screen.getmaxyx()[1])
        except (OSError, ValueError) as e:
            lines = [f"forkwsgi top: no answer from {addr}: {e}"]
        screen.erase()
        for i, ln in enumerate(lines[:screen.getmaxyx()[0] - 1]):
            screen.addstr(i, 0, ln)
        screen.refresh()
        deadline = time.monotonic() + interval
        while time.monotonic() < deadline:
            if screen.getch() in (ord("q"), ord("Q")):
                return 0
            time.sleep(0.05)


def main(argv):
    ap = argparse.ArgumentParser(prog="forkwsgi top", description=__doc__.split("\n")[0])
    ap.add_argument("addr", metavar="ADDR", help="the server's --stats address: HOST:PORT or unix:/path")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    ap.add_argument("--once", action="store_true", help="print one sample (over one interval) and exit")
    ap.add_argument("--json", action="store_true", help="with --once: as JSON")
    args = ap.parse_args(argv)
    try:
        if args.once:
            doc, _, _ = sample(args.addr)
            time.sleep(args.interval)
            _, head, rows = sample(args.addr, doc, args.interval)
            if args.json:
                print(json.dumps({"server": head, "workers": rows}))
            else:
                print("\n".join(render(head, rows, 200)))
            return 0
        return curses.wrapper(live, args.addr, args.interval)
    except (OSError, ValueError) as e:
        print(f"forkwsgi top: no answer from {args.addr}: {e}", file=sys.stderr)
        return 1
