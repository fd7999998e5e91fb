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

import pytest
from hypothesis import settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read when jaxlib loads: before any jax import

# XLA:CPU's LLVM backend at optimization level 0 (XLA_FLAGS is read when the first backend starts,
# after this file is imported). The suite is bound by compiling thousands of small programs, not
# by running them: level 0 halves an experiment's smoke run (rl_scaling 107 -> 54 s) and cuts the
# model tests by a quarter, while the programs compute the same operations (no fast-math; a result
# may differ in its last bits, which every tolerance here already allows: results must not depend
# on the machine's code generation). Benchmarks and `make run` keep XLA's default level. A level
# set by the caller wins; the accelerator compile tests (``-m aot``) keep the default, so that
# their GPU kernels are compiled as a user's are. Not used: XLA:CPU's older loop emitter for fusions
# (`--xla_cpu_use_fusion_emitters=false`) compiles about 40% faster again at level 0, but there it
# miscompiles the jitted FFD decode of TestXLA.test_pages_and_values[2] (random keys of magnitude
# 1e-2, seed 1, lengths (1, 17), delta 0: the second row's outputs are wrong, for the reference
# implementation too), which it computes right at level 1, eagerly, and with the default emitters
# at level 0. Narrowed down: the page mask (bool [B, K, P]) the program computes is right as an
# output and its bytes are 0 or 1, the masked attention is right when the same mask comes in as
# an argument, and the selection and the attention are right when jitted apart; in the one
# program, the fusion that takes the masked row maximum reads the page as skipped (m = -inf)
# while the exponential sum counts it.
_OPT_FLAG = "--xla_backend_optimization_level"


def pytest_configure(config):
    markexpr = (config.option.markexpr or "").replace(" ", "")
    if markexpr == "aot":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if _OPT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_OPT_FLAG}=0".strip()


settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=10 * settings.get_profile("ci").max_examples,
                          derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Runs the tests marked ``slow`` (notebooks, end-to-end runs: tens of seconds each) first, so
    that xdist hands them out while every worker is free instead of ending the run on one of them
    while the other workers wait. The order is otherwise kept, and every worker computes the same."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def max_map_count() -> int:
    """The kernel's limit on a process's memory maps (``vm.max_map_count``; Linux's default,
    65,530, where it cannot be read)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65_530


# Room left below the limit for the next module: the largest test module (the FFD implementation
# contract) adds about 14,400 maps, the next ones 8,000 and fewer. With the default limit, caches
# are kept up to 45,530 maps: one release in a full two-worker run instead of four (each costs its
# worker 5-12 s, and the small programs of later modules compile again).
MAP_HEADROOM = 20_000
MAX_MEMORY_MAPS = max(max_map_count() - MAP_HEADROOM, 10_000)


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
