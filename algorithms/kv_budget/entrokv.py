"""EntroKV: per-head KV-cache budgets from attention entropy, with SnapKV-style selection.

Dimensions: B batch, N heads being budgeted (e.g. layers x kv heads, flattened), W observation
queries (the last ``window`` prompt tokens), P prompt tokens (keys), G query heads per kv head.

EntroKV (ICML 2026): a head whose attention is spread out (high entropy) needs more cache than a head
that looks at a few tokens. For each head, the attention of the last W prompt queries over the
prompt gives a normalised entropy ``H = mean_q entropy(p_q) / log(n_q)`` in [0, 1] (n_q = keys query
q may see); the score is the blend ``s = (1 - alpha) * H_bar + alpha * H`` with a prior ``H_bar``;
the total budget is split in proportion to s, exactly, with at least ``min_budget`` and at most P
per head. Tokens are then chosen per head as in SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You
Are Looking for Before Generation", arXiv 2404.14469, Sec. 4): the observation
window's attention on the prefix (the P - W keys before the window) summed over its queries (the
"vote"), smoothed by 1-D pooling over the prefix alone (kernel ``pool``, stride 1, ``pool // 2``
padding on each side), the top ``budget - W`` prefix tokens per head, and the window itself always
kept. The window's keys neither vote nor lend their attention to prefix neighbours through the
pooling. The reference code's ``SnapKVCluster.update_kv`` offers max and average pooling (its
default is average pooling with kernel 5; its LongBench run uses window 32, kernel 7 and max pooling,
the defaults of :class:`EntroKVConfig`). The baseline "uniform" gives every head the same budget
(SnapKV).

Bad values: the public functions refuse NaN and infinite inputs with a ``ValueError`` naming the
first bad entry when called outside ``jit``/``vmap``; on traced inputs no value check is possible and
each docstring states what a non-finite input then produces.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from kernels import checks

POOLINGS = ("max", "avg")


def check_finite(x, name: str, where: str, *, allow_posinf: bool = False,
                 allow_neginf: bool = False, index_name: str = "index") -> None:
    """Raises a ``ValueError`` naming the first NaN (or infinite) entry of a concrete array.

    Does nothing for a tracer (inside ``jit`` / ``vmap`` the values are not known).

    Args:
      x: an array (any shape; integer and boolean arrays always pass).
      name, where: the argument and the function, for the message.
      allow_posinf, allow_neginf: accept +inf / -inf entries (NaN is always refused).
      index_name: how an entry's position is called in the message (e.g. ``"head"``).

    Raises:
      ValueError: ``"<where>: <name> must be finite, got <value> at <index_name> <i> (<n> bad of
        <size>)"``.
    """
    if checks.is_traced(x):
        return
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        return
    bad = np.isnan(a)
    if not allow_posinf:
        bad |= np.isposinf(a)
    if not allow_neginf:
        bad |= np.isneginf(a)
    if bad.any():
        flat = int(np.argmax(bad.ravel()))
        idx = np.unravel_index(flat, a.shape)
        pos = int(idx[0]) if a.ndim == 1 else tuple(int(i) for i in idx)
        expected = "free of NaN" if allow_posinf and allow_neginf else "finite"
        raise checks.error(where, name, expected, f"{a.ravel()[flat]} at {index_name} {pos} "
                           f"({int(bad.sum())} bad of {a.size})")


@dataclasses.dataclass(frozen=True)
class EntroKVConfig:
    """Hyper-parameters (hashable).

    Attributes:
      window: W observation queries (the last prompt tokens); always kept.
      alpha: weight of the measured entropy in the blend, in [0, 1].
      prior: H_bar, the prior normalised entropy, in [0, 1].
      pool: max-pooling kernel width (odd) over the prefix's vote (SnapKV's LongBench setting:
        window 32, kernel 7, max pooling).
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
        if self.pool % 2 == 0:
            raise ValueError(f"EntroKVConfig: pool={self.pool} must be a positive odd width")


