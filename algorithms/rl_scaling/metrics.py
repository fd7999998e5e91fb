"""Evaluation metrics: unbiased pass@k, coverage, and interference across problems.

Dimensions: N problems, G groups (problems in one batch), D flattened parameter count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def pass_at_k(num_samples: jax.Array, num_correct: jax.Array, k: int) -> jax.Array:
    """Unbiased pass@k from c correct out of n samples per problem (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", Eq. 1): 1 - C(n - c, k) / C(n, k).

    Computed with the product form C(n - c, k) / C(n, k) = prod_{i=0}^{k-1} (1 - c / (n - i)) as
    ``-expm1(sum_i log1p(-c / (n - i)))``: every factor lies in [0, 1], so the result lies in [0, 1]
    and keeps its relative accuracy when pass@k is small (no cancellation of large log-gamma
    values). Exactly 1 when n - c < k and exactly 0 when c = 0. Computed in float32, or float64 under
    ``jax.enable_x64``; the relative error is about ``k`` float units.

    Args:
      num_samples: int [N] (or scalar) n >= k.
      num_correct: int [N] c in [0, n].
      k: static int >= 1.

    Returns:
      float [N] in [0, 1] (float32, float64 under ``jax.enable_x64``).

    Raises:
      ValueError: k not an int >= 1, or (for concrete inputs) k > n or c outside [0, n].
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"pass_at_k: k={k!r} must be an int >= 1")
    k = int(k)
    n = jnp.asarray(num_samples)
    c = jnp.asarray(num_correct)
    if n.ndim and c.ndim and n.shape != c.shape:
        raise ValueError(f"pass_at_k: num_correct must have the shape of num_samples "
                         f"{tuple(n.shape)}, got shape {tuple(c.shape)}")
    if not isinstance(n, jax.core.Tracer) and bool(jnp.any(n < k)):
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={n} (need k <= n)")
    if not isinstance(c, jax.core.Tracer) and not isinstance(n, jax.core.Tracer) and bool(
            jnp.any((c < 0) | (c > n))):
        raise ValueError(f"pass_at_k: correct counts {c} outside [0, n={n}]")
    ft = jnp.result_type(float)
    n, c = jnp.broadcast_arrays(n.astype(ft), c.astype(ft))
    fail = n - c
    # Factor i of the product: 1 - c / (n - i), i = 0..k-1 (all > 0 when n - c >= k).
    i = jnp.arange(k, dtype=ft)
    ok = fail >= k
    ratio = jnp.where(ok[..., None], c[..., None] / jnp.maximum(n[..., None] - i, 1.0), 0.0)
    # (0.0 - x turns the -0.0 of c = 0 into 0.0.)
    return jnp.where(ok, 0.0 - jnp.expm1(jnp.sum(jnp.log1p(-ratio), axis=-1)), 1.0)


def expected_pass_at_k(p: jax.Array, k: int | jax.Array) -> jax.Array:
    """pass@k of independent samples with per-problem success probability p: 1 - (1 - p)^k.

    With an exact-match reward there is one correct completion, so p is its probability under the
    policy and this is the exact expectation that :func:`pass_at_k` estimates.
    """
    return 1.0 - (1.0 - jnp.clip(p, 0.0, 1.0)) ** k


def fraction_fallen(before: jax.Array, after: jax.Array, valid: jax.Array,
                    tol: float = 0.0) -> jax.Array:
    """Share of valid problems whose pass rate fell by more than ``tol`` after an update (the
    interference measure of the IsoCompute paper, Sec. 5). Scalars [G] in, float32 out."""
    validf = valid.astype(jnp.float32)
    fell = (after < before - tol).astype(jnp.float32)
    return (fell * validf).sum() / jnp.maximum(validf.sum(), 1.0)


def mean_pairwise_cosine(grads: jax.Array, eps: float = 1e-12) -> tuple[jax.Array, jax.Array]:
    """Mean cosine similarity between distinct rows of ``grads`` [G, D] (per-problem gradients).

    Rows with zero norm (problems whose rollouts all got the same reward carry no GRPO signal) are
    excluded. Returns (mean cosine over the pairs of non-zero rows (0 if fewer than 2), number of
    such pairs).
    """
    norms = jnp.linalg.norm(grads, axis=1)
    nonzero = norms > eps
    unit = grads / jnp.maximum(norms, eps)[:, None]
    cos = unit @ unit.T
    g = grads.shape[0]
    pair = nonzero[:, None] & nonzero[None, :] & ~jnp.eye(g, dtype=bool)
    count = pair.sum()
    return jnp.where(count > 0, (cos * pair).sum() / jnp.maximum(count, 1), 0.0), count
