"""The ``pl.CostEstimate`` the four Pallas kernels declare (FFD and QVG, TPU and GPU): read back
from the traced ``pallas_call`` (no compilation), checked against hand counts and counts summed from
the blocks the kernels touch, against the storage-format floors, for their scaling in context and
kept fraction, and for the refusal of bad kept fractions."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.extend import core as jex_core

from kernels.kv_quant import cost as kq_cost
from kernels.kv_quant import pallas_common as pc
from kernels.kv_quant import pallas_gpu as kq_gpu
from kernels.kv_quant import pallas_tpu as kq_tpu
from kernels.kv_quant import reference as kq_ref
from kernels.sparse_decode import api as sd_api
from kernels.sparse_decode import cost as sd_cost
from kernels.sparse_decode import pallas_gpu as sd_gpu
from kernels.sparse_decode import pallas_tpu as sd_tpu
from kernels.sparse_decode import reference as sd_ref

S32 = jnp.int32


def _sub_jaxprs(value):
    if isinstance(value, jex_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jex_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)


def pallas_estimates(fn, *args) -> list:
    """The ``cost_estimate`` of every ``pallas_call`` in ``fn``'s jaxpr (nested jaxprs included)."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                found.append(eqn.params["cost_estimate"])
            else:
                for v in eqn.params.values():
                    for sub in _sub_jaxprs(v):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def _one(fn, *args):
    est = pallas_estimates(fn, *args)
    assert len(est) == 1, est
    return est[0]


# -- FFD --------------------------------------------------------------------------------------


def _ffd_structs(b, kh, g, d, p, n, m):
    """(qg, codes, scale, resid, v, idx, count) of the GPU kernel's signature."""
    sds = jax.ShapeDtypeStruct
    cache = jax.eval_shape(lambda: sd_ref.init_ffd_cache(b, n * p, kh, d, jnp.bfloat16, p))
    return (sds((b, kh, g, d), jnp.float32), cache["codes"], cache["scale"], cache["resid"],
            cache["v"], sds((b, kh, m), S32), sds((b, kh), S32))


def _tpu_args(structs):
    """The TPU attention kernel's operands: the GPU's plus the tail keys and the lengths."""
    qg, codes, scale, resid, v, idx, count = structs
    b, kh, _, d = qg.shape
    tail = jax.ShapeDtypeStruct((b, kh, codes.shape[-1], d), jnp.bfloat16)
    return (qg, codes, scale, resid, v, tail, idx, count, jax.ShapeDtypeStruct((b,), S32))


def _ffd_kernel_estimate(impl, structs, ns, f):
    if impl == "tpu":
        return _one(functools.partial(sd_tpu.ffd_pages_attention, assumed_kept_fraction=f),
                    *_tpu_args(structs))
    return _one(functools.partial(sd_gpu.ffd_pages_attention, num_splits=ns,
                                  assumed_kept_fraction=f), *structs)


def _scan_estimate(structs):
    qg, codes, scale = structs[:3]
    lengths = jax.ShapeDtypeStruct((qg.shape[0],), S32)
    return _one(functools.partial(sd_tpu.ffd_scan_select, delta=3.0), qg, codes, scale, lengths)


def _fused_estimate(structs, f):
    qg, codes, scale, resid, v = structs[:5]
    lengths = jax.ShapeDtypeStruct((qg.shape[0],), S32)
    return _one(functools.partial(sd_gpu.ffd_decode_fused, delta=3.0, assumed_kept_fraction=f),
                qg, codes, scale, resid, v, lengths)


def _ffd_bytes_from_blocks(impl, structs, ns, kept):
    """Bytes summed over the blocks the kernel touches, sliced out of zero arrays of the operands'
    shapes and dtypes (an independent route to the same count)."""
    qg, codes, scale, resid, v, idx, count = (np.zeros(s.shape, s.dtype) for s in structs)
    b, kh, g, d = qg.shape
    rows = g if impl == "tpu" else sd_gpu.ROWS
    partial = np.zeros((rows, d + 2), np.float32).nbytes  # acc [R, D], m and l [R]
    # TPU: the page list, counts and lengths by scalar prefetch, once
    total = idx.nbytes + count.nbytes + 4 * b if impl == "tpu" else 0
    for bi in range(b):
        for ki in range(kh):
            pages = sum(x[bi, ki, :kept].nbytes for x in (codes, scale, resid, v))
            if impl == "tpu":  # q in, the tail's bf16 keys and its value page, the output out
                total += 2 * qg[bi, ki].nbytes + pages + 2 * v[bi, ki, 0].nbytes
            else:  # every program loads the padded queries and the count; kept indices
                qp = np.zeros((rows, d), np.float32)
                total += ns * (qp.nbytes + count[bi, ki].nbytes) + idx[bi, ki, :kept].nbytes
                total += pages + ns * partial
    return total


