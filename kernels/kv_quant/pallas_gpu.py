"""QVG decode attention on GPU: a Pallas (Triton) kernel, split-K over chunks, dequantizing in
registers.

Dimensions as in :mod:`kernels.kv_quant.reference`; Rp = R padded to a power of two >= 16 (the
smallest tensor-core tile), NS splits of the NC chunks, BN tokens per tile.

Program (b, k, s) walks the token tiles of its split that hold quantized slots of row b (a
``fori_loop`` whose upper bound is ``ceil(num_quantized[b] / BN)``, so empty tiles are never
read), BN tokens at a time, so registers and shared memory are set by BN and not by the chunk
length N. The cache stores each chunk tokens minor (codes [P, N], scales [NB, N], assignments
[S, N]), so a tile's loads are rows of BN consecutive bytes; it is dequantized channels by tokens
(pieces [W, BN], :mod:`kernels.kv_quant.pallas_common`: shifted masks of the packed bytes times
the block scale row, plus the stage centroids as the bfloat16 product ``C_s^T @ onehot`` of the
chunk's centroid table and the tile's assignments, both staged in shared memory by ``tl.dot``);
keys are rotated to their slot positions when stored before RoPE (by angle addition from the
chunk start's and the in-chunk offsets' cos and sin,
:func:`kernels.kv_quant.pallas_common.rope_cos_sin`), and an online softmax (acc, m, l) is
updated. Each program writes its partial; the splits are merged with a log-sum-exp outside
the kernel. By default the chunks are split so that the grid has at least 264 programs (two per
SM of an H100) when there are that many chunks (:func:`default_splits`).

Triton needs power-of-two tiles: N, D and BN must be powers of two (checked); query rows are padded
(padding rows see no slot).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.kv_quant import cost
from kernels.kv_quant import pallas_common as pc
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import QVGConfig

MIN_ROWS = 16  # smallest tensor-core tile (tl.dot needs every dim >= 16)


MIN_PROGRAMS = 264  # two programs per SM of an H100 SXM (132 SMs)


def default_splits(pairs: int, num_chunks: int) -> int:
    """NS: splits per (batch, kv head) so that ``pairs`` x NS programs reach
    :data:`MIN_PROGRAMS` (split-K over chunks, a whole number of chunks per split; at most NC)."""
    want = -(-MIN_PROGRAMS // pairs)
    cps = max(1, num_chunks // want)
    return -(-num_chunks // cps)


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def _mm(a, b, trans_a=False, trans_b=False, exact=True):
    """[M, K] x [K, N] (``a`` given as [K, M] with ``trans_a``, ``b`` as [N, K] with ``trans_b``):
    ``tl.dot`` (operands staged through shared memory) when every dim is >= 16, else a broadcast
    multiply-sum (tiny tiles)."""
    m = a.shape[1] if trans_a else a.shape[0]
    k = a.shape[0] if trans_a else a.shape[1]
    n = b.shape[0] if trans_b else b.shape[1]
    if min(m, k, n) >= MIN_ROWS:
        return plgpu.dot(a, b, trans_a=trans_a, trans_b=trans_b, allow_tf32=not exact)
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    return jnp.sum(a[:, :, None] * b[None, :, :], axis=1)


def _kernel(pos_ref, nq_ref, q_ref, *refs, cfg: QVGConfig, rope: bool, w: int,
            blocks_per_split: int, block_n: int, num_centroids: int, rope_terms: int):
    stages = cfg.stages
    per_code = 4 if stages else 2
    k_refs, v_refs = refs[:per_code], refs[per_code:2 * per_code]
    rest = refs[2 * per_code:]
    if rope:
        freq_ref, off_ref, st_ref, *rest = rest
    acc_ref, m_ref, l_ref = rest
    split = pl.program_id(2)
    n = k_refs[0].shape[-1]
    blocks_per_chunk = n // block_n
    rows, d = q_ref.shape
    pos = pos_ref[...]  # [Rp]; -1 for padding rows
    nq = jnp.max(nq_ref[...])
    lo = split * blocks_per_split
    hi = jnp.minimum(lo + blocks_per_split, lax.div(nq + block_n - 1, jnp.int32(block_n)))

    def pieces(code_refs, c, toks):  # channels x tokens [W, BN]
        codes_ref, scale_ref = code_refs[0], code_refs[1]
        cent_rows = None
        if stages:
            assign_ref, cent_ref = code_refs[2], code_refs[3]
            cid = jnp.arange(num_centroids, dtype=jnp.int32)[:, None]
            onehot = [(assign_ref[c, s, toks].astype(jnp.int32)[None, :] == cid
                       ).astype(jnp.bfloat16) for s in range(stages)]  # [C, BN]

            def cent_rows(s, c0, ww):  # C_s^T [W, C] @ onehot [C, BN] (bf16: exact)
                return _mm(cent_ref[c, s, :, pl.ds(c0, ww)], onehot[s], trans_a=True)

        return pc.dequant_pieces(
            lambda b0, ww: codes_ref[c, pl.ds(b0, ww), toks],
            lambda bi: scale_ref[c, pl.ds(bi, 1), toks], cent_rows,
            d=d, bits=cfg.bits, block=cfg.block, stages=stages, w=w)

    def body(g, carry):  # token block g: chunk g // blocks_per_chunk, tokens t0 .. t0 + block_n
        accs, m, l = carry
        c = lax.div(g, jnp.int32(blocks_per_chunk))
        t0 = (g - c * blocks_per_chunk) * block_n
        toks = pl.ds(pl.multiple_of(t0, block_n), block_n)
        kp = pieces(k_refs, c, toks)
        if rope:
            kpos = (g * block_n + jnp.arange(block_n, dtype=jnp.int32))[None, :]  # [1, BN]
            kpos = kpos.astype(jnp.float32)
            zero = jnp.minimum(nq, 0)  # 0 at run time (num_quantized >= 0)

            def rotation(c0, ww):
                cols = pl.ds(c0, ww)
                return pc.rope_cos_sin(
                    kpos, freq_ref[cols, :],
                    tuple(off_ref[i, cols, toks] for i in range(3)),
                    tuple(st_ref[i, cols, pl.ds(c, 1)] for i in range(3)), rope_terms, zero)

            kp = pc.rope_pieces(kp, rotation)
        logits = None
        for i, kx in enumerate(kp):
            part = _mm(q_ref[:, pl.ds(i * w, w)].astype(jnp.float32), kx)
            logits = part if logits is None else logits + part
        logits = logits * (1.0 / math.sqrt(d))
        slot = g * block_n + jnp.arange(block_n, dtype=jnp.int32)
        valid = (slot[None, :] < nq) & (slot[None, :] <= pos[:, None])
        prob, corr, m_new, l_new = pc.online_softmax_step(logits, valid, m, l)
        accs = [corr * a + _mm(prob, vx, trans_b=True)
                for a, vx in zip(accs, pieces(v_refs, c, toks), strict=True)]
        return accs, m_new, l_new

    init = ([jnp.zeros((rows, w), jnp.float32) for _ in range(d // w)],
            jnp.full((rows, 1), -jnp.inf, jnp.float32), jnp.zeros((rows, 1), jnp.float32))
    accs, m, l = lax.fori_loop(lo, hi, body, init)
    for i, a in enumerate(accs):
        acc_ref[:, pl.ds(i * w, w)] = a
    m_ref[...] = m
    l_ref[...] = l


@functools.partial(jax.jit, static_argnames=("cfg", "num_new", "rope_base", "num_splits",
                                             "block_n", "interpret", "num_warps"))
def qvg_chunk_attention(q: jax.Array, k_code: ref.QVGCode, v_code: ref.QVGCode, cfg: QVGConfig,
                        start: jax.Array, num_quantized: jax.Array, num_new: int,
                        rope_base: float | None, num_splits: int | None = None,
                        block_n: int | None = None, interpret: bool = False, num_warps: int = 4
                        ) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, K, R, D] over the QVG chunks, dequantized inside the kernel.

    Same contract as :func:`kernels.kv_quant.api.qvg_chunk_attention`. ``num_splits`` (default
    :func:`default_splits`: B K NS >= 264 programs, two per H100 SM, when there are enough chunks)
    programs per (batch, kv head) each take ceil(NC / NS) consecutive chunks, walked
    ``block_n`` tokens at a time (default min(N, 64)): no tile is larger than
    [max(block_n, Rp), W], so shared memory does not grow with N or C. For H100 at N = 1024,
    C = 256, D = 128, S = 1, INT2, block 64, with RoPE, the kernel takes 131904 B of the 232448 B of
    shared memory (XLA's launch); with [N, C] one-hot tiles it asked for 1847296 B and did not compile.
    The ``pallas_call`` declares the cost of :func:`kernels.kv_quant.cost.qvg_gpu_cost` (every
    chunk quantized).

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]); rows that see no slot get (0, -inf).

    Raises:
      ValueError: inconsistent shapes, N or D not a power of two, num_splits < 1, or block_n
        not a power of two dividing N.
    """
    pc.check_inputs(q, k_code, v_code, cfg, num_new)
    b, kh, r, d = q.shape
    nc, n = k_code.codes.shape[2], k_code.codes.shape[4]
    if _pow2(n) != n or _pow2(d) != d:
        raise ValueError(f"pallas_gpu.qvg_chunk_attention: chunk={n} and head dim {d} must be "
                         f"powers of two (Triton tiles); e.g. chunk 128, 256, ..., head dim 64, "
                         f"128 or 256 (or implementation='xla')")
    ns = default_splits(b * kh, nc) if num_splits is None else num_splits
    if ns < 1:
        raise ValueError(f"num_splits={ns} must be >= 1")
    cps = -(-nc // ns)
    ns = -(-nc // cps)  # programs that hold a chunk
    bn = min(n, 64) if block_n is None else block_n
    if bn < 1 or _pow2(bn) != bn or n % bn:
        raise ValueError(f"block_n={bn} must be a power of two that divides the chunk N={n}")
    rope = rope_base is not None
    w = pc.piece_width(d, cfg.bits, cfg.block, rope)
    s, c = cfg.stages, cfg.num_centroids
    rp = max(MIN_ROWS, _pow2(r))

    def full(shape):  # the whole [NC, ...] slab of one (batch, kv head)
        zeros = (0,) * len(shape)
        return pl.BlockSpec((None, None) + shape, lambda bi, ki, si: (bi, ki) + zeros)

    def code_in(code):
        specs = [full((nc, code.codes.shape[3], n)), full((nc, code.scales.shape[3], n))]
        args = [code.codes, code.scales]
        if s:
            specs += [full((nc, s, n)), full((nc, s, c, d))]
            args += [code.assign, code.centroids]
        return specs, args

    rowoff = jnp.arange(rp, dtype=jnp.int32) % num_new
    pos = jnp.where(jnp.arange(rp) < r, start.astype(jnp.int32)[:, None] + rowoff, -1)  # [B, Rp]
    nq = jnp.broadcast_to(num_quantized.astype(jnp.int32)[:, None], (b, rp))
    qp = jnp.pad(q, ((0, 0), (0, 0), (0, rp - r), (0, 0)))
    row_spec = pl.BlockSpec((None, rp), lambda bi, ki, si: (bi, 0))
    in_specs = [row_spec, row_spec, full((rp, d))]
    args = [pos, nq, qp]
    for code in (k_code, v_code):
        sp, ar = code_in(code)
        in_specs += sp
        args += ar
    terms = pc.rope_series_terms(nc * n, d, rope_base) if rope else 0
    if rope:  # frequencies [D/2, 1], offsets [3, D/2, N], chunk starts [3, D/2, NC]
        tables = pc.rope_tables(nc, n, d, rope_base)
        in_specs += [pl.BlockSpec(t.shape, lambda bi, ki, si, nd=t.ndim: (0,) * nd)
                     for t in tables]
        args += list(tables)

    part = lambda shape: pl.BlockSpec((None, None, None) + shape,  # noqa: E731
                                      lambda bi, ki, si: (bi, ki, si) + (0,) * len(shape))
    f32 = jnp.float32
    acc, m, l = pl.pallas_call(
        functools.partial(_kernel, cfg=cfg, rope=rope, w=w, blocks_per_split=cps * (n // bn),
                          block_n=bn, num_centroids=c, rope_terms=terms),
        grid=(b, kh, ns),
        in_specs=in_specs,
        out_specs=[part((rp, d)), part((rp, 1)), part((rp, 1))],
        out_shape=[jax.ShapeDtypeStruct((b, kh, ns, rp, d), f32),
                   jax.ShapeDtypeStruct((b, kh, ns, rp, 1), f32),
                   jax.ShapeDtypeStruct((b, kh, ns, rp, 1), f32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=2),
        interpret=interpret,
        cost_estimate=cost.qvg_gpu_cost(qp, k_code, v_code, cfg, w=w, rope=rope, num_splits=ns,
                                        block_n=bn, rope_terms=terms),
        name="qvg_chunk_attention",
    )(*args)
    return _merge_splits(acc[:, :, :, :r], m[:, :, :, :r, 0], l[:, :, :, :r, 0])


def _merge_splits(acc, m, l):
    """Log-sum-exp merge of split partials acc [B, K, NS, R, D], m, l [B, K, NS, R]."""
    mx = jnp.max(m, axis=2)
    mx_safe = jnp.where(jnp.isfinite(mx), mx, 0.0)
    wgt = jnp.exp(m - mx_safe[:, :, None])  # 0 for empty splits (m = -inf)
    total = jnp.sum(wgt * l, axis=2)
    out = jnp.sum(wgt[..., None] * acc, axis=2)
    out, lse = pc.finalize(out, mx_safe[..., None], total[..., None])
    return out, lse[..., 0]
