"""Shared pytest setup: quiet XLA logging and the hypothesis profiles. (Fixtures live beside the
tests that use them.)

Compiled programs are released (:func:`jax.clear_caches`) after a test module when the process
holds more than :data:`MAX_MEMORY_MAPS` memory maps (after every module where ``/proc/self/maps``
cannot be read). XLA:CPU maps each executable's code into its own memory regions (about 3 per
program), and a worker that runs a few hundred modules keeps thousands of programs alive; past the
kernel's ``vm.max_map_count`` (65,530 by default) the next compile cannot map its code and the
worker dies with a segmentation fault inside ``backend_compile_and_load``, in whichever test
happens to compile then. Below the threshold the caches are kept, so that later modules reuse
the small programs every test compiles (eager ops, shared fixtures).

Tests marked ``slow`` run first (:func:`pytest_collection_modifyitems`).

Hypothesis profiles, chosen with the environment variable ``HYPOTHESIS_PROFILE``:

* ``ci`` (the default; what ``make test`` runs): derandomized, so every run draws the same examples
  and a failure reproduces; no example database is written; no deadline (first calls compile).
* ``thorough`` (for local runs): fresh random draws each run, failures kept in the example database
  (``.hypothesis/``) and replayed first, and 10x the examples of every test that sizes its count
  with :func:`tests.hypothesis_budget.examples`.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read when jaxlib loads: before any jax import

# XLA:CPU's cheapest code generation (XLA_FLAGS is read when the first backend starts, after this
# file is imported). The suite is bound by compiling thousands of small programs, not by running
# them. LLVM at optimization level 0 halves an experiment's smoke run (rl_scaling 107 -> 54 s) and
# cuts the model tests by a quarter; XLA:CPU's older loop emitter for fusions instead of its MLIR
# fusion emitters compiles in about half the time again (rl_scaling's smoke run: backend compiles
# 20.4 -> 11.4 s). The programs compute the same operations (no fast-math); a result may differ in
# its last bits, which every tolerance here already allows: results must not depend on the
# machine's code generation. Benchmarks and `make run` keep XLA's defaults. Flags set by the
# caller win; the accelerator compile tests (``-m aot``) keep the defaults, so that their GPU
# kernels are compiled as a user's are. A flag this jaxlib does not know (XLA would abort) is left
# out: the process that starts the run tries them first.
_FAST_COMPILE_FLAGS = {"--xla_backend_optimization_level": "0",
                       "--xla_cpu_use_fusion_emitters": "false"}
_FLAGS_CHECKED = "ICML26_TEST_XLA_FLAGS_CHECKED"


def _accepted(flags: str) -> bool:
    """Whether XLA:CPU starts with ``flags`` (an unknown flag aborts the process)."""
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                           capture_output=True, timeout=120)
    return probe.returncode == 0


def _fast_compile_flags():
    if os.environ.get(_FLAGS_CHECKED):  # an xdist worker or a test's subprocess: already set
        return
    flags = os.environ.get("XLA_FLAGS", "")
    added = " ".join(f"{k}={v}" for k, v in _FAST_COMPILE_FLAGS.items() if k not in flags)
    if added and _accepted(f"{flags} {added}".strip()):
        os.environ["XLA_FLAGS"] = f"{flags} {added}".strip()
    os.environ[_FLAGS_CHECKED] = "1"


# JAX's persistent compilation cache, one fresh folder per run, shared by the xdist workers and every
# process a test starts (notebook kernels, `main` in isolated processes, the bad-input runs): they
# compile many of the same programs (an experiment's smoke run executes in its test and again in its
# notebook), and a program compiled once is then read back from disk (the rl_scaling notebook: 92 s
# with a cold cache, 34 s warm). The cache key covers the program, the compile options, XLA_FLAGS
# and the jax/jaxlib versions, so a hit is the executable that compiling would have produced. The
# folder is made by the process that starts the run and removed when that process ends; a caller's
# own JAX_COMPILATION_CACHE_DIR wins (and is kept).
_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
_OWN_CACHE = "ICML26_TEST_OWNS_COMPILATION_CACHE"


def _share_compilation_cache():
    if _CACHE_ENV not in os.environ:
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="jax-compilation-cache-")
        os.environ[_OWN_CACHE] = str(os.getpid())
    # Every program, however quick to compile: the suite's time is thousands of small compiles.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_configure(config):
    markexpr = (config.option.markexpr or "").replace(" ", "")
    if markexpr == "aot":
        return
    _fast_compile_flags()
    _share_compilation_cache()


def pytest_unconfigure(config):
    if os.environ.get(_OWN_CACHE) == str(os.getpid()):
        shutil.rmtree(os.environ[_CACHE_ENV], ignore_errors=True)


settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=10 * settings.get_profile("ci").max_examples,
                          derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Runs the tests marked ``slow`` (notebooks, end-to-end runs: tens of seconds each) first, so
    that xdist hands them out while every worker is free instead of ending the run on one of them
    while the other workers wait. The order is otherwise kept, and every worker computes the same."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# A third of the default vm.max_map_count: the largest test module adds a few thousand maps.
MAX_MEMORY_MAPS = 20_000


def memory_maps() -> int | None:
    """The number of memory maps of this process (None where ``/proc/self/maps`` is missing)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every jit cache after a module when the process nears the map limit (module
    docstring)."""
    yield
    maps = memory_maps()
    if maps is None or maps > MAX_MEMORY_MAPS:
        import jax

        jax.clear_caches()
