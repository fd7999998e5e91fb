"""The providers' subgame of a benchmark: observed scores, payoff tensors, pure Nash equilibria and
best-response dynamics.

Model (Chen, Zhang & Hardt, "Leaderboard Incentives: Model Rankings under Strategic Post-Training",
ICML 2026; the model set-up): providers ``i = 1..N`` hold models of latent quality
``theta_1 > ... > theta_N``.
The designer's protocol gives every model ``Delta`` units of benchmark-specific training before it is
evaluated ("tune-before-test"; ``Delta = 0`` is the current practice). Each provider then chooses an
extra effort ``e_i`` from a grid and is observed at ``v(theta_i, Delta + e_i)``. Providers are ranked
by observed score, ties going to the higher ``theta`` (the lower index); provider ``i`` receives

    u_i(e) = r_{rank_i(e)} - c(e_i),        r_1 >= r_2 >= ... >= r_N,  c convex, strictly increasing.

Everything here is pure and jittable; validation of user input happens once, on the host, in
:func:`make_contest`.

Dimension legend: N providers (players), M effort levels, G grid points of Delta, K slots for
enumerated equilibria, T rounds of best-response dynamics. Indices into the effort grid are int32;
scores, rewards, costs and payoffs are float32 in the units of their inputs (scores in benchmark
points, efforts and Delta in training units, rewards and costs in utility).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from kernels import checks

# ----------------------------------------------------------------------------------------------
# Score families (observed score as a function of latent quality and total training).


def _parameters_as_leaves(cls):
    """Registers a frozen dataclass as a pytree whose fields are leaves, so that one compiled
    function serves every parameter value (changing ``amplitude`` does not recompile). Unflattening
    bypasses ``__post_init__``: validation runs once, when the user builds the object."""
    names = [f.name for f in dataclasses.fields(cls)]

    def unflatten(_, leaves):
        obj = object.__new__(cls)
        for name, value in zip(names, leaves, strict=True):
            object.__setattr__(obj, name, value)
        return obj

    jax.tree_util.register_pytree_node(cls, lambda obj: ([getattr(obj, n) for n in names], None),
                                       unflatten)
    return cls


class ScoreFamily(Protocol):
    """Observed score ``v(theta, t)``: increasing in ``theta``; increasing, concave and saturating in
    the training ``t >= 0``. Implementations are frozen dataclasses registered as pytrees: they are
    ordinary (traced) arguments of the jitted functions, their parameters are leaves."""

    def __call__(self, theta: jax.Array, t: jax.Array) -> jax.Array: ...

    def overtake_effort(self, theta_low, theta_high, delta): ...

    def threshold_for_effort(self, theta_low, theta_high, effort): ...

    def relative_score(self, gap, delta, effort): ...


@_parameters_as_leaves
@dataclasses.dataclass(frozen=True)
class AdditiveSaturating:
    """``v(theta, t) = theta + amplitude * (1 - exp(-rate * t))``.

    Training adds at most ``amplitude`` points. Once the remaining headroom ``amplitude *
    exp(-rate * Delta)`` is no larger than a quality gap ``g``, no effort lets the lower model
    overtake: overtaking is impossible for ``Delta >= log(amplitude / g) / rate``.

    Raises:
      ValueError: ``amplitude`` or ``rate`` not positive and finite.
    """

    amplitude: float = 1.0
    rate: float = 1.0

    def __post_init__(self):
        for name in ("amplitude", "rate"):
            value = getattr(self, name)
            checks.number(value, name, "AdditiveSaturating", minimum=0.0, open_min=True)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"AdditiveSaturating.{name} must be positive and finite, got {value}")

    def __call__(self, theta, t):
        return theta + self.amplitude * (-jnp.expm1(-self.rate * t))

    def relative_score(self, gap, delta, effort):
        """``v(theta_0 + gap, delta + effort) - v(theta_0, delta) = gap + A exp(-rate delta)
        (1 - exp(-rate effort))``: the observed score relative to the best model at zero extra
        effort. Both terms are small where the ranking is decided, so float32 resolves quality gaps
        to its relative precision, not to the precision of the scores themselves."""
        return gap + self.amplitude * jnp.exp(-self.rate * delta) * (-jnp.expm1(-self.rate * effort))

    def overtake_effort(self, theta_low, theta_high, delta):
        """Extra effort at which ``v(theta_low, delta + e) = v(theta_high, delta)`` (continuum);
        any larger effort overtakes. ``inf`` where overtaking is impossible.

        Closed form ``e = -log(1 - (g / A) exp(rate * delta)) / rate`` with ``g = theta_high -
        theta_low``. Works elementwise on arrays (numpy float64 in, numpy out).
        """
        g = np.asarray(theta_high, np.float64) - np.asarray(theta_low, np.float64)
        delta = np.asarray(delta, np.float64)
        headroom = 1.0 - (g / self.amplitude) * np.exp(self.rate * delta)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = -np.log(headroom) / self.rate
        return np.where(headroom > 0, e, np.inf)

    def impossibility_threshold(self, theta_low, theta_high):
        """``log(A / g) / rate``: from this ``Delta`` on the lower model cannot overtake at all."""
        g = np.asarray(theta_high, np.float64) - np.asarray(theta_low, np.float64)
        return np.log(self.amplitude / g) / self.rate

    def threshold_for_effort(self, theta_low, theta_high, effort):
        """Smallest ``Delta`` (possibly negative) at which just overtaking needs at least ``effort``:
        ``log((A / g) (1 - exp(-rate * effort))) / rate``; ``effort = inf`` gives the impossibility
        threshold."""
        g = np.asarray(theta_high, np.float64) - np.asarray(theta_low, np.float64)
        effort = np.asarray(effort, np.float64)
        return np.log((self.amplitude / g) * -np.expm1(-self.rate * effort)) / self.rate


@_parameters_as_leaves
@dataclasses.dataclass(frozen=True)
class LogitLogSteps:
    """``v(theta, t) = sigmoid(theta + slope * log(1 + t))``: the logit of benchmark accuracy grows
    linearly in the log of training steps (``theta`` is the logit before training).

    The score is concave in ``t`` for every ``theta`` iff ``slope <= 1`` (its second derivative has
    the sign of ``slope * (1 - 2 v) - 1``), so larger slopes are rejected. Overtaking is never
    impossible here, but the effort needed, ``(1 + Delta)(exp(g / slope) - 1)``, grows linearly in
    ``Delta``, so it becomes unprofitable.

    Raises:
      ValueError: ``slope`` outside ``(0, 1]``.
    """

    slope: float = 0.5

    def __post_init__(self):
        if not (math.isfinite(self.slope) and 0 < self.slope <= 1):
            raise ValueError(
                f"LogitLogSteps.slope must lie in (0, 1] for a concave score, got {self.slope}")

    def __call__(self, theta, t):
        return jax.nn.sigmoid(theta + self.slope * jnp.log1p(t))

    def relative_score(self, gap, delta, effort):
        """``logit v(theta_0 + gap, delta + effort) - logit v(theta_0, delta) = gap + slope
        log(1 + effort / (1 + delta))``: a strictly increasing transform of the observed score
        less a constant shared by all providers, so it ranks them alike and resolves quality gaps
        to float32's relative precision."""
        return gap + self.slope * jnp.log1p(effort / (1.0 + delta))

    def overtake_effort(self, theta_low, theta_high, delta):
        """``(1 + delta) (exp(g / slope) - 1)`` with ``g = theta_high - theta_low`` (continuum)."""
        g = np.asarray(theta_high, np.float64) - np.asarray(theta_low, np.float64)
        return (1.0 + np.asarray(delta, np.float64)) * np.expm1(g / self.slope)

    def threshold_for_effort(self, theta_low, theta_high, effort):
        """``effort / (exp(g / slope) - 1) - 1``: the ``Delta`` at which just overtaking needs
        ``effort``."""
        g = np.asarray(theta_high, np.float64) - np.asarray(theta_low, np.float64)
        return np.asarray(effort, np.float64) / np.expm1(g / self.slope) - 1.0


