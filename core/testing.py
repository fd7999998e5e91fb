"""Test support shared by the bad-input batteries of every package (pytest is imported lazily, so
the library does not depend on it).

A battery collects cases with :meth:`BadInputs.add` and runs each through one parametrized test:

    CASES = BadInputs()
    CASES.add("pass_at_k-negative-n", rl_metrics.pass_at_k, jnp.array([-1]), jnp.array([0]), 1,
              match="num_samples")

    @pytest.mark.parametrize("case", CASES.params())
    def test_bad_input_is_one_clear_value_error(case):
        case.check()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class BadInput:
    """One call that must fail with a one-line ``ValueError`` whose message matches ``match``."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    match: str

    def check(self) -> None:
        """Calls ``fn(*args, **kwargs)``; asserts a ``ValueError`` matching ``match`` (a regular
        expression searched in the message) whose message is one line."""
        import pytest

        with pytest.raises(ValueError, match=self.match) as error:
            self.fn(*self.args, **self.kwargs)
        message = str(error.value)
        assert "\n" not in message.strip(), f"the error spans several lines: {message!r}"


class BadInputs:
    """An ordered collection of :class:`BadInput` cases with unique ids."""

    def __init__(self) -> None:
        self._cases: dict[str, BadInput] = {}

    def add(self, case_id: str, fn: Callable[..., Any], *args: Any, match: str,
            **kwargs: Any) -> None:
        """Adds the call ``fn(*args, **kwargs)``, expected to raise a ``ValueError`` matching
        ``match``.

        Raises:
          ValueError: ``case_id`` already used.
        """
        if case_id in self._cases:
            raise ValueError(f"BadInputs.add: case id {case_id!r} is already used")
        self._cases[case_id] = BadInput(fn, args, kwargs, match)

    def __len__(self) -> int:
        return len(self._cases)

    def params(self) -> list:
        """The cases as ``pytest.param(case, id=case_id)``."""
        import pytest

        return [pytest.param(case, id=case_id) for case_id, case in self._cases.items()]