def normalized_entropy(probs: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean over queries of ``entropy(p_q) / log(n_q)`` per head (natural logs; the ratio is
    unitless).

    Args:
      probs: float [..., W, P] attention rows (zero where not valid, rows sum to 1).
      valid: bool broadcastable to ``probs``: keys each query may see.

    Returns:
      float32 [...] in [0, 1] (a query seeing a single key counts as entropy 0). Inside ``jit``
      a NaN, infinite or negative entry of ``probs`` makes that head's result NaN.

    Raises:
      ValueError: ``probs`` not a float array of rank >= 2; ``valid`` not boolean; outside
        ``jit``, an entry of ``probs`` NaN, infinite or negative (the first one is named).
    """
    where = "normalized_entropy"
    checks.array(probs, "probs", where, kind="float")
    checks.array(valid, "valid", where, kind="bool")
    if probs.ndim < 2:
        raise checks.error(where, "probs", "an array [..., W, P] of rank >= 2",
                           f"shape {tuple(probs.shape)}")
    if not checks.is_traced(probs):
        p_np = np.asarray(probs)  # one host copy for both value checks
        check_finite(p_np, "probs", where)
        if np.any(p_np < 0):
            idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(p_np < 0)), p_np.shape))
            raise checks.error(where, "probs", "non-negative", f"{p_np[idx]} at index {idx}")
    p = probs.astype(jnp.float32)
    # xlogy(0, 0) = 0; a NaN or negative entry gives NaN, which propagates (no silent drop).
    ent = -jnp.sum(jax.scipy.special.xlogy(p, p), axis=-1)
    n = jnp.sum(jnp.broadcast_to(valid, p.shape), axis=-1).astype(jnp.float32)
    norm = jnp.where(n > 1, ent / jnp.log(jnp.maximum(n, 2.0)), jnp.where(jnp.isnan(ent), ent, 0.0))
    return jnp.clip(jnp.mean(norm, axis=-1), 0.0, 1.0)


def blend_scores(entropy: jax.Array, cfg: EntroKVConfig) -> jax.Array:
    """``s = (1 - alpha) * H_bar + alpha * H`` (float32, same shape as ``entropy``).

    Inside ``jit`` a NaN entropy gives a NaN score.

    Raises:
      ValueError: ``entropy`` not a float array; outside ``jit``, a NaN or infinite entry.
    """
    checks.array(entropy, "entropy", "blend_scores", kind="float")
    check_finite(entropy, "entropy", "blend_scores")
    return (1.0 - cfg.alpha) * cfg.prior + cfg.alpha * entropy.astype(jnp.float32)


def _check_total(total: int, num_heads: int, min_budget: int, capacity: int) -> None:
    where = "allocate_budgets"
    checks.integer(total, "total", where, minimum=1)
    checks.integer(min_budget, "min_budget", where, minimum=0)
    checks.integer(capacity, "capacity", where, minimum=max(1, min_budget))
    if total < num_heads * min_budget:
        raise ValueError(f"allocate_budgets: total={total} is below num_heads * min_budget = "
                         f"{num_heads} * {min_budget}")
    if total > num_heads * capacity:
        raise ValueError(f"allocate_budgets: total={total} exceeds num_heads * capacity = "
                         f"{num_heads} * {capacity}")


_TINY = 1e-12


@functools.partial(jax.jit, static_argnames=("total", "min_budget", "capacity"))
def _allocate(scores, total, min_budget, capacity):
    s = scores.astype(jnp.float32)
    # Traced input cannot be checked: NaN, -inf and non-positive scores count as tiny (the head
    # gets min_budget), +inf as the largest float (the head gets capacity), so the bounds and the
    # exact total still hold.
    s = jnp.nan_to_num(s, nan=_TINY, posinf=jnp.finfo(jnp.float32).max, neginf=_TINY)
    s = jnp.maximum(s, _TINY)

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

    return jax.lax.while_loop(cond, body, b)


def allocate_budgets(scores: jax.Array, total: int, min_budget: int = 1,
                     capacity: int | None = None) -> jax.Array:
    """Integer budgets proportional to ``scores`` that sum exactly to ``total``.

    Solves ``sum_h clip(lambda * s_h, min_budget, capacity) = total`` for lambda (bisection), floors,
    then moves single slots by largest fractional shortfall until the sum is exact (largest-remainder
    rounding with bounds).

    Args:
      scores: float [N], finite; entries <= 0 are treated as tiny (the head gets ``min_budget``).
      total: the budget to split, in slots (static int >= 1).
      min_budget: least slots per head (static int >= 0).
      capacity: most slots per head (static int >= max(1, min_budget); default ``total``).

    Returns:
      int32 [N] with ``sum == total`` and ``min_budget <= b <= capacity``. Inside ``jit`` /
      ``vmap`` (no value check possible) a NaN or -inf score counts as tiny (that head gets
      ``min_budget``) and +inf as the largest float32 (that head gets ``capacity``), so the sum and
      the bounds still hold.

    Raises:
      ValueError: ``scores`` not a real vector [N] with N >= 1; outside ``jit``, a NaN or infinite
        score (the head index and value are named); ``total``, ``min_budget`` or ``capacity`` not
        integers in range; ``total < N * min_budget`` or ``total > N * capacity``.
    """
    checks.array(scores, "scores", "allocate_budgets", ndim=1, kind="real", nonempty=True)
    check_finite(scores, "scores", "allocate_budgets", index_name="head")
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


def _pool_prefix(vote: jax.Array, pool: int, pooling: str) -> jax.Array:
    """1-D pooling along the last axis, stride 1, ``pool // 2`` padding each side: max pooling
    pads with -inf (the padding never wins), average pooling pads with zeros and divides by
    ``pool`` everywhere (PyTorch's ``avg_pool1d`` default, ``count_include_pad=True``)."""
    if pool == 1 or vote.shape[-1] == 0:
        return vote
    pad = [(0, 0)] * (vote.ndim - 1) + [(pool // 2, pool // 2)]
    dims, strides = (1,) * (vote.ndim - 1) + (pool,), (1,) * vote.ndim
    if pooling == "max":
        padded = jnp.pad(vote, pad, constant_values=-jnp.inf)
        return jax.lax.reduce_window(padded, -jnp.inf, jax.lax.max, dims, strides, "VALID")
    padded = jnp.pad(vote, pad)
    return jax.lax.reduce_window(padded, 0.0, jax.lax.add, dims, strides, "VALID") / pool


def snapkv_votes(probs: jax.Array, window: int, pool: int, pooling: str = "max") -> jax.Array:
    """SnapKV importance of each prompt key (Li et al. 2024, Sec. 4; module docstring).

    The attention of the observation queries on the prefix keys (the P - ``window`` keys before
    the window) is summed over the queries (and, by the caller, over the ``G`` query heads of a kv
    head), then pooled over the prefix alone with kernel ``pool``, stride 1 and ``pool // 2``
    padding on each side, as the SnapKV reference code does (``max_pool1d`` / ``avg_pool1d`` on the
    prefix's vote). The window's own keys take no part in the pooling: they never lend their
    attention to the prefix tokens next to them.

    Args:
      probs: float [..., Wq, P] attention of the observation queries over the prompt.
      window: W, the observation window (the last W keys), 1 <= W <= P.
      pool: odd kernel width >= 1 (1: no pooling).
      pooling: ``"max"`` (SnapKV's LongBench setting; the default here) or ``"avg"`` (the
        reference code's default: zero padding counted in each mean).

    Returns:
      float32 [..., P]: the pooled vote on the prefix; +inf on the window's own keys, which
      :func:`select_tokens` keeps first, newest first, so a budget below the window keeps the most
      recent window tokens. Inside ``jit`` a NaN in ``probs`` gives NaN votes (which
      :func:`select_tokens` refuses outside ``jit``).

    Raises:
      ValueError: ``probs`` not a float array of rank >= 2; ``window`` not an int in [1, P];
        ``pool`` not a positive odd int; unknown ``pooling``; outside ``jit``, a NaN or infinite
        entry of ``probs``.
    """
    where = "snapkv_votes"
    checks.array(probs, "probs", where, kind="float")
    if probs.ndim < 2:
        raise checks.error(where, "probs", "an array [..., Wq, P] of rank >= 2",
                           f"shape {tuple(probs.shape)}")
    p = probs.shape[-1]
    checks.integer(window, "window", where, minimum=1, maximum=p)
    checks.integer(pool, "pool", where, minimum=1)
    if pool % 2 == 0:
        raise checks.error(where, "pool", "a positive odd width", pool)
    checks.one_of(pooling, "pooling", where, POOLINGS)
    check_finite(probs, "probs", where)
    vote = jnp.sum(probs[..., :p - window].astype(jnp.float32), axis=-2)  # the prefix's vote
    vote = _pool_prefix(vote, pool, pooling)
    # +inf, not 1e30 + position: in float32 1e30 + p is the same number for every p < 2^49
    always = jnp.full(vote.shape[:-1] + (window,), jnp.inf, jnp.float32)
    return jnp.concatenate([vote, always], axis=-1)


def select_tokens(votes: jax.Array, budgets: jax.Array) -> jax.Array:
    """Keep mask: per head, the ``budgets[h]`` highest-vote tokens, exactly.

    Tokens are ranked by vote, then by an integer position key: among the always-kept tokens
    (vote +inf, the observation window) the newest first, among equal finite votes the oldest
    first. Sorting on the two keys (``lexsort``) keeps the order exact at any prompt length.

    Args:
      votes: float [..., N, P], no NaN (+inf marks always-kept tokens, -inf never-wanted ones);
        budgets: int [N] >= 0 (broadcast over leading dims).

    Returns:
      bool [..., N, P] with ``sum(mask[..., h, :]) == min(budgets[h], P)``. Inside ``jit`` NaN
      votes are ranked after every other vote (the sort's NaN order), which is not SnapKV's rule.

    Raises:
      ValueError: ``votes`` not a float array of rank >= 2; ``budgets`` not an int vector [N];
        outside ``jit``, a NaN vote or a negative budget.
    """
    where = "select_tokens"
    checks.array(votes, "votes", where, kind="float")
    if votes.ndim < 2:
        raise checks.error(where, "votes", "an array [..., N, P] of rank >= 2",
                           f"shape {tuple(votes.shape)}")
    checks.array(budgets, "budgets", where, kind="int", shape=(votes.shape[-2],))
    check_finite(votes, "votes", where, allow_posinf=True, allow_neginf=True)
    if not checks.is_traced(budgets) and bool(np.any(np.asarray(budgets) < 0)):
        b_np = np.asarray(budgets)
        h = int(np.argmax(b_np < 0))
        raise checks.error(where, "budgets", "non-negative", f"{b_np[h]} at head {h}")
    p = votes.shape[-1]
    pos = jnp.arange(p, dtype=jnp.int32)
    tie = jnp.where(jnp.isposinf(votes), -pos, pos)  # newest first inside the window
    order = jnp.lexsort((tie, -votes), axis=-1)  # last key is the primary one
    rank = jnp.argsort(order, axis=-1)
    return rank < budgets[:, None]


def observation_probs(q: jax.Array, k: jax.Array, window: int) -> tuple[jax.Array, jax.Array]:
    """Causal attention of the last ``window`` queries over all P keys, per kv head, in float32
    (scaled by 1 / sqrt(D)).

    Args:
      q: float [B, H, P, D] queries (RoPE applied); k: float [B, K, P, D] keys; H = G * K.
      window: W, 1 <= W <= P.

    Returns:
      (probs float32 [B, K, G, W, P], valid bool [W, P]). Inside ``jit`` a non-finite q or k
      gives NaN rows.

    Raises:
      ValueError: q or k not float arrays of rank 4; B, P or D differing between them; H not a
        multiple of K; window not an int in [1, P]; outside ``jit``, a NaN or infinite entry
        of q or k.
    """
    where = "observation_probs"
    checks.array(q, "q", where, ndim=4, kind="float")
    checks.array(k, "k", where, ndim=4, kind="float")
    b, h, p, d = q.shape
    kh = k.shape[1]
    checks.array(k, "k", where, shape=(b, None, p, d))
    if kh < 1 or h % kh:
        raise checks.error(where, "k", f"[B, K, P, D] with K dividing the {h} query heads",
                           f"K={kh}")
    checks.integer(window, "window", where, minimum=1, maximum=p)
    check_finite(q, "q", where)
    check_finite(k, "k", where)
    qo = q[:, :, p - window:].reshape(b, kh, h // kh, window, d).astype(jnp.float32)
    s = jnp.einsum("bkgwd,bkpd->bkgwp", qo, k.astype(jnp.float32)) / math.sqrt(d)
    valid = jnp.arange(p)[None, :] <= (p - window + jnp.arange(window))[:, None]
    probs = jax.nn.softmax(jnp.where(valid, s, -jnp.inf), axis=-1)
    return probs, valid


def head_entropy(probs: jax.Array, valid: jax.Array) -> jax.Array:
    """EntroKV's H per kv head: normalised entropy averaged over queries and the G query heads.

    probs float [..., G, W, P], valid bool broadcastable -> float32 [...]; errors and in-``jit``
    behaviour as :func:`normalized_entropy`."""
    return jnp.mean(normalized_entropy(probs, valid), axis=-1)
