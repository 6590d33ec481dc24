# forkwsgi: C unit tests, fuzzing and the sanitizer build of the extension.
# The Python package itself builds with pip / setup.py; see tests/README.md.
#
#   make ctest         C unit tests (tests/c: parser, PROXY protocol, uwsgi packets, access log writer, offload ring), ASan + UBSan
#   make kafka-ctest RDKAFKA_LIB=...  the Kafka producer (cserver/fw_kafka.c) over a real librdkafka, no broker
#   make rdkafka-abi   cserver/fw_rdkafka.h checked against librdkafka's rdkafka.h (needs librdkafka-dev)
#   make faults        tests/c/build/libfwfault.so, the LD_PRELOAD fault injector tests/test_faults.py uses
#   make fuzz-smoke    the fuzz targets (HTTP, PROXY protocol, uwsgi) without libFuzzer: corpus + random inputs, ~90 s
#   make fuzz          libFuzzer (clang), FUZZ_SECONDS=60
#   make fuzz-proxy    the same for the PROXY protocol parser
#   make fuzz-uwsgi    the same for the uwsgi packet parser
#   make fuzz-offload-smoke / fuzz-offload   the same for the offload record parser
#   make fuzz-ring-smoke / fuzz-ring         the same for the offload ring's reader (damaged ring files)
#   make asan-ext      extension built with ASan/UBSan into build/asan, pytest run on it
#   make asan-smoke    the same build, a short run of a real server (tests/asan_smoke.py)
#   make coverage      the whole suite on a gcov build: per-file line and branch tables for C
#                      (gcovr) and Python (coverage.py, servers and workers included)
#   make wheels        sdist + manylinux_2_17 wheels for CPython 3.10-3.13 into dist/ (zig cc, auditwheel)
#   make clean

CC       ?= cc
CLANG    ?= clang
FUZZ_CC  ?= $(CC)
PYTHON   ?= python3

# The project's warning flags (setup.py) and the sanitizers.
CWARN    := -std=gnu11 -Wall -Wextra -Wimplicit-fallthrough -Werror -Wno-missing-field-initializers
# setup.py adds -Werror only when asked (users' builds go without it).
FORKWSGI_WERROR ?= 1
export FORKWSGI_WERROR
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1
SAN_ENV  := ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

HTTP_SRC := cserver/fw_http.c cserver/fw_reqread.c cserver/fw_buf.c
HTTP_HDR := cserver/fw_http.h cserver/fw_reqread.h cserver/fw_buf.h tests/c/http_sim.h

CBUILD   := tests/c/build
FBUILD   := tests/fuzz/build

# fuzz-smoke: random inputs, seed, and a time bound (seconds) for the random phase.
FUZZ_SMOKE_N       ?= 200000
FUZZ_SMOKE_SEED    ?= 1
FUZZ_SMOKE_SECONDS ?= 60
# libFuzzer run length (seconds) and extra options.
FUZZ_SECONDS       ?= 60
FUZZ_ARGS          ?=

# asan-ext: a separate build tree, and the tests to run on it. The tests that
# bound the server's RSS are left out: ASan's shadow memory and quarantine
# alone exceed their bounds (test_offload's 8 MiB spill test bounds the
# sibling's growth); so is the one that runs the server under a
# 1 GiB address-space limit (ASan cannot map its shadow there); and
# test_faults.py, whose preloaded shim serves malloc from glibc's own
# allocator behind ASan's back.
ASAN_DIR         := build/asan
ASAN_PYTEST_ARGS ?= -q -p no:cacheprovider tests --ignore=tests/test_c.py --ignore=tests/test_faults.py \
                    -k "not bounded_memory and not app_threads_that_cannot_start and not spilled_records_over_8_mib"
# The extension is built by the compiler Python was built with; its ASan
# runtime must be preloaded into the (uninstrumented) python process.
EXT_CC   = $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('CC').split()[0])")
LIBASAN  = $(shell $(EXT_CC) -print-file-name=libasan.so)
ASAN_EXT_ENV = LD_PRELOAD=$(LIBASAN) \
    ASAN_OPTIONS=detect_leaks=0:log_path=$(abspath $(ASAN_DIR))/logs/asan \
    UBSAN_OPTIONS=print_stacktrace=1:log_path=$(abspath $(ASAN_DIR))/logs/ubsan \
    PYTHONPATH=$(abspath $(ASAN_DIR))

