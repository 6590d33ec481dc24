"""A sink for the offload tests (--offload-sink python:offload_sinks:make).

It appends every batch it takes to $FW_SINK_OUT as JSON lines, each with the
batch number, and obeys files in $FW_SINK_CTL:
  fail    raise (the sink is "down"): the batch is retried later
  slow    sleep this many seconds (the file's content) before taking a batch
  gate    hold the batch (checked after fail) until this file is removed;
          while it holds one, the file "at-gate" exists (a test waits on it)
  digest  write each value's length and SHA-256, not the value (records of
          megabytes: the sink's own copies would hide the sibling's memory)
and refuses for good every record whose value contains b"REJECT".
"""
import hashlib
import json
import os
import time


class ControlledSink:
    def __init__(self):
        self.out = os.environ["FW_SINK_OUT"]
        self.ctl = os.environ["FW_SINK_CTL"]
        self.batches = 0

    def send(self, batch):
        if os.path.exists(os.path.join(self.ctl, "fail")):
            raise ConnectionError("sink down (test)")
        gate, at_gate = os.path.join(self.ctl, "gate"), os.path.join(self.ctl, "at-gate")
        if os.path.exists(gate):
            open(at_gate, "w").close()
            while os.path.exists(gate):
                time.sleep(0.02)
            os.unlink(at_gate)
        slow = os.path.join(self.ctl, "slow")
        if os.path.exists(slow):
            with open(slow) as f:
                time.sleep(float(f.read().strip() or "0.1"))
        self.batches += 1
        refused = [(i, "refused by the test sink") for i, r in enumerate(batch) if b"REJECT" in r.value]
        digest = os.path.exists(os.path.join(self.ctl, "digest"))
        lines = [json.dumps({"pid": os.getpid(), "batch": self.batches, "topic": r.topic,
                             "key": r.key.hex() if r.key is not None else None,
                             **({"value_len": len(r.value), "value_sha256": hashlib.sha256(r.value).hexdigest()}
                                if digest else {"value": r.value.hex()}),
                             "src": r.pid, "seq": r.seq})
                 for r in batch if b"REJECT" not in r.value]
        with open(self.out, "a") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return refused

    def close(self):
        pass


def make():
    return ControlledSink()


def make_after_work():
    """The test sink, made after $FW_SINK_WORK seconds of CPU time (a sink
    whose set-up is real work: a client library's import, a connection)."""
    until = time.thread_time() + float(os.environ.get("FW_SINK_WORK", "0.3"))
    while time.thread_time() < until:
        pass
    return ControlledSink()
