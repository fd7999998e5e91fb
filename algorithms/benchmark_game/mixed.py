"""Mixed Nash equilibria of two-player games: support and vertex enumeration, and strict dominance.

On a finite effort grid a mixed equilibrium always exists (Nash, 1951) even when the pure one does
not. For two providers we compute them with the two exact algorithms of von Stengel, "Equilibrium
computation for two-player games" (in Nisan et al., "Algorithmic Game Theory", 2007, ch. 3):

* Support enumeration (ch. 3, Algorithm 3.4; ``nashpy.Game.support_enumeration``): for every pair of
  supports ``(S, T)`` of equal size solve the indifference equations

      (A y)_i = u  for i in S,   y_j = 0 for j not in T,   sum_j y_j = 1,
      (x^T B)_j = w for j in T,   x_i = 0 for i not in S,   sum_i x_i = 1,

  and keep the solutions that are probability vectors with exactly those supports and whose support
  strategies are best responses. Complete for nondegenerate games only.
* Vertex enumeration (ch. 3, Algorithm 3.5; ``nashpy.Game.vertex_enumeration``): with payoffs made
  positive, the best-response polytopes are ``P = {x >= 0 : B^T x <= 1}`` and
  ``Q = {y >= 0 : A y <= 1}``. Label ``i`` (``i < m``) marks ``x_i = 0`` in P and ``(A y)_i = 1`` in
  Q; label ``m + j`` marks ``(B^T x)_j = 1`` in P and ``y_j = 0`` in Q. A pair of nonzero vertices
  whose labels together cover all ``m + n`` is an equilibrium after normalising ``(x, y)`` to
  probabilities (Theorem 3.7), and in a degenerate game every extreme equilibrium is such a pair.

:func:`nash_equilibria` returns the union of both, each candidate verified by its regrets in
float64 on the original payoffs. Both algorithms solve their small linear systems for every support
pair / constraint subset at once with ``vmap``, in float64 (scoped ``jax.enable_x64``). Equilibria do
not change when a player's payoffs are scaled by a positive constant or shifted (the best responses
are the same), so each player's payoffs are first mapped affinely onto ``[1, 2]``; the tolerances then
act on that unit scale and the result does not depend on the payoff scale.

Dimension legend: m row strategies, n column strategies, P support pairs of equal size
(``binomial(m + n, m) - 1``), R constraint subsets of size m (``binomial(m + n, m)``), Q distinct
equilibria.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Tolerance on the unit payoff scale (payoffs mapped onto [1, 2]) for probabilities, indifference,
# best responses and tight constraints. float64 solutions of these well-scaled systems are accurate to
# ~1e-13; 1e-9 separates round-off from genuine slack.
TOL = 1e-9
# Largest game enumerated (m + n strategies): both algorithms solve binomial(m + n, m) systems.
MAX_STRATEGIES = 20


def _support_masks(k: int) -> np.ndarray:
    """All non-empty subsets of ``range(k)`` as bool masks [2**k - 1, k]."""
    bits = (np.arange(1, 2 ** k)[:, None] >> np.arange(k)[None, :]) & 1
    return bits.astype(bool)


def support_pairs(m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column support masks of every pair of equal size: ([P, m], [P, n]) bool."""
    rows, cols = _support_masks(m), _support_masks(n)
    rs, cs = rows.sum(1), cols.sum(1)
    ri, ci = np.nonzero(rs[:, None] == cs[None, :])
    return rows[ri], cols[ci]


