"""Judge-aware Bradley-Terry-Luce model: likelihood, derivatives and a jitted Newton fit.

Dimension legend: M aggregated rows, N models, J judges, P reduced (free) parameters,
D = N + J + 1 full parameters laid out as ``x = [s (N), alpha (J), tau (1)]``, R posterior draws.

Model (Xu et al., 2026, "A Judge-Aware Ranking Framework for Evaluating Large Language Models
without Ground Truth", eq. for the judge-aware BTL likelihood): judge ``k`` prefers model ``i`` to
model ``j`` with probability

    P(i > j | k) = sigmoid(gamma_k (s_i - s_j)),   gamma_k = exp(alpha_k) > 0,

normalised by ``sum_i s_i = 0`` and ``sum_k alpha_k = 0`` (geometric-mean discrimination 1), which
fixes the location of ``s`` and the scale shared by ``s`` and ``gamma``. Plain BTL (Bradley and Terry,
1952) is ``alpha = 0``. Ties, with ``d = gamma_k (s_i - s_j)``:

* ``"half"``: a tie counts as half a win for each side (a pseudo-likelihood; default).
* ``"davidson"`` (Davidson, 1970): ``P(i) : P(j) : P(tie) = e^{d/2} : e^{-d/2} : nu``, ``nu = e^tau``.
* ``"rao_kupper"`` (Rao and Kupper, 1967): ``P(i) = sigmoid(d - eta)``, ``P(j) = sigmoid(-d - eta)``,
  ``P(tie)`` the rest, ``eta = e^tau > 0``.

The fit maximises the log-likelihood (minus optional Gaussian priors ``ridge_scores/2 |s|^2`` and
``ridge_alpha/2 |alpha|^2``, i.e. the MAP) in reduced coordinates ``x = B theta``, where ``B`` is
block-diagonal with orthonormal bases of the zero-sum subspaces (Helmert contrasts). Newton's method
uses the exact Hessian, assembled from per-row 4x4 blocks, shifted by the smallest multiple of the identity
that makes its Cholesky factorisation succeed (Levenberg-Marquardt damping) because the joint likelihood
is not concave in ``(s, alpha)`` away from the optimum, and an Armijo
backtracking line search guarantees descent. It stops when the Newton decrement ``g^T H^-1 g / 2``
falls below ``tol`` (an affine-invariant criterion, in nats of total log-likelihood).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from algorithms.ranking.data import ComparisonTable
from kernels import checks

TIE_MODELS = ("half", "davidson", "rao_kupper")


class Params(NamedTuple):
    """Model parameters (a pytree).

    Attributes:
      scores: float [N], latent quality ``s`` (sum 0).
      log_discrimination: float [J], ``alpha`` (sum 0 in the judge-aware model, else all 0).
      tie: float [], ``tau``: log of the Davidson ``nu`` or of the Rao-Kupper ``eta``; 0 for ``"half"``.
    """

    scores: jax.Array
    log_discrimination: jax.Array
    tie: jax.Array

    @property
    def discrimination(self) -> jax.Array:
        """``gamma = exp(alpha)``, float [J]."""
        return jnp.exp(self.log_discrimination)


class Convergence(NamedTuple):
    """Convergence report of :func:`solve`.

    Attributes:
      iterations: int32 [], Newton iterations (both stages together).
      converged: bool [], the Newton decrement fell below ``tol`` within ``max_iter``.
      decrement: float [], the last Newton decrement ``g^T H^-1 g / 2`` (nats).
      grad_norm: float [], max-norm of the reduced gradient at the returned point.
      objective: float [], negative (penalised) log-likelihood at the returned point (nats).
      information: float [D], diagonal of the observed information (Hessian of the objective) at the
        returned point; an entry near 0 relative to the parameter's comparisons flags a parameter that
        runs to plus or minus infinity (e.g. a judge whose every comparison agrees with the fitted
        order, ``alpha -> +inf``, or whose votes do not follow it, ``alpha -> -inf``).
    """

    iterations: jax.Array
    converged: jax.Array
    decrement: jax.Array
    grad_norm: jax.Array
    objective: jax.Array
    information: jax.Array


@functools.partial(jax.tree_util.register_dataclass, data_fields=["ridge_scores", "ridge_alpha"],
                   meta_fields=["judge_aware", "tie_model", "max_iter", "tol", "max_halvings"])
@dataclasses.dataclass(frozen=True)
class FitConfig:
    """Hyper-parameters of the fit; a pytree whose ridge weights are leaves (traced, so a grid of
    ridges shares one compilation and can be ``jax.vmap``-ed) and whose other fields are static.

    Attributes:
      judge_aware: fit ``alpha`` (judge-aware BTL); ``False`` is plain BTL (``gamma = 1``).
      tie_model: ``"half"``, ``"davidson"`` or ``"rao_kupper"``.
      ridge_scores: weight of the Gaussian prior ``ridge/2 |s|^2`` (0 = maximum likelihood).
      ridge_alpha: weight of the Gaussian prior on ``alpha`` (0 = maximum likelihood).
      max_iter: Newton iterations per stage (plain BTL first, then joint when judge-aware).
      tol: stop when the Newton decrement is below this (nats of total log-likelihood).
      max_halvings: Armijo line-search halvings per iteration.
    """

    judge_aware: bool = True
    tie_model: str = "half"
    ridge_scores: float = 0.0
    ridge_alpha: float = 0.0
    max_iter: int = 100
    tol: float = 1e-14
    max_halvings: int = 40

    def __post_init__(self):
        if self.tie_model not in TIE_MODELS:
            raise ValueError(f"FitConfig.tie_model={self.tie_model!r}; expected one of {TIE_MODELS}")
        for name in ("ridge_scores", "ridge_alpha"):
            v = getattr(self, name)
            if checks.is_traced(v) or getattr(v, "ndim", 0) > 0:
                continue  # a traced or array leaf (inside jit/vmap): validated where it was built
            # NumPy scalars (np.float32(-1)) are checked exactly like Python floats
            checks.number(v, name, "FitConfig", minimum=0.0)
        checks.integer(self.max_iter, "max_iter", "FitConfig", minimum=1)
        checks.integer(self.max_halvings, "max_halvings", "FitConfig", minimum=1)
        checks.number(self.tol, "tol", "FitConfig", minimum=0.0, open_min=True)
        if self.max_iter < 1 or self.max_halvings < 1:
            raise ValueError("FitConfig.max_iter and max_halvings must be >= 1")
        if not self.tol > 0:
            raise ValueError(f"FitConfig.tol={self.tol!r}; expected > 0")

    @property
    def has_tie_param(self) -> bool:
        return self.tie_model != "half"


# ----------------------------------------------------------------------------------------------
# Likelihood per row
# ----------------------------------------------------------------------------------------------


def outcome_logprobs(d: jax.Array, tau: jax.Array, tie_model: str) -> jax.Array:
    """Log-probabilities of (i wins, j wins, tie) given ``d = gamma_k (s_i - s_j)``.

    Args:
      d: float [...], the discriminated score difference.
      tau: float [] or [...], the tie parameter (ignored for ``"half"``).
      tie_model: see the module docstring.

    Returns:
      float [..., 3]. For ``"half"`` the third entry is the tie pseudo-log-likelihood
      ``(log sigmoid(d) + log sigmoid(-d)) / 2``, so the three do not sum to one in probability.
    """
    if tie_model == "half":
        lw, ll = jax.nn.log_sigmoid(d), jax.nn.log_sigmoid(-d)
        return jnp.stack([lw, ll, 0.5 * (lw + ll)], axis=-1)
    tau = jnp.broadcast_to(tau, jnp.shape(d))
    if tie_model == "davidson":
        logits = jnp.stack([d / 2, -d / 2, tau], axis=-1)
        return logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    if tie_model == "rao_kupper":
        eta = jnp.exp(tau)
        lw, ll = jax.nn.log_sigmoid(d - eta), jax.nn.log_sigmoid(-d - eta)
        # P(tie) = (e^{2 eta} - 1) / ((1 + e^{eta - d}) (1 + e^{eta + d})).
        lt = jnp.log(jnp.expm1(2 * eta)) - jax.nn.softplus(eta - d) - jax.nn.softplus(eta + d)
        return jnp.stack([lw, ll, lt], axis=-1)
    raise ValueError(f"tie_model={tie_model!r}; expected one of {TIE_MODELS}")


def _local_logprobs(u: jax.Array, tie_model: str) -> jax.Array:
    """``u = (s_i, s_j, alpha_k, tau)`` [4] -> outcome log-probabilities [3]."""
    d = jnp.exp(u[2]) * (u[0] - u[1])
    return outcome_logprobs(d, u[3], tie_model)


def _row_index(table: ComparisonTable) -> jax.Array:
    """Positions of ``(s_i, s_j, alpha_k, tau)`` of every row in the full vector: int32 [M, 4]."""
    n, nj = table.n_models, table.n_judges
    return jnp.stack([table.i, table.j, n + table.judge, jnp.full_like(table.i, n + nj)], axis=-1)


def _row_counts(table: ComparisonTable) -> jax.Array:
    return jnp.stack([table.wins, table.losses, table.ties], axis=-1)


def flatten(params: Params) -> jax.Array:
    """``Params`` -> full vector ``x = [s, alpha, tau]``, float [D]."""
    return jnp.concatenate([params.scores, params.log_discrimination, params.tie[None]])


def unflatten(x: jax.Array, n_models: int, n_judges: int) -> Params:
    """Full vector [..., D] -> ``Params`` (leading axes kept)."""
    return Params(x[..., :n_models], x[..., n_models:n_models + n_judges], x[..., n_models + n_judges])


def loglik(params: Params, table: ComparisonTable, tie_model: str = "half") -> jax.Array:
    """Total log-likelihood (pseudo-log-likelihood for ``"half"``), float [] in nats."""
    x = flatten(params)
    u = x[_row_index(table)]
    lp = jax.vmap(lambda v: _local_logprobs(v, tie_model))(u)
    return jnp.sum(_row_counts(table) * lp)


def win_probability(params: Params, i, j, judge=None) -> jax.Array:
    """``P(i beats j | judge)`` under the ``"half"`` convention (ties split), float [...]."""
    a = 0.0 if judge is None else params.log_discrimination[judge]
    return jax.nn.sigmoid(jnp.exp(a) * (params.scores[i] - params.scores[j]))


# ----------------------------------------------------------------------------------------------
# Reduced coordinates
# ----------------------------------------------------------------------------------------------


def zero_sum_basis(n: int, dtype=None) -> jax.Array:
    """Orthonormal basis of ``{x in R^n : sum x = 0}`` (Helmert contrasts), float [n, n-1].

    Column ``k`` (0-based) is ``(1, ..., 1, -(k+1), 0, ..., 0) / sqrt((k+1)(k+2))`` with ``k+1`` ones.

    Raises:
      ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"zero_sum_basis: n={n}; expected >= 1")
    dtype = dtype or jnp.result_type(float)
    r = jnp.arange(n)[:, None]
    k = jnp.arange(n - 1)[None, :]
    val = jnp.where(r <= k, 1.0, jnp.where(r == k + 1, -(k + 1.0), 0.0))
    return (val / jnp.sqrt((k + 1.0) * (k + 2.0))).astype(dtype)


