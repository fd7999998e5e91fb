"""The designer's problem: how much tune-before-test training ``Delta`` to give every model.

The designer moves first (a Stackelberg leader) and picks ``Delta``; the providers then play the
subgame of :mod:`algorithms.benchmark_game.game`. The designer wants the equilibrium leaderboard to
rank models by latent quality and pays ``cost_per_unit`` per unit of ``Delta`` (Chen, Zhang & Hardt,
ICML 2026; the Stackelberg formulation of its abstract and introduction):

    J(Delta) = fidelity(Delta) - cost_per_unit * Delta,

with fidelity the Kendall tau between the equilibrium ranking and the quality order.

Threshold ``Delta*``. With everybody at zero effort, provider ``j`` gains ``R = r_k - r_j`` by
overtaking a better provider ``k < j``; in the continuum the cheapest way is to just overtake,
which needs the effort ``e_jk(Delta)`` solving ``v(theta_j, Delta + e) = v(theta_k, Delta)``
(increasing in ``Delta``). Zero effort is an equilibrium once, for every pair, overtaking is
impossible (``e_jk = inf``) or unprofitable (``c(e_jk) >= R``, i.e. ``e_jk >= c^{-1}(R)``):

    Delta* = max_{k < j} max(0, D_jk),   D_jk = the Delta with e_jk(Delta) = c^{-1}(r_k - r_j).

For the additive family ``v = theta + A (1 - exp(-rate t))`` this is ``D_jk = log((A / g) (1 -
exp(-rate c^{-1}(R)))) / rate`` with ``g = theta_k - theta_j``, below the impossibility threshold
``log(A / g) / rate``; for the logit-in-log-steps family ``D_jk = c^{-1}(R) / (exp(g / slope) - 1)
- 1``. The numeric threshold is read off the equilibria on a grid of ``Delta``.

Dimension legend: N providers, M effort levels, G grid points of Delta, K equilibrium slots.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.benchmark_game.game import (
    Contest,
    ScoreFamily,
    best_response_dynamics,
    cycle_taus,
    pure_equilibria,
)
from core import sharding, steps


def pair_thresholds(score: ScoreFamily, cost, theta, rewards) -> np.ndarray:
    """``max(0, D_jk)`` for every pair ``k < j`` (zero elsewhere) [N, N] float64 (host).

    Args:
      score: a score family with ``threshold_for_effort``.
      cost: a cost with ``inverse`` (e.g. :class:`~algorithms.benchmark_game.game.PowerCost`).
      theta: [N] qualities, strictly decreasing.
      rewards: [N] reward per rank, non-increasing.

    Raises:
      ValueError: ``theta`` not finite and strictly decreasing, or ``rewards`` not finite or of the
        wrong length.
    """
    theta = np.asarray(theta, np.float64)
    rewards = np.asarray(rewards, np.float64)
    if theta.ndim != 1 or not np.all(np.isfinite(theta)) or np.any(np.diff(theta) >= 0):
        raise ValueError(f"the closed form needs finite, strictly decreasing theta, got {theta}")
    if rewards.shape != theta.shape:
        raise ValueError(f"rewards must have shape {theta.shape}, got {rewards.shape}")
    if not np.all(np.isfinite(rewards)):
        raise ValueError(f"rewards must be finite, got {rewards}")
    n = theta.shape[0]
    out = np.zeros((n, n))
    for k in range(n):
        for j in range(k + 1, n):
            gain = rewards[k] - rewards[j]
            if gain <= 0:
                continue  # nothing to win by overtaking
            d = score.threshold_for_effort(theta[j], theta[k], cost.inverse(gain))
            out[j, k] = max(0.0, float(d)) if np.isfinite(d) else (np.inf if d > 0 else 0.0)
    return out


def delta_star_closed_form(score: ScoreFamily, cost, theta, rewards) -> float:
    """The continuum threshold ``Delta*`` above which zero effort is an equilibrium (module doc)."""
    return float(np.max(pair_thresholds(score, cost, theta, rewards)))


class Sweep(NamedTuple):
    """Pure-equilibrium statistics on a grid of ``Delta`` (leading axis G)."""

    deltas: jax.Array  # [G] f32
    count: jax.Array  # [G] int32 number of pure equilibria
    zero_effort_unique: jax.Array  # [G] bool
    mean_tau: jax.Array  # [G] f32 mean Kendall tau over the enumerated equilibria (NaN if none)
    min_tau: jax.Array  # [G] f32


def sweep_deltas(score: ScoreFamily, contest: Contest, deltas: jax.Array,
                 max_equilibria: int = 16) -> Sweep:
    """Pure equilibria at every ``Delta`` in ``deltas`` [G] (sequential ``lax.map``: the payoff
    tensor of one ``Delta`` is built at a time, so memory stays ``N * M**N`` floats).

    Raises:
      ValueError: concrete ``deltas`` that are not a vector of finite values >= 0. Traced ``deltas``
        are not checked here; a bad entry gives ``count = -1``, ``zero_effort_unique = False`` and
        NaN taus at its grid point (see :func:`~algorithms.benchmark_game.game.pure_equilibria`).
    """
    if np.ndim(deltas) != 1:
        raise ValueError(f"deltas must be a vector [G], got shape {np.shape(deltas)}")
    if not isinstance(deltas, jax.core.Tracer):
        d = np.asarray(deltas, np.float64)
        bad = np.flatnonzero(~(np.isfinite(d) & (d >= 0)))
        if bad.size:
            raise ValueError(f"deltas must be finite and >= 0, got deltas[{bad[0]}] = {d[bad[0]]}")
    if not isinstance(max_equilibria, (int, np.integer)) or max_equilibria < 1:
        raise ValueError(f"max_equilibria must be an integer >= 1, got {max_equilibria!r}")
    return _sweep_deltas(score, contest, jnp.asarray(deltas, jnp.float32), int(max_equilibria))


def sweep_step(score: ScoreFamily, contest: Contest, deltas,
               mesh: jax.sharding.Mesh | None = None) -> steps.Step:
    """:func:`sweep_deltas` over the grid ``deltas`` [G] rounded to float32 (where the sweep
    computes), as a ``core.steps.Step``: its arguments as given (``mesh`` None: the analysis
    calls it), or abstract and replicated on ``mesh`` (an ahead-of-time compile; a Python number
    among the score's parameters becomes a float32 scalar)."""
    args = (score, contest, np.asarray(deltas, np.float64).astype(np.float32))
    if mesh is not None:
        args = steps.place(jax.tree.map(jnp.asarray, args), sharding.replicated(mesh),
                           as_abstract=True)
    return steps.Step(sweep_deltas, args)


@functools.partial(jax.jit, static_argnames=("max_equilibria",))
def _sweep_deltas(score: ScoreFamily, contest: Contest, deltas: jax.Array,
                  max_equilibria: int) -> Sweep:
    def one(delta):
        eq = pure_equilibria(score, contest, delta, max_equilibria)
        return eq.count, eq.zero_effort_unique, jnp.nanmean(eq.taus), jnp.nanmin(eq.taus)

    count, zero, mean_tau, min_tau = jax.lax.map(one, deltas)
    return Sweep(deltas, count, zero, mean_tau, min_tau)


def delta_star_numeric(deltas, good) -> float:
    """Smallest grid ``Delta`` from which ``good`` (e.g. ``zero_effort_unique``) holds on the rest of
    the grid; ``inf`` when it fails at the last grid point.

    Raises:
      ValueError: ``deltas`` empty, not finite or not strictly increasing, or shapes differ.
    """
    deltas = np.asarray(deltas, np.float64)
    good = np.asarray(good, bool)
    if (deltas.shape != good.shape or deltas.ndim != 1 or deltas.size == 0
            or not np.all(np.isfinite(deltas)) or np.any(np.diff(deltas) <= 0)):
        raise ValueError(f"deltas must be a non-empty, finite, strictly increasing vector with one flag "
                         f"each, got deltas {deltas} and flags of shape {good.shape}")
    if not good[-1]:
        return float("inf")
    bad = np.flatnonzero(~good)
    return float(deltas[0] if bad.size == 0 else deltas[bad[-1] + 1])


def refine_delta_star(score: ScoreFamily, contest: Contest, lo: float, hi: float,
                      iters: int = 30) -> float:
    """Bisection on ``[lo, hi]`` for the point where ``zero_effort_unique`` switches on (expects it
    off at ``lo`` and on at ``hi``, e.g. the grid neighbours of :func:`delta_star_numeric`).

    Raises:
      ValueError: ``lo`` or ``hi`` not finite, ``lo < 0`` or ``lo > hi``; ``iters < 0``.
    """
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 <= lo <= hi):
        raise ValueError(f"need finite 0 <= lo <= hi, got lo={lo}, hi={hi}")
    if iters < 0:
        raise ValueError(f"iters must be >= 0, got {iters}")
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if bool(pure_equilibria(score, contest, mid).zero_effort_unique):
            hi = mid
        else:
            lo = mid
    return hi