# ----------------------------------------------------------------------------------------------
# Costs and rewards.


@dataclasses.dataclass(frozen=True)
class PowerCost:
    """``c(e) = scale * e ** power``; ``power = 1`` is linear, ``power = 2`` quadratic.

    Raises:
      ValueError: ``scale <= 0`` (not strictly increasing) or ``power < 1`` (not convex).
    """

    scale: float = 1.0
    power: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"PowerCost.scale must be positive (strictly increasing cost), got {self.scale}")
        if not (math.isfinite(self.power) and self.power >= 1):
            raise ValueError(f"PowerCost.power must be >= 1 for a convex cost, got {self.power}")

    def __call__(self, e):
        return self.scale * np.asarray(e, np.float64) ** self.power

    def inverse(self, y):
        """The effort that costs ``y`` (``y >= 0``)."""
        return (np.asarray(y, np.float64) / self.scale) ** (1.0 / self.power)


def _num_ranks(n, name: str) -> int:
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name}: the number of ranks n must be an integer >= 1, got {n!r}")
    return int(n)


def winner_take_all(n: int) -> np.ndarray:
    """Rewards ``(1, 0, ..., 0)`` [n] float32.

    Raises:
      ValueError: ``n`` is not an integer >= 1.
    """
    r = np.zeros(_num_ranks(n, "winner_take_all"), np.float32)
    r[0] = 1.0
    return r


