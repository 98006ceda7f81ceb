# The two front doors: `make demo` and `make test`. Both install what is missing, then build.
BUILD ?= build
PY := .venv/bin/python
JOBS ?= 2

.PHONY: demo test deps build test-cpp test-python bench clean

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

clean:
	rm -rf $(BUILD)
