# The two front doors: `make demo` and `make test`. Both install what is missing, then build.
SHELL := /bin/bash
BUILD ?= build
PY := .venv/bin/python
JOBS ?= 2

.PHONY: demo test deps build test-cpp test-python bench clean fuzz fuzz-build asan asan-python

demo: build
	$(BUILD)/attn demo

test: build
	$(MAKE) --no-print-directory test-cpp test-python

deps:
	@scripts/install-deps.sh

# Configure once, build incrementally, and put the Python module on .venv's path (a .pth file).
build: deps
	@[ -f $(BUILD)/CMakeCache.txt ] || cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release \
	  -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python
	cmake --build $(BUILD) -j$(JOBS)
	@printf '%s\n%s\n' "$(CURDIR)/python" "$(CURDIR)/$(BUILD)/python" > \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/attn.pth"

test-cpp:
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-python:
	$(PY) -m pytest -q tests/python

# libFuzzer targets (tests/fuzz/fuzz_*.cpp) with ASan + UBSan, built with clang in build-fuzz (clang is
# installed on demand: ATTN_FUZZ=1 scripts/install-deps.sh). Each runs FUZZ_SECONDS on a copy of its seed
# corpus (tests/fuzz/corpus/NAME), niced so a shared machine stays usable; a finding fails the target.
FUZZ_SECONDS ?= 60
FUZZ_BUILD ?= build-fuzz
FUZZERS := safetensors checkpoint
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
