"""EntroKV: per-head KV-cache budgets from attention entropy, with SnapKV-style selection.

Dimensions: B batch, N heads being budgeted (e.g. layers x kv heads, flattened), W observation
queries (the last ``window`` prompt tokens), P prompt tokens (keys), G query heads per kv head.

EntroKV (ICML 2026): a head whose attention is spread out (high entropy) needs more cache than a head
that looks at a few tokens. For each head, the attention of the last W prompt queries over the
prompt gives a normalised entropy ``H = mean_q entropy(p_q) / log(n_q)`` in [0, 1] (n_q = keys query
q may see); the score is the blend ``s = (1 - alpha) * H_bar + alpha * H`` with a prior ``H_bar``;
the total budget is split in proportion to s, exactly, with at least ``min_budget`` and at most P
per head. Tokens are then chosen per head as in SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You
Are Looking for Before Generation", Sec. 4): the observation window's attention summed over its
queries (the "vote"), smoothed by 1-D max pooling, top-budget per head, the window itself always
kept. The baseline "uniform" gives every head the same budget (SnapKV).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from kernels import checks


@dataclasses.dataclass(frozen=True)
class EntroKVConfig:
    """Hyper-parameters (hashable).

    Attributes:
      window: W observation queries (the last prompt tokens); always kept.
      alpha: weight of the measured entropy in the blend, in [0, 1].
      prior: H_bar, the prior normalised entropy, in [0, 1].
      pool: max-pooling kernel width (odd) over the vote.
      min_budget: the least slots per head (>= 1).
    """

    window: int = 32
    alpha: float = 0.5
    prior: float = 0.3
    pool: int = 7
    min_budget: int = 1

    def __post_init__(self):
        for name in ("window", "pool", "min_budget"):
            checks.integer(getattr(self, name), name, "EntroKVConfig", minimum=1)
        for name in ("alpha", "prior"):
            checks.number(getattr(self, name), name, "EntroKVConfig", minimum=0.0, maximum=1.0)
        if self.window < 1:
            raise ValueError(f"EntroKVConfig: window={self.window} must be >= 1")
        if not 0.0 <= self.alpha <= 1.0 or not 0.0 <= self.prior <= 1.0:
            raise ValueError(f"EntroKVConfig: alpha={self.alpha} and prior={self.prior} must be in "
                             "[0, 1]")
        if self.pool < 1 or self.pool % 2 == 0:
            raise ValueError(f"EntroKVConfig: pool={self.pool} must be a positive odd width")
        if self.min_budget < 1:
            raise ValueError(f"EntroKVConfig: min_budget={self.min_budget} must be >= 1")


def normalized_entropy(probs: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean over queries of ``entropy(p_q) / log(n_q)`` per head.

    Args:
      probs: float [..., W, P] attention rows (zero where not valid, rows sum to 1).
      valid: bool broadcastable to ``probs``: keys each query may see.

    Returns:
      float32 [...] in [0, 1] (a query seeing a single key counts as entropy 0).
    """
    p = probs.astype(jnp.float32)
    ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)
    n = jnp.sum(jnp.broadcast_to(valid, p.shape), axis=-1).astype(jnp.float32)
    norm = jnp.where(n > 1, ent / jnp.log(jnp.maximum(n, 2.0)), 0.0)
    return jnp.clip(jnp.mean(norm, axis=-1), 0.0, 1.0)


def blend_scores(entropy: jax.Array, cfg: EntroKVConfig) -> jax.Array:
    """``s = (1 - alpha) * H_bar + alpha * H`` (float32, same shape as ``entropy``)."""
    return (1.0 - cfg.alpha) * cfg.prior + cfg.alpha * entropy.astype(jnp.float32)


def _check_total(total: int, num_heads: int, min_budget: int, capacity: int) -> None:
    if total < num_heads * min_budget:
        raise ValueError(f"allocate_budgets: total={total} is below num_heads * min_budget = "
                         f"{num_heads} * {min_budget}")
    if total > num_heads * capacity:
        raise ValueError(f"allocate_budgets: total={total} exceeds num_heads * capacity = "
                         f"{num_heads} * {capacity}")


