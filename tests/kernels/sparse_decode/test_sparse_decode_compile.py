"""FFD decode (Pallas TPU and GPU kernels, through the public ``ffd_decode``) compiled for TPU
v5e / v6e and H100 / H200 on compile-only devices (core.aot).

Runs in .venv-aot (``make test-aot``, marker ``aot``). Compiling runs Mosaic's tiling rules and
Triton/ptxas, which lowering alone does not: the head dims cover the power-of-two chunking of the GPU
kernel (96 = 64 + 32) and the lane slices of the TPU kernel.
"""

import math
import re

import jax
import jax.numpy as jnp
import pytest

from core import aot
from kernels.sparse_decode import api
from kernels.sparse_decode import reference as ref
from tests.kernels import compiled_steps

pytestmark = pytest.mark.aot


def _args(d, b=2, kh=2, g=4, p=16, n=4):
    cache = jax.eval_shape(lambda: ref.init_ffd_cache(b, n * p, kh, d, jnp.bfloat16, p))
    return (jax.ShapeDtypeStruct((b, kh * g, d), jnp.bfloat16), cache,
            jax.ShapeDtypeStruct((b,), jnp.int32))


# every target at D = 128; the other head dims (GPU: 96 = 64 + 32 chunks) on one TPU and one GPU
CASES = ([(t, i, 128) for t, i in (("tpu-v5e", "pallas_tpu"), ("tpu-v6e", "pallas_tpu"),
                                   ("h100", "pallas_gpu"), ("h200", "pallas_gpu"))]
         + [(t, i, d) for t, i in (("tpu-v5e", "pallas_tpu"), ("h100", "pallas_gpu"))
            for d in (64, 96, 256)])


@pytest.mark.parametrize("target,impl,d", CASES)
def test_ffd_decode_compiles(target, impl, d):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env)")
    f = jax.jit(lambda q, c, l: api.ffd_decode(q, c, l, delta=3.0, max_pages=3,
                                               implementation=impl))
    res = aot.compile_for(f, _args(d), target)
    assert res.memory["output"] >= 2 * 8 * d * 2  # [B, H, D] bf16 (TPU pads to its tiles)


_HLO_DTYPES = {"s32": jnp.int32, "f32": jnp.float32, "bf16": jnp.bfloat16, "f8e4m3fn": ref.F8}
_RELAYOUT = re.compile(r"= (\w+)\[([\d,]*)\]\S* (copy|transpose)\(")


def relayouts(hlo_text: str) -> list[tuple[str, int, str]]:
    """(dtype, element count, line) of every synchronous ``copy`` and ``transpose`` instruction in
    compiled HLO text: the instructions that re-lay out an array. (Asynchronous ``copy-start``
    moves an array between memory spaces, e.g. into VMEM when it fits, without a new layout.)"""
    found = []
    for line in hlo_text.splitlines():
        m = _RELAYOUT.search(line)
        if m and m.group(1) in _HLO_DTYPES:
            dims = [int(x) for x in m.group(2).split(",") if x]
            found.append((m.group(1), math.prod(dims), line.strip()))
    return found


def test_tpu_decode_step_copies_no_cache_array():
    """One decode step (cache update of one token, then the Pallas decode), the cache donated,
    compiled for a TPU v5e: no instruction of the compiled program copies or transposes an array
    of the size and dtype of a cache field (the codes are written in place in their stored
    token-minor layout, the scales by a window update, and the kernels read the cache where it
    lies)."""
    from kernels.sparse_decode.cache import FFDCache

    backend = FFDCache(page_size=128, delta=3.0, implementation="pallas_tpu", scan_copy=False)
    text, cache = compiled_steps.decode_step_hlo(backend, "tpu-v5e", batch=1, slots=8 * 128,
                                                 kv_heads=2, group=4, head_dim=128)
    fields = {(jnp.dtype(x.dtype), x.size) for x in jax.tree.leaves(cache)}
    assert len(fields) == 5  # codes, scale, resid, tail, v: no two alike
    found = relayouts(text)
    assert found  # the parser reads the instructions (the update copies its small page window)
    bad = [line for dt, count, line in found if (jnp.dtype(_HLO_DTYPES[dt]), count) in fields]
    assert bad == [], "\n".join(bad)
    assert "ffd_scan_select" in text and "ffd_pages_attention" in text


def test_gpu_decode_step_reads_little_outside_the_kernel():
    """One layer's decode step (update of one token, then the split-K Triton kernel), the cache
    donated, compiled for an H100 at Llama-3-8B's per-GPU shape (one kv head of 4 query heads,
    D 128) over 128k slots: the instructions around the kernel read at most 10% of dense bf16
    attention's 67.1 MB (XLA:GPU has no cost analysis, so the bytes are counted from the compiled
    program's operand shapes, ``core.aot.bytes_read_outside_custom_calls``)."""
    from kernels.sparse_decode.cache import FFDCache

    slots, d = 131072, 128
    backend = FFDCache(page_size=128, delta=6.0, implementation="pallas_gpu", scan_copy=False)
    text, cache = compiled_steps.decode_step_hlo(backend, "h100", batch=1, slots=slots,
                                                 kv_heads=1, group=4, head_dim=d)
    outside, kernel = aot.bytes_read_outside_custom_calls(text)
    dense = 2 * slots * d * 2
    assert outside <= 0.1 * dense, f"{outside / 1e6:.2f} MB outside the kernel"
    # the kernel is handed the whole cache (it reads the kept pages of it): codes, scales,
    # residuals and values
    assert kernel >= sum(x.size * x.dtype.itemsize for k, x in cache.items() if k != "tail")
