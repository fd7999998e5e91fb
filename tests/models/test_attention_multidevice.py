"""Splash attention on several devices: under a mesh in context (``jax.set_mesh``) the kernel runs
inside ``shard_map`` on each device's rows and heads, with none over a 1-D mesh of all devices
(interpret mode, 8 fake CPU devices, own process); both equal the jnp reference in values and
gradients."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from core import sharding
from kernels.attention_math import grouped_attention
from models import attention as attn

pytestmark = pytest.mark.multidevice


@pytest.mark.parametrize("model, in_context", [(1, True), (2, True), (2, False)])
def test_splash_in_shard_map_equals_reference(model, in_context):
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    mesh = sharding.make_mesh(model, devices=jax.devices()[:8])
    b, h, k, l, d = 8 // model, 4, 2, 128, 32  # rows over data, kv heads over model
    rng = np.random.default_rng(model)
    q, kk, v, cot = (jnp.asarray(rng.normal(size=s), jnp.float32)
                     for s in ((b, h, l, d), (b, k, l, d), (b, k, l, d), (b, h, l, d)))
    spec = NamedSharding(mesh, PartitionSpec("data", "model"))
    mask = jnp.tril(jnp.ones((l, l), bool))[None, None, None]

    def ours(q, kk, v):
        return attn.attention(q, kk, v, implementation="splash", mask_kind="causal",
                              block_size=128, interpret=True)

    with jax.set_mesh(mesh) if in_context else contextlib.nullcontext():
        out, grads = jax.jit(lambda *a: (ours(*a), jax.vjp(ours, *a)[1](cot)))(
            *(jax.device_put(x, spec) for x in (q, kk, v)))
        text = jax.jit(ours).lower(q, kk, v).as_text()
    assert "shard_map" in text or "sdy.manual_computation" in text
    ref_out, ref_vjp = jax.vjp(lambda *a: grouped_attention(*a, mask), q, kk, v)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-6)
    for a, r in zip(grads, ref_vjp(cot), strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(r))))
