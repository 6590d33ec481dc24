"""What the master knows of the whole server, told as uWSGI's stats server
tells it (--stats ADDR), so uwsgitop and the scripts written for it work.

The master shares memory with every worker (slots.py): the scoreboard
(requests in flight), the status entries (what each app thread is in, and
how many calls it made) and the counters (cserver/fw_stats.h). It reads
them here, without asking any worker, so the answer comes even when every
worker is busy. Like uWSGI's, the server writes one JSON document to each
client that connects, then closes the connection.
"""
import json
import logging
import os
import socket
import struct
import time

from . import _forkwsgi, binding, observer
from .slots import add_counters
from ._version import __version__

log = logging.getLogger("forkwsgi")

# struct tcp_info: 8 bytes of u8 fields, then u32 rto, ato, snd_mss, rcv_mss,
# unacked, sacked: a listener keeps its accept queue's length and size there.
_TCP_INFO_QUEUE = struct.Struct("=24xII")


# sock_diag (netlink) for a unix listener: request SOCK_DIAG_BY_FAMILY for
# its inode, in state LISTEN, asking for UNIX_DIAG_RQLEN (queued, backlog).
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _UDIAG_SHOW_RQLEN, _UNIX_DIAG_RQLEN = 4, 20, 0x10, 4
_NLMSG = struct.Struct("=IHHII")
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")


def _unix_listen_queue(sock):
    inode = os.fstat(sock.fileno()).st_ino
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        req = _UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0, 1 << 10, inode, _UDIAG_SHOW_RQLEN, 0xffffffff, 0xffffffff)
        nl.sendto(_NLMSG.pack(_NLMSG.size + len(req), _SOCK_DIAG_BY_FAMILY, 1, 1, 0) + req, (0, 0))
        data = nl.recv(65536)
    length, kind = _NLMSG.unpack_from(data)[:2]
    off = _NLMSG.size + 16                    # then struct unix_diag_msg, then attributes
    while kind == _SOCK_DIAG_BY_FAMILY and off + 4 <= min(length, len(data)):
        alen, atype = struct.unpack_from("=HH", data, off)
        if atype == _UNIX_DIAG_RQLEN and alen >= 12:
            return struct.unpack_from("=II", data, off + 4)
        if alen < 4:
            break
        off += (alen + 3) & ~3
    return 0, 0


def listen_queue(sock):
    """(connections waiting in the accept queue, its size) of a listening
    socket: TCP from TCP_INFO (tcpi_unacked / tcpi_sacked hold them for a
    listener), unix from sock_diag; (0, 0) when the kernel does not tell."""
    if sock.family == socket.AF_UNIX:
        try:
            return _unix_listen_queue(sock)
        except (OSError, struct.error):
            return 0, 0
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return 0, 0
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        queued, size = _TCP_INFO_QUEUE.unpack_from(raw)
    except (OSError, struct.error):
        return 0, 0
    return queued, size


