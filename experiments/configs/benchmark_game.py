"""Benchmarks as a Stackelberg game: equilibria of the providers' subgame and the designer's
tune-before-test threshold (Chen, Zhang & Hardt, "Leaderboard Incentives", ICML 2026).

    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:tiny --workdir=workdir
    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:paper \
        --workdir=workdir
    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:tiny \
        --config.cost_power=2 --config.cost_scale=0.06 --workdir=workdir   # quadratic cost

No data files: the games are specified by the fields below.
"""

import ml_collections

from core import config as cfg_lib
from core import report


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Observed score families: theta + amplitude (1 - exp(-rate t)) and sigmoid(theta + slope log(1 + t)).
    c.amplitude = 1.0
    c.rate = 1.0
    c.logit_slope = 0.5
    # Cost c(e) = cost_scale * e ** cost_power (1 = linear, 2 = quadratic).
    c.cost_scale = 0.25
    c.cost_power = 1.0
    c.max_effort = 5.0  # effort grids are linspace(0, max_effort, levels)
    # Main game: N = 3 providers on 101 effort levels, winner takes all.
    c.theta = (1.0, 0.8, 0.6)
    c.levels = 101
    c.rewards = "winner_take_all"  # or "linear"
    c.max_delta = 3.0  # Delta grid of the additive family: linspace(0, max_delta, num_deltas)
    c.num_deltas = 31
    c.logit_max_delta = 15.0  # the logit family's Delta grid: linspace(0, logit_max_delta, num_deltas)
    # Five providers on 21 levels with linear rewards.
    c.theta5 = (1.0, 0.9, 0.8, 0.7, 0.6)
    c.levels5 = 21
    c.rewards5 = "linear"
    c.max_delta5 = 3.6
    c.num_deltas5 = 13
    # Delta* against the quality gap, two providers.
    c.gaps = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
    c.logit_gaps = (0.2, 0.3, 0.4, 0.6, 0.8, 1.0)
    c.gap_levels = 101
    c.gap_deltas = 41
    c.bisection_steps = 20
    # Designer: J(Delta) = Kendall tau - cost_per_delta * Delta.
    c.cost_per_delta = 0.05
    # Two providers' mixed equilibrium at Delta = 0 on a coarse grid (support enumeration).
    c.mixed_levels = 7
    c.timing_repeats = 5
    c.max_rounds = 64
    # No 'resolved' checks: equilibria and thresholds are computed exactly, not estimated.
    c.claim = report.claim_config(
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
    return c


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


_POSITIVE = cfg_lib.number(lo=0, lo_open=True)
_GRID = cfg_lib.integer(lo=2)  # a grid's number of points: linspace(0, max, n) needs n >= 2
_REWARDS = cfg_lib.one_of("winner_take_all", "linear")
_QUALITIES = cfg_lib.tuple_of(cfg_lib.number(), min_len=2)  # a contest needs two providers

# What each field accepts (checked once every override is in, before any work).
RULES = {
    "amplitude": _POSITIVE,
    "rate": _POSITIVE,
    "logit_slope": _POSITIVE,
    "cost_scale": _POSITIVE,
    "cost_power": _POSITIVE,
    "max_effort": _POSITIVE,
    "theta": _QUALITIES,
    "levels": _GRID,
    "rewards": _REWARDS,
    "max_delta": _POSITIVE,
    "num_deltas": _GRID,
    "logit_max_delta": _POSITIVE,
    "theta5": _QUALITIES,
    "levels5": _GRID,
    "rewards5": _REWARDS,
    "max_delta5": _POSITIVE,
    "num_deltas5": _GRID,
    "gaps": cfg_lib.tuple_of(_POSITIVE),
    "logit_gaps": cfg_lib.tuple_of(_POSITIVE),
    "gap_levels": _GRID,
    "gap_deltas": _GRID,
    "bisection_steps": cfg_lib.integer(lo=0),
    "cost_per_delta": cfg_lib.number(lo=0),
    "mixed_levels": _GRID,
    "timing_repeats": cfg_lib.integer(lo=1),
    "max_rounds": cfg_lib.integer(lo=1),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return cfg_lib.build(arg, base, VARIANTS)