def reduced_basis(n_models: int, n_judges: int, config: FitConfig, dtype=None) -> jax.Array:
    """``B``, float [D, P]: maps reduced coordinates to ``x = [s, alpha, tau]``.

    Blocks: zero-sum basis of ``s``; zero-sum basis of ``alpha`` if judge-aware (else ``alpha`` is
    fixed at 0); the identity on ``tau`` if the tie model has a parameter.
    """
    dtype = dtype or jnp.result_type(float)
    d = n_models + n_judges + 1
    blocks = [jnp.zeros((d, n_models - 1), dtype).at[:n_models].set(zero_sum_basis(n_models, dtype))]
    if config.judge_aware and n_judges > 1:
        blocks.append(jnp.zeros((d, n_judges - 1), dtype)
                      .at[n_models:n_models + n_judges].set(zero_sum_basis(n_judges, dtype)))
    if config.has_tie_param:
        blocks.append(jnp.zeros((d, 1), dtype).at[d - 1, 0].set(1.0))
    return jnp.concatenate(blocks, axis=1)


def _ridge_diag(n_models: int, n_judges: int, config: FitConfig, dtype) -> jax.Array:
    return jnp.concatenate([jnp.full(n_models, config.ridge_scores, dtype),
                            jnp.full(n_judges, config.ridge_alpha, dtype), jnp.zeros(1, dtype)])


