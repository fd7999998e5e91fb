"""Fits for the compute-optimal number of rollouts per problem n*(C) (host-side NumPy/SciPy).

Dimensions: Q values of n, S seeds, C compute budgets.

* n*(C) at one budget: the reward at each log2 n is smoothed by a parabola; n* is its vertex when
  the parabola is concave and the vertex lies inside the grid, else the best grid point (Cheng et
  al. 2026, Sec. 4.1, which read n* off smoothed iso-compute curves).
* Across budgets: log2 n*(C) is fitted by a saturating sigmoid in log2 C,
  ``lo + (hi - lo) * sigmoid((log2 C - x0) / w)`` with ``lo`` the smallest n tried, and by a
  plain power law ``log2 n* = a + b log2 C``; the two forms are compared by leave-one-budget-out
  squared error in log2 n*.
* Confidence intervals: bootstrap over the replicate runs of each configuration. Replicates are
  S seeds, each with T rollout streams: a seed fixes the order of the training problems and a
  stream the randomness of the rollouts sampled on them, so the T streams of a seed share its
  problem order (a two-level design). A replicate of the bootstrap resamples the S seeds with
  replacement and then, within each drawn seed, its T streams with replacement (the two-stage
  bootstrap of hierarchical data, Davison & Hinkley 1997, "Bootstrap Methods and their
  Application", Sec. 3.8; resampling both stages errs on the wide side). With T = 1 it is the
  plain bootstrap over seeds.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy import optimize


def n_star(log2_n: np.ndarray, reward: np.ndarray) -> float:
    """log2 n* from the rewards [Q] measured at log2 n [Q] (Q >= 1; the parabola needs Q >= 3).

    Raises:
      ValueError: mismatched shapes, empty input, or non-finite rewards.
    """
    x = np.asarray(log2_n, np.float64)
    y = np.asarray(reward, np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"n_star: log2_n {x.shape} and reward {y.shape} must be equal 1-D shapes")
    if not np.all(np.isfinite(y)):
        raise ValueError(f"n_star: non-finite rewards {y}")
    best = float(x[np.argmax(y)])
    if x.size < 3:
        return best
    a, b, _ = np.polyfit(x, y, 2)
    if a >= 0:
        return best
    vertex = -b / (2 * a)
    return float(vertex) if x.min() <= vertex <= x.max() else best


def resample_mean(rng: np.random.Generator, rewards: np.ndarray) -> np.ndarray:
    """One two-stage bootstrap replicate of the replicate mean of each configuration.

    Args:
      rng: the NumPy generator (advanced).
      rewards: float64 [..., S, T, Q]: S seeds x T rollout streams of Q independent
        configurations (leading axes, e.g. budgets, share the draw: a run's rewards at every
        budget are one draw).

    Returns:
      float64 [..., Q]: per configuration q, the mean over S seeds drawn with replacement and,
      within each drawn seed, T of its streams drawn with replacement (module docstring).
    """
    s, t, q = rewards.shape[-3:]
    seeds = rng.integers(0, s, size=(s, 1, q))
    streams = rng.integers(0, t, size=(s, t, q))
    return rewards[..., seeds, streams, np.arange(q)].mean(axis=(-3, -2))


def bootstrap_n_star(log2_n: np.ndarray, rewards: np.ndarray, num_boot: int, seed: int,
                     level: float = 0.9) -> tuple[float, float, float]:
    """(point estimate, lower, upper) of log2 n* with a percentile bootstrap over the replicates.

    Args:
      log2_n: [Q].
      rewards: [S, Q] per-seed rewards, or [S, T, Q] for S seeds x T rollout streams
        (resampled in two stages, :func:`resample_mean`); NaN is not allowed.
      num_boot: bootstrap replicates (>= 1).
      seed: NumPy seed of the resampling.
      level: central interval mass.

    Raises:
      ValueError: rewards of another shape.
    """
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim not in (2, 3) or rewards.shape[-1] != len(log2_n) or not rewards.size:
        raise ValueError(f"bootstrap_n_star: rewards must be [S, Q={len(log2_n)}] or "
                         f"[S, T, Q={len(log2_n)}], got {rewards.shape}")
    rng = np.random.default_rng(seed)
    if rewards.ndim == 3 and rewards.shape[1] > 1:
        point = n_star(log2_n, rewards.mean(axis=(0, 1)))
        boots = [n_star(log2_n, resample_mean(rng, rewards)) for _ in range(num_boot)]
    else:  # one stream: the bootstrap over seeds
        rewards = rewards.reshape(rewards.shape[0], -1)
        s = rewards.shape[0]
        point = n_star(log2_n, rewards.mean(axis=0))
        idx = rng.integers(0, s, size=(num_boot, s, rewards.shape[1]))
        boots = [n_star(log2_n, np.take_along_axis(rewards, i, axis=0).mean(axis=0))
                 for i in idx]
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return point, float(lo), float(hi)


def power_law(log2_c: np.ndarray, a: float, b: float) -> np.ndarray:
    """log2 n* = a + b log2 C."""
    return a + b * np.asarray(log2_c)


def sigmoid_law(log2_c: np.ndarray, hi: float, x0: float, w: float, lo: float) -> np.ndarray:
    """log2 n* = lo + (hi - lo) / (1 + exp(-(log2 C - x0) / w)): grows, then saturates at hi."""
    return lo + (hi - lo) / (1.0 + np.exp(-(np.asarray(log2_c) - x0) / w))


@dataclasses.dataclass
class ScalingFit:
    """Both fitted forms and their leave-one-budget-out errors (mean squared error in log2 n*)."""

    power: dict[str, float]
    sigmoid: dict[str, float]
    loo_power: float
    loo_sigmoid: float

    @property
    def winner(self) -> str:
        return "sigmoid" if self.loo_sigmoid < self.loo_power else "power"


def _fit_power(x, y):
    b, a = np.polyfit(x, y, 1)
    return {"a": float(a), "b": float(b)}


def _fit_sigmoid(x, y, lo, hi_max):
    span = max(float(x.max() - x.min()), 1.0)
    p0 = (float(max(y.max(), lo + 0.1)), float(np.median(x)), span / 4)
    bounds = ([lo, x.min() - span, 0.05 * span], [hi_max, x.max() + span, 4 * span])
    p0 = tuple(float(np.clip(v, lb + 1e-6, ub - 1e-6)) for v, lb, ub in zip(p0, *bounds))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            popt, _ = optimize.curve_fit(lambda c, hi, x0, w: sigmoid_law(c, hi, x0, w, lo), x, y,
                                         p0=p0, bounds=bounds, maxfev=20_000)
        except RuntimeError:
            popt = p0
    return {"hi": float(popt[0]), "x0": float(popt[1]), "w": float(popt[2]), "lo": float(lo)}


def fit_scaling(log2_c: np.ndarray, log2_nstar: np.ndarray, lo: float, hi_max: float
                ) -> ScalingFit:
    """Fits the power law and the saturating sigmoid to log2 n*(C) and compares them.

    Args:
      log2_c: [C] budgets (C >= 3).
      log2_nstar: [C].
      lo: the sigmoid's floor (log2 of the smallest n tried).
      hi_max: upper bound for its ceiling (e.g. log2 of twice the largest n tried).

    Raises:
      ValueError: fewer than 3 budgets or mismatched shapes.
    """
    x = np.asarray(log2_c, np.float64)
    y = np.asarray(log2_nstar, np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size < 3:
        raise ValueError(f"fit_scaling: need >= 3 budgets with matching shapes, got {x.shape}, "
                         f"{y.shape}")
    errs_p, errs_s = [], []
    for j in range(x.size):
        keep = np.arange(x.size) != j
        pp = _fit_power(x[keep], y[keep])
        ps = _fit_sigmoid(x[keep], y[keep], lo, hi_max)
        errs_p.append((power_law(x[j], **pp) - y[j]) ** 2)
        errs_s.append((sigmoid_law(x[j], **ps) - y[j]) ** 2)
    return ScalingFit(_fit_power(x, y), _fit_sigmoid(x, y, lo, hi_max),
                      float(np.mean(errs_p)), float(np.mean(errs_s)))


def saturation_onset(hi: float, x0: float, w: float, lo: float, share: float = 0.9) -> float:
    """log2 C at which the sigmoid :func:`sigmoid_law` has covered ``share`` of its rise from ``lo``
    to ``hi``: x0 + w log(share / (1 - share)) (0 < share < 1).

    Raises:
      ValueError: share outside (0, 1) or w <= 0.
    """
    if not 0 < share < 1 or not w > 0:
        raise ValueError(f"saturation_onset: need 0 < share < 1 and w > 0, got {share}, {w}")
    del hi, lo
    return float(x0 + w * np.log(share / (1 - share)))


@dataclasses.dataclass
class ScalingBootstrap:
    """The two fitted forms of log2 n*(C) under a bootstrap over seeds.

    Attributes:
      loo_diff: [num_boot] leave-one-budget-out MSE of the power law minus that of the sigmoid
        (> 0: the sigmoid predicts held-out budgets better).
      slope: [num_boot] the power law's exponent b (log2 n* = a + b log2 C).
      onset: [num_boot] log2 C where the sigmoid reaches 90% of its rise
        (:func:`saturation_onset`).
      level: central interval mass of :meth:`interval`.
      tol: differences of MSE within ``tol`` (in (log2 n)^2) of 0 are float rounding, not a
        verdict: a bootstrap whose every replicate ties exactly gives such a zero-width interval.
    """

    loo_diff: np.ndarray
    slope: np.ndarray
    onset: np.ndarray
    level: float = 0.9
    tol: float = 1e-9

    def interval(self, name: str) -> tuple[float, float]:
        """The central ``level`` percentile interval of ``loo_diff``, ``slope`` or ``onset``."""
        q = (1 - self.level) / 2
        lo, hi = np.quantile(getattr(self, name), [q, 1 - q])
        return float(lo), float(hi)

    @property
    def decisive(self) -> bool:
        """Whether the interval of ``loo_diff`` excludes 0 by more than ``tol``: one form
        predicts held-out budgets better by more than the bootstrap spread of the comparison."""
        lo, hi = self.interval("loo_diff")
        return lo > self.tol or hi < -self.tol


def bootstrap_scaling(log2_c: np.ndarray, log2_n: np.ndarray, rewards: np.ndarray, num_boot: int,
                      seed: int, lo: float, hi_max: float, level: float = 0.9
                      ) -> ScalingBootstrap:
    """Bootstrap over the replicate runs of the whole n*(C) analysis: n* at every budget, both
    fits, their leave-one-budget-out comparison, the power law's slope and the sigmoid's
    saturation onset.

    A replicate resamples the runs of each n (with replacement; seeds, then streams within each
    seed, :func:`resample_mean`) once and uses that resample at every budget: a run at budget C
    is a prefix of the same run at the largest budget, so a run's rewards across budgets are one
    draw.

    Args:
      log2_c: [C] budgets (C >= 3).
      log2_n: [Q] rollouts per problem (Q >= 1).
      rewards: [C, S, Q] per-seed rewards, or [C, S, T, Q] for S seeds x T rollout streams.
      num_boot: replicates (>= 1).
      seed: NumPy seed of the resampling.
      lo, hi_max: as in :func:`fit_scaling`.
      level: central interval mass.

    Raises:
      ValueError: mismatched shapes, C < 3, num_boot < 1, non-finite rewards.
    """
    x = np.asarray(log2_c, np.float64)
    n = np.asarray(log2_n, np.float64)
    r = np.asarray(rewards, np.float64)
    if r.ndim not in (3, 4) or r.shape[0] != x.size or r.shape[-1] != n.size or x.size < 3:
        raise ValueError(f"bootstrap_scaling: rewards must be [C={x.size} >= 3, S, Q={n.size}] "
                         f"or [C, S, T, Q], got {r.shape}")
    if num_boot < 1 or not np.all(np.isfinite(r)):
        raise ValueError(f"bootstrap_scaling: need num_boot >= 1 and finite rewards, got "
                         f"num_boot={num_boot}")
    rng = np.random.default_rng(seed)
    streams = r.ndim == 4 and r.shape[2] > 1
    r = r if streams else r.reshape(x.size, r.shape[1], n.size)
    s = r.shape[1]
    diff, slope, onset = [], [], []
    for _ in range(num_boot):
        if streams:
            means = resample_mean(rng, r)
        else:  # one stream: the bootstrap over seeds
            idx = rng.integers(0, s, size=(s, n.size))
            means = np.stack([np.take_along_axis(r[j], idx, axis=0).mean(axis=0)
                              for j in range(x.size)])
        y = np.asarray([n_star(n, means[j]) for j in range(x.size)])
        f = fit_scaling(x, y, lo, hi_max)
        diff.append(f.loo_power - f.loo_sigmoid)
        slope.append(f.power["b"])
        onset.append(saturation_onset(**f.sigmoid))
    return ScalingBootstrap(np.asarray(diff), np.asarray(slope), np.asarray(onset), level)
