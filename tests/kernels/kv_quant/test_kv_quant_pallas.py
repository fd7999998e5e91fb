"""Pallas QVG decode-attention kernels (TPU and GPU) against the jnp reference, in interpret mode,
and their lowering for TPU and CUDA on a CPU-only machine."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.kv_quant import api, pallas_gpu, pallas_tpu
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import QVGConfig

KERNELS = {"pallas_tpu": pallas_tpu.qvg_chunk_attention,
           "pallas_gpu": pallas_gpu.qvg_chunk_attention}


def _random_code(rng, b, kh, nc, n, d, cfg):
    """Fresh random codes: every byte pattern, positive bf16 scales, random ids and centroids
    (drawn with numpy: no XLA compilation for test inputs)."""
    p = d * cfg.bits // 8
    codes = rng.integers(0, 256, (b, kh, nc, p, n), dtype=np.uint8)  # tokens minor
    scales = rng.uniform(0.05, 0.6, (b, kh, nc, d // cfg.block, n))
    assign = rng.integers(0, cfg.num_centroids, (b, kh, nc, cfg.stages, n), dtype=np.uint8)
    cents = rng.standard_normal((b, kh, nc, cfg.stages, cfg.num_centroids, d))
    return ref.QVGCode(jnp.asarray(codes), jnp.asarray(scales, ref.SCALE_DTYPE),
                       jnp.asarray(assign), jnp.asarray(cents, ref.CENTROID_DTYPE))


def _case(seed, g, t, bits, stages, block, b, start, nq, kh=2, nc=3, n=128, d=32, c=4):
    cfg = QVGConfig(bits=bits, stages=stages, block=block, num_centroids=c, chunk=n)
    rng = np.random.default_rng(seed)
    q = jnp.asarray(2.0 * rng.standard_normal((b, kh, g * t, d)), jnp.float32)
    kc = _random_code(rng, b, kh, nc, n, d, cfg)
    vc = _random_code(rng, b, kh, nc, n, d, cfg)
    return q, kc, vc, cfg, jnp.array(start[:b], jnp.int32), jnp.array(nq[:b], jnp.int32)


# (G, T, bits, stages, block, B, NC, start, num_quantized, rope): GQA 1, 2 and 4; ragged rows (one
# with nothing quantized yet, ones whose window has just started, one ending mid-block, a full
# cache); INT2 / INT4; S = 0, 1, 2 stages; with and without RoPE; chunks of N = 128 (the TPU
# kernel's lanes); NC = 5 gives the GPU kernel uneven splits and the TPU kernel one chunk per step;
# NC = 128 gives the TPU kernel four grid steps of 32 chunks (groups of 4 chunks, two per loop
# trip), as many blocks of the assignments, and a row that ends inside its second block.
CASES = [
    (1, 1, 2, 0, 16, 2, 3, [300, 128], [256, 128], None),
    (4, 2, 4, 1, 8, 3, 5, [240, 40, 632], [128, 0, 640], 10_000.0),
    (2, 1, 2, 2, 8, 2, 4, [376, 160], [384, 128], 500.0),
    (4, 1, 2, 1, 16, 2, 128, [16390, 5000], [16384, 4992], None),
    (4, 1, 2, 1, 16, 2, 128, [16390, 5000], [16384, 4992], 10_000.0),
]


@functools.partial(jax.jit, static_argnames=("cfg", "num_new", "rope"))
def _reference(q, kc, vc, start, nq, *, cfg, num_new, rope):
    """The jnp reference's (out, lse), jitted (one compile instead of one per op)."""
    return api.qvg_chunk_attention(q, kc, vc, cfg, start, nq, num_new, rope,
                                   implementation="reference")


@functools.cache
def _case_and_reference(case):
    """Inputs of ``CASES[case]`` and the reference's (out, lse), shared by both kernels."""
    g, t, bits, stages, block, b, nc, start, nq, rope = CASES[case]
    q, kc, vc, cfg, start, nq = _case(case, g, t, bits, stages, block, b, start, nq, nc=nc)
    want = _reference(q, kc, vc, start, nq, cfg=cfg, num_new=t, rope=rope)
    return (q, kc, vc, cfg, start, nq), want


