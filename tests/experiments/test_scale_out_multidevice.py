"""Scale-out: the diffusion-LM and PPM forecasting train steps, data-parallel over 8 fake CPU
devices, equal the single-device step (run in their own process; see the Makefile)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.diffusion_lm.families import FamilySpec, transformer_config
from algorithms.diffusion_lm.training import init_state, make_step
from algorithms.forecasting.training import ppm_loss_fn
from core import sharding
from core.training import init_train_state, make_train_step
from models.forecasting import PPM, PPMConfig
from models.transformer import Transformer

pytestmark = pytest.mark.multidevice


def run_on(devices, step, state, batch, replicated_batch, key):
    mesh = sharding.make_mesh(devices=devices)
    placed = sharding.shard_batch(batch, mesh)
    if replicated_batch:  # scalars in a dict batch are replicated, arrays split over `data`
        placed = {**placed, **sharding.replicate(replicated_batch, mesh)}
    return jax.jit(step)(sharding.replicate(state, mesh), placed, key)


def assert_same(out8, out1):
    (s8, m8), (s1, m1) = out8, out1
    np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 s8["params"], s1["params"])


@pytest.mark.parametrize("family", ["mdlm", "duo"])
def test_diffusion_lm_step_data_parallel(family):
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    spec = FamilySpec(name=family)
    cfg = transformer_config(spec, 16, d_model=32, num_layers=1, num_heads=2)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    tx = optax.sgd(0.1)
    step = make_step(graphdef, tx, spec)
    x = np.random.default_rng(0).integers(0, 256, size=(16, 16)).astype(np.int32)
    scalars = {"train": jnp.float32(1.0), "ce": jnp.float32(0.0)}
    key = jax.random.key(3)
    out1 = run_on(jax.devices()[:1], step, init_state(params, tx), {"x": x}, scalars, key)
    out8 = run_on(jax.devices(), step, init_state(params, tx), {"x": x}, scalars, key)
    assert_same(out8, out1)


def test_ppm_step_data_parallel():
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    cfg = PPMConfig(input_len=24, horizon=12, d_model=16, d_ff=32)
    graphdef, params = nnx.split(PPM(cfg, rngs=nnx.Rngs(0)))
    tx = optax.sgd(0.05)
    step = make_train_step(graphdef, tx, ppm_loss_fn(tau=0.1, bandwidth=0.3, num_samples=8))
    rng = np.random.default_rng(1)
    batch = (rng.normal(size=(16, 24, 3)).astype(np.float32),
             rng.normal(size=(16, 12, 3)).astype(np.float32))
    key = jax.random.key(4)
    out1 = run_on(jax.devices()[:1], step, init_train_state(params, tx), batch, {}, key)
    out8 = run_on(jax.devices(), step, init_train_state(params, tx), batch, {}, key)
    assert_same(out8, out1)
