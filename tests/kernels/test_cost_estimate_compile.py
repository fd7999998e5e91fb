"""The FFD (scan and attention) and QVG TPU kernels compiled for a TPU v5e on a compile-only device: the compiled
program's ``cost_analysis()`` carries each kernel's declared ``pl.CostEstimate``. Each program is
compiled twice, as is and with the estimate withheld from ``pallas_call``: the difference is
exactly the estimate (without one XLA charges the kernel 0 bytes and 0 FLOPs; what is left is the
XLA code around it, operand copies and the RoPE tables). Small shapes; runs in .venv-aot (``make
test-aot``, marker ``aot``). XLA's GPU compiler returns no cost analysis, so only TPU is checked."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from core import aot
from kernels.kv_quant import cost as kq_cost
from kernels.kv_quant import pallas_common as pc
from kernels.kv_quant import pallas_tpu as kq_tpu
from kernels.kv_quant import reference as kq_ref
from kernels.sparse_decode import cost as sd_cost
from kernels.sparse_decode import pallas_tpu as sd_tpu
from kernels.sparse_decode import reference as sd_ref

pytestmark = pytest.mark.aot

TARGET = "tpu-v5e"
B, K, G, D = 1, 2, 4, 128
S = jax.ShapeDtypeStruct
FIELDS = {"flops": "flops", "transcendentals": "transcendentals",
          "bytes_accessed": "bytes accessed"}


def _analysis(fn, args) -> dict:
    # a fresh function object per compile: a fresh trace, not a cached jaxpr
    ca = aot.compile_for(jax.jit(lambda *a: fn(*a)), args, TARGET).compiled.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return {k: float(ca.get(v, 0.0)) for k, v in FIELDS.items()}


def _with_and_without(monkeypatch, fn, args):
    """cost_analysis() of ``fn`` compiled as is, then with ``cost_estimate`` dropped."""
    if not aot.extras_available(TARGET):
        pytest.skip(f"compile extras for {TARGET} are not installed here (make aot-env)")
    declared = _analysis(fn, args)
    plain = pl.pallas_call

    def no_estimate(*a, **kw):
        kw.pop("cost_estimate", None)
        return plain(*a, **kw)

    monkeypatch.setattr(pl, "pallas_call", no_estimate)
    return declared, _analysis(fn, args)


def _assert_carries(declared: dict, withheld: dict, estimate: pl.CostEstimate):
    for field in FIELDS:
        want = getattr(estimate, field)
        assert want > 0
        assert declared[field] >= want
        assert declared[field] - withheld[field] == pytest.approx(want, rel=1e-9, abs=0.5)


def test_ffd_tpu_kernel_costs_reach_the_compiled_program(monkeypatch):
    p, n, f = 128, 8, 0.5
    cache = jax.eval_shape(lambda: sd_ref.init_ffd_cache(B, n * p, K, D, jnp.bfloat16, p))
    qg, lengths = S((B, K, G, D), jnp.float32), S((B,), jnp.int32)
    args = (qg, cache["codes"], cache["scale"], cache["resid"], cache["v"], cache["tail"],
            S((B, K, n), jnp.int32), S((B, K), jnp.int32), lengths)
    # the undecorated functions (the jitted ones would reuse their cached jaxprs)
    fn = functools.partial(sd_tpu.ffd_pages_attention.__wrapped__, assumed_kept_fraction=f)
    declared, withheld = _with_and_without(monkeypatch, fn, args)
    estimate = sd_cost.ffd_tpu_attend_cost(*args[:7], kept_fraction=f)
    assert withheld["flops"] == withheld["transcendentals"] == 0  # the kernel was free to XLA
    _assert_carries(declared, withheld, estimate)

    monkeypatch.undo()
    scan = functools.partial(sd_tpu.ffd_scan_select.__wrapped__, delta=3.0)
    scan_args = (qg, cache["codes"], cache["scale"], lengths)
    declared, withheld = _with_and_without(monkeypatch, scan, scan_args)
    pb = sd_tpu.scan_block(n)
    estimate = sd_cost.ffd_tpu_scan_cost(qg, cache["codes"], cache["scale"], num_slots=n,
                                         pages_per_step=pb, sub=sd_tpu.sub_block(pb))
    for field in ("flops", "bytes_accessed"):  # no exp in the scan
        want = getattr(estimate, field)
        assert want > 0 and declared[field] >= want
        assert declared[field] - withheld[field] == pytest.approx(want, rel=1e-9, abs=0.5)


def test_qvg_tpu_kernel_cost_reaches_the_compiled_program(monkeypatch):
    cfg = kq_ref.qvg_preset("qvg", bits=2, block=64, num_centroids=16, chunk=256)
    nc = 4
    one = jax.eval_shape(lambda: kq_ref.qvg_quantize_chunk(jnp.zeros((cfg.chunk, D)), cfg,
                                                          jax.random.key(0)))
    code = jax.tree.map(lambda s: S((B, K, nc) + s.shape, s.dtype), one)
    q = S((B, K, G, D), jnp.float32)
    rows = S((B,), jnp.int32)

    def fn(q, kc, vc, start, nq):
        return kq_tpu.qvg_chunk_attention.__wrapped__(q, kc, vc, cfg, start, nq, 1, 10_000.0)

    declared, withheld = _with_and_without(monkeypatch, fn, (q, code, code, rows, rows))
    w = pc.piece_width(D, cfg.bits, cfg.block, True)
    estimate = kq_cost.qvg_tpu_cost(q, code, code, cfg, w=w, rope=True)
    _assert_carries(declared, withheld, estimate)
