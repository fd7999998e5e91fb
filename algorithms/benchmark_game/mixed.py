"""Mixed Nash equilibria of two-player games by support enumeration, and strict dominance.

On a finite effort grid a mixed equilibrium always exists (Nash, 1951) even when the pure one does
not; for two providers we compute them all (for nondegenerate games) by support enumeration
(von Stengel, "Equilibrium computation for two-player games", in Nisan et al., "Algorithmic
Game Theory", 2007, ch. 3; the algorithm behind ``nashpy.Game.support_enumeration``): for every
pair of supports ``(S, T)`` of equal size solve the indifference equations

    (A y)_i = u  for i in S,   y_j = 0 for j not in T,   sum_j y_j = 1,
    (x^T B)_j = w for j in T,   x_i = 0 for i not in S,   sum_i x_i = 1,

and keep the solutions that are probability vectors with exactly those supports and whose support
strategies are best responses. Every support pair is solved at once with ``vmap`` on systems of
fixed size ``n + 1`` (resp. ``m + 1``) whose rows are selected by masks.

Dimension legend: m row strategies, n column strategies, P support pairs of equal size
(``binomial(m + n, m) - 1``), Q distinct equilibria.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


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
      row: [P, m] f32 row player's mixed strategy (garbage where ``valid`` is False).
      col: [P, n] f32 column player's mixed strategy.
      valid: [P] bool the pair is a Nash equilibrium with exactly these supports.
      row_value: [P] f32 row player's expected payoff; col_value: [P] f32 column player's.
    """

    row: jax.Array
    col: jax.Array
    valid: jax.Array
    row_value: jax.Array
    col_value: jax.Array


@functools.partial(jax.jit, static_argnames=("tol",))
def _enumerate(A, B, row_masks, col_masks, tol: float):
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
        return jnp.where(rows, x, 0.0), jnp.where(cols, y, 0.0), ok, u, w  # exact zeros off support

    return jax.vmap(one)(row_masks, col_masks)


def support_enumeration(A, B, tol: float = 1e-6) -> MixedEquilibria:
    """All mixed Nash equilibria of the bimatrix game ``(A, B)`` with supports of equal size.

    Args:
      A: [m, n] row player's payoffs; B: [m, n] column player's payoffs (finite).
      tol: tolerance for probabilities, indifference and best responses (payoff units).

    Returns:
      :class:`MixedEquilibria` over all ``P`` equal-size support pairs; :func:`distinct` extracts
      the valid ones. In a nondegenerate game this is every equilibrium; in a degenerate game
      (e.g. tied payoffs) equilibria with unequal supports or continua may be missed, as in
      ``nashpy``'s default.

    Raises:
      ValueError: shapes differ, are not 2-D, or payoffs are not finite; more than 20 strategies in all
        (the enumeration is exponential: ``binomial(m + n, m)`` systems).
    """
    A = np.asarray(A, np.float32)
    B = np.asarray(B, np.float32)
    if A.ndim != 2 or A.shape != B.shape or min(A.shape) < 1:
        raise ValueError(f"A and B must be 2-D of the same shape, got {A.shape} and {B.shape}")
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(B))):
        raise ValueError("payoffs must be finite")
    if A.shape[0] + A.shape[1] > 20:
        raise ValueError(f"support enumeration over {A.shape} strategies is too large "
                         "(exponential); eliminate dominated strategies or coarsen the grid")
    rows, cols = support_pairs(*A.shape)
    x, y, valid, u, w = _enumerate(jnp.asarray(A), jnp.asarray(B), jnp.asarray(rows),
                                   jnp.asarray(cols), float(tol))
    return MixedEquilibria(x, y, valid, u, w)


def distinct(eq: MixedEquilibria, decimals: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """The valid equilibria as ``[(x [m], y [n]), ...]`` float64, duplicates (to ``decimals``)
    removed, in support-enumeration order."""
    out, seen = [], set()
    for x, y, ok in zip(np.asarray(eq.row), np.asarray(eq.col), np.asarray(eq.valid),
                         strict=True):
        if not ok:
            continue
        key = tuple(np.round(np.concatenate([x, y]), decimals) + 0.0)
        if key not in seen:
            seen.add(key)
            out.append((x.astype(np.float64), y.astype(np.float64)))
    return out


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
    "MixedEquilibria", "support_enumeration", "distinct", "strictly_dominated", "support_pairs",
    "contest_bimatrix",
]
