# Thin layer over CMake and a project venv. `make` installs missing Debian packages, makes or
# refreshes the venv (.venv, pinned in requirements/), configures and builds; `make test`
# also builds and installs the c10d wheel into the venv and runs every C++ and Python test;
# `make run` runs the collective benchmark on NPROC local ranks (side by side with PyTorch 2.13
# and Open MPI).
BUILD ?= build
VENV ?= .venv
# The interpreter the venv is made from (CPython 3.9+ with venv and pip).
BASE_PYTHON ?= python3
PYTHON := $(abspath $(VENV))/bin/python
WHEELS ?= $(BUILD)/wheels
PORTABLE_WHEELS ?= $(BUILD)/wheels-portable
JOBS ?= $(shell nproc)
NPROC ?= 2
BACKEND ?= shm,shm-zc,gloo
CMAKE_FLAGS ?=

.PHONY: all deps venv venv-bench configure build wheel wheel-portable docs stubs format format-check test test-cpp test-python test-cpp-consumer test-torch stress exit-soak run run-multihost demo bench fuzz fuzz-build fuzz-smoke clean

all: build

deps:
	@bash scripts/install-deps.sh

# The venv is made again when a requirements file changes (pip keeps what is already right).
$(VENV)/.requirements-test: requirements/test.txt | deps
	@test -x $(PYTHON) || $(BASE_PYTHON) -m venv $(VENV)
	@$(PYTHON) -m pip install -q --disable-pip-version-check -r requirements/test.txt
	@touch $@

$(VENV)/.requirements-bench: requirements/bench.txt $(VENV)/.requirements-test
	@$(PYTHON) -m pip install -q --disable-pip-version-check -r requirements/bench.txt
	@touch $@

venv: $(VENV)/.requirements-test
venv-bench: $(VENV)/.requirements-bench

# The in-tree build (libraries, tests, benchmarks, and python/c10d/_C for PYTHONPATH=python)
# uses the venv's interpreter, numpy and pybind11.
$(BUILD)/build.ninja: CMakeLists.txt | venv
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DPython3_EXECUTABLE=$(PYTHON) -Dpybind11_DIR=$$($(PYTHON) -m pybind11 --cmakedir) \
	  $(CMAKE_FLAGS) >/dev/null

configure: $(BUILD)/build.ninja

build: deps venv configure
	@cmake --build $(BUILD) -j $(JOBS)

# The wheel users get from `pip install .`, built with the venv's pinned tools, installed into
# the venv (the launcher becomes .venv/bin/c10drun); tests/python/test_packaging.py tries it.
wheel: venv
	@rm -rf $(WHEELS)
	@$(PYTHON) -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
	  -w $(WHEELS) .
	@$(PYTHON) -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
	  $(WHEELS)/c10d-*.whl

# The wheel for any x86-64 Linux with glibc 2.34+ and libstdc++ of GCC 12+
# (manylinux_2_35): auditwheel copies the libraries c10d._C needs from Debian (Gloo, libuv,
# cpp-httplib and theirs) into it. libmpi stays the host's: c10d._mpi loads it on first use.
# tests/python/test_portable_wheel.py installs it into a bare Debian root file system.
wheel-portable: wheel
	@rm -rf $(PORTABLE_WHEELS)
	@PATH=$(abspath $(VENV))/bin:$$PATH $(PYTHON) -m auditwheel repair \
	  --exclude libmpi.so.40 -w $(PORTABLE_WHEELS) $(WHEELS)/c10d-*.whl

# The API reference: HTML from the docstrings (pdoc) in $(BUILD)/api/index.html, warnings
# being errors; make test builds it too and checks every public name has a docstring
# (tests/python/test_api_reference.py).
docs: build
	@rm -rf $(BUILD)/api
	@$(PYTHON) scripts/api_docs.py $(BUILD)/api
	@echo "API reference: $(BUILD)/api/index.html"

# python/c10d/_C.pyi from the built module (scripts/gen_stubs.py); make test fails when it is
# stale (tests/python/test_stubs.py).
stubs: build
	@$(PYTHON) scripts/gen_stubs.py

# C++ through .clang-format, Python through ruff (pyproject.toml), over every tracked file.
CXX_SOURCES = git ls-files '*.cc' '*.h' '*.cpp'
PY_SOURCES = python tests scripts bench examples fuzz
format: venv
	@$(CXX_SOURCES) | xargs clang-format -i
	@$(PYTHON) -m ruff format -q $(PY_SOURCES)
	@$(PYTHON) -m ruff check -q --fix $(PY_SOURCES)

format-check: venv
	@$(CXX_SOURCES) | xargs clang-format --dry-run -Werror
	@$(PYTHON) -m ruff format -q --check $(PY_SOURCES)
	@$(PYTHON) -m ruff check -q $(PY_SOURCES)

test: build wheel wheel-portable
	@$(MAKE) --no-print-directory format-check test-cpp test-python test-cpp-consumer fuzz-smoke

test-cpp:
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

test-python:
	@C10D_WHEELS=$(abspath $(WHEELS)) C10D_PORTABLE_WHEELS=$(abspath $(PORTABLE_WHEELS)) \
	  C10D_ROOTFS=$(abspath $(BUILD))/rootfs C10D_REQUIRE_PEERS=1 PYTHONPATH=python $(PYTHON) -m pytest -q --durations=30 \
	  tests/python