def solve_small(M: jax.Array, v: jax.Array) -> jax.Array:
    """Solves ``M z = v`` for one small square system by Gauss-Jordan elimination with partial
    pivoting, in plain ``jnp`` (unrolled over the static size; vmap it for batches).

    Args:
      M: [k, k] float; v: [k] float (k up to a few tens: the loop is unrolled).

    Returns:
      z: [k], same dtype. A singular ``M`` gives non-finite entries (a zero pivot divides by zero),
      which callers detect with ``isfinite``.

    Used instead of ``jnp.linalg.solve`` because the LAPACK custom call it lowers to, batched over
    thousands of support pairs inside this program, deadlocked sporadically on XLA:CPU (jaxlib
    0.10.2: the host waited forever on a result while every worker thread was idle).
    """
    k = M.shape[0]
    aug = jnp.concatenate([M, v[:, None]], axis=1)  # [k, k + 1]
    idx = jnp.arange(k)
    for j in range(k):
        p = jnp.argmax(jnp.where(idx >= j, jnp.abs(aug[:, j]), -1.0))  # pivot row among j..k-1
        row_j, row_p = aug[j], aug[p]
        aug = aug.at[j].set(row_p).at[p].set(row_j)
        pivot = aug[j] / aug[j, j]
        factors = aug[:, j].at[j].set(0.0)
        aug = (aug - factors[:, None] * pivot[None, :]).at[j].set(pivot)
    return aug[:, k]


def _check_game(A, B) -> tuple[np.ndarray, np.ndarray]:
    """Validated float64 copies of the bimatrix ``(A, B)``."""
    A = np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)
    if A.ndim != 2 or A.shape != B.shape or min(A.shape) < 1:
        raise ValueError(f"A and B must be 2-D of the same shape, got {A.shape} and {B.shape}")
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
        raise ValueError("payoffs must be finite: A or B holds NaN or inf")
    if A.shape[0] + A.shape[1] > MAX_STRATEGIES:
        raise ValueError(f"enumeration over {A.shape} strategies is too large (exponential: "
                         f"binomial(m + n, m) systems; at most {MAX_STRATEGIES} strategies in all); "
                         "eliminate dominated strategies or coarsen the grid")
    return A, B


def unit_scale(payoffs: np.ndarray) -> np.ndarray:
    """Maps one player's payoffs [m, n] affinely onto ``[1, 2]`` (a constant matrix onto 1).

    The map is a positive scale plus a shift, so every best response, and hence every equilibrium,
    is unchanged; afterwards payoffs are positive, as vertex enumeration needs, and of unit size."""
    lo, hi = float(payoffs.min()), float(payoffs.max())
    if hi - lo <= 0.0:
        return np.ones_like(payoffs)
    return 1.0 + (payoffs - lo) / (hi - lo)


def regrets(A, B, x, y) -> tuple[float, float]:
    """Regrets of the profile ``(x, y)``: how much each player gains by its best pure deviation,
    ``max_i (A y)_i - x^T A y`` and ``max_j (x^T B)_j - x^T B y`` (float64, payoff units).
    ``(x, y)`` is a Nash equilibrium iff both are 0."""
    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.max(A @ y) - x @ A @ y), float(np.max(x @ B) - x @ B @ y)


