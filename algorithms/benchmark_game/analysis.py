"""Studies of one benchmark game: equilibria along a ``Delta`` grid, the threshold ``Delta*`` against
the quality gap, and the two-provider mixed equilibrium at ``Delta = 0`` (Chen, Zhang & Hardt,
"Leaderboard Incentives", ICML 2026).

Each study takes the game (score family, cost, qualities, rewards, grids) as arguments and returns
host numbers (numpy arrays, floats, bools); no I/O. Dimension legend: N providers, M effort levels,
G grid points of Delta, S quality gaps.
"""

from __future__ import annotations

import numpy as np

from algorithms.benchmark_game.designer import (
    delta_star_closed_form,
    delta_star_numeric,
    fidelity,
    refine_delta_star,
    sweep_deltas,
    sweep_step,
    zero_effort_margin,
)
from algorithms.benchmark_game.game import (
    Contest,
    ScoreFamily,
    best_response_dynamics,
    linear_rewards,
    make_contest,
    payoff_tensor,
    pure_equilibria,
    ranking_scores,
    winner_take_all,
)
from algorithms.benchmark_game.mixed import contest_bimatrix, nash_equilibria

REWARDS = ("winner_take_all", "linear")


def named_rewards(kind: str, n: int) -> np.ndarray:
    """Rewards [n] float32 by name: ``"winner_take_all"`` or ``"linear"``.

    Raises:
      ValueError: another name, or ``n`` not an integer >= 1.
    """
    if kind == "winner_take_all":
        return winner_take_all(n)
    if kind == "linear":
        return linear_rewards(n)
    raise ValueError(f"rewards must be one of {REWARDS}, got {kind!r}")


def analyse(score: ScoreFamily, cost, contest: Contest, theta, rewards, deltas, max_rounds: int = 64,
            bisection_steps: int = 20) -> dict:
    """Equilibria of one game on a grid of ``Delta`` and its threshold ``Delta*``.

    Args:
      score, cost: the score family and the cost (with ``inverse``) of the contest.
      contest: from :func:`~algorithms.benchmark_game.game.make_contest`.
      theta, rewards: [N] the contest's qualities and rewards in float64 (for the closed forms).
      deltas: [G] strictly increasing grid from 0.
      max_rounds: rounds of best-response dynamics; bisection_steps: refinement of ``Delta*``.

    Returns:
      dict: ``deltas`` [G], ``n_pure_ne`` [G], ``zero_effort_unique`` [G], ``kendall_tau`` [G] and its
      ``kendall_tau_source``; ``delta_star_numeric`` (grid), ``delta_star_refined`` (bisection
      between grid neighbours) and ``delta_star_closed_form``; ``zero_effort_margin`` (the profit of
      overtaking from zero effort at ``Delta = 0``: the no-equilibrium statement needs it > 0, see
      :func:`~algorithms.benchmark_game.designer.zero_effort_margin`); ``ne_ranks_by_quality`` (for
      every grid ``Delta >= Delta*`` the only equilibrium is zero effort with Kendall tau 1); and
      best-response dynamics from zero effort at ``Delta = 0``: ``br_cycle_at_zero``,
      ``br_cycle_length_at_zero``, ``br_converged_at_zero``.
    """
    deltas = np.asarray(deltas, np.float64)
    step = sweep_step(score, contest, deltas)
    sweep = step.fn(*step.args)
    zero_unique = np.asarray(sweep.zero_effort_unique)
    numeric = delta_star_numeric(deltas, zero_unique)
    taus, source = fidelity(score, contest, deltas, sweep, max_rounds)
    dyn = best_response_dynamics(score, contest, 0.0, np.zeros(len(theta), np.int32), max_rounds)
    refined = numeric
    if np.isfinite(numeric) and numeric > deltas[0]:
        lo = float(deltas[np.flatnonzero(deltas < numeric)[-1]])
        refined = refine_delta_star(score, contest, lo, float(numeric), bisection_steps)
    above = deltas >= numeric
    return {
        "deltas": deltas,
        "n_pure_ne": np.asarray(sweep.count),
        "zero_effort_unique": zero_unique,
        "kendall_tau": taus,
        "kendall_tau_source": source,
        "delta_star_numeric": numeric,
        "delta_star_refined": refined,
        "delta_star_closed_form": delta_star_closed_form(score, cost, theta, rewards),
        "zero_effort_margin": zero_effort_margin(score, cost, theta, rewards, 0.0),
        "ne_ranks_by_quality": bool(np.isfinite(numeric) and np.all(zero_unique[above])
                                    and np.all(np.asarray(sweep.mean_tau)[above] == 1.0)),
        "br_cycle_at_zero": bool(dyn.cycled),
        "br_cycle_length_at_zero": int(dyn.cycle_length),
        "br_converged_at_zero": bool(dyn.converged),
    }