# A standalone CMake project (examples/cpp) finds a fresh `cmake --install` of c10d and runs
# an all_reduce on 2 processes.
test-cpp-consumer: build
	@bash examples/cpp/run.sh $(BUILD)

# PyTorch's own distributed test suite from the installed wheel (tests/torch_suite/run.py) on
# c10d through both doors, all of it, at world size 2 and (the part torch's Gloo runs there) 8;
# make test runs a part (tests/python/test_torch_suite.py).
TORCH_SUITE_WORLDS ?= 2 8
test-torch: build
	@for ws in $(TORCH_SUITE_WORLDS); do \
	  for cfg in "torch gloo" "plugin c10d_shm" "plugin c10d_gloo" "c10d gloo" "c10d shm"; do \
	    set -- $$cfg; $(PYTHON) tests/torch_suite/run.py --door $$1 --backend $$2 \
	      --world-size $$ws || exit 1; \
	  done; \
	done

# The randomized collective programs of tests/python/test_stress.py, STRESS_EXAMPLES per test
# instead of the ~60 s default (2000: about half an hour on 2 cores).
STRESS_EXAMPLES ?= 2000
stress: build
	@C10D_STRESS_EXAMPLES=$(STRESS_EXAMPLES) PYTHONPATH=python $(PYTHON) -m pytest -q \
	  tests/python/test_stress.py

# Programs that exit with work never waited (and PyTorch's join tutorial), EXIT_RUNS launches
# each on shm and gloo: none may crash.
EXIT_RUNS ?= 200
exit-soak: build
	@C10D_EXIT_RUNS=$(EXIT_RUNS) PYTHONPATH=python $(PYTHON) -m pytest -q \
	  tests/python/test_shm_safety.py -k "exit"

# The main job, a few minutes: all_reduce, broadcast, all_gather and reduce_scatter at 4 B, 1 KiB, 64 KiB,
# 1 MiB and 16 MiB, side by side with PyTorch 2.13 (Gloo, and on c10d's shm through c10d.torch_backend)
# and Open MPI, 5 interleaved rounds (1 for the Gloo ones); then a small data-parallel run.
# `make bench` is the full sweep.
run: build venv-bench
	@PYTHONPATH=python $(PYTHON) bench/collective_bench.py --nproc $(NPROC) \
	  --backend $(BACKEND) --compare --ops all_reduce,broadcast,all_gather,reduce_scatter \
	  --sizes 4,1K,64K,1M,16M --time-scale 0.3 --rounds 5 --slow-rounds 1 \
	  --placement-budget 60 --placement-probe $(BUILD)/bench/placement_probe
	@PYTHONPATH=python $(PYTHON) -m c10d.run --nproc-per-node $(NPROC) examples/ddp_numpy.py

# Across test hosts (network namespaces, root): c10d's hier and Gloo against PyTorch's Gloo.
run-multihost: build venv-bench
	@PYTHONPATH=python $(PYTHON) bench/multihost_bench.py

demo: build
	@PYTHONPATH=python $(PYTHON) examples/store_demo.py --nproc $(NPROC)

# Every collective at 2 and 4 ranks against Open MPI and PyTorch's Gloo, then the store, the
# reduction kernels and the torch plugin.
BENCH_NPROCS ?= 2 4
bench: build venv-bench
	@$(BUILD)/bench/reduce_bench --benchmark_min_time=0.2
	@PYTHONPATH=python $(PYTHON) bench/store_bench.py
	@for n in $(BENCH_NPROCS); do \
	  PYTHONPATH=python $(PYTHON) bench/collective_bench.py --nproc $$n \
	    --backend $(BACKEND) --compare --time-scale 0.3 --rounds 7 --slow-rounds 3 \
	    --plot bench/busbw-$$n.png --placement-probe $(BUILD)/bench/placement_probe || exit 1; \
	done
	@PYTHONPATH=python $(PYTHON) -m c10d.run --nproc-per-node $(NPROC) \
	  bench/torch_backend_bench.py

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_TARGETS = tcpstore_parser_fuzz tcpstore_server_fuzz

fuzz-build:
	@C10D_WITH_FUZZ=1 bash scripts/install-deps.sh
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DC10D_FUZZ=ON \
	  -DC10D_WITH_GLOO=OFF -DC10D_BUILD_TESTS=OFF -DC10D_BUILD_PYTHON=OFF \
	  -DC10D_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) --target $(FUZZ_TARGETS) -j $(JOBS)

# Each fuzz target for FUZZ_SECONDS (default 10 minutes), memory capped at 2 GiB: the
# server must stay within its per-field size limits whatever it is sent.
fuzz: fuzz-build
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  echo "fuzzing $$t for $(FUZZ_SECONDS)s"; \
	  $(FUZZ_BUILD)/fuzz/$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	    -print_final_stats=1 $(FUZZ_BUILD)/corpus/$$t 2>&1 | tail -n 12 || exit 1; \
	done

fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=20

clean:
	@rm -rf $(BUILD) $(VENV) python/c10d/_C*.so
