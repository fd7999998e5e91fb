"""Benchmarks as a Stackelberg game: equilibria of the providers' subgame and the designer's
tune-before-test threshold (Chen, Zhang & Hardt, "Leaderboard Incentives", ICML 2026).

    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:tiny --workdir=workdir
    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:paper \
        --workdir=workdir
    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:tiny \
        --config.cost_power=2 --config.cost_scale=0.06 --workdir=workdir   # quadratic cost

No data files: the games are specified by the fields below.
"""

import dataclasses
from typing import Annotated, Literal

import ml_collections

from core import config as cfg_lib
from core import report

# a grid's number of points: linspace(0, max, n) needs n >= 2
Grid = Annotated[int, cfg_lib.Range(2)]
Rewards = Literal["winner_take_all", "linear"]
# a contest needs two providers
Qualities = Annotated[tuple[float, ...], cfg_lib.Items(2)]


@dataclasses.dataclass(frozen=True)
class Config:
    # Observed score families: theta + amplitude (1 - exp(-rate t)) and sigmoid(theta + slope log(1 + t)).
    amplitude: cfg_lib.Positive = 1.0
    rate: cfg_lib.Positive = 1.0
    logit_slope: cfg_lib.Positive = 0.5
    # Cost c(e) = cost_scale * e ** cost_power (1 = linear, 2 = quadratic).
    cost_scale: cfg_lib.Positive = 0.25
    cost_power: cfg_lib.Positive = 1.0
    max_effort: cfg_lib.Positive = 5.0  # effort grids are linspace(0, max_effort, levels)
    # Main game: N = 3 providers on 101 effort levels, winner takes all.
    theta: Qualities = (1.0, 0.8, 0.6)
    levels: Grid = 101
    rewards: Rewards = "winner_take_all"  # or "linear"
    # Delta grid of the additive family: linspace(0, max_delta, num_deltas)
    max_delta: cfg_lib.Positive = 3.0
    num_deltas: Grid = 31
    # the logit family's Delta grid: linspace(0, logit_max_delta, num_deltas)
    logit_max_delta: cfg_lib.Positive = 15.0
    # Five providers on 21 levels with linear rewards.
    theta5: Qualities = (1.0, 0.9, 0.8, 0.7, 0.6)
    levels5: Grid = 21
    rewards5: Rewards = "linear"
    max_delta5: cfg_lib.Positive = 3.6
    num_deltas5: Grid = 13
    # Delta* against the quality gap, two providers.
    gaps: tuple[cfg_lib.Positive, ...] = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
    logit_gaps: tuple[cfg_lib.Positive, ...] = (0.2, 0.3, 0.4, 0.6, 0.8, 1.0)
    gap_levels: Grid = 101
    gap_deltas: Grid = 41
    bisection_steps: cfg_lib.NonNegInt = 20
    # Designer: J(Delta) = Kendall tau - cost_per_delta * Delta.
    cost_per_delta: cfg_lib.NonNegative = 0.05
    # Two providers' mixed equilibrium at Delta = 0 on a coarse grid (support enumeration).
    mixed_levels: Grid = 7
    timing_repeats: cfg_lib.Count = 5
    max_rounds: cfg_lib.Count = 64
    # No 'resolved' checks: equilibria and thresholds are computed exactly, not estimated.
    claim: report.Claim = report.Claim(
        method="Benchmarks as a Stackelberg game (tune-before-test)",
        statement="no equilibrium without tune-before-test; a unique equilibrium ranking models by "
                  "latent quality with enough of it",
        checks=("n_pure_ne_at_zero == 0", "ne_ranks_by_quality == 1",
                "logit_family.n_pure_ne_at_zero == 0", "logit_family.ne_ranks_by_quality == 1",
                "five_providers.n_pure_ne_at_zero == 0", "five_providers.ne_ranks_by_quality == 1"),
        ours="{game_labels[main]}: {n_pure_ne_at_zero} pure NE at Delta=0 (overtaking profit "
             "{zero_effort_margin:.2f} > 0); 1 zero-effort NE, tau=1, for Delta >= "
             "{delta_star_refined:.3f} (closed form {delta_star_closed_form:.3f}); "
             "{game_labels[five]}: {five_providers[n_pure_ne_at_zero]} pure NE at 0, Delta* "
             "{five_providers[delta_star_refined]:.3f}; logit family: "
             "{logit_family[n_pure_ne_at_zero]} at 0, Delta* {logit_family[delta_star_refined]:.3f}")


VARIANTS = {
    "tiny": {},
    # seconds: executes every code path (tests and notebook smoke runs); numbers are meaningless
    "smoke": {"levels": 11, "num_deltas": 4, "levels5": 5, "num_deltas5": 3, "gap_levels": 11,
              "gap_deltas": 4, "gaps": (0.2, 0.4), "logit_gaps": (0.4, 0.8), "bisection_steps": 3,
              "mixed_levels": 3, "timing_repeats": 1},
    "paper": {
        "levels": 201, "num_deltas": 121, "levels5": 31, "num_deltas5": 31, "gap_levels": 201,
        "gap_deltas": 81, "gaps": (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8),
        "bisection_steps": 30, "mixed_levels": 9, "timing_repeats": 20,
    },
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, Config, VARIANTS)
