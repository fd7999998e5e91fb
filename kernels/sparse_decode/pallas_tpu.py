"""FFD decode attention on TPU: two Pallas kernels, the page scan with the selection, and the
attention over the kept pages.

Dimensions as in :mod:`kernels.sparse_decode.reference` (B, K, G, D, p, P, W = D/16), plus M page
slots per (row, kv head), PB pages per scan grid step, C kept pages per copy round.

* :func:`ffd_scan_select` (grid B x K x P/PB): reads the token-minor 2-bit codes ``[PB, W, p]`` and
  scales of PB pages per grid step, forms every page's largest estimated logit per query head (one
  batched ``[G, D] x [D, p]`` product per page), keeps them in VMEM, and at the last step applies
  the top-delta rule (threshold from the first and last full pages, paper Sec. 3) and compacts the
  kept pages into a list ``idx [B, K, M]`` with its count ``[B, K]`` (a prefix count by a small
  triangular product and a one-hot sum; no sort). Blocks past a row's last full page repeat the
  previous block index, so their codes are never fetched.
* :func:`ffd_pages_attention` (grid B x K): the page list, the counts and the lengths are scalar-
  prefetched into SMEM; the codes, scales, residuals and values stay in HBM (``memory_space=ANY``)
  and the kernel copies C kept pages per round into double-buffered VMEM with asynchronous DMAs
  (round i + 1 is in flight while round i is attended), looping ``ceil(count / C)`` rounds. Each
  page's refined logits are ``(q * scale) . (c - 1.5 + resid)``; an online softmax accumulates the
  pages, the exact tail page (its keys as a block, its values copied from the value page) joins
  the same log-sum-exp, and the kernel writes the normalized output.

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


def scan_block(num_pages: int) -> int:
    """Pages per scan grid step: all P when P <= 128, else the largest multiple of 8 that divides
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


def _unpack(words: jax.Array, axis: int) -> jax.Array:
    """int32 planar words [..., W, ...] -> float32 codes [..., D, ...] (slab s = channels
    s*W .. s*W+W-1, stacked along ``axis``)."""
    return jnp.concatenate([(lax.shift_right_logical(words, jnp.int32(2 * s)) & 3)
                            for s in range(CODES_PER_WORD)], axis=axis).astype(jnp.float32)


