"""Scores of sample-based probabilistic forecasts: CRPS, CRPS-sum, QICE, interval coverage, MSE/MAE.

All functions take forecast samples ``samples`` f32 [B, S, H, N] and targets ``target`` f32 [B, H, N]
(B windows, S samples, H horizon steps, N channels) on the same scale (the experiments use the
globally standardised scale, as the forecasting literature does). Large test sets are scored in
batches: :func:`metric_sums` returns additive sufficient statistics, :func:`finalize_metrics` turns
their total into the metrics, so a streamed evaluation equals a one-shot one exactly (up to float
summation order).

Conventions:
  * One representation for every method: the functions score S independent draws from each
    method's predictive distribution F, and the benchmark (:mod:`algorithms.forecasting.benchmark`)
    feeds every method that way, the closed-form baselines included (SARIMA draws from its
    predictive normal, seasonal naive resamples its residuals). A deterministic quantile set is not
    scored here: the same estimator gives it a different value than draws of the same F (below),
    so mixing the two puts methods on different footings.
  * CRPS is the *fair* ensemble CRPS (Ferro 2014, "Fair scores for ensemble forecasts", Q. J. R.
    Meteorol. Soc. 140, 1917-1923), the unbiased estimator of
    ``CRPS(F, y) = E|X - y| - 1/2 E|X - X'|`` (Gneiting & Raftery 2007, eq. 21) from S iid draws:

        CRPS_fair = 1/S sum_i |x_i - y| - 1/(2 S (S - 1)) sum_{i != j} |x_i - x_j|.

    The plain ensemble CRPS (``fair=False``; ``properscoring.crps_ensemble``, and the ``CRPS``
    package's first output, which the PPM authors report) divides the pair sum by ``2 S^2``
    instead: it is the CRPS of the S-point empirical distribution and, for iid draws, has
    expectation ``CRPS(F, y) + E|X - X'| / (2 S)``. For a perfect N(0, 1) forecast that is
    ``1 / (S sqrt(pi))`` = 0.0056 too much at S = 100, i.e. 1/S = 1% of the mean CRPS
    ``1/sqrt(pi)`` when y ~ N(0, 1), and the charge grows with the forecast's spread, so it favours
    narrow ensembles. (On the quantile set ``F^-1((i - 1/2)/S)`` the plain form is the right one: it
    is within O(1/S^2) of ``CRPS(F, y)``, and the fair form is then O(1/S) too low.)
    Both are computed after one sort as a sum of non-negative terms (the quantile-score form of
    Laio & Tamea 2007): with ``x_(1) <= ... <= x_(S)`` and ``d_i = x_(i) - y``,

        plain: 2/S^2      sum_i [ d_i (S - i + 1/2)  if d_i > 0,  -d_i (i - 1/2)  else ],
        fair:  2/(S(S-1)) sum_i [ d_i (S - i)        if d_i > 0,  -d_i (i - 1)    else ],

    (from ``sum_{i,j} |x_i - x_j| = 2 sum_i (2i - S - 1) x_(i)`` and ``sum_i (2i - S - 1) = 0``),
    so both are >= 0 exactly in floating point and have no cancellation when the samples sit far
    from zero (the form ``E|X - y| - S^-2 sum_i (2i - S - 1) x_(i)`` loses all digits of the
    spread term at large offsets). The fair CRPS needs S >= 2. Reported as the mean over all B*H*N
    points (as in the PPM authors' evaluation); :func:`metric_sums` also returns the plain one
    (``crps_plain``) for comparison with numbers computed that way.
  * CRPS-sum (``crps_sum``) is the literature's normalised one (Salinas et al. 2019, "High-
    dimensional multivariate forecasting with low-rank Gaussian copula processes", NeurIPS; Rasul
    et al. 2021, TimeGrad, ICML; gluonts' ``MultivariateEvaluator`` with a sum target): the
    CRPS of the channel sum (samples and target summed over N), summed over the B*H points and
    divided by the sum of the channel sum's absolute values,

        CRPS-sum = sum_{b,h} CRPS(F_sum, sum_n y_bhn) / sum_{b,h} |sum_n y_bhn|,

    with the fair CRPS (above) for the numerator where gluonts and CSDI (Tashiro et al. 2021)
    approximate it by the mean weighted quantile loss at the levels 0.05, 0.10, ..., 0.95. It is
    scale-free but undefined (NaN here) when every channel sum is 0, and large when the sums
    are near 0, as on standardised data whose channels cancel. ``crps_sum_raw`` is the
    unnormalised mean over the B*H points of the same CRPS; with N = 1 it equals CRPS.
  * QICE (quantile interval coverage error; Han et al. 2022, CARD) with M bins: the sample
    quantiles ``q_0 <= ... <= q_M`` at levels 0, 1/M, ..., 1 cut the line into M intervals; a target
    y is in interval m (1..M) when exactly m of them are strictly below it. QICE = mean_m
    |r_m - 1/M| where r_m is the fraction of all target points in interval m. The two reference
    codes differ for a target outside the samples' range (y <= min sample, or y > max sample):
      - ``out_of_range="ppm"`` (default; the PPM authors' code, whose numbers we compare with):
        such a target is in no interval; it still counts in the denominator, so the r_m sum to
        less than 1.
      - ``out_of_range="card"`` (the CARD code of Han et al.): it is counted in the first
        (y <= min) or last (y > max) interval, so the r_m sum to 1.
    QICE lies in ``[0, max(1/M, 2(M-1)/M^2)]``. Reported as a percentage in the experiments.
  * Coverage of the central p interval: fraction of points in ``[q_(1-p)/2, q_(1+p)/2]`` (sample
    quantiles with linear interpolation, like ``numpy.quantile``).
  * QICE and coverage of a *perfect* forecast are not exactly 0 and p at finite S. With y and the S
    iid draws exchangeable, y lies below the smallest or above the largest draw with probability
    2/(S+1), and (exactly for a uniform F, closely otherwise) below the interpolated sample quantile
    at virtual index t (0-based) with probability (t+1)/(S+1). So the central p interval covers
    ``p (S-1)/(S+1)`` (0.882 for p = 0.9 at S = 100), each QICE bin holds
    ``(S-1)/(M (S+1))`` of the points under the PPM convention, and QICE tends to ``2/(M (S+1))`` =
    0.20% (``4 (M-2)/(M^2 (S+1))`` = 0.32% under CARD's) at S = 100, M = 10 as the test set grows
    (a finite one adds the bins' sampling noise). The midpoint quantile set of the same F gives
    about 0.891, 0.099 and 0.10%: another reason for one representation.
  * MSE and MAE are those of the sample mean (float32: squared errors overflow beyond ~1e19). For
    iid draws the sample mean's MSE exceeds that of the predictive mean by the predictive variance
    over S on average (1% of it at S = 100), as in the PPM authors' evaluation.

Bad values. Shapes are static and checked everywhere (ValueError, also under ``jit``), including
empty axes (B, S, H or N of size 0), which would otherwise give all-NaN metrics. Values are checked
by the host entry point :func:`evaluate` (ValueError naming ``samples`` or ``target`` and the first
non-finite index). The array functions (:func:`metric_sums`, :func:`crps_ensemble`,
:func:`qice_bin_counts`), which run under ``jit`` where a check would cost a device round trip,
instead return NaN in every output that depends on a NaN or infinite sample or target: the CRPS of
that point, and every value-dependent sum of a batch that contains one (CRPS, CRPS-sum, squared
and absolute errors, coverage counts and all QICE bin counts); the point counts stay exact.
:func:`finalize_metrics` then gives NaN for every metric but never a plausible finite number.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

QICE_BINS = 10
COVERAGE_LEVELS = (0.5, 0.9)
OUT_OF_RANGE = ("ppm", "card")


def _check(samples: jax.Array, target: jax.Array) -> None:
    if samples.ndim != 4 or target.ndim != 3 or samples.shape[:1] + samples.shape[2:] != target.shape:
        raise ValueError(
            f"expected samples [B, S, H, N] and target [B, H, N], got {samples.shape} and {target.shape}")
    if 0 in samples.shape:
        raise ValueError(f"empty batch: samples has shape {samples.shape} (B, S, H, N); every axis "
                         "needs at least one entry (an empty batch has no metrics)")


def _check_bins(num_bins, out_of_range: str) -> None:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ValueError(f"num_bins must be an integer >= 1, got {num_bins!r}")
    if out_of_range not in OUT_OF_RANGE:
        raise ValueError(f"out_of_range must be one of {OUT_OF_RANGE}, got {out_of_range!r}")


def _bad_points(xs: jax.Array, target: jax.Array) -> jax.Array:
    """bool with ``target``'s shape: the target or any of its samples (last axis) is not finite."""
    return ~jnp.isfinite(target) | jnp.any(~jnp.isfinite(xs), axis=-1)