def is_equilibrium(A, B, x, y, tol: float = 1e-7) -> bool:
    """Whether ``(x, y)`` are probability vectors with both regrets at most ``tol`` times the
    player's payoff range (a scale-free test, float64)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if np.any(x < -tol) or np.any(y < -tol) or abs(x.sum() - 1) > tol or abs(y.sum() - 1) > tol:
        return False
    ra, rb = regrets(A, B, x, y)
    span_a = max(float(np.ptp(A)), np.finfo(np.float64).tiny)
    span_b = max(float(np.ptp(B)), np.finfo(np.float64).tiny)
    return ra <= tol * span_a and rb <= tol * span_b


# ------------------------------------------------------------------ support enumeration


def _indifferent_mix(A: jax.Array, rows: jax.Array, cols: jax.Array):
    """The mix ``y`` [n] on ``cols`` making the row player indifferent on ``rows`` (|rows| = |cols|),
    and the common value ``u``. Solves the masked (n + 1)-square system; rows are selected by a stable
    sort so that shapes stay static under vmap."""
    m, n = A.shape
    eq_indiff = jnp.concatenate([A, -jnp.ones((m, 1), A.dtype)], axis=1)  # [m, n+1]: A_i y - u = 0
    eq_zero = jnp.concatenate([jnp.eye(n, dtype=A.dtype), jnp.zeros((n, 1), A.dtype)], axis=1)
    eq_sum = jnp.concatenate([jnp.ones((1, n), A.dtype), jnp.zeros((1, 1), A.dtype)], axis=1)
    system = jnp.concatenate([eq_indiff, eq_zero, eq_sum], axis=0)  # [m + n + 1, n + 1]
    rhs = jnp.zeros(m + n + 1, A.dtype).at[-1].set(1.0)
    active = jnp.concatenate([rows, ~cols, jnp.ones(1, bool)])
    take = jnp.argsort(~active, stable=True)[: n + 1]  # exactly n + 1 active rows, in order
    z = solve_small(system[take], rhs[take])
    return z[:n], z[n]


class MixedEquilibria(NamedTuple):
    """Support-enumeration candidates, one per support pair (leading axis P).

    Attributes:
      row: [P, m] f64 row player's mixed strategy (garbage where ``valid`` is False).
      col: [P, n] f64 column player's mixed strategy.
      valid: [P] bool the pair is a Nash equilibrium with exactly these supports.
      row_value: [P] f64 row player's expected payoff (in the original payoff units);
      col_value: [P] f64 column player's.
    """

    row: np.ndarray
    col: np.ndarray
    valid: np.ndarray
    row_value: np.ndarray
    col_value: np.ndarray


@functools.partial(jax.jit, static_argnames=("tol",))
def _enumerate_supports(A, B, row_masks, col_masks, tol: float):
    def one(rows, cols):
        y, u = _indifferent_mix(A, rows, cols)
        x, w = _indifferent_mix(B.T, cols, rows)
        finite = jnp.all(jnp.isfinite(x)) & jnp.all(jnp.isfinite(y))
        on_support = jnp.all(jnp.where(rows, x > tol, jnp.abs(x) <= tol))
        on_support &= jnp.all(jnp.where(cols, y > tol, jnp.abs(y) <= tol))
        row_pay, col_pay = A @ y, x @ B
        best = (jnp.max(row_pay) <= u + tol) & (jnp.max(col_pay) <= w + tol)
        indiff = jnp.all(jnp.where(rows, jnp.abs(row_pay - u) <= tol, True))
        indiff &= jnp.all(jnp.where(cols, jnp.abs(col_pay - w) <= tol, True))
        ok = finite & on_support & best & indiff
        return jnp.where(rows, x, 0.0), jnp.where(cols, y, 0.0), ok  # exact zeros off support

    return jax.vmap(one)(row_masks, col_masks)


def support_enumeration(A, B, tol: float = TOL) -> MixedEquilibria:
    """All mixed Nash equilibria of the bimatrix game ``(A, B)`` with supports of equal size
    (von Stengel 2007, Algorithm 3.4), computed in float64.

    Args:
      A: [m, n] row player's payoffs; B: [m, n] column player's payoffs (finite, any scale).
      tol: tolerance for probabilities, indifference and best responses on the unit payoff scale
        (each player's payoffs mapped onto [1, 2]), so the result does not depend on the scale.

    Returns:
      :class:`MixedEquilibria` over all ``P`` equal-size support pairs; :func:`distinct` extracts
      the valid ones. In a nondegenerate game this is every equilibrium; in a degenerate game
      (e.g. tied payoffs) equilibria with unequal supports may be missed, as in ``nashpy``'s default:
      use :func:`nash_equilibria`, which adds vertex enumeration.

    Raises:
      ValueError: shapes differ, are not 2-D, or payoffs are not finite; more than
        ``MAX_STRATEGIES`` strategies in all (``binomial(m + n, m)`` systems).
    """
    A, B = _check_game(A, B)
    rows, cols = support_pairs(*A.shape)
    with jax.enable_x64(True):
        x, y, valid = _enumerate_supports(jnp.asarray(unit_scale(A)), jnp.asarray(unit_scale(B)),
                                          jnp.asarray(rows), jnp.asarray(cols), float(tol))
        x, y, valid = np.asarray(x), np.asarray(y), np.asarray(valid)
    return MixedEquilibria(x, y, valid, np.einsum("pm,mn,pn->p", x, A, y),
                           np.einsum("pm,mn,pn->p", x, B, y))


def distinct(eq: MixedEquilibria) -> list[tuple[np.ndarray, np.ndarray]]:
    """The valid equilibria as ``[(x [m], y [n]), ...]`` float64, duplicates removed, in
    support-enumeration order."""
    return _dedupe([(x, y) for x, y, ok in zip(eq.row, eq.col, eq.valid, strict=True) if ok])


def _unique_rows(Z: np.ndarray, atol: float) -> np.ndarray:
    """Indices of the first row of each group of rows of ``Z`` [R, d] equal to within ``atol`` (max
    norm), in order. (Rounding to a grid would split near-equal rows that straddle a cell edge.)"""
    keep: list[int] = []
    for i, z in enumerate(Z):
        if not keep or np.min(np.max(np.abs(Z[keep] - z), axis=1)) > atol:
            keep.append(i)
    return np.asarray(keep, np.int64)


def _dedupe(pairs: list, atol: float = 1e-7) -> list[tuple[np.ndarray, np.ndarray]]:
    """Distinct ``(x, y)`` pairs (max-norm distance above ``atol``), first occurrence kept."""
    if not pairs:
        return []
    Z = np.stack([np.concatenate([x, y]) for x, y in pairs]).astype(np.float64)
    return [(np.asarray(pairs[i][0], np.float64), np.asarray(pairs[i][1], np.float64))
            for i in _unique_rows(Z, atol)]


# ------------------------------------------------------------------ vertex enumeration


@functools.partial(jax.jit, static_argnames=("tol",))
def _polytope_vertices(C: jax.Array, subsets: jax.Array, tol: float):
    """Vertices of ``{z >= 0 : C^T z <= 1}`` for C [k, l] (k = dim): for each subset [R, k] of the
    ``k + l`` constraints solve them as equalities; return (z [R, k], labels [R, k + l] bool: tight
    constraints, ok [R] bool: a finite, feasible, nonzero point)."""
    k, l = C.shape
    # Constraint rows over z: z_i >= 0 (labels 0..k-1), (C^T z)_j <= 1 (labels k..k+l-1).
    G = jnp.concatenate([jnp.eye(k, dtype=C.dtype), C.T], axis=0)  # [k + l, k]
    h = jnp.concatenate([jnp.zeros(k, C.dtype), jnp.ones(l, C.dtype)])  # [k + l]

    def one(subset):
        z = solve_small(G[subset], h[subset])
        finite = jnp.all(jnp.isfinite(z))
        slack = jnp.concatenate([z, 1.0 - C.T @ z])  # >= 0 when feasible
        feasible = jnp.all(slack >= -tol)
        nonzero = jnp.any(z > tol)
        return z, jnp.abs(slack) <= tol, finite & feasible & nonzero

    return jax.vmap(one)(subsets)


def _vertices(C: np.ndarray, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Distinct nonzero vertices of ``{z >= 0 : C^T z <= 1}`` and their label bitmasks."""
    k, l = C.shape
    subsets = np.asarray(list(itertools.combinations(range(k + l), k)), np.int32)
    with jax.enable_x64(True):
        z, tight, ok = _polytope_vertices(jnp.asarray(C), jnp.asarray(subsets), float(tol))
        ok = np.asarray(ok)
        z, tight = np.asarray(z)[ok], np.asarray(tight)[ok]
    first = _unique_rows(z, 1e3 * tol)  # a degenerate vertex solves several subsets
    z, tight = np.where(np.abs(z[first]) <= tol, 0.0, z[first]), tight[first]
    masks = (tight.astype(np.int64) << np.arange(k + l, dtype=np.int64)).sum(axis=1)
    return z, masks


def vertex_enumeration(A, B, tol: float = TOL) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every extreme Nash equilibrium of ``(A, B)`` by vertex enumeration of the best-response
    polytopes (von Stengel 2007, Algorithm 3.5 and Theorem 3.7), degenerate games included.

    Args:
      A, B: [m, n] payoffs of the row and column player (finite, any scale).
      tol: tolerance for feasibility and tight constraints on the unit payoff scale.

    Returns:
      ``[(x [m], y [n]), ...]`` float64 probability vectors, duplicates removed. A continuum of
      equilibria (degenerate games) is represented by its extreme points.

    Raises:
      ValueError: as :func:`support_enumeration`.
    """
    A, B = _check_game(A, B)
    m, n = A.shape
    xs, lx = _vertices(unit_scale(B), tol)  # P: labels i (x_i = 0), m + j ((B^T x)_j = 1)
    ys, ly = _vertices(unit_scale(A).T, tol)  # Q over y: labels j (y_j = 0), n + i ((A y)_i = 1)
    # Relabel Q into the common numbering: (A y)_i = 1 -> i, y_j = 0 -> m + j.
    ly = ((ly >> n) & ((1 << m) - 1)) | ((ly & ((1 << n) - 1)) << m)
    full = (1 << (m + n)) - 1
    ix, iy = np.nonzero((lx[:, None] | ly[None, :]) == full)
    return _dedupe([(xs[i] / xs[i].sum(), ys[j] / ys[j].sum()) for i, j in zip(ix, iy, strict=True)])


def nash_equilibria(A, B, tol: float = TOL) -> list[tuple[np.ndarray, np.ndarray]]:
    """The Nash equilibria of ``(A, B)`` found by vertex enumeration and by support enumeration,
    each verified by its float64 regrets (:func:`is_equilibrium`), duplicates removed.

    This is every equilibrium of a nondegenerate game and every extreme equilibrium of a degenerate
    one (von Stengel 2007, ch. 3), on any payoff scale and on any processor.

    Args:
      A, B: [m, n] payoffs of the row and column player (finite).
      tol: enumeration tolerance on the unit payoff scale.

    Returns:
      ``[(x [m], y [n]), ...]`` float64 probability vectors, vertex-enumeration order first.

    Raises:
      ValueError: as :func:`support_enumeration`.
    """
    candidates = vertex_enumeration(A, B, tol) + distinct(support_enumeration(A, B, tol))
    return _dedupe([(x, y) for x, y in candidates if is_equilibrium(A, B, x, y)])


@jax.jit
def strictly_dominated(A: jax.Array) -> jax.Array:
    """Row strategies of ``A`` [m, n] strictly dominated by another pure row: [m] bool.

    ``i`` is dominated iff some ``k`` has ``A[k, j] > A[i, j]`` for every column ``j``. (For the
    column player pass ``B.T``.) A strictly dominated strategy is never in an equilibrium support.
    """
    better = jnp.all(A[:, None, :] > A[None, :, :], axis=-1)  # [k, i]: k dominates i
    return jnp.any(better, axis=0)


def contest_bimatrix(payoffs: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """Splits a two-player payoff tensor [2, M, M] into the bimatrix ``(A, B)``, both [M, M]."""
    if payoffs.ndim != 3 or payoffs.shape[0] != 2:
        raise ValueError(f"expected a two-player payoff tensor [2, M, M], got {payoffs.shape}")
    return np.asarray(payoffs[0]), np.asarray(payoffs[1])


__all__ = [
    "MAX_STRATEGIES", "MixedEquilibria", "TOL", "contest_bimatrix", "distinct", "is_equilibrium",
    "nash_equilibria", "regrets", "solve_small", "strictly_dominated", "support_enumeration",
    "support_pairs", "unit_scale", "vertex_enumeration",
]