def fidelity(score: ScoreFamily, contest: Contest, deltas, sweep: Sweep,
             max_rounds: int = 64) -> tuple[np.ndarray, list[str]]:
    """Ranking fidelity per grid ``Delta`` [G] and where it came from.

    The mean Kendall tau over the pure equilibria when there are some ("pure_ne"); otherwise the
    mean over the end-of-round profiles of the best-response cycle reached from zero effort
    ("br_cycle") - the leaderboards a designer would actually see when no equilibrium exists.
    """
    taus, source = [], []
    start = jnp.zeros(contest.num_players, jnp.int32)
    for g, delta in enumerate(np.asarray(deltas)):
        if int(sweep.count[g]) > 0:
            taus.append(float(sweep.mean_tau[g]))
            source.append("pure_ne")
            continue
        dyn = best_response_dynamics(score, contest, float(delta), start, max_rounds)
        t = cycle_taus(score, contest, float(delta), dyn)
        taus.append(float(np.mean(t)) if t.size else float("nan"))
        source.append("br_cycle" if t.size else "unresolved")
    return np.asarray(taus), source


def designer_objective(deltas, fidelities, cost_per_unit: float) -> np.ndarray:
    """``J(Delta) = fidelity(Delta) - cost_per_unit * Delta`` [G] (the leader's payoff)."""
    if not (np.isfinite(cost_per_unit) and cost_per_unit >= 0):
        raise ValueError(f"cost_per_unit must be finite and non-negative, got {cost_per_unit}")
    return np.asarray(fidelities, np.float64) - cost_per_unit * np.asarray(deltas, np.float64)


