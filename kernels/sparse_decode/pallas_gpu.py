"""FFD decode attention on GPU: one fused Pallas (Triton) kernel, selection and attention together.

Dimensions as in :mod:`kernels.sparse_decode.reference`; Gp = G padded to 16 rows (the smallest
tensor-core tile), NS splits of the P pages (split-K), PPS = P / NS pages per split.

Program (b, k, s) walks the full pages of its split. For each page it loads the packed 2-bit codes
and the scale, computes the estimated logits of its Gp query rows slab by slab and their maximum,
and compares them with the threshold ``theta [B, K, Gp]``, which depends only on the first and last
full pages and is therefore known to every program up front: no global synchronization. A kept page
loads its float8 residual and bf16 values (inside ``lax.cond``: a skipped page reads neither),
refines the logits and updates the online softmax. Each program writes its (acc, m, l) partial;
the splits and the exact tail page are merged with a log-sum-exp outside the kernel.

Padding rows carry zero queries and ``theta = +inf``, so they never keep a page.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.sparse_decode.reference import CODES_PER_WORD

ROWS = 16


def _kernel(q_ref, theta_ref, nfull_ref, codes_ref, scale_ref, resid_ref, v_ref,
            acc_ref, m_ref, l_ref, *, pages_per_split: int):
    s = pl.program_id(2)
    rows, d = q_ref.shape
    w = codes_ref.shape[-1]
    theta = theta_ref[...]  # [Gp]
    lo = s * pages_per_split
    hi = jnp.minimum(lo + pages_per_split, nfull_ref[0])

    def body(j, carry):
        q = q_ref[...]  # [Gp, D], already / sqrt(D)
        qs = q * scale_ref[j, :][None, :]
        words = codes_ref[j, :, :]  # [p, W] int32
        est = -1.5 * jnp.sum(qs, axis=-1)[:, None]
        for sl in range(CODES_PER_WORD):
            c = (lax.shift_right_logical(words, jnp.int32(2 * sl)) & 3).astype(jnp.float32)
            qsl = q_ref[:, pl.ds(sl * w, w)] * scale_ref[j, pl.ds(sl * w, w)][None, :]
            est = est + jnp.sum(qsl[:, None, :] * c[None, :, :], axis=-1)  # [Gp, p]
        keep = jnp.max(jnp.max(est, axis=-1) - theta) >= 0  # some head reaches its threshold

        def attend(carry):
            acc, m, l = carry
            r = resid_ref[j, :, :].astype(jnp.float32)  # [p, D]
            logits = est + plgpu.dot(qs, r, trans_b=True)
            m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
            corr = jnp.exp(m - m_new)
            e = jnp.exp(logits - m_new[:, None])
            vj = v_ref[j, :, :].astype(jnp.float32)
            return (corr[:, None] * acc + plgpu.dot(e, vj), m_new, corr * l + jnp.sum(e, axis=-1))

        return lax.cond(keep, attend, lambda c: c, carry)

    init = (jnp.zeros((rows, d), jnp.float32), jnp.full((rows,), -jnp.inf, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    acc, m, l = lax.fori_loop(lo, hi, body, init)
    acc_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


@functools.partial(jax.jit, static_argnames=("num_splits", "interpret", "num_warps"))
def ffd_fused_attention(qg: jax.Array, theta: jax.Array, num_full: jax.Array, codes: jax.Array,
                        scale: jax.Array, resid: jax.Array, v: jax.Array, *, num_splits: int = 8,
                        interpret: bool = False, num_warps: int = 4):
    """Fused scan + top-delta filter + attention over the full pages.

    Args:
      qg: float32 [B, K, G, D] queries already scaled by 1/sqrt(D); G <= 16.
      theta: float32 [B, K, G] per-head thresholds (``reference.ffd_threshold``; for top-k, the k-th
        score repeated over G).
      num_full: int32 [B] full pages per row.
      codes, scale, resid, v: the FFD cache arrays (P pages, power-of-two p and D).
      num_splits: NS, must divide P.

    Returns:
      (acc [B, K, NS, G, D], m [B, K, NS, G], l [B, K, NS, G]) float32 partials.

    Raises:
      ValueError: G > 16 or ``num_splits`` does not divide P.
    """
    b, kh, g, d = qg.shape
    n, p, w = codes.shape[2], codes.shape[3], codes.shape[4]
    if g > ROWS:
        raise ValueError(f"pallas_gpu FFD supports up to {ROWS} query heads per kv head, got {g}")
    if n % num_splits:
        raise ValueError(f"num_splits={num_splits} must divide the {n} pages")
    pps = n // num_splits
    qp = jnp.pad(qg.astype(jnp.float32), ((0, 0), (0, 0), (0, ROWS - g), (0, 0)))
    tp = jnp.pad(theta.astype(jnp.float32), ((0, 0), (0, 0), (0, ROWS - g)),
                 constant_values=jnp.inf)
    nf = jnp.broadcast_to(num_full.astype(jnp.int32)[:, None, None], (b, kh, ROWS))
    f32 = jnp.float32
    acc, m, l = pl.pallas_call(
        functools.partial(_kernel, pages_per_split=pps),
        grid=(b, kh, num_splits),
        in_specs=[
            pl.BlockSpec((None, None, ROWS, d), lambda bi, ki, si: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, ROWS), lambda bi, ki, si: (bi, ki, 0)),
            pl.BlockSpec((None, None, ROWS), lambda bi, ki, si: (bi, ki, 0)),
            pl.BlockSpec((None, None, n, p, w), lambda bi, ki, si: (bi, ki, 0, 0, 0)),
            pl.BlockSpec((None, None, n, d), lambda bi, ki, si: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, n, p, d), lambda bi, ki, si: (bi, ki, 0, 0, 0)),
            pl.BlockSpec((None, None, n, p, d), lambda bi, ki, si: (bi, ki, 0, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, ROWS, d), lambda bi, ki, si: (bi, ki, si, 0, 0)),
            pl.BlockSpec((None, None, None, ROWS), lambda bi, ki, si: (bi, ki, si, 0)),
            pl.BlockSpec((None, None, None, ROWS), lambda bi, ki, si: (bi, ki, si, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct((b, kh, num_splits, ROWS, d), f32),
                   jax.ShapeDtypeStruct((b, kh, num_splits, ROWS), f32),
                   jax.ShapeDtypeStruct((b, kh, num_splits, ROWS), f32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        name="ffd_fused_attention",
    )(qp, tp, nf, codes, scale, resid, v)
    return acc[:, :, :, :g], m[:, :, :, :g], l[:, :, :, :g]
