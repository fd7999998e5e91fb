"""IsoFLOP scaling-law fits (Hoffmann et al. 2022, "Chinchilla", Approach 2; as used by Sahoo et
al. 2026, Sec. 4).

Dimensions: S model sizes per budget, C compute budgets, W held-out windows, R bootstrap
replicates.

For each compute budget C (FLOPs, ``C = 3 F_fwd tokens``) the losses of S model sizes N (parameters)
are fitted by a parabola in ``log N``; its vertex gives the compute-optimal size ``N*(C)`` and loss
``L*(C)``. Across budgets, ``N*(C) = k C^a`` and ``L*(C) = A C^-b`` are fitted by least squares in
log-log space. A budget whose measured loss is lowest at the smallest or largest size (or whose
parabola has no interior minimum) does not locate ``N*(C)``: the grid does not bracket the optimum,
so the fit refuses the size exponent (``exponent`` NaN, ``resolved`` False) instead of fitting a
power law to grid edges. Two loss frontiers give the compute ratio at equal loss: the ``C'`` at which family 1
reaches family 2's ``L*(C)``, ``C' / C = (A_1 / L*_2(C))^(1/b_1) / C``. Uncertainty comes from a
paired bootstrap over held-out windows (:func:`paired_bootstrap_ratio`: every cell of both grids
evaluated on the same windows, resampled jointly) or, without per-window losses, a parametric one
that perturbs every measured loss independently by its standard error (:func:`bootstrap_ratio`;
it ignores the pairing, so its interval is too wide when the two grids share their noise).

Pure NumPy (host-side analysis of a few dozen numbers); no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class IsoFlopFit:
    """Result of :func:`fit_isoflop`.

    Attributes:
      budgets: [C] FLOPs.
      n_opt: [C] compute-optimal parameter counts (parabola vertices, clipped to the sampled range).
      loss_opt: [C] losses at the vertices.
      concave: [C] bool, True where the parabola opened downward (vertex replaced by the best
        measured size).
      at_edge: [C] bool, True where the budget's optimum is not bracketed by the size grid: the
        lowest measured loss is at the smallest or largest size, the parabola is concave, or its
        vertex was clipped to the sampled range.
      exponent: a in ``N* = k C^a``; NaN unless every budget's optimum is bracketed
        (``resolved``): a minimum at the edge of the grid is not a minimum.
      coef: k (NaN with ``exponent``).
      loss_exponent: b in ``L* = A C^-b``.
      loss_coef: A.
    """

    budgets: np.ndarray
    n_opt: np.ndarray
    loss_opt: np.ndarray
    concave: np.ndarray
    at_edge: np.ndarray
    exponent: float
    coef: float
    loss_exponent: float
    loss_coef: float

    @property
    def resolved(self) -> bool:
        """True when the size grid brackets the optimum at every budget (``exponent`` is finite)."""
        return not bool(np.any(self.at_edge))

    def loss_at(self, c: np.ndarray | float) -> np.ndarray:
        """Frontier loss ``A C^-b``."""
        return self.loss_coef * np.asarray(c, np.float64) ** (-self.loss_exponent)

    def compute_for_loss(self, loss: np.ndarray | float) -> np.ndarray:
        """Inverse of :meth:`loss_at`: the FLOPs at which the frontier reaches ``loss``."""
        return (self.loss_coef / np.asarray(loss, np.float64)) ** (1.0 / self.loss_exponent)


def parabola_vertex(log_n: np.ndarray, loss: np.ndarray) -> tuple[float, float, bool]:
    """Least-squares ``loss = a x^2 + b x + c`` in ``x = log N``; returns (x*, loss(x*), concave).

    The vertex is clipped to the sampled range; a concave fit (a <= 0) returns the best measured
    point and ``concave = True``.

    Raises:
      ValueError: fewer than 3 points or mismatched shapes.
    """
    log_n, loss = np.asarray(log_n, np.float64), np.asarray(loss, np.float64)
    if log_n.shape != loss.shape or log_n.ndim != 1 or log_n.size < 3:
        raise ValueError(f"parabola_vertex: need >= 3 matching points, got shapes {log_n.shape}, "
                         f"{loss.shape}")
    a, b, c = np.polyfit(log_n, loss, 2)
    if a <= 0:
        i = int(np.argmin(loss))
        return float(log_n[i]), float(loss[i]), True
    x = float(np.clip(-b / (2 * a), log_n.min(), log_n.max()))
    return x, float(a * x * x + b * x + c), False


def power_law(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares fit ``y = k x^a`` in log-log space; returns (a, k).

    Raises:
      ValueError: fewer than 2 points or non-positive values.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.size < 2 or x.shape != y.shape or np.any(x <= 0) or np.any(y <= 0):
        raise ValueError(f"power_law: need >= 2 matching positive points, got {x}, {y}")
    a, logk = np.polyfit(np.log(x), np.log(y), 1)
    return float(a), float(np.exp(logk))


def fit_isoflop(budgets: Sequence[float], sizes: np.ndarray, losses: np.ndarray) -> IsoFlopFit:
    """Chinchilla Approach 2 on a grid.

    Args:
      budgets: [C] FLOPs.
      sizes: [S] parameter counts (the same sizes at every budget) or [C, S].
      losses: [C, S] validation losses (e.g. NELBO in nats per token).

    Returns:
      An :class:`IsoFlopFit`. The loss frontier ``L* = A C^-b`` is always fitted (at a budget whose
      optimum is not bracketed, ``L*`` is the parabola at the grid's edge, or the best measured
      loss if concave: an upper bound on the optimum); the size exponent ``a`` and ``k`` only when
      every budget's optimum is bracketed, else NaN.

    Raises:
      ValueError: shapes disagree, fewer than 2 budgets or 3 sizes.
    """
    budgets = np.asarray(budgets, np.float64)
    losses = np.asarray(losses, np.float64)
    sizes = np.broadcast_to(np.asarray(sizes, np.float64), losses.shape)
    if losses.ndim != 2 or losses.shape[0] != budgets.size or budgets.size < 2:
        raise ValueError(f"fit_isoflop: losses {losses.shape} must be [C>=2, S>=3] with C = "
                         f"{budgets.size} budgets")
    verts = [parabola_vertex(np.log(sizes[k]), losses[k]) for k in range(budgets.size)]
    n_opt = np.exp([v[0] for v in verts])
    loss_opt = np.array([v[1] for v in verts])
    concave = np.array([v[2] for v in verts])
    best = sizes[np.arange(budgets.size), np.argmin(losses, axis=1)]  # sizes need not be sorted
    lo, hi = sizes.min(axis=1), sizes.max(axis=1)
    clipped = (n_opt <= lo * (1 + 1e-9)) | (n_opt >= hi * (1 - 1e-9))
    at_edge = concave | clipped | (best == lo) | (best == hi)
    a, k = power_law(budgets, n_opt) if not at_edge.any() else (float("nan"), float("nan"))
    neg_b, big_a = power_law(budgets, loss_opt)
    return IsoFlopFit(budgets, n_opt, loss_opt, concave, at_edge, a, k, -neg_b, big_a)


def matched_compute_ratio(fit_1: IsoFlopFit, fit_2: IsoFlopFit, budgets: np.ndarray | None = None
                          ) -> float:
    """``C_1 / C_2`` at equal frontier loss, geometric mean over ``budgets`` (default: fit_2's):
    < 1 means family 1 needs fewer FLOPs than family 2 for the same loss."""
    c2 = fit_2.budgets if budgets is None else np.asarray(budgets, np.float64)
    c1 = fit_1.compute_for_loss(fit_2.loss_at(c2))
    return float(np.exp(np.mean(np.log(c1 / c2))))


def bootstrap_ratio(budgets: Sequence[float], sizes: np.ndarray, losses_1: np.ndarray,
                    se_1: np.ndarray, losses_2: np.ndarray, se_2: np.ndarray, *,
                    num_samples: int = 1000, seed: int = 0) -> dict[str, float]:
    """:func:`matched_compute_ratio` with a parametric bootstrap over the measured losses.

    Each replicate adds independent Gaussian noise with the given standard errors ([C, S] each) to
    both loss grids and refits everything. Returns ``ratio`` (point estimate), ``median``, ``lo``
    and ``hi`` (16th / 84th percentiles: a 68% interval) and ``std`` of the replicates.
    """
    rng = np.random.default_rng(seed)
    point = matched_compute_ratio(fit_isoflop(budgets, sizes, losses_1),
                                  fit_isoflop(budgets, sizes, losses_2))
    reps = []
    for _ in range(num_samples):
        l1 = losses_1 + rng.standard_normal(np.shape(losses_1)) * se_1
        l2 = losses_2 + rng.standard_normal(np.shape(losses_2)) * se_2
        try:
            r = matched_compute_ratio(fit_isoflop(budgets, sizes, l1),
                                      fit_isoflop(budgets, sizes, l2))
        except (ValueError, FloatingPointError):
            continue
        if np.isfinite(r):
            reps.append(r)
    reps = np.asarray(reps)
    return {"ratio": point, "median": float(np.median(reps)),
            "lo": float(np.percentile(reps, 16)), "hi": float(np.percentile(reps, 84)),
            "std": float(np.std(reps)), "replicates": int(reps.size)}


def paired_bootstrap_ratio(budgets: Sequence[float], sizes: np.ndarray, windows_1: np.ndarray,
                           windows_2: np.ndarray, *, num_samples: int = 1000, seed: int = 0
                           ) -> dict[str, float]:
    """:func:`matched_compute_ratio` with a nonparametric bootstrap over held-out windows that
    keeps the pairing: each replicate draws W window indices with replacement once and uses them
    for every (budget, size) cell of both families, so the noise the families share (the same
    windows, times and masks) cancels as it does in the point estimate.

    Args:
      budgets: [C] FLOPs.
      sizes: [S] parameter counts.
      windows_1, windows_2: [C, S, W] per-window losses of the two families, every cell on the
        same W windows (in the same order) with the same draws.

    Returns:
      ``ratio`` (the point estimate on the window means), ``median``, ``lo`` / ``hi`` (16th /
      84th percentiles: 68%), ``lo95`` / ``hi95`` (2.5th / 97.5th), ``std``, ``replicates``
      (those whose fits succeeded).

    Raises:
      ValueError: the window arrays are not [C, S, W] of one shape with W >= 2.
    """
    w1, w2 = np.asarray(windows_1, np.float64), np.asarray(windows_2, np.float64)
    if w1.shape != w2.shape or w1.ndim != 3 or w1.shape[-1] < 2:
        raise ValueError(f"paired_bootstrap_ratio: need two [C, S, W >= 2] arrays of one shape, "
                         f"got {w1.shape} and {w2.shape}")
    rng = np.random.default_rng(seed)
    point = matched_compute_ratio(fit_isoflop(budgets, sizes, w1.mean(-1)),
                                  fit_isoflop(budgets, sizes, w2.mean(-1)))
    n = w1.shape[-1]
    reps = []
    for _ in range(num_samples):
        idx = rng.integers(0, n, n)
        try:
            r = matched_compute_ratio(fit_isoflop(budgets, sizes, w1[..., idx].mean(-1)),
                                      fit_isoflop(budgets, sizes, w2[..., idx].mean(-1)))
        except (ValueError, FloatingPointError):
            continue
        if np.isfinite(r):
            reps.append(r)
    reps = np.asarray(reps)
    if reps.size == 0:
        nan = float("nan")
        return {"ratio": point, "median": nan, "lo": nan, "hi": nan, "lo95": nan, "hi95": nan,
                "std": nan, "replicates": 0}
    lo, hi, lo95, hi95 = np.percentile(reps, [16, 84, 2.5, 97.5])
    return {"ratio": point, "median": float(np.median(reps)), "lo": float(lo), "hi": float(hi),
            "lo95": float(lo95), "hi95": float(hi95), "std": float(np.std(reps)),
            "replicates": int(reps.size)}
