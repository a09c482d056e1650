# Thin layer over CMake. `make` installs missing Debian packages, configures and builds;
# `make test` runs every C++ and Python test; `make run` runs the collective benchmark on
# NPROC local ranks (side by side with PyTorch and Open MPI, which it installs from Debian).
BUILD ?= build
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
NPROC ?= 2
BACKEND ?= gloo
CMAKE_FLAGS ?=

.PHONY: all deps configure build test test-cpp test-python run demo bench clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt | deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS) >/dev/null

configure: $(BUILD)/build.ninja

build: deps configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@C10D_WITH_PEERS=1 bash scripts/install-deps.sh
	@$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

test-python:
	@PYTHONPATH=python $(PYTHON) -m pytest -q tests/python

run: build
	@C10D_WITH_PEERS=1 bash scripts/install-deps.sh
	@PYTHONPATH=python $(PYTHON) bench/collective_bench.py --nproc $(NPROC) \
	  --backend $(BACKEND) --compare --time-scale 0.3

demo: build
	@PYTHONPATH=python $(PYTHON) examples/store_demo.py --nproc $(NPROC)

bench: build
	@C10D_WITH_PEERS=1 bash scripts/install-deps.sh
	@$(BUILD)/bench/reduce_bench --benchmark_min_time=0.2
	@PYTHONPATH=python $(PYTHON) bench/store_bench.py
	@PYTHONPATH=python $(PYTHON) bench/collective_bench.py --nproc $(NPROC) \
	  --backend $(BACKEND) --compare --plot bench/busbw.png

clean:
	@rm -rf $(BUILD) python/c10d/_C*.so
