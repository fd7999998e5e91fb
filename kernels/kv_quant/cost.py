"""Analytic cost of the QVG Pallas kernels and the physical floor of a QVG decode step.

Dimensions as in :mod:`kernels.kv_quant.reference`: B batch, K kv heads, R = G * T query rows per
kv head, D head dim, N tokens per chunk, NC chunks, P = D bits / 8 packed bytes per token,
NB = D / block scale blocks per token, S k-means stages, C centroids; W the kernels' column piece
width (:func:`kernels.kv_quant.pallas_common.piece_width`).

XLA charges a ``pallas_call`` nothing unless it declares a ``pl.CostEstimate``; the kernels in
:mod:`kernels.kv_quant.pallas_tpu` and :mod:`kernels.kv_quant.pallas_gpu` declare the counts
computed here. Conventions as in :mod:`kernels.sparse_decode.cost`: bytes moved between HBM and the
kernel (blocks fetched, loads issued, outputs written), FLOPs with a matmul [m, k] x [k, n] as
2 m k n and one per input element of an elementwise operation or reduction (integer unpacking,
conversions and masks not counted), transcendentals the softmax ``exp`` (and the TPU kernel's
final ``log``).

The kernels skip chunks past ``num_quantized``, which is known only at run time; the estimate
assumes every one of the NC chunks quantized (a full cache), the largest cost.

Only QVG has Pallas kernels; KIVI's decode (:func:`kernels.kv_quant.xla.kivi_attention`) is XLA,
whose cost XLA counts itself.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import checks
from kernels.kv_quant.reference import CENTROID_DTYPE, SCALE_DTYPE, QVGConfig

_F32 = 4  # bytes


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def chunk_bytes(code) -> int:
    """Bytes of one chunk of one (row, kv head) of a :class:`~kernels.kv_quant.reference.QVGCode`
    with fields [B, K, NC, ...]: codes ``N P``, scales ``N NB``, assignments ``S N`` and centroids
    ``S C D``, in their dtypes, tokens minor (QVG paper Sec. 3; at N = 256, D = 128, INT2, block 64, S = 1,
    C = 16: 8192 + 1024 + 256 + 4096 = 13568 bytes, 53 per token)."""
    per = lambda x: _nbytes(x.shape[3:], x.dtype)  # noqa: E731
    return per(code.codes) + per(code.scales) + per(code.assign) + per(code.centroids)


def tpu_block_bytes(shape, dtype) -> int:
    """Bytes a TPU kernel moves for a block [..., X, Y] in VMEM's tiled layout: Y padded to a
    multiple of 128 lanes and X to a multiple of the rows one 32-bit sublane word packs (4 for
    8-bit, 2 for 16-bit, 1 for 32-bit dtypes). E.g. one chunk's uint8 assignments [S = 1, N =
    256] move as [4, 256]: 1024 bytes where they store 256."""
    *lead, x, y = shape
    pack = max(1, 4 // jnp.dtype(dtype).itemsize)
    return _nbytes((*lead, -(-x // pack) * pack, -(-y // 128) * 128), dtype)


TPU_ASSIGN_ROWS = 32  # chunks per block of the TPU kernel's assignments: one uint8 (32, 128) tile


def tpu_chunks_per_block(num_chunks: int, chunk: int, target_tokens: int = 8192) -> int:
    """CB, the chunks per grid step of the TPU kernel: the largest divisor of NC with
    CB N <= max(N, ``target_tokens``) and CB a divisor of 128 that is at most
    :data:`TPU_ASSIGN_ROWS` (a block's chunks then share one block of the assignments)."""
    cap = max(1, min(target_tokens // chunk, TPU_ASSIGN_ROWS))
    return max(c for c in range(1, min(cap, num_chunks) + 1)
               if num_chunks % c == 0 and 128 % c == 0)


def tpu_chunk_bytes(code) -> int:
    """:func:`chunk_bytes` in :func:`tpu_block_bytes` without the assignments: what the TPU
    kernel moves per chunk of one (row, kv head) for codes, scales and centroids (at N = 256,
    D = 128, INT2, block 64, S = 1, C = 16: 8192 + 1024 + 4096 = 13312 bytes); the assignments
    come in blocks of several chunks (:func:`tpu_assign_bytes`)."""
    return sum(tpu_block_bytes(x.shape[3:], x.dtype)
               for x in (code.codes, code.scales, code.centroids))


def tpu_assign_bytes(code) -> int:
    """Bytes the TPU kernel moves for the assignments of one (row, kv head): the kernel reads
    them chunks second-minor ([S, NC, N], a free view of the store), in ``ceil(NC / AR)`` blocks
    [S, AR, N] of AR = min(NC, 32) chunks, each in :func:`tpu_block_bytes` (at NC = 512, N = 256,
    S = 1: 16 blocks of 8192 bytes, 256 per chunk, where chunk-major [S, N] blocks moved
    [4, N], 1024 per chunk)."""
    nc, s, n = code.assign.shape[2:]
    rows = min(nc, TPU_ASSIGN_ROWS)
    return -(-nc // rows) * tpu_block_bytes((s, rows, n), code.assign.dtype) if s else 0


def dequant_flops(tokens: int, head_dim: int, stages: int, num_centroids: int,
                  onehot: bool) -> int:
    """FLOPs to dequantize ``tokens`` x D values (:func:`kernels.kv_quant.pallas_common.dequant_pieces`):
    ``(code - 2^(n-1)) * scale`` (2 per value) and per stage the centroid add (1 per value), plus
    on TPU (``onehot``) the bf16 one-hot [N, C] x [C, D] gather matmul (2 N C D per stage)."""
    n, d = tokens, head_dim
    return 2 * n * d + stages * (n * d + (2 * n * num_centroids * d if onehot else 0))


def rope_flops(tokens: int, head_dim: int, terms: int) -> int:
    """FLOPs to rotate ``tokens`` keys to their slot positions in a kernel: per token and frequency
    (D / 2 of them) the angle ``fl(p f)``, its residual ``e`` and the m-term series of ``cos e``,
    ``sin e``, and the addition formulas, ``17 + 4 m``
    (:func:`kernels.kv_quant.pallas_common.rope_cos_sin`), and the rotation of the pair, 4
    products and 2 adds (:func:`kernels.kv_quant.pallas_common.rope_pieces`)."""
    return tokens * (head_dim // 2) * (17 + 4 * terms + 6)


def rope_from_start_flops(tokens: int, head_dim: int, terms: int) -> int:
    """:func:`rope_flops` of a kernel whose query carries the chunk start's rotation
    (:func:`kernels.kv_quant.pallas_common.rope_cos_sin_from_start`): ``11 + 4 m`` per token
    and frequency for the angle less the start's, plus the pair's rotation, 6."""
    return tokens * (head_dim // 2) * (11 + 4 * terms + 6)


def tile_flops(rows: int, tokens: int, head_dim: int, w: int) -> int:
    """FLOPs of attending ``tokens`` dequantized (and rotated) keys / values for ``rows`` query
    rows: the logits q K^T, 2 R N D, their D / W - 1 piece adds and the 1/sqrt(D) factor,
    R N (D / W); the online softmax: row max, subtraction under the exp and row sum, 3 R N, and
    per row the running max, correction subtraction, l rescale and add, 4 R; the accumulator:
    probabilities x values 2 R N D, rescale and add 2 R D."""
    r, n, d = rows, tokens, head_dim
    return 4 * r * n * d + r * n * (d // w) + 3 * r * n + 4 * r + 2 * r * d


def code_logits_flops(rows: int, tokens: int, head_dim: int, blocks: int, stages: int,
                      num_centroids: int) -> int:
    """FLOPs of the TPU kernel's logits over keys stored after RoPE, read as codes
    (:mod:`kernels.kv_quant.pallas_tpu`): the codes' offsets ``code - 2^(n-1)``, N D; the
    query against the codes, 2 R N D; each scale block's row times its partial products and
    their sum, R N (2 NB - 1); per stage ``q C_s^T`` 2 R C D, its one-hot gather 2 R C N and
    the add, R N; the 1/sqrt(D) factor, R N."""
    r, n, d, c = rows, tokens, head_dim, num_centroids
    return (n * d + 2 * r * n * d + r * n * (2 * blocks - 1)
            + stages * (2 * r * c * d + 2 * r * c * n + r * n) + r * n)


def code_values_flops(rows: int, tokens: int, head_dim: int, blocks: int, stages: int,
                      num_centroids: int) -> int:
    """FLOPs of the TPU kernel's ``P V`` over value codes: the offsets, N D; the probabilities
    times each block's scales, NB R N; their product with the codes, 2 R N D; each block's
    columns times its constant row and their sum, R D (2 NB - 1); per stage ``P onehot^T``
    2 R N C, its product with the centroids 2 R C D and the add, R D."""
    r, n, d, c = rows, tokens, head_dim, num_centroids
    return (n * d + blocks * r * n + 2 * r * n * d + r * d * (2 * blocks - 1)
            + stages * (2 * r * n * c + 2 * r * c * d + r * d))


def rope_start_table_bytes(chunks: int, head_dim: int) -> int:
    """Bytes of ``chunks`` columns of :func:`kernels.kv_quant.pallas_common.rope_start_table`
    (the chunk starts' cos and sin over the head dim), float32: ``2 D chunks``."""
    return _F32 * 2 * chunks * head_dim


def rope_table_bytes(num_chunks: int, chunk: int, head_dim: int) -> tuple[int, int]:
    """(bytes of the tables read once, bytes per chunk) of
    :class:`kernels.kv_quant.pallas_common.RopeTables`, float32: the frequencies ``D / 2`` and the
    in-chunk offsets' cos, sin and angle ``3 N D / 2`` once; the chunk start's cos, sin and angle
    ``3 D / 2`` per chunk."""
    h = head_dim // 2
    return _F32 * (h + 3 * chunk * h), _F32 * 3 * h


def qvg_tpu_cost(q, k_code, v_code, cfg: QVGConfig, *, w: int, rope: bool,
                 rope_terms: int = 1, lanes: int | None = None) -> pl.CostEstimate:
    """Cost of :func:`kernels.kv_quant.pallas_tpu.qvg_chunk_attention` (grid B x K x NC / CB, CB
    chunks per step), every chunk quantized.

    Args:
      q: [B, K, R, D] queries; k_code, v_code: QVGCode fields [B, K, NC, ...] (only shapes and
        dtypes are read); cfg: the QVG config; w: the piece width W; rope: whether keys are
        rotated in the kernel (then the tables of :func:`rope_table_bytes` are read);
        rope_terms: the series terms m
        (:func:`kernels.kv_quant.pallas_common.rope_series_terms`; 1 up to 128k positions);
        lanes: L, the chunks per block of the chunk-start table (default 128).

    Returns:
      ``pl.CostEstimate`` with, summed over the B K (row, kv head) pairs:

      * bytes: the queries ``R D`` once per pair; per chunk the key and value chunks as the
        kernel moves them, in padded tiles (:func:`tpu_chunk_bytes`), and their assignments in
        blocks of up to 32 chunks (:func:`tpu_assign_bytes`); with RoPE the chunk starts' cos
        and sin in ``ceil(NC / L)`` blocks of L chunks (:func:`rope_start_table_bytes`; the
        block index changes once per group); the output ``R D`` and log-sum-exp ``R`` float32
        once per pair; once per call the row offsets ``R``
        int32, the scalar-prefetched ``start`` and ``num_quantized``, ``2 B`` int32, and with
        RoPE the frequencies and offsets' tables (their block index never changes, so they are
        fetched once).
      * flops: per chunk the values' ``P V`` from their codes (:func:`code_values_flops`), the
        online softmax, ``3 R N + 4 R``, and the accumulator's rescale and add, ``2 R D``; the
        logits: keys stored after RoPE read as codes (:func:`code_logits_flops`, and per grid
        step the query's block rows, ``NB R D``), or with RoPE the keys dequantized
        (:func:`dequant_flops`, one-hot matmul), rotated by their angles less the chunk
        start's (:func:`rope_from_start_flops`), the start's angles ``D / 2``, the query's
        rotation by them ``3 R D`` and ``q K^T`` with its piece adds and 1/sqrt(D) factor,
        ``2 R N D + R N D / W``, and per grid step the query's half swap, a signed
        permutation matmul of its three terms, ``6 R D^2``; per pair the final ``acc / l``
        and ``m + log l``, R (D + 1).
      * transcendentals: per chunk R N + R exps; per pair R logs.
    """
    b, kh, r, d = q.shape
    nc, n = k_code.codes.shape[2], k_code.codes.shape[4]
    s, c = cfg.stages, cfg.num_centroids
    lanes = 128 if lanes is None else lanes
    pairs = b * kh
    rope_once = rope_table_bytes(nc, n, d)[0] if rope else 0
    starts = -(-nc // lanes) * rope_start_table_bytes(lanes, d) if rope else 0
    chunks = tpu_chunk_bytes(k_code) + tpu_chunk_bytes(v_code)
    assign = tpu_assign_bytes(k_code) + tpu_assign_bytes(v_code)
    per_pair = _nbytes((r, d), q.dtype) + nc * chunks + assign + starts + _F32 * r * (d + 1)
    once = _nbytes((r,), jnp.int32) + _nbytes((2, b), jnp.int32) + rope_once
    nb = d // cfg.block
    if rope:
        keys = (dequant_flops(n, d, s, c, onehot=True) + rope_from_start_flops(n, d, rope_terms)
                + d // 2 + 3 * r * d + 2 * r * n * d + r * n * (d // w))
        per_step = 2 * 3 * r * d * d  # q's half swap
    else:
        keys = code_logits_flops(r, n, d, nb, s, c)
        per_step = nb * r * d  # q's block rows
    softmax = 3 * r * n + 4 * r + 2 * r * d
    flops = nc * (keys + code_values_flops(r, n, d, nb, s, c) + softmax)
    flops += r * (d + 1) + nc // tpu_chunks_per_block(nc, n) * per_step
    return pl.CostEstimate(flops=int(pairs * flops),
                           transcendentals=int(pairs * (nc * (r * n + r) + r)),
                           bytes_accessed=int(pairs * per_pair + once))


def qvg_gpu_cost(qp, k_code, v_code, cfg: QVGConfig, *, w: int, rope: bool, num_splits: int,
                 block_n: int, rope_terms: int = 1) -> pl.CostEstimate:
    """Cost of :func:`kernels.kv_quant.pallas_gpu.qvg_chunk_attention` (grid B x K x NS, each
    program walking its chunks ``block_n`` tokens at a time), every chunk quantized.

    Args:
      qp: [B, K, Rp, D] the padded queries (Rp rows computed); k_code, v_code, cfg, w, rope,
        rope_terms as :func:`qvg_tpu_cost`; num_splits: NS programs per pair; block_n: BN tokens
        per tile.

    Returns:
      ``pl.CostEstimate`` with, summed over the B K pairs:

      * bytes: per program the row positions and counts ``2 Rp`` int32, and, for each of the
        ``ceil(NC / ceil(NC / NS))`` programs that hold a chunk, the queries ``Rp D`` and, with
        RoPE, the frequencies' and offsets' tables (:func:`rope_table_bytes`; later tiles reload
        them from cache); per chunk the key and value chunks (:func:`chunk_bytes`: the centroid
        table once per chunk; the chunk's later tiles re-read it from cache) and, with RoPE, the
        chunk start's column ``3 D / 2`` float32; the partials ``NS Rp (D + 2)`` float32.
      * flops: per chunk, keys and values dequantized (:func:`dequant_flops` with the one-hot
        matmul ``C_s^T @ onehot``), with RoPE the rotation of N keys (:func:`rope_flops`), and
        :func:`tile_flops` with Rp rows per tile of BN tokens.
      * transcendentals: per tile Rp BN + Rp exps.
    """
    b, kh, rows, d = qp.shape
    nc, n = k_code.codes.shape[2], k_code.codes.shape[4]
    s, c = cfg.stages, cfg.num_centroids
    pairs = b * kh
    tiles = n // block_n  # per chunk
    active = -(-nc // -(-nc // num_splits))  # programs with at least one chunk
    rope_once, rope_chunk = rope_table_bytes(nc, n, d) if rope else (0, 0)
    per_pair = (num_splits * _nbytes((2, rows), jnp.int32)
                + active * (_nbytes((rows, d), qp.dtype) + rope_once)
                + nc * (chunk_bytes(k_code) + chunk_bytes(v_code) + rope_chunk)
                + num_splits * _F32 * rows * (d + 2))
    rot = rope_flops(n, d, rope_terms) if rope else 0
    flops = nc * (2 * dequant_flops(n, d, s, c, onehot=True) + rot
                  + tiles * tile_flops(rows, block_n, d, w))
    trans = nc * tiles * (rows * block_n + rows)
    return pl.CostEstimate(flops=int(pairs * flops), transcendentals=int(pairs * trans),
                           bytes_accessed=int(pairs * per_pair))


class QVGFloor(NamedTuple):
    """Bytes a QVG decode step must move per (layer, sequence), by term (keys and values)."""

    codes: float
    scales: float
    assign: float
    centroids: float
    window: float  # the recent tokens kept in full precision
    io: float  # queries read and outputs written

    @property
    def total(self) -> float:
        return sum(self)


def qvg_floor_bytes(context: int, num_kv_heads: int, num_heads: int, head_dim: int,
                    cfg: QVGConfig, *, num_new: int = 1, window_itemsize: int = 2,
                    io_itemsize: int = 2) -> QVGFloor:
    """The physical floor of one QVG decode step per (layer, sequence), from the storage format
    alone (QVG paper Sec. 3: k-means smoothing, progressive residual INTn), no kernel layout.

    Of the S = ``context`` tokens, ``Sq = N floor(S / N)`` are quantized and the ``S - Sq`` most
    recent stay in the full-precision window. Per kv head, for keys and for values each, in bits
    per token and head-dim channel:

    * codes: ``bits`` (INTn residual codes);
    * scales: ``16 / block`` (one bfloat16 scale per block of channels);
    * assignments: ``8 S / D`` (one uint8 centroid id per token and stage);
    * centroids: ``16 S C / N`` (S x C bfloat16 centroids of D channels per chunk of N tokens);
    * window: ``8 window_itemsize`` for the ``S - Sq`` recent tokens;

    plus io: the ``num_heads x num_new`` query rows read and outputs written,
    ``2 H T D io_itemsize`` bytes. Dense bf16 attention reads ``2 S D 2`` bytes per kv head.

    Raises:
      ValueError: a size that is not an integer >= 1, or ``num_heads`` not a multiple of
        ``num_kv_heads``; a head dim ``cfg`` cannot pack.
    """
    for name, x in (("context", context), ("num_kv_heads", num_kv_heads),
                    ("num_heads", num_heads), ("head_dim", head_dim), ("num_new", num_new),
                    ("window_itemsize", window_itemsize), ("io_itemsize", io_itemsize)):
        checks.integer(x, name, "qvg_floor_bytes", minimum=1)
    if num_heads % num_kv_heads:
        raise ValueError(f"qvg_floor_bytes: num_heads={num_heads} is not a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    cfg.check_head_dim(head_dim)
    d, n, kh = head_dim, cfg.chunk, num_kv_heads
    sq = (context // n) * n
    tensors = 2 * kh  # keys and values of every kv head
    scale_bits = 8 * jnp.dtype(SCALE_DTYPE).itemsize
    cent_bits = 8 * jnp.dtype(CENTROID_DTYPE).itemsize
    return QVGFloor(
        codes=tensors * sq * d * cfg.bits / 8,
        scales=tensors * sq * (d // cfg.block) * scale_bits / 8,
        assign=tensors * sq * cfg.stages * 8 / 8,
        centroids=tensors * (sq // n) * cfg.stages * cfg.num_centroids * d * cent_bits / 8,
        window=float(tensors * (context - sq) * d * window_itemsize),
        io=float(2 * num_heads * num_new * d * io_itemsize))
