"""Example counts for the hypothesis tests under the profile that ``tests/conftest.py`` loads.

A test asks for ``examples(n)``: ``n`` under the ``ci`` profile (what ``make test`` runs), and
``n`` times the loaded profile's ``max_examples`` over the ``ci`` profile's otherwise (``thorough``:
10 n). An explicit ``max_examples`` in ``@settings`` overrides a profile, so a plain number there
would not grow under ``HYPOTHESIS_PROFILE=thorough``.
"""

from hypothesis import settings


def examples(n: int) -> int:
    """``n`` scaled by the loaded hypothesis profile (see the module docstring)."""
    scale = settings.default.max_examples / settings.get_profile("ci").max_examples
    return max(1, round(n * scale))