def _scan_kernel(len_ref, q_ref, codes_ref, scale_ref, idx_ref, count_ref, pm_ref, *,
                 delta: float, page_size: int, pages_per_step: int, sub: int, num_steps: int):
    b, j = pl.program_id(0), pl.program_id(2)
    num_full = lax.div(len_ref[b], page_size)
    q = q_ref[...]  # [G, D] float32, already / sqrt(D)
    g = q.shape[0]
    nsub = pages_per_step // sub

    def scan(i, carry):
        p0 = i * sub
        sc = scale_ref[pl.ds(p0, sub), :]  # [SUB, D]
        qs = q[None, :, :] * sc[:, None, :]  # [SUB, G, D]
        c = _unpack(codes_ref[pl.ds(p0, sub)], axis=1)  # [SUB, D, p]
        est = lax.dot_general(qs, c, _BATCHED, preferred_element_type=jnp.float32)
        pm = jnp.max(est, axis=-1) - 1.5 * jnp.sum(qs, axis=-1)  # [SUB, G]
        page = j * pages_per_step + p0 + lax.broadcasted_iota(jnp.int32, (sub, g), 0)
        pm_ref[j * nsub + i] = jnp.where(page < num_full, pm, -jnp.inf)
        return carry

    lax.fori_loop(0, nsub, scan, 0)

    @pl.when(j == num_steps - 1)
    def _select():
        m_slots = idx_ref.shape[-1]
        last = jnp.maximum(num_full - 1, 0)
        rows = lax.broadcasted_iota(jnp.int32, (sub, g), 0)
        first = pm_ref[0][0:1, :]  # [1, G]
        # the last full page's row, picked by a masked sum (exact, keeps a NaN or -inf)
        last_v = jnp.sum(jnp.where(rows == lax.rem(last, sub), pm_ref[lax.div(last, sub)], 0.0), axis=0,
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

        total, acc = lax.fori_loop(0, num_steps * nsub, select,
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

    def block(bi, ki, ji, len_ref):  # blocks past the last full page repeat it: no new DMA
        last = lax.div(jnp.maximum(lax.div(len_ref[bi], p) - 1, 0), pb)
        return jnp.minimum(ji, last)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(b, kh, steps),
        in_specs=[
            pl.BlockSpec((None, None, g, d), lambda bi, ki, ji, lr: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, pb, w, p),
                         lambda bi, ki, ji, lr: (bi, ki, block(bi, ki, ji, lr), 0, 0)),
            pl.BlockSpec((None, None, pb, d),
                         lambda bi, ki, ji, lr: (bi, ki, block(bi, ki, ji, lr), 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, 1, n), lambda bi, ki, ji, lr: (bi, ki, 0, 0)),
            pl.BlockSpec((None, None, 1, 128), lambda bi, ki, ji, lr: (bi, ki, 0, 0)),
        ],
        scratch_shapes=[pltpu.VMEM((n // sub, sub, g), jnp.float32)],
    )
    idx, count = pl.pallas_call(
        functools.partial(_scan_kernel, delta=float(delta), page_size=p, pages_per_step=pb,
                          sub=sub, num_steps=steps),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((b, kh, 1, n), jnp.int32),
                   jax.ShapeDtypeStruct((b, kh, 1, 128), jnp.int32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=estimate,
        name="ffd_scan_select",
    )(lengths.astype(jnp.int32), qg.astype(jnp.float32), *_in_hbm(interpret, codes, scale))
    return idx[:, :, 0], count[:, :, 0, 0]


def _attend_kernel(idx_ref, count_ref, len_ref, q_ref, tail_ref, codes_hbm, scale_hbm,
                   resid_hbm, v_hbm, out_ref, cbuf, sbuf, rbuf, vbuf, tvbuf, sems, tsem,
                   m_ref, l_ref, acc_ref, *, pages_per_round: int, num_kv_heads: int,
                   num_slots: int):
    b, k = pl.program_id(0), pl.program_id(1)
    pair = b * num_kv_heads + k
    count = count_ref[pair]
    length = len_ref[b]
    p, n = tail_ref.shape[0], v_hbm.shape[2]
    cpr = pages_per_round
    rounds = lax.div(count + cpr - 1, cpr)

    tail_copy = pltpu.make_async_copy(v_hbm.at[b, k, jnp.minimum(lax.div(length, p), n - 1)], tvbuf,
                                      tsem.at[0])
    tail_copy.start()

    def copies(r, c, slot):
        page = idx_ref[pair * num_slots + jnp.minimum(r * cpr + c, num_slots - 1)]
        return (pltpu.make_async_copy(codes_hbm.at[b, k, page], cbuf.at[slot, c], sems.at[slot, 0]),
                pltpu.make_async_copy(scale_hbm.at[b, k, pl.ds(page, 1)], sbuf.at[slot, c],
                                      sems.at[slot, 1]),
                pltpu.make_async_copy(resid_hbm.at[b, k, page], rbuf.at[slot, c], sems.at[slot, 2]),
                pltpu.make_async_copy(v_hbm.at[b, k, page], vbuf.at[slot, c], sems.at[slot, 3]))

    def each_page(r, slot, action):
        for c in range(cpr):
            @pl.when(r * cpr + c < count)
            def _(c=c):  # run at once by pl.when; c bound for clarity
                for cp in copies(r, c, slot):
                    getattr(cp, action)()

    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    q = q_ref[...]  # [G, D] float32, already / sqrt(D)

    def update(logits, v):  # online softmax over one more block of keys
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(logits, axis=-1, keepdims=True))
        corr = jnp.exp(m_prev - m_new)
        e = jnp.exp(logits - m_new)
        l_ref[...] = corr * l_ref[...] + jnp.sum(e, axis=-1, keepdims=True)
        acc_ref[...] = corr * acc_ref[...] + jnp.dot(e, v, preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(rounds > 0)
    def _first():
        each_page(0, 0, "start")

    def body(r, carry):
        slot = lax.rem(r, 2)

        @pl.when(r + 1 < rounds)
        def _prefetch():
            each_page(r + 1, 1 - slot, "start")

        each_page(r, slot, "wait")
        for c in range(cpr):
            @pl.when(r * cpr + c < count)
            def _attend(c=c):
                qs = q * sbuf[slot, c]  # [G, D] * [1, D]
                codes = _unpack(cbuf[slot, c], axis=0)  # [D, p]
                resid = rbuf[slot, c].astype(jnp.float32)  # [p, D]
                logits = (jnp.dot(qs, codes, preferred_element_type=jnp.float32)
                          + lax.dot_general(qs, resid, _NT, preferred_element_type=jnp.float32)
                          - 1.5 * jnp.sum(qs, axis=-1, keepdims=True))
                update(logits, vbuf[slot, c].astype(jnp.float32))
        return carry

    lax.fori_loop(0, rounds, body, 0)
    tail_copy.wait()
    rem = lax.rem(length, p)

    @pl.when(rem > 0)
    def _tail():
        keys = tail_ref[...].astype(jnp.float32)  # [p, D]
        logits = lax.dot_general(q, keys, _NT, preferred_element_type=jnp.float32)  # [G, p]
        ok = lax.broadcasted_iota(jnp.int32, logits.shape, 1) < rem
        rows = lax.broadcasted_iota(jnp.int32, tvbuf.shape, 0) < rem
        v = jnp.where(rows, tvbuf[...].astype(jnp.float32), 0.0)  # slots past the length unread
        update(jnp.where(ok, logits, -jnp.inf), v)

    out_ref[...] = acc_ref[...] / l_ref[...]


@functools.partial(jax.jit, static_argnames=("pages_per_round", "interpret",
                                             "assumed_kept_fraction"))
def ffd_pages_attention(qg: jax.Array, codes: jax.Array, scale: jax.Array, resid: jax.Array,
                        v: jax.Array, tail: jax.Array, idx: jax.Array, count: jax.Array,
                        lengths: jax.Array, *, pages_per_round: int = 8, interpret: bool = False,
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
      pages_per_round: C, kept pages copied per DMA round (double-buffered).
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
    cpr = min(pages_per_round, m_slots)
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
            pltpu.VMEM((2, cpr, 1, d), scale.dtype),
            pltpu.VMEM((2, cpr, p, d), resid.dtype),
            pltpu.VMEM((2, cpr, p, d), v.dtype),
            pltpu.VMEM((p, d), v.dtype),
            pltpu.SemaphoreType.DMA((2, 4)),
            pltpu.SemaphoreType.DMA((1,)),
            pltpu.VMEM((g, 1), jnp.float32),
            pltpu.VMEM((g, 1), jnp.float32),
            pltpu.VMEM((g, d), jnp.float32),
        ],
    )
    return pl.pallas_call(
        functools.partial(_attend_kernel, pages_per_round=cpr, num_kv_heads=kh,
                          num_slots=m_slots),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((b, kh, g, d), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
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
                   delta: float, interpret: bool = False, pages_per_round: int = 8,
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
