"""kernels.attention_math: partial-attention merges against one softmax, grouped attention against
dense attention, the grouped query."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import attention_math

# jitted: one compile per shape instead of one per eager op
_softmax_partial = jax.jit(attention_math.softmax_partial)
_merge_partials = jax.jit(attention_math.merge_partials, static_argnums=3)
_partial_attention = jax.jit(attention_math.partial_attention)
_merge_lse = jax.jit(attention_math.merge_lse)


def _dense(q, k, v):  # q [B, K, R, D], k/v [B, K, S, D]
    s = np.einsum("bkrd,bksd->bkrs", q, k) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bkrs,bksd->bkrd", p / p.sum(-1, keepdims=True), v)


def test_partials_merge_to_one_softmax():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (2, 3, 4, 16)) * 3
    k = jax.random.normal(kk, (2, 3, 40, 16)) * 3
    v = jax.random.normal(kv, (2, 3, 40, 16))
    want = _dense(np.asarray(q), np.asarray(k), np.asarray(v))
    # (acc, m, l) over three splits, one of them empty
    logits = np.einsum("bkrd,bksd->bkrs", np.asarray(q), np.asarray(k)) / 4.0
    parts = [_softmax_partial(logits[..., a:b], v[:, :, a:b]) for a, b in ((0, 7), (7, 40))]
    empty = _softmax_partial(np.full(logits[..., :5].shape, -np.inf, np.float32), v[:, :, :5])
    np.testing.assert_array_equal(empty[0], 0.0)
    acc, m, l = (np.stack(x, 2) for x in zip(*parts, empty))
    np.testing.assert_allclose(_merge_partials(acc, m, l, 2), want, rtol=1e-5, atol=1e-5)
    # (out, lse) of two disjoint masks
    first = np.arange(40) < 13
    o1, lse1 = _partial_attention(q, k, v, first)
    o2, lse2 = _partial_attention(q, k, v, ~first)
    np.testing.assert_allclose(_merge_lse(o1, lse1, o2, lse2), want, rtol=1e-5, atol=1e-5)
    o0, lse0 = _partial_attention(q, k, v, np.zeros(40, bool))
    assert np.all(np.asarray(o0) == 0) and np.all(np.isneginf(lse0))
    np.testing.assert_allclose(_merge_lse(o0, lse0, *_partial_attention(
        q, k, v, np.ones(40, bool))), want, rtol=1e-5, atol=1e-5)


def test_grouped_attention_matches_dense_and_causal_mask():
    kq, kk, kv = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(kq, (2, 6, 3, 8))  # H = 6 over K = 2
    k = jax.random.normal(kk, (2, 2, 10, 8))
    v = jax.random.normal(kv, (2, 2, 10, 8))
    start = jnp.array([2, 7])
    mask = attention_math.causal_cache_mask(start, 3, 10)
    assert mask.shape == (2, 1, 1, 3, 10)
    assert int(mask[1, 0, 0, 2].sum()) == 10 and int(mask[0, 0, 0, 0].sum()) == 3
    out = jax.jit(attention_math.grouped_attention)(q, k, v, mask)
    qg = np.asarray(q).reshape(2, 2, 3, 3, 8)
    for b in range(2):
        for t in range(3):
            n = int(start[b]) + t + 1
            want = _dense(qg[b:b + 1, :, :, t], np.asarray(k)[b:b + 1, :, :n],
                          np.asarray(v)[b:b + 1, :, :n])
            np.testing.assert_allclose(np.asarray(out)[b, :, t], want.reshape(6, 8), rtol=1e-5,
                                       atol=1e-5)


def test_grouped_query_groups_heads_per_kv_head_and_scales():
    q = jax.random.normal(jax.random.key(5), (2, 6, 16), jnp.bfloat16)
    qg = attention_math.grouped_query(q, 3)
    assert qg.shape == (2, 3, 2, 16) and qg.dtype == jnp.float32
    q32 = np.asarray(q, np.float32)
    for h in range(6):  # query head h is kv head h // G, member h % G
        np.testing.assert_allclose(np.asarray(qg)[:, h // 2, h % 2], q32[:, h] / 4.0, rtol=1e-7)
    with pytest.raises(ValueError, match="grouped_query: 6 query heads.*4 kv heads"):
        attention_math.grouped_query(q, 4)
