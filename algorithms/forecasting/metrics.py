"""Scores of sample-based probabilistic forecasts: CRPS, CRPS-sum, QICE, interval coverage, MSE/MAE.

All functions take forecast samples ``samples`` f32 [B, S, H, N] and targets ``target`` f32 [B, H, N]
(B windows, S samples, H horizon steps, N channels) on the same scale (the experiments use the
globally standardised scale, as the forecasting literature does). Large test sets are scored in
batches: :func:`metric_sums` returns additive sufficient statistics, :func:`finalize_metrics` turns
their total into the metrics, so a streamed evaluation equals a one-shot one exactly (up to float
summation order).

Conventions:
  * CRPS is the ensemble estimator ``CRPS(F_S, y) = E|X - y| - 1/2 E|X - X'|`` with X, X'
    independent draws from the S-sample empirical distribution (pairs with X = X' included, i.e. the
    1/S^2 normalisation; Gneiting & Raftery 2007, eq. 21; ``properscoring.crps_ensemble``), computed
    in O(S log S) by sorting: ``1/2 E|X - X'| = S^-2 sum_i (2i - S - 1) x_(i)``. Reported as the
    mean over all B*H*N points (as in the PPM authors' evaluation).
  * CRPS-sum is the CRPS of the channel sum (samples and target summed over N), averaged over the
    B*H points; it is not normalised by the target's magnitude. With N = 1 it equals CRPS.
  * QICE (quantile interval coverage error; Han et al. 2022, CARD) with M bins: the sample
    quantiles at levels 0, 1/M, ..., 1 cut the line into M intervals; QICE = mean_m |r_m - 1/M|
    where r_m is the fraction of target points falling in interval m. A target below the smallest
    or above the largest sample falls in no interval (it still counts in the denominator), which is
    the convention of the CARD and PPM reference code. Reported as a percentage in the experiments.
  * Coverage of the central p interval: fraction of points in ``[q_(1-p)/2, q_(1+p)/2]`` (sample
    quantiles with linear interpolation, like ``numpy.quantile``).
  * MSE and MAE are those of the sample mean.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

QICE_BINS = 10
COVERAGE_LEVELS = (0.5, 0.9)


def _check(samples: jax.Array, target: jax.Array) -> None:
    if samples.ndim != 4 or target.ndim != 3 or samples.shape[:1] + samples.shape[2:] != target.shape:
        raise ValueError(
            f"expected samples [B, S, H, N] and target [B, H, N], got {samples.shape} and {target.shape}")
    if samples.shape[1] < 1:
        raise ValueError("need at least one sample per window")


def _crps_sorted(xs: jax.Array, target: jax.Array) -> jax.Array:
    """CRPS from samples already sorted ascending along the last axis."""
    m = xs.shape[-1]
    skill = jnp.mean(jnp.abs(xs - target[..., None]), axis=-1)
    weights = (2.0 * jnp.arange(1, m + 1, dtype=xs.dtype) - m - 1.0) / (m * m)
    return skill - jnp.sum(xs * weights, axis=-1)


def _quantiles_sorted(xs: jax.Array, levels) -> jax.Array:
    """Sample quantiles [..., Q] at ``levels`` from samples sorted along the last axis, with the
    linear interpolation of ``numpy.quantile`` (virtual index ``level * (S - 1)``)."""
    m = xs.shape[-1]
    pos = jnp.asarray(levels, xs.dtype) * (m - 1)
    lo = jnp.clip(jnp.floor(pos).astype(jnp.int32), 0, m - 1)
    hi = jnp.minimum(lo + 1, m - 1)
    frac = pos - lo.astype(xs.dtype)
    return xs[..., lo] * (1.0 - frac) + xs[..., hi] * frac


def crps_ensemble(samples: jax.Array, target: jax.Array, axis: int = -1) -> jax.Array:
    """Ensemble CRPS of each target point (sort-based; equals ``properscoring.crps_ensemble``).

    Args:
      samples: f32 [..., S, ...], the S draws along ``axis``.
      target: f32 with the shape of ``samples`` without ``axis``.
      axis: the sample axis of ``samples``.

    Returns:
      f32 with ``target``'s shape: ``mean_i |x_i - y| - S^-2 sum_i (2i - S - 1) x_(i)`` (>= 0), in
      the units of the data.
    """
    x = jnp.moveaxis(samples, axis, -1)
    if x.shape[:-1] != target.shape:
        raise ValueError(f"samples {samples.shape} (sample axis {axis}) do not match target {target.shape}")
    return _crps_sorted(jnp.sort(x, axis=-1), target)


def _qice_counts_sorted(xs: jax.Array, target: jax.Array, num_bins: int) -> jax.Array:
    q = _quantiles_sorted(xs, jnp.linspace(0.0, 1.0, num_bins + 1))      # [..., M+1]
    membership = jnp.sum(target[..., None] > q, axis=-1)               # 0..M+1; 1..M are the bins
    hits = membership[..., None] == jnp.arange(1, num_bins + 1)
    return jnp.sum(hits.reshape(-1, num_bins), axis=0).astype(jnp.float32)


def qice_bin_counts(samples: jax.Array, target: jax.Array, num_bins: int = QICE_BINS) -> jax.Array:
    """Number of target points in each of the ``num_bins`` sample-quantile intervals.

    Args:
      samples: f32 [B, S, H, N]; target: f32 [B, H, N].

    Returns:
      f32 [num_bins]; targets outside [min sample, max sample] are in no bin (see module docstring).
    """
    xs = jnp.sort(jnp.moveaxis(samples, 1, -1), axis=-1)
    return _qice_counts_sorted(xs, target, num_bins)


def qice_from_counts(counts: jax.Array, num_points: jax.Array | float) -> jax.Array:
    """QICE = mean_m |counts_m / num_points - 1/M| (a fraction; multiply by 100 for percent)."""
    m = counts.shape[-1]
    return jnp.mean(jnp.abs(counts / num_points - 1.0 / m), axis=-1)


@functools.partial(jax.jit, static_argnames=("num_bins",))
def metric_sums(samples: jax.Array, target: jax.Array, num_bins: int = QICE_BINS) -> dict[str, jax.Array]:
    """Additive statistics of one batch of forecasts (sum them over batches, then
    :func:`finalize_metrics`).

    Args:
      samples: f32 [B, S, H, N] forecast draws; target: f32 [B, H, N].

    Returns:
      dict of f32 scalars (and ``qice_counts`` [num_bins]): ``points`` (B*H*N), ``sum_points``
      (B*H), ``crps``, ``crps_sum``, ``se``, ``ae``, ``covered_50``, ``covered_90`` (sums), and
      ``qice_counts``.

    Raises:
      ValueError: shapes are not [B, S, H, N] and [B, H, N].
    """
    _check(samples, target)
    target = target.astype(jnp.float32)
    xs = jnp.sort(jnp.moveaxis(samples.astype(jnp.float32), 1, -1), axis=-1)   # [B, H, N, S], one sort
    mean = jnp.mean(xs, axis=-1)
    out = {
        "points": jnp.asarray(target.size, jnp.float32),
        "sum_points": jnp.asarray(target.shape[0] * target.shape[1], jnp.float32),
        "crps": jnp.sum(_crps_sorted(xs, target)),
        "crps_sum": jnp.sum(crps_ensemble(samples.astype(jnp.float32).sum(-1), target.sum(-1), axis=1)),
        "se": jnp.sum((mean - target) ** 2),
        "ae": jnp.sum(jnp.abs(mean - target)),
        "qice_counts": _qice_counts_sorted(xs, target, num_bins),
    }
    for p in COVERAGE_LEVELS:
        q = _quantiles_sorted(xs, [(1 - p) / 2, (1 + p) / 2])
        inside = (target >= q[..., 0]) & (target <= q[..., 1])
        out[f"covered_{round(100 * p)}"] = jnp.sum(inside).astype(jnp.float32)
    return out


def add_sums(a: dict | None, b: dict) -> dict:
    """Elementwise sum of two :func:`metric_sums` results (``a`` may be ``None``)."""
    return b if a is None else jax.tree.map(jnp.add, a, b)


def finalize_metrics(sums: dict) -> dict[str, float]:
    """Metrics from summed statistics: ``crps``, ``crps_sum``, ``qice`` (fraction), ``mse``, ``mae``,
    ``coverage_50``, ``coverage_90`` as Python floats."""
    n = sums["points"]
    out = {
        "crps": sums["crps"] / n,
        "crps_sum": sums["crps_sum"] / sums["sum_points"],
        "qice": qice_from_counts(sums["qice_counts"], n),
        "mse": sums["se"] / n,
        "mae": sums["ae"] / n,
    }
    for p in COVERAGE_LEVELS:
        out[f"coverage_{round(100 * p)}"] = sums[f"covered_{round(100 * p)}"] / n
    return {k: float(v) for k, v in out.items()}


def evaluate(samples: jax.Array, target: jax.Array, num_bins: int = QICE_BINS) -> dict[str, float]:
    """All metrics of one set of forecasts: ``finalize_metrics(metric_sums(samples, target))``."""
    return finalize_metrics(metric_sums(samples, target, num_bins))
