"""The C-level tests, run through pytest so CI runs them with the rest.

- `make ctest`: tests/c/test_http.c (parser, chunked decoder, split
  equivalence, fw_buf), tests/c/test_proxy.c (PROXY protocol parser,
  address lists) and tests/c/test_uwsgi.c (uwsgi packets) under ASan + UBSan;
- `make fuzz-smoke`: the fuzz targets tests/fuzz/fuzz_http.c (seed corpus and
  200k seeded random inputs), tests/fuzz/fuzz_proxy.c and
  tests/fuzz/fuzz_uwsgi.c (40k each), under ASan + UBSan, without libFuzzer;
- `make fuzz-offload-smoke`: the same for the offload record parser
  (tests/fuzz/fuzz_offload.c), and `make fuzz-ring-smoke` for the offload
  ring's reader over damaged ring files (tests/fuzz/fuzz_ring.c); the ring's
  unit tests, with producer processes killed mid-write, are
  tests/c/test_ring.c in `make ctest`, and the app-thread pool's (a job back
  through the eventfd, or unannounced until the loop collects it) are
  tests/c/test_pool.c.

Skipped only when there is no C compiler at all.
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

from httpraw import unsanitized_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _compiler():
    candidates = [os.environ["CC"]] if os.environ.get("CC") else []
    for cc in candidates + ["cc", "gcc", "clang"]:
        if shutil.which(cc.split()[0]):
            return cc
    return None


CC = _compiler()
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


def make(target, timeout, *variables):
    assert shutil.which("make"), "make is needed for the C tests (apt-get install make)"
    proc = subprocess.run(["make", "--no-print-directory", target, f"CC={CC}", *variables], cwd=ROOT,
                          env=unsanitized_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, f"make {target} exited with {proc.returncode}:\n{out[-20000:]}"
    return out


def test_c_unit_tests():
    out = make("ctest", timeout=240)
    results = re.findall(r"^(\d+) passed, (\d+) failed$", out, re.M)
    assert len(results) == 5, out[-5000:]       # test_http, test_proxy, test_uwsgi, test_ring, test_pool
    #                                             (test_alog prints its name first)
    for passed, failed in results:
        assert int(passed) > 0 and int(failed) == 0, out[-5000:]


def _librdkafka():
    """The librdkafka confluent-kafka loads (a test dependency), found as the
    sibling finds it."""
    out = subprocess.run([sys.executable, "-c", "from forkwsgi.offload.sinks import librdkafka_path as p; print(p())"],
                         stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode().strip()
    assert out and out != "None", "confluent-kafka loaded no librdkafka"
    return out


def test_kafka_producer_over_real_librdkafka():
    out = make("kafka-ctest", 120, f"RDKAFKA_LIB={_librdkafka()}")
    results = re.findall(r"^(\d+) passed, (\d+) failed$", out, re.M)
    assert len(results) == 1 and int(results[0][0]) > 0 and results[0][1] == "0", out[-5000:]


@pytest.mark.skipif(not os.path.exists("/usr/include/librdkafka/rdkafka.h"),
                    reason="librdkafka's header is not installed (Debian: librdkafka-dev; CI installs it)")
def test_rdkafka_abi_matches_librdkafkas_header():
    out = make("rdkafka-abi", timeout=120)
    assert "cserver/fw_rdkafka.h matches rdkafka.h" in out, out[-5000:]


def test_fuzz_smoke():
    out = make("fuzz-smoke", timeout=400)
    # the HTTP parser's target, then the PROXY protocol parser's, then the uwsgi parser's (with its corpus)
    runs = re.findall(r"^standalone: (\d+) files and \d+ random inputs .* no crash$", out, re.M)
    assert len(runs) == 3 and int(runs[2]) > 0, out[-5000:]


def test_fuzz_offload_smoke():
    out = make("fuzz-offload-smoke", timeout=280)
    assert re.search(r"^standalone: \d+ files and \d+ random inputs .* no crash$", out, re.M), out[-5000:]


def test_fuzz_ring_smoke():
    out = make("fuzz-ring-smoke", timeout=200)
    assert re.search(r"^standalone: [1-9]\d* files and \d+ random inputs .* no crash$", out, re.M), out[-5000:]
