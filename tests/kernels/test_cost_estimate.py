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
    sds = jax.ShapeDtypeStruct
    cache = jax.eval_shape(lambda: sd_ref.init_ffd_cache(b, n * p, kh, d, jnp.bfloat16, p))
    return (sds((b, kh, g, d), jnp.float32), cache["codes"], cache["scale"], cache["resid"],
            cache["v"], sds((b, kh, m), S32), sds((b, kh), S32))


def _ffd_kernel_estimate(impl, structs, ns, f):
    mod = sd_tpu if impl == "tpu" else sd_gpu
    return _one(functools.partial(mod.ffd_pages_attention, num_splits=ns,
                                  assumed_kept_fraction=f), *structs)


def _ffd_bytes_from_blocks(impl, structs, ns, kept):
    """Bytes summed over the blocks the kernel touches, sliced out of zero arrays of the operands'
    shapes and dtypes (an independent route to the same count)."""
    qg, codes, scale, resid, v, idx, count = (np.zeros(s.shape, s.dtype) for s in structs)
    b, kh, g, d = qg.shape
    rows = g if impl == "tpu" else sd_gpu.ROWS
    partial = np.zeros((rows, d + 2), np.float32).nbytes  # acc [R, D], m and l [R]
    total = idx.nbytes + count.nbytes if impl == "tpu" else 0  # scalar prefetch, once
    for bi in range(b):
        for ki in range(kh):
            pages = sum(x[bi, ki, :kept].nbytes for x in (codes, scale, resid, v))
            if impl == "tpu":
                total += qg[bi, ki].nbytes + pages + ns * partial
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


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
@pytest.mark.parametrize("shape", FFD_SHAPES)
def test_ffd_declared_estimate_is_the_analytic_count(impl, shape):
    b, kh, g, d, p, n, m, ns, f, kept = shape
    structs = _ffd_structs(b, kh, g, d, p, n, m)
    est = _ffd_kernel_estimate(impl, structs, ns, f)
    assert isinstance(est, pl.CostEstimate)
    assert sd_cost.kept_pages(n, m, f) == kept
    if impl == "tpu":
        want = sd_cost.ffd_tpu_cost(*structs[:6], num_splits=ns, kept_fraction=f)
        rows, parts = g, 1
    else:
        qp = jax.ShapeDtypeStruct((b, kh, sd_gpu.ROWS, d), jnp.float32)
        parts = len(sd_gpu.pow2_parts(d // 16))
        want = sd_cost.ffd_gpu_cost(qp, *structs[1:6], num_splits=ns, parts=parts, kept_fraction=f)
        rows = sd_gpu.ROWS
    assert est == want
    assert est.bytes_accessed == _ffd_bytes_from_blocks(impl, structs, ns, kept)
    pairs = b * kh
    assert est.transcendentals == pairs * kept * (rows * p + rows)
    # the matmuls alone (refined logits from codes and residual, then P V) are 6 R p D per page
    matmul = pairs * kept * 6 * rows * p * d
    assert matmul < est.flops < 1.2 * matmul


def test_ffd_tpu_count_by_hand():
    """B = K = 1, G = 4, D = 32, p = 16, P = M = 8, NS = 1, f = 1/4: 2 pages."""
    structs = _ffd_structs(1, 1, 4, 32, 16, 8, 8)
    est = _ffd_kernel_estimate("tpu", structs, 1, 0.25)
    # bytes: q 4*32*4 = 512; per page codes 16*2*4 = 128, scale 32*4 = 128, resid 16*32 = 512,
    # v 16*32*2 = 1024 (1792, twice: 3584); partials 4*(32+2)*4 = 544; page list (8+1)*4 = 36
    assert est.bytes_accessed == 512 + 3584 + 544 + 36
    # flops per page: 6*4*16*32 = 12288 (matmuls) + 5*4*32 = 640 + 20*4*16 = 1280 + 5*4 = 20
    assert est.flops == 2 * (12288 + 640 + 1280 + 20)
    assert est.transcendentals == 2 * (4 * 16 + 4)


def test_ffd_decode_threads_the_kept_fraction_to_the_kernel():
    b, kh, g, d, p, n = 2, 2, 2, 32, 16, 8
    cache = jax.eval_shape(lambda: sd_ref.init_ffd_cache(b, n * p, kh, d, jnp.float32, p))
    q = jax.ShapeDtypeStruct((b, kh * g, d), jnp.float32)
    lengths = jax.ShapeDtypeStruct((b,), S32)
    structs = _ffd_structs(b, kh, g, d, p, n, n)
    for f in (None, 0.5, 1.0):
        kw = {} if f is None else {"assumed_kept_fraction": f}
        for impl in ("pallas_tpu", "pallas_gpu"):
            est = _one(functools.partial(sd_api.ffd_decode, implementation=impl, interpret=True,
                                         **kw), q, cache, lengths)
            ns = 1 if impl == "pallas_tpu" else 8
            want = _ffd_kernel_estimate(impl[-3:], structs, ns,
                                        sd_cost.DEFAULT_KEPT_FRACTION if f is None else f)
            assert est == want


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
    for x in ("flops", "transcendentals"):  # exactly proportional to the kept pages
        assert getattr(est[1], x) == 2 * getattr(est[0], x)
        assert getattr(est[2], x) == 3 * getattr(est[0], x)
    # in f at fixed P = M = 40: the bytes change by whole kept pages
    structs = _ffd_structs(b, kh, g, d, p, 40, 40)
    fs = (0.1, 0.25, 0.5, 1.0)
    by_f = [_ffd_kernel_estimate(impl, structs, ns, f) for f in fs]
    for (f0, e0), (f1, e1) in zip(zip(fs, by_f), zip(fs[1:], by_f[1:])):
        extra = round(40 * f1) - round(40 * f0)
        assert e1.bytes_accessed - e0.bytes_accessed == b * kh * extra * (
            page + (4 if impl == "gpu" else 0))
        assert e1.flops * round(40 * f0) == e0.flops * round(40 * f1)


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


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
@pytest.mark.parametrize("shape", FFD_SHAPES)
def test_ffd_count_is_at_least_the_floor(impl, shape):
    """The kernel attends; the page scan (codes and scales of every page) runs before it, in XLA.
    The kernel's bytes cover the floor's attend and io terms; with the scan's floor added, the
    whole floor."""
    b, kh, g, d, p, n, m, ns, f, kept = shape
    est = _ffd_kernel_estimate(impl, _ffd_structs(b, kh, g, d, p, n, m), ns, f)
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
    the tables are those the kernel is passed (:func:`pc.rope_tables`): the chunk start's block
    [3, D/2] per chunk and pair; the frequencies [1, D/2] and offsets [3, N, D/2], whose block
    index never changes, once per call (TPU) or once per program that holds a chunk (GPU)."""
    fields = [np.zeros(x.shape, x.dtype) for x in code]
    b, kh, r, d = q.shape
    nc, n = code.codes.shape[2], code.codes.shape[3]
    tables = jax.eval_shape(lambda: pc.rope_tables(nc, n, d, 10_000.0))
    freq, offsets, starts = (np.zeros(t.shape, t.dtype) for t in tables)
    assert starts.shape == (nc, 3, d // 2) and offsets.shape == (3, n, d // 2)
    total = 0
    for bi in range(b):
        for ki in range(kh):
            for c in range(nc):
                total += 2 * sum(x[bi, ki, c].nbytes for x in fields)  # keys and values
                total += starts[c].nbytes if rope else 0
            if impl == "tpu":
                total += np.zeros((r, d), q.dtype).nbytes + np.zeros((r, d + 1), np.float32).nbytes
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
    (1, 2, 4, 1, 32, 3, kq_ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=16),
     10_000.0),
    (2, 1, 2, 2, 64, 5, kq_ref.QVGConfig(bits=4, stages=2, block=32, num_centroids=8, chunk=32),
     None),
    (1, 1, 1, 1, 32, 2, kq_ref.QVGConfig(bits=2, stages=0, block=32, num_centroids=4, chunk=16),
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
        rows, onehot = r, 2 * 2 * n * cfg.num_centroids * d * cfg.stages
    else:
        rows, ns, bn = max(16, 1 << (r - 1).bit_length()), min(nc, 4), min(n, 64)
        qp = jax.ShapeDtypeStruct((b, kh, rows, d), q.dtype)
        assert est == kq_cost.qvg_gpu_cost(qp, code, code, cfg, w=w, rope=rope, num_splits=ns,
                                           block_n=bn)
        assert est.bytes_accessed == _qvg_bytes_from_blocks("gpu", q, code, rope, rows, ns)
        assert est.transcendentals == b * kh * nc * (n // bn) * (rows * bn + rows)
        onehot = 0
    # matmuls: q K^T and P V (4 R N D per chunk) plus the TPU's one-hot centroid gathers; the
    # in-kernel RoPE of the keys: 17 + 4 m + 6 = 27 per token and frequency at m = 1 (below 128k)
    matmul = b * kh * nc * (4 * rows * n * d + onehot)
    rot = b * kh * nc * n * (d // 2) * 27 if rope else 0
    assert matmul + rot < est.flops < 1.5 * matmul + rot + b * kh * nc * 8 * n * d * (1 + cfg.stages)


def test_qvg_tpu_count_by_hand():
    """B = K = R = NC = 1, D = 32, N = 16, INT2, block 16, S = 1, C = 4, no RoPE: W = 8."""
    cfg = kq_ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=16)
    q, code, start, nq = _qvg_structs(1, 1, 1, 32, 1, cfg)
    est = _one(lambda *a: kq_tpu.qvg_chunk_attention(*a[:3], cfg, *a[3:], 1, None),
               q, code, code, start, nq)
    # bytes: q 32*4 = 128; per tensor codes 16*8 = 128, scales 16*2*2 = 64, assignments 16,
    # centroids 4*32*2 = 256 (464, keys and values: 928); out and lse (32+1)*4 = 132; row offset 4
    # and the prefetched start, num_quantized 8
    assert est.bytes_accessed == 128 + 928 + 132 + 4 + 8
    # dequantize, per tensor: 2*16*32 = 1024 + centroid add 16*32 = 512 + one-hot matmul
    # 2*16*4*32 = 4096; attend: matmuls 4*16*32 = 2048, logit piece adds and 1/sqrt(D) 16*4 = 64,
    # softmax 3*16 = 48 and 4 per row, accumulator rescale 2*32 = 64; final acc / l, m + log l: 33
    assert est.flops == 2 * (1024 + 512 + 4096) + (2048 + 64 + 48 + 4 + 64) + 33
    assert est.transcendentals == 16 + 1 + 1


@pytest.mark.parametrize("impl", ["tpu", "gpu"])
def test_qvg_count_is_affine_in_context(impl):
    cfg = kq_ref.QVGConfig(bits=2, stages=1, block=16, num_centroids=4, chunk=16)
    b, kh, r, d = 2, 2, 4, 32
    est = []
    for nc in (4, 8, 12):  # the GPU kernel runs 4 programs per pair at each
        q, code, start, nq = _qvg_structs(b, kh, r, d, nc, cfg)
        fn = kq_tpu.qvg_chunk_attention if impl == "tpu" else kq_gpu.qvg_chunk_attention
        est.append(_one(lambda *a, fn=fn: fn(*a[:3], cfg, *a[3:], 1, 10_000.0),
                        q, code, code, start, nq))
    chunk = kq_cost.chunk_bytes(code)
    # per chunk: codes 16*8 + scales 16*2*2 + assignments 16 + centroids 4*32*2 = 464 bytes, keys
    # and values, plus the chunk start's RoPE block (cos, sin, angle) 3 * 16 * 4
    assert chunk == 16 * 8 + 16 * 2 * 2 + 16 + 4 * 32 * 2
    step = b * kh * 4 * (2 * chunk + 3 * 16 * 4)
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
    for mod in (sd_tpu, sd_gpu):
        with pytest.raises(ValueError, match="assumed_kept_fraction"):
            jax.make_jaxpr(functools.partial(mod.ffd_pages_attention, num_splits=1,
                                             assumed_kept_fraction=f))(*structs)


@pytest.mark.parametrize("f", [0, -0.1, 1.5, math.nan])
def test_ffd_decode_refuses_a_bad_kept_fraction(f):
    cache = sd_ref.init_ffd_cache(1, 64, 1, 32, jnp.float32, 16)
    q = jnp.ones((1, 2, 32))
    for impl in ("xla", "pallas_tpu"):
        with pytest.raises(ValueError, match=r"ffd_decode: assumed_kept_fraction .*got "
                           + re.escape(repr(f))):
            sd_api.ffd_decode(q, cache, jnp.array([20]), implementation=impl, interpret=True,
                              assumed_kept_fraction=f)
