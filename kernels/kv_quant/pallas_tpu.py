"""QVG decode attention on TPU: a Pallas kernel that attends up to 32 chunks per grid step from
their codes in VMEM.

Dimensions as in :mod:`kernels.kv_quant.reference` (B, K, R = G * T rows, D, N, NC, P, NB, S, C);
CB chunks per grid step, L = 128 chunks per block of the chunk-start table, AR = min(NC, 32)
chunks per block of the assignments.

Layout. The cache stores each chunk tokens minor (codes [P, N], scales [NB, N], assignments
[S, N]; :class:`~kernels.kv_quant.reference.QVGCode`), so with N a multiple of 128 every per-token
array fills the 128 lanes and the kernel reads the cache as stored (no relayout copy per decode
step); centroids [S, C, D] keep D on the lanes. The assignments are read as [S, NC, N] (a free
view: XLA:TPU keeps the size-1 stage axis of the [NC, S, N] store major, the chunks on the
sublanes of whole (32, 128) uint8 tiles), AR chunks per block, and widened to int32 rows once per
grid step; read as [NC, S, N] they were copied into a layout with S on the sublanes, padded 4x,
every decode step. A chunk is worked on channels by tokens.

Codes as an MXU operand. A plane of the planar-packed codes masked in place (not shifted) less
its offset is ``(code - 2^(n-1)) 2^(n plane)``, a small integer exact in bfloat16, so the codes of
a chunk enter the MXU as one exact [D, N] bfloat16 operand and are never dequantized in float32:

* values: ``sum_t p_t v_ct = 2^(-n plane(c)) sum_t (p_t scale_bt) (code_ct - 2^(n-1)) 2^(n plane(c))
  + sum_s (P onehot_s^T) C_s`` for channel c in scale block b: the probabilities times each
  block's scale row, stacked [NB R, N], against the codes ([NB R, N] x [D, N]^T), each block's
  columns then kept and rescaled by a constant row, plus the centroids through the small products
  P onehot^T [R, C] and [R, C] x [C, D];
* keys stored after RoPE (``rope_base=None``): ``q . k_t = sum_b scale_bt sum_{c in b} q_c 2^(-n
  plane(c)) (code_ct - 2^(n-1)) 2^(n plane(c)) + sum_s (q C_s^T)[a_st]``: the query's rows masked
  to each block and plane-scaled, [NB R, D] (built once per grid step), against the codes, then
  the scale rows, plus ``q C_s^T`` [R, C] gathered by a one-hot product;
* keys stored before RoPE: dequantized in float32 pieces [W, N]
  (:mod:`kernels.kv_quant.pallas_common`; plus the centroid rows from the one-hot product ``C_s^T
  [D, C] @ onehot [C, N]``), rotated (below), then ``q K^T`` with the keys in three bfloat16 terms.

Every float32 factor (query, probabilities, their block-scaled rows, ``q C^T``, ``P onehot^T``)
enters the MXU as three bfloat16 terms stacked on the rows without padding (:func:`_split_rows`;
a term is the remainder with its low 16 bits cleared, an and and an exact subtraction), whose
exact products the MXU sums in float32: float32 accuracy, and with R = 4 query rows one 16-row
operand tile and one [16, N] result per product instead of a padded tile per term (the result
rows of the terms are then added).

Grid (B, K, NC / CB), chunk blocks innermost ("arbitrary"). ``start`` and ``num_quantized`` are
prefetched into SMEM (``PrefetchScalarGridSpec``); the block index maps clamp the block index to
the last block holding a quantized slot of the row, so later blocks issue no new DMA and are
skipped by ``pl.when``. Inside a block the chunks go four at a time (``GROUP``), each group one
online-softmax step over its 4N slots, ``UNROLL`` groups per trip of the block's loop with
(acc, m, l) carried in registers and no branch between groups; a trip computes its groups'
logits first and then their softmax steps, so the schedule overlaps one group's products with
another's softmax chain; in a row's last block a chunk past ``num_quantized`` reads the last
quantized chunk's data with every slot masked. Keys stored
before RoPE are rotated to their slot positions by angle addition, the chunk start's rotation
carried by the query: ``q . R(B + a) k = (R(-B) q) . (R(a) k)``. Per chunk the query is rotated
back by the start's angle B from its cos and sin
(:func:`kernels.kv_quant.pallas_common.rope_start_table`, [2, D, L] blocks of L = 128 chunks,
transposed into query rows in VMEM once per block), and the keys by ``a = fl(p f) - B``, the
reference's float32 angle less B (:func:`kernels.kv_quant.pallas_common.rope_cos_sin_from_start`,
from the in-chunk offsets' table [3, D/2, N], one block for the whole grid). The online softmax
runs over the chunks (m, l, acc kept in VMEM scratch between grid steps); the last block step
writes (acc / l, m + log l).

Constraints (checked before compiling, :func:`check_layout`): N a multiple of 128 (lane-dense
chunks) and W a multiple of 8 (piece rows on whole sublane tiles).
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
_TN = (((0,), (0,)), ((), ()))  # [X, M] x [X, N] -> [M, N]


LANES = 128  # TPU vector lanes: the token axis of a chunk fills whole lane tiles
SUBLANES = 8  # float32 / int32 sublanes: a piece's W rows fill whole tiles
ASSIGN_ROWS = cost.TPU_ASSIGN_ROWS  # chunks per block of the assignments (a uint8 tile's rows)
GROUP = 4  # chunks per online-softmax step (their chains overlap in the schedule)
UNROLL = 2  # groups per trip of the block's loop


def check_layout(chunk: int, d: int, cfg: QVGConfig, rope: bool) -> int:
    """The piece width W, after checking that the kernel can tile this layout.

    Raises:
      ValueError: a chunk N that is not a multiple of 128 (its tokens are the lanes of codes,
        scales and assignments), or a piece width W = gcd(P, block, D/2 or D) that is not a
        multiple of 8 (the rows of a piece), naming the value and sizes that work.
    """
    if chunk % LANES:
        raise ValueError(
            f"pallas_tpu.qvg_chunk_attention: chunk={chunk} is not a multiple of {LANES}: a "
            f"chunk's tokens are the TPU lanes of its codes, scales and assignments; use a chunk "
            f"of 128, 256, 512, ... (or implementation='xla')")
    w = pc.piece_width(d, cfg.bits, cfg.block, rope)
    if w % SUBLANES:
        raise ValueError(
            f"pallas_tpu.qvg_chunk_attention: head dim {d} with {cfg.bits}-bit codes, block "
            f"{cfg.block}{' and RoPE halves' if rope else ''} gives dequantization pieces of "
            f"W = gcd(P={d * cfg.bits // 8}, block={cfg.block}, "
            f"{'D/2' if rope else 'D'}={d // 2 if rope else d}) = {w} rows; the kernel needs W a "
            f"multiple of {SUBLANES}: a block that is a multiple of 8 and a head dim with "
            f"D * bits / 8 and D / 2 multiples of 8 (e.g. D = 64, 128, 256 with block 16 .. 64)")
    return w


def chunks_per_block(num_chunks: int, chunk: int) -> int:
    """CB: the largest divisor of NC with CB N <= max(N, 8192) tokens and CB a divisor of 128
    of at most 32 (a block's chunks then share one 128-row group of the chunk-start table and
    one 32-row block of the assignments) (:func:`kernels.kv_quant.cost.tpu_chunks_per_block`)."""
    return cost.tpu_chunks_per_block(num_chunks, chunk)


def _split_terms(x: jax.Array, parts: int) -> list[jax.Array]:
    """float32 x as ``parts`` float32 terms, each but the last exact in bfloat16, whose float32
    sum approximates it (3 terms: exact, 24 significant bits; 2 terms: to 2^-16 relative): the
    split of Henry, Tang and Heinecke, "Leveraging the bfloat16 artificial intelligence datatype
    for higher-precision computations" (ARITH 2019), for float32-accurate MXU products. Each term
    but the last is the running remainder with its low 16 bits cleared; the subtraction of it is
    exact."""
    out = []
    for i in range(parts):
        if i + 1 < parts:
            hi = lax.bitcast_convert_type(
                lax.bitcast_convert_type(x, jnp.int32) & jnp.int32(-65536), jnp.float32)
            out.append(hi)
            x = x - hi
        else:
            out.append(x)
    return out


def _split(x: jax.Array, parts: int) -> list[jax.Array]:
    """:func:`_split_terms` as bfloat16 terms (the conversion of all but the last is exact), for
    MXU products at float32 accuracy."""
    return [t.astype(jnp.bfloat16) for t in _split_terms(x, parts)]


def _split_rows(x: jax.Array, parts: int = 3) -> jax.Array:
    """The ``parts`` bfloat16 terms of float32 x [M, K] (:func:`_split_terms`) stacked on the
    rows without padding between them, [parts M rounded up to 16, K] (a bfloat16 tile has 16
    rows): the MXU then reads one operand row per query row and term, not a padded tile per
    term."""
    terms = _split_terms(x, parts)
    m = x.shape[0] * parts
    pad = -(-m // 16) * 16 - m
    if pad:
        terms.append(jnp.zeros((pad, x.shape[1]), jnp.float32))
    return jnp.concatenate(terms, axis=0).astype(jnp.bfloat16)


def _dot_rows(a: jax.Array, rows: int, b: jax.Array, dims=None, parts: int = 3) -> jax.Array:
    """``sum_i a_i b`` [rows, N] for the terms a_i stacked by :func:`_split_rows` and an exact
    bfloat16 b: one MXU product (float32 accumulation), then the terms' rows added."""
    out = (jnp.dot(a, b, preferred_element_type=jnp.float32) if dims is None else
           lax.dot_general(a, b, dims, preferred_element_type=jnp.float32))
    total = out[:rows]
    for i in range(1, parts):
        total = total + out[i * rows:(i + 1) * rows]
    return total