def _check_fair(num_samples: int, fair: bool) -> None:
    if fair and num_samples < 2:
        raise ValueError(f"the fair CRPS needs at least 2 samples per point, got S = {num_samples}; "
                         "pass fair=False for the CRPS of a single-member ensemble, |x - y|")


def _crps_sorted(xs: jax.Array, target: jax.Array, fair: bool) -> jax.Array:
    """CRPS from samples sorted ascending along the last axis (quantile-score form, module doc),
    fair (``fair=True``, S >= 2) or plain. NaN where the target or a sample is not finite."""
    s = xs.shape[-1]
    i = jnp.arange(s, dtype=xs.dtype)                                    # 0-based rank
    d = xs - target[..., None]
    # Weights of |d| above / below the target (0-based i), both in [0, 1], so no term exceeds
    # |x - y| and the sum cannot overflow where the differences do not:
    #   plain (S - i - 1/2)/S and (i + 1/2)/S;  fair (S - 1 - i)/(S - 1) and i/(S - 1).
    if fair:
        above, below = (s - 1 - i) / (s - 1), i / (s - 1)
    else:
        above, below = (s - i - 0.5) / s, (i + 0.5) / s
    terms = jnp.where(d > 0, d * above, -d * below)
    crps = jnp.sum(terms, axis=-1) * (2.0 / s)
    return jnp.where(_bad_points(xs, target), jnp.nan, crps)


