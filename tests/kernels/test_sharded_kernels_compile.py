"""FFD and QVG decode attention inside ``shard_map`` (``kernels/*/sharded.py``) compiled for a
4-chip TPU v5e slice and 4 H100s on compile-only devices: the Pallas kernel runs per device on
its block (rows over ``data``, kv heads over ``model``), which is what the pod decode steps in
AOT.md use. Small shapes; runs in .venv-aot (``make test-aot``, marker ``aot``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from core import aot
from kernels.kv_quant import reference as kq_ref
from kernels.kv_quant import sharded as kq_sharded
from kernels.sparse_decode import reference as sd_ref
from kernels.sparse_decode import sharded as sd_sharded

pytestmark = pytest.mark.aot

TARGETS = [("tpu-v5e", "v5e:2x2", "pallas_tpu"), ("h100", "1x1x4", "pallas_gpu")]
B, K, G, D = 4, 2, 4, 128


def _mesh(target, topology):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env)")
    devices = aot.topology_description(target, topology).devices
    return Mesh(np.asarray(devices).reshape(2, 2), ("data", "model"))


def _place(tree, mesh, spec):
    sharding = NamedSharding(mesh, spec)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


@pytest.mark.parametrize("target,topology,impl", TARGETS)
def test_ffd_decode_in_shard_map_compiles_per_device(target, topology, impl):
    mesh = _mesh(target, topology)
    p, n = 128, 8
    rows = PartitionSpec("data", "model")
    cache = _place(jax.eval_shape(lambda: sd_ref.init_ffd_cache(B, n * p, K, D, jnp.bfloat16, p)),
                   mesh, rows)
    q = _place(jax.ShapeDtypeStruct((B, K * G, D), jnp.bfloat16), mesh, rows)
    lengths = _place(jax.ShapeDtypeStruct((B,), jnp.int32), mesh, PartitionSpec("data"))
    f = jax.jit(lambda q, c, l: sd_sharded.ffd_decode_sharded(q, c, l, mesh, delta=6.0,
                                                               implementation=impl))
    compiled = f.lower(q, cache, lengths).compile()
    out = compiled.output_shardings
    assert out.spec == rows  # rows and heads stay where they were: no gather around the kernel
    # per device: its [B/2, H/2, D] block of the bf16 output (TPU may pad it to its tiles)
    assert compiled.memory_analysis().output_size_in_bytes >= (B // 2) * (K * G // 2) * D * 2


@pytest.mark.parametrize("target,topology,impl", TARGETS)
def test_qvg_chunk_attention_in_shard_map_compiles_per_device(target, topology, impl):
    mesh = _mesh(target, topology)
    cfg = kq_ref.qvg_preset("qvg", bits=2, block=64, num_centroids=4, chunk=128)  # TPU: chunk = lanes
    nc, rows = 4, PartitionSpec("data", "model")
    one = jax.eval_shape(lambda: kq_ref.qvg_quantize_chunk(jnp.zeros((cfg.chunk, D)), cfg,
                                                          jax.random.key(0)))
    code = _place(jax.tree.map(lambda s: jax.ShapeDtypeStruct((B, K, nc) + s.shape, s.dtype), one),
                  mesh, rows)
    q = _place(jax.ShapeDtypeStruct((B, K, G, D), jnp.float32), mesh, rows)
    per_row = _place(jax.ShapeDtypeStruct((B,), jnp.int32), mesh, PartitionSpec("data"))
    f = jax.jit(lambda q, kc, vc, s, m: kq_sharded.qvg_chunk_attention_sharded(
        q, kc, vc, cfg, s, m, 1, 10_000.0, mesh, implementation=impl))
    compiled = f.lower(q, code, code, per_row, per_row).compile()
    out, lse = compiled.output_shardings
    assert out.spec == rows and lse.spec == rows
