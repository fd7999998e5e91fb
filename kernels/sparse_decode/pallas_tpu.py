"""FFD decode attention on TPU: two Pallas kernels, the page scan with the selection, and the
attention over the kept pages.

Dimensions as in :mod:`kernels.sparse_decode.reference` (B, K, G, D, p, P, W = D/16), plus M page
slots per (row, kv head), PB pages per scan block, C kept pages per copy round, R = G rounded up to
a multiple of 8 (the query rows a kernel computes: whole sublane tiles).

* :func:`ffd_scan_select` (grid B x K): streams the token-minor 2-bit codes ``[PB, W, p]`` and the
  scales of PB pages per block through double-buffered VMEM (asynchronous copies from HBM, block
  j + 1 in flight while block j is scanned; blocks past a row's last full page are not copied),
  forms every page's largest estimated logit per query head (one ``[3R, D] x [D, p]`` product per
  page), keeps them in VMEM, then applies the top-delta rule (threshold from the first and last
  full pages, paper Sec. 3) and compacts the kept pages into a list ``idx [B, K, M]`` with its
  count ``[B, K]`` (a prefix count by a small triangular product and a one-hot sum; no sort).
* :func:`ffd_pages_attention` (grid B x K): the page list, the counts and the lengths are scalar-
  prefetched into SMEM; the codes, scales, residuals and values stay in HBM (``memory_space=ANY``)
  and the kernel copies C kept pages per round into VMEM with asynchronous DMAs (codes, scales
  and residuals double-buffered, values triple-buffered), looping ``ceil(count / C)`` rounds. In
  round r it computes the refined logits ``(q * scale) . (c - 1.5 + resid)`` and the online
  softmax of round r's pages, the probabilities-times-values products of round r - 1 (so that the
  vector work of one round overlaps the matrix work of the other), and issues the copies of page
  c of round r + 1 right after reading page c of round r (the scalar work of issuing them then
  overlaps the vector work). Page indices are clamped once when they are read (the copies skip
  their own bounds checks); all copies of a round signal one semaphore per array, so a full round
  is one wait per array and the last one at most log2(C) + 1. The exact tail page (its keys as a
  block, its values copied from the value page) joins the same log-sum-exp, and the kernel writes
  the normalized output.

Matrix products (``_split3``): the MXU multiplies bfloat16 numbers whatever the operands' dtype,
so every product has one factor exact in bfloat16 (2-bit codes masked in place, ``c 4^s``; float8
residuals; bf16 values and tail keys) and the other (``q * scale``, the probabilities) split into
three bfloat16 terms whose sum is exactly its float32 value: float32 accuracy at one MXU pass per
term.

Both declare the ``pl.CostEstimate`` of :mod:`kernels.sparse_decode.cost`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import attention_math
from kernels.sparse_decode import cost
from kernels.sparse_decode.reference import CODES_PER_WORD

_NT = (((1,), (1,)), ((), ()))  # contract the last dims: [G, X] x [N, X] -> [G, N]
_BATCHED = (((2,), (1,)), ((0,), (0,)))  # [N, G, D] x [N, D, p] -> [N, G, p]
MAX_PAGES_PER_STEP = 128
SUB = 16  # pages per selection sub-block
PAGES_PER_ROUND = 16  # C: kept pages the attention kernel copies per round
SCAN_UNROLL = 8  # selection sub-blocks per trip of the scan's loop (a whole 128-page block)


def scan_block(num_pages: int) -> int:
    """Pages per scan block (PB): all P when P <= 128, else the largest multiple of 8 that divides
    P and is at most 128 (the scale block's sublane tiling), else P."""
    if num_pages <= MAX_PAGES_PER_STEP:
        return num_pages
    for pb in range(MAX_PAGES_PER_STEP, 7, -8):
        if num_pages % pb == 0:
            return pb
    return num_pages


def sub_block(pages_per_step: int) -> int:
    """Pages per selection sub-block: 16, 8, 4 or 2, the largest that divides PB (else PB)."""
    for s in (SUB, 8, 4, 2):
        if pages_per_step % s == 0:
            return s
    return pages_per_step


_HIGH16 = -65536  # 0xFFFF0000: a float32's sign, exponent and top 7 mantissa bits


def _split3(x: jax.Array, axis: int = 0, dtype=jnp.float32) -> jax.Array:
    """float32 x (its ``axis`` a multiple of 8 long) as three terms stacked along ``axis``, each
    exactly a bfloat16 number (float32's top 16 bits, then those of the remainder, then the
    remainder: 8 + 8 + 8 significant bits), whose sum is x exactly. An MXU product of the stack
    with an operand exact in bfloat16 (codes, float8 residuals, bf16 values) is then float32-
    accurate at any matmul precision once the three blocks are added (:func:`_sum3`); the terms are
    returned in ``dtype`` (float32 or bfloat16, exact either way)."""
    def top(y):
        return lax.bitcast_convert_type(lax.bitcast_convert_type(y, jnp.int32) & _HIGH16,
                                        jnp.float32)

    hi = top(x)
    r = x - hi
    mid = top(r)
    return jnp.concatenate([hi, mid, r - mid], axis=axis).astype(dtype)


def _sum3(y: jax.Array, axis: int = 0) -> jax.Array:
    """The sum of the three blocks along ``axis`` of a product with :func:`_split3`."""
    r = y.shape[axis] // 3
    part = [lax.slice_in_dim(y, i * r, (i + 1) * r, axis=axis) for i in range(3)]
    return (part[0] + part[1]) + part[2]


def _code_planes(words: jax.Array) -> jax.Array:
    """int32 planar words [..., W, p] -> float32 [..., D, p]: slab s (channels s W .. s W + W - 1)
    holds ``c * 4^(s mod 8)``, the code masked in place in the low or the high half-word (an
    integer with two significant bits: exact in bfloat16, so the MXU multiplies it exactly at any
    precision); :func:`_plane_factors` undoes the power of four."""
    high = lax.shift_right_logical(words, jnp.int32(16))
    half = CODES_PER_WORD // 2
    planes = [(words if s < half else high) & jnp.int32(3 << (2 * (s % half)))
              for s in range(CODES_PER_WORD)]
    return jnp.concatenate(planes, axis=-2).astype(jnp.float32)


def _residual_b11(resid: jax.Array) -> jax.Array:
    """float8 e4m3fn residuals [..] -> float32 ``resid / 16``, read as float8 e4m3b11fnuz (the
    same bits with exponent bias 11, the TPU's native float8 unpack: one instruction per vreg
    instead of a conversion with fix-ups). The two formats differ in three bytes only: 0x80 is
    -0 in e4m3fn and NaN in e4m3b11fnuz (mapped back to 0 here), and 0x7f / 0xff are NaN in
    e4m3fn and +-30 here (+-480 after the factor 16). The quantizer writes those two only beside a
    NaN scale (a NaN key's channel, :func:`kernels.sparse_decode.reference.quantize_pages`),
    which makes every logit of the page NaN whatever the residual is read as."""
    x = lax.bitcast_convert_type(resid, jnp.float8_e4m3b11fnuz).astype(jnp.float32)
    return jnp.where(x == x, x, 0.0)


def _plane_factors(w: int, d: int) -> jax.Array:
    """float32 [1, D]: 4^-(s mod 8) for the channels of slab s (W channels per slab), the exact
    powers of two that turn :func:`_code_planes` back into codes."""
    s = lax.rem(lax.div(lax.broadcasted_iota(jnp.int32, (1, d), 1), jnp.int32(w)),
                jnp.int32(CODES_PER_WORD // 2))
    return lax.bitcast_convert_type(lax.shift_left(127 - 2 * s, 23), jnp.float32)


def _pad_rows(q: jax.Array) -> jax.Array:
    """[G, D] -> [R, D], R = G rounded up to a multiple of 8, with zero rows."""
    g, d = q.shape
    rows = -(-g // 8) * 8
    return q if rows == g else jnp.concatenate([q, jnp.zeros((rows - g, d), q.dtype)], axis=0)


def _scan_kernel(len_ref, q_ref, codes_hbm, scale_hbm, idx_ref, count_ref, cbuf, sbuf, sems,
                 pm_ref, *, delta: float, pages_per_step: int, sub: int, num_steps: int):
    b, k = pl.program_id(0), pl.program_id(1)
    p, w = cbuf.shape[3], cbuf.shape[2]
    pb = pages_per_step
    num_full = lax.div(len_ref[b], p)
    last_block = lax.div(jnp.maximum(num_full - 1, 0), pb)  # blocks past it hold no full page
    q = q_ref[...]  # [G, D] float32, already / sqrt(D)
    g, d = q.shape
    qf = _pad_rows(q) * _plane_factors(w, d)  # [R, D]: the codes' planes carry 4^(s mod 8)
    nsub = pb // sub

    def copies(j, slot):
        return (pltpu.make_async_copy(codes_hbm.at[b, k, pl.ds(j * pb, pb)], cbuf.at[slot],
                                      sems.at[slot, 0]),
                pltpu.make_async_copy(scale_hbm.at[b, k, pl.ds(j * pb, pb)], sbuf.at[slot],
                                      sems.at[slot, 1]))

    for cp in copies(0, 0):
        cp.start()

    def step(j, carry):
        slot = lax.rem(j, 2)

        @pl.when(j < last_block)
        def _prefetch():
            for cp in copies(j + 1, 1 - slot):
                cp.start()

        @pl.when(j <= last_block)
        def _scan_block():
            for cp in copies(0, slot):  # a wait needs only the destination's size
                cp.wait()

            def scan(i):
                p0 = i * sub
                sc = sbuf[slot, pl.ds(p0, sub), :]  # [SUB, D]
                planes = _code_planes(cbuf[slot, pl.ds(p0, sub)])  # [SUB, D, p]
                qs = qf[None, :, :] * sc[:, None, :]  # [SUB, R, D]
                est = lax.dot_general(_split3(qs, axis=1), planes, _BATCHED,
                                      preferred_element_type=jnp.float32)  # [SUB, 3R, p]
                off = 1.5 * jnp.sum(q[None, :, :] * sc[:, None, :], axis=-1)  # [SUB, G]
                pm = jnp.max(_sum3(est, axis=1), axis=-1)[:, :g] - off
                page = j * pb + p0 + lax.broadcasted_iota(jnp.int32, (sub, g), 0)
                pm_ref[j * nsub + i] = jnp.where(page < num_full, pm, -jnp.inf)

            per = max(u for u in range(1, SCAN_UNROLL + 1) if nsub % u == 0)

            def scan_some(i, carry):  # several sub-blocks per trip: one's reductions beside
                for u in range(per):  # another's unpacking (their chains are latency-bound)
                    scan(per * i + u)
                return carry

            lax.fori_loop(0, nsub // per, scan_some, 0)

        @pl.when(j > last_block)
        def _empty():
            pm_ref[pl.ds(j * nsub, nsub)] = jnp.full((nsub, sub, g), -jnp.inf, jnp.float32)

        return carry

    lax.fori_loop(0, num_steps, step, 0)

    m_slots = idx_ref.shape[-1]
    last = jnp.maximum(num_full - 1, 0)
    rws = lax.broadcasted_iota(jnp.int32, (sub, g), 0)
    first = pm_ref[0][0:1, :]  # [1, G]
    # the last full page's row, picked by a masked sum (exact, keeps a NaN or -inf)
    last_v = jnp.sum(jnp.where(rws == lax.rem(last, sub), pm_ref[lax.div(last, sub)], 0.0), axis=0,
                     keepdims=True)
    theta = jnp.maximum(first, last_v) - delta  # [1, G]; NaN if a reference page is NaN
    below = lax.broadcasted_iota(jnp.int32, (sub, sub), 1) < lax.broadcasted_iota(
        jnp.int32, (sub, sub), 0)
    lower = below.astype(jnp.float32)  # [t, i] = 1 for i < t: exclusive prefix count
    slots = lax.broadcasted_iota(jnp.int32, (1, m_slots), 1).astype(jnp.float32)

    def select(i, carry):
        offset, acc = carry  # [1, 1] pages kept so far, [1, M] page indices so far
        blk = pm_ref[i]  # [SUB, G]
        page = i * sub + lax.broadcasted_iota(jnp.int32, (sub, 1), 0)
        kept = jnp.max(jnp.where(blk < theta, 0.0, 1.0), axis=1, keepdims=True)  # NaN keeps
        kept = jnp.where(page < num_full, kept, 0.0)  # [SUB, 1]
        wide = jnp.broadcast_to(kept, (sub, 128))
        rank = lax.dot_general(lower, wide, (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)[:, 0:1] + offset
        onehot = jnp.where((rank == slots) & (kept > 0), 1.0, 0.0)  # [SUB, M]
        acc = acc + jnp.sum(onehot * page.astype(jnp.float32), axis=0, keepdims=True)
        return offset + jnp.sum(kept, axis=0, keepdims=True), acc

    blocks = num_steps * nsub
    per = max(u for u in (1, 2, 4) if blocks % u == 0)

    def select_some(i, carry):
        for u in range(per):
            carry = select(per * i + u, carry)
        return carry

    total, acc = lax.fori_loop(0, blocks // per, select_some,
                               (jnp.zeros((1, 1), jnp.float32),
                                jnp.zeros((1, m_slots), jnp.float32)))
    idx_ref[...] = acc.astype(jnp.int32)
    count_ref[...] = jnp.broadcast_to(total, count_ref.shape).astype(jnp.int32)


def _in_hbm(interpret: bool, *arrays: jax.Array) -> list[jax.Array]:
    """``arrays`` (cache arrays a kernel streams block by block) constrained to stay in HBM.
    Without it XLA's memory-space assignment may stage a whole cache array in VMEM around the
    kernel, a copy in and out per decode step that is as large as the array. Interpret mode has
    no memory spaces."""
    if interpret:
        return list(arrays)
    return [pltpu.with_memory_space_constraint(x, pltpu.HBM) for x in arrays]


@functools.partial(jax.jit, static_argnames=("delta", "interpret"))
def ffd_scan_select(qg: jax.Array, codes: jax.Array, scale: jax.Array, lengths: jax.Array, *,
                    delta: float, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """The top-delta page list of every (row, kv head), computed by one Pallas kernel.

    Args:
      qg: float32 [B, K, G, D] queries already scaled by 1/sqrt(D).
      codes: int32 [B, K, P, W, p] token-minor 2-bit codes; scale: float32 [B, K, P, D].
      lengths: int32 [B] in 1..S, tokens per row (``lengths // p`` full pages).
      delta: the top-delta margin in nats (a Python float >= 0, ``inf`` keeps every full page).

    Returns:
      (idx int32 [B, K, P], count int32 [B, K]): the kept full pages in increasing order in
      ``idx[b, k, :count[b, k]]`` (0 in the later slots), the same pages as
      :func:`kernels.sparse_decode.reference.select_pages` with ``top_k = max_pages = None`` on the
      same page estimates (computed here in float32; a page within float32 rounding of the
      threshold may be decided either way).

    Raises:
      ValueError: ``codes`` is not [B, K, P, D/16, p].
    """
    b, kh, g, d = qg.shape
    n, w, p = codes.shape[2], codes.shape[3], codes.shape[4]
    if codes.shape[:2] != (b, kh) or w * CODES_PER_WORD != d:
        raise ValueError(f"ffd_scan_select: codes of shape {codes.shape} do not match queries "
                         f"{qg.shape} (expected [B, K, P, D/16, p])")
    pb = scan_block(n)
    steps = n // pb
    sub = sub_block(pb)
    estimate = cost.ffd_tpu_scan_cost(qg, codes, scale, num_slots=n, pages_per_step=pb, sub=sub)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(b, kh),
        in_specs=[
            pl.BlockSpec((None, None, g, d), lambda bi, ki, lr: (bi, ki, 0, 0)),
            pl.BlockSpec(memory_space=pl.ANY),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=[
            pl.BlockSpec((None, None, 1, n), lambda bi, ki, lr: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, 1, 128), lambda bi, ki, lr: (bi, ki, 0, 0)),
        ],
        scratch_shapes=[pltpu.VMEM((2, pb, w, p), codes.dtype),
                        pltpu.VMEM((2, pb, d), scale.dtype),
                        pltpu.SemaphoreType.DMA((2, 2)),
                        pltpu.VMEM((n // sub, sub, g), jnp.float32)],
    )
    idx, count = pl.pallas_call(
        functools.partial(_scan_kernel, delta=float(delta), pages_per_step=pb, sub=sub,
                          num_steps=steps),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((b, kh, 1, n), jnp.int32),
                   jax.ShapeDtypeStruct((b, kh, 1, 128), jnp.int32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        interpret=interpret,
        cost_estimate=estimate,
        name="ffd_scan_select",
    )(lengths.astype(jnp.int32), qg.astype(jnp.float32), *_in_hbm(interpret, codes, scale))
    return idx[:, :, 0], count[:, :, 0, 0]


def _attend_kernel(idx_ref, count_ref, len_ref, q_ref, tail_ref, codes_hbm, scale_hbm,
                   resid_hbm, v_hbm, out_ref, cbuf, sbuf, rbuf, vbuf, tvbuf, sems, tsem, *,
                   pages_per_round: int, num_kv_heads: int, num_slots: int):
    b, k = pl.program_id(0), pl.program_id(1)
    pair = b * num_kv_heads + k
    count = jnp.minimum(count_ref[pair], num_slots)  # so a listed slot i < count is < M
    length = len_ref[b]
    p, n = tail_ref.shape[0], v_hbm.shape[2]
    g, d = q_ref.shape
    w = cbuf.shape[2]
    cpr = pages_per_round
    rounds = lax.div(count + cpr - 1, cpr)

    tail_copy = pltpu.make_async_copy(v_hbm.at[b, k, jnp.minimum(lax.div(length, p), n - 1)], tvbuf,
                                      tsem.at[0])
    tail_copy.start()

    def page_copies(slot, vslot, c, page):
        return (pltpu.make_async_copy(codes_hbm.at[b, k, page], cbuf.at[slot, c], sems.at[slot, 0]),
                pltpu.make_async_copy(scale_hbm.at[b, k, pl.ds(page, 1)], sbuf.at[slot, pl.ds(c, 1)],
                                      sems.at[slot, 1]),
                pltpu.make_async_copy(resid_hbm.at[b, k, page], rbuf.at[slot, c], sems.at[slot, 2]),
                pltpu.make_async_copy(v_hbm.at[b, k, page], vbuf.at[vslot, c], sems.at[vslot, 3]))

    def start_page(r, c):
        i = r * cpr + c

        @pl.when(i < count)
        def _():
            # the page index clamped once (as unsigned: negatives too): the copies below need no
            # bounds check of their own
            page = jnp.minimum(idx_ref[pair * num_slots + i].astype(jnp.uint32),
                               jnp.uint32(n - 1)).astype(jnp.int32)
            for cp in page_copies(lax.rem(r, 2), lax.rem(r, 3), c, page):
                cp.start()

    def start_round(r):
        for c in range(cpr):
            start_page(r, c)

    def wait_round(r):
        # every copy of a round signals its array's semaphore of the slot (the semaphores count
        # bytes), so a round waits for its pages by powers of two: a full round in one wait per
        # array, the last one in at most log2(C) + 1 (a wait needs only the destination's size)
        slot, vslot = lax.rem(r, 2), lax.rem(r, 3)
        pages = jnp.minimum(count - r * cpr, cpr)
        bufs = ((codes_hbm, cbuf, slot, 0), (scale_hbm, sbuf, slot, 1),
                (resid_hbm, rbuf, slot, 2), (v_hbm, vbuf, vslot, 3))
        conds = [(cpr, pages == cpr)] + [(1 << i, (pages < cpr) & ((pages & (1 << i)) != 0))
                                         for i in range((cpr - 1).bit_length())]
        for size, cond in conds:
            @pl.when(cond)
            def _(size=size):
                for src, buf, s, j in bufs:
                    pltpu.make_async_copy(src.at[b, k, pl.ds(0, size)], buf.at[s, pl.ds(0, size)],
                                          sems.at[s, j]).wait()

    q = _pad_rows(q_ref[...])  # [R, D] float32, already / sqrt(D)
    rows = q.shape[0]
    factors = _plane_factors(w, d)

    def values(r, probs):
        """P V of round r (its probabilities ``probs``), zero for the slots not copied (their
        stale values may be anything: a zero weight is not enough)."""
        vslot = lax.rem(r + 3, 3)
        pv = None
        for c, e in enumerate(probs):
            part = _sum3(jnp.dot(_split3(e, dtype=jnp.bfloat16), vbuf[vslot, c],
                                 preferred_element_type=jnp.float32))
            part = jnp.where((r >= 0) & (r * cpr + c < count), part, 0.0)
            pv = part if pv is None else pv + part
        return pv

    @pl.when(rounds > 0)
    def _first():
        start_round(0)

    def body(r, carry):
        # round r's logits and softmax beside round r - 1's values (triple-buffered for it):
        # the vector work of one overlaps the MXU work of the other
        m_prev, l_prev, acc_prev, corr_prev, probs_prev = carry
        slot = lax.rem(r, 2)
        wait_round(r)
        acc = corr_prev * acc_prev + values(r - 1, probs_prev)
        scales = sbuf[slot]  # [C, D]
        logits = []
        for c in range(cpr):
            qs = q * scales[c:c + 1]  # [R, D]
            planes = _code_planes(cbuf[slot, c])  # [D, p]
            resid = _residual_b11(rbuf[slot, c])  # [p, D], resid / 16
            est = _sum3(jnp.dot(_split3(qs * factors), planes, preferred_element_type=jnp.float32))
            ref_ = _sum3(lax.dot_general(_split3(qs * 16.0), resid, _NT,
                                         preferred_element_type=jnp.float32))
            x = est + ref_ - 1.5 * jnp.sum(qs, axis=-1, keepdims=True)  # [R, p]
            logits.append(jnp.where(r * cpr + c < count, x, -jnp.inf))
            # page c of the next round, once this round's page c is read (each page under its
            # own condition, so nothing past the count)
            start_page(r + 1, c)
        top = logits[0]
        for x in logits[1:]:
            top = jnp.maximum(top, x)
        m_new = jnp.maximum(m_prev, jnp.max(top, axis=-1, keepdims=True))
        corr = jnp.exp(m_prev - m_new)
        probs = tuple(jnp.exp(x - m_new) for x in logits)
        total = probs[0]
        for e in probs[1:]:
            total = total + e
        return (m_new, corr * l_prev + jnp.sum(total, axis=-1, keepdims=True), acc, corr, probs)

    init = (jnp.full((rows, 1), -jnp.inf, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
            jnp.zeros((rows, d), jnp.float32), jnp.ones((rows, 1), jnp.float32),
            tuple(jnp.zeros((rows, p), jnp.float32) for _ in range(cpr)))
    m_run, l_run, acc, corr_last, probs_last = lax.fori_loop(0, rounds, body, init)
    acc = corr_last * acc + values(rounds - 1, probs_last)
    tail_copy.wait()
    rem = lax.rem(length, p)
    keys = tail_ref[...]  # [p, D] in the model's dtype
    if keys.dtype == jnp.bfloat16:  # exact in bfloat16: q in three terms
        tl = _sum3(lax.dot_general(_split3(q), keys.astype(jnp.float32), _NT,
                                   preferred_element_type=jnp.float32))  # [R, p]
    else:
        tl = lax.dot_general(q, keys.astype(jnp.float32), _NT, preferred_element_type=jnp.float32,
                             precision=lax.Precision.HIGHEST)
    tl = jnp.where((lax.broadcasted_iota(jnp.int32, tl.shape, 1) < rem), tl, -jnp.inf)
    m_new = jnp.maximum(m_run, jnp.max(tl, axis=-1, keepdims=True))
    # no tail token (rem = 0): the tail adds nothing (and leaves m as it was)
    m_new = jnp.where(rem > 0, m_new, m_run)
    corr = jnp.exp(m_run - m_new)
    e = jnp.exp(tl - m_new)
    # slots past the length are never read: their values are zeroed, not only their weights
    ok = lax.broadcasted_iota(jnp.int32, (p, d), 0) < rem
    tv = jnp.where(ok, tvbuf[...].astype(jnp.float32), 0.0).astype(jnp.bfloat16)
    l_fin = corr * l_run + jnp.sum(e, axis=-1, keepdims=True)
    acc = corr * acc + _sum3(jnp.dot(_split3(e, dtype=jnp.bfloat16), tv,
                                     preferred_element_type=jnp.float32))
    out_ref[...] = (acc / l_fin)[:g]


@functools.partial(jax.jit, static_argnames=("pages_per_round", "interpret",
                                             "assumed_kept_fraction"))
def ffd_pages_attention(qg: jax.Array, codes: jax.Array, scale: jax.Array, resid: jax.Array,
                        v: jax.Array, tail: jax.Array, idx: jax.Array, count: jax.Array,
                        lengths: jax.Array, *, pages_per_round: int = PAGES_PER_ROUND,
                        interpret: bool = False,
                        assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION) -> jax.Array:
    """FFD attention over the listed pages and the tail page of each (row, kv head).

    Args:
      qg: float32 [B, K, G, D] queries already scaled by 1/sqrt(D).
      codes: int32 [B, K, P, W, p]; scale: float32 [B, K, P, D]; resid: float8 [B, K, P, p, D];
        v: bfloat16 [B, K, P, p, D]; tail: [B, K, p, D] exact keys of the unfinished page (the
        FFD cache arrays).
      idx: int32 [B, K, M] page indices, the ``count[b, k]`` attended ones first (full pages).
      count: int32 [B, K], 0..M.
      lengths: int32 [B] in 1..S; the tail page ``lengths // p`` holds ``lengths % p`` tokens.
      pages_per_round: C, kept pages copied per DMA round.
      assumed_kept_fraction: f in (0, 1], the fraction of the P pages the declared
        ``pl.CostEstimate`` assumes listed (:func:`kernels.sparse_decode.cost.ffd_tpu_attend_cost`);
        it changes the cost XLA sees, never the result.

    Returns:
      float32 [B, K, G, D]: softmax attention over the listed pages' refined keys and the tail's
      exact keys, with their values (NaN if a row attends no token).

    Raises:
      ValueError: ``pages_per_round`` not an int >= 1, or ``assumed_kept_fraction`` outside
        (0, 1].
    """
    b, kh, g, d = qg.shape
    w, p = codes.shape[3], codes.shape[4]
    m_slots = idx.shape[-1]
    if not isinstance(pages_per_round, int) or pages_per_round < 1:
        raise ValueError(f"ffd_pages_attention: pages_per_round must be an int >= 1, got "
                         f"{pages_per_round!r}")
    cpr = min(pages_per_round, m_slots, codes.shape[2])
    estimate = cost.ffd_tpu_attend_cost(qg, codes, scale, resid, v, tail, idx,
                                        kept_fraction=assumed_kept_fraction)
    anyspace = pl.BlockSpec(memory_space=pl.ANY)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(b, kh),
        in_specs=[
            pl.BlockSpec((None, None, g, d), lambda bi, ki, *_: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, p, d), lambda bi, ki, *_: (bi, ki, 0, 0)),
            anyspace, anyspace, anyspace, anyspace,
        ],
        out_specs=pl.BlockSpec((None, None, g, d), lambda bi, ki, *_: (bi, ki, 0, 0)),
        scratch_shapes=[
            pltpu.VMEM((2, cpr, w, p), codes.dtype),
            pltpu.VMEM((2, cpr, d), scale.dtype),
            pltpu.VMEM((2, cpr, p, d), resid.dtype),
            pltpu.VMEM((3, cpr, p, d), v.dtype),
            pltpu.VMEM((p, d), v.dtype),
            pltpu.SemaphoreType.DMA((3, 4)),
            pltpu.SemaphoreType.DMA((1,)),
        ],
    )
    return pl.pallas_call(
        functools.partial(_attend_kernel, pages_per_round=cpr, num_kv_heads=kh,
                          num_slots=m_slots),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((b, kh, g, d), jnp.float32),
        # page indices are clamped in the kernel, so the copies skip their own bounds checks
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             disable_bounds_checks=True),
        interpret=interpret,
        cost_estimate=estimate,
        name="ffd_pages_attention",
    )(idx.reshape(-1).astype(jnp.int32), count.reshape(-1).astype(jnp.int32),
      lengths.astype(jnp.int32), qg.astype(jnp.float32), tail,
      *_in_hbm(interpret, codes, scale, resid, v))


def list_to_mask(idx: jax.Array, count: jax.Array, num_pages: int) -> jax.Array:
    """bool [B, K, P] from a page list (idx int32 [B, K, M], count int32 [B, K]): page j is set iff
    it is one of the first ``count`` entries."""
    b, kh, m_slots = idx.shape
    listed = jnp.arange(m_slots)[None, None, :] < count[..., None]
    return jnp.zeros((b, kh, num_pages), bool).at[
        jnp.arange(b)[:, None, None], jnp.arange(kh)[None, :, None],
        jnp.where(listed, idx, num_pages)].set(True, mode="drop")


def ffd_decode_tpu(q: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array, *,
                   delta: float, interpret: bool = False, pages_per_round: int = PAGES_PER_ROUND,
                   assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION):
    """FFD decode with the top-delta rule, all of it in the two kernels of this module.

    Args:
      q: [B, H, D] float queries; cache: an FFD cache; lengths: int32 [B] in 1..S.
      delta: top-delta margin in nats (a Python float >= 0).
      interpret, pages_per_round, assumed_kept_fraction: see :func:`ffd_pages_attention`.

    Returns:
      (out [B, H, D] in ``q``'s dtype, idx int32 [B, K, P], count int32 [B, K]) where ``idx`` and
      ``count`` are the page list of :func:`ffd_scan_select`.
    """
    b, h, d = q.shape
    qg = attention_math.grouped_query(q, cache["resid"].shape[1])  # the reference's rounding of q / sqrt(D)
    idx, count = ffd_scan_select(qg, cache["codes"], cache["scale"], lengths, delta=delta,
                                 interpret=interpret)
    out = ffd_pages_attention(qg, cache["codes"], cache["scale"], cache["resid"], cache["v"],
                              cache["tail"], idx, count, lengths, pages_per_round=pages_per_round,
                              interpret=interpret, assumed_kept_fraction=assumed_kept_fraction)
    return out.reshape(b, h, d).astype(q.dtype), idx, count