def linear_rewards(n: int) -> np.ndarray:
    """Rewards ``r_k = (n - k) / (n - 1)``, ``k = 1..n``: 1 for the top, 0 for the bottom [n] float32.

    With one rank (``n = 1``) the top is also the bottom; the single reward is 1, the same as
    :func:`winner_take_all` (the formula's 0/0 is not used).

    Raises:
      ValueError: ``n`` is not an integer >= 1.
    """
    n = _num_ranks(n, "linear_rewards")
    if n == 1:
        return np.ones(1, np.float32)
    return (np.arange(n, 0, -1, dtype=np.float32) - 1.0) / (n - 1)


# ----------------------------------------------------------------------------------------------
# The contest (validated arrays).


class Contest(NamedTuple):
    """Arrays of one subgame (a pytree; pass it through jit as an ordinary argument).

    Attributes:
      theta: [N] f32 latent qualities, non-increasing (player 0 is the best model).
      efforts: [M] f32 effort grid, strictly increasing, ``efforts[0] == 0``.
      costs: [M] f32 ``c(efforts)``.
      rewards: [N] f32 reward of rank 1..N, non-increasing.
      gaps: [N] f32 ``theta_i - theta_0`` (<= 0), computed in float64 before rounding, so that
        qualities closer than float32's resolution of ``theta`` stay distinct (see
        :func:`ranking_scores`).
    """

    theta: jax.Array
    efforts: jax.Array
    costs: jax.Array
    rewards: jax.Array
    gaps: jax.Array

    @property
    def num_players(self) -> int:
        return self.theta.shape[0]

    @property
    def num_levels(self) -> int:
        return self.efforts.shape[0]


# Two distinct qualities must differ by at least this fraction of their distance from the best
# model: the ranking scores (:func:`ranking_scores`) are float32 relative to the best model, with a
# rounding error of about one float32 epsilon (1.2e-7) of that distance, so 1024 epsilons keep the
# effort and Delta at which one overtakes the other accurate to about 1e-3 of their gap.
GAP_RESOLUTION = 1024.0 * float(np.finfo(np.float32).eps)


def make_contest(theta, efforts, rewards, cost, *, allow_tied_theta: bool = False) -> Contest:
    """Validates the inputs on the host and returns a :class:`Contest` of float32 device arrays.

    Args:
      theta: [N] latent qualities sorted from best to worst, ``N >= 2``.
      efforts: [M] effort grid, ``M >= 1``, strictly increasing from 0.
      rewards: [N] reward per rank, non-increasing.
      cost: a callable ``c(efforts) -> [M]`` (e.g. :class:`PowerCost`) or the [M] costs themselves.
      allow_tied_theta: if True, equal qualities are accepted (ties then go to the lower index).

    Raises:
      ValueError: wrong shapes; non-finite values; ``theta`` not sorted in decreasing order (or tied
        when ties are not allowed); two distinct qualities closer than ``GAP_RESOLUTION`` times
        their distance from ``theta[0]`` (the best model itself may be arbitrarily close to the
        second: ``(1, 1 - 1e-8)`` is solved exactly as a gap of 1e-8); empty, unsorted or
        not-from-zero effort grid; rewards increasing
        with rank; costs that are not strictly increasing or not convex on the grid.
    """
    theta = np.asarray(theta, np.float64)
    efforts = np.asarray(efforts, np.float64)
    rewards = np.asarray(rewards, np.float64)
    if theta.ndim != 1 or theta.shape[0] < 2:
        raise ValueError(f"theta must be a vector of at least 2 qualities, got shape {theta.shape}")
    if not np.all(np.isfinite(theta)):
        raise ValueError(f"theta must be finite, got {theta}")
    steps = np.diff(theta)
    if np.any(steps > 0):
        i = int(np.argmax(steps > 0))
        raise ValueError(f"theta must be sorted from best to worst: theta[{i}]={theta[i]} < "
                         f"theta[{i + 1}]={theta[i + 1]}")
    if not allow_tied_theta and np.any(steps == 0):
        i = int(np.argmax(steps == 0))
        raise ValueError(f"theta has a tie at positions {i} and {i + 1} ({theta[i]}); ties between "
                         "qualities are not allowed unless allow_tied_theta=True")
    if efforts.ndim != 1 or efforts.shape[0] == 0:
        raise ValueError(f"the effort grid must be a non-empty vector, got shape {efforts.shape}")
    if not np.all(np.isfinite(efforts)) or efforts[0] != 0.0 or np.any(np.diff(efforts) <= 0):
        raise ValueError(f"the effort grid must be finite, strictly increasing and start at 0, got "
                         f"{efforts[:5]}{'...' if efforts.size > 5 else ''}")
    if rewards.shape != theta.shape:
        raise ValueError(f"rewards must have one entry per rank, shape {theta.shape}, got {rewards.shape}")
    if not np.all(np.isfinite(rewards)) or np.any(np.diff(rewards) > 0):
        raise ValueError(f"rewards must be finite and non-increasing in rank, got {rewards}")
    costs = np.asarray(cost(efforts) if callable(cost) else cost, np.float64)
    if costs.shape != efforts.shape or not np.all(np.isfinite(costs)):
        raise ValueError(f"costs must be finite with shape {efforts.shape}, got {costs.shape}")
    if efforts.shape[0] > 1:
        slopes = np.diff(costs) / np.diff(efforts)
        if np.any(slopes <= 0):
            raise ValueError(f"the cost must be strictly increasing in effort, slopes {slopes}")
        bad = np.diff(slopes) < -1e-9 * np.maximum(1.0, np.abs(slopes[1:]))
        if np.any(bad):
            i = int(np.argmax(bad)) + 1
            raise ValueError(f"the cost must be convex: its slope falls at effort {efforts[i]} "
                             f"({slopes[i - 1]:.6g} -> {slopes[i]:.6g})")
    gaps = theta - theta[0]  # float64, exact for qualities closer than float32 resolves
    step = -np.diff(gaps)
    unresolved = (step > 0) & (step < GAP_RESOLUTION * np.abs(gaps[1:]))
    if np.any(unresolved):
        i = int(np.argmax(unresolved))
        raise ValueError(
            f"theta[{i}]={float(theta[i])!r} and theta[{i + 1}]={float(theta[i + 1])!r} differ by "
            f"{step[i]:.3g}, "
            f"less than {GAP_RESOLUTION:.2g} times their distance {-gaps[i + 1]:.3g} from the best "
            f"model theta[0]={float(theta[0])!r}: the float32 game cannot tell them apart; use qualities "
            "further apart, or equal ones with allow_tied_theta=True")
    as32 = lambda x: jnp.asarray(x, jnp.float32)
    return Contest(as32(theta), as32(efforts), as32(costs), as32(rewards), as32(gaps))