def gap_sweep(score: ScoreFamily, cost, gaps, max_effort: float, levels: int, num_deltas: int,
              bisection_steps: int = 20) -> dict:
    """``Delta*`` of two providers (qualities 1 and 1 - gap, winner takes all) against the gap.

    For every gap the ``Delta`` grid is ``linspace(0, 1.5 Delta*_closed + 0.5, num_deltas)`` and the
    effort grid ``linspace(0, max_effort, levels)``; the numeric threshold is refined by bisection.

    Returns:
      dict: ``gaps`` [S], ``closed_form`` [S], ``numeric_grid`` [S], ``numeric_refined`` [S] and
      ``max_abs_diff`` (largest |refined - closed form|).
    """
    efforts = np.linspace(0.0, max_effort, levels)
    rewards = winner_take_all(2)
    closed, grid, refined = [], [], []
    for g in gaps:
        theta = np.array([1.0, 1.0 - g])
        contest = make_contest(theta, efforts, rewards, cost)
        cf = delta_star_closed_form(score, cost, theta, rewards)
        deltas = np.linspace(0.0, 1.5 * cf + 0.5, num_deltas)
        sweep = sweep_deltas(score, contest, deltas.astype(np.float32))
        num = delta_star_numeric(deltas, np.asarray(sweep.zero_effort_unique))
        ref = num
        if np.isfinite(num) and num > 0:
            ref = refine_delta_star(score, contest, float(num - (deltas[1] - deltas[0])), float(num),
                                    bisection_steps)
        closed.append(cf)
        grid.append(num)
        refined.append(ref)
    closed, refined = np.asarray(closed), np.asarray(refined)
    return {"gaps": np.asarray(gaps, np.float64), "closed_form": closed,
            "numeric_grid": np.asarray(grid), "numeric_refined": refined,
            "max_abs_diff": float(np.max(np.abs(refined - closed)))}


def mixed_at_zero(score: ScoreFamily, cost, theta, max_effort: float, levels: int) -> dict:
    """The two best providers at ``Delta = 0`` with winner-take-all rewards on ``levels`` efforts.

    Returns:
      dict: ``levels``, ``n_pure_ne``, ``n_mixed_ne`` and per mixed equilibrium (``equilibria``) the
      strategies ``row`` and ``col``, the probability that the better model ranks first (ties go to
      it), the expected Kendall tau ``2 p - 1`` and the expected efforts.
    """
    theta = np.asarray(theta, np.float64)[:2]
    efforts = np.linspace(0.0, max_effort, levels)
    contest = make_contest(theta, efforts, winner_take_all(2), cost)
    scores = np.asarray(ranking_scores(score, contest, 0.0))
    A, B = contest_bimatrix(payoff_tensor(scores, contest.costs, contest.rewards))
    eqs = nash_equilibria(A, B)
    better_first = (scores[0][:, None] >= scores[1][None, :]).astype(np.float64)
    out = {"levels": int(levels), "n_pure_ne": int(pure_equilibria(score, contest, 0.0).count),
           "n_mixed_ne": len(eqs), "equilibria": []}
    for x, y in eqs:
        p = float(x @ better_first @ y)
        out["equilibria"].append({"row": x, "col": y, "p_better_ranks_first": p,
                                  "expected_kendall_tau": 2 * p - 1,
                                  "expected_effort": [float(x @ efforts), float(y @ efforts)]})
    return out