def _quantiles_sorted(xs: jax.Array, levels) -> jax.Array:
    """Sample quantiles [..., Q] at ``levels`` from samples sorted along the last axis, with the
    linear interpolation of ``numpy.quantile`` (virtual index ``level * (S - 1)``)."""
    m = xs.shape[-1]
    pos = jnp.asarray(levels, xs.dtype) * (m - 1)
    lo = jnp.clip(jnp.floor(pos).astype(jnp.int32), 0, m - 1)
    hi = jnp.minimum(lo + 1, m - 1)
    frac = pos - lo.astype(xs.dtype)
    return xs[..., lo] * (1.0 - frac) + xs[..., hi] * frac


def crps_ensemble(samples: jax.Array, target: jax.Array, axis: int = -1, *,
                  fair: bool = True) -> jax.Array:
    """Ensemble CRPS of each target point from S draws (module doc).

    ``fair=True`` (default; Ferro 2014): ``1/S sum_i |x_i - y| - 1/(2S(S-1)) sum_{i!=j} |x_i - x_j|``,
    unbiased for ``CRPS(F, y)`` when the x_i are iid draws from F. ``fair=False``: the pair sum
    over ``2 S^2``, the CRPS of the empirical distribution (equals ``properscoring.crps_ensemble``),
    whose expectation for iid draws exceeds ``CRPS(F, y)`` by ``E|X - X'| / (2S)``.

    Args:
      samples: f32 [..., S, ...], the draws along ``axis``; S >= 2 for the fair CRPS, >= 1 else.
      target: f32 with the shape of ``samples`` without ``axis``.
      axis: the sample axis of ``samples``.
      fair: the estimator (keyword only).

    Returns:
      f32 with ``target``'s shape, >= 0, in the units of the data; NaN where the target or one of
      its samples is NaN or infinite (traceable: no host check of values).

    Raises:
      ValueError: shapes do not match, no samples, or one sample with ``fair=True``.
    """
    x = jnp.moveaxis(jnp.asarray(samples), axis, -1)
    target = jnp.asarray(target)
    if x.shape[:-1] != target.shape:
        raise ValueError(f"samples {samples.shape} (sample axis {axis}) do not match target {target.shape}")
    if x.shape[-1] < 1:
        raise ValueError(f"samples has no draws along axis {axis} (shape {samples.shape})")
    _check_fair(x.shape[-1], fair)
    return _crps_sorted(jnp.sort(x, axis=-1), target, bool(fair))


