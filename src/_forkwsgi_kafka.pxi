# Part of _forkwsgi.pyx, included there (one module, one namespace).

# ---- the offload sibling's Kafka producer (cserver/fw_kafka.h) --------------------

cdef extern from "fw_kafka.h":
    ctypedef struct fw_kafka:
        pass

    ctypedef struct fw_kafka_err:
        uint32_t index
        int32_t code

    ctypedef struct fw_kafka_batch:
        uint64_t id
        uint32_t n
        uint32_t nerr
        fw_kafka_err *errs

    ctypedef struct fw_kafka_rec:
        const char *topic
        const void *key
        size_t key_len
        const void *value
        size_t value_len
        int64_t ts_ms

    ctypedef struct fw_kafka_log:
        int level
        char fac[16]
        char text[240]

    int FW_KAFKA_QUEUE_FULL
    int FW_KAFKA_ERR_INVALID_ARG
    void fw_kafka_fail(fw_kafka *k, fw_kafka_batch *b, uint32_t i, int code)
    fw_kafka *fw_kafka_open(const char *lib_path, const char *const *conf, char *err, size_t errlen)
    const char *fw_kafka_version(const fw_kafka *k)
    fw_kafka_batch *fw_kafka_batch_new(fw_kafka *k, uint64_t id, uint32_t n)
    int fw_kafka_produce(fw_kafka *k, fw_kafka_batch *b, uint32_t i, const fw_kafka_rec *r)
    void fw_kafka_poll(fw_kafka *k, int timeout_ms) nogil
    int fw_kafka_flush(fw_kafka *k, int timeout_ms) nogil
    void fw_kafka_purge(fw_kafka *k)
    fw_kafka_batch *fw_kafka_next_done(fw_kafka *k)
    void fw_kafka_batch_free(fw_kafka_batch *b)
    int fw_kafka_fatal(fw_kafka *k, char *buf, size_t len)
    int fw_kafka_next_log(fw_kafka *k, fw_kafka_log *out, unsigned *dropped)
    const char *fw_kafka_err_name(const fw_kafka *k, int code)
    const char *fw_kafka_err_text(const fw_kafka *k, int code)
    void fw_kafka_close(fw_kafka *k) nogil


