"""The offload record format, the one Python reader and writer of it: the
layout of cserver/fw_offload.h (fw_offload_hdr, then topic, key, value),
checked against the C framing by tests/test_offload.py."""
import collections
import re
import struct


HDR = struct.Struct("<IIIIIIIIQ")        # cserver/fw_offload.h: fw_offload_hdr
MAGIC = 0x314F5746                       # "FWO1"
FLAG_KEY = 1
TOPIC_MAX = 249                          # Kafka's limit for a topic name (FW_OFL_TOPIC_MAX)

Record = collections.namedtuple("Record", "topic key value ts pid seq")


class BadRecord(ValueError):
    pass


def length(buf, off=0):
    """The length of the record at buf[off:], from its header: what a reader
    needs to hold to parse it; None if not even the header is there. Raises
    BadRecord for bytes that are not a record's header."""
    if len(buf) - off < HDR.size:
        return None
    magic, total, flags, tlen, klen, vlen, _, _, _ = HDR.unpack_from(buf, off)
    if (magic != MAGIC or total != HDR.size + tlen + klen + vlen or flags & ~FLAG_KEY
            or (not flags & FLAG_KEY and klen) or not 0 < tlen <= TOPIC_MAX):
        raise BadRecord("not an offload record")
    return total


def parse(buf, off=0):
    """(Record, length) for the record at buf[off:], (None, 0) if it is not
    all there yet. Raises BadRecord for bytes that are not a record."""
    total = length(buf, off)
    if total is None or len(buf) - off < total:
        return None, 0
    _, _, flags, tlen, klen, vlen, pid, seq, ts = HDR.unpack_from(buf, off)
    p = off + HDR.size
    topic = bytes(buf[p:p + tlen]).decode("ascii", "replace")
    p += tlen
    key = bytes(buf[p:p + klen]) if flags & FLAG_KEY else None
    p += klen
    value = bytes(buf[p:p + vlen])
    return Record(topic, key, value, ts / 1e9, pid, seq), total


def key(buf, off=0):
    """(pid, seq, ts_ns) of the record at buf[off:]: what _forkwsgi.ring_take
    compares to recognise a record journaled already."""
    _, _, _, _, _, _, pid, seq, ts = HDR.unpack_from(buf, off)
    return pid, seq, ts


def frame(rec):
    """The record's bytes in the queue's format (the inverse of parse)."""
    topic = rec.topic.encode("ascii")
    key = rec.key or b""
    flags = FLAG_KEY if rec.key is not None else 0
    total = HDR.size + len(topic) + len(key) + len(rec.value)
    return HDR.pack(MAGIC, total, flags, len(topic), len(key), len(rec.value), rec.pid, rec.seq,
                    int(rec.ts * 1e9)) + topic + key + rec.value


def topic_ok(t):
    """A valid Kafka topic name: 1-249 of A-Z a-z 0-9 . _ -, not "." or ".."
    (the rule fw_offload_topic_ok applies to every record)."""
    return 0 < len(t) <= TOPIC_MAX and t not in (".", "..") and re.fullmatch(r"[A-Za-z0-9._-]+", t) is not None