.PHONY: help ctest faults kafka-ctest rdkafka-abi fuzz-smoke fuzz fuzz-http fuzz-proxy fuzz-uwsgi fuzz-offload-smoke fuzz-offload fuzz-ring-smoke fuzz-ring \
        asan-ext asan-ext-build asan-smoke coverage coverage-build wheels clean

help:
	@sed -n 's/^#   //p' Makefile

# ---- C unit tests ----------------------------------------------------------

$(CBUILD)/test_http: tests/c/test_http.c tests/c/check.h $(HTTP_SRC) $(HTTP_HDR)
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver -Itests/c tests/c/test_http.c $(HTTP_SRC) -o $@

ALOG_SRC := cserver/fw_alog.c cserver/fw_http.c cserver/fw_uwsgi.c cserver/fw_buf.c

$(CBUILD)/test_alog: tests/c/test_alog.c $(ALOG_SRC) cserver/fw_alog.h $(HTTP_HDR)
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver tests/c/test_alog.c $(ALOG_SRC) -lpthread -o $@

UWSGI_SRC := cserver/fw_uwsgi.c cserver/fw_http.c
UWSGI_HDR := cserver/fw_uwsgi.h cserver/fw_http.h

$(CBUILD)/test_uwsgi: tests/c/test_uwsgi.c tests/c/check.h $(UWSGI_SRC) $(UWSGI_HDR)
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver -Itests/c tests/c/test_uwsgi.c $(UWSGI_SRC) -o $@

PROXY_SRC := cserver/fw_proxy.c cserver/fw_netmask.c
PROXY_HDR := cserver/fw_proxy.h cserver/fw_netmask.h

$(CBUILD)/test_proxy: tests/c/test_proxy.c tests/c/check.h $(PROXY_SRC) $(PROXY_HDR)
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver -Itests/c tests/c/test_proxy.c $(PROXY_SRC) -o $@

RING_SRC := cserver/fw_ring.c

$(CBUILD)/test_ring: tests/c/test_ring.c tests/c/check.h $(RING_SRC) cserver/fw_ring.h
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver -Itests/c tests/c/test_ring.c $(RING_SRC) -lpthread -o $@

POOL_SRC := cserver/fw_pool.c cserver/fw_loop.c

$(CBUILD)/test_pool: tests/c/test_pool.c tests/c/check.h $(POOL_SRC) cserver/fw_pool.h cserver/fw_loop.h
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver -Itests/c tests/c/test_pool.c $(POOL_SRC) -lpthread -o $@

KAFKA_SRC := cserver/fw_kafka.c cserver/fw_rdkafka.c

$(CBUILD)/test_kafka: tests/c/test_kafka.c tests/c/check.h $(KAFKA_SRC) cserver/fw_kafka.h cserver/fw_rdkafka.h
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) $(SANITIZE) -Icserver -Itests/c tests/c/test_kafka.c $(KAFKA_SRC) -ldl -lpthread -o $@

# The fault injector (tests/c/faults.c: see its top comment); the tests
# build their own copy, this one is for trying a fault by hand.
$(CBUILD)/libfwfault.so: tests/c/faults.c
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) -shared -fPIC -O1 -o $@ tests/c/faults.c -ldl

faults: $(CBUILD)/libfwfault.so

# RDKAFKA_LIB: the librdkafka shared library to drive (tests/test_c.py gives
# the one confluent-kafka ships); no broker is needed.
kafka-ctest: $(CBUILD)/test_kafka
	@test -n "$(RDKAFKA_LIB)" || { echo "kafka-ctest: set RDKAFKA_LIB=/path/to/librdkafka.so.1"; exit 2; }
	$(SAN_ENV) $(CBUILD)/test_kafka $(RDKAFKA_LIB)

# cserver/fw_rdkafka.h against librdkafka's rdkafka.h (Debian: librdkafka-dev):
# compile-time checks only.
$(CBUILD)/test_rdkafka_abi: tests/c/test_rdkafka_abi.c cserver/fw_rdkafka.h cserver/fw_kafka.h
	@mkdir -p $(CBUILD)
	$(CC) $(CWARN) -Icserver tests/c/test_rdkafka_abi.c -lrdkafka -o $@

rdkafka-abi: $(CBUILD)/test_rdkafka_abi
	$(CBUILD)/test_rdkafka_abi

