"""Analytic cost of the FFD Pallas kernels and the physical floor of an FFD decode step.

Dimensions as in :mod:`kernels.sparse_decode.reference`: B batch, K kv heads, G query heads per kv
head, H = G * K, D head dim, p page size, P pages (capacity S = P * p), W = D / 16 code words per
key, M page slots per (row, kv head), NS splits of the slots; R the query rows a kernel computes
(TPU: G; GPU: G padded to 16); f the fraction of the P pages the kernel is told to assume kept.

XLA charges a ``pallas_call`` nothing unless it declares a ``pl.CostEstimate``; the kernels in
:mod:`kernels.sparse_decode.pallas_tpu` and :mod:`kernels.sparse_decode.pallas_gpu` declare the
counts computed here, so that the compiled program's cost analysis sees them.

Conventions (all counts are Python ints, summed over the whole grid):

* ``bytes_accessed``: bytes moved between HBM and the kernel: every block the kernel's block specs
  fetch (TPU: once per change of block index; GPU: every load the body issues from a page it
  walks), every output block written, and the scalar-prefetched page list.
* ``flops``: floating-point operations; a matmul [m, k] x [k, n] counts 2 m k n (the GPU kernel's
  broadcast multiply-sum of the same product counts the same); an elementwise operation or a
  reduction counts one per input element. Integer work (unpacking the 2-bit codes with shifts and
  masks), dtype conversions and masks (selects, compares that are not a max) are not counted.
* ``transcendentals``: the ``exp`` of the online softmax.

The page count is data dependent (the top-delta rule, paper Sec. 3), so the estimate assumes a
kept fraction f of the P pages: ``ceil(f * P)`` pages per (row, kv head), at most M (the slots).
The default :data:`DEFAULT_KEPT_FRACTION` = 0.1 is of the order measured at long context (6.4% of
the pages at 64k on the benchmark workload); 1.0 is the upper bound (every slot attended).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels import checks
from kernels.sparse_decode.reference import CODES_PER_WORD, F8

DEFAULT_KEPT_FRACTION = 0.1

# the FFD cache's storage format (reference.init_ffd_cache), in bits per token per head-dim channel
CODE_BITS = 32 // CODES_PER_WORD  # 2-bit codes, 16 to an int32 word
SCALE_BITS = 32  # float32 per (page, channel): SCALE_BITS / p bits per token and channel
RESID_BITS = 8 * jnp.dtype(F8).itemsize  # float8 e4m3 residual
VALUE_BITS = 8 * jnp.dtype(jnp.bfloat16).itemsize  # bfloat16 values


def check_kept_fraction(kept_fraction: Any, where: str) -> float:
    """Returns ``kept_fraction`` as a float.

    Raises:
      ValueError: ``kept_fraction`` is not a real number with 0 < f <= 1 (NaN, 0, negatives and
        values above 1 are refused; the message names the value and ``where``).
    """
    real = isinstance(kept_fraction, numbers.Real) and not isinstance(kept_fraction, bool)
    value = float(kept_fraction) if real else math.nan
    if not 0.0 < value <= 1.0:  # NaN fails too
        raise ValueError(f"{where}: assumed_kept_fraction must be a real number in (0, 1] (the "
                         f"fraction of pages the cost estimate assumes attended), got "
                         f"{kept_fraction!r}")
    return value


def kept_pages(num_pages: int, slots: int, kept_fraction: float, where: str = "kept_pages") -> int:
    """Pages per (row, kv head) the estimate assumes: ``min(M, ceil(f * P))`` (>= 1 for f > 0).

    ``f * P`` is rounded to 9 decimals before the ceiling, so that 0.3 * 10 is 3 pages, not 4.

    Raises:
      ValueError: ``kept_fraction`` outside (0, 1] (:func:`check_kept_fraction`).
    """
    f = check_kept_fraction(kept_fraction, where)
    return min(int(slots), max(1, math.ceil(round(f * num_pages, 9))))


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def page_bytes(codes, scale, resid, v) -> int:
    """Bytes of one page of one (row, kv head) in HBM: its codes ``p * W`` words, scale ``D``,
    residual and values ``p * D`` each, in the arrays' dtypes (68 KiB at p = D = 128 with int32
    words, float32 scale, float8 residual, bf16 values: p D (2 + 8 + 16) / 8 + 32 D / 8 bytes)."""
    w, p = codes.shape[3], codes.shape[4]
    d = resid.shape[-1]
    return (_nbytes((p, w), codes.dtype) + _nbytes((d,), scale.dtype)
            + _nbytes((p, d), resid.dtype) + _nbytes((p, d), v.dtype))


def page_flops(rows: int, page_size: int, head_dim: int, parts: int = 1) -> int:
    """FLOPs of one kept page for ``rows`` query rows (the kernel body, top to bottom).

    Matmuls, 6 R p D: the 16 code slabs (2 R p W each, 2 R p D together), the residual term
    (2 R p D) and probabilities x values (2 R p D). Elementwise on [R, D]: q * scale, its sum, the
    per-slab q * scale (R D together), the rescale and add of the accumulator: 5 R D. On [R, p]:
    one logit add per slab and per word chunk (16 ``parts``) and one per residual chunk
    (``parts``), where ``parts`` is the number of power-of-two chunks the GPU kernel cuts W into
    (1 on TPU and for D = 128), then the row max, the subtraction under the exp and the row sum of
    the probabilities: (17 parts + 3) R p. Per row: the -1.5 factor, the running max, the
    subtraction under the correction exp, the rescale and add of l: 5 R.
    """
    r, p, d = rows, page_size, head_dim
    return 6 * r * p * d + 5 * r * d + (17 * parts + 3) * r * p + 5 * r


def page_transcendentals(rows: int, page_size: int) -> int:
    """exps of one kept page: R p probabilities and R corrections."""
    return rows * page_size + rows


def scan_page_flops(rows: int, page_size: int, head_dim: int) -> int:
    """FLOPs of scanning one page for ``rows`` query rows (:func:`kernels.sparse_decode.pallas_tpu.
    ffd_scan_select`'s body): q * scale and its sum (2 R D), the estimated logits (2 R D p), their
    row max (R p), the -1.5 factor and the subtraction (2 R)."""
    r, p, d = rows, page_size, head_dim
    return 2 * r * d * p + 2 * r * d + r * p + 2 * r


def select_flops(rows: int, num_pages: int, slots: int, sub: int) -> int:
    """FLOPs of the selection and compaction that close the scan kernel: the threshold (a masked
    sum over one sub-block, a max and a subtraction: SUB R + 2 R), and per sub-block of SUB pages
    the keep test (a max over the R heads, SUB R), the prefix count (a [SUB, SUB] x [SUB, 128]
    product, 2 SUB^2 128, and its offset, SUB), the one-hot page sum (2 SUB M, and its add to the
    list, M) and the kept sum (SUB + 1)."""
    blocks = num_pages // sub
    per_block = sub * rows + 2 * sub * sub * 128 + sub + 2 * sub * slots + slots + sub + 1
    return sub * rows + 2 * rows + blocks * per_block


def ffd_tpu_scan_cost(qg, codes, scale, *, num_slots: int, pages_per_step: int,
                      sub: int) -> pl.CostEstimate:
    """Cost of :func:`kernels.sparse_decode.pallas_tpu.ffd_scan_select` (grid B x K, P/PB blocks
    each) at a full cache (every page block fetched), from its operands' static shapes and dtypes.

    Args:
      qg: [B, K, G, D] queries; codes [B, K, P, W, p]; scale [B, K, P, D] (shapes and dtypes only).
      num_slots: M, the length of the page list written; pages_per_step: PB; sub: SUB, the pages
        of one selection sub-block.

    Returns:
      ``pl.CostEstimate`` with, summed over the B K (row, kv head) pairs:

      * bytes: the queries ``G D`` once per pair, the codes ``P W p`` and scales ``P D`` of every
        page, the page list ``M`` and the count row (128 lanes) int32 written; plus the lengths
        ``B`` int32 (scalar prefetch).
      * flops: ``P`` x :func:`scan_page_flops` + :func:`select_flops` per pair, R = G.
      * transcendentals: none.
    """
    del pages_per_step  # every block is fetched once whatever its size
    b, kh, g, d = qg.shape
    n, w, p = codes.shape[2], codes.shape[3], codes.shape[4]
    pairs = b * kh
    per_pair = (_nbytes((g, d), jnp.float32) + _nbytes((n, w, p), codes.dtype)
                + _nbytes((n, d), scale.dtype) + _nbytes((num_slots + 128,), jnp.int32))
    flops = n * scan_page_flops(g, p, d) + select_flops(g, n, num_slots, sub)
    return pl.CostEstimate(flops=int(pairs * flops), transcendentals=0,
                           bytes_accessed=int(pairs * per_pair + _nbytes((b,), jnp.int32)))


def attend_page_flops(rows: int, page_size: int, head_dim: int) -> int:
    """FLOPs of one kept page in :func:`kernels.sparse_decode.pallas_tpu.ffd_pages_attention`:
    matmuls 6 R p D (codes, residual, probabilities x values); on [R, D] q * scale, its sum, the
    rescale and add of the accumulator (4 R D); on [R, p] the two logit adds, the row max, the
    subtraction under the exp, the row sum (5 R p); per row the -1.5 factor, the running max, the
    subtraction under the correction exp, the rescale and add of l (5 R)."""
    r, p, d = rows, page_size, head_dim
    return 6 * r * p * d + 4 * r * d + 5 * r * p + 5 * r


def tail_flops(rows: int, page_size: int, head_dim: int) -> int:
    """FLOPs of the tail page and the final division in ``ffd_pages_attention``: matmuls 4 R p D,
    the accumulator's rescale and add 2 R D, on [R, p] 3 R p, per row 4 R, the division R D."""
    r, p, d = rows, page_size, head_dim
    return 4 * r * p * d + 3 * r * d + 3 * r * p + 4 * r


def ffd_tpu_attend_cost(qg, codes, scale, resid, v, tail, idx, *,
                        kept_fraction: float = DEFAULT_KEPT_FRACTION) -> pl.CostEstimate:
    """Cost of :func:`kernels.sparse_decode.pallas_tpu.ffd_pages_attention` (grid B x K), from its
    operands' static shapes and dtypes.

    Args:
      qg: [B, K, G, D] queries; codes [B, K, P, W, p]; scale [B, K, P, D]; resid, v
        [B, K, P, p, D]; tail [B, K, p, D]; idx [B, K, M] the page list (shapes and dtypes only).
      kept_fraction: f in (0, 1]; ``kept = min(M, ceil(f P))`` pages per (row, kv head).

    Returns:
      ``pl.CostEstimate`` with, summed over the B K pairs:

      * bytes: the queries ``G D`` float32, ``kept`` pages of codes, scale, residual and values
        (:func:`page_bytes`, one DMA each), the tail page's keys ``p D`` (its dtype) and values
        ``p D`` bf16, the output ``G D`` float32; plus the scalar-prefetched page list
        ``B K M``, counts ``B K`` and lengths ``B`` (int32).
      * flops: ``kept`` x :func:`attend_page_flops` + :func:`tail_flops`, R = G.
      * transcendentals: ``(kept + 1) (G p + G)`` exps (pages and tail, with their corrections).

    Raises:
      ValueError: ``kept_fraction`` outside (0, 1].
    """
    b, kh, g, d = qg.shape
    n, p = codes.shape[2], codes.shape[4]
    m_slots = idx.shape[-1]
    kept = kept_pages(n, m_slots, kept_fraction, "ffd_tpu_attend_cost")
    pairs = b * kh
    per_pair = (2 * _nbytes((g, d), jnp.float32) + kept * page_bytes(codes, scale, resid, v)
                + _nbytes((p, d), tail.dtype) + _nbytes((p, d), v.dtype))
    page_list = _nbytes((pairs * (m_slots + 1) + b,), jnp.int32)
    return pl.CostEstimate(
        flops=int(pairs * (kept * attend_page_flops(g, p, d) + tail_flops(g, p, d))),
        transcendentals=int(pairs * (kept + 1) * page_transcendentals(g, p)),
        bytes_accessed=int(pairs * per_pair + page_list))


def ffd_gpu_cost(qp, codes, scale, resid, v, idx, *, num_splits: int, parts: int,
                 kept_fraction: float = DEFAULT_KEPT_FRACTION) -> pl.CostEstimate:
    """Cost of :func:`kernels.sparse_decode.pallas_gpu.ffd_pages_attention` (grid B x K x NS),
    from its operands' static shapes and dtypes.

    Args:
      qp: [B, K, R, D] the padded float32 queries (R = 16 rows, G of them real); codes, scale,
        resid, v, idx as :func:`ffd_tpu_cost`.
      num_splits: NS programs per (row, kv head).
      parts: the number of power-of-two chunks the kernel splits the W code words into
        (``len(pallas_gpu.pow2_parts(W))``: 1 for D = 128, 2 for D = 96).
      kept_fraction: f in (0, 1].

    Returns:
      ``pl.CostEstimate`` with, summed over the B K pairs:

      * bytes: the padded queries ``R D`` float32 once per program (NS per pair: every program
        loads them before its loop), ``kept`` pages (:func:`page_bytes`), ``kept`` page indices
        and NS counts (int32), the partials ``NS R (D + 2)`` float32.
      * flops: ``kept`` x :func:`page_flops` with R = 16 (padding rows are computed too).
      * transcendentals: ``kept`` x :func:`page_transcendentals` with R = 16.

    Raises:
      ValueError: ``kept_fraction`` outside (0, 1].
    """
    b, kh, rows, d = qp.shape
    n, p = codes.shape[2], codes.shape[4]
    m_slots = idx.shape[-1]
    kept = kept_pages(n, m_slots, kept_fraction, "ffd_gpu_cost")
    pairs = b * kh
    per_pair = (num_splits * _nbytes((rows, d), qp.dtype)
                + kept * page_bytes(codes, scale, resid, v)
                + _nbytes((kept + num_splits,), jnp.int32)
                + num_splits * _nbytes((rows, d + 2), jnp.float32))
    return pl.CostEstimate(flops=int(pairs * kept * page_flops(rows, p, d, parts)),
                           transcendentals=int(pairs * kept * page_transcendentals(rows, p)),
                           bytes_accessed=int(pairs * per_pair))


def fused_scan_flops(rows: int, page_size: int, head_dim: int) -> int:
    """FLOPs of estimating one page's logits in the fused GPU kernel: the 16 slab products and
    their sums over the W words (2 R D p together), q * scale and its sum (2 R D), the -1.5 factor
    (R) and the page maximum (R p)."""
    r, p, d = rows, page_size, head_dim
    return 2 * r * d * p + 2 * r * d + r + r * p


def fused_attend_flops(rows: int, page_size: int, head_dim: int) -> int:
    """FLOPs of one kept page in the fused GPU kernel beyond its estimate: the residual and value
    matmuls (4 R p D), on [R, p] the residual add, the row max, the subtraction under the exp and
    the row sum (4 R p), the accumulator's rescale and add (2 R D), per row the running max and
    the rescale and add of l (4 R)."""
    r, p, d = rows, page_size, head_dim
    return 4 * r * p * d + 4 * r * p + 2 * r * d + 4 * r


def ffd_gpu_fused_cost(qp, codes, scale, resid, v, *, pages_per_program: int, flag_slots: int,
                       kept_fraction: float = DEFAULT_KEPT_FRACTION) -> pl.CostEstimate:
    """Cost of :func:`kernels.sparse_decode.pallas_gpu.ffd_decode_fused` (grid B x K x NS, NS =
    ceil(P / PPB)) at a full cache, from its operands' static shapes and dtypes.

    Args:
      qp: [B, K, R, D] the padded float32 queries; codes [B, K, P, W, p]; scale [B, K, P, D];
        resid, v [B, K, P, p, D].
      pages_per_program: PPB; flag_slots: the keep flags each program writes (PPB rounded up to a
        power of two).
      kept_fraction: f in (0, 1]; ``kept = ceil(f P)`` pages per (row, kv head).

    Returns:
      ``pl.CostEstimate`` with, summed over the B K pairs:

      * bytes: per program the queries ``R D`` float32, the row's length (int32), the codes and
        scales of the two reference pages (first and last full) and of its PPB pages (every page
        once over the NS programs), its keep flags and its partial ``R (D + 2)`` float32; per kept
        page its residual and values.
      * flops: ``(P + 2 NS)`` x :func:`fused_scan_flops` + ``kept`` x :func:`fused_attend_flops`.
      * transcendentals: ``kept (R p + R)``.

    Raises:
      ValueError: ``kept_fraction`` outside (0, 1].
    """
    b, kh, rows, d = qp.shape
    n, w, p = codes.shape[2], codes.shape[3], codes.shape[4]
    kept = kept_pages(n, n, kept_fraction, "ffd_gpu_fused_cost")
    ns = -(-n // pages_per_program)
    scan_page = _nbytes((w, p), codes.dtype) + _nbytes((d,), scale.dtype)
    per_program = (_nbytes((rows, d), qp.dtype) + 4 + 2 * scan_page
                   + _nbytes((flag_slots,), jnp.int32) + _nbytes((rows, d + 2), jnp.float32))
    per_pair = (ns * per_program + n * scan_page
                + kept * (_nbytes((p, d), resid.dtype) + _nbytes((p, d), v.dtype)))
    flops = (n + 2 * ns) * fused_scan_flops(rows, p, d) + kept * fused_attend_flops(rows, p, d)
    pairs = b * kh
    return pl.CostEstimate(flops=int(pairs * flops),
                           transcendentals=int(pairs * kept * page_transcendentals(rows, p)),
                           bytes_accessed=int(pairs * per_pair))


class FFDFloor(NamedTuple):
    """Bytes an FFD decode step must move per (layer, sequence), by term (floats: ``f`` pages)."""

    scan: float  # 2-bit codes and scales of every full page (the selection reads them all)
    attend: float  # residuals and values of the kept pages
    tail: float  # exact keys and values of the unfinished page
    io: float  # queries read and outputs written

    @property
    def total(self) -> float:
        return self.scan + self.attend + self.tail + self.io


def ffd_floor_bytes(context: int, num_kv_heads: int, num_heads: int, head_dim: int,
                    page_size: int, kept_fraction: float = DEFAULT_KEPT_FRACTION, *,
                    io_itemsize: int = 2, tail_key_itemsize: int = 2) -> FFDFloor:
    """The physical floor of one FFD decode step per (layer, sequence), from the cache's storage
    format alone (FFD paper Sec. 3; bits per token per head-dim channel), with no kernel layout.

    With S = ``context`` tokens, ``F = S // p`` full pages and ``S - F p`` tail tokens, per kv head:

    * scan: ``CODE_BITS`` = 2 bits per token and channel of every full page, plus the float32 scale
      of every (full page, channel), ``SCALE_BITS / p`` bits per token and channel: the page scan
      needs both to estimate every page's logits, ``F p D 2 / 8 + F D 4`` bytes;
    * attend: float8 residual and bf16 values of the kept fraction f of the full pages,
      ``f F p D (8 + 16) / 8`` bytes;
    * tail: the unfinished page's exact keys (``tail_key_itemsize`` bytes, the model dtype) and
      bf16 values, ``(S - F p) D (tail_key_itemsize + 2)`` bytes;

    plus io: the ``num_heads`` query vectors read and outputs written, ``2 H D io_itemsize`` bytes.
    Dense bf16 attention reads ``2 S D 2`` bytes per kv head.

    Raises:
      ValueError: a size that is not an integer >= 1, ``num_heads`` not a multiple of
        ``num_kv_heads``, or ``kept_fraction`` outside (0, 1].
    """
    for name, x in (("context", context), ("num_kv_heads", num_kv_heads),
                    ("num_heads", num_heads), ("head_dim", head_dim), ("page_size", page_size),
                    ("io_itemsize", io_itemsize), ("tail_key_itemsize", tail_key_itemsize)):
        checks.integer(x, name, "ffd_floor_bytes", minimum=1)
    if num_heads % num_kv_heads:
        raise ValueError(f"ffd_floor_bytes: num_heads={num_heads} is not a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    f = check_kept_fraction(kept_fraction, "ffd_floor_bytes")
    d, p, kh = head_dim, page_size, num_kv_heads
    full = context // p
    tail_tokens = context - full * p
    scan = kh * (full * p * d * CODE_BITS + full * d * SCALE_BITS) / 8
    attend = kh * f * full * p * d * (RESID_BITS + VALUE_BITS) / 8
    tail = kh * tail_tokens * d * (tail_key_itemsize + VALUE_BITS // 8)
    io = 2 * num_heads * d * io_itemsize
    return FFDFloor(float(scan), float(attend), float(tail), float(io))
