"""FFD decode attention on GPU: a Pallas (Triton) kernel over the kept pages of each (row, kv head).

Dimensions as in :mod:`kernels.sparse_decode.reference` (B, K, G, D, p, P, W = D/16); Gp = G padded
to 16 rows (the smallest tensor-core tile), M page slots per (row, kv head), NS splits of the slots
(split-K), MPS = M / NS slots per split.

Two kernels. :func:`ffd_pages_attention` (``top_k``, ``max_pages``, or shapes the fused kernel does
not take): the selection (packed 2-bit scan and the top-delta or top-k rule,
:func:`reference.ffd_keep`) runs once, before the kernel, and yields the kept page indices packed to
the front of ``idx [B, K, M]`` and their number ``count [B, K]`` (:func:`reference.page_list`); the
kernel attends exactly those pages, those of :func:`kernels.sparse_decode.api.ffd_select`.
:func:`ffd_decode_fused` (the top-delta rule, the default): each program estimates its pages'
logits itself and applies the rule to those float32 estimates, keeping the page that sets the
threshold by its index; a GPU may round the estimates differently from ``ffd_select`` (fused
multiply-adds, reduction order), so a page whose estimate lies within float32 rounding of the
threshold may be kept by one and skipped by the other; every other page is decided alike, and
``return_keep`` reports the kernel's own choice. In the first kernel, program (b, k, s) walks the slots
``s * MPS .. min((s + 1) * MPS, count) - 1``; for each listed page it loads the packed codes and
scale, forms the estimated logits slab by slab, adds the float8 residual term (refined logits), and
updates an online softmax with the bf16 values. Each program writes its (acc, m, l) partial; the
splits and the exact tail page are merged with a log-sum-exp outside the kernel. Skipped pages are
never read.

Triton tensors must have power-of-two sizes. Every load is a power-of-two slice: the head dim D is
split into power-of-two channel chunks (D = 96 is 64 + 32, W = 6 words is 4 + 2), so any D that is
a multiple of 16 works without copying the cache; the page size p must be a power of two >= 16.
Padding rows carry zero queries; their partials are discarded.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.sparse_decode import cost
from kernels.sparse_decode.reference import CODES_PER_WORD

ROWS = 16


def pow2_parts(n: int) -> tuple[tuple[int, int], ...]:
    """(offset, size) chunks of ``0 .. n-1`` with power-of-two sizes, largest first (6 -> 4 + 2)."""
    parts, off = [], 0
    for bit in reversed(range(n.bit_length())):
        if n & (1 << bit):
            parts.append((off, 1 << bit))
            off += 1 << bit
    return tuple(parts)


def _kernel(idx_ref, count_ref, q_ref, codes_ref, scale_ref, resid_ref, v_ref,
            acc_ref, m_ref, l_ref, *, slots_per_split: int):
    s = pl.program_id(2)
    rows = q_ref.shape[0]
    w = codes_ref.shape[-2]
    wparts = pow2_parts(w)  # word chunks of one slab
    dparts = tuple((CODES_PER_WORD * o, CODES_PER_WORD * z) for o, z in wparts)  # channel chunks
    lo = s * slots_per_split
    hi = jnp.minimum(lo + slots_per_split, count_ref[0])
    f32 = jnp.float32
    qd = [q_ref[:, pl.ds(o, z)] for o, z in dparts]  # [Gp, Dc], already / sqrt(D)
    # slab sl holds the channels sl*W .. sl*W+W-1 (planar packing), taken in the same word chunks
    qslab = [[q_ref[:, pl.ds(sl * w + o, z)] for o, z in wparts] for sl in range(CODES_PER_WORD)]

    def body(slot, carry):
        accs, m, l = carry
        j = idx_ref[slot]
        qs = [x * scale_ref[j, pl.ds(o, z)][None, :] for x, (o, z) in zip(qd, dparts)]
        logits = -1.5 * sum(jnp.sum(x, axis=-1) for x in qs)[:, None]  # [Gp, 1]
        words = [codes_ref[j, pl.ds(o, z), :] for o, z in wparts]  # [Wc, p] int32, token-minor
        for sl in range(CODES_PER_WORD):
            for (o, z), wd, qc in zip(wparts, words, qslab[sl]):
                c = (lax.shift_right_logical(wd, jnp.int32(2 * sl)) & 3).astype(f32)
                qsl = qc * scale_ref[j, pl.ds(sl * w + o, z)][None, :]
                logits = logits + jnp.sum(qsl[:, :, None] * c[None, :, :], axis=1)  # [Gp, p]
        for x, (o, z) in zip(qs, dparts):
            logits = logits + plgpu.dot(x, resid_ref[j, :, pl.ds(o, z)].astype(f32), trans_b=True)
        m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
        corr = jnp.exp(m - m_new)
        e = jnp.exp(logits - m_new[:, None])
        accs = tuple(corr[:, None] * a + plgpu.dot(e, v_ref[j, :, pl.ds(o, z)].astype(f32))
                     for a, (o, z) in zip(accs, dparts))
        return accs, m_new, corr * l + jnp.sum(e, axis=-1)

    init = (tuple(jnp.zeros((rows, z), f32) for _, z in dparts),
            jnp.full((rows,), -jnp.inf, f32), jnp.zeros((rows,), f32))
    accs, m, l = lax.fori_loop(lo, hi, body, init)
    for a, (o, z) in zip(accs, dparts):
        acc_ref[:, pl.ds(o, z)] = a
    m_ref[...] = m
    l_ref[...] = l


def _query_and_cache_specs(d: int, n: int, w: int, p: int) -> list[pl.BlockSpec]:
    """BlockSpecs of the padded queries [B, K, ROWS, D] and the whole cache of one (row, kv head):
    codes [B, K, P, W, p], scales [B, K, P, D], residuals and values [B, K, P, p, D], on a
    (row, kv head, split) grid."""
    return [pl.BlockSpec((None, None, ROWS, d), lambda bi, ki, si: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, n, w, p), lambda bi, ki, si: (bi, ki, 0, 0, 0)),
            pl.BlockSpec((None, None, n, d), lambda bi, ki, si: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, n, p, d), lambda bi, ki, si: (bi, ki, 0, 0, 0)),
            pl.BlockSpec((None, None, n, p, d), lambda bi, ki, si: (bi, ki, 0, 0, 0))]


@functools.partial(jax.jit, static_argnames=("num_splits", "interpret", "num_warps",
                                             "assumed_kept_fraction"))

def ffd_pages_attention(qg: jax.Array, codes: jax.Array, scale: jax.Array, resid: jax.Array,
                        v: jax.Array, idx: jax.Array, count: jax.Array, *, num_splits: int = 8,
                        interpret: bool = False, num_warps: int = 4,
                        assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION):
    """Online-softmax partials over the listed pages of each (row, kv head).

    Args:
      qg: float32 [B, K, G, D] queries already scaled by 1/sqrt(D); G <= 16; D a multiple of 16.
      codes: int32 [B, K, P, W, p] (token-minor); scale: float32 [B, K, P, D]; resid: float8 [B, K, P, p, D];
        v: bfloat16 [B, K, P, p, D] (the FFD cache arrays; p a power of two >= 16).
      idx: int32 [B, K, M] page indices, the ``count[b, k]`` attended ones first
        (:func:`kernels.sparse_decode.reference.page_list`).
      count: int32 [B, K], 0..M.
      num_splits: NS, must divide M.
      assumed_kept_fraction: f in (0, 1], the fraction of the P pages the declared
        ``pl.CostEstimate`` assumes listed (:func:`kernels.sparse_decode.cost.ffd_gpu_cost`); it
        changes the cost XLA sees, never the result.

    Returns:
      (acc [B, K, NS, G, D], m [B, K, NS, G], l [B, K, NS, G]) float32 partials; a split with no
      listed page gives (0, -inf, 0).

    Raises:
      ValueError: G > 16, ``num_splits`` does not divide M, p is not a power of two >= 16, D is
        not a multiple of 16, or ``assumed_kept_fraction`` is outside (0, 1].
    """
    b, kh, g, d = qg.shape
    n, w, p = codes.shape[2], codes.shape[3], codes.shape[4]
    m_slots = idx.shape[-1]
    if g > ROWS:
        raise ValueError(f"pallas_gpu FFD supports up to {ROWS} query heads per kv head, got {g}")
    if num_splits < 1 or m_slots % num_splits:
        raise ValueError(f"num_splits={num_splits} must divide the {m_slots} page slots")
    if p < 16 or p & (p - 1):
        raise ValueError(f"pallas_gpu FFD needs a power-of-two page size >= 16, got {p}")
    if d != CODES_PER_WORD * w:
        raise ValueError(f"head dim {d} must be {CODES_PER_WORD} x the {w} code words")
    mps = m_slots // num_splits
    qp = jnp.pad(qg.astype(jnp.float32), ((0, 0), (0, 0), (0, ROWS - g), (0, 0)))
    estimate = cost.ffd_gpu_cost(qp, codes, scale, resid, v, idx, num_splits=num_splits,
                                 parts=len(pow2_parts(w)), kept_fraction=assumed_kept_fraction)
    f32 = jnp.float32
    acc, m, l = pl.pallas_call(
        functools.partial(_kernel, slots_per_split=mps),
        grid=(b, kh, num_splits),
        in_specs=[
            pl.BlockSpec((None, None, m_slots), lambda bi, ki, si: (bi, ki, 0)),
            pl.BlockSpec((None, None, 1), lambda bi, ki, si: (bi, ki, 0)),
            *_query_and_cache_specs(d, n, w, p),
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
        cost_estimate=estimate,
        name="ffd_pages_attention",
    )(idx.astype(jnp.int32), count.astype(jnp.int32)[..., None], qp, codes, scale, resid, v)
    return acc[:, :, :, :g], m[:, :, :, :g], l[:, :, :, :g]


# -- the fused GPU decode: scan, top-delta test and attention in one kernel, split-K -----------

MIN_PROGRAMS = 264  # two thread blocks per SM of an H100 SXM (132 SMs)


def fused_pages_per_program(num_pages: int, pairs: int) -> int:
    """Pages each program scans so that ``pairs * ceil(P / PPB) >= 264`` where P allows (at least
    one page per program): ``max(1, P * pairs // 264)``."""
    return max(1, num_pages * pairs // MIN_PROGRAMS)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _fused_kernel(len_ref, q_ref, codes_ref, scale_ref, resid_ref, v_ref, keep_ref, acc_ref,
                  m_ref, l_ref, *, pages_per_program: int, delta: float, real_rows: int):
    b, s = pl.program_id(0), pl.program_id(2)
    rows, d = q_ref.shape
    w, p = codes_ref.shape[-2], codes_ref.shape[-1]
    f32 = jnp.float32
    num_full = len_ref[b] // p
    q = q_ref[...]  # [R, D] float32, already / sqrt(D); rows >= G are zero
    real = lax.broadcasted_iota(jnp.int32, (rows,), 0) < real_rows

    def estimate(j):  # estimated logits [R, p] of page j and q * scale [R, D]
        qs = q * scale_ref[j, :][None, :]
        words = codes_ref[j, :, :]  # [W, p] int32, token-minor
        logits = jnp.zeros((rows, p), f32) - 1.5 * jnp.sum(qs, axis=1)[:, None]
        for sl in range(CODES_PER_WORD):  # slab sl: channels sl*W .. sl*W+W-1
            c = (lax.shift_right_logical(words, jnp.int32(2 * sl)) & 3).astype(f32)
            qsl = q_ref[:, pl.ds(sl * w, w)] * scale_ref[j, pl.ds(sl * w, w)][None, :]
            logits = logits + jnp.sum(qsl[:, :, None] * c[None, :, :], axis=1)
        return logits, qs

    def page_max(logits):
        return jnp.where(real, jnp.max(logits, axis=1), -jnp.inf)  # [R]

    last = jnp.maximum(num_full - 1, 0)
    first_max, last_max = page_max(estimate(0)[0]), page_max(estimate(last)[0])
    theta = jnp.maximum(first_max, last_max) - delta
    # the page that sets the threshold, kept by its index: the loop below estimates it again, and
    # the compiler may round that evaluation differently (reference.select_pages)
    ref_page = jnp.where(jnp.max(jnp.where(real & ~(first_max < last_max), 1, 0)) > 0, 0, last)
    lo = s * pages_per_program
    hi = jnp.minimum(lo + pages_per_program, num_full)
    slots = keep_ref.shape[0]

    def body(j, carry):
        acc, m, l, flags = carry
        logits, qs = estimate(j)
        pm = jnp.max(logits, axis=1)
        keep = (jnp.max(jnp.where(real & ~(pm < theta), 1, 0)) > 0) | (j == ref_page)  # NaN keeps

        def attend(state):
            acc, m, l = state
            refined = logits + plgpu.dot(qs, resid_ref[j, :, :].astype(f32), trans_b=True)
            m_new = jnp.maximum(m, jnp.max(refined, axis=1))
            corr = jnp.exp(m - m_new)
            e = jnp.exp(refined - m_new[:, None])
            acc = corr[:, None] * acc + plgpu.dot(e, v_ref[j, :, :].astype(f32))
            return acc, m_new, corr * l + jnp.sum(e, axis=1)

        acc, m, l = lax.cond(keep, attend, lambda st: st, (acc, m, l))
        flags = jnp.where(lax.broadcasted_iota(jnp.int32, (slots,), 0) == j - lo,
                          keep.astype(jnp.int32), flags)
        return acc, m, l, flags

    init = (jnp.zeros((rows, d), f32), jnp.full((rows,), -jnp.inf, f32), jnp.zeros((rows,), f32),
            jnp.zeros((slots,), jnp.int32))
    acc, m, l, flags = lax.fori_loop(lo, hi, body, init)
    keep_ref[...] = flags
    acc_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


@functools.partial(jax.jit, static_argnames=("delta", "interpret", "num_warps",
                                             "assumed_kept_fraction"))
def ffd_decode_fused(qg: jax.Array, codes: jax.Array, scale: jax.Array, resid: jax.Array,
                     v: jax.Array, lengths: jax.Array, *, delta: float, interpret: bool = False,
                     num_warps: int = 4,
                     assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION):
    """FFD's top-delta pages attended in one Triton kernel, split over >= 264 programs.

    Program (b, k, s) scans pages ``s * PPB .. (s + 1) * PPB - 1`` of (row b, kv head k)
    (:func:`fused_pages_per_program`): it estimates each page's logits from the packed 2-bit codes
    (token-minor words, unpacked in registers), computes the top-delta threshold from the first and
    last full pages (paper Sec. 3), and only for a kept page loads the float8 residual and the bf16
    values and updates an online softmax. Each program writes its partial and its pages' keep flags;
    the partials are merged with the tail page outside
    (:func:`kernels.attention_math.merge_partials`).

    Args:
      qg: float32 [B, K, G, D] queries already scaled by 1/sqrt(D); G <= 16.
      codes: int32 [B, K, P, W, p] (W a power of two); scale: float32 [B, K, P, D]; resid: float8
        [B, K, P, p, D]; v: bfloat16 [B, K, P, p, D] (p a power of two >= 16).
      lengths: int32 [B] in 1..S.
      delta: the top-delta margin in nats (a Python float >= 0).
      assumed_kept_fraction: f in (0, 1] for the declared cost
        (:func:`kernels.sparse_decode.cost.ffd_gpu_fused_cost`).

    Returns:
      (acc [B, K, NS, G, D], m [B, K, NS, G], l [B, K, NS, G], keep bool [B, K, P]) with NS the
      programs per (row, kv head); a program that keeps no page gives (0, -inf, 0).

    Raises:
      ValueError: G > 16, W or p not a power of two, p < 16, or D != 16 W.
    """
    b, kh, g, d = qg.shape
    n, w, p = codes.shape[2], codes.shape[3], codes.shape[4]
    if g > ROWS:
        raise ValueError(f"ffd_decode_fused supports up to {ROWS} query heads per kv head, got {g}")
    if p < 16 or p & (p - 1) or w & (w - 1) or d != CODES_PER_WORD * w:
        raise ValueError(f"ffd_decode_fused needs p and W = D / 16 powers of two (p >= 16), got "
                         f"p = {p}, D = {d}, W = {w}")
    ppb = fused_pages_per_program(n, b * kh)
    ns = -(-n // ppb)
    slots = _next_pow2(ppb)
    qp = jnp.pad(qg.astype(jnp.float32), ((0, 0), (0, 0), (0, ROWS - g), (0, 0)))
    estimate = cost.ffd_gpu_fused_cost(qp, codes, scale, resid, v, pages_per_program=ppb,
                                       flag_slots=slots, kept_fraction=assumed_kept_fraction)
    f32 = jnp.float32
    keep, acc, m, l = pl.pallas_call(
        functools.partial(_fused_kernel, pages_per_program=ppb, delta=float(delta), real_rows=g),
        grid=(b, kh, ns),
        in_specs=[
            pl.BlockSpec((b,), lambda bi, ki, si: (0,)),
            *_query_and_cache_specs(d, n, w, p),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, slots), lambda bi, ki, si: (bi, ki, si, 0)),
            pl.BlockSpec((None, None, None, ROWS, d), lambda bi, ki, si: (bi, ki, si, 0, 0)),
            pl.BlockSpec((None, None, None, ROWS), lambda bi, ki, si: (bi, ki, si, 0)),
            pl.BlockSpec((None, None, None, ROWS), lambda bi, ki, si: (bi, ki, si, 0)),
        ],
        out_shape=[jax.ShapeDtypeStruct((b, kh, ns, slots), jnp.int32),
                   jax.ShapeDtypeStruct((b, kh, ns, ROWS, d), f32),
                   jax.ShapeDtypeStruct((b, kh, ns, ROWS), f32),
                   jax.ShapeDtypeStruct((b, kh, ns, ROWS), f32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        cost_estimate=estimate,
        name="ffd_decode_fused",
    )(lengths.astype(jnp.int32), qp, codes, scale, resid, v)
    keep = keep[..., :ppb].reshape(b, kh, ns * ppb)[..., :n] > 0
    return acc[:, :, :, :g], m[:, :, :, :g], l[:, :, :, :g], keep