# ----------------------------------------------------------------------------------------------
# Derivatives
# ----------------------------------------------------------------------------------------------


def objective(x: jax.Array, table: ComparisonTable, config: FitConfig) -> jax.Array:
    """Negative penalised log-likelihood at the full vector ``x`` [D], float [] (nats)."""
    n, nj = table.n_models, table.n_judges
    d = jnp.exp(x[n + table.judge]) * (x[table.i] - x[table.j])
    nll = jnp.sum(_phi(d, x[-1], _row_counts(table), config.tie_model))
    return nll + 0.5 * jnp.sum(_ridge_diag(n, nj, config, x.dtype) * x * x)


def _phi(d: jax.Array, tau: jax.Array, cnt: jax.Array, tie_model: str) -> jax.Array:
    """Row negative log-likelihood ``phi(d, tau)`` [M] (closed form for ``"half"``: one pass, as in
    the line search, where it is evaluated once per trial step)."""
    if tie_model == "half":
        n = jnp.sum(cnt, axis=-1)
        y = cnt[:, 0] + 0.5 * cnt[:, 2]
        return -(y * jax.nn.log_sigmoid(d) + (n - y) * jax.nn.log_sigmoid(-d))
    return -jnp.sum(cnt * outcome_logprobs(d, tau, tie_model), axis=-1)


def _phi_derivs(d: jax.Array, tau: jax.Array, cnt: jax.Array, tie_model: str):
    """Row negative log-likelihood ``phi(d, tau)`` and its first and second partials, each [M].

    Closed form for ``"half"`` (``phi_d = n sigmoid(d) - y``, ``phi_dd = n sigmoid(d) sigmoid(-d)``
    with ``y`` the wins plus half the ties); autodiff of the two-variable function otherwise.
    """
    if tie_model == "half":
        n = jnp.sum(cnt, axis=-1)
        y = cnt[:, 0] + 0.5 * cnt[:, 2]
        p = jax.nn.sigmoid(d)
        phi = -(y * jax.nn.log_sigmoid(d) + (n - y) * jax.nn.log_sigmoid(-d))
        z = jnp.zeros_like(d)
        return phi, n * p - y, z, n * p * (1 - p), z, z

    def phi_fn(dt, c):
        return -jnp.dot(c, outcome_logprobs(dt[0], dt[1], tie_model))

    dt = jnp.stack([d, jnp.broadcast_to(tau, d.shape)], axis=-1)
    phi = jax.vmap(phi_fn)(dt, cnt)
    g = jax.vmap(jax.grad(phi_fn))(dt, cnt)
    h = jax.vmap(jax.hessian(phi_fn))(dt, cnt)
    return phi, g[:, 0], g[:, 1], h[:, 0, 0], h[:, 0, 1], h[:, 1, 1]


def _local_geometry(x: jax.Array, table: ComparisonTable):
    """``d`` [M], its gradient [M, 4] and Hessian [M, 4, 4] in ``u = (s_i, s_j, alpha_k, tau)``."""
    n = table.n_models
    gamma = jnp.exp(x[n + table.judge])
    d = gamma * (x[table.i] - x[table.j])
    z = jnp.zeros_like(d)
    gd = jnp.stack([gamma, -gamma, d, z], axis=-1)
    # hess d = gamma * C1 + d * C2 with constant 4x4 patterns (cheaper to compile than scatters).
    c1 = jnp.asarray([[0, 0, 1, 0], [0, 0, -1, 0], [1, -1, 0, 0], [0, 0, 0, 0]], x.dtype)
    c2 = jnp.zeros((4, 4), x.dtype).at[2, 2].set(1.0)
    hd = gamma[:, None, None] * c1 + d[:, None, None] * c2
    return d, gd, hd