# ----------------------------------------------------------------------------------------------
# Scores, ranks and payoffs.


# Payoffs ``r - c`` are float32. Two payoffs of one player that differ by at most ``TIE_EPS`` times
# the payoff scale ``max|r| + max|c|`` are a tie: rounding the rewards and costs to float32 and the
# subtraction move a payoff by at most 1.5 float32 epsilons of that scale, so payoffs that are equal
# in exact arithmetic (e.g. ``r_1 - c(e_1) = r_2 - c(e_0)``) stay tied at every positive scale of
# the rewards and costs, and the equilibria do not depend on that scale.
TIE_EPS = 8.0 * float(np.finfo(np.float32).eps)


def _tie_tolerance(costs: jax.Array, rewards: jax.Array) -> jax.Array:
    """() f32 absolute tolerance for payoff ties (see ``TIE_EPS``)."""
    return TIE_EPS * (jnp.max(jnp.abs(rewards)) + jnp.max(jnp.abs(costs)))


def _is_traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def _check_delta(delta, name: str = "delta") -> None:
    """Host check of a concrete tune-before-test level (a traced one is checked inside, see
    :func:`_delta_ok`)."""
    if _is_traced(delta):
        return
    d = np.asarray(delta)
    if d.shape != () or not np.issubdtype(d.dtype, np.number) or np.iscomplexobj(d):
        raise ValueError(f"{name} must be a real scalar (training units), got {delta!r}")
    if not (np.isfinite(d) and d >= 0):
        raise ValueError(f"{name} must be finite and >= 0 (training units), got {float(d)}")


def _delta_ok(scores: jax.Array, delta) -> jax.Array:
    """() bool, traced: ``delta`` is finite and >= 0 and every observed score is finite."""
    d = jnp.asarray(delta, jnp.float32)
    return jnp.isfinite(d) & (d >= 0) & jnp.all(jnp.isfinite(scores))


def _check_game_shapes(scores, costs, rewards) -> None:
    """Static (trace-time) shape check shared by the payoff functions."""
    if scores.ndim != 2:
        raise ValueError(f"scores must be [N, M] (players x effort levels), got shape {scores.shape}")
    n, m = scores.shape
    if n < 2:
        raise ValueError(f"scores has {n} player row(s); a contest needs N >= 2 players")
    if rewards.shape != (n,):
        raise ValueError(f"rewards has shape {rewards.shape} but scores has {n} players: expected one "
                         f"reward per rank, shape ({n},)")
    if costs.shape != (m,):
        raise ValueError(f"costs has shape {costs.shape} but scores has {m} effort levels: expected "
                         f"one cost per level, shape ({m},)")


@jax.jit
def observed_scores(score: ScoreFamily, contest: Contest, delta) -> jax.Array:
    """``v(theta_i, delta + e_m)`` [N, M] f32 (the observed score of the model set-up).

    Jitted, so ``delta`` is not checked: a NaN ``delta`` gives NaN scores."""
    return score(contest.theta[:, None], jnp.asarray(delta, jnp.float32) + contest.efforts[None, :])


