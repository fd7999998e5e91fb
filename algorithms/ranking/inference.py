"""Asymptotic inference for the judge-aware BTL fit: covariances, intervals, ranks, bootstrap.

Dimension legend: N models, J judges, D = N + J + 1 full parameters ``x = [s, alpha, tau]``,
P reduced parameters, R posterior draws, B bootstrap replicates, M table rows.

The MLE is consistent and asymptotically normal (Xu et al., 2026, Section 4; the theorem on the
asymptotic distribution of the normalised estimator, whose covariance is the inverse of the
expected (Fisher) information). In the reduced coordinates ``x = B theta`` (``B`` with orthonormal
zero-sum blocks, :func:`algorithms.ranking.btl.reduced_basis`) the information ``I = B^T F B`` is
non-singular, so

    Cov(theta) ~= I^{-1},        Cov(x) = B I^{-1} B^T                       (Fisher)
    Cov(theta) ~= I^{-1} S I^{-1}, S = sum_c score_c score_c^T               (sandwich, robust)

Two conventions for ``F`` (``information=``): ``"expected"`` (default, as in the paper), the
expected information at the estimate, :func:`algorithms.ranking.btl.expected_information`
(``p (1 - p)`` times the outer product of the gradient of the logit ``gamma_k (s_i - s_j)`` per
comparison), or ``"observed"``, the Hessian ``H`` of the negative log-likelihood at the estimate.
They coincide for plain BTL (canonical logit link); in the judge-aware model they differ by
``sum_rows (total p - wins) hess d``, which is zero in expectation only. ``Cov(x)`` is singular (rank
P) because of the normalisation; variances of contrasts such as ``s_i - s_j`` are read off directly.
For a MAP fit (ridge > 0) both add the prior's curvature (the Laplace approximation).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.stats import norm

from algorithms.ranking.btl import (
    FitConfig,
    Params,
    derivatives,
    expected_information,
    flatten,
    mle_exists,
    reduced_basis,
    score_outer,
    solve,
)
from algorithms.ranking.data import ComparisonTable

COVARIANCES = ("fisher", "sandwich")
INFORMATION = ("expected", "observed")


def covariance(table: ComparisonTable, params: Params, config: FitConfig, kind: str = "fisher",
               information: str | None = None) -> jax.Array:
    """Asymptotic covariance of ``x = [s, alpha, tau]`` at the fitted ``params``, float [D, D].

    Args:
      table: the data the fit used.
      params: the fitted parameters (a maximum of the penalised likelihood).
      config: the fit's config (its tie model, ridges and judge-awareness define the free directions;
        fixed entries, e.g. ``alpha`` of plain BTL or ``tau`` of ``"half"``, get zero variance).
      kind: ``"fisher"`` (inverse information) or ``"sandwich"`` (``I^-1 S I^-1``, robust to
        misspecification, e.g. to the ``"half"`` pseudo-likelihood or to judge heterogeneity the
        model lacks).
      information: the information ``I`` that is inverted: ``"expected"`` (the Fisher information
        at the estimate, :func:`algorithms.ranking.btl.expected_information`; the paper's
        convention, Xu et al., 2026, Section 4) or ``"observed"`` (the Hessian of the negative
        log-likelihood at the estimate). ``None`` (default) is ``"expected"`` for ``"fisher"`` and
        ``"observed"`` for ``"sandwich"``, whose bread must be the data's own curvature to stay
        valid when the model is wrong.

    Returns:
      float [D, D], symmetric positive semi-definite of rank P.

    Raises:
      ValueError: unknown ``kind`` or ``information``.
    """
    if kind not in COVARIANCES:
        raise ValueError(f"covariance kind={kind!r}; expected one of {COVARIANCES}")
    if information is None:
        information = "expected" if kind == "fisher" else "observed"
    if information not in INFORMATION:
        raise ValueError(f"covariance information={information!r}; expected one of {INFORMATION}")
    return _covariance(table, params, config, kind, information)


@functools.partial(jax.jit, static_argnames=("kind", "information"))
def _covariance(table, params, config, kind, information):
    x = flatten(params)
    basis = reduced_basis(table.n_models, table.n_judges, config, x.dtype)
    if information == "expected":
        h = expected_information(x, table, config)
    else:
        _, _, h = derivatives(x, table, config)
    info = basis.T @ h @ basis
    info = 0.5 * (info + info.T)
    inv = jnp.linalg.inv(info)
    if kind == "sandwich":
        meat = basis.T @ score_outer(x, table, config) @ basis
        inv = inv @ meat @ inv
    cov = basis @ inv @ basis.T
    return 0.5 * (cov + cov.T)


class Intervals(NamedTuple):
    """Wald intervals at one level. Shapes: [N] for scores, [N, N] for differences (row minus
    column), [J] for discriminations; ``lo``/``hi`` bound the interval, ``se`` is the standard error."""

    scores: jax.Array
    scores_se: jax.Array
    scores_lo: jax.Array
    scores_hi: jax.Array
    diff_se: jax.Array
    diff_lo: jax.Array
    diff_hi: jax.Array
    gamma: jax.Array
    gamma_se: jax.Array
    gamma_lo: jax.Array
    gamma_hi: jax.Array


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level {level!r}; expected a number in (0, 1)")
    return float(norm.ppf(0.5 + level / 2))


def intervals(params: Params, cov: jax.Array, level: float = 0.95) -> Intervals:
    """Wald confidence intervals for ``s_i``, ``s_i - s_j`` and ``gamma_k``.

    ``gamma_k = exp(alpha_k)`` gets the delta-method standard error ``gamma_k se(alpha_k)`` and the
    interval ``gamma_k +- z gamma_k se(alpha_k)``.

    Args:
      params: fitted parameters.
      cov: float [D, D] from :func:`covariance`.
      level: coverage, e.g. 0.95.

    Raises:
      ValueError: ``level`` outside (0, 1) or a covariance of the wrong shape.
    """
    ft = jnp.result_type(float)  # float64 under jax.enable_x64, else float32
    params = jax.tree.map(lambda a: jnp.asarray(a, ft), params)
    cov = jnp.asarray(cov, ft)
    n, nj = params.scores.shape[-1], params.log_discrimination.shape[-1]
    if cov.shape[-2:] != (n + nj + 1, n + nj + 1):
        raise ValueError(f"covariance has shape {cov.shape}; expected [{n + nj + 1}, {n + nj + 1}]")
    z = _z(level)
    _check_concrete("intervals: cov", cov)
    var = jnp.clip(jnp.diagonal(cov, axis1=-2, axis2=-1), 0.0)
    s_se = jnp.sqrt(var[..., :n])
    cs = cov[..., :n, :n]
    dvar = var[..., :n, None] + var[..., None, :n] - 2 * cs
    d_se = jnp.sqrt(jnp.clip(dvar, 0.0))
    diff = params.scores[..., :, None] - params.scores[..., None, :]
    gamma = jnp.exp(params.log_discrimination)
    g_se = gamma * jnp.sqrt(var[..., n:n + nj])
    return Intervals(params.scores, s_se, params.scores - z * s_se, params.scores + z * s_se,
                     d_se, diff - z * d_se, diff + z * d_se,
                     gamma, g_se, gamma - z * g_se, gamma + z * g_se)


def ranks(scores: jax.Array) -> jax.Array:
    """Rank of each model, 1 = highest score, int32 [..., N]: one plus the number of models with a
    strictly higher score, so tied scores share the best of their ranks ("1224" competition ranking).
    """
    neg = -jnp.asarray(scores)
    srt = jnp.sort(neg, axis=-1)
    below = jnp.vectorize(lambda a, v: jnp.searchsorted(a, v, side="left"),
                          signature="(n),(n)->(n)")(srt, neg)
    return (below + 1).astype(jnp.int32)


def _check_concrete(name: str, value, finite: bool = True) -> None:
    if isinstance(value, jax.core.Tracer):
        return
    a = np.asarray(value)
    if finite and not np.all(np.isfinite(a)):
        raise ValueError(f"{name} has {int(np.size(a) - np.isfinite(a).sum())} non-finite entries "
                         "(NaN or inf); expected finite values (did the fit or its covariance fail?)")


def rank_intervals(key: jax.Array, params: Params, cov: jax.Array, level: float = 0.95,
                   num_draws: int = 4000) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Marginal intervals for each model's rank by simulation from the asymptotic normal law.

    Draws ``s ~ N(s_hat, Cov(s))`` (``Cov(s)`` is singular along the all-ones direction; the draws
    are sampled through its eigendecomposition), ranks every draw with :func:`ranks`, and takes the
    ``(1-level)/2`` and ``(1+level)/2`` quantiles of each model's rank (lower and upper empirical
    order statistics, so the integer interval is conservative). The point rank is :func:`ranks` of
    ``s_hat`` (tied scores share the best rank); each interval is widened, where needed, to contain
    its point rank (with many near-equal models the rank of ``s_hat`` can fall outside the central
    quantiles of the draws' ranks), so ``lo <= point <= hi`` always.

    Args:
      key: PRNG key.
      params: fitted parameters (scores float [N]).
      cov: float [D, D] from :func:`covariance` (D = N + J + 1), finite.
      level: coverage in (0, 1).
      num_draws: R >= 1 draws (static).

    Returns:
      (point ranks int32 [N], lower int32 [N], upper int32 [N]), 1 = best.

    Raises:
      ValueError: ``level`` outside (0, 1); ``num_draws`` < 1; ``cov`` of the wrong shape; ``cov``
        or the scores not finite (checked when concrete).
    """
    _z(level)
    if isinstance(num_draws, bool) or not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        raise ValueError(f"rank_intervals: num_draws={num_draws!r}; expected an int >= 1")
    n, nj = np.shape(params.scores)[-1], np.shape(params.log_discrimination)[-1]
    if np.shape(cov) != (n + nj + 1, n + nj + 1):
        raise ValueError(f"rank_intervals: cov has shape {np.shape(cov)}; expected "
                         f"[{n + nj + 1}, {n + nj + 1}] (N + J + 1 with N={n}, J={nj})")
    _check_concrete("rank_intervals: cov", cov)
    _check_concrete("rank_intervals: params.scores", params.scores)
    return _rank_intervals(key, params, jnp.asarray(cov), level, int(num_draws))