def derivatives(x: jax.Array, table: ComparisonTable, config: FitConfig):
    """Objective, gradient and Hessian of :func:`objective` in full coordinates.

    A row depends on ``x`` only through ``d = exp(alpha_k) (s_i - s_j)`` and ``tau``, so by the chain
    rule its gradient in ``u = (s_i, s_j, alpha_k, tau)`` is ``phi_d grad d + phi_tau e_tau`` and its
    Hessian ``phi_dd grad d grad d^T + phi_d hess d + phi_dtau (grad d e_tau^T + e_tau grad d^T)
    + phi_tautau e_tau e_tau^T``, with ``grad d = (gamma, -gamma, d, 0)`` and ``hess d`` holding
    ``+-gamma`` in the ``(s, alpha)`` entries and ``d`` in the ``(alpha, alpha)`` entry. The 4x4
    block has five distinct entries (up to sign), so the Hessian [D, D] is assembled block by block
    from per-row scalars: the score block from one [N, N] segment sum of ``phi_dd gamma^2`` (its
    diagonal the row sums: a Laplacian), the score-judge block from two [N, J] segment sums, the judge
    block and the tie entries from [J] and [N] sums. This is the same matrix as scattering the 4x4
    blocks (``_scatter_blocks``) with about a third of the scattered values, the cost of an iteration.

    Returns:
      (f [], g [D], H [D, D]), float.
    """
    n, nj = table.n_models, table.n_judges
    gamma = jnp.exp(x[n + table.judge])
    d = gamma * (x[table.i] - x[table.j])
    phi, p_d, p_t, p_dd, p_dt, p_tt = _phi_derivs(d, x[-1], _row_counts(table), config.tie_model)
    ridge = _ridge_diag(n, nj, config, x.dtype)
    f = jnp.sum(phi) + 0.5 * jnp.sum(ridge * x * x)
    g = jnp.concatenate([_per_model(p_d * gamma, table), jax.ops.segment_sum(p_d * d, table.judge, nj),
                         jnp.sum(p_t)[None]]) + ridge * x
    h = _assemble_curvature(table, gamma, d, p_d, p_dd, p_dt, p_tt)
    return f, g, h + jnp.diag(ridge)


def _per_model(v: jax.Array, table: ComparisonTable) -> jax.Array:
    """Per-row values [M] summed into [N]: ``+v`` at ``s_i``, ``-v`` at ``s_j``."""
    n = table.n_models
    return jax.ops.segment_sum(v, table.i, n) - jax.ops.segment_sum(v, table.j, n)


def _assemble_curvature(table: ComparisonTable, gamma, d, c_d, c_dd, c_dt, c_tt) -> jax.Array:
    """``sum_rows c_dd grad d grad d^T + c_d hess d + c_dt (grad d e_tau^T + e_tau grad d^T)
    + c_tt e_tau e_tau^T`` in full coordinates, float [D, D], from per-row scalars [M] (see
    :func:`derivatives` for the block-wise assembly). With the observed partials of ``phi`` it is
    the observed information; with ``c_d = 0`` and the expected partials, the expected one."""
    n, nj = table.n_models, table.n_judges
    i, j, k = table.i, table.j, table.judge
    w = jax.ops.segment_sum(c_dd * gamma * gamma, i * n + j, n * n).reshape(n, n)
    w = w + w.T
    h_ss = jnp.diag(jnp.sum(w, axis=1)) - w
    q = c_dd * gamma * d + c_d * gamma
    h_sa = (jax.ops.segment_sum(q, i * nj + k, n * nj) - jax.ops.segment_sum(q, j * nj + k, n * nj)
            ).reshape(n, nj)
    h_aa = jnp.diag(jax.ops.segment_sum(c_dd * d * d + c_d * d, k, nj))
    h_st = _per_model(c_dt * gamma, table)
    h_at = jax.ops.segment_sum(c_dt * d, k, nj)
    col_t = jnp.concatenate([h_st, h_at])[:, None]
    return jnp.block([[h_ss, h_sa, col_t[:n]],
                      [h_sa.T, h_aa, col_t[n:]],
                      [col_t.T, jnp.sum(c_tt)[None, None]]])


def _expected_partials(d: jax.Array, tau: jax.Array, total: jax.Array, tie_model: str):
    """Per-row Fisher information of ``(d, tau)``: ``total`` comparisons times
    ``sum_o p_o (dlog p_o)(dlog p_o)^T`` over the outcomes ``o``; entries ``(dd, dtau, tautau)``,
    each [M]. For ``"half"`` (a Bernoulli comparison, ``P(i wins) = sigmoid(d)``) it is
    ``(total p (1 - p), 0, 0)``."""
    if tie_model == "half":
        p = jax.nn.sigmoid(d)
        z = jnp.zeros_like(d)
        return total * p * (1 - p), z, z
    tau = jnp.broadcast_to(tau, d.shape)
    lp = outcome_logprobs(d, tau, tie_model)  # [M, 3]
    jd, jt = jax.vmap(jax.jacfwd(lambda dd, tt: outcome_logprobs(dd, tt, tie_model),
                                 argnums=(0, 1)))(d, tau)  # [M, 3] each
    p = jnp.exp(lp)
    return (total * jnp.sum(p * jd * jd, -1), total * jnp.sum(p * jd * jt, -1),
            total * jnp.sum(p * jt * jt, -1))


