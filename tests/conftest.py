"""Shared pytest setup: quiet XLA logging and the hypothesis profiles. (Fixtures live beside the
tests that use them.)

Hypothesis profiles, chosen with the environment variable ``HYPOTHESIS_PROFILE``:

* ``ci`` (the default; what ``make test`` runs): derandomized, so every run draws the same examples
  and a failure reproduces; no example database is written; no deadline (first calls compile).
* ``thorough`` (for local runs): fresh random draws each run, failures kept in the example database
  (``.hypothesis/``) and replayed first, and 10x the examples of every test that sizes its count
  with :func:`tests.hypothesis_budget.examples`.
"""

import os

from hypothesis import settings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=10 * settings.get_profile("ci").max_examples,
                          derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
