"""Scale-out: the diffusion-LM, PPM forecasting and SPF train steps, data-parallel over 8 fake CPU
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
from algorithms.spf import problems as spf_problems
from algorithms.spf import spf as spf_lib
from algorithms.spf.training import EpisodeBatches
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


@pytest.mark.parametrize("family", ["mdlm", "duo", "gidd"])
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


def _record_grads() -> optax.GradientTransformation:
    """Passes updates through and keeps the last ones (the raw gradient, first in a chain)."""
    return optax.GradientTransformation(lambda p: jax.tree.map(jnp.zeros_like, p),
                                        lambda u, s, p=None: (u, u))


@pytest.mark.parametrize("kind", ["lsq", "logistic"])
def test_spf_step_data_parallel(kind):
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    E, T = 8, 12
    problem = spf_problems.Problem(kind=kind, drift="rotation", dim=5, batch=3, steps=T)
    cfg = spf_lib.SPFConfig(step=0.1, hidden=8)
    graphdef, params = spf_lib.init_spf(cfg)
    # away from the zero last layer, so every parameter gets a gradient
    keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(params))))
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), params)
    tx = optax.chain(_record_grads(), optax.clip_by_global_norm(1.0), optax.adam(3e-3))
    step = make_train_step(graphdef, tx, spf_lib.make_episode_loss_fn(kind, cfg))
    key = jax.random.key(11)

    def episodes(devices):
        return next(EpisodeBatches(problem, E, key, sharding.make_mesh(devices=devices)))

    def run(devices, batch):
        mesh = sharding.make_mesh(devices=devices)
        compiled = jax.jit(step).lower(sharding.replicate(init_train_state(params, tx), mesh),
                                       batch, key).compile()
        return compiled(sharding.replicate(init_train_state(params, tx), mesh), batch, key), \
            compiled.as_text()

    batch1, batch8 = episodes(jax.devices()[:1]), episodes(jax.devices())
    # the same episodes, one per device: the simulation is one program per mesh, and XLA may fuse
    # a multiply-add in one and not the other, so they agree to float32 rounding (a few units in
    # the last place of the largest value), not bit for bit
    eps = np.finfo(np.float32).eps
    for x1, x8 in zip(batch1, batch8, strict=True):
        x1 = np.asarray(x1)
        np.testing.assert_allclose(np.asarray(x8), x1, rtol=0, atol=8 * eps * np.abs(x1).max())
        assert {s.data.shape[0] for s in x8.addressable_shards} == {1}
    # the step on both meshes from the same values, laid out as the 8-device episodes are
    batch8 = jax.device_put(batch1, tuple(x.sharding for x in batch8))
    s1, m1 = run(jax.devices()[:1], batch1)[0]
    (s8, m8), hlo8 = run(jax.devices(), batch8)
    assert "all-gather" not in hlo8
    # Only the grouping of the sums over episodes differs (8 per-device partials, then an
    # all-reduce): the loss terms are E * T non-negative numbers, whose sum in any order is within
    # E * T * 2^-24 ~ 6e-6 relative of the exact one; the gradient is a signed sum over E, so its
    # error is measured against each leaf's largest entry.
    for k in ("loss", "excess", "residual"):
        np.testing.assert_allclose(m8[k], m1[k], rtol=6e-6)
    g1, g8 = s1["opt_state"][0], s8["opt_state"][0]
    for a8, a1 in zip(jax.tree.leaves(g8), jax.tree.leaves(g1), strict=True):
        a8, a1 = np.asarray(a8), np.asarray(a1)
        assert np.abs(a1).max() > 0
        np.testing.assert_allclose(a8, a1, rtol=1e-5, atol=1e-5 * np.abs(a1).max())
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 s8["params"], s1["params"])