def expected_information(x: jax.Array, table: ComparisonTable, config: FitConfig) -> jax.Array:
    """Expected (Fisher) information of the penalised negative log-likelihood at ``x``, float [D, D].

    The data enter only through the number of comparisons of each row (the design); the outcomes
    are averaged over the model at ``x``. A comparison depends on ``x`` through
    ``d = exp(alpha_k) (s_i - s_j)`` (and ``tau``); its score is ``(dlog p_o / dd) grad d`` (plus the
    ``tau`` part), so its information is ``E[score score^T]``. For a decisive comparison with
    ``p = sigmoid(d)`` that is

        p (1 - p) grad d grad d^T,    grad d = (gamma_k, -gamma_k, d) in (s_i, s_j, alpha_k),

    i.e. ``p (1 - p)`` times the outer product of the gradient of the logit ``d``. Written out per
    row: ``p(1-p) gamma^2`` in the ``(s, s)`` entries (a graph Laplacian), ``p(1-p) gamma d`` in
    ``(s_i, alpha_k)`` (minus at ``s_j``) and ``p(1-p) d^2`` in ``(alpha_k, alpha_k)``. With ties
    (Davidson, Rao-Kupper) the per-comparison ``(d, tau)`` information ``sum_o p_o (dlog p_o)
    (dlog p_o)^T`` replaces ``p (1 - p)``. For ``"half"`` ties count as comparisons of the Bernoulli
    model (the pseudo-likelihood's convention). Ridges add ``diag(ridge)``, as in :func:`derivatives`.

    The observed information (the Hessian of :func:`derivatives`) differs by ``sum_rows phi_d
    hess d``, with ``phi_d = total p - y`` (wins ``y``) for a decisive row: its expectation is 0, so
    the two agree on average over the outcomes, but not on one data set. ``hess d`` is zero in the
    ``(s, s)`` block, so for plain BTL (``alpha`` fixed) they coincide at every ``x``: the logit
    link is canonical. Xu et al. (2026), Section 4: the asymptotic covariance of the normalised
    MLE is the inverse of this (expected) information.

    Args:
      x: float [D], the full parameter vector ``[s, alpha, tau]``.
      table: the design (only ``wins + losses + ties`` per row is used).
      config: tie model and ridges.

    Returns:
      float [D, D], symmetric positive semi-definite.
    """
    n, nj = table.n_models, table.n_judges
    gamma = jnp.exp(x[n + table.judge])
    d = gamma * (x[table.i] - x[table.j])
    e_dd, e_dt, e_tt = _expected_partials(d, x[-1], table.totals.astype(x.dtype), config.tie_model)
    h = _assemble_curvature(table, gamma, d, jnp.zeros_like(d), e_dd, e_dt, e_tt)
    return h + jnp.diag(_ridge_diag(n, nj, config, x.dtype))


def _scatter_blocks(blocks: jax.Array, idx: jax.Array, dim: int) -> jax.Array:
    """``sum_r P_r^T blocks_r P_r``: per-row 4x4 blocks [M, 4, 4] added at ``idx`` [M, 4] of a
    [dim, dim] matrix (a 1-D segment sum over flattened positions, faster on CPU than a 2-D scatter)."""
    flat = (idx[:, :, None] * dim + idx[:, None, :]).reshape(-1)
    return jax.ops.segment_sum(blocks.reshape(-1), flat, dim * dim).reshape(dim, dim)


def score_outer(x: jax.Array, table: ComparisonTable, config: FitConfig) -> jax.Array:
    """``sum over comparisons of grad log p grad log p^T`` in full coordinates, float [D, D].

    The "meat" of the sandwich covariance (Huber, 1967; White, 1982): one score per individual
    comparison, each outcome of a row weighted by its count. For ``"half"`` a tie's score is the
    gradient of its pseudo-log-likelihood ``(log sigmoid(d) + log sigmoid(-d)) / 2``.
    """
    idx = _row_index(table)
    cnt = _row_counts(table)
    d, gd, _ = _local_geometry(x, table)
    jac = jax.vmap(jax.jacfwd(lambda dd, tt: outcome_logprobs(dd, tt, config.tie_model),
                              argnums=(0, 1)), in_axes=(0, None))(d, x[-1])  # 2 x [M, 3]
    e = jnp.zeros(4, x.dtype).at[3].set(1.0)
    score = jac[0][:, :, None] * gd[:, None, :] + jac[1][:, :, None] * e  # [M, 3, 4]
    local = jnp.einsum("mo,moa,mob->mab", cnt, score, score)
    return _scatter_blocks(local, idx, x.shape[0])


# ----------------------------------------------------------------------------------------------
# Newton's method
# ----------------------------------------------------------------------------------------------


def _damped_solve(h: jax.Array, g: jax.Array) -> jax.Array:
    """``(H + mu I)^{-1} g`` with the smallest ``mu`` in ``{0, 1e-10 c, 1e-9 c, ...}`` (``c`` the largest
    diagonal entry) for which the Cholesky factorisation succeeds (Levenberg-Marquardt damping).

    Away from the optimum the joint likelihood is not concave in ``(s, alpha)``; the shift makes the
    step a descent direction. At the MLE ``H`` is positive definite and the step is pure Newton.
    """
    c = jnp.maximum(jnp.max(jnp.diagonal(h)), 1.0)
    eye = jnp.eye(h.shape[0], dtype=h.dtype)

    def cond(carry):
        _, chol, k = carry
        return ~jnp.all(jnp.isfinite(chol)) & (k < 40)

    def body(carry):
        mu, _, k = carry
        mu = jnp.where(mu == 0, 1e-10 * c, 10.0 * mu)
        return mu, jnp.linalg.cholesky(h + mu * eye), k + 1

    zero = jnp.zeros((), h.dtype)
    _, chol, _ = jax.lax.while_loop(cond, body, (zero, jnp.linalg.cholesky(h), 0))
    return jax.scipy.linalg.cho_solve((chol, True), g)


