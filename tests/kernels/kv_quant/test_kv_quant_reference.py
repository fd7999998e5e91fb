"""Tests of the QVG / KIVI jnp specification and the quantized-cache backends."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import attention_math, cache_backend, packing
from kernels.kv_quant import reference as ref
from kernels.kv_quant.cache import KIVICache, QVGCache
from kernels.rope import rope_slots

_grouped_attention = jax.jit(attention_math.grouped_attention)


def test_kmeans_objective_never_increases_and_finds_separated_clusters():
    key = jax.random.key(0)
    centers = jnp.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    lab = jnp.repeat(jnp.arange(3), 30)
    x = centers[lab] + jax.random.uniform(key, (90, 2), minval=-1.0, maxval=1.0)
    c, a, objs = jax.jit(ref.kmeans, static_argnums=(1, 2))(x, 3, 6, jax.random.key(3))
    assert np.all(np.diff(np.asarray(objs)) <= 1e-3)
    # The optimum of well-separated clusters: each centroid is its cluster's mean.
    means = jax.ops.segment_sum(x, lab, 3) / 30.0
    order = np.argsort(np.asarray(c[:, 0] + 2 * c[:, 1]))
    chex.assert_trees_all_close(c[order], means[np.argsort(np.asarray(means[:, 0] + 2 * means[:, 1]))],
                                atol=1e-4)
    assert len(np.unique(np.asarray(a)[lab == 0])) == 1
    optimum = float(jnp.sum((x - means[lab]) ** 2))
    np.testing.assert_allclose(float(objs[-1]), optimum, rtol=1e-5)


@pytest.mark.parametrize("offset", [100.0, 1e3])
def test_kmeans_assigns_nearest_centroid_under_a_large_common_offset(offset):
    # A chunk whose spread (0.1) is small beside its common offset: |x|^2 - 2 x.c + |c|^2 in
    # float32 loses the distances to cancellation (about half the points went to a centroid that
    # is not their nearest, and the objective rose). Assignments are checked against brute-force
    # float64 distances, each Lloyd step's objective against the previous one.
    rng = np.random.default_rng(7)
    x = (offset + 0.1 * rng.standard_normal((256, 64))).astype(np.float32)
    c, a, objs = jax.jit(ref.kmeans, static_argnums=(1, 2))(jnp.asarray(x), 16, 8,
                                                            jax.random.key(1))
    x64, c64 = x.astype(np.float64), np.asarray(c, np.float64)
    d64 = np.sum((x64[:, None, :] - c64[None]) ** 2, -1)
    chosen = d64[np.arange(len(x)), np.asarray(a)]
    np.testing.assert_allclose(chosen, d64.min(1), rtol=1e-5)  # rounding-level ties only
    objs = np.asarray(objs, np.float64)
    assert np.all(np.diff(objs) <= 1e-6 * objs[0]), objs
    # The returned objective is that of the returned assignment, in float64.
    np.testing.assert_allclose(objs[-1], chosen.sum(), rtol=1e-5)
    # One more Lloyd step from the returned centroids keeps the same nearest-centroid rule.
    _, a2 = ref.lloyd_step(jnp.asarray(x), c)
    np.testing.assert_allclose(d64[np.arange(len(x)), np.asarray(a2)], d64.min(1), rtol=1e-5)


def test_lloyd_step_from_bad_start_decreases_objective():
    x = jax.random.normal(jax.random.key(1), (64, 4))
    c = x[:8] + 3.0
    prev = float(ref.kmeans_objective(x, c, jnp.argmin(ref._sq_dists(x, c), -1)))
    for _ in range(4):
        c, _ = ref.lloyd_step(x, c)
        obj = float(ref.kmeans_objective(x, c, jnp.argmin(ref._sq_dists(x, c), -1)))
        assert obj <= prev + 1e-4
        prev = obj


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_invertible(bits):
    codes = jax.random.randint(jax.random.key(bits), (5, 3, 16), 0, 2 ** bits).astype(jnp.uint8)
    packed = packing.pack_codes(codes, bits)
    assert packed.shape == (5, 3, 16 * bits // 8) and packed.dtype == jnp.uint8
    np.testing.assert_array_equal(packing.unpack_codes(packed, bits), codes)


@pytest.mark.parametrize("bits", [2, 4])
def test_symmetric_codes_in_range_and_error_bounded(bits):
    x = jax.random.normal(jax.random.key(0), (32, 16)) * 3.0
    packed, scales = ref.quantize_symmetric(x, bits, 8)
    assert scales.dtype == jnp.bfloat16 and scales.shape == (32, 2)
    codes = np.asarray(packing.unpack_codes(packed, bits)).astype(int) - 2 ** (bits - 1)
    qmax = 2 ** (bits - 1) - 1
    assert codes.min() >= -qmax and codes.max() <= qmax  # INT2 uses {-1, 0, 1}
    x_hat = ref.dequantize_symmetric(packed, scales, bits)
    s = np.repeat(np.asarray(scales.astype(jnp.float32)), 8, axis=-1)
    amax = np.repeat(np.abs(np.asarray(x)).reshape(32, 2, 8).max(-1), 8, axis=-1)
    # The scale is rounded up: nothing clips, the error is the rounding error <= s/2.
    assert np.all(amax <= qmax * s)
    assert np.all(np.abs(np.asarray(x_hat) - np.asarray(x)) <= s / 2 * (1 + 1e-6))


def test_qvg_roundtrip_exact_when_residual_is_zero():
    protos = jnp.round(jax.random.normal(jax.random.key(0), (4, 16)) * 8) / 8  # bf16-exact
    x = protos[jax.random.randint(jax.random.key(1), (32,), 0, 4)].at[:4].set(protos)
    cfg = ref.QVGConfig(bits=2, stages=1, block=8, num_centroids=4, chunk=32, kmeans_iters=5)
    code = ref.qvg_quantize(x[None], cfg, jax.random.key(2))
    assert code.assign.dtype == jnp.uint8 and code.centroids.dtype == jnp.bfloat16
    np.testing.assert_array_equal(ref.qvg_dequantize(code, cfg)[0], x)


def test_more_stages_reduce_error():
    x = jax.random.normal(jax.random.key(0), (2, 128, 16))
    errs = []
    for stages in (0, 1, 4):
        cfg = ref.QVGConfig(bits=2, stages=stages, block=16, num_centroids=8, chunk=64,
                            kmeans_iters=5)
        errs.append(float(jnp.linalg.norm(ref.qvg_roundtrip(x, cfg, jax.random.key(1)) - x)))
    assert errs[0] > errs[1] > errs[2]


def test_effective_bits_by_hand():
    qvg = ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=8)
    # codes 8*16*2 + bf16 scales 8*1*16 + uint8 ids 8*8 + bf16 centroids 4*16*16 = 1472 bits / 128
    assert ref.effective_bits(qvg, 16) == {"nominal": 2.0, "effective": 11.5,
                                           "compression": 16 / 11.5}
    kivi = ref.KIVIConfig(bits=2, group=4, block=8, residual=8)
    # keys 256 + 2 groups*16 ch*2*16 = 1280; values 256 + 8 tok*2 blocks*2*16 = 768; mean 1024
    assert ref.effective_bits(kivi, 16)["effective"] == 8.0
    # 12 cached tokens. Keys: 8 quantized at 1280 / 128 = 10 bits + 4 in bf16; values: codes of all
    # 12 at 768 / 128 = 6 bits + the 8 most recent (the window) in bf16.
    np.testing.assert_allclose(ref.effective_bits(kivi, 16, context_len=12)["effective"],
                               ((8 * 10 + 4 * 16) + (12 * 6 + 8 * 16)) / 24)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="bits=3"):
        ref.QVGConfig(bits=3)
    with pytest.raises(ValueError, match="bits=5"):
        ref.KIVIConfig(bits=5)
    with pytest.raises(ValueError, match="divide the head dim"):
        ref.qvg_preset("qvg").check_head_dim(32)  # block 64 > D = 32
    with pytest.raises(ValueError, match="divide the head dim"):
        ref.quantize_symmetric(jnp.ones((2, 12)), 2, 8)
    with pytest.raises(ValueError, match="preset"):
        ref.qvg_preset("qvg_max")
    with pytest.raises(ValueError, match="multiple of group"):
        ref.KIVIConfig(group=32, residual=48)
    with pytest.raises(ValueError, match="implementation"):
        QVGCache(implementation="cuda")


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _dense_of_qvg(layer, cfg, length, rope_base):
    """Dequantize a QVGCache layer into dense [B, K, S, D] keys (RoPE'd) and values."""
    k = ref._dequant_chunks(layer["k"], cfg.bits)
    v = ref._dequant_chunks(layer["v"], cfg.bits)
    k = rope_slots(k, rope_base)
    n = cfg.chunk
    nq = (length // n) * n
    # the window's first N slots (a prefill leaves fewer than N tokens there)
    k = k.at[:, :, nq:nq + n].set(layer["wk"][:, :, :n][:, :, : k.shape[2] - nq])
    v = v.at[:, :, nq:nq + n].set(layer["wv"][:, :, :n][:, :, : v.shape[2] - nq])
    return k, v


def test_qvg_cache_attention_matches_dequantize_then_dense():
    b, kh, h, d, n = 2, 2, 4, 16, 8
    cfg = ref.QVGConfig(bits=4, stages=1, block=8, num_centroids=4, chunk=n, kmeans_iters=3)
    be = QVGCache(config=cfg, implementation="reference")
    ks = jax.random.split(jax.random.key(0), 3)
    k = jax.random.normal(ks[0], (b, kh, 19, d))
    v = jax.random.normal(ks[1], (b, kh, 19, d))
    q = jax.random.normal(ks[2], (b, h, 3, d))
    layer = be.init(b, 32, kh, d, jnp.float32)
    start = jnp.zeros((b,), jnp.int32)
    update = jax.jit(be.update)
    layer = update(layer, k[:, :, :16], v[:, :, :16], start)
    start = jnp.full((b,), 16, jnp.int32)
    layer = update(layer, k[:, :, 16:], v[:, :, 16:], start)
    out = jax.jit(be.attend)(layer, q, start)
    kd, vd = _dense_of_qvg(layer, cfg, 19, be.rope_base)
    mask = attention_math.causal_cache_mask(start, 3, kd.shape[2])
    expect = _grouped_attention(q, kd, vd, mask)
    chex.assert_trees_all_close(out, expect, atol=2e-5, rtol=2e-5)
    # The window holds the 3 newest (exact) keys; the 16 older ones went through the quantizer.
    chex.assert_trees_all_close(layer["wk"][:, :, :3], k[:, :, 16:])
    rel = jnp.linalg.norm(kd[:, :, :16] - k[:, :, :16]) / jnp.linalg.norm(k[:, :, :16])
    assert 0 < float(rel) < 0.3


def test_kivi_cache_streaming_equals_prefill_and_int8_is_close_to_dense():
    b, kh, h, d = 1, 2, 2, 16
    cfg = ref.KIVIConfig(bits=8, group=4, block=8, residual=8)
    be = KIVICache(config=cfg)
    ks = jax.random.split(jax.random.key(1), 3)
    k = jax.random.normal(ks[0], (b, kh, 12, d))
    v = jax.random.normal(ks[1], (b, kh, 12, d))
    q = jax.random.normal(ks[2], (b, h, 1, d))
    upd, att, flush = jax.jit(be.update), jax.jit(be.attend), jax.jit(be.flush)
    one = upd(be.init(b, 16, kh, d, jnp.float32), k, v, jnp.zeros((b,), jnp.int32))
    steps = upd(be.init(b, 16, kh, d, jnp.float32), k[:, :, :6], v[:, :, :6],
                jnp.zeros((b,), jnp.int32))
    for i in range(6, 12):  # a decode loop: a flush after every one-token step
        steps = flush(upd(steps, k[:, :, i:i + 1], v[:, :, i:i + 1], jnp.full((b,), i, jnp.int32)))
    chex.assert_trees_all_equal(one, steps)
    start = jnp.full((b,), 11, jnp.int32)
    dense = cache_backend.DenseKVCache()
    ref_layer = dense.update(dense.init(b, 16, kh, d, jnp.float32), k, v,
                             jnp.zeros((b,), jnp.int32))
    chex.assert_trees_all_close(att(one, q, start), dense.attend(ref_layer, q, start), atol=2e-2)


_KIVI_WINDOW = KIVICache(config=ref.KIVIConfig(bits=2, group=4, block=8, residual=8))
# one jitted update / attend for every length below (their shapes repeat: one compile each)
_kivi_update = jax.jit(_KIVI_WINDOW.update)
_kivi_attend = jax.jit(_KIVI_WINDOW.attend)
_kivi_flush = jax.jit(_KIVI_WINDOW.flush)
_kivi_roundtrip = jax.jit(ref.kivi_roundtrip, static_argnums=2)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _kivi_chunk_roundtrip(x, cfg, per_channel):
    """KIVI quantize then dequantize of one chunk x [N, D] (the chunk quantizer, jitted)."""
    return ref.kivi_dequantize_chunk(ref.kivi_quantize_chunk(x, cfg, per_channel), cfg, per_channel)


@pytest.mark.parametrize("length", [10, 19, 24])
def test_kivi_values_keep_a_sliding_exact_window(length):
    """KIVI (Liu et al. 2024, Alg. 1): the last ``residual`` values are exact at every length, the
    older ones quantized per token; keys are quantized per channel in whole chunks. At length 10
    with residual 8: keys 0-7 quantized and 8-9 exact, values 0-1 quantized and 2-9 exact (the
    chunked scheme had values 8-9 exact only)."""
    b, kh, h, d, r = 2, 2, 4, 16, 8
    be = _KIVI_WINDOW
    cfg = be.config
    assert cfg.residual == r
    ks = jax.random.split(jax.random.key(length), 3)
    k = jax.random.normal(ks[0], (b, kh, length, d))
    v = jax.random.normal(ks[1], (b, kh, length, d))
    q = jax.random.normal(ks[2], (b, h, 1, d))
    upd = _kivi_update
    prefill = upd(be.init(b, 32, kh, d, jnp.float32), k, v, jnp.zeros((b,), jnp.int32))
    stream = upd(be.init(b, 32, kh, d, jnp.float32), k[:, :, :3], v[:, :, :3],
                 jnp.zeros((b,), jnp.int32))
    for i in range(3, length):  # a decode loop: a flush after every one-token step
        stream = _kivi_flush(upd(stream, k[:, :, i:i + 1], v[:, :, i:i + 1],
                                 jnp.full((b,), i, jnp.int32)))
    chex.assert_trees_all_equal(prefill, stream)
    # The expected cache, built from the chunk quantizer directly.
    nq = (length // r) * r
    k_want, v_want = np.asarray(k).copy(), np.asarray(v).copy()
    for bi in range(b):
        for hi in range(kh):
            for c in range(nq // r):
                chunk = jnp.asarray(k_want[bi, hi, c * r:(c + 1) * r])
                k_want[bi, hi, c * r:(c + 1) * r] = _kivi_chunk_roundtrip(chunk, cfg, True)
            old = jnp.asarray(v_want[bi, hi, :length - r])
            v_want[bi, hi, :length - r] = _kivi_chunk_roundtrip(old, cfg, False)
    start = jnp.full((b,), length - 1, jnp.int32)
    mask = attention_math.causal_cache_mask(start, 1, length)
    attention = _grouped_attention
    want = attention(q, jnp.asarray(k_want), jnp.asarray(v_want), mask)
    chex.assert_trees_all_close(_kivi_attend(prefill, q, start), want, atol=2e-5, rtol=2e-5)
    # and it is not the chunked-values answer (values quantized in whole chunks only)
    v_chunked = np.asarray(v).copy()
    v_chunked[:, :, :nq] = np.asarray(_kivi_roundtrip(k[:, :, :nq], v[:, :, :nq], cfg)[1])
    other = attention(q, jnp.asarray(k_want), jnp.asarray(v_chunked), mask)
    assert float(jnp.max(jnp.abs(other - want))) > 1e-2
