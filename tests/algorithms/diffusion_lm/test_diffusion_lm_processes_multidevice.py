"""Forward-process sampling on a batch-sharded mesh of 8 fake CPU devices (own process; see the
Makefile): every device draws only its own rows."""

import jax
import jax.numpy as jnp
import pytest

from algorithms.diffusion_lm.processes import KINDS, Process
from core import sharding

pytestmark = pytest.mark.multidevice

V, N, MASK = 258, 256, 257  # the byte vocabulary of the experiments


@pytest.mark.parametrize("kind", KINDS)
def test_sample_draws_per_shard_on_a_batch_sharded_mesh(kind):
    """The compiled per-device temporaries of ``Process.sample`` stay below one shard's [B/8, L, V]
    float32 array: no [B, L, V] draw (a Gumbel-max categorical from the step's replicated key is
    generated whole on every device; it once put 95 GiB per chip into GIDD's paper step)."""
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    proc = Process(kind, V, N, mask_id=None if kind == "uniform" else MASK, p_uniform=0.3
                   if kind == "gidd" else 0.0)
    mesh = sharding.make_mesh(devices=jax.devices())
    b, L = 64, 128
    x = jax.ShapeDtypeStruct((b, L), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
    t = jax.ShapeDtypeStruct((b,), jnp.float32, sharding=sharding.batch_sharding(mesh, 1))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=sharding.replicated(mesh))
    compiled = jax.jit(proc.sample).lower(key, x, t).compile()
    per_shard_vocab_array = b // 8 * L * V * 4
    assert compiled.memory_analysis().temp_size_in_bytes < per_shard_vocab_array
    assert compiled.output_shardings.spec[0] == sharding.DATA
