# cython: language_level=3, boundscheck=False, wraparound=False
"""forkwsgi._forkwsgi: the extension's Python-facing objects.

One file per job, included below: the C declarations (_forkwsgi_decls.pxi),
the one table that turns the settings registry's values into an fw_config
and the Server type over the C core's fw_server (_forkwsgi_server.pxi), the
master's views of the memory it shares with the workers
(_forkwsgi_views.pxi), the offload sibling's Kafka producer
(_forkwsgi_kafka.pxi); the module's set-up is here. The per-request path
(environ, start_response, wsgi.input, file_wrapper, the request driver,
offload()) stays in C under src/: it runs for every request, and there C
is what measures fastest.
"""
import os

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.errno cimport ENOMEM, errno
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memset, strcpy, strlen

include "_forkwsgi_decls.pxi"    # the C declarations: Python.h, src/glue.h

SB_SLOT_SIZE = FW_SB_SLOT_SIZE
STATS_SIZE = FW_STATS_SIZE
# The histograms' bucket bounds in seconds, the last one open (cserver/fw_stats.h).
STATS_BOUNDS = tuple(fw_stats_bound_us(i) / 1e6 for i in range(FW_STATS_NBUCKETS - 1)) + (float("inf"),)
STATUS_SIZE = FW_STATUS_SIZE


def status_entries(int threads):
    """status_entries(threads): status entries a worker of `threads` app
    threads needs: its threads, and the spares that stand in for parked
    ones (cserver/fw_pool.h)."""
    return fw_pool_max_threads(threads) if threads > 1 else 1


BALANCE_SHARED = FW_BAL_SHARED
BALANCE_LEAST_BUSY = FW_BAL_LEAST_BUSY
BALANCE_REUSEPORT = FW_BAL_REUSEPORT


include "_forkwsgi_server.pxi"   # the settings the C core takes, the Server type
include "_forkwsgi_views.pxi"    # the master's views of the shared memory
include "_forkwsgi_kafka.pxi"    # the offload sibling's Kafka producer


# ---- the module ------------------------------------------------------------------

PyType_Ready(&StartResponse_Type)
PyType_Ready(&Writer_Type)
PyType_Ready(&Input_Type)
PyType_Ready(&FileWrapper_Type)
fw_environ_init()
fw_request_init()
FileWrapper = <object><PyObject *>&FileWrapper_Type
Input = <object><PyObject *>&Input_Type


def _coverage_dump():
    """Write gcov's counters now (`make coverage` builds; elsewhere nothing):
    a process about to os._exit() calls it, as libgcov's exit handler does
    not run then."""
    fw_coverage_dump()


def _add_c_functions():
    """offload(), offload_setup() & co, defined in C (src/offload.c)."""
    import sys
    PyModule_AddFunctions(sys.modules[__name__], fw_offload_methods)


_add_c_functions()
del _add_c_functions