@functools.partial(jax.jit, static_argnames=("num_draws",))
def _rank_intervals(key, params, cov, level, num_draws):
    n = params.scores.shape[-1]
    scores = jnp.asarray(params.scores, cov.dtype)
    w, v = jnp.linalg.eigh(cov[:n, :n])
    factor = v * jnp.sqrt(jnp.clip(w, 0.0))  # the singular direction has w ~ 0 (+- rounding)
    eps = jax.random.normal(key, (num_draws, n), cov.dtype)
    draws = scores + eps @ factor.T
    r = ranks(draws).astype(cov.dtype)
    a = (1.0 - level) / 2
    lo = jnp.quantile(r, a, axis=0, method="lower").astype(jnp.int32)
    hi = jnp.quantile(r, 1.0 - a, axis=0, method="higher").astype(jnp.int32)
    point = ranks(scores)
    return point, jnp.minimum(lo, point), jnp.maximum(hi, point)


def bootstrap(key: jax.Array, table: ComparisonTable, params: Params, config: FitConfig,
              num_samples: int = 200, batch_size: int = 16) -> tuple[Params, jax.Array]:
    """Nonparametric (multinomial) bootstrap: resample the C comparisons with replacement and refit.

    Each replicate draws C comparisons from the empirical distribution over (row, outcome) cells
    (counts ~ Multinomial(C, counts / C)), then fits from ``params`` (a warm start, so a few Newton
    steps suffice). Memory is ``batch_size * C`` indices; replicates run ``batch_size`` at a time.

    Args:
      key: PRNG key.
      table: the data (integer counts).
      params: the fit on ``table``; the starting point of every refit.
      config: the fit's config.
      num_samples: B replicates.
      batch_size: replicates vectorised together.

    Returns:
      (params with a leading axis [B], converged bool [B]). A replicate counts as converged only if
      Newton's method converged and its MLE exists (:func:`algorithms.ranking.btl.mle_exists`: a
      resample can break identifiability, say a model that now never loses, or separate a judge;
      its scores then run to infinity). Drop the others; :func:`bootstrap_intervals` does so and
      counts them.

    Raises:
      ValueError: ``num_samples`` or ``batch_size`` < 1, or counts that are not whole numbers.
    """
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"bootstrap: num_samples={num_samples}, batch_size={batch_size}; expected >= 1")
    cnt = np.stack([np.asarray(table.wins), np.asarray(table.losses), np.asarray(table.ties)], -1)
    if not np.allclose(cnt, np.round(cnt)):
        raise ValueError("bootstrap: counts must be whole numbers (resampling individual comparisons)")
    return _bootstrap(key, table, params, config, num_samples, min(batch_size, num_samples),
                      int(round(cnt.sum())))


