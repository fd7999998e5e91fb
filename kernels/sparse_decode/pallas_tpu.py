"""FFD decode attention on TPU: a Pallas kernel over the kept pages, gathered by scalar prefetch.

Dimensions as in :mod:`kernels.sparse_decode.reference` (B, K, G, D, p, P, W = D/16), plus M page
slots per (row, kv head) and NS splits of the slots (split-K; M = NS * MPS).

The selection (packed 2-bit scan and the top-delta or top-k rule, capped at ``max_pages`` by score:
:func:`kernels.sparse_decode.reference.ffd_keep`, the mask every implementation uses) runs first and
yields, per (row, kv head), the kept page indices packed to the front of ``idx [B, K, M]`` and their
number ``count [B, K] <= M`` (:func:`kernels.sparse_decode.reference.page_list`). Both are
prefetched into SMEM (``PrefetchScalarGridSpec``); the block index maps read them, so each grid
step's DMA fetches exactly one kept page of codes, scale, residual and values from HBM. Slots beyond
``count`` map to the last kept page (an unchanged block index issues no new DMA) and are skipped by
``pl.when``: skipped pages load neither residual nor values. Each split keeps an online-softmax
partial (acc, m, l) in its output block; the splits and the exact tail page are merged with a log-
sum-exp in :func:`kernels.sparse_decode.reference.merge_partials`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.sparse_decode import cost
from kernels.sparse_decode.reference import CODES_PER_WORD

_NT = (((1,), (1,)), ((), ()))  # contract the last dims: [G, X] x [N, X] -> [G, N]


def _kernel(idx_ref, count_ref, q_ref, codes_ref, scale_ref, resid_ref, v_ref,
            acc_ref, m_ref, l_ref, *, slots_per_split: int, num_kv_heads: int):
    b, k, s, i = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)
    slot = s * slots_per_split + i

    @pl.when(i == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    @pl.when(slot < count_ref[b * num_kv_heads + k])
    def _attend():
        w = codes_ref.shape[-1]
        q = q_ref[...].astype(jnp.float32)  # [G, D], already / sqrt(D)
        qs = q * scale_ref[...]  # [G, D] * [1, D]
        words = codes_ref[...]  # [p, W] int32, planar 2-bit codes
        logits = -1.5 * jnp.sum(qs, axis=-1, keepdims=True)  # [G, 1]
        for sl in range(CODES_PER_WORD):
            c = (lax.shift_right_logical(words, jnp.int32(2 * sl)) & 3).astype(jnp.float32)
            qsl = q_ref[:, pl.ds(sl * w, w)].astype(jnp.float32) * scale_ref[:, pl.ds(sl * w, w)]
            logits = logits + lax.dot_general(qsl, c, _NT, preferred_element_type=jnp.float32)
        r = resid_ref[...].astype(jnp.float32)  # [p, D]
        logits = logits + lax.dot_general(qs, r, _NT, preferred_element_type=jnp.float32)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(logits, axis=-1, keepdims=True))
        corr = jnp.exp(m_prev - m_new)
        e = jnp.exp(logits - m_new)
        l_ref[...] = corr * l_ref[...] + jnp.sum(e, axis=-1, keepdims=True)
        acc_ref[...] = corr * acc_ref[...] + jnp.dot(e, v_ref[...].astype(jnp.float32),
                                                     preferred_element_type=jnp.float32)
        m_ref[...] = m_new


@functools.partial(jax.jit, static_argnames=("num_splits", "interpret", "assumed_kept_fraction"))
def ffd_pages_attention(qg: jax.Array, codes: jax.Array, scale: jax.Array, resid: jax.Array,
                        v: jax.Array, idx: jax.Array, count: jax.Array, *, num_splits: int = 1,
                        interpret: bool = False,
                        assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION):
    """Online-softmax partials over the listed pages of each (row, kv head).

    Args:
      qg: float32 [B, K, G, D] queries already scaled by 1/sqrt(D).
      codes: int32 [B, K, P, p, W]; scale: float32 [B, K, P, D]; resid: float8 [B, K, P, p, D];
        v: bfloat16 [B, K, P, p, D] (the FFD cache arrays).
      idx: int32 [B, K, M] page indices, the ``count[b, k]`` attended ones first.
      count: int32 [B, K], 0..M.
      num_splits: NS, must divide M.
      assumed_kept_fraction: f in (0, 1], the fraction of the P pages the declared
        ``pl.CostEstimate`` assumes listed (:func:`kernels.sparse_decode.cost.ffd_tpu_cost`); it
        changes the cost XLA sees, never the result.

    Returns:
      (acc [B, K, NS, G, D], m [B, K, NS, G, 1], l [B, K, NS, G, 1]) float32 partials.

    Raises:
      ValueError: ``num_splits`` does not divide M, or ``assumed_kept_fraction`` is outside
        (0, 1].
    """
    b, kh, g, d = qg.shape
    n, p, w = codes.shape[2], codes.shape[3], codes.shape[4]
    m_slots = idx.shape[-1]
    if m_slots % num_splits:
        raise ValueError(f"num_splits={num_splits} must divide the {m_slots} page slots")
    mps = m_slots // num_splits
    estimate = cost.ffd_tpu_cost(qg, codes, scale, resid, v, idx, num_splits=num_splits,
                                 kept_fraction=assumed_kept_fraction)

    def page(bi, ki, si, ii, idx_ref, count_ref):
        slot = si * mps + ii
        last = jnp.maximum(count_ref[bi * kh + ki] - 1, 0)
        return idx_ref[(bi * kh + ki) * m_slots + jnp.minimum(slot, last)]

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(b, kh, num_splits, mps),
        in_specs=[
            pl.BlockSpec((None, None, g, d), lambda bi, ki, si, ii, *_: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, None, p, w),
                         lambda bi, ki, si, ii, *r: (bi, ki, page(bi, ki, si, ii, *r), 0, 0)),
            pl.BlockSpec((None, None, None, 1, d),
                         lambda bi, ki, si, ii, *r: (bi, ki, page(bi, ki, si, ii, *r), 0, 0)),
            pl.BlockSpec((None, None, None, p, d),
                         lambda bi, ki, si, ii, *r: (bi, ki, page(bi, ki, si, ii, *r), 0, 0)),
            pl.BlockSpec((None, None, None, p, d),
                         lambda bi, ki, si, ii, *r: (bi, ki, page(bi, ki, si, ii, *r), 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, g, d), lambda bi, ki, si, ii, *_: (bi, ki, si, 0, 0)),
            pl.BlockSpec((None, None, None, g, 1), lambda bi, ki, si, ii, *_: (bi, ki, si, 0, 0)),
            pl.BlockSpec((None, None, None, g, 1), lambda bi, ki, si, ii, *_: (bi, ki, si, 0, 0)),
        ],
    )
    f32 = jnp.float32
    return pl.pallas_call(
        functools.partial(_kernel, slots_per_split=mps, num_kv_heads=kh),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((b, kh, num_splits, g, d), f32),
                   jax.ShapeDtypeStruct((b, kh, num_splits, g, 1), f32),
                   jax.ShapeDtypeStruct((b, kh, num_splits, g, 1), f32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=estimate,
        name="ffd_pages_attention",
    )(idx.reshape(-1).astype(jnp.int32), count.reshape(-1).astype(jnp.int32), qg, codes,
      scale.reshape(b, kh, n, 1, d), resid, v)
