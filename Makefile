# The two front doors: `make demo` and `make test`. Both install what is missing, then build.
# demo: the demo set of scripts/install-deps.sh, and the CLI and the Python module only, the SIMD kernels for this
# CPU's best target: the first time about 7 CPU-minutes of compiling (4 minutes on 2 free cores, more on a busy
# machine; the README says so), later only what changed;
# test (and build): the test set too, and everything (tests, benchmarks, examples).
SHELL := /bin/bash
BUILD ?= build
PY := .venv/bin/python
JOBS ?= 2
CONFIGURE := cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python
# Put the Python module on .venv's path (a .pth file): python/ and the built _attn.
PTH = printf '%s\n%s\n' "$(CURDIR)/python" "$(CURDIR)/$(BUILD)/python" > \
  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/attn.pth"

.PHONY: demo build-demo test test-halves deps build test-cpp test-python bench clean fuzz fuzz-build asan asan-python

demo: build-demo
	$(BUILD)/attn demo

# A first configure here leaves the tests, benchmarks and examples out; make test turns them on.
build-demo:
	@scripts/install-deps.sh demo
	@[ -f $(BUILD)/CMakeCache.txt ] || $(CONFIGURE) -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCH=OFF \
	  -DATTN_BUILD_EXAMPLES=OFF -DATTN_NATIVE_ONLY=ON
	cmake --build $(BUILD) -j$(JOBS) --target front_ends
	@$(PTH)

test: build
	@$(MAKE) --no-print-directory test-halves

deps:
	@scripts/install-deps.sh test

# Configure once (again when a demo build left the tests out and compiled the kernels for this CPU only), build
# incrementally, put the module on the path.
build: deps
	@grep -qs '^ATTN_BUILD_TESTS:BOOL=ON' $(BUILD)/CMakeCache.txt && \
	  grep -qs '^ATTN_BUILD_BENCH:BOOL=ON' $(BUILD)/CMakeCache.txt && \
	  ! grep -qs '^ATTN_NATIVE_ONLY:BOOL=ON' $(BUILD)/CMakeCache.txt || \
	  $(CONFIGURE) -DATTN_BUILD_TESTS=ON -DATTN_BUILD_BENCH=ON -DATTN_BUILD_EXAMPLES=ON -DATTN_NATIVE_ONLY=OFF
	cmake --build $(BUILD) -j$(JOBS)
	@$(PTH)

# The two halves of make test. Each runs whatever the other gives, each says how it ended, and either
# failing fails make test (tests/python/test_make.py runs this with stand-in commands).
TEST_CPP = cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
TEST_PYTHON = $(PY) -m pytest -q tests/python
test-halves:
	@cpp=0; py=0; \
	( $(TEST_CPP) ) || cpp=$$?; \
	( $(TEST_PYTHON) ) || py=$$?; \
	say() { [ "$$2" = 0 ] && echo "$$1 passed" || echo "$$1 FAILED (exit $$2)"; }; \
	echo "make test: $$(say C++ $$cpp), $$(say Python $$py)"; \
	[ $$cpp = 0 ] && [ $$py = 0 ]

test-cpp:
	$(TEST_CPP)

# The headline numbers, attn against PyTorch 2.13 (transformers, ONNX Runtime) on this machine, in one table:
# bench/run.py says what it runs (at most 10 minutes on 2 cores; BENCH_ARGS=--threads 4 for another count).
# The peers are the test set's Python packages; the build is the CLI and the module only, as make demo's.
BENCH_ARGS ?=
bench: deps
	@$(MAKE) --no-print-directory build-demo
	$(PY) bench/run.py $(BENCH_ARGS)

test-python:
	$(TEST_PYTHON)

# libFuzzer targets (tests/fuzz/fuzz_*.cpp) with ASan + UBSan, built with clang in build-fuzz (clang is
# installed on demand: ATTN_FUZZ=1 scripts/install-deps.sh). Each runs FUZZ_SECONDS on a copy of its seed
# corpus (tests/fuzz/corpus/NAME), niced so a shared machine stays usable; a finding fails the target.
FUZZ_SECONDS ?= 60
FUZZ_BUILD ?= build-fuzz
FUZZERS := safetensors checkpoint tokenizer
fuzz-build:
	@ATTN_FUZZ=1 scripts/install-deps.sh
	@[ -f $(FUZZ_BUILD)/CMakeCache.txt ] || CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DATTN_FUZZ=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j$(JOBS)

fuzz: fuzz-build
	@for f in $(FUZZERS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$f && cp -n tests/fuzz/corpus/$$f/* $(FUZZ_BUILD)/corpus/$$f/ ; \
	  echo "fuzz_$$f: $(FUZZ_SECONDS) s"; \
	  nice -n 10 $(FUZZ_BUILD)/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
	    -artifact_prefix=$(FUZZ_BUILD)/crash-$$f- -print_final_stats=1 $(FUZZ_BUILD)/corpus/$$f > $(FUZZ_BUILD)/fuzz_$$f.log 2>&1; \
	  rc=$$?; grep -E "DONE|stat::number_of_executed_units|stat::peak_rss_mb|INFO: Seed" $(FUZZ_BUILD)/fuzz_$$f.log; \
	  if [ $$rc -ne 0 ]; then tail -n 60 $(FUZZ_BUILD)/fuzz_$$f.log; echo "fuzz_$$f: a finding (exit $$rc)"; exit 1; fi; \
	done

# The C++ tests once under ASan + UBSan (any report aborts the test), in build-asan. allocator_may_return_null:
# a failed malloc is the NULL the code must check (tests/test_hardening.cpp asks for 96 TiB), not ASan's abort.
ASAN_BUILD ?= build-asan
asan: deps
	@[ -f $(ASAN_BUILD)/CMakeCache.txt ] || cmake -S . -B $(ASAN_BUILD) -DATTN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS) $(ASAN_CTEST_ARGS)

# The Python tests of objects shared across threads, failing allocations, the --out lock and the saving
# signals against a sanitized module and CLI (build-asan-py; the ASan runtime preloaded into Python, leaks
# unchecked there: the interpreter's own would drown them).
ASAN_PY_BUILD ?= build-asan-py
ASAN_PYTEST ?= shared_by_8_threads or huge_zero_stride or second_trainer or sigterm
asan-python: deps
	@[ -f $(ASAN_PY_BUILD)/CMakeCache.txt ] || cmake -S . -B $(ASAN_PY_BUILD) -DATTN_SANITIZE=ON -DATTN_SANITIZE_PYTHON=ON \
	  -DATTN_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python
	cmake --build $(ASAN_PY_BUILD) -j$(JOBS) --target _attn attn
	LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libubsan.so)" \
	  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  PYTHONPATH=$(CURDIR)/$(ASAN_PY_BUILD)/python:$(CURDIR)/python ATTN_BIN=$(CURDIR)/$(ASAN_PY_BUILD)/attn \
	  $(PY) -m pytest -q -p no:cacheprovider tests/python/test_hardening.py -k "$(ASAN_PYTEST)"

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(ASAN_BUILD) $(ASAN_PY_BUILD)
