"""RoPE inside the QVG Pallas kernels (TPU and GPU): keys stored before RoPE are rotated by angle
addition from small tables (:func:`kernels.kv_quant.pallas_common.rope_cos_sin`), at the
reference's float32 angles ``fl(p f)``, at positions beyond 100k where those angles are large.

The plain angle addition ``fl(c N f) + fl(j f)`` differs from ``fl(p f)`` by up to an ulp of the
angle (7.8e-3 rad at p = 128k); on the inputs below that moves the attention output by 5e-4 of its
range, five times the tolerance, so the kernel checks can fail."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import attention_math
from kernels.kv_quant import api, pallas_gpu, pallas_tpu
from kernels.kv_quant import pallas_common as pc
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import QVGConfig
from kernels.rope import rope_angles
from models.rope import RotaryEmbedding

LLAMA3 = RotaryEmbedding(theta=500_000.0, kind="llama3", factor=8.0, original_max_len=8192)
BASES = {64: 10_000.0, 128: LLAMA3, 256: 1_000_000.0}  # head dim -> RoPE frequencies
ULP1 = 2.0 ** -24  # half the float32 spacing at 1


def _tables_at(pos, n, nc, d, base):
    """The kernels' operands for slots ``pos`` (materialized, as a kernel loads them), slots by
    frequencies [T, D/2] (the tables hold frequencies by slots; rope_cos_sin is elementwise)."""
    tab = jax.jit(lambda: pc.rope_tables(nc, n, d, base))()
    c, j = pos // n, pos % n
    off = tuple(jnp.asarray(np.asarray(tab.offsets[i]).T[j]) for i in range(3))
    st = tuple(jnp.asarray(np.asarray(tab.starts[i]).T[c]) for i in range(3))
    return tab.freq.T, off, st


@functools.partial(jax.jit, static_argnames="terms")
def _cos_sin(pos, nq, freq, off, st, terms):
    return pc.rope_cos_sin(pos[:, None].astype(jnp.float32), freq, off, st, terms,
                           jnp.minimum(nq, 0))


def _reference_angles(pos, d, base):
    """The reference's float32 angles fl(p f) (kernels.rope.rope_angles), as float64."""
    return np.asarray(rope_angles(jnp.asarray(pos), d, base)).astype(np.float64)


@pytest.mark.parametrize("d", sorted(BASES))
def test_rope_cos_sin_is_the_reference_angle(d):
    """cos, sin of fl(p f) for p up to 2^17 + 300 to within 7 half-ulps of 1 (table roundings,
    the addition formulas' products and sums); the plain angle addition is off by 1e-3 or more."""
    n, nc, base = 256, 2 ** 17 // 256 + 2, BASES[d]
    pos = np.sort(np.random.default_rng(d).integers(0, nc * n, 4096)).astype(np.int32)
    pos[-1] = nc * n - 1
    freq, off, st = _tables_at(pos, n, nc, d, base)
    terms = pc.rope_series_terms(nc * n, d, base)
    cos, sin = _cos_sin(jnp.asarray(pos), jnp.int32(nc * n), freq, off, st, terms)
    a = _reference_angles(pos, d, base)
    assert a.max() > 1e5  # large angles: f = 1 at the first frequency
    np.testing.assert_allclose(np.asarray(cos), np.cos(a), rtol=0, atol=7 * ULP1)
    np.testing.assert_allclose(np.asarray(sin), np.sin(a), rtol=0, atol=7 * ULP1)
    # without the residual e: cos(B + b) from the tables alone
    plain = np.asarray(st[0] * off[0] - st[1] * off[1], np.float64)
    assert np.abs(plain - np.cos(a)).max() > 1e-3


def test_series_terms_cover_long_contexts():
    """m grows with the largest angle (2 ulp bound on |e|, Taylor remainder below 2^-27); with
    too few terms the rotation at 4M positions is visibly off; positions past 2^24 are refused."""
    assert [pc.rope_series_terms(s, 128, 10_000.0) for s in (1, 2 ** 17, 2 ** 17 + 1, 2 ** 20,
                                                              2 ** 20 + 1, 2 ** 22, 2 ** 24)] == [
        1, 1, 2, 2, 3, 4, 7]
    # frequencies below 1 (a llama3 object whose largest f is 1 too) give the same count
    assert pc.rope_series_terms(2 ** 17, 128, LLAMA3) == 1
    d, n, nc = 64, 4096, 2 ** 22 // 4096
    pos = np.arange(nc * n - 2048, nc * n, dtype=np.int32)
    freq, off, st = _tables_at(pos, n, nc, d, 10_000.0)
    a = _reference_angles(pos, d, 10_000.0)
    terms = pc.rope_series_terms(nc * n, d, 10_000.0)
    cos, _ = _cos_sin(jnp.asarray(pos), jnp.int32(nc * n), freq, off, st, terms)
    np.testing.assert_allclose(np.asarray(cos), np.cos(a), rtol=0, atol=7 * ULP1)
    cos1, _ = _cos_sin(jnp.asarray(pos), jnp.int32(nc * n), freq, off, st, 1)
    assert np.abs(np.asarray(cos1) - np.cos(a)).max() > 1e-5
    for bad in (0, 2 ** 24 + 1):
        with pytest.raises(ValueError, match="in-kernel RoPE"):
            pc.rope_series_terms(bad, 128, 10_000.0)