@functools.partial(jax.jit, static_argnames=("num_samples", "batch_size", "total"))
def _bootstrap(key, table, params, config, num_samples, batch_size, total):
    cnt = jnp.stack([table.wins, table.losses, table.ties], axis=-1).reshape(-1)
    logits = jnp.where(cnt > 0, jnp.log(jnp.where(cnt > 0, cnt, 1.0)), -jnp.inf)
    m = table.num_rows

    def one(k):
        cells = jax.random.categorical(k, logits, shape=(total,))
        new = jnp.bincount(cells, length=3 * m).astype(table.wins.dtype).reshape(m, 3)
        t = ComparisonTable(table.i, table.j, table.judge, new[:, 0], new[:, 1], new[:, 2],
                            table.n_models, table.n_judges)
        p, conv = solve(t, config, init=params)
        # A resample can lose the MLE's existence (e.g. a model that now never loses): Newton then
        # stops on a flat objective with the scores far out, which is not a converged fit.
        return p, conv.converged & mle_exists(t, config, conv.information)

    keys = jax.random.split(key, num_samples)
    return jax.lax.map(one, keys, batch_size=batch_size)


def percentile_intervals(draws: jax.Array, level: float = 0.95, axis: int = 0):
    """Percentile bootstrap interval ``(lo, hi)`` of ``draws`` along ``axis``.

    Raises:
      ValueError: ``level`` outside (0, 1).
    """
    _z(level)
    a = (1.0 - level) / 2
    return jnp.quantile(draws, a, axis=axis), jnp.quantile(draws, 1.0 - a, axis=axis)