ctest: $(CBUILD)/test_http $(CBUILD)/test_proxy $(CBUILD)/test_uwsgi $(CBUILD)/test_alog $(CBUILD)/test_ring \
       $(CBUILD)/test_pool
	$(SAN_ENV) $(CBUILD)/test_http
	$(SAN_ENV) $(CBUILD)/test_proxy
	$(SAN_ENV) $(CBUILD)/test_uwsgi
	$(SAN_ENV) $(CBUILD)/test_alog
	$(SAN_ENV) $(CBUILD)/test_ring
	$(SAN_ENV) $(CBUILD)/test_pool

# ---- fuzzing ---------------------------------------------------------------
# One target per parser, named by its tests/fuzz/fuzz_NAME.c; per NAME:
#   FUZZ_NAME_SRC/_HDR  the C core it links (and rebuilds on)
#   FUZZ_NAME_INC       include flags; FUZZ_NAME_LIBS  link flags
#   FUZZ_NAME_OPTS      libFuzzer options; FUZZ_NAME_CORPUS  its corpus under tests/fuzz (read
#                       only) and $(FBUILD) (new entries)
# Two pattern rules build them: $(FBUILD)/fuzz_NAME (libFuzzer, clang) and
# $(FBUILD)/fuzz_NAME_standalone (tests/fuzz/standalone_main.c, any cc; the
# HTTP one keeps its older name fuzz_standalone).

FUZZ_NAMES := http proxy uwsgi offload ring

FUZZ_http_SRC     := $(HTTP_SRC)
FUZZ_http_HDR     := $(HTTP_HDR)
FUZZ_http_INC     := -Icserver -Itests/c
FUZZ_http_OPTS    := -max_len=2048 -dict=tests/fuzz/http.dict
FUZZ_http_CORPUS  := corpus

FUZZ_proxy_SRC    := $(PROXY_SRC)
FUZZ_proxy_HDR    := $(PROXY_HDR)
FUZZ_proxy_OPTS   := -max_len=512

FUZZ_uwsgi_SRC    := $(UWSGI_SRC)
FUZZ_uwsgi_HDR    := $(UWSGI_HDR)
FUZZ_uwsgi_OPTS   := -max_len=1024

FUZZ_offload_SRC  := cserver/fw_offload.c cserver/fw_ring.c
FUZZ_offload_HDR  := cserver/fw_offload.h cserver/fw_ring.h cserver/fw_io.h
FUZZ_offload_LIBS := -lpthread
FUZZ_offload_OPTS := -max_len=4096

FUZZ_ring_SRC     := cserver/fw_ring.c cserver/fw_offload.c
FUZZ_ring_HDR     := cserver/fw_ring.h cserver/fw_offload.h cserver/fw_io.h
FUZZ_ring_LIBS    := -lpthread
FUZZ_ring_OPTS    := -max_len=8192

# Defaults: include cserver only, corpus_NAME.
$(foreach n,$(FUZZ_NAMES),$(eval FUZZ_$(n)_INC ?= -Icserver)$(eval FUZZ_$(n)_CORPUS ?= corpus_$(n)))

# NAME of a standalone binary's stem: fuzz -> http, fuzz_proxy -> proxy.
fuzz_name = $(if $(filter fuzz,$(1)),http,$(1:fuzz_%=%))

.SECONDEXPANSION:

$(FBUILD)/fuzz_%: tests/fuzz/fuzz_%.c $$(FUZZ_$$*_SRC) $$(FUZZ_$$*_HDR)
	@mkdir -p $(FBUILD)
	$(CLANG) $(CWARN) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
	    -g -O1 $(FUZZ_$*_INC) $< $(strip $(FUZZ_$*_SRC) $(FUZZ_$*_LIBS)) -o $@

$(FBUILD)/%_standalone: tests/fuzz/fuzz_$$(call fuzz_name,$$*).c tests/fuzz/standalone_main.c \
                        $$(FUZZ_$$(call fuzz_name,$$*)_SRC) $$(FUZZ_$$(call fuzz_name,$$*)_HDR)
	@mkdir -p $(FBUILD)
	$(FUZZ_CC) $(CWARN) $(SANITIZE) $(FUZZ_$(call fuzz_name,$*)_INC) $< tests/fuzz/standalone_main.c \
	    $(strip $(FUZZ_$(call fuzz_name,$*)_SRC) $(FUZZ_$(call fuzz_name,$*)_LIBS)) -o $@

# Smoke runs of a standalone binary (no libFuzzer): the full inputs and time, or a fifth of each.
fuzz_smoke_full = $(SAN_ENV) timeout $$(( $(FUZZ_SMOKE_SECONDS) * 3 + 60 )) $(FBUILD)/$(1) \
	    -n $(FUZZ_SMOKE_N) -s $(FUZZ_SMOKE_SEED) -t $(FUZZ_SMOKE_SECONDS) -a $(FBUILD)/ tests/fuzz/$(2)