@jax.jit
def ranking_scores(score: ScoreFamily, contest: Contest, delta) -> jax.Array:
    """Scores that rank the providers exactly as :func:`observed_scores` does, [N, M] f32.

    ``score.relative_score(theta_i - theta_0, delta, e_m)``: a strictly increasing transform of the
    observed score less a constant shared by all providers (for both families, the score relative to
    the best model at zero extra effort). The observed scores themselves are O(1) in float32, so two
    qualities closer than about 1e-7 (e.g. 1 and 1 - 1e-8) would round to the same score and the
    game would be solved as if the models were tied; the relative scores keep the gap (computed in
    float64 by :func:`make_contest`) to float32's relative precision. A family without
    ``relative_score`` falls back to the observed scores. Used by every equilibrium computation.
    """
    relative = getattr(score, "relative_score", None)
    if relative is None:
        return observed_scores(score, contest, delta)
    d = jnp.asarray(delta, jnp.float32)
    return relative(contest.gaps[:, None], d, contest.efforts[None, :])


def _beats(s_j, s_i, j_before_i: bool):
    """Whether player j ranks above player i: higher score, or equal score and higher theta."""
    return (s_j > s_i) | ((s_j == s_i) & j_before_i)


@jax.jit
def profile_ranks(scores: jax.Array, profile: jax.Array) -> jax.Array:
    """Ranks [N] int32 (0 = top) of a pure profile ``profile`` [N] int32 given ``scores`` [N, M]."""
    n = scores.shape[0]
    s = jnp.take_along_axis(scores, profile[:, None], axis=1)[:, 0]
    idx = jnp.arange(n)
    above = _beats(s[None, :], s[:, None], idx[None, :] < idx[:, None])  # [i, j]: j above i
    return jnp.sum(above & (idx[None, :] != idx[:, None]), axis=1).astype(jnp.int32)


def _reward_of_rank(rewards: jax.Array, rank: jax.Array) -> jax.Array:
    """``rewards[rank]`` as a chain of selects: elementwise, so XLA fuses it (a gather over
    ``M**N`` entries would not be)."""
    out = jnp.broadcast_to(rewards[-1], rank.shape)
    for k in range(rewards.shape[0] - 2, -1, -1):
        out = jnp.where(rank == k, rewards[k], out)
    return out


def _player_payoff(scores: jax.Array, costs: jax.Array, rewards: jax.Array, i: int) -> jax.Array:
    """Player ``i``'s payoff over all profiles, [M, ..., M] (N axes; axis j = player j's effort)."""
    n, m = scores.shape

    def along(j, x):  # x [M] placed on axis j of an N-axis tensor
        shape = [1] * n
        shape[j] = m
        return x.reshape(shape)

    rank = jnp.zeros((1,) * n, jnp.int32)
    for j in range(n):
        if j != i:
            rank = rank + _beats(along(j, scores[j]), along(i, scores[i]), j < i)
    return jnp.broadcast_to(_reward_of_rank(rewards, rank) - along(i, costs), (m,) * n)


@jax.jit
def payoff_tensor(scores: jax.Array, costs: jax.Array, rewards: jax.Array) -> jax.Array:
    """All payoffs by broadcasting: ``U[i, m_1, ..., m_N] = r[rank_i(m)] - c[m_i]``.

    Args:
      scores: [N, M] observed scores, ``N >= 2``.
      costs: [M] cost per effort level.
      rewards: [N] reward per rank (rank 1 first).

    Returns:
      [N, M, ..., M] (N + 1 axes) f32. Memory is ``N * M**N`` floats: 3 x 101**3 and 5 x 21**5
      (20 M) are fine on a CPU.

    Raises:
      ValueError: ``scores`` is not [N, M] with ``N >= 2``, ``rewards`` is not [N] or ``costs`` is
        not [M] (shapes are static, so this is raised while tracing).
    """
    _check_game_shapes(scores, costs, rewards)
    n, m = scores.shape
    # the stacked output plus one player's float32 payoffs and comparisons while it is built
    checks.fits_in_memory((n + 2) * 4.0 * float(m) ** n, "payoff_tensor",
                          f"the payoff tensor of {n} players x {m} effort levels")
    return jnp.stack([_player_payoff(scores, costs, rewards, i) for i in range(scores.shape[0])])


def _payoff_tolerance(payoffs: jax.Array, tol) -> jax.Array:
    if tol is not None:
        return jnp.asarray(tol, payoffs.dtype)
    # Without the rewards and costs, their scale is bounded by twice the largest payoff magnitude.
    return 2.0 * TIE_EPS * jnp.max(jnp.abs(payoffs))


