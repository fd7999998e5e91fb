"""Shared pytest setup: quiet XLA logging and the hypothesis profiles. (Fixtures live beside the
tests that use them.)

Compiled programs are released after each test module (:func:`jax.clear_caches`). XLA:CPU maps
each executable's code into its own memory regions (about 3 per program), and a worker that runs a
few hundred modules keeps thousands of programs alive; past the kernel's ``vm.max_map_count``
(65,530 by default) the next compile cannot map its code and the worker dies with a segmentation
fault inside ``backend_compile_and_load``, in whichever test happens to compile then.

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

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=10 * settings.get_profile("ci").max_examples,
                          derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every jit cache when a module's tests are done (see the module docstring)."""
    yield
    import jax

    jax.clear_caches()