def _qice_counts_sorted(xs: jax.Array, target: jax.Array, num_bins: int, out_of_range: str
                        ) -> jax.Array:
    q = _quantiles_sorted(xs, jnp.linspace(0.0, 1.0, num_bins + 1))      # [..., M+1]
    membership = jnp.sum(target[..., None] > q, axis=-1)               # 0..M+1; 1..M are the bins
    if out_of_range == "card":
        membership = jnp.clip(membership, 1, num_bins)
    hits = membership[..., None] == jnp.arange(1, num_bins + 1)
    counts = jnp.sum(hits.reshape(-1, num_bins), axis=0).astype(jnp.float32)
    return jnp.where(jnp.any(_bad_points(xs, target)), jnp.nan, counts)


def qice_bin_counts(samples: jax.Array, target: jax.Array, num_bins: int = QICE_BINS,
                    out_of_range: str = "ppm") -> jax.Array:
    """Number of target points in each of the ``num_bins`` sample-quantile intervals.

    Args:
      samples: f32 [B, S, H, N]; target: f32 [B, H, N].
      num_bins: M >= 1.
      out_of_range: ``"ppm"`` (a target at or below the smallest sample or above the largest is in
        no bin; the PPM reference code) or ``"card"`` (it is counted in the first or last bin; the
        CARD reference code). See the module docstring.

    Returns:
      f32 [num_bins]; all NaN if any sample or target is NaN or infinite.

    Raises:
      ValueError: bad shapes, an empty axis, ``num_bins < 1`` or an unknown ``out_of_range``.
    """
    _check(samples, target)
    _check_bins(num_bins, out_of_range)
    xs = jnp.sort(jnp.moveaxis(samples, 1, -1), axis=-1)
    return _qice_counts_sorted(xs, target, int(num_bins), out_of_range)


def qice_from_counts(counts: jax.Array, num_points: jax.Array | float) -> jax.Array:
    """QICE = mean_m |counts_m / num_points - 1/M| (a fraction; multiply by 100 for percent).

    Args:
      counts: f32 [..., M] bin counts (:func:`qice_bin_counts`); num_points: the number of target
        points they were counted from (including those in no bin), > 0.

    Raises:
      ValueError: a concrete ``num_points`` that is not > 0.
    """
    if not isinstance(num_points, jax.core.Tracer) and not np.all(np.asarray(num_points) > 0):
        raise ValueError(f"num_points must be > 0, got {num_points}")
    m = counts.shape[-1]
    return jnp.mean(jnp.abs(counts / num_points - 1.0 / m), axis=-1)


@functools.partial(jax.jit, static_argnames=("num_bins", "out_of_range"))
def metric_sums(samples: jax.Array, target: jax.Array, num_bins: int = QICE_BINS,
                out_of_range: str = "ppm") -> dict[str, jax.Array]:
    """Additive statistics of one batch of forecasts (sum them over batches, then
    :func:`finalize_metrics`).

    Args:
      samples: f32 [B, S, H, N] forecast draws; target: f32 [B, H, N]; every axis non-empty.
      num_bins: M, QICE bins (static). out_of_range: QICE convention (static; see
        :func:`qice_bin_counts`).

    Returns:
      dict of f32 scalars (and ``qice_counts`` [num_bins]): ``points`` (B*H*N), ``sum_points``
      (B*H), ``crps`` (fair), ``crps_plain``, ``crps_sum`` (fair CRPS of the channel sum),
      ``sum_abs`` (|channel sum of the target|), ``se``, ``ae``, ``covered_50``, ``covered_90``
      (sums over the batch), and ``qice_counts``. Jitted, so values are not checked: if any sample or target is NaN or
      infinite, every entry except ``points`` and ``sum_points`` is NaN.

    Raises:
      ValueError: shapes are not [B, S, H, N] and [B, H, N], an axis is empty, S < 2 (the fair
        CRPS), bad ``num_bins`` or ``out_of_range`` (raised while tracing).
    """
    _check(samples, target)
    _check_fair(samples.shape[1], True)
    _check_bins(num_bins, out_of_range)
    target = target.astype(jnp.float32)
    samples = samples.astype(jnp.float32)
    xs = jnp.sort(jnp.moveaxis(samples, 1, -1), axis=-1)   # [B, H, N, S], one sort
    any_bad = jnp.any(_bad_points(xs, target))

    def value_sum(v):
        return jnp.where(any_bad, jnp.nan, jnp.sum(v).astype(jnp.float32))

    mean = jnp.mean(xs, axis=-1)
    out = {
        "points": jnp.asarray(target.size, jnp.float32),
        "sum_points": jnp.asarray(target.shape[0] * target.shape[1], jnp.float32),
        "crps": value_sum(_crps_sorted(xs, target, fair=True)),
        "crps_plain": value_sum(_crps_sorted(xs, target, fair=False)),
        "crps_sum": value_sum(crps_ensemble(samples.sum(-1), target.sum(-1), axis=1, fair=True)),
        "sum_abs": value_sum(jnp.abs(target.sum(-1))),
        "se": value_sum((mean - target) ** 2),
        "ae": value_sum(jnp.abs(mean - target)),
        "qice_counts": _qice_counts_sorted(xs, target, num_bins, out_of_range),
    }
    for p in COVERAGE_LEVELS:
        q = _quantiles_sorted(xs, [(1 - p) / 2, (1 + p) / 2])
        inside = (target >= q[..., 0]) & (target <= q[..., 1])
        out[f"covered_{round(100 * p)}"] = value_sum(inside)
    return out