def best_response_mask(payoffs: jax.Array, tol=None) -> jax.Array:
    """``B[i, m] = True`` iff ``m_i`` is a best response of player i to ``m_{-i}`` [N, M, ..., M].

    A payoff within ``tol`` of the maximum along player i's axis counts as a best response (a tie).
    ``tol=None`` takes ``2 * TIE_EPS * max|payoffs|``, the float32 rounding of payoffs ``r - c``
    (module constant ``TIE_EPS``); :func:`pure_equilibria` uses ``TIE_EPS * (max|r| + max|c|)``.
    """
    n = payoffs.shape[0]
    t = _payoff_tolerance(payoffs, tol)
    return jnp.stack([payoffs[i] >= jnp.max(payoffs[i], axis=i, keepdims=True) - t for i in range(n)])


def pure_nash_mask(payoffs: jax.Array, tol=None) -> jax.Array:
    """[M, ..., M] bool: profiles where every player best-responds (pure Nash equilibria); ``tol`` as
    in :func:`best_response_mask`."""
    return jnp.all(best_response_mask(payoffs, tol), axis=0)


@jax.jit
def kendall_tau_to_quality(ranks: jax.Array) -> jax.Array:
    """Kendall's tau between a ranking ``ranks`` [..., N] (0 = top; a permutation) and the quality
    order (index order: player 0 is the best). 1 = ranked by quality, -1 = reversed. f32 [...].

    Raises:
      ValueError: fewer than 2 players (the statistic is 0/0).
    """
    n = ranks.shape[-1]
    if n < 2:
        raise ValueError(f"ranks must rank at least 2 players, got shape {ranks.shape}")
    upper = jnp.triu(jnp.ones((n, n), bool), k=1)
    sign = jnp.sign(ranks[..., None, :] - ranks[..., :, None])  # [.., i, j] > 0: i above j
    return jnp.sum(jnp.where(upper, sign, 0), axis=(-2, -1)) / (n * (n - 1) / 2)


class Equilibria(NamedTuple):
    """Pure equilibria of one subgame.

    Attributes:
      count: () int32 number of pure Nash equilibria (may exceed ``K``).
      profiles: [K, N] int32 effort indices of the first ``K`` equilibria (row-major order), -1 pads.
      ranks: [K, N] int32 their rankings (0 = top), -1 pads.
      taus: [K] f32 their Kendall tau to the quality order, NaN pads.
      zero_effort_unique: () bool, the only equilibrium is everybody at effort 0, ranked by quality.
    """

    count: jax.Array
    profiles: jax.Array
    ranks: jax.Array
    taus: jax.Array
    zero_effort_unique: jax.Array


def _first_true(mask: jax.Array, k: int) -> jax.Array:
    """Indices [k, N] int32 of the first ``k`` True entries of ``mask`` [M, ..., M] in row-major
    order, -1 pads. Same result as ``jnp.argwhere(mask, size=k, fill_value=-1)`` at a fraction of
    the cost: one reduction over the whole mask, then compaction inside at most ``k`` rows."""
    n, m = mask.ndim, mask.shape[0]
    lead = max(n - 2, 0)
    rows = mask.reshape(m ** lead, -1)  # [R, C]
    (row_idx,) = jnp.nonzero(jnp.any(rows, axis=1), size=k, fill_value=-1)
    sub = rows[jnp.maximum(row_idx, 0)] & (row_idx >= 0)[:, None]  # [k, C]
    col_idx = jax.vmap(lambda r: jnp.nonzero(r, size=k, fill_value=-1)[0])(sub)  # [k, k]
    flat = (row_idx[:, None] * rows.shape[1] + col_idx).reshape(-1)
    ok = (col_idx >= 0).reshape(-1)
    flat = flat[jnp.argsort(~ok, stable=True)[:k]]
    ok = ok[jnp.argsort(~ok, stable=True)[:k]]
    coords = jnp.stack(jnp.unravel_index(jnp.maximum(flat, 0), mask.shape), axis=-1)
    return jnp.where(ok[:, None], coords, -1).astype(jnp.int32)