fuzz_smoke_fifth = $(SAN_ENV) timeout $$(( $(FUZZ_SMOKE_SECONDS) + 60 )) $(FBUILD)/$(1) \
	    -n $$(( $(FUZZ_SMOKE_N) / 5 )) -s $(FUZZ_SMOKE_SEED) -t $$(( $(FUZZ_SMOKE_SECONDS) / 5 + 1 )) \
	    -a $(FBUILD)/ tests/fuzz/$(2)

# Per NAME, its smoke budget: full or fifth (the PROXY protocol and uwsgi
# parsers and the ring's reader over damaged ring files get a fifth of the
# HTTP target's inputs and time).
FUZZ_SMOKE_BUDGET_http    := full
FUZZ_SMOKE_BUDGET_proxy   := fifth
FUZZ_SMOKE_BUDGET_uwsgi   := fifth
FUZZ_SMOKE_BUDGET_offload := full
FUZZ_SMOKE_BUDGET_ring    := fifth

# The smoke targets, and the NAMEs each runs one after the other.
FUZZ_SMOKE_TARGETS                 := fuzz-smoke fuzz-offload-smoke fuzz-ring-smoke
FUZZ_SMOKE_RUNS_fuzz-smoke         := http proxy uwsgi
FUZZ_SMOKE_RUNS_fuzz-offload-smoke := offload
FUZZ_SMOKE_RUNS_fuzz-ring-smoke    := ring

# NAME's standalone binary (the HTTP one keeps its older name fuzz_standalone).
fuzz_standalone = fuzz_$(if $(filter http,$(1)),,$(1)_)standalone
# One recipe line per NAME (the blank line in the define ends each).
define fuzz_smoke_run
$(call fuzz_smoke_$(FUZZ_SMOKE_BUDGET_$(1)),$(call fuzz_standalone,$(1)),$(FUZZ_$(1)_CORPUS))

endef

$(FUZZ_SMOKE_TARGETS): %: $$(foreach n,$$(FUZZ_SMOKE_RUNS_$$*),$(FBUILD)/$$(call fuzz_standalone,$$(n)))
	$(foreach n,$(FUZZ_SMOKE_RUNS_$@),$(call fuzz_smoke_run,$(n)))

# libFuzzer runs: `make fuzz` (HTTP; also fuzz-http), fuzz-proxy, fuzz-uwsgi, fuzz-offload, fuzz-ring.
# New corpus entries go to tests/fuzz/build/corpus*; tests/fuzz/corpus* are read only.
# A crash leaves tests/fuzz/build/crash-<sha1>; replay it with
#     tests/fuzz/build/fuzz_http tests/fuzz/build/crash-<sha1>
fuzz: fuzz-http

$(addprefix fuzz-,$(FUZZ_NAMES)): fuzz-%: $(FBUILD)/fuzz_%
	@mkdir -p $(FBUILD)/$(FUZZ_$*_CORPUS)
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(FBUILD)/fuzz_$* \
	    -max_total_time=$(FUZZ_SECONDS) $(FUZZ_$*_OPTS) -artifact_prefix=$(FBUILD)/ -print_final_stats=1 \
	    $(FUZZ_ARGS) $(FBUILD)/$(FUZZ_$*_CORPUS) tests/fuzz/$(FUZZ_$*_CORPUS)

# ---- the extension under ASan/UBSan ---------------------------------------
# Built into build/asan (objects in build/asan/tmp) next to a copy of the
# pure-Python package, so neither the in-place .so nor build/ of a normal
# build is touched; PYTHONPATH puts it before the installed package.