def _newton(x0: jax.Array, table: ComparisonTable, config: FitConfig, basis: jax.Array,
            stage_one: jax.Array | None = None, stop_after_one: jax.Array | bool = False):
    """Damped (Levenberg-Marquardt) Newton from ``x0`` along the span of ``basis`` [D, P].

    ``stage_one`` (bool [P]) marks coordinates held fixed until a first convergence (plain BTL before
    the joint fit); one loop runs both stages so the derivatives are traced and compiled once.
    ``stop_after_one`` (a traced bool) ends after the first stage (plain BTL).

    Returns:
      (x [D], iterations, last Newton decrement, converged).
    """
    dtype = x0.dtype
    eps = jnp.finfo(dtype).eps
    p = basis.shape[1]
    frozen0 = jnp.zeros(p, bool) if stage_one is None else stage_one

    def obj(theta):
        return objective(x0 + basis @ theta, table, config)

    def cond(state):
        return (state["it"] < config.max_iter) & ~state["done"]

    def body(state):
        theta = state["theta"]
        frozen = frozen0 & (state["stage"] == 0)
        f, g_full, h_full = derivatives(x0 + basis @ theta, table, config)
        g = jnp.where(frozen, 0.0, basis.T @ g_full)
        h = basis.T @ h_full @ basis
        h = jnp.where(frozen[:, None] | frozen[None, :], jnp.diag(frozen.astype(dtype)), h)
        step = -_damped_solve(h, g)
        dec = 0.5 * jnp.dot(-g, step)
        small = dec < config.tol

        def ls_cond(carry):
            t, k, fn = carry
            return (k < config.max_halvings) & ~(fn <= f + 1e-4 * t * jnp.dot(g, step))

        def ls_body(carry):
            t, k, _ = carry
            t = 0.5 * t
            return t, k + 1, obj(theta + t * step)

        one = jnp.ones((), dtype)
        # A predicted decrease below the rounding of the objective cannot be checked by comparing
        # objectives: the search would halve the step on rounding noise and stall a few 1e-14 nats
        # short of tol. There the quadratic model is exact to that rounding, so the full Newton step
        # is taken without a search.
        full = ~small & (dec < 1e2 * eps * jnp.maximum(jnp.abs(f), 1.0))
        # Converged: skip the search (the first trial is then not evaluated either).
        start = (one, jnp.where(small | full, config.max_halvings, 0),
                 jax.lax.cond(small, lambda: f, lambda: obj(theta + step)))
        t, _, fn = jax.lax.while_loop(ls_cond, ls_body, start)
        accept = ~small & jnp.isfinite(fn) & ((fn <= f) | full)
        theta = jnp.where(accept, theta + t * step, theta)
        # No decrease at all: the objective is flat to rounding; converged if the decrement is at
        # the level of that rounding, otherwise stuck (reported as not converged).
        stalled = ~small & ~accept
        ok = small | (stalled & (dec < 1e3 * eps * jnp.maximum(jnp.abs(f), 1.0)))
        stop = small | stalled
        last_stage = (state["stage"] == 1) | ~jnp.any(frozen0) | stop_after_one
        return dict(theta=theta, it=state["it"] + 1, dec=dec, ok=ok,
                    stage=jnp.where(stop, 1, state["stage"]), done=stop & last_stage)

    state = dict(theta=jnp.zeros(p, dtype), it=jnp.zeros((), jnp.int32),
                 dec=jnp.asarray(jnp.inf, dtype), ok=jnp.zeros((), bool),
                 stage=jnp.zeros((), jnp.int32), done=jnp.zeros((), bool))
    out = jax.lax.while_loop(cond, body, state)
    return x0 + basis @ out["theta"], out["it"], out["dec"], out["ok"] & out["done"]


def initial_tie(table: ComparisonTable, tie_model: str, dtype) -> jax.Array:
    """Method-of-moments ``tau`` at ``s = 0``: the tie fraction ``p_t`` gives ``nu = 2 p_t / (1 - p_t)``
    (Davidson) or ``eta = 2 artanh(p_t)`` (Rao-Kupper); 0 for ``"half"``."""
    if tie_model == "half":
        return jnp.zeros((), dtype)
    p = jnp.clip(jnp.sum(table.ties) / jnp.maximum(jnp.sum(_row_counts(table)), 1.0), 1e-3, 0.95)
    if tie_model == "davidson":
        return jnp.log(2 * p / (1 - p)).astype(dtype)
    return jnp.log(2 * jnp.arctanh(p)).astype(dtype)


def solve(table: ComparisonTable, config: FitConfig, init: Params | None = None
          ) -> tuple[Params, Convergence]:
    """Fits the model by Newton's method; jitted, no validation (see :func:`fit` for the checked
    entry point). Safe to ``jax.vmap`` over tables of one shape (e.g. simulated or bootstrap data).

    Plain BTL and the judge-aware model share one compilation: plain BTL is the first stage of the
    judge-aware fit (``alpha`` held at 0), stopped there.

    Args:
      table: the counts (float dtype sets the precision: use float64 for reference-grade fits).
      config: hyper-parameters (ridges traced, the rest static).
      init: starting point; default ``s = 0``, ``alpha = 0``, moment estimate of ``tau``. Without
        ``init`` and judge-aware, plain BTL is fitted first and the joint fit starts from it.

    Returns:
      (params, convergence); ``params`` satisfy both zero-sum normalisations exactly (up to rounding).
    """
    aware = dataclasses.replace(config, judge_aware=True)
    return _solve(table, aware, init, jnp.asarray(config.judge_aware and table.n_judges > 1))


@jax.jit
def _solve(table: ComparisonTable, config: FitConfig, init: Params | None, judge_aware: jax.Array):
    n, nj = table.n_models, table.n_judges
    dtype = jnp.result_type(table.wins.dtype, jnp.float32)
    basis = reduced_basis(n, nj, config, dtype)
    alpha_cols = jnp.zeros(basis.shape[1], bool).at[n - 1:n - 1 + max(nj - 1, 0)].set(nj > 1)
    if init is None:
        x = jnp.concatenate([jnp.zeros(n + nj, dtype), initial_tie(table, config.tie_model, dtype)[None]])
        stage_one, always = alpha_cols, ~judge_aware
    else:
        x = flatten(init).astype(dtype)
        x = x.at[n:n + nj].set(jnp.where(judge_aware, x[n:n + nj], 0.0))
        stage_one, always = alpha_cols & ~judge_aware, ~judge_aware
    x, iters, dec, ok = _newton(x, table, config, basis, stage_one, always)
    basis = basis * jnp.where(alpha_cols & ~judge_aware, 0.0, 1.0)[None, :]
    f, g, h = derivatives(x, table, config)
    conv = Convergence(iterations=iters, converged=ok, decrement=dec,
                       grad_norm=jnp.max(jnp.abs(basis.T @ g)), objective=f, information=jnp.diagonal(h))
    return unflatten(x, n, nj), conv


