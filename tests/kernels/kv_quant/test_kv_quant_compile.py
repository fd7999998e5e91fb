"""The QVG Pallas kernels compiled (not only lowered) for TPU v5e / v6e and H100 / H200 on
compile-only devices (core.aot). Runs in .venv-aot: ``make test-aot``.

Lowering (``jax.export``) and interpret mode accepted the GPU kernel while XLA:GPU rejected it at
every length ("Shared memory size limit exceeded: requested 1847296, available: 232448" at
N = 1024, C = 256, D = 128): only a compile shows that.
"""

import jax
import jax.numpy as jnp
import pytest

from core import aot
from kernels.kv_quant import pallas_gpu, pallas_tpu
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import QVGConfig
from tests.kernels import compiled_steps

pytestmark = pytest.mark.aot

H100_SHARED_MEMORY = 232448  # shared_memory_per_block_optin in core/aot_targets/h100_sxm.txtpb


def _specs(cfg: QVGConfig, b: int, kh: int, nc: int, d: int, rows: int):
    """ShapeDtypeStructs of (q, k_code, v_code, start, num_quantized)."""
    n, s = cfg.chunk, cfg.stages
    S = jax.ShapeDtypeStruct
    code = ref.QVGCode(S((b, kh, nc, d * cfg.bits // 8, n), jnp.uint8),  # tokens minor
                       S((b, kh, nc, d // cfg.block, n), ref.SCALE_DTYPE),
                       S((b, kh, nc, s, n), jnp.uint8),
                       S((b, kh, nc, s, cfg.num_centroids, d), ref.CENTROID_DTYPE))
    return (S((b, kh, rows, d), jnp.float32), code, code, S((b,), jnp.int32), S((b,), jnp.int32))


def _compile(kernel, cfg, target, rope_base, num_new=2, nc=2, d=128, rows=8, **kw):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env installs them)")
    fn = lambda q, k, v, s, m: kernel(q, k, v, cfg, s, m, num_new, rope_base)  # noqa: E731
    return aot.compile_for(fn, _specs(cfg, 1, 2, nc, d, rows), target, **kw)


# A small shape of each code path: INT2 with one k-means stage and RoPE'd keys; INT4 plain.
# Chunks of 128 tokens (the TPU lanes); NC = 2 chunks, both in one TPU grid step.
SMALL = [(QVGConfig(bits=2, stages=1, block=64, num_centroids=16, chunk=128), 10_000.0),
         (QVGConfig(bits=4, stages=0, block=32, chunk=128), None)]


@pytest.mark.parametrize("target", ["tpu-v5e", "tpu-v6e"])
@pytest.mark.parametrize("case", range(len(SMALL)))
def test_tpu_kernel_compiles(target, case):
    cfg, rope = SMALL[case]
    res = _compile(pallas_tpu.qvg_chunk_attention, cfg, target, rope)
    assert res.memory["generated_code"] > 0
    assert res.memory["output"] >= 1 * 2 * 8 * 128 * 4  # at least the f32 output


@pytest.mark.parametrize("target", ["h100", "h200"])
@pytest.mark.parametrize("case", range(len(SMALL)))
def test_gpu_kernel_compiles(target, case):
    cfg, rope = SMALL[case]
    res = _compile(pallas_gpu.qvg_chunk_attention, cfg, target, rope, shared_memory=True)
    smem = res.shared_memory["qvg_chunk_attention"]
    assert 0 < smem <= H100_SHARED_MEMORY


def test_gpu_kernel_compiles_at_the_paper_chunk():
    """QVG's chunk of 1024 tokens, 256 centroids, D = 128: the case that did not compile."""
    cfg = QVGConfig(bits=2, stages=1, block=64, num_centroids=256, chunk=1024)
    res = _compile(pallas_gpu.qvg_chunk_attention, cfg, "h100", 10_000.0, nc=1,
                   shared_memory=True)
    smem = res.shared_memory["qvg_chunk_attention"]
    assert 0 < smem <= H100_SHARED_MEMORY


@pytest.mark.parametrize("d", [64, 256])
def test_tpu_kernel_compiles_at_other_head_dims(d):
    """Head dims 64 and 256 (pieces of W = 16 and 64 rows), keys rotated in the kernel."""
    cfg = QVGConfig(bits=2, stages=1, block=min(64, d), num_centroids=16, chunk=256)
    res = _compile(pallas_tpu.qvg_chunk_attention, cfg, "tpu-v5e", 10_000.0, d=d, nc=4)
    assert res.memory["generated_code"] > 0


def test_gpu_kernel_compiles_with_many_splits():
    """512 chunks (128k slots of N = 256): the default split-K gives every (row, kv head) pair
    enough programs for >= 264 in all (two per SM of an H100's 132), and the kernel compiles."""
    for pairs, splits in ((1, 512), (2, 171), (8, 35), (16, 18)):
        assert pallas_gpu.default_splits(pairs, 512) == splits and pairs * splits >= 264
    cfg = QVGConfig(bits=2, stages=1, block=64, num_centroids=16, chunk=256)
    res = _compile(pallas_gpu.qvg_chunk_attention, cfg, "h100", 500_000.0, nc=512, rows=4,
                   num_new=1, shared_memory=True)
    assert 0 < res.shared_memory["qvg_chunk_attention"] <= H100_SHARED_MEMORY


def test_gpu_decode_step_reads_little_outside_the_kernel():
    """One layer's decode step of the QVG cache (the one-token update into the window, then
    attention: the Triton kernel over the quantized chunks, XLA over the window, the merge), the
    cache donated, compiled for an H100 at Llama-3-8B's per-GPU shape (one kv head of 4 query
    heads, D 128) over 128k slots with the paper config (2-bit, block 64, 16 centroids, chunk
    256): the instructions around the kernel read at most 10% of dense bf16 attention's 67.1 MB
    (``core.aot.bytes_read_outside_custom_calls``; XLA:GPU gives no cost analysis)."""
    from kernels.kv_quant.cache import QVGCache

    slots, d = 131072, 128
    cfg = ref.qvg_preset("qvg", bits=2, block=64, num_centroids=16, chunk=256)
    backend = QVGCache(config=cfg, rope_base=500000.0, implementation="pallas_gpu")
    text, cache = compiled_steps.decode_step_hlo(backend, "h100", batch=1, slots=slots,
                                                 kv_heads=1, group=4, head_dim=d)
    outside, kernel = aot.bytes_read_outside_custom_calls(text)
    dense = 2 * slots * d * 2
    assert outside <= 0.1 * dense, f"{outside / 1e6:.2f} MB outside the kernel"
    stores = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((cache["k"], cache["v"])))
    assert kernel >= stores  # the kernel is handed both chunk stores
