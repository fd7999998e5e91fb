"""Quest decode attention (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
Inference", ICML 2024): the metadata baseline of the sparse_decode op, one XLA implementation.

Dimensions: B batch, H query heads, K kv heads, G = H / K, D head dim, p page size, P pages
(S = P * p cache slots), M = min(top_k, P) gathered pages.

Per-page channel-wise minimum ``m`` and maximum ``M`` keys bound every logit of a page from above
by ``sum_d max(q_d m_d, q_d M_d)`` (Quest Sec. 3); decode attends the ``top_k`` full pages with the
largest bound, exactly (full-precision keys and values), plus the unfinished last page. The cache
backend is :class:`kernels.sparse_decode.cache.QuestCache` (``"quest"``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernels import attention_math
from kernels.attention_math import merge_partials, softmax_partial
from kernels.sparse_decode.reference import rankable


def quest_metadata(k: jax.Array, page_size: int) -> tuple[jax.Array, jax.Array]:
    """Per-page channel-wise (min, max) keys, each float32 [B, K, P, D], from keys [B, K, S, D]."""
    b, kh, s, d = k.shape
    pages = k.reshape(b, kh, s // page_size, page_size, d).astype(jnp.float32)
    return pages.min(axis=3), pages.max(axis=3)


def quest_page_scores(qg: jax.Array, kmin: jax.Array, kmax: jax.Array) -> jax.Array:
    """Quest's upper bound of each page's logit, ``sum_d max(q_d m_d, q_d M_d)``, maximised over the
    kv group: float32 [B, K, P]. ``qg`` [B, K, G, D] (already / sqrt(D))."""
    ub = jnp.maximum(qg[:, :, :, None, :] * kmin[:, :, None], qg[:, :, :, None, :] * kmax[:, :, None])
    return ub.sum(-1).max(2)


def quest_decode(q: jax.Array, k: jax.Array, v: jax.Array, kmin: jax.Array, kmax: jax.Array,
                 lengths: jax.Array, *, top_k: int, page_size: int
                 ) -> tuple[jax.Array, jax.Array]:
    """Quest decode: attend the ``top_k`` full pages with the largest upper-bound score, gathered
    (exact keys and values), plus the unfinished last page. k, v [B, K, S, D]; metadata
    [B, K, P, D] (from :func:`quest_metadata`, valid on full pages). Returns (out [B, H, D],
    keep bool [B, K, P]).

    Scores that are not finite rank as in FFD's :func:`~kernels.sparse_decode.reference.rankable`:
    NaN (a NaN key) and ``+inf`` (a bound that overflows float32 while the page's logits do not)
    first, ``-inf`` last; every full page is rankable, so ``top_k >= P`` attends all of them (and
    a NaN key makes its rows NaN, as dense attention does)."""
    b, h, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    n = s // page_size
    qg = attention_math.grouped_query(q, kh)
    num_full = lengths // page_size
    valid = jnp.arange(n)[None, :] < num_full[:, None]
    score = jnp.where(valid[:, None, :], rankable(quest_page_scores(qg, kmin, kmax)), -jnp.inf)
    m_slots = max(1, min(top_k, n))
    top, idx = lax.top_k(score, m_slots)
    ok = jnp.isfinite(top)  # a full page (rankable is finite), not a filler slot
    kp = k.reshape(b, kh, n, page_size, d)
    vp = v.reshape(b, kh, n, page_size, d)
    ix = idx[..., None, None]
    kg = jnp.take_along_axis(kp, ix, axis=2).astype(jnp.float32)
    logits = jnp.einsum("bkgd,bkmtd->bkgmt", qg, kg)
    logits = jnp.where(ok[:, :, None, :, None], logits, -jnp.inf).reshape(b, kh, -1, m_slots * page_size)
    acc, m, l = softmax_partial(logits, jnp.take_along_axis(vp, ix, axis=2).reshape(
        b, kh, m_slots * page_size, d))
    # the unfinished page, exact
    tp = jnp.minimum(num_full, n - 1)[:, None, None, None, None]
    tk = jnp.take_along_axis(kp, tp, axis=2)[:, :, 0].astype(jnp.float32)
    tv = jnp.take_along_axis(vp, tp, axis=2)[:, :, 0]
    tl = jnp.einsum("bkgd,bktd->bkgt", qg, tk)
    tok = jnp.arange(page_size)[None, :] < (lengths % page_size)[:, None]
    ta, tm, tl = softmax_partial(jnp.where(tok[:, None, None, :], tl, -jnp.inf), tv)
    out = merge_partials(jnp.stack([acc, ta], 2), jnp.stack([m, tm], 2), jnp.stack([l, tl], 2), 2)
    keep = jnp.zeros((b, kh, n), bool).at[
        jnp.arange(b)[:, None, None], jnp.arange(kh)[None, :, None], idx].set(ok)
    return out.reshape(b, h, d).astype(q.dtype), keep
