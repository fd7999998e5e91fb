"""Budget bookkeeping for the IsoCompute sweep: C = B_p * n * M rollouts (Cheng et al. 2026,
Sec. 2: rollouts per problem n, problems per batch B_p, sequential update steps M)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One way to spend a rollout budget.

    Attributes:
      budget: C, total rollouts (completions sampled) over training.
      n: rollouts per problem.
      problems_per_batch: B_p.
      group_normalized: whether advantages divide by the group std (then n >= 2 is required).

    Raises (on construction):
      ValueError: non-positive values, n < 2 with group normalisation, or C not a multiple of
        n * B_p.
    """

    budget: int
    n: int
    problems_per_batch: int
    group_normalized: bool = True

    def __post_init__(self):
        if self.budget < 1 or self.n < 1 or self.problems_per_batch < 1:
            raise ValueError(f"Allocation: budget, n and problems_per_batch must be >= 1, got {self}")
        if self.group_normalized and self.n < 2:
            raise ValueError(f"Allocation: group-normalised advantages need n >= 2 rollouts per "
                             f"problem, got n={self.n}")
        if self.budget % (self.n * self.problems_per_batch):
            raise ValueError(
                f"Allocation: budget C={self.budget} is not divisible by n * B_p = "
                f"{self.n} * {self.problems_per_batch} = {self.n * self.problems_per_batch}")

    @property
    def rollouts_per_step(self) -> int:
        """R = n * B_p."""
        return self.n * self.problems_per_batch

    @property
    def steps(self) -> int:
        """M = C / (n * B_p)."""
        return self.budget // self.rollouts_per_step


def feasible(budget: int, n: int, problems_per_batch: int) -> bool:
    """Whether (C, n, B_p) gives an integer M >= 1."""
    r = n * problems_per_batch
    return budget >= r and budget % r == 0


def budget_grid(smallest: int, num: int, factor: int = 2) -> tuple[int, ...]:
    """A log grid of budgets ``smallest * factor**i``, i < num.

    Raises:
      ValueError: smallest < 1, num < 1 or factor < 2.
    """
    if smallest < 1 or num < 1 or factor < 2:
        raise ValueError(f"budget_grid: need smallest >= 1, num >= 1, factor >= 2, got "
                         f"{smallest}, {num}, {factor}")
    return tuple(smallest * factor**i for i in range(num))