def add_sums(a: dict | None, b: dict) -> dict:
    """Elementwise sum of two :func:`metric_sums` results (``a`` may be ``None``)."""
    return b if a is None else jax.tree.map(jnp.add, a, b)


def finalize_metrics(sums: dict) -> dict[str, float]:
    """Metrics from summed statistics: ``crps`` (fair), ``crps_plain``, ``crps_sum`` (normalised,
    the literature's; NaN when every channel sum of the target is 0), ``crps_sum_raw``
    (unnormalised; module docstring), ``qice`` (fraction), ``mse``, ``mae``, ``coverage_50``,
    ``coverage_90`` as Python floats; NaN where the sums are NaN (a batch held a non-finite
    sample or target, see :func:`metric_sums`).

    Raises:
      ValueError: ``sums`` lacks a statistic or counts no points.
    """
    need = ("points", "sum_points", "crps", "crps_plain", "crps_sum", "sum_abs", "se", "ae",
            "qice_counts") + tuple(
        f"covered_{round(100 * p)}" for p in COVERAGE_LEVELS)
    missing = [k for k in need if k not in sums]
    if missing:
        raise ValueError(f"sums lacks {missing}; pass the (summed) output of metric_sums")
    n = sums["points"]
    if not float(n) > 0:
        raise ValueError(f"sums['points'] is {float(n)}: no target points were scored")
    out = {
        "crps": sums["crps"] / n,
        "crps_plain": sums["crps_plain"] / n,
        "crps_sum": sums["crps_sum"] / sums["sum_abs"] if float(sums["sum_abs"]) != 0 else
        jnp.nan,
        "crps_sum_raw": sums["crps_sum"] / sums["sum_points"],
        "qice": qice_from_counts(sums["qice_counts"], n),
        "mse": sums["se"] / n,
        "mae": sums["ae"] / n,
    }
    for p in COVERAGE_LEVELS:
        out[f"coverage_{round(100 * p)}"] = sums[f"covered_{round(100 * p)}"] / n
    return {k: float(v) for k, v in out.items()}


def _first_non_finite(x: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} has {int(bad.sum())} NaN or infinite value(s), the first at index "
                         f"{idx} ({x[idx]}); every metric would depend on it")


def evaluate(samples: jax.Array, target: jax.Array, num_bins: int = QICE_BINS,
             out_of_range: str = "ppm") -> dict[str, float]:
    """All metrics of one set of forecasts: ``finalize_metrics(metric_sums(samples, target))``.

    Args:
      samples: [B, S, H, N]; target: [B, H, N] (any real dtype; scored in float32).
      num_bins, out_of_range: as in :func:`metric_sums`.

    Raises:
      ValueError: bad shapes, an empty axis or S < 2; a NaN or infinite value in ``samples`` or
        ``target`` (the message names the array and the first bad index).
    """
    samples, target = jnp.asarray(samples), jnp.asarray(target)
    _check(samples, target)
    _first_non_finite(np.asarray(samples, np.float32), "samples")
    _first_non_finite(np.asarray(target, np.float32), "target")
    return finalize_metrics(metric_sums(samples, target, num_bins, out_of_range))