# ----------------------------------------------------------------------------------------------
# Existence of the MLE (traceable; the host-side checks with messages are in data.py)
# ----------------------------------------------------------------------------------------------

# A parameter whose observed information per comparison falls below this has run to infinity.
DIVERGENCE_INFO = 1e-6


def strongly_connected(table: ComparisonTable) -> jax.Array:
    """Whether the "beat or tied" digraph (edge ``i -> j`` when ``i`` won or tied against ``j`` at
    least once) is strongly connected, bool []. This is the condition for finite maximum-likelihood
    scores of (plain) BTL (Ford, 1957; Hunter, 2004, Assumption 1): otherwise a group of models never
    loses to the rest and the scores separate without bound. Transitive closure by ``ceil(log2 N)``
    boolean squarings, O(N^3 log N); traceable (``jit``, ``vmap``). Models in no comparison make it
    False."""
    n = table.n_models
    fwd = (table.wins + table.ties) > 0
    bwd = (table.losses + table.ties) > 0
    flat = jnp.zeros(n * n, jnp.float32)
    flat = flat.at[table.i * n + table.j].max(fwd.astype(jnp.float32))
    flat = flat.at[table.j * n + table.i].max(bwd.astype(jnp.float32))
    reach = flat.reshape(n, n) + jnp.eye(n, dtype=jnp.float32) > 0
    for _ in range(max(1, (n - 1).bit_length())):
        r = reach.astype(jnp.float32)
        reach = (r @ r) > 0
    return jnp.all(reach)


def diverging(table: ComparisonTable, config: FitConfig, information: jax.Array):
    """Unpenalised parameters running to infinity, judged by the observed information at the fit.

    A parameter whose information per comparison it enters has collapsed below
    :data:`DIVERGENCE_INFO` has run far along a flat direction: a score or a discrimination whose
    comparisons have all become near-certain (``p (1 - p) -> 0``), a discrimination falling to 0
    (``d = gamma (s_i - s_j) -> 0``: its comparisons become coin flips and carry no information on
    ``alpha``), or a tie parameter with a tie probability at 0 or 1. Its MLE is at plus or minus
    infinity whatever the decrement test says (:func:`divergence_message` words which).
    Blocks with a ridge (a MAP with a finite optimum) are never flagged. Traceable.

    Args:
      table: the data.
      config: the fit's config.
      information: float [D], :attr:`Convergence.information`.

    Returns:
      (scores bool [N], log-discriminations bool [J], tie bool []).
    """
    n, nj = table.n_models, table.n_judges
    info = jnp.asarray(information)
    tot = table.totals
    per_model = (jax.ops.segment_sum(tot, table.i, n) + jax.ops.segment_sum(tot, table.j, n))
    per_judge = jax.ops.segment_sum(tot, table.judge, nj)
    bad = ~jnp.isfinite(info)
    flat_s = ((info[:n] < DIVERGENCE_INFO * jnp.maximum(per_model, 1.0)) | bad[:n]) & (
        config.ridge_scores <= 0)
    flat_a = ((info[n:n + nj] < DIVERGENCE_INFO * jnp.maximum(per_judge, 1.0)) | bad[n:n + nj]) & (
        config.ridge_alpha <= 0)
    if not (config.judge_aware and nj > 1):
        flat_a = jnp.zeros(nj, bool)
    if config.has_tie_param:
        flat_t = (info[-1] < DIVERGENCE_INFO * jnp.maximum(jnp.sum(tot), 1.0)) | bad[-1]
    else:
        flat_t = jnp.zeros((), bool)
    return flat_s, flat_a, flat_t


def mle_exists(table: ComparisonTable, config: FitConfig, information: jax.Array | None = None
               ) -> jax.Array:
    """Whether the (penalised) MLE of ``table`` exists, bool []; traceable, for data made inside
    ``jit`` (bootstrap replicates, simulated data) where :func:`algorithms.ranking.data.check_identifiable`
    cannot run.

    Checks the conditions of :func:`~algorithms.ranking.data.check_identifiable` that a resample can
    break: some decisive comparison; with a tie parameter, some ties and some decisive outcomes;
    without a ridge on the scores, a strongly connected "beat or tied" graph
    (:func:`strongly_connected`; with a ridge, a connected comparison graph); judge-aware without a
    ridge on ``alpha``, a decisive comparison by every judge. Given ``information`` (the fit's
    :attr:`Convergence.information`) it also requires that no parameter diverges (:func:`diverging`),
    which covers separation that the graph conditions miss (a judge agreeing with the fitted order
    in every comparison).
    """
    nj = table.n_judges
    decisive = jnp.sum(table.wins) + jnp.sum(table.losses)
    ok = decisive > 0
    if config.has_tie_param:
        ok &= jnp.sum(table.ties) > 0
    # With a ridge on the scores the graph need only be connected (undirected).
    sym = dataclasses.replace(table, wins=table.totals, losses=table.totals)
    connected = jnp.where(config.ridge_scores > 0, strongly_connected(sym), strongly_connected(table))
    ok &= connected
    if config.judge_aware and nj > 1:
        per_judge = jax.ops.segment_sum(table.wins + table.losses, table.judge, nj)
        ok &= (config.ridge_alpha > 0) | jnp.all(per_judge > 0)
    if information is not None:
        fs, fa, ft = diverging(table, config, information)
        ok &= ~(jnp.any(fs) | jnp.any(fa) | ft)
    return ok


