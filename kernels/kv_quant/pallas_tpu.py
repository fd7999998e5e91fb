"""QVG decode attention on TPU: a Pallas kernel that dequantizes each chunk in VMEM.

Dimensions as in :mod:`kernels.kv_quant.reference` (B, K, R = G * T rows, D, N, NC, P, NB, S, C).

Grid (B, K, NC), chunks innermost ("arbitrary"). ``start`` and ``num_quantized`` are prefetched
into SMEM (``PrefetchScalarGridSpec``); the block index maps clamp the chunk index to the last
quantized chunk of the row, so chunks past ``num_quantized`` issue no new DMA and are skipped by
``pl.when``. Each visited chunk's packed codes, bfloat16 scales, uint8 assignments and bf16 centroids
are dequantized piece by piece (:mod:`kernels.kv_quant.pallas_common`), keys are rotated to their
slot positions when they were stored before RoPE (by angle addition from small tables: the
chunk's start angle, one [3, D/2] block per chunk, and the in-chunk offsets', one [3, N, D/2] block
for the whole grid, :func:`kernels.kv_quant.pallas_common.rope_cos_sin`), and the online softmax
(m, l, acc in VMEM scratch) is updated. The last chunk step writes (acc / l, m + log l).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.kv_quant import cost
from kernels.kv_quant import pallas_common as pc
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import QVGConfig

_NT = (((1,), (1,)), ((), ()))  # [M, X] x [N, X] -> [M, N]
_HI = lax.Precision.HIGHEST


def _mm(a, b):
    # f32 operands at full precision; bf16 operands (the one-hot centroid gather) are exact as is
    precision = _HI if a.dtype == jnp.float32 or b.dtype == jnp.float32 else None
    return jnp.dot(a, b, preferred_element_type=jnp.float32, precision=precision)


def _kernel(start_ref, nq_ref, rowoff_ref, q_ref, *refs, cfg: QVGConfig, rope: bool, w: int,
            num_chunks: int, rope_terms: int):
    stages = cfg.stages
    per_code = 4 if stages else 2
    k_refs, v_refs = refs[:per_code], refs[per_code:2 * per_code]
    rest = refs[2 * per_code:]
    if rope:
        freq_ref, off_ref, st_ref, *rest = rest
    out_ref, lse_ref, acc_ref, m_ref, l_ref = rest
    b, c = pl.program_id(0), pl.program_id(2)
    n = k_refs[0].shape[0]
    d = q_ref.shape[-1]
    nq = nq_ref[b]

    @pl.when(c == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    def pieces(code_refs):
        codes_ref, scale_ref = code_refs[0], code_refs[1]
        assign_ref, cent_ref = (code_refs[2], code_refs[3]) if stages else (None, None)
        return pc.dequant_pieces(
            lambda b0, ww: codes_ref[:, pl.ds(b0, ww)],
            lambda bi: scale_ref[:, pl.ds(bi, 1)],
            (lambda s: assign_ref[s]) if stages else None,
            (lambda s, c0, ww: cent_ref[s, :, pl.ds(c0, ww)]) if stages else None,
            _mm, d=d, bits=cfg.bits, block=cfg.block, stages=stages,
            num_centroids=cfg.num_centroids, w=w)

    @pl.when(c * n < nq)
    def _attend():
        kp = pieces(k_refs)
        if rope:
            kpos = (c * n + lax.broadcasted_iota(jnp.int32, (n, w), 0)).astype(jnp.float32)
            zero = jnp.minimum(nq, 0)  # 0 at run time (num_quantized >= 0)

            def rotation(c0, ww):
                cols = pl.ds(c0, ww)
                return pc.rope_cos_sin(
                    kpos, freq_ref[:, cols],
                    tuple(off_ref[i, :, cols] for i in range(3)),
                    tuple(st_ref[pl.ds(i, 1), cols] for i in range(3)), rope_terms, zero)

            kp = pc.rope_pieces(kp, rotation)
        logits = None
        for i, kx in enumerate(kp):
            qx = q_ref[:, pl.ds(i * w, w)].astype(jnp.float32)
            part = lax.dot_general(qx, kx, _NT, preferred_element_type=jnp.float32, precision=_HI)
            logits = part if logits is None else logits + part
        logits = logits * (1.0 / math.sqrt(d))
        rows = logits.shape[0]
        slot = c * n + lax.broadcasted_iota(jnp.int32, (rows, n), 1)
        pos = start_ref[b] + rowoff_ref[...]  # [R, 1]
        valid = (slot < nq) & (slot <= pos)
        prob, corr, m_new, l_new = pc.online_softmax_step(logits, valid, m_ref[...], l_ref[...])
        for i, vx in enumerate(pieces(v_refs)):
            cols = pl.ds(i * w, w)
            acc_ref[:, cols] = corr * acc_ref[:, cols] + _mm(prob, vx)
        m_ref[...] = m_new
        l_ref[...] = l_new

    @pl.when(c == num_chunks - 1)
    def _done():
        out, lse = pc.finalize(acc_ref[...], m_ref[...], l_ref[...])
        out_ref[...] = out
        lse_ref[...] = lse


@functools.partial(jax.jit, static_argnames=("cfg", "num_new", "rope_base", "interpret"))
def qvg_chunk_attention(q: jax.Array, k_code: ref.QVGCode, v_code: ref.QVGCode, cfg: QVGConfig,
                        start: jax.Array, num_quantized: jax.Array, num_new: int,
                        rope_base: float | None, interpret: bool = False
                        ) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, K, R, D] over the QVG chunks, dequantized inside the kernel.

    Same contract as :func:`kernels.kv_quant.api.qvg_chunk_attention`: row r of batch b sits at
    position ``start[b] + r % num_new`` and sees slots ``s < num_quantized[b]`` with ``s <= pos``;
    keys are rotated to their slot positions when ``rope_base`` is set.

    The ``pallas_call`` declares the cost of :func:`kernels.kv_quant.cost.qvg_tpu_cost` (every
    chunk quantized).

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]); rows that see no slot get (0, -inf).

    Raises:
      ValueError: inconsistent shapes, or a head dim the config cannot pack.
    """
    pc.check_inputs(q, k_code, v_code, cfg, num_new)
    b, kh, r, d = q.shape
    nc, n = k_code.codes.shape[2], k_code.codes.shape[3]
    p, nb = k_code.codes.shape[4], k_code.scales.shape[4]
    rope = rope_base is not None
    w = pc.piece_width(d, cfg.bits, cfg.block, rope)
    s, c = cfg.stages, cfg.num_centroids

    def chunk(bi, ki, ci, start_ref, nq_ref):
        # lax.div: truncating division of non-negative ints (jnp's floor division needs sign)
        last = jnp.maximum(lax.div(nq_ref[bi] + n - 1, n) - 1, 0)
        return jnp.minimum(ci, last)

    def code_specs():
        specs = [pl.BlockSpec((None, None, None, n, p),
                              lambda bi, ki, ci, *sr: (bi, ki, chunk(bi, ki, ci, *sr), 0, 0)),
                 pl.BlockSpec((None, None, None, n, nb),
                              lambda bi, ki, ci, *sr: (bi, ki, chunk(bi, ki, ci, *sr), 0, 0))]
        if s:
            specs += [pl.BlockSpec((None, None, None, s, n, 1),
                                   lambda bi, ki, ci, *sr: (bi, ki, chunk(bi, ki, ci, *sr), 0, 0, 0)),
                      pl.BlockSpec((None, None, None, s, c, d),
                                   lambda bi, ki, ci, *sr: (bi, ki, chunk(bi, ki, ci, *sr), 0, 0, 0))]
        return specs

    def code_args(code):
        args = [code.codes, code.scales]
        if s:
            args += [code.assign.reshape(*code.assign.shape, 1), code.centroids]
        return args

    in_specs = [pl.BlockSpec((r, 1), lambda bi, ki, ci, *_: (0, 0)),
                pl.BlockSpec((None, None, r, d), lambda bi, ki, ci, *_: (bi, ki, 0, 0))]
    in_specs += code_specs() + code_specs()
    args = [(jnp.arange(r, dtype=jnp.int32) % num_new)[:, None], q]
    args += code_args(k_code) + code_args(v_code)
    terms = pc.rope_series_terms(nc * n, d, rope_base) if rope else 0
    if rope:
        # frequencies and offsets: one block for the whole grid, fetched once; chunk starts:
        # one [3, D/2] block per chunk
        in_specs += [pl.BlockSpec((1, d // 2), lambda *_: (0, 0)),
                     pl.BlockSpec((3, n, d // 2), lambda *_: (0, 0, 0)),
                     pl.BlockSpec((None, 3, d // 2),
                                  lambda bi, ki, ci, *sr: (chunk(bi, ki, ci, *sr), 0, 0))]
        args += list(pc.rope_tables(nc, n, d, rope_base))

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(b, kh, nc),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, r, d), lambda bi, ki, ci, *_: (bi, ki, 0, 0)),
                   pl.BlockSpec((None, None, r, 1), lambda bi, ki, ci, *_: (bi, ki, 0, 0))],
        scratch_shapes=[pltpu.VMEM((r, d), jnp.float32), pltpu.VMEM((r, 1), jnp.float32),
                        pltpu.VMEM((r, 1), jnp.float32)],
    )
    out, lse = pl.pallas_call(
        functools.partial(_kernel, cfg=cfg, rope=rope, w=w, num_chunks=nc, rope_terms=terms),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((b, kh, r, d), jnp.float32),
                   jax.ShapeDtypeStruct((b, kh, r, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost.qvg_tpu_cost(q, k_code, v_code, cfg, w=w, rope=rope,
                                        rope_terms=terms),
        name="qvg_chunk_attention",
    )(start.astype(jnp.int32), num_quantized.astype(jnp.int32), *args)
    return out, lse[..., 0]