class BootstrapSummary(NamedTuple):
    """Percentile intervals over the usable bootstrap replicates.

    Attributes:
      lo, hi: float [...], the interval bounds (the shape of one replicate).
      num_used: replicates that converged to an existing MLE.
      num_dropped: replicates left out (not converged, or MLE at infinity).
    """

    lo: np.ndarray
    hi: np.ndarray
    num_used: int
    num_dropped: int


def bootstrap_intervals(draws: jax.Array, converged: jax.Array, level: float = 0.95
                        ) -> BootstrapSummary:
    """Percentile intervals from :func:`bootstrap` output, dropping unusable replicates.

    Args:
      draws: float [B, ...], e.g. the replicate scores [B, N].
      converged: bool [B], the second output of :func:`bootstrap`.
      level: coverage in (0, 1).

    Raises:
      ValueError: ``level`` outside (0, 1), mismatched lengths, or fewer than 2 usable replicates.
    """
    draws, ok = np.asarray(draws), np.asarray(converged, bool)
    if ok.shape != draws.shape[:1]:
        raise ValueError(f"bootstrap_intervals: converged has shape {ok.shape}; expected "
                         f"({draws.shape[0]},) like the leading axis of draws {draws.shape}")
    used = int(ok.sum())
    if used < 2:
        raise ValueError(f"bootstrap_intervals: only {used} of {ok.size} replicates have a finite "
                         "MLE; the data are too sparse for a bootstrap (add a ridge, or comparisons)")
    _z(level)
    a = (1.0 - level) / 2  # host quantiles: float64 whatever the JAX precision setting
    lo, hi = np.quantile(draws[ok], a, axis=0), np.quantile(draws[ok], 1.0 - a, axis=0)
    return BootstrapSummary(lo, hi, used, int(ok.size - used))