def _code_planes(codes, bits, plane):
    """Plane ``plane`` of planar-packed codes int32 [P, T], masked in place (not shifted):
    ``code * 2^(bits * plane)``, an exact small integer in float32 and bfloat16."""
    return codes & jnp.int32(((1 << bits) - 1) << (bits * plane))


def _kernel(start_ref, nq_ref, rowoff_ref, q_ref, *refs, cfg: QVGConfig, rope: bool, w: int,
            num_blocks: int, cb: int, lanes: int, rope_terms: int, arows: int):
    stages = cfg.stages
    bits = cfg.bits
    per_code = 4 if stages else 2
    k_refs, v_refs = refs[:per_code], refs[per_code:2 * per_code]
    rest = refs[2 * per_code:]
    if rope:
        freq_ref, off_ref, st_ref, *rest = rest
    out_ref, lse_ref, acc_ref, m_ref, l_ref, *more = rest
    if rope:
        srow_ref, *more = more
    kid_ref, vid_ref = more if stages else (None, None)
    b, blk = pl.program_id(0), pl.program_id(2)
    n = k_refs[0].shape[-1]
    d = q_ref.shape[-1]
    h = d // 2
    p = d * bits // 8
    nq = nq_ref[b]
    nb = d // cfg.block
    # per scale block, the row [1, D] that keeps its channels and undoes their planes' in-place
    # factor 2^(n plane(c)) (code_matrix; a power of two: exact)
    ch = lax.broadcasted_iota(jnp.int32, (1, d), 1)
    plane_factor = 1.0
    for pl_ in range(1, 8 // bits):
        plane_factor = jnp.where(ch >= pl_ * p, 2.0 ** (-bits * pl_), plane_factor)
    col_factor = [jnp.where((ch >= bi * cfg.block) & (ch < (bi + 1) * cfg.block),
                            plane_factor, 0.0) for bi in range(nb)]
    # chunks of this block that hold a quantized slot (lax.div: non-negative ints)
    count = jnp.clip(lax.div(nq + n - 1, n) - blk * cb, 0, cb)

    @pl.when(blk == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)

    def onehots(code_refs, j, ls=slice(None)):
        row = lax.rem(blk * cb + j, arows)  # the chunk's row in the assignments' block
        ids = kid_ref if code_refs is k_refs else vid_ref
        assign = ids[:, pl.ds(row, 1), ls][:, 0, :]  # [S, T] int32
        cid = lax.broadcasted_iota(jnp.int32, (cfg.num_centroids, assign.shape[1]), 0)
        return [(assign[s:s + 1] == cid).astype(jnp.bfloat16) for s in range(stages)]

    def code_rows(code_refs, j, ls=slice(None)):
        """(x - centroids) float32 pieces [W, T] of the tokens ``ls``: (code - 2^(n-1)) scale,
        exact."""
        codes = code_refs[0][j, :, ls].astype(jnp.int32)  # [P, T]
        scales = code_refs[1][j, :, ls].astype(jnp.float32)  # [NB, T]
        pieces = []
        for i in range(d // w):
            c0 = i * w
            plane, b0 = divmod(c0, p)
            sc = scales[c0 // cfg.block:c0 // cfg.block + 1]  # [1, N]
            # (code - 2^(n-1)) 2^(bits plane), an exact small integer, times scale 2^-(bits plane)
            m = _code_planes(codes[b0:b0 + w], bits, plane) - jnp.int32(
                (1 << (bits - 1)) << (bits * plane))
            pieces.append(m.astype(jnp.float32) * (sc * 2.0 ** (-bits * plane)))
        return pieces

    def key_pieces(j, ls):
        pieces = code_rows(k_refs, j, ls)
        if stages:
            oh = onehots(k_refs, j, ls)
            cent_ref = k_refs[3]
            # C_s^T [D, C] @ onehot [C, N]: the tokens' centroid rows, exact (bf16 products)
            for s in range(stages):
                rows = lax.dot_general(cent_ref[j, s], oh[s], _TN,
                                       preferred_element_type=jnp.float32)  # [D, T]
                pieces = [x + rows[i * w:(i + 1) * w] for i, x in enumerate(pieces)]
        return pieces

    def code_matrix(code_refs, j):
        """``(code - 2^(n-1)) 2^(n plane)`` [D, N] bfloat16 of chunk j, channels by tokens
        (channel ``plane P + row``): each plane masked in place, an exact small integer."""
        # read as int8 (a free bitcast): the sign extension to int32 needs no mask of the low
        # byte, and each plane's mask keeps bits of that byte only
        codes = lax.bitcast_convert_type(code_refs[0][j], jnp.int8).astype(jnp.int32)  # [P, N]
        planes = [_code_planes(codes, bits, pl_) - jnp.int32((1 << (bits - 1)) << (bits * pl_))
                  for pl_ in range(8 // bits)]
        m = jnp.concatenate(planes, axis=0) if len(planes) > 1 else planes[0]
        return m.astype(jnp.float32).astype(jnp.bfloat16)

    def key_logits(j, c, q_parts):
        """Unscaled logits q K^T [R, N] at float32 accuracy.

        Keys stored after RoPE are never dequantized: ``q . k_t = sum_b scale_bt sum_{c in b}
        q_c (code_ct - 2^(n-1)) + sum_s (q C_s^T)[a_st]``, the first sum one matmul of the
        query's block-masked, plane-scaled rows (three bfloat16 terms, built once per grid step)
        with the chunk's exact bfloat16 codes, the second a [R, C] x [C, N] one-hot product.
        Keys stored before RoPE are dequantized in float32 [D, N] and rotated by their angles
        less the chunk start's (whose rotation the query carries), then ``q K^T`` with both
        factors as three bfloat16 terms."""
        if not rope:
            q_rows, qb_rows = q_parts
            r = q_ref.shape[0]
            dots = _dot_rows(qb_rows, nb * r, code_matrix(k_refs, j))  # [NB R, N]
            scales = k_refs[1][j].astype(jnp.float32)  # [NB, N]
            logits = None
            for bi in range(nb):
                x = scales[bi:bi + 1] * dots[bi * r:(bi + 1) * r]
                logits = x if logits is None else logits + x
            if stages:
                oh = onehots(k_refs, j)
                for s in range(stages):
                    qc = _dot_rows(q_rows, r, k_refs[3][j, s], _NT)  # q C_s^T [R, C]
                    logits = logits + _dot_rows(_split_rows(qc), r, oh[s])
            return logits
        ls = slice(None)
        kp = key_pieces(j, ls)
        kpos = (c * n + lax.broadcasted_iota(jnp.int32, (1, n), 1)).astype(jnp.float32)
        zero = jnp.minimum(nq, 0)  # 0 at run time (num_quantized >= 0)
        # the chunk start's angle fl(c N f) [D/2, 1], rounded as the tables' (one product)
        sa = lax.bitcast_convert_type(lax.bitcast_convert_type(
            (c * n).astype(jnp.float32) * freq_ref[...], jnp.int32) | zero, jnp.float32)

        def rotation(c0, ww):
            return pc.rope_cos_sin_from_start(
                kpos, freq_ref[c0:c0 + ww, :],
                tuple(off_ref[i, c0:c0 + ww, ls] for i in range(3)),
                sa[c0:c0 + ww], rope_terms, zero)

        kp = pc.rope_pieces(kp, rotation)
        keys = jnp.concatenate(kp, axis=0) if len(kp) > 1 else kp[0]  # [D, N] float32
        # q's terms stacked (one MXU product per key term), the terms above float32's precision
        # left out of the sums
        logits = None
        for t, k_term in enumerate(_split(keys, 3)):
            x = _dot_rows(q_parts, q_ref.shape[0], k_term, parts=3 - t)
            logits = x if logits is None else logits + x
        return logits

    def chunk_logits(j, jr, q_parts):
        """Masked logits [R, N] of chunk j (its data read from chunk jr, below)."""
        c = blk * cb + j  # global chunk index
        if rope:  # q rotated back by the chunk start: R(-B) q = q cos B + [q_2, -q_1] sin B
            q, qs = q_parts
            row = lax.rem(c, lanes)
            qr = q * srow_ref[0, pl.ds(row, 1), :] + qs * srow_ref[1, pl.ds(row, 1), :]
            q_parts = _split_rows(qr)
        logits = key_logits(jr, c, q_parts) * (1.0 / math.sqrt(d))  # [R, N]
        rows = logits.shape[0]
        slot = c * n + lax.broadcasted_iota(jnp.int32, (rows, n), 1)
        pos = start_ref[b] + rowoff_ref[...]  # [R, 1]
        return logits, (slot < nq) & (slot <= pos)

    def chunk_values(j, prob):
        """P V [R, D] of chunk j for its probabilities P [R, N], without dequantizing the values:
        ``sum_t p_t v_ct = 2^(-n plane(c)) sum_t (p_t scale_bt) (code_ct - 2^(n-1)) 2^(n plane(c))
        + sum_s (P onehot_s^T) C_s`` for c in block b, the first sum one matmul of the
        block-scaled probabilities' rows (three bfloat16 terms) with the exact bfloat16 codes,
        each block's columns then kept and scaled by a constant row."""
        r = prob.shape[0]
        scales = v_refs[1][j].astype(jnp.float32)  # [NB, N]
        pw = jnp.concatenate([prob * scales[bi:bi + 1] for bi in range(nb)], axis=0) if (
            nb > 1) else prob * scales  # [NB R, N]
        res = _dot_rows(_split_rows(pw), nb * r, code_matrix(v_refs, j), _NT)  # [NB R, D]
        pv = None
        for bi in range(nb):
            x = res[bi * r:(bi + 1) * r] * col_factor[bi]
            pv = x if pv is None else pv + x
        if stages:
            p_rows = _split_rows(prob)
            oh = onehots(v_refs, j)
            for s in range(stages):
                pa = _dot_rows(p_rows, r, oh[s], _NT)  # P onehot^T [R, C], float32
                pv = pv + _dot_rows(_split_rows(pa), r, v_refs[3][j, s])  # (P onehot^T) C_s
        return pv

    def group_logits(j0, k, q_parts):
        """Masked logits [R, k N] of chunks j0 .. j0 + k - 1 and the chunks their data are read
        from. A chunk past the row's quantized ones (in its last block) reads the last quantized
        chunk's data instead, every slot of it masked: its weights are 0 and its values those
        the row already attends."""
        jr = [jnp.minimum(j0 + i, count - 1) for i in range(k)]
        parts = [chunk_logits(j0 + i, jr[i], q_parts) for i in range(k)]
        logits = jnp.concatenate([x for x, _ in parts], axis=1) if k > 1 else parts[0][0]
        valid = jnp.concatenate([v for _, v in parts], axis=1) if k > 1 else parts[0][1]
        return jr, logits, valid

    def group_update(jr, logits, valid, carry):
        """One online-softmax step over a group's slots; ``carry`` = (acc, m, l)."""
        acc, m, l = carry
        prob, corr, m_new, l_new = pc.online_softmax_step(logits, valid, m, l)
        pv = None
        for i, j in enumerate(jr):
            x = chunk_values(j, prob[:, i * n:(i + 1) * n])
            pv = x if pv is None else pv + x
        return corr * acc + pv, m_new, l_new

    @pl.when(count > 0)
    def _attend():
        # q [R, D] in three bfloat16 terms, once per block (the same for all its chunks); with
        # RoPE q and its half swap [q_2, -q_1], rotated and split per chunk
        q = q_ref[...].astype(jnp.float32)
        if rope:  # the half swap as q times a signed permutation (exact: one product each)
            i = lax.broadcasted_iota(jnp.int32, (d, d), 0)
            o = lax.broadcasted_iota(jnp.int32, (d, d), 1)
            swap = jnp.where(i == o + h, 1.0, jnp.where(i + h == o, -1.0, 0.0))
            q_parts = (q, _dot_rows(_split_rows(q), q.shape[0], swap.astype(jnp.bfloat16)))
        else:  # and q's rows masked to each scale block and plane-scaled, stacked [NB R, D]
            qb = jnp.concatenate([q * f for f in col_factor], axis=0) if nb > 1 else (
                q * col_factor[0])
            q_parts = (_split_rows(q), _split_rows(qb))
        if rope:
            # the chunk starts' cos and sin as query rows [L, D]: the table's block [D, L]
            # transposed when a grid step enters a new group of L chunks
            @pl.when(lax.rem(blk * cb, lanes) == 0)
            def _rows():
                for i in range(2):
                    srow_ref[i] = st_ref[i].T
        if stages:  # the block's assignments as int32 rows (a uint8 row cannot be indexed)
            kid_ref[...] = k_refs[2][...].astype(jnp.int32)
            vid_ref[...] = v_refs[2][...].astype(jnp.int32)
        group = GROUP if cb % GROUP == 0 else 1

        # every group of the block, unconditionally (no branch between groups, so the schedule
        # overlaps consecutive groups); (acc, m, l) carried in registers
        unroll = UNROLL if cb % (group * UNROLL) == 0 else 1

        def body(g, carry):
            # every group's logits first (independent of the softmax state), then the online
            # softmax steps: in this program order the schedule starts the next groups'
            # products while a step waits on its own
            groups = [group_logits((g * unroll + u) * group, group, q_parts)
                      for u in range(unroll)]
            for jr, logits, valid in groups:
                carry = group_update(jr, logits, valid, carry)
            return carry
        acc, m, l = lax.fori_loop(0, cb // (group * unroll), body,
                                  (acc_ref[...], m_ref[...], l_ref[...]))
        acc_ref[...] = acc
        m_ref[...] = m
        l_ref[...] = l

    @pl.when(blk == num_blocks - 1)
    def _done():
        out, lse = pc.finalize(acc_ref[...], m_ref[...], l_ref[...])
        out_ref[...] = out
        lse_ref[...] = lse


@functools.partial(jax.jit, static_argnames=("cfg", "num_new", "rope_base", "interpret"))
def qvg_chunk_attention(q: jax.Array, k_code: ref.QVGCode, v_code: ref.QVGCode, cfg: QVGConfig,
                        start: jax.Array, num_quantized: jax.Array, num_new: int,
                        rope_base: float | None, interpret: bool = False
                        ) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, K, R, D] over the QVG chunks, read from their codes inside the kernel.

    Same contract as :func:`kernels.kv_quant.api.qvg_chunk_attention`: row r of batch b sits at
    position ``start[b] + r % num_new`` and sees slots ``s < num_quantized[b]`` with ``s <= pos``;
    keys are rotated to their slot positions when ``rope_base`` is set.

    The ``pallas_call`` declares the cost of :func:`kernels.kv_quant.cost.qvg_tpu_cost` (every
    chunk quantized).

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]); rows that see no slot get (0, -inf).

    Raises:
      ValueError: inconsistent shapes, a head dim the config cannot pack, or a layout the kernel
        cannot tile (:func:`check_layout`: N not a multiple of 128, W not a multiple of 8).
    """
    pc.check_inputs(q, k_code, v_code, cfg, num_new)
    b, kh, r, d = q.shape
    nc, p, n = k_code.codes.shape[2:]
    nb = k_code.scales.shape[3]
    rope = rope_base is not None
    w = check_layout(n, d, cfg, rope)
    s, c = cfg.stages, cfg.num_centroids
    cb = chunks_per_block(nc, n)
    nblk = nc // cb
    lanes = LANES  # chunks per block of the chunk-start table (128 lanes; CB divides it)
    arows = ASSIGN_ROWS if nc > ASSIGN_ROWS else nc  # chunks per assignments' block

    def block(bi, ki, gi, start_ref, nq_ref):
        # lax.div: truncating division of non-negative ints (jnp's floor division needs sign)
        last = jnp.maximum(lax.div(nq_ref[bi] + n * cb - 1, n * cb) - 1, 0)
        return jnp.minimum(gi, last)

    def spec(shape):
        zeros = (0,) * len(shape)
        return pl.BlockSpec((None, None, cb) + shape,
                            lambda bi, ki, gi, *sr: (bi, ki, block(bi, ki, gi, *sr)) + zeros)

    def code_specs():
        specs = [spec((p, n)), spec((nb, n))]
        if s:
            # assignments [B, K, S, NC, N]: AR chunks' rows per block, a whole uint8 tile
            specs += [pl.BlockSpec((None, None, s, arows, n), lambda bi, ki, gi, *sr: (
                bi, ki, 0, lax.div(block(bi, ki, gi, *sr) * cb, arows), 0)), spec((s, c, d))]
        return specs

    def code_args(code):
        # The cache stays in HBM (the kernel streams it block by block): without the constraint
        # XLA's memory-space assignment staged each whole store in VMEM around the kernel after
        # the cache update's chunk write, a copy of the cache in and out per decode step (v5e,
        # one layer at 128k: 154 MB accessed, 48 MB with it). Interpret mode has no HBM.
        leaves = [code.codes, code.scales] + (
            [jnp.swapaxes(code.assign, 2, 3), code.centroids] if s else [])
        if interpret:
            return leaves
        return [pltpu.with_memory_space_constraint(x, pltpu.HBM) for x in leaves]

    in_specs = [pl.BlockSpec((r, 1), lambda bi, ki, gi, *_: (0, 0)),
                pl.BlockSpec((None, None, r, d), lambda bi, ki, gi, *_: (bi, ki, 0, 0))]
    in_specs += code_specs() + code_specs()
    args = [(jnp.arange(r, dtype=jnp.int32) % num_new)[:, None], q]
    args += code_args(k_code) + code_args(v_code)
    terms = pc.rope_series_terms(nc * n, d, rope_base) if rope else 0
    if rope:
        # frequencies and offsets: one block for the whole grid, fetched once; chunk starts' cos
        # and sin [2, D, L]: the group of L = 128 chunks holding the block's (CB divides L)
        h = d // 2
        in_specs += [pl.BlockSpec((h, 1), lambda *_: (0, 0)),
                     pl.BlockSpec((3, h, n), lambda *_: (0, 0, 0)),
                     pl.BlockSpec((2, d, lanes), lambda bi, ki, gi, *sr: (
                         0, 0, lax.div(block(bi, ki, gi, *sr) * cb, lanes)))]
        tables = pc.rope_tables(nc, n, d, rope_base)
        args += [tables.freq, tables.offsets, pc.rope_start_table(nc, n, d, rope_base, lanes)]

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(b, kh, nblk),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, r, d), lambda bi, ki, gi, *_: (bi, ki, 0, 0)),
                   pl.BlockSpec((None, None, r, 1), lambda bi, ki, gi, *_: (bi, ki, 0, 0))],
        scratch_shapes=[pltpu.VMEM((r, d), jnp.float32), pltpu.VMEM((r, 1), jnp.float32),
                        pltpu.VMEM((r, 1), jnp.float32)]
        + ([pltpu.VMEM((2, lanes, d), jnp.float32)] if rope else [])
        + ([pltpu.VMEM((s, arows, n), jnp.int32)] * 2 if s else []),
    )
    out, lse = pl.pallas_call(
        functools.partial(_kernel, cfg=cfg, rope=rope, w=w, num_blocks=nblk, cb=cb, lanes=lanes,
                          rope_terms=terms, arows=arows),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((b, kh, r, d), jnp.float32),
                   jax.ShapeDtypeStruct((b, kh, r, 1), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        cost_estimate=cost.qvg_tpu_cost(q, k_code, v_code, cfg, w=w, rope=rope,
                                        rope_terms=terms, lanes=lanes),
        name="qvg_chunk_attention",
    )(start.astype(jnp.int32), num_quantized.astype(jnp.int32), *args)
    return out, lse[..., 0]