def pure_equilibria(score: ScoreFamily, contest: Contest, delta, max_equilibria: int = 16, *,
                    max_bytes: float | None = None) -> Equilibria:
    """All pure Nash equilibria at tune-before-test level ``delta`` (a scalar, training units).

    Builds the payoff tensor (:func:`payoff_tensor`) and intersects the players' best-response
    masks (payoffs within ``TIE_EPS * (max|r| + max|c|)`` of a player's best are ties, so the result
    does not change when the rewards and costs are multiplied by a positive constant). The paper's
    two main results - no equilibrium at ``Delta = 0``, a unique quality-ranked equilibrium with
    enough tune-before-test - are statements about ``count`` and ``zero_effort_unique`` (here for
    pure strategies on the effort grid).

    Args:
      score: a score family (pytree; its parameters may vary without recompiling).
      contest: from :func:`make_contest`.
      delta: () tune-before-test training, finite and >= 0.
      max_equilibria: K >= 1, how many equilibria to list (static); ``count`` is exact regardless.
      max_bytes: refuse a contest whose working set (about ``10 * M**N`` bytes: one player's
        float32 payoffs, their maximum and the boolean masks) exceeds this; default half of the
        device's memory (:func:`kernels.checks.memory_limit`).

    Returns:
      :class:`Equilibria`. Costs ``O(N**2 M**N)`` time and ``O(M**N)`` memory per player. When
      ``delta`` is traced (inside the caller's ``jit``/``vmap``/``lax.map``) it cannot be checked
      on the host; a NaN, infinite or negative ``delta``, or a non-finite observed score, then gives
      ``count = -1``, profiles and ranks -1, taus NaN and ``zero_effort_unique = False``.

    Raises:
      ValueError: a concrete ``delta`` that is not a finite scalar >= 0; ``max_equilibria < 1``;
        a contest too large for ``max_bytes`` (the message gives the estimate and the limit).
    """
    _check_delta(delta)
    n, m = contest.num_players, contest.num_levels
    checks.fits_in_memory(10.0 * float(m) ** n, "pure_equilibria",
                          f"{n} players x {m} effort levels ({float(m) ** n:.3g} profiles)",
                          max_bytes)
    if not isinstance(max_equilibria, (int, np.integer)) or max_equilibria < 1:
        raise ValueError(f"max_equilibria must be an integer >= 1, got {max_equilibria!r}")
    return _pure_equilibria(score, contest, delta, int(max_equilibria))


@functools.partial(jax.jit, static_argnames=("max_equilibria",))
def _pure_equilibria(score: ScoreFamily, contest: Contest, delta, max_equilibria: int) -> Equilibria:
    scores = ranking_scores(score, contest, delta)
    n = contest.num_players
    tol = _tie_tolerance(contest.costs, contest.rewards)
    mask = jnp.ones((contest.num_levels,) * n, bool)
    for i in range(n):  # the best-response masks, one player at a time (no [N, M**N] stack)
        u = _player_payoff(scores, contest.costs, contest.rewards, i)
        mask &= u >= jnp.max(u, axis=i, keepdims=True) - tol
    ok = _delta_ok(scores, delta)
    count = jnp.where(ok, jnp.sum(mask, dtype=jnp.int32), -1)
    profiles = jnp.where(ok, _first_true(mask, max_equilibria), -1)
    valid = profiles[:, 0] >= 0
    ranks = jax.vmap(profile_ranks, in_axes=(None, 0))(scores, jnp.maximum(profiles, 0))
    ranks = jnp.where(valid[:, None], ranks, -1)
    taus = jnp.where(valid, kendall_tau_to_quality(ranks), jnp.nan)
    zero_unique = (count == 1) & mask[(0,) * n]
    zero_unique &= jnp.all(profile_ranks(scores, jnp.zeros(n, jnp.int32)) == jnp.arange(n))
    return Equilibria(count, profiles, ranks, taus, zero_unique & ok)


# ----------------------------------------------------------------------------------------------
# Best-response dynamics.


def best_response(scores: jax.Array, costs: jax.Array, rewards: jax.Array, profile: jax.Array,
                  i) -> jax.Array:
    """Player ``i``'s best response (an effort index, int32) to the others' efforts in ``profile``.

    Keeps the current effort when it is already a best response, else takes the cheapest best
    response; payoffs within ``TIE_EPS * (max|r| + max|c|)`` of the best are ties, as in
    :func:`pure_equilibria`. Costs O(N M), without the payoff tensor.

    Args:
      scores: [N, M] observed scores; costs: [M]; rewards: [N]; profile: [N] int32 effort indices;
      i: the player (int, may be traced).

    Raises:
      ValueError: mismatched shapes (static, raised while tracing).
    """
    _check_game_shapes(scores, costs, rewards)
    n, m = scores.shape
    if profile.shape != (n,):
        raise ValueError(f"profile must have one effort index per player, shape ({n},), got "
                         f"{profile.shape}")
    checks.array(profile, "profile", "best_response", kind="int")
    if not checks.is_traced(profile):
        p = np.asarray(profile)
        if p.min() < 0 or p.max() >= m:
            raise checks.error("best_response", "profile", f"effort indices in [0, {m})", p)
    if not checks.is_traced(i):
        checks.integer(i, "i (the player)", "best_response", minimum=0, maximum=n - 1)
    idx = jnp.arange(n)
    others = jnp.take_along_axis(scores, profile[:, None], axis=1)[:, 0]  # [N]
    mine = scores[i]  # [M]
    above = _beats(others[:, None], mine[None, :], (idx < i)[:, None]) & (idx != i)[:, None]
    payoff = rewards[jnp.sum(above, axis=0)] - costs  # [M]
    good = payoff >= jnp.max(payoff) - _tie_tolerance(costs, rewards)
    return jnp.where(good[profile[i]], profile[i], jnp.argmax(good)).astype(jnp.int32)