cdef class KafkaProducer:
    """A librdkafka producer driven from C (cserver/fw_kafka.h), for the
    offload sibling's Kafka sink: produce() hands a whole batch of records
    to librdkafka in one C loop, poll() serves the delivery reports (without
    the GIL) and returns the batches that are finished.

    KafkaProducer(lib_path, conf): lib_path is librdkafka's shared library
    (offload/sinks.py gives the one confluent-kafka loaded), conf a list of
    (name, value) str pairs. ValueError with librdkafka's reason when it
    cannot be loaded or refuses a setting. One thread uses it."""

    cdef fw_kafka *k
    cdef readonly str version

    def __cinit__(self, str lib_path, conf):
        cdef char err[512]
        cdef const char **kv = NULL
        pairs = [(str(n).encode(), str(v).encode()) for n, v in conf]
        kv = <const char **>PyMem_Malloc((2 * len(pairs) + 1) * sizeof(char *))
        if kv == NULL:
            raise MemoryError()
        try:
            for i, (n, v) in enumerate(pairs):
                kv[2 * i] = n
                kv[2 * i + 1] = v
            kv[2 * len(pairs)] = NULL
            path = os.fsencode(lib_path)
            err[0] = 0
            self.k = fw_kafka_open(path, kv, err, sizeof(err))
        finally:
            PyMem_Free(kv)
        if self.k == NULL:
            raise ValueError(err.decode("utf-8", "replace"))
        self.version = fw_kafka_version(self.k).decode()

    cdef fw_kafka *_open(self) except NULL:
        if self.k == NULL:
            raise ValueError("the Kafka producer is closed")
        return self.k

    def produce(self, list records, uint64_t batch_id, double queue_full_wait=0.05):
        """Produce `records` (Record: topic, key, value, ts, ...) as batch
        `batch_id`. When librdkafka's queue is full, serve reports for up to
        queue_full_wait seconds (without the GIL) and try again."""
        cdef fw_kafka *k = self._open()
        cdef fw_kafka_rec r
        cdef fw_kafka_batch *b
        cdef uint32_t i = 0
        cdef Py_ssize_t n = len(records)
        cdef int wait_ms = _ms(queue_full_wait)
        cdef bytes key, value
        cdef const char *topic
        if n == 0:
            return
        b = fw_kafka_batch_new(k, batch_id, <uint32_t>n)
        if b == NULL:
            raise MemoryError()
        # The batch is k's from here: every record must get an outcome, so
        # one that is not a Record fails the rest (the caller retries them).
        try:
            for rec in records:
                if not isinstance(rec, tuple) or len(rec) < 4:
                    raise TypeError("a Record (topic, key, value, ts, ...) was expected")
                topic = PyUnicode_AsUTF8(<object>PyTuple_GET_ITEM(rec, 0))
                key = <object>PyTuple_GET_ITEM(rec, 1)
                value = <object>PyTuple_GET_ITEM(rec, 2)
                r.topic = topic
                if key is None:
                    r.key, r.key_len = NULL, 0
                else:
                    r.key, r.key_len = <const char *>key, len(key)
                r.value = <const char *>value
                r.value_len = len(value)
                r.ts_ms = <int64_t>(<double>(<object>PyTuple_GET_ITEM(rec, 3)) * 1000.0)
                while fw_kafka_produce(k, b, i, &r) == FW_KAFKA_QUEUE_FULL:
                    with nogil:
                        fw_kafka_poll(k, wait_ms)
                i += 1
        except BaseException:
            while i < n:
                fw_kafka_fail(k, b, i, FW_KAFKA_ERR_INVALID_ARG)
                i += 1
            raise

    def poll(self, double timeout):
        """Serve delivery reports, waiting up to `timeout` seconds for the
        first. Returns the batches finished since the last call, in order:
        (batch_id, failures), failures a list of (index, error name, error
        text)."""
        cdef fw_kafka *k = self._open()
        cdef int ms = _ms(timeout)
        with nogil:
            fw_kafka_poll(k, ms)
        return self._finished()

    cdef list _finished(self):
        cdef list out = []
        cdef fw_kafka_batch *b
        cdef uint32_t j
        while True:
            b = fw_kafka_next_done(self.k)
            if b == NULL:
                return out
            try:
                out.append((b.id, [(b.errs[j].index, fw_kafka_err_name(self.k, b.errs[j].code).decode(),
                                    fw_kafka_err_text(self.k, b.errs[j].code).decode("utf-8", "replace"))
                                   for j in range(b.nerr)]))
            finally:
                fw_kafka_batch_free(b)

    def flush(self, double timeout):
        """Wait up to `timeout` s for every report; returns (records still
        without one, the batches finished meanwhile as poll() gives them)."""
        cdef fw_kafka *k = self._open()
        cdef int ms = _ms(timeout)
        cdef int left
        with nogil:
            left = fw_kafka_flush(k, ms)
        return left, self._finished()

    def purge(self):
        """Drop what librdkafka holds; the reports come at the next poll."""
        fw_kafka_purge(self._open())

    def fatal(self):
        """The fatal error's text (the producer must be replaced), or None."""
        cdef char buf[512]
        if self.k == NULL:
            return "the producer is closed"
        if not fw_kafka_fatal(self.k, buf, sizeof(buf)):
            return None
        return buf.decode("utf-8", "replace")

    def logs(self):
        """librdkafka's log lines since the last call: a list of (syslog
        level, facility, text), then the number of lines dropped for room."""
        cdef fw_kafka_log line
        cdef unsigned dropped = 0
        cdef list out = []
        if self.k == NULL:
            return out, 0
        while fw_kafka_next_log(self.k, &line, &dropped):
            out.append((line.level, line.fac.decode("utf-8", "replace"), line.text.decode("utf-8", "replace")))
        return out, dropped

    def close(self):
        """Purge, destroy the producer (without the GIL: it waits for
        librdkafka's threads) and unload the library; batches not finished
        are forgotten."""
        cdef fw_kafka *k = self.k
        self.k = NULL
        if k != NULL:
            with nogil:
                fw_kafka_close(k)

    def __dealloc__(self):
        if self.k != NULL:
            fw_kafka_close(self.k)
            self.k = NULL