@functools.partial(jax.jit, static_argnames=("total", "min_budget", "capacity"))
def _allocate(scores, total, min_budget, capacity):
    s = jnp.maximum(scores.astype(jnp.float32), 1e-12)
    n = s.shape[0]

    def filled(lam):
        return jnp.sum(jnp.clip(lam * s, min_budget, capacity))

    lo, hi = jnp.float32(0.0), jnp.float32(capacity) / jnp.min(s)

    def bisect(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        under = filled(mid) < total
        return jnp.where(under, mid, lo), jnp.where(under, hi, mid)

    lo, hi = jax.lax.fori_loop(0, 60, bisect, (lo, hi))
    x = jnp.clip(hi * s, min_budget, capacity)
    b = jnp.clip(jnp.floor(x), min_budget, capacity).astype(jnp.int32)

    # Exact total: hand out (or take back) one slot at a time, largest shortfall first.
    def cond(b):
        return jnp.sum(b) != total

    def body(b):
        short = jnp.sum(b) < total
        gap = jnp.where(short, x - b, b - x)
        room = jnp.where(short, b < capacity, b > min_budget)
        i = jnp.argmax(jnp.where(room, gap, -jnp.inf))
        return b.at[i].add(jnp.where(short, 1, -1))

    del n
    return jax.lax.while_loop(cond, body, b)


def allocate_budgets(scores: jax.Array, total: int, min_budget: int = 1,
                     capacity: int | None = None) -> jax.Array:
    """Integer budgets proportional to ``scores`` that sum exactly to ``total``.

    Solves ``sum_h clip(lambda * s_h, min_budget, capacity) = total`` for lambda (bisection), floors,
    then moves single slots by largest fractional shortfall until the sum is exact (largest-remainder
    rounding with bounds).

    Args:
      scores: float [N] > 0 (non-positive entries are treated as tiny).
      total: the budget to split (static).
      min_budget: least slots per head (static).
      capacity: most slots per head (static; default ``total``).

    Returns:
      int32 [N] with ``sum == total`` and ``min_budget <= b <= capacity``.

    Raises:
      ValueError: ``scores`` not a float vector [N] with N >= 1; ``total < N * min_budget`` or
        ``total > N * capacity``.
    """
    checks.array(scores, "scores", "allocate_budgets", ndim=1, kind="real", nonempty=True)
    n = scores.shape[0]
    capacity = total if capacity is None else capacity
    _check_total(total, n, min_budget, capacity)
    return _allocate(scores, total, min_budget, capacity)


def uniform_budgets(num_heads: int, total: int, capacity: int | None = None) -> jax.Array:
    """The SnapKV baseline: ``total`` split as evenly as possible (int32 [N], exact sum).

    Raises:
      ValueError: ``num_heads`` not an int >= 1, or as :func:`allocate_budgets`.
    """
    checks.integer(num_heads, "num_heads", "uniform_budgets", minimum=1)
    return allocate_budgets(jnp.ones((num_heads,), jnp.float32), total, 1, capacity)


def snapkv_votes(probs: jax.Array, window: int, pool: int) -> jax.Array:
    """SnapKV importance of each prompt key: attention of the last ``window`` queries summed over
    those queries (and over the ``G`` query heads of a kv head), max-pooled over ``pool`` positions.

    Args:
      probs: float [..., Wq, P] attention of the observation queries over the prompt.

    Returns:
      float32 [..., P]; the window's own keys get +inf: :func:`select_tokens` keeps them first,
      newest first, so a budget below the window keeps the most recent window tokens.
    """
    p = probs.shape[-1]
    vote = jnp.sum(probs.astype(jnp.float32), axis=-2)
    if pool > 1:
        pad = pool // 2
        padded = jnp.pad(vote, [(0, 0)] * (vote.ndim - 1) + [(pad, pad)], constant_values=-jnp.inf)
        vote = jax.lax.reduce_window(padded, -jnp.inf, jax.lax.max,
                                     (1,) * (vote.ndim - 1) + (pool,), (1,) * vote.ndim, "VALID")
    pos = jnp.arange(p)
    in_window = pos >= p - window
    # +inf, not 1e30 + position: in float32 1e30 + p is the same number for every p < 2^49
    return jnp.where(in_window, jnp.inf, vote)


def select_tokens(votes: jax.Array, budgets: jax.Array) -> jax.Array:
    """Keep mask: per head, the ``budgets[h]`` highest-vote tokens, exactly.

    Tokens are ranked by vote, then by an integer position key: among the always-kept tokens
    (vote +inf, the observation window) the newest first, among equal finite votes the oldest
    first. Sorting on the two keys (``lexsort``) keeps the order exact at any prompt length.

    Args:
      votes: float [..., N, P] (NaN not allowed); budgets: int [N] (broadcast over leading dims).

    Returns:
      bool [..., N, P] with ``sum(mask[..., h, :]) == min(budgets[h], P)``.
    """
    p = votes.shape[-1]
    pos = jnp.arange(p, dtype=jnp.int32)
    tie = jnp.where(jnp.isposinf(votes), -pos, pos)  # newest first inside the window
    order = jnp.lexsort((tie, -votes), axis=-1)  # last key is the primary one
    rank = jnp.argsort(order, axis=-1)
    return rank < budgets[:, None]


def observation_probs(q: jax.Array, k: jax.Array, window: int) -> tuple[jax.Array, jax.Array]:
    """Causal attention of the last ``window`` queries over all P keys, per kv head.

    Args:
      q: [B, H, P, D] queries (RoPE applied); k: [B, K, P, D] keys; H = G * K.

    Returns:
      (probs float32 [B, K, G, W, P], valid bool [W, P]).

    Raises:
      ValueError: window > P.
    """
    b, h, p, d = q.shape
    kh = k.shape[1]
    if window > p:
        raise ValueError(f"observation_probs: window={window} exceeds the prompt length {p}")
    qo = q[:, :, p - window:].reshape(b, kh, h // kh, window, d).astype(jnp.float32)
    s = jnp.einsum("bkgwd,bkpd->bkgwp", qo, k.astype(jnp.float32)) / math.sqrt(d)
    valid = jnp.arange(p)[None, :] <= (p - window + jnp.arange(window))[:, None]
    probs = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), axis=-1)
    return probs, valid


def head_entropy(probs: jax.Array, valid: jax.Array) -> jax.Array:
    """EntroKV's H per kv head: normalised entropy averaged over queries and the G query heads.

    probs [..., G, W, P] -> float32 [...]."""
    return jnp.mean(normalized_entropy(probs, valid), axis=-1)
