"""Attention arithmetic shared by the KV-cache kernels and the models: dense grouped-query
attention over a cache, and partials of attention over disjoint key sets with their merges.

Dimensions: B batch, H query heads, K kv heads, G = H / K, S cache slots, T new tokens, D head dim,
R query rows per kv head, N keys of a partial.

* Dense attention: :func:`grouped_attention` (GQA softmax over a cache), :func:`causal_cache_mask`,
  :func:`grouped_query` (one token's queries grouped per kv head).
* Partials (split-K / flash decoding): unnormalised ``(acc, m, l)`` from :func:`softmax_partial`,
  merged by :func:`merge_partials`; or normalised ``(out, lse)`` from :func:`partial_attention`,
  merged by :func:`merge_lse`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from kernels import checks


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention with grouped-query heads, computed in float32.

    Args:
      q: [B, H, T, D].
      k, v: [B, K, S, D] with H = G * K (query head h uses kv head h // G).
      mask: bool, broadcastable to [B, K, G, T, S]; True = may attend. Every query row must allow
        at least one key.

    Returns:
      [B, H, T, D] in ``q``'s dtype.

    Raises:
      ValueError: ``q`` not float [B, H, T, D]; ``k`` not [B, K, S, D] with H a multiple of K;
        ``v`` not of ``k``'s shape.
    """
    where = "grouped_attention"
    checks.array(q, "q", where, ndim=4, kind="float")
    b, h, t, d = q.shape
    checks.array(k, "k", where, ndim=4, shape=(b, None, None, d))
    checks.array(v, "v", where, shape=k.shape)
    kh = k.shape[1]
    if h % kh:
        raise checks.error(where, "q", f"a number of query heads that is a multiple of the {kh} "
                           "kv heads", f"{h} query heads")
    qg = q.reshape(b, kh, h // kh, t, d).astype(jnp.float32)
    scores = jnp.einsum("bkgtd,bksd->bkgts", qg, k.astype(jnp.float32)) / jnp.sqrt(d).astype(
        jnp.float32)
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v.astype(jnp.float32))
    return out.reshape(b, h, t, d).astype(q.dtype)


def causal_cache_mask(start: jax.Array, num_new: int, num_slots: int) -> jax.Array:
    """bool [B, 1, 1, T, S]: new token t of row b sees slots s <= start[b] + t (``start`` int [B])."""
    limit = start[:, None] + jnp.arange(num_new)[None, :]  # [B, T]
    return (jnp.arange(num_slots)[None, None, :] <= limit[:, :, None])[:, None, None]



def grouped_query(q: jax.Array, num_kv_heads: int) -> jax.Array:
    """Queries of one new token per row, ``q [B, H, D]`` (any float dtype), grouped per kv head and
    scaled for the softmax: float32 [B, K, G, D] equal to ``q / sqrt(D)`` (query head h is
    ``[h // G, h % G]``).

    Raises:
      ValueError: H not a multiple of ``num_kv_heads``.
    """
    b, h, d = q.shape
    if h % num_kv_heads:
        raise ValueError(f"grouped_query: {h} query heads are not a multiple of {num_kv_heads} "
                         "kv heads")
    return q.reshape(b, num_kv_heads, h // num_kv_heads, d).astype(jnp.float32) / math.sqrt(d)


def softmax_partial(logits: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unnormalised partial of logits [..., R, N] against values [..., N, D]: ``(acc, m, l)`` with
    ``m = max_n logit`` [..., R], ``l = sum_n exp(logit - m)`` [..., R] and
    ``acc = sum_n exp(logit - m) v_n`` float32 [..., R, D]; an all ``-inf`` row gives (0, -inf, 0)."""
    m = logits.max(-1)
    e = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0.0)[..., None])
    acc = jnp.einsum("...gn,...nd->...gd", e, v.astype(jnp.float32))
    return acc, m, e.sum(-1)


def merge_partials(acc: jax.Array, m: jax.Array, l: jax.Array, axis: int) -> jax.Array:
    """Log-sum-exp merge of :func:`softmax_partial` partials stacked on ``axis`` (of ``m`` and ``l``;
    ``acc`` has the extra trailing D): ``sum_s e^{m_s - M} acc_s / sum_s e^{m_s - M} l_s``, float32.

    Empty partials (``m = -inf``, ``l = 0``) weigh nothing; a NaN partial makes the output NaN; if
    every partial is empty the result is 0/0 = NaN, so callers must attend at least one key.
    """
    mm = m.max(axis=axis, keepdims=True)
    w = jnp.exp(m - jnp.where(jnp.isinf(mm), 0.0, mm))  # exp(-inf) = 0 for empty splits
    num = jnp.sum(w[..., None] * acc, axis=axis)
    return num / jnp.sum(w * l, axis=axis)[..., None]


def partial_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
                      ) -> tuple[jax.Array, jax.Array]:
    """Softmax attention of rows ``q [B, K, R, D]`` over ``k, v [B, K, S, D]`` with its log-sum-exp.

    Logits are ``q.k / sqrt(D)`` in float32; ``mask`` bool broadcastable to [B, K, R, S].

    Returns:
      (out float32 [B, K, R, D], 0 where a row sees nothing; lse float32 [B, K, R], -inf there), to
      merge with :func:`merge_lse`; a NaN logit or value a row sees makes its out (and, for a
      logit, its lse) NaN, as dense attention does.
    """
    d = q.shape[-1]
    s = jnp.einsum("bkrd,bksd->bkrs", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(d)
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m_safe)
    l = jnp.sum(p, axis=-1, keepdims=True)
    # Only l == 0 is a row that sees nothing: a NaN logit makes l NaN, and the row NaN (out and
    # lse), as dense attention does; `l > 0` would take it for an empty row.
    empty = l == 0
    out = jnp.einsum("bkrs,bksd->bkrd", p, v.astype(jnp.float32)) / jnp.where(empty, 1.0, l)
    lse = jnp.where(empty[..., 0], -jnp.inf,
                    m_safe[..., 0] + jnp.log(jnp.where(empty[..., 0], 1.0, l[..., 0])))
    return out, lse


def merge_lse(o1: jax.Array, lse1: jax.Array, o2: jax.Array, lse2: jax.Array) -> jax.Array:
    """Combines two normalised partials over disjoint key sets: float32 [..., R, D] from
    ``(o1, lse1)`` and ``(o2, lse2)`` (lse [..., R]); two empty partials give 0."""
    m = jnp.maximum(lse1, lse2)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w1, w2 = jnp.exp(lse1 - m)[..., None], jnp.exp(lse2 - m)[..., None]
    return (o1 * w1 + o2 * w2) / jnp.maximum(w1 + w2, 1e-30)
