"""Benchmarks as a Stackelberg game (Chen, Zhang & Hardt, "Leaderboard Incentives", ICML 2026).

A designer picks the amount ``Delta`` of tune-before-test training; providers then choose extra
benchmark-specific effort and are paid by leaderboard rank. ``game`` builds payoff tensors, pure
equilibria and best-response dynamics; ``mixed`` finds two-player mixed equilibria (support and
vertex enumeration); ``designer`` gives the threshold ``Delta*`` (closed form and numeric), the
condition for "no equilibrium at ``Delta = 0``" and the designer's objective; ``analysis`` runs the
studies of one game (a ``Delta`` sweep, ``Delta*`` against the quality gap, the mixed equilibrium).
"""

from algorithms.benchmark_game.analysis import REWARDS, analyse, gap_sweep, mixed_at_zero, named_rewards
from algorithms.benchmark_game.designer import (
    Sweep,
    delta_star_closed_form,
    delta_star_numeric,
    designer_objective,
    fidelity,
    pair_thresholds,
    refine_delta_star,
    sweep_deltas,
    zero_effort_margin,
)
from algorithms.benchmark_game.game import (
    AdditiveSaturating,
    Contest,
    Dynamics,
    Equilibria,
    LogitLogSteps,
    PowerCost,
    best_response,
    best_response_dynamics,
    best_response_mask,
    cycle_taus,
    kendall_tau_to_quality,
    linear_rewards,
    make_contest,
    observed_scores,
    payoff_tensor,
    profile_ranks,
    pure_equilibria,
    pure_nash_mask,
    ranking_scores,
    winner_take_all,
)
from algorithms.benchmark_game.mixed import (
    MixedEquilibria,
    contest_bimatrix,
    distinct,
    is_equilibrium,
    nash_equilibria,
    regrets,
    strictly_dominated,
    support_enumeration,
    vertex_enumeration,
)

__all__ = [
    "REWARDS", "analyse", "gap_sweep", "mixed_at_zero", "named_rewards", "ranking_scores",
    "zero_effort_margin", "AdditiveSaturating", "best_response", "best_response_dynamics", "best_response_mask",
    "Contest", "contest_bimatrix", "cycle_taus", "delta_star_closed_form", "delta_star_numeric",
    "designer_objective", "distinct", "Dynamics", "Equilibria", "fidelity", "is_equilibrium",
    "kendall_tau_to_quality", "linear_rewards", "LogitLogSteps", "make_contest", "MixedEquilibria",
    "nash_equilibria", "observed_scores", "pair_thresholds", "payoff_tensor", "PowerCost",
    "profile_ranks", "pure_equilibria", "pure_nash_mask", "refine_delta_star", "regrets",
    "strictly_dominated", "support_enumeration", "Sweep", "sweep_deltas", "vertex_enumeration",
    "winner_take_all",
]