class Dynamics(NamedTuple):
    """Outcome of round-robin best-response dynamics.

    Attributes:
      converged: () bool, a round changed nothing (the final profile is a pure Nash equilibrium).
      cycled: () bool, a round ended in a profile seen at the end of an earlier round.
      cycle_length: () int32 rounds per cycle (1 when converged, 0 when neither).
      rounds: () int32 rounds played.
      history: [T + 1, N] int32 profiles at the end of rounds 0..T (row 0 = the start), -1 pads.
      cycle_start: () int32 the history row where the cycle (or the fixed point) begins, -1 if none.
    """

    converged: jax.Array
    cycled: jax.Array
    cycle_length: jax.Array
    rounds: jax.Array
    history: jax.Array
    cycle_start: jax.Array


def best_response_dynamics(score: ScoreFamily, contest: Contest, delta, start: jax.Array,
                           max_rounds: int = 64) -> Dynamics:
    """Round-robin best-response dynamics from ``start`` [N] int32 with exact cycle detection.

    In each round players ``0..N-1`` in turn switch to :func:`best_response`. A round is a
    deterministic map of profiles, so the end-of-round profiles either reach a fixed point (a pure
    equilibrium) or revisit an earlier profile and cycle for ever; the loop stops at either or after
    ``max_rounds``.

    Args:
      score, contest: as in :func:`pure_equilibria`.
      delta: () tune-before-test training, finite and >= 0. Traced and bad (NaN, infinite,
        negative, or non-finite scores): ``converged`` and ``cycled`` False, ``rounds`` 0,
        ``cycle_length`` 0, ``cycle_start`` -1 and ``history`` all -1.
      start: [N] int effort indices in ``[0, M)``.
      max_rounds: T >= 1 (static).

    Raises:
      ValueError: a concrete ``delta`` that is not a finite scalar >= 0; a concrete ``start`` of the
        wrong shape or out of range; ``max_rounds < 1``.
    """
    _check_delta(delta)
    if not isinstance(max_rounds, (int, np.integer)) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an integer >= 1, got {max_rounds!r}")
    n, m = contest.num_players, contest.num_levels
    if tuple(np.shape(start)) != (n,):
        raise ValueError(f"start must have one effort index per player, shape ({n},), got "
                         f"{np.shape(start)}")
    if not _is_traced(start):
        s = np.asarray(start)
        if not np.issubdtype(s.dtype, np.integer) or np.any((s < 0) | (s >= m)):
            raise ValueError(f"start must hold integer effort indices in [0, {m}), got {s}")
    return _best_response_dynamics(score, contest, delta, jnp.asarray(start, jnp.int32),
                                   int(max_rounds))


@functools.partial(jax.jit, static_argnames=("max_rounds",))
def _best_response_dynamics(score: ScoreFamily, contest: Contest, delta, start: jax.Array,
                            max_rounds: int) -> Dynamics:
    scores = ranking_scores(score, contest, delta)
    n = contest.num_players
    history = jnp.full((max_rounds + 1, n), -1, jnp.int32).at[0].set(start)

    def one_round(profile):
        return jax.lax.fori_loop(
            0, n, lambda i, p: p.at[i].set(best_response(scores, contest.costs, contest.rewards, p, i)),
            profile)

    def cond(state):
        t, _, start_row = state
        return (t < max_rounds) & (start_row < 0)

    def body(state):
        t, hist, _ = state
        new = one_round(hist[t])
        seen = jnp.all(hist == new[None, :], axis=1) & (jnp.arange(max_rounds + 1) <= t)
        start_row = jnp.where(jnp.any(seen), jnp.argmax(seen), -1).astype(jnp.int32)
        return t + 1, hist.at[t + 1].set(new), start_row

    t, history, start_row = jax.lax.while_loop(cond, body, (jnp.int32(0), history, jnp.int32(-1)))
    ok = _delta_ok(scores, delta)
    found = (start_row >= 0) & ok
    length = jnp.where(found, t - start_row, 0).astype(jnp.int32)
    converged = found & (length == 1)
    return Dynamics(converged, found & (length > 1), length, jnp.where(ok, t, 0),
                    jnp.where(ok, history, -1), jnp.where(ok, start_row, -1))


def cycle_taus(score: ScoreFamily, contest: Contest, delta, dynamics: Dynamics) -> np.ndarray:
    """Kendall tau to quality of each end-of-round profile on the cycle (or fixed point) [C], host.

    Raises:
      ValueError: ``delta`` is not a finite scalar >= 0.
    """
    _check_delta(delta)
    if int(dynamics.cycle_start) < 0:
        return np.zeros(0, np.float32)
    lo, hi = int(dynamics.cycle_start), int(dynamics.rounds)
    scores = ranking_scores(score, contest, delta)
    profiles = dynamics.history[lo:hi]
    ranks = jax.vmap(profile_ranks, in_axes=(None, 0))(scores, profiles)
    return np.asarray(kendall_tau_to_quality(ranks))
