"""Tests of the quantized-cache quality measures and EntroKV's per-head entropies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.kv_budget import cache as bcache
from algorithms.kv_budget import entrokv, quality
from kernels.kv_quant import reference as ref


def test_relative_error_closed_form():
    b = jnp.array([3.0, 4.0])
    # ||(0, 0.5)|| / ||(3, 4)|| = 0.5 / 5, in float32
    assert quality.relative_error(b + jnp.array([0.0, 0.5]), b) == float(np.float32(0.1))


def test_attention_is_causal_and_exact_for_one_key():
    q = jax.random.normal(jax.random.key(0), (1, 2, 3, 8))
    k = jax.random.normal(jax.random.key(1), (1, 1, 3, 8))
    v = jax.random.normal(jax.random.key(2), (1, 1, 3, 8))
    out = quality.attention(q, k, v)
    # the first query sees only the first key: its output is that key's value
    np.testing.assert_allclose(out[0, :, 0], jnp.broadcast_to(v[0, 0, 0], (2, 8)), atol=1e-6)


def test_eight_bit_roundtrips_have_small_attention_error_and_two_bits_larger():
    q, k, v = quality.synthetic_keys(jax.random.key(3), tokens=256, head_dim=32, heads=2,
                                     clusters=8, outlier_channels=2, queries=4)
    assert q.shape == (1, 2, 4, 32) and k.shape == v.shape == (1, 2, 256, 32)
    # the outlier channels are 10x larger in the keys
    assert float(jnp.abs(k[..., :2]).mean()) > 5 * float(jnp.abs(k[..., 2:]).mean())
    errs = {}
    for bits in (2, 8):
        for name, cfg in (("qvg", ref.qvg_preset("qvg", bits=bits, block=32, num_centroids=8,
                                                  chunk=256, kmeans_iters=3)),
                          ("kivi", ref.KIVIConfig(bits=bits, group=32, block=32, residual=256))):
            e = quality.synthetic_error(q, k, v, cfg, jax.random.key(4))
            assert e["compression"] == 16 / e["effective_bits"]
            errs[name, bits] = e["rel_err"]
    for name in ("qvg", "kivi"):
        assert errs[name, 8] < 0.02 and errs[name, 2] > 2 * errs[name, 8]


def test_head_entropies_limits():
    """Equal keys: uniform attention, normalised entropy 1; one key far along every query:
    attention on it alone, entropy near 0."""
    cfg = entrokv.EntroKVConfig(window=4)
    b, kh, g, p, d = 1, 2, 2, 12, 8
    q = jax.random.normal(jax.random.key(5), (b, kh * g, p, d))
    flat = jnp.ones((b, kh, p, d))
    np.testing.assert_allclose(bcache.head_entropies([(q, flat)], cfg), 1.0, atol=1e-5)
    qpos = jnp.abs(q) + 1.0  # every query component positive
    k = jnp.zeros((b, kh, p, d)).at[:, :, 0].set(100.0)
    ent = np.asarray(bcache.head_entropies([(qpos, k), (qpos, flat)], cfg))
    assert ent.shape == (b, 2 * kh)
    assert np.all(ent[:, :kh] < 1e-3) and np.allclose(ent[:, kh:], 1.0, atol=1e-5)


def test_quality_measures_refuse_non_finite_and_zero_references():
    b = jnp.array([3.0, 4.0])
    with pytest.raises(ValueError, match="relative_error: a must be finite, got nan at index 1"):
        quality.relative_error(b.at[1].set(jnp.nan), b)
    with pytest.raises(ValueError, match="relative_error: b must be a reference with a non-zero"):
        quality.relative_error(b, jnp.zeros(2))
    q = jax.random.normal(jax.random.key(0), (1, 2, 3, 8))
    k = jax.random.normal(jax.random.key(1), (1, 1, 3, 8))
    v = jax.random.normal(jax.random.key(2), (1, 1, 3, 8))
    with pytest.raises(ValueError, match="attention: v must be finite"):
        quality.attention(q, k, v.at[0, 0, 1, 2].set(jnp.inf))
    with pytest.raises(ValueError, match="attention: q must be at most S = 3"):
        quality.attention(jnp.ones((1, 2, 4, 8)), k, v)
    cfg = ref.KIVIConfig(bits=8, group=8, block=8, residual=8)
    with pytest.raises(ValueError, match=r"attention_error \(layer 1\): k must be finite"):
        quality.attention_error([(q, k, v), (q, k.at[0, 0, 0, 0].set(jnp.nan), v)], cfg,
                                jax.random.key(3))
    with pytest.raises(ValueError, match="outlier_channels"):
        quality.synthetic_keys(jax.random.key(0), 16, 8, 1, 2, 9, 2)
