"""kernels.common: packing layouts, partial-attention merges against one softmax, RoPE invariants,
the backend registry."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import common


@pytest.mark.parametrize("bits,word_bits", [(1, 8), (2, 8), (4, 8), (8, 8), (2, 32), (4, 32)])
def test_pack_roundtrip_and_planar_layout(bits, word_bits):
    n = word_bits // bits
    d = 2 * n
    codes = jax.random.randint(jax.random.key(bits + word_bits), (3, 5, d), 0, 2 ** bits)
    words = common.pack_codes(codes, bits, word_bits)
    assert words.shape == (3, 5, d // n)
    assert words.dtype == (jnp.uint8 if word_bits == 8 else jnp.int32)
    np.testing.assert_array_equal(common.unpack_codes(words, bits), codes.astype(np.uint8))
    # planar: channel c sits in word c % W at bit bits * (c // W)
    w = d // n
    u = np.asarray(words).view(np.uint8 if word_bits == 8 else np.uint32).astype(np.uint64)
    c = np.asarray(codes)
    for ch in range(d):
        got = (u[..., ch % w] >> (bits * (ch // w))) & (2 ** bits - 1)
        np.testing.assert_array_equal(got, c[..., ch])


def test_pack_rejects_bad_widths():
    with pytest.raises(ValueError, match="bits must"):
        common.pack_codes(jnp.zeros((4, 8), jnp.uint8), 3)
    with pytest.raises(ValueError, match="word_bits must"):
        common.pack_codes(jnp.zeros((4, 8), jnp.uint8), 2, word_bits=16)
    with pytest.raises(ValueError, match="multiple of 16"):
        common.pack_codes(jnp.zeros((4, 8), jnp.uint8), 2, word_bits=32)
    with pytest.raises(ValueError, match="words must"):
        common.unpack_codes(jnp.zeros((4, 8), jnp.float32), 2)


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
    logits = jnp.einsum("bkrd,bksd->bkrs", q, k) / 4.0
    parts = [common.softmax_partial(logits[..., a:b], v[:, :, a:b]) for a, b in ((0, 7), (7, 40))]
    empty = common.softmax_partial(jnp.full(logits[..., :5].shape, -jnp.inf), v[:, :, :5])
    np.testing.assert_array_equal(empty[0], 0.0)
    acc, m, l = (jnp.stack(x, 2) for x in zip(*parts, empty))
    np.testing.assert_allclose(common.merge_partials(acc, m, l, 2), want, rtol=1e-5, atol=1e-5)
    # (out, lse) of two disjoint masks
    first = jnp.arange(40) < 13
    o1, lse1 = common.partial_attention(q, k, v, first)
    o2, lse2 = common.partial_attention(q, k, v, ~first)
    np.testing.assert_allclose(common.merge_lse(o1, lse1, o2, lse2), want, rtol=1e-5, atol=1e-5)
    o0, lse0 = common.partial_attention(q, k, v, jnp.zeros(40, bool))
    assert np.all(np.asarray(o0) == 0) and np.all(np.isneginf(lse0))
    np.testing.assert_allclose(common.merge_lse(o0, lse0, *common.partial_attention(
        q, k, v, jnp.ones(40, bool))), want, rtol=1e-5, atol=1e-5)


def test_grouped_attention_matches_dense_and_causal_mask():
    kq, kk, kv = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(kq, (2, 6, 3, 8))  # H = 6 over K = 2
    k = jax.random.normal(kk, (2, 2, 10, 8))
    v = jax.random.normal(kv, (2, 2, 10, 8))
    start = jnp.array([2, 7])
    mask = common.causal_cache_mask(start, 3, 10)
    assert mask.shape == (2, 1, 1, 3, 10)
    assert int(mask[1, 0, 0, 2].sum()) == 10 and int(mask[0, 0, 0, 0].sum()) == 3
    out = common.grouped_attention(q, k, v, mask)
    qg = np.asarray(q).reshape(2, 2, 3, 3, 8)
    for b in range(2):
        for t in range(3):
            n = int(start[b]) + t + 1
            want = _dense(qg[b:b + 1, :, :, t], np.asarray(k)[b:b + 1, :, :n],
                          np.asarray(v)[b:b + 1, :, :n])
            np.testing.assert_allclose(np.asarray(out)[b, :, t], want.reshape(6, 8), rtol=1e-5,
                                       atol=1e-5)


def test_rope_is_orthogonal_and_relative():
    x = jax.random.normal(jax.random.key(2), (1, 5, 2, 16))
    pos = jnp.arange(5)[None] * 37
    y = common.apply_rope(x, pos)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(common.apply_rope(y, -pos), x, atol=1e-5)
    # <R_p q, R_s k> depends on p - s only
    q, k = x[:, :1], x[:, 1:2]
    a = jnp.sum(common.apply_rope(q, jnp.array([[9]])) * common.apply_rope(k, jnp.array([[4]])))
    b = jnp.sum(common.apply_rope(q, jnp.array([[105]])) * common.apply_rope(k, jnp.array([[100]])))
    np.testing.assert_allclose(a, b, rtol=1e-4)
    # rope_slots is apply_rope in the cache layout [B, K, S, D]
    kc = x.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(common.rope_slots(kc, 10_000.0, 3),
                               common.apply_rope(x, jnp.arange(3, 8)[None]).transpose(0, 2, 1, 3),
                               atol=1e-6)


def test_rope_accepts_a_frequency_object():
    class Half:
        def inv_freq(self, head_dim):
            return 0.5 * 10_000.0 ** (-np.arange(0, head_dim, 2) / head_dim)

    pos = jnp.arange(4)
    np.testing.assert_allclose(common.rope_angles(pos, 8, Half()),
                               0.5 * common.rope_angles(pos, 8), rtol=1e-6)


def test_registry():
    backends = common.registered_backends()
    assert backends["dense"] is common.DenseKVCache
    assert isinstance(common.DENSE, common.KVCacheBackend)

    @dataclasses.dataclass(frozen=True)
    class Other(common.DenseKVCache):
        pass

    with pytest.raises(ValueError, match="taken"):
        common.register_backend("dense")(Other)
    with pytest.raises(ValueError, match="init, update and attend"):
        common.register_backend("broken")(type("Broken", (), {}))
    with pytest.raises(ValueError, match="name must"):
        common.register_backend("")
    assert common.register_backend("dense")(common.DenseKVCache) is common.DenseKVCache
    assert "broken" not in common.registered_backends()


def test_models_find_every_kernel_backend():
    from models import kv_cache

    names = set(common.registered_backends())
    assert {"dense", "ffd", "quest", "qvg", "kivi"} <= names
    assert kv_cache.get_backend("ffd", page_size=16).page_size == 16
