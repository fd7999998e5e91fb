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
import re

import pytest
from hypothesis import settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read when jaxlib loads: before any jax import

# How XLA:CPU compiles the suite's programs (XLA_FLAGS is read when the first backend starts, after
# this file is imported). The suite is bound by compiling thousands of small programs, not by running
# them, so it asks for the cheapest code generation that computes the same operations:
#
# * LLVM at optimization level 0: halves an experiment's smoke run (rl_scaling 107 -> 54 s) and cuts
#   the model tests by a quarter;
# * XLA:CPU's loop emitter for fusions (``--xla_cpu_use_fusion_emitters=false``, the code generator
#   XLA:CPU used before its MLIR fusion emitters): about 35% less compile time again at level 0.
#
# Neither turns on fast-math; a result may differ in its last bits (a multiply-add may or may not be
# fused, and may be fused in one copy of a computation and not in another), which every test here
# must allow: results must not depend on the machine's code generation. (That freedom found a real
# fault: the FFD selection compared the estimate of the page that sets the threshold with a second
# evaluation of itself, one of them with a fused multiply-add, and a row could then attend a page
# its masked maximum skipped; see reference.select_pages and test_threshold_page_survives_rounding.)
# Benchmarks and `make run` keep XLA's defaults. Flags set by the caller win; the accelerator
# compile tests (``-m aot``) keep the defaults, so that their GPU kernels are compiled as a user's
# are. The loop emitter is asked for only on the jaxlib versions it was checked with (a flag XLA
# does not know aborts the process).
_OPT_FLAG = "--xla_backend_optimization_level"
_EMITTER_FLAG = "--xla_cpu_use_fusion_emitters"
_EMITTER_CHECKED_JAXLIB = ("0.10.",)


def suite_xla_flags(flags: str, jaxlib_version: str) -> str:
    """``flags`` with the suite's code-generation flags added where the caller set none."""
    if _OPT_FLAG not in flags:
        flags = f"{flags} {_OPT_FLAG}=0"
    if _EMITTER_FLAG not in flags and jaxlib_version.startswith(_EMITTER_CHECKED_JAXLIB):
        flags = f"{flags} {_EMITTER_FLAG}=false"
    return flags.strip()


def selects_compile_tests(markexpr: str) -> bool:
    """Whether a ``-m`` expression selects the accelerator compile tests (names ``aot`` other than
    as ``not aot``), which keep XLA's default flags."""
    return re.search(r"(?<!not )\baot\b", " ".join(markexpr.split())) is not None


def pytest_configure(config):
    if selects_compile_tests(config.option.markexpr or ""):
        return
    from importlib import metadata

    os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""),
                                              metadata.version("jaxlib"))


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
# contract) adds about 14,400 maps with XLA's default fusion emitters, 9,100 with the loop emitter
# (fewer, smaller executables), the next ones 8,000 and fewer. With the default limit, caches are
# kept up to 45,530 maps: one release in a full two-worker run instead of four (each costs its
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