asan-ext-build:
	FORKWSGI_SANITIZE=1 $(PYTHON) setup.py -q build_ext --force -b $(ASAN_DIR) -t $(ASAN_DIR)/tmp
	cp python/forkwsgi/*.py $(ASAN_DIR)/forkwsgi/
	mkdir -p $(ASAN_DIR)/forkwsgi/offload && cp python/forkwsgi/offload/*.py $(ASAN_DIR)/forkwsgi/offload/
	@test -f "$(LIBASAN)" || { echo "cannot find libasan.so for $(EXT_CC)"; exit 1; }
	@$(ASAN_EXT_ENV) $(PYTHON) -c "import forkwsgi._forkwsgi as m, sys; \
	    assert m.__file__.startswith('$(abspath $(ASAN_DIR))'), m.__file__; print('ASan build:', m.__file__)"

# Reports are written to build/asan/logs/{asan,ubsan}.<pid>; any report fails the target.
asan-ext: asan-ext-build
	@rm -rf $(ASAN_DIR)/logs && mkdir -p $(ASAN_DIR)/logs
	$(ASAN_EXT_ENV) $(PYTHON) -m pytest -n 0 $(ASAN_PYTEST_ARGS); rc=$$?; \
	    if ls $(ASAN_DIR)/logs/* >/dev/null 2>&1; then \
	        echo "== sanitizer reports:"; cat $(ASAN_DIR)/logs/*; exit 1; fi; \
	    echo "no sanitizer reports"; exit $$rc

asan-smoke: asan-ext-build
	@rm -rf $(ASAN_DIR)/logs && mkdir -p $(ASAN_DIR)/logs
	cd tests && $(ASAN_EXT_ENV) $(PYTHON) asan_smoke.py; rc=$$?; cd ..; \
	    if ls $(ASAN_DIR)/logs/* >/dev/null 2>&1; then \
	        echo "== sanitizer reports:"; cat $(ASAN_DIR)/logs/*; exit 1; fi; \
	    echo "no sanitizer reports"; exit $$rc

# ---- coverage ----------------------------------------------------------------
# The extension built with --coverage into build/cov (objects and .gcda files
# in build/cov/tmp), beside a copy of the package and tests/coverage's
# sitecustomize, which starts coverage.py in every Python process of the run
# (pytest, servers, forked workers) and writes gcov's counters at os._exit.
# Needs the coverage extra: pip install '.[test,coverage]'. COV_PYTEST_ARGS
# picks the tests (default: all but the C unit tests, which build their own).

COV_DIR          := build/cov
COV_PYTEST_ARGS  ?= -q -p no:cacheprovider tests --ignore=tests/test_c.py
COV_ENV = COVERAGE_PROCESS_START=$(abspath tests/coverage/coverage.rc) \
    FW_COVERAGE_DATA=$(abspath $(COV_DIR))/data/.coverage PYTHONPATH=$(abspath $(COV_DIR))

coverage-build:
	FORKWSGI_COVERAGE=1 $(PYTHON) setup.py -q build_ext --force -b $(COV_DIR) -t $(COV_DIR)/tmp
	cp python/forkwsgi/*.py $(COV_DIR)/forkwsgi/
	mkdir -p $(COV_DIR)/forkwsgi/offload && cp python/forkwsgi/offload/*.py $(COV_DIR)/forkwsgi/offload/
	cp tests/coverage/sitecustomize.py $(COV_DIR)/

coverage: coverage-build
	@rm -rf $(COV_DIR)/data && mkdir -p $(COV_DIR)/data
	@find $(COV_DIR)/tmp -name '*.gcda' -delete
	$(COV_ENV) $(PYTHON) -m pytest -n 0 $(COV_PYTEST_ARGS); rc=$$?; \
	    export FW_COVERAGE_DATA=$(abspath $(COV_DIR))/data/.coverage; \
	    $(PYTHON) -m coverage combine -q --rcfile tests/coverage/coverage.rc $(COV_DIR)/data; \
	    $(PYTHON) -m coverage report --rcfile tests/coverage/coverage.rc; \
	    echo "== C lines"; \
	    $(PYTHON) -m gcovr -r . --object-directory $(COV_DIR)/tmp -f cserver/ -f 'src/[a-z_]+\.c' \
	        -e src/_forkwsgi.c --txt-metric line; \
	    echo "== C branches"; \
	    $(PYTHON) -m gcovr -r . --object-directory $(COV_DIR)/tmp -f cserver/ -f 'src/[a-z_]+\.c' \
	        -e src/_forkwsgi.c --txt-metric branch; \
	    exit $$rc

# ---- packaging -------------------------------------------------------------
# scripts/build_wheels.py: the sdist, then from it a wheel per interpreter
# compiled by zig cc for glibc 2.17, checked and tagged by auditwheel. Its
# tools come from $(PYTHON) or a venv it makes under build/wheel-tools.
# WHEEL_PYTHONS="3.12 /usr/bin/python3.11" builds for those versions or interpreters only.
WHEEL_PYTHONS ?=

wheels:
	$(PYTHON) scripts/build_wheels.py --out dist $(foreach p,$(WHEEL_PYTHONS),--python $(p))

clean:
	rm -rf $(CBUILD) $(FBUILD) $(ASAN_DIR) build/wheels