@pytest.mark.parametrize("impl", list(KERNELS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_interpret_matches_reference(impl, case):
    t, rope = CASES[case][1], CASES[case][-1]
    (q, kc, vc, cfg, start, nq), (want_out, want_lse) = _case_and_reference(case)
    out, lse = api.qvg_chunk_attention(q, kc, vc, cfg, start, nq, t, rope, implementation=impl,
                                       interpret=True)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert out.dtype == lse.dtype == jnp.float32
    np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(np.asarray(want_lse))
    np.testing.assert_allclose(np.asarray(lse)[finite], np.asarray(want_lse)[finite],
                               atol=2e-5, rtol=2e-5)
    # The inputs are informative: the attention is not trivial.
    assert float(jnp.std(want_out)) > 0.03 and finite.mean() > 0.5
    if int(nq.min()) == 0:  # a row with nothing quantized sees no slot: (0, -inf)
        empty = int(jnp.argmin(nq))
        assert np.all(np.isneginf(np.asarray(lse[empty])))
        np.testing.assert_array_equal(out[empty], 0.0)


@pytest.mark.parametrize("block_n,num_splits", [(16, 2), (8, 1)])
def test_gpu_kernel_token_tiles_match_reference(block_n, num_splits):
    """Chunks of N = 32 walked in tiles of 16 or 8 tokens (the tiling that bounds shared memory),
    with ragged quantized lengths that end mid-split."""
    q, kc, vc, cfg, start, nq = _case(7, 2, 2, 2, 1, 8, 2, [70, 40], [64, 32], nc=3, n=32)
    want_out, want_lse = _reference(q, kc, vc, start, nq, cfg=cfg, num_new=2, rope=10_000.0)
    out, lse = pallas_gpu.qvg_chunk_attention(q, kc, vc, cfg, start, nq, 2, 10_000.0,
                                              num_splits=num_splits, block_n=block_n,
                                              interpret=True)
    np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse, want_lse, atol=2e-5, rtol=2e-5)
    assert float(jnp.std(want_out)) > 0.03
    with pytest.raises(ValueError, match="block_n"):
        pallas_gpu.qvg_chunk_attention(q, kc, vc, cfg, start, nq, 2, None, block_n=12,
                                       interpret=True)


@pytest.mark.parametrize("platform,impl", [("tpu", "pallas_tpu"), ("cuda", "pallas_gpu")])
@pytest.mark.parametrize("bits,stages,rope", [(2, 1, 10_000.0), (4, 0, None)])
def test_kernels_lower_for_accelerators(platform, impl, bits, stages, rope):
    q, kc, vc, cfg, start, nq = _case(3, 4, 2, bits, stages, 16, 2, [40, 20], [32, 16],
                                      d=64, n=128, c=16)
    f = jax.jit(lambda q, k, v, s, m: KERNELS[impl](q, k, v, cfg, s, m, 2, rope))
    # a Triton call carries no serialization-compatibility guarantee; we only check that it lowers
    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    exported = jax.export.export(f, platforms=[platform], disabled_checks=checks)(q, kc, vc,
                                                                                 start, nq)
    text = exported.mlir_module()
    assert ("tpu_custom_call" in text) if platform == "tpu" else ("triton" in text.lower())


def test_bad_input_raises():
    q, kc, vc, cfg, start, nq = _case(0, 1, 1, 2, 1, 16, 2, [5, 5], [0, 0])
    with pytest.raises(ValueError, match="num_new"):
        pallas_tpu.qvg_chunk_attention(q, kc, vc, cfg, start, nq, 3, None, interpret=True)
    with pytest.raises(ValueError, match="stages"):
        pallas_gpu.qvg_chunk_attention(q, kc, vc, QVGConfig(bits=2, stages=2, block=16,
                                                            num_centroids=4, chunk=16),
                                       start, nq, 1, None, interpret=True)
    q6, kc6, vc6, cfg6, _, _ = _case(0, 1, 1, 2, 0, 8, 2, [5, 5], [0, 0], d=24, c=4)
    with pytest.raises(ValueError, match="powers of two"):
        pallas_gpu.qvg_chunk_attention(q6, kc6, vc6, cfg6, start, nq, 1, None, interpret=True)
    # the TPU layout: a chunk's tokens are the 128 lanes, a piece's W rows whole sublane tiles;
    # refused before compiling, naming the value and what works
    qa, kca, vca, cfga, _, _ = _case(0, 1, 1, 2, 0, 16, 2, [5, 5], [0, 0], n=64)
    with pytest.raises(ValueError, match=r"chunk=64 is not a multiple of 128.*128, 256"):
        pallas_tpu.qvg_chunk_attention(qa, kca, vca, cfga, start, nq, 1, None, interpret=True)
    qb, kcb, vcb, cfgb, _, _ = _case(0, 1, 1, 2, 0, 16, 2, [5, 5], [0, 0], d=16)
    with pytest.raises(ValueError, match=r"head dim 16 .* = 4 rows.*multiple of 8"):
        pallas_tpu.qvg_chunk_attention(qb, kcb, vcb, cfgb, start, nq, 1, None, interpret=True)