def divergence_message(params: Params, scores, judges, tie: bool, model_names=None,
                       judge_names=None) -> str:
    """The error text for parameters that :func:`diverging` flags, worded by where each goes.

    The direction is read from the parameter's value where Newton stopped (far out along the
    flat direction): a score to ``+inf`` (the model wins every comparison under the fit) or
    ``-inf`` (loses every one); a judge's discrimination ``gamma_k`` to ``+inf`` (``alpha_k > 0``:
    every comparison the judge made agrees with the fitted order, so the fit makes them certain) or
    to 0 (``alpha_k < 0``: the judge's votes do not follow the fitted order, being independent of
    it or against it, and the fit makes its comparisons coin flips, ``P = 1/2``; since
    ``sum alpha = 0`` the other judges' ``gamma`` rise to match); the tie parameter to ``+inf``
    (every comparison a tie) or ``-inf`` (ties impossible).

    Args:
      params: the parameters where the fit stopped (host or device arrays).
      scores, judges: int [*], indices of the flagged models and judges.
      tie: whether the tie parameter is flagged.
      model_names, judge_names: names for the message (default: the indices).

    Returns:
      str, one sentence per group, then the remedy.
    """
    import numpy as np

    from algorithms.ranking.data import _names

    s, a = np.asarray(params.scores), np.asarray(params.log_discrimination)
    scores, judges = np.asarray(scores, int), np.asarray(judges, int)
    parts = []

    def group(idx, values, names, up, down, what):
        v = values[idx]
        for sel, text in ((v > 0, up), (v < 0, down),
                          (~(v > 0) & ~(v < 0), "have a vanishing or non-finite information")):
            if np.any(sel):
                at = ", ".join(f"{x:+.3g}" for x in v[sel][:8]) + (", ..." if np.sum(sel) > 8 else "")
                parts.append(f"{what} {_names(idx[sel], names)} (at {at} where the fit stopped) {text}")

    group(scores, s, model_names, "run to +inf: under the fit these models win every comparison",
          "run to -inf: under the fit these models lose every comparison", "scores of models")
    group(judges, a, judge_names,
          "run to +inf: the discrimination gamma grows without bound, every comparison these judges "
          "made agrees with the fitted order and the fit makes each of them certain",
          "run to -inf: the discrimination gamma falls to 0, these judges' votes do not follow the "
          "fitted order (independent of it or against it) and the fit makes their comparisons coin "
          "flips (P = 1/2)", "log-discriminations alpha of judges")
    if tie:
        tau = float(np.asarray(params.tie))
        parts.append(f"the tie parameter tau (at {tau:+.3g}) runs to "
                     + ("+inf: every comparison becomes a tie" if tau > 0 else
                        "-inf: ties become impossible" if tau < 0 else
                        "an infinite value (vanishing or non-finite information)"))
    remedy = []
    if judges.size:
        remedy.append("ridge_alpha > 0 (a Gaussian prior on the log-discriminations)")
    if scores.size:
        remedy.append("ridge_scores > 0 (a Gaussian prior on the scores)")
    return ("the fit diverges (the MLE is at infinity): " + "; ".join(parts)
            + (f"; set {' and '.join(remedy)} for a finite MAP fit" if remedy else
               "; the data do not identify the tie parameter"))


# ----------------------------------------------------------------------------------------------
# Checked entry point
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FitResult:
    """Output of :func:`fit`: parameters, convergence report, and what produced them."""

    params: Params
    convergence: Convergence
    config: FitConfig
    table: ComparisonTable


def fit(table: ComparisonTable, config: FitConfig = FitConfig(), *, init: Params | None = None,
        precision: str = "float64", model_names=None, judge_names=None) -> FitResult:
    """Checks identifiability, then fits (maximum likelihood, or MAP with ridges) by Newton's method.

    Args:
      table: aggregated comparisons (:func:`algorithms.ranking.data.aggregate`).
      config: the model and solver settings.
      init: optional starting point (e.g. a previous fit).
      precision: ``"float64"`` (default; enables 64-bit JAX for this call only) or ``"float32"``.
      model_names, judge_names: used in error messages only.

    Returns:
      :class:`FitResult`; its arrays are in the requested precision.

    Raises:
      ValueError: the data do not identify the model (see
        :func:`algorithms.ranking.data.check_identifiable`), or the fit diverges: a parameter whose
        MLE is at plus or minus infinity (:func:`diverging`), e.g. a judge whose every comparison
        agrees with the fitted order (discrimination to infinity) or whose votes do not follow it
        (discrimination to 0); the message (:func:`divergence_message`) names each, says which way
        it goes and what that does to its comparisons, and suggests a ridge.
    """
    import warnings

    import numpy as np

    from algorithms.ranking.data import check_identifiable

    if precision not in ("float64", "float32"):
        raise ValueError(f"precision={precision!r}; expected 'float64' or 'float32'")
    check_identifiable(table, judge_aware=config.judge_aware, ridge_scores=config.ridge_scores,
                       ridge_alpha=config.ridge_alpha, tie_model=config.tie_model,
                       model_names=model_names, judge_names=judge_names)
    with jax.enable_x64(precision == "float64"):
        t = table.astype(np.float64 if precision == "float64" else np.float32)
        params, conv = solve(t, config, init)
        flat_s, flat_a, flat_t = (np.asarray(a) for a in diverging(t, config, conv.information))
        params, conv = jax.device_get(params), jax.device_get(conv)
    flat_s, flat_a = np.flatnonzero(flat_s), np.flatnonzero(flat_a)
    if flat_s.size or flat_a.size or bool(flat_t):
        raise ValueError(divergence_message(params, flat_s, flat_a, bool(flat_t), model_names,
                                            judge_names))
    if not bool(conv.converged):
        warnings.warn(f"judge-aware BTL fit did not converge in {int(conv.iterations)} iterations "
                      f"(Newton decrement {float(conv.decrement):.3g}, tol {config.tol:g})",
                      RuntimeWarning, stacklevel=2)
    return FitResult(params=params, convergence=conv, config=config, table=table)