def process_memory(pid):
    """(rss, vsz) in bytes, from /proc; (0, 0) for a process that is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            vsz_pages, rss_pages = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return 0, 0
    page = os.sysconf("SC_PAGE_SIZE")
    return rss_pages * page, vsz_pages * page


def shown(line, cfg):
    """A request line as the stats show it: without its query string,
    unless --stats-query-strings (it may carry a token)."""
    if cfg.get("stats_query_strings"):
        return line
    method, _, target = line.partition(" ")
    path, q, _ = target.partition("?")
    return f"{method} {path}?..." if q else line


def heirs(master):
    """{worker pid: requests of ended workers it reports besides its own}.
    uwsgitop's total is the sum of the workers' "requests": so that it never
    goes back when workers are replaced, the requests of the ended workers
    of an index are reported by the worker serving that index now (not an
    old one still finishing), or, with none (scaled down), by the current
    worker of the lowest index."""
    current = {}
    for w in sorted(master.workers.values(), key=lambda w: (w.index, w.pid)):
        if w.slot is not None and not (w.old or w.retiring):
            current.setdefault(w.index, w.pid)
    out = {}
    for index, n in master.retired_requests.items():
        pid = current.get(index) or (current[min(current)] if current else None)
        if pid is not None and n:
            out[pid] = out.get(pid, 0) + n
    return out


def uwsgi_document(master, previous):
    """The stats document for the arbiter `master`. previous: {pid:
    requests} at the last document, updated here (delta_requests)."""
    workers, in_flight = [], 0
    inherited = heirs(master)
    board = _forkwsgi.sb_read(master.slots.scoreboard)
    now, now_ns = time.time(), time.monotonic_ns()
    totals = dict_copy(master.slots.retired)
    for w in sorted(master.workers.values(), key=lambda w: (w.index, w.pid)):
        if w.slot is None:
            continue
        c = master.slots.counters(w.slot)
        threads = master.slots.threads_of(w.slot)
        busy = sum(1 for _, began, _, _ in threads if began)
        # The scoreboard counts requests taken but not yet on a thread too;
        # it counts nothing with one thread per worker (no balancing needed).
        worker_in_flight = max(board[w.slot]["inflight"], busy)
        rss, vsz = process_memory(w.pid)
        requests = c["requests"]
        in_flight += worker_in_flight
        add_counters(totals, c)
        workers.append({
            "id": w.index, "pid": w.pid, "accepting": int(w.ready and not w.retiring),
            "requests": requests + inherited.get(w.pid, 0), "delta_requests": requests - previous.get(w.pid, 0),
            "exceptions": c["exceptions"], "harakiri_count": master.timeouts[w.index], "signals": 0,
            # From the same reading as in_flight below, so the two never
            # disagree: a request taken but not yet on an app thread counts.
            "signal_queue": 0, "status": "busy" if worker_in_flight else "idle", "rss": rss, "vsz": vsz,
            "running_time": c["total_us"], "last_spawn": int(w.spawned),
            "respawn_count": master.spawns[w.index] - 1, "tx": c["bytes_out"],
            "avg_rt": c["total_us"] // requests if requests else 0, "apps": [],
            "cores": cores(threads, master.cfg, now, now_ns),
            "forkwsgi": {"slot": w.slot, "retiring": w.retiring or w.old, "in_flight": worker_in_flight,
                         "connections": c["conns_open"], "idle_connections": c["conns_idle"],
                         "status_classes": status_classes(c["status"]),
                         "app_calls": c["app_calls"], "app_us": c["app_us"],
                         "handed_in": board[w.slot]["handed_in"], "handed_out": board[w.slot]["handed_out"],
                         "balancer_kicks": board[w.slot]["kicks_sent"],
                         "listener_changes": board[w.slot]["arms"],
                         # Per-bucket counts of request durations; bounds in "histogram_bounds".
                         "durations": c["total_hist"]},
        })
    previous.clear()
    previous.update({w["pid"]: w["requests"] - inherited.get(w["pid"], 0) for w in workers})
    sockets = listen_sockets(master)
    queued_total = sum(s["queue"] for s in sockets)
    return {
        "version": f"{__version__} (forkwsgi)", "listen_queue": queued_total, "listen_queue_errors": 0,
        "signal_queue": 0, "load": in_flight, "pid": master.pid, "uid": os.getuid(), "gid": os.getgid(),
        "cwd": os.getcwd(), "locks": [], "sockets": sockets, "workers": workers,
        "forkwsgi": {"workers": master.num_workers, "threads": master.threads, "balance": master.balance,
                     "histogram_bounds": [b if b != float("inf") else None for b in _forkwsgi.STATS_BOUNDS],
                     "reloads": master.reloads, "backlog": master.cfg["backlog"],
                     # Since the start, over every worker that ever ran: never go back.
                     "totals": {"requests": totals["requests"], "bytes_out": totals["bytes_out"],
                                "exceptions": totals["exceptions"],
                                "status_classes": status_classes(totals["status"]),
                                "respawns": sum(master.spawns.values()) - len(master.spawns),
                                "timeouts": sum(master.timeouts.values())}},
    }


def cores(threads, cfg, now, now_ns):
    """A worker's app threads as uWSGI's "cores" (threads: the slot's
    (index, began ns, request line, calls) each; now and now_ns: one
    reading of the wall and the monotonic clock)."""
    return [{"id": t, "requests": calls, "static_requests": 0, "routed_requests": 0,
             "offloaded_requests": 0, "write_errors": 0, "read_errors": 0,
             "in_request": int(bool(began)), "vars": [],
             # request_start is uWSGI's (whole seconds, for uwsgitop);
             # request_age, forkwsgi's own: seconds in the app, exact
             # to the microsecond (what forkwsgi top shows).
             "req_info": {"request_start": int(now - (now_ns - began) / 1e9),
                          "request_age": round((now_ns - began) / 1e9, 6),
                          "request": shown(line, cfg)} if began else {}}
            for t, began, line, calls in threads]


def listen_sockets(master):
    """The master's listening sockets as uWSGI's "sockets": each one's
    accept queue (listen_queue) and its size."""
    sockets = []
    for s, proto in zip(master.sockets, master.protocols):
        queued, size = listen_queue(s)
        sockets.append({"name": binding.describe(s, proto)[2], "proto": proto, "queue": queued,
                        "max_queue": size or master.cfg["backlog"], "shared": 0, "can_offload": 0})
    return sockets


def dict_copy(totals):
    return {k: list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v
            for k, v in totals.items()}


def status_classes(counts):
    """[other, 1xx, ..., 5xx] -> {"1xx": n, ..., "other": n}."""
    out = {f"{i}xx": counts[i] for i in range(1, 6)}
    out["other"] = counts[0]
    return out


class StatsServer(observer.Observer):
    """The --stats socket: each client gets one JSON document."""

    name = "stats"

    def __init__(self, addr, sock=None):
        super().__init__(addr, sock)
        self.previous = {}

    wants_request = False      # uWSGI's: the document is written as soon as a client connects

    def answer_for(self, request, master):
        return json.dumps(uwsgi_document(master, self.previous)).encode()

    def announcement(self):
        # No http://: it is no HTTP server (a browser or curl would not
        # get an HTTP response), but a socket that writes one JSON document.
        if self.sock.family == socket.AF_UNIX:
            return f"Stats (uWSGI's, raw JSON over a unix socket) at {binding.describe(self.sock)[2]}"
        host, port = self.sock.getsockname()[:2]
        host = f"[{host}]" if self.sock.family == socket.AF_INET6 else host
        return f"Stats (uWSGI's, raw JSON over TCP) at {host}:{port}"