# (B, K, G, D, p, P, M, NS, f, kept): M = P (no cap) and M < ceil(f P) (the slots cap the pages);
# f P fractional (ceil) and integral (0.3 x 10 = 3 pages despite float rounding).
FFD_SHAPES = [
    (1, 1, 4, 32, 16, 8, 8, 1, 0.25, 2),
    (2, 2, 2, 64, 16, 10, 10, 2, 0.3, 3),
    (1, 2, 8, 32, 32, 9, 9, 3, 0.5, 5),
    (2, 1, 4, 32, 16, 8, 4, 2, 1.0, 4),
    (1, 1, 1, 96, 16, 4, 4, 1, 0.01, 1),
]


@pytest.mark.parametrize("shape", [s for s in FFD_SHAPES if s[3] != 96])  # W = D / 16: 2^k
def test_ffd_gpu_fused_estimate(shape):
    """The fused GPU kernel: its declared count is the analytic one, by hand on its blocks, and at
    least the floor (its bytes cover the scan, the kept pages and the queries; the tail page is
    merged outside)."""
    b, kh, g, d, p, n, m, ns, f, kept = shape
    structs = _ffd_structs(b, kh, g, d, p, n, n)
    est = _fused_estimate(structs, f)
    ppb = sd_gpu.fused_pages_per_program(n, b * kh)
    programs = -(-n // ppb)
    slots = 1 << max(0, (ppb - 1).bit_length())
    qp = jax.ShapeDtypeStruct((b, kh, sd_gpu.ROWS, d), jnp.float32)
    assert est == sd_cost.ffd_gpu_fused_cost(qp, *structs[1:5], pages_per_program=ppb,
                                             flag_slots=slots, kept_fraction=f)
    kept = sd_cost.kept_pages(n, n, f)
    w = d // 16
    scan_page = w * p * 4 + d * 4
    rows = sd_gpu.ROWS
    per_program = rows * d * 4 + 4 + 2 * scan_page + slots * 4 + rows * (d + 2) * 4
    assert est.bytes_accessed == b * kh * (programs * per_program + n * scan_page
                                           + kept * p * d * 3)
    floor = sd_cost.ffd_floor_bytes(n * p, kh, kh * g, d, p, kept * 1.0 / n, io_itemsize=4)
    assert est.bytes_accessed >= b * (floor.scan + floor.attend + floor.io / 2)
    assert est.transcendentals == b * kh * kept * (rows * p + rows)


def test_ffd_gpu_fused_launches_enough_programs():
    """Llama-3-8B at 128k on one kv head per GPU (P = 1024 pages, B K = 1): at least 264 programs
    (two per SM of an H100), each scanning at least one page."""
    for pairs, n in ((1, 1024), (4, 1024), (1, 300), (1, 8)):
        ppb = sd_gpu.fused_pages_per_program(n, pairs)
        programs = pairs * -(-n // ppb)
        assert ppb >= 1 and (programs >= 264 or ppb == 1)
    assert sd_gpu.fused_pages_per_program(1024, 1) == 3  # 342 programs


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
@pytest.mark.parametrize("shape", FFD_SHAPES)
def test_ffd_declared_estimate_is_the_analytic_count(impl, shape):
    b, kh, g, d, p, n, m, ns, f, kept = shape
    structs = _ffd_structs(b, kh, g, d, p, n, m)
    est = _ffd_kernel_estimate(impl, structs, ns, f)
    assert isinstance(est, pl.CostEstimate)
    assert sd_cost.kept_pages(n, m, f) == kept
    pairs = b * kh
    if impl == "tpu":
        args = _tpu_args(structs)
        want = sd_cost.ffd_tpu_attend_cost(*args[:7], kept_fraction=f)
        rows, calls = g, kept + 1  # the tail page is attended too (exactly)
        matmul = pairs * (kept * 6 + 4) * rows * p * d
    else:
        qp = jax.ShapeDtypeStruct((b, kh, sd_gpu.ROWS, d), jnp.float32)
        parts = len(sd_gpu.pow2_parts(d // 16))
        want = sd_cost.ffd_gpu_cost(qp, *structs[1:6], num_splits=ns, parts=parts, kept_fraction=f)
        rows, calls = sd_gpu.ROWS, kept
        # the matmuls alone (refined logits from codes and residual, then P V) are 6 R p D per page
        matmul = pairs * kept * 6 * rows * p * d
    assert est == want
    assert est.bytes_accessed == _ffd_bytes_from_blocks(impl, structs, ns, kept)
    assert est.transcendentals == pairs * calls * (rows * p + rows)
    assert matmul < est.flops < 1.2 * matmul


def test_ffd_tpu_count_by_hand():
    """B = K = 1, G = 4, D = 32 (W = 2), p = 16, P = M = 8, f = 1/4: 2 kept pages."""
    structs = _ffd_structs(1, 1, 4, 32, 16, 8, 8)
    est = _ffd_kernel_estimate("tpu", structs, 1, 0.25)
    # bytes: q 4*32*4 = 512 in and the output 512 out; per page codes 2*16*4 = 128, scale 32*4 =
    # 128, resid 16*32 = 512, v 16*32*2 = 1024 (1792, twice: 3584); tail keys (bf16) and values
    # 16*32*2 = 1024 each; page list (8+1)*4 = 36 and lengths 4
    assert est.bytes_accessed == 512 + 512 + 3584 + 2048 + 36 + 4
    # flops per page: 6*4*16*32 = 12288 (matmuls) + 4*4*32 = 512 + 5*4*16 = 320 + 5*4 = 20;
    # tail: 4*4*16*32 = 8192 + 3*4*32 = 384 + 3*4*16 = 192 + 4*4 = 16
    assert est.flops == 2 * (12288 + 512 + 320 + 20) + 8192 + 384 + 192 + 16
    assert est.transcendentals == 3 * (4 * 16 + 4)
    # the scan kernel over all 8 pages (one grid step, one selection sub-block of 8 pages):
    # bytes: q 512; codes 8*2*16*4 = 1024; scales 8*32*4 = 1024; page list 8 and count row 128
    # int32 written, 544; lengths 4
    scan = _scan_estimate(structs)
    assert scan.bytes_accessed == 512 + 1024 + 1024 + 544 + 4
    # per page 2*4*32*16 = 4096 + 2*4*32 = 256 + 4*16 = 64 + 2*4 = 8; selection: the threshold
    # 8*4 + 2*4, the block 8*4 + 2*8*8*128 + 8 + 2*8*8 + 8 + 8 + 1
    assert scan.flops == 8 * (4096 + 256 + 64 + 8) + 40 + (32 + 16384 + 8 + 128 + 8 + 8 + 1)
    assert scan.transcendentals == 0


def test_ffd_decode_threads_the_kept_fraction_to_the_kernel():
    b, kh, g, d, p, n = 2, 2, 2, 32, 16, 8
    cache = jax.eval_shape(lambda: sd_ref.init_ffd_cache(b, n * p, kh, d, jnp.bfloat16, p))
    q = jax.ShapeDtypeStruct((b, kh * g, d), jnp.float32)
    lengths = jax.ShapeDtypeStruct((b,), S32)
    structs = _ffd_structs(b, kh, g, d, p, n, n)
    for f in (None, 0.5, 1.0):
        kw = {} if f is None else {"assumed_kept_fraction": f}
        want_f = sd_cost.DEFAULT_KEPT_FRACTION if f is None else f
        gpu = _one(functools.partial(sd_api.ffd_decode, implementation="pallas_gpu",
                                     interpret=True, **kw), q, cache, lengths)
        assert gpu == _fused_estimate(structs, want_f)
        # a page cap: the XLA selection, then the page-list kernel
        gpu = _one(functools.partial(sd_api.ffd_decode, implementation="pallas_gpu",
                                     interpret=True, max_pages=4, **kw), q, cache, lengths)
        capped = _ffd_structs(b, kh, g, d, p, n, 4)  # 4 slots in 4 splits
        assert gpu == _ffd_kernel_estimate("gpu", capped, 4, want_f)
        # TPU: the scan-and-select kernel, then the attention kernel
        tpu = pallas_estimates(functools.partial(sd_api.ffd_decode, implementation="pallas_tpu",
                                                 interpret=True, **kw), q, cache, lengths)
        assert tpu == [_scan_estimate(structs), _ffd_kernel_estimate("tpu", structs, 1, want_f)]


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
def test_ffd_count_is_affine_in_context_and_kept_pages(impl):
    b, kh, g, d, p, ns = 2, 2, 4, 32, 16, 1
    # f = 1/4 of P = 8, 16, 24 pages (M = P): 2, 4, 6 kept pages
    est = [_ffd_kernel_estimate(impl, _ffd_structs(b, kh, g, d, p, n, n), ns, 0.25)
           for n in (8, 16, 24)]
    page = sd_cost.page_bytes(*_ffd_structs(b, kh, g, d, p, 8, 8)[1:5])
    assert page == p * d * (2 + 8 + 16) // 8 + 4 * d
    # 2 more kept pages per pair; TPU: 8 more page-list slots, GPU: 2 more indices read
    step = b * kh * (2 * page + (8 * 4 if impl == "tpu" else 2 * 4))
    assert est[1].bytes_accessed - est[0].bytes_accessed == step
    assert est[2].bytes_accessed - est[1].bytes_accessed == step
    # TPU: less the tail page, attended once whatever the kept pages
    fixed = ({"flops": b * kh * sd_cost.tail_flops(g, p, d),
              "transcendentals": b * kh * sd_cost.page_transcendentals(g, p)} if impl == "tpu"
             else {"flops": 0, "transcendentals": 0})
    for x in ("flops", "transcendentals"):  # exactly proportional to the kept pages
        e0, e1, e2 = (getattr(e, x) - fixed[x] for e in est)
        assert e1 == 2 * e0 and e2 == 3 * e0
    # in f at fixed P = M = 40: the bytes change by whole kept pages
    structs = _ffd_structs(b, kh, g, d, p, 40, 40)
    fs = (0.1, 0.25, 0.5, 1.0)
    by_f = [_ffd_kernel_estimate(impl, structs, ns, f) for f in fs]
    for (f0, e0), (f1, e1) in zip(zip(fs, by_f), zip(fs[1:], by_f[1:])):
        extra = round(40 * f1) - round(40 * f0)
        assert e1.bytes_accessed - e0.bytes_accessed == b * kh * extra * (
            page + (4 if impl == "gpu" else 0))
        assert (e1.flops - fixed["flops"]) * round(40 * f0) == (
            e0.flops - fixed["flops"]) * round(40 * f1)


LLAMA = dict(num_kv_heads=8, num_heads=32, head_dim=128, page_size=128)
CTX = 131072


def test_ffd_floor_closed_form_llama_128k():
    for f in (0.1, 1.0):
        floor = sd_cost.ffd_floor_bytes(CTX, kept_fraction=f, **LLAMA)
        # per kv head: 2-bit codes 131072*128/4 = 4 MiB + scales 1024 pages*128*4 = 512 KiB;
        # kept: f * 131072 * 128 * (1 + 2) bytes; io: 32 heads x 128 x 2 bytes, in and out
        assert floor.scan == 8 * (4 * 2**20 + 2**19)
        assert floor.attend == pytest.approx(8 * f * CTX * 128 * 3, rel=1e-12)
        assert floor.tail == 0 and floor.io == 2 * 32 * 128 * 2
    dense = 8 * 2 * CTX * 128 * 2
    assert dense / sd_cost.ffd_floor_bytes(CTX, kept_fraction=1.0, **LLAMA).total == \
        pytest.approx(512 / (32 + 4 + 384), rel=1e-3)
    # an unfinished page of 100 tokens: exact bf16 keys and values
    tail = sd_cost.ffd_floor_bytes(CTX + 100, kept_fraction=0.1, **LLAMA)
    assert tail.tail == 8 * 100 * 128 * 4 and tail.scan == floor.scan


@pytest.mark.parametrize("shape", FFD_SHAPES)
def test_ffd_tpu_count_is_at_least_the_floor(shape):
    """TPU: the scan kernel reads the codes and scales of every page, the attention kernel the
    kept pages, the tail page, the queries and writes the outputs: together at least the floor
    (codes + kept pages + tail + queries and outputs)."""
    b, kh, g, d, p, n, m, ns, f, kept = shape
    structs = _ffd_structs(b, kh, g, d, p, n, m)
    scan, attend = _scan_estimate(structs), _ffd_kernel_estimate("tpu", structs, ns, f)
    # a context one token short of the capacity: P - 1 full pages and a tail of p - 1 tokens
    floor = sd_cost.ffd_floor_bytes(n * p - 1, kh, kh * g, d, p, kept * 1.0 / n, io_itemsize=4)
    assert floor.tail > 0
    assert scan.bytes_accessed >= b * floor.scan
    assert attend.bytes_accessed >= b * (floor.attend + floor.tail + floor.io)
    assert scan.bytes_accessed + attend.bytes_accessed >= b * floor.total


@pytest.mark.parametrize("shape", FFD_SHAPES)
def test_ffd_gpu_count_is_at_least_the_floor(shape):
    """GPU: the kernel attends; the page scan (codes and scales of every page) runs before it, in
    XLA. The kernel's bytes cover the floor's attend and io terms; with the scan's floor added,
    the whole floor."""
    b, kh, g, d, p, n, m, ns, f, kept = shape
    est = _ffd_kernel_estimate("gpu", _ffd_structs(b, kh, g, d, p, n, m), ns, f)
    floor = sd_cost.ffd_floor_bytes(n * p, kh, kh * g, d, p, kept * 1.0 / n, io_itemsize=4)
    assert floor.tail == 0
    assert est.bytes_accessed >= b * (floor.attend + floor.io)
    assert est.bytes_accessed + b * floor.scan >= b * floor.total


# -- QVG --------------------------------------------------------------------------------------


def _qvg_structs(b, kh, r, d, nc, cfg):
    one = jax.eval_shape(lambda: kq_ref.qvg_quantize_chunk(jnp.zeros((cfg.chunk, d)), cfg,
                                                          jax.random.key(0)))
    code = jax.tree.map(lambda s: jax.ShapeDtypeStruct((b, kh, nc) + s.shape, s.dtype), one)
    sds = jax.ShapeDtypeStruct
    return sds((b, kh, r, d), jnp.float32), code, sds((b,), S32), sds((b,), S32)


def _qvg_bytes_from_blocks(impl, q, code, rope, rows=None, ns=1):
    """Bytes summed over the blocks the kernel touches (every chunk), from zero arrays. With RoPE
    the tables are those the kernel is passed (:func:`pc.rope_tables`, and on TPU
    :func:`pc.rope_start_table`): on TPU the chunk starts' cos and sin [2, D, 128] once per
    group of 128 chunks and pair, on GPU the chunk
    start's column [3, D/2] per chunk and pair; the frequencies [D/2, 1] and offsets [3, D/2, N],
    whose block index never changes, once per call (TPU) or once per program that holds a chunk
    (GPU)."""
    fields = [np.zeros(x.shape, x.dtype) for x in code]
    b, kh, r, d = q.shape
    nc, n = code.codes.shape[2], code.codes.shape[4]
    lanes = nc if nc <= 128 else 128
    tables = jax.eval_shape(lambda: pc.rope_tables(nc, n, d, 10_000.0, pad_to=lanes))
    freq, offsets, starts = (np.zeros(t.shape, t.dtype) for t in tables)
    start_cs = jax.eval_shape(lambda: pc.rope_start_table(nc, n, d, 10_000.0, pad_to=128))
    start_cs = np.zeros(start_cs.shape, start_cs.dtype)
    assert start_cs.shape == (2, d, -(-nc // 128) * 128)
    assert offsets.shape == (3, d // 2, n) and freq.shape == (d // 2, 1)
    total = 0
    def moved(x):  # TPU: VMEM tiles, the minor dim padded to 128 lanes, the second-minor to
        # the rows a 32-bit sublane packs (4 uint8, 2 bfloat16)
        if impl == "gpu":
            return x.nbytes
        pack = 4 // x.itemsize
        pad = [(0, 0)] * (x.ndim - 2) + [(0, -x.shape[-2] % pack), (0, -x.shape[-1] % 128)]
        return np.pad(x, pad).nbytes

    for bi in range(b):
        for ki in range(kh):
            for c in range(nc):
                per_chunk = fields if impl == "gpu" else fields[:2] + fields[3:]
                total += 2 * sum(moved(x[bi, ki, c]) for x in per_chunk)  # keys and values
                if rope and impl == "gpu":
                    total += starts[:, :, c].nbytes
            if impl == "tpu" and code.assign.shape[3]:
                # assignments read chunks second-minor [S, NC, N], blocks of up to 32 chunks
                at = np.swapaxes(fields[2][bi, ki], 0, 1)
                rows = min(nc, 32)
                total += 2 * sum(moved(at[:, g0:g0 + rows]) for g0 in range(0, nc, rows))
            if impl == "tpu":
                total += np.zeros((r, d), q.dtype).nbytes + np.zeros((r, d + 1), np.float32).nbytes
                if rope:
                    for g0 in range(0, nc, 128):  # one block per group of 128 chunks
                        total += start_cs[:, :, g0:g0 + 128].nbytes
            else:
                active = -(-nc // -(-nc // ns))
                total += active * np.zeros((rows, d), q.dtype).nbytes
                total += active * (freq.nbytes + offsets.nbytes) if rope else 0
                total += ns * (np.zeros((2, rows), np.int32).nbytes
                               + np.zeros((rows, d + 2), np.float32).nbytes)
    if impl == "tpu":  # row offsets [R, 1] and the prefetched start, num_quantized
        total += np.zeros((r, 1), np.int32).nbytes + 2 * np.zeros((b,), np.int32).nbytes
        total += freq.nbytes + offsets.nbytes if rope else 0
    return total


# (B, K, G, T, D, NC, cfg, rope_base)
QVG_SHAPES = [
    (1, 2, 4, 1, 32, 3, kq_ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=128),
     10_000.0),
    (2, 1, 2, 2, 64, 5, kq_ref.QVGConfig(bits=4, stages=2, block=32, num_centroids=8, chunk=128),
     None),
    (1, 1, 1, 1, 32, 2, kq_ref.QVGConfig(bits=2, stages=0, block=32, num_centroids=4, chunk=128),
     500.0),
]


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
@pytest.mark.parametrize("case", range(len(QVG_SHAPES)))
def test_qvg_declared_estimate_is_the_analytic_count(impl, case):
    b, kh, g, t, d, nc, cfg, rope_base = QVG_SHAPES[case]
    q, code, start, nq = _qvg_structs(b, kh, g * t, d, nc, cfg)
    rope = rope_base is not None
    w = pc.piece_width(d, cfg.bits, cfg.block, rope)
    fn = kq_tpu.qvg_chunk_attention if impl == "tpu" else kq_gpu.qvg_chunk_attention
    est = _one(lambda *a: fn(*a[:3], cfg, *a[3:], t, rope_base), q, code, code, start, nq)
    n, r = cfg.chunk, g * t
    if impl == "tpu":
        assert est == kq_cost.qvg_tpu_cost(q, code, code, cfg, w=w, rope=rope)
        assert est.bytes_accessed == _qvg_bytes_from_blocks("tpu", q, code, rope)
        assert est.transcendentals == b * kh * (nc * (r * n + r) + r)
        # centroids per stage: values P onehot^T and its product with C_s, 2 R N C + 2 R C D;
        # keys with RoPE dequantized by the one-hot product C_s^T onehot, 2 N C D, keys after
        # RoPE as q C_s^T and its one-hot gather, 2 R C D + 2 R C N
        c = cfg.num_centroids
        keys = 2 * n * c * d if rope else 2 * r * c * d + 2 * r * c * n
        rows, onehot = r, cfg.stages * (2 * r * n * c + 2 * r * c * d + keys)
    else:
        rows, bn = max(16, 1 << (r - 1).bit_length()), min(n, 64)
        ns = kq_gpu.default_splits(b * kh, nc)
        qp = jax.ShapeDtypeStruct((b, kh, rows, d), q.dtype)
        assert est == kq_cost.qvg_gpu_cost(qp, code, code, cfg, w=w, rope=rope, num_splits=ns,
                                           block_n=bn)
        assert est.bytes_accessed == _qvg_bytes_from_blocks("gpu", q, code, rope, rows, ns)
        assert est.transcendentals == b * kh * nc * (n // bn) * (rows * bn + rows)
        onehot = 2 * 2 * n * cfg.num_centroids * d * cfg.stages
    # matmuls: q K^T and P V (4 R N D per chunk) plus the centroid products; the
    # in-kernel RoPE of the keys: 17 + 4 m + 6 = 27 per token and frequency at m = 1 (below 128k)
    # on GPU, 11 + 4 m + 6 = 21 on TPU (the query carries the chunk start's rotation)
    matmul = b * kh * nc * (4 * rows * n * d + onehot)
    rot = b * kh * nc * n * (d // 2) * (21 if impl == "tpu" else 27) if rope else 0
    assert matmul + rot < est.flops < 1.5 * matmul + rot + b * kh * nc * 8 * n * d * (1 + cfg.stages)


def test_qvg_tpu_count_by_hand():
    """B = K = R = NC = 1, D = 32, N = 128, INT2, block 16, S = 1, C = 4, no RoPE: W = 8."""
    cfg = kq_ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=128)
    q, code, start, nq = _qvg_structs(1, 1, 1, 32, 1, cfg)
    est = _one(lambda *a: kq_tpu.qvg_chunk_attention(*a[:3], cfg, *a[3:], 1, None),
               q, code, code, start, nq)
    # bytes: q 32*4 = 128; per tensor codes 128*8 = 1024, scales 128*2*2 = 512, assignments
    # [1, 128] uint8 moved as a [4, 128] tile, 512, centroids [4, 32] bf16 moved as [4, 128],
    # 1024 (3072, keys and values: 6144); out and lse (32+1)*4 = 132; row offset 4 and the
    # prefetched start, num_quantized 8
    assert est.bytes_accessed == 128 + 6144 + 132 + 4 + 8
    # keys read as codes: offsets 128*32 = 4096, q against the codes 2*128*32 = 8192, two
    # blocks' scales and their sum 128*3 = 384, q C^T 2*4*32 = 256, its one-hot gather
    # 2*4*128 = 1024 and add 128, 1/sqrt(D) 128: 14208; values: offsets 4096, P times the two
    # blocks' scales 256, P against the codes 8192, the blocks' column rows and sum 32*3 = 96,
    # P onehot^T 2*128*4 = 1024, times the centroids 2*4*32 = 256 and add 32: 13952; softmax
    # 3*128 = 384 and 4 per row, accumulator rescale 2*32 = 64; the query's block rows once
    # per grid step 2*32 = 64; final acc / l, m + log l: 33
    assert est.flops == 14208 + 13952 + (384 + 4 + 64) + 64 + 33
    assert est.transcendentals == 128 + 1 + 1


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
def test_qvg_count_is_affine_in_context(impl):
    cfg = kq_ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=128)
    b, kh, r, d = 2, 2, 4, 32
    est = []
    for nc in (128, 256, 384):  # 128-lane groups of chunk starts (TPU); 4 programs a pair (GPU)
        q, code, start, nq = _qvg_structs(b, kh, r, d, nc, cfg)
        if impl == "tpu":
            fn = kq_tpu.qvg_chunk_attention
        else:
            fn = functools.partial(kq_gpu.qvg_chunk_attention, num_splits=4)
        est.append(_one(lambda *a, fn=fn: fn(*a[:3], cfg, *a[3:], 1, 10_000.0),
                        q, code, code, start, nq))
    chunk = kq_cost.chunk_bytes(code) if impl == "gpu" else kq_cost.tpu_chunk_bytes(code)
    # per chunk: codes 128*8 + scales 128*2*2 + assignments 128 + centroids 4*32*2 = 1920 bytes
    # (TPU tiles: centroids [4, 128] 1024, the assignments 128, in blocks [1, 32, 128] of 32
    # chunks: 3072), keys and values, plus the chunk start's RoPE cos, sin, angle 3 * 16 * 4 (a
    # column per chunk; on TPU its cos and sin over the head dim, 2 * 32 * 4, in blocks of 128)
    tpu = impl == "tpu"
    if tpu:
        assert kq_cost.tpu_assign_bytes(code) == (nc // 32) * 32 * 128  # 128 a chunk
        chunk += 128
    assert chunk == 128 * 8 + 128 * 2 * 2 + 128 + (1024 if tpu else 4 * 32 * 2)
    step = b * kh * 128 * (2 * chunk + (2 * 32 * 4 if tpu else 3 * 16 * 4))
    for field in ("bytes_accessed", "flops", "transcendentals"):
        d1 = getattr(est[1], field) - getattr(est[0], field)
        d2 = getattr(est[2], field) - getattr(est[1], field)
        assert d1 == d2 > 0
    assert est[1].bytes_accessed - est[0].bytes_accessed == step


QVG_PAPER = kq_ref.qvg_preset("qvg", bits=2, block=64, num_centroids=16, chunk=256)


def test_qvg_floor_closed_form_llama_128k():
    floor = kq_cost.qvg_floor_bytes(CTX, 8, 32, 128, QVG_PAPER)
    # per kv head, keys and values: codes 2*131072*32, scales 2*131072*2 blocks*2 bytes,
    # assignments 2*131072, centroids 2 x 512 chunks x 16 x 128 x 2 bytes; no window at 128k
    assert floor.codes == 8 * 2 * CTX * 32
    assert floor.scales == 8 * 2 * CTX * 4
    assert floor.assign == 8 * 2 * CTX
    assert floor.centroids == 8 * 2 * 512 * 16 * 128 * 2
    assert floor.window == 0 and floor.io == 2 * 32 * 128 * 2
    per_token = (floor.total - floor.io) / (8 * CTX)
    assert per_token == 2 * (32 + 4 + 1 + 16)  # bytes per token per kv head (dense bf16: 512)
    w = kq_cost.qvg_floor_bytes(CTX + 100, 8, 32, 128, QVG_PAPER)
    assert w.window == 8 * 2 * 100 * 128 * 2 and w.codes == floor.codes


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
@pytest.mark.parametrize("case", range(len(QVG_SHAPES)))
def test_qvg_count_is_at_least_the_floor(impl, case):
    b, kh, g, t, d, nc, cfg, rope_base = QVG_SHAPES[case]
    q, code, start, nq = _qvg_structs(b, kh, g * t, d, nc, cfg)
    fn = kq_tpu.qvg_chunk_attention if impl == "tpu" else kq_gpu.qvg_chunk_attention
    est = _one(lambda *a: fn(*a[:3], cfg, *a[3:], t, rope_base), q, code, code, start, nq)
    floor = kq_cost.qvg_floor_bytes(nc * cfg.chunk, kh, kh * g, d, cfg, num_new=t,
                                    io_itemsize=4)
    assert floor.window == 0
    assert est.bytes_accessed >= b * floor.total


# -- bad kept fractions -----------------------------------------------------------------------


@pytest.mark.parametrize("f", [0, 0.0, -0.1, 1.5, math.nan, math.inf, True, "0.5", None])
def test_bad_kept_fraction_is_refused(f):
    with pytest.raises(ValueError, match="assumed_kept_fraction"):
        sd_cost.check_kept_fraction(f, "test")
    with pytest.raises(ValueError, match=r"ffd_floor_bytes: .*got " + re.escape(repr(f))):
        sd_cost.ffd_floor_bytes(CTX, kept_fraction=f, **LLAMA)
    structs = _ffd_structs(1, 1, 2, 32, 16, 4, 4)
    for kernel, args in ((functools.partial(sd_tpu.ffd_pages_attention), _tpu_args(structs)),
                         (functools.partial(sd_gpu.ffd_pages_attention, num_splits=1), structs)):
        with pytest.raises(ValueError, match="assumed_kept_fraction"):
            jax.make_jaxpr(functools.partial(kernel, assumed_kept_fraction=f))(*args)


@pytest.mark.parametrize("f", [0, -0.1, 1.5, math.nan])
def test_ffd_decode_refuses_a_bad_kept_fraction(f):
    cache = sd_ref.init_ffd_cache(1, 64, 1, 32, jnp.float32, 16)
    q = jnp.ones((1, 2, 32))
    for impl in ("xla", "pallas_tpu"):
        with pytest.raises(ValueError, match=r"ffd_decode: assumed_kept_fraction .*got "
                           + re.escape(repr(f))):
            sd_api.ffd_decode(q, cache, jnp.array([20]), implementation=impl, interpret=True,
                              assumed_kept_fraction=f)