def zero_effort_margin(score: ScoreFamily, cost, theta, rewards, delta: float = 0.0) -> float:
    """Largest profit of overtaking from zero effort at ``delta``: ``max_{k < j} (r_k - r_j) -
    c(e_jk(delta))`` over pairs with something to win (host, float64; continuum efforts).

    The paper's "no equilibrium at ``Delta = 0``" needs effort to be cheap relative to the reward
    gap: if this margin is ``<= 0`` at ``delta = 0`` no provider can buy a better rank for less than
    it pays, so zero effort, ranked by quality, is already an equilibrium (``Delta* = 0``; e.g. a
    linear cost of 5 per unit instead of 0.25 in the default N = 3 game). A positive margin is the
    condition for the statement, and it is equivalent to ``delta_star_closed_form(...) > delta``.
    For two providers with winner-take-all rewards it is also sufficient: the better model
    re-overtakes any profitable lead for less than the leader paid, so no profile is stable.

    Returns:
      The margin in utility units; ``-inf`` when no pair can gain (equal rewards, or overtaking
      impossible for every pair).

    Raises:
      ValueError: as :func:`pair_thresholds`, or ``delta`` not finite and >= 0.
    """
    pair_thresholds(score, cost, theta, rewards)  # validates theta and rewards
    if not (np.isfinite(delta) and delta >= 0):
        raise ValueError(f"zero_effort_margin: delta must be finite and >= 0, got {delta}")
    theta = np.asarray(theta, np.float64)
    rewards = np.asarray(rewards, np.float64)
    best = -np.inf
    for k in range(theta.shape[0]):
        for j in range(k + 1, theta.shape[0]):
            gain = rewards[k] - rewards[j]
            if gain <= 0:
                continue
            e = float(score.overtake_effort(theta[j], theta[k], delta))
            best = max(best, gain - float(cost(e)) if np.isfinite(e) else -np.inf)
    return float(best)