# -- the kernels at > 100k positions -------------------------------------------------------------

N, NC, G, T = 4096, 25, 2, 2  # 102400 slots
NQ = [NC * N, 23 * N + 1000]  # a full cache; one that ends inside chunk 23 (chunks 24, 25 skipped)


def _random_code(rng, d, cfg):
    """Fresh random QVG codes [B = 2, K = 1, NC, ...] (numpy: no compilation for inputs)."""
    shape = (2, 1, NC)
    codes = rng.integers(0, 256, shape + (d * cfg.bits // 8, N), dtype=np.uint8)  # tokens minor
    scales = rng.uniform(0.05, 0.6, shape + (d // cfg.block, N))
    assign = rng.integers(0, cfg.num_centroids, shape + (cfg.stages, N), dtype=np.uint8)
    cents = rng.standard_normal(shape + (cfg.stages, cfg.num_centroids, d))
    return ref.QVGCode(jnp.asarray(codes), jnp.asarray(scales, ref.SCALE_DTYPE),
                       jnp.asarray(assign), jnp.asarray(cents, ref.CENTROID_DTYPE))


@functools.cache
def _case(d):
    """Inputs and the reference's (out, lse) at head dim d; rows at the last positions."""
    cfg = QVGConfig(bits=2, stages=1, block=32, num_centroids=8, chunk=N)
    rng = np.random.default_rng(d)
    q = jnp.asarray(3.0 * rng.standard_normal((2, 1, G * T, d)), jnp.float32)
    kc, vc = _random_code(rng, d, cfg), _random_code(rng, d, cfg)
    nq = jnp.array(NQ, jnp.int32)
    start = nq - T
    want = jax.jit(lambda q, kc, vc, start, nq: api.qvg_chunk_attention(
        q, kc, vc, cfg, start, nq, T, BASES[d], implementation="reference"))(q, kc, vc, start, nq)
    return (q, kc, vc, cfg, start, nq), tuple(np.asarray(x) for x in want)


@pytest.mark.parametrize("impl", ["pallas_tpu", "pallas_gpu"])
@pytest.mark.parametrize("d", sorted(BASES))
def test_kernel_matches_reference_beyond_100k(impl, d):
    (q, kc, vc, cfg, start, nq), (want, want_lse) = _case(d)
    if impl == "pallas_tpu":
        out, lse = pallas_tpu.qvg_chunk_attention(q, kc, vc, cfg, start, nq, T, BASES[d],
                                                  interpret=True)
    else:
        out, lse = pallas_gpu.qvg_chunk_attention(q, kc, vc, cfg, start, nq, T, BASES[d],
                                                  block_n=512, interpret=True)
    span = np.abs(want).max()
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=1e-4 * span)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5)


def test_inputs_resolve_the_angle_rounding():
    """Control: the same attention with the plain angle addition's angles fl(c N f) + fl(j f)
    (float64 cos / sin of that sum) is more than 1e-4 of the range away from the reference, so
    the tolerance above tells the reference's angles from the plain addition's."""
    d = 128
    (q, kc, vc, cfg, start, nq), (want, _) = _case(d)
    dequantize = jax.jit(ref.qvg_dequantize, static_argnums=1)
    k, v = dequantize(kc, cfg), dequantize(vc, cfg)  # [B, K, S, D]
    pos = np.arange(NC * N)
    ang = _reference_angles(pos // N * N, d, LLAMA3) + _reference_angles(pos % N, d, LLAMA3)
    cos, sin = jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)
    x1, x2 = k[..., : d // 2], k[..., d // 2:]
    kr = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    rowpos = np.asarray(start)[:, None] + np.arange(G * T) % T  # [B, R]
    valid = (pos < np.asarray(nq)[:, None, None]) & (pos <= rowpos[..., None])  # [B, R, S]
    out, _ = jax.jit(attention_math.partial_attention)(q, kr, v, jnp.asarray(valid)[:, None])
    assert np.abs(np.asarray(out) - want).max() > 1e-4 * np.abs(want).max()
