"""Data-parallel training on 8 fake CPU devices equals one device (run in its own process)."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from core import sharding
from core.training import init_train_state, make_train_step
from models.losses import next_token_nll
from models.transformer import Transformer, TransformerConfig

pytestmark = pytest.mark.multidevice


def loss_fn(model, batch, key):
    del key
    return next_token_nll(model(batch), batch).mean(), {}


def test_data_parallel_step_matches_single_device():
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    cfg = TransformerConfig(vocab_size=64, max_len=16, d_model=32, num_layers=2, num_heads=4,
                            num_kv_heads=2)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    # SGD, so parameter differences are gradient differences (Adam's first step divides by |g| and
    # amplifies summation-order noise in near-zero gradients).
    tx = optax.sgd(0.1)
    step = make_train_step(graphdef, tx, loss_fn)
    batch = np.random.default_rng(0).integers(0, 64, size=(16, 16)).astype(np.int32)
    key = jax.random.key(0)

    one = jax.devices()[:1]
    mesh1 = sharding.make_mesh(devices=one)
    s1, m1 = jax.jit(step)(sharding.replicate(init_train_state(params, tx), mesh1),
                           sharding.shard_batch(batch, mesh1), key)

    mesh8 = sharding.make_mesh()
    assert mesh8.shape == {"data": 8, "model": 1}
    b8 = sharding.shard_batch(batch, mesh8)
    assert len(b8.sharding.device_set) == 8
    s8, m8 = jax.jit(step)(sharding.replicate(init_train_state(params, tx), mesh8), b8, key)

    np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-6)
    assert m8["loss"].sharding.is_fully_replicated
    np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 s8["params"], s1["params"])

    def grads(p, b):
        return jax.grad(lambda q: loss_fn(nnx.merge(graphdef, q), b, None)[0])(p)

    g1 = jax.jit(grads)(sharding.replicate(params, mesh1), sharding.shard_batch(batch, mesh1))
    g8 = jax.jit(grads)(sharding.replicate(params, mesh8), b8)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), g8, g1)


def test_shard_batch_rejects_indivisible_batch():
    mesh = sharding.make_mesh()
    with pytest.raises(ValueError, match="cannot be split over 8"):
        sharding.shard_batch(np.zeros((6, 4)), mesh)
    with pytest.raises(ValueError, match="must divide"):
        sharding.make_mesh(model_parallelism=3)


def test_constrain_pins_named_axes_on_the_mesh_in_context_and_nothing_without_one():
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    x = np.zeros((16, 6, 4), np.float32)
    axes = ("batch", "seq", "mlp")
    # no mesh in context: the identity, even under jit
    assert sharding.constrain(x, axes) is x
    mesh = sharding.make_mesh(2)  # data 4 x model 2

    def f(x):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return sharding.constrain(x * 2, axes)

    out = jax.jit(f)(jax.device_put(x, sharding.replicated(mesh)))
    assert out.sharding.spec == jax.sharding.PartitionSpec("data", None, "model")
    # an axis that does not divide its dimension is left to the compiler
    odd = jax.jit(f)(jax.device_put(np.zeros((8, 6, 3), np.float32), sharding.replicated(mesh)))
    assert odd.sharding.is_equivalent_to(sharding.batch_sharding(mesh, 3), 3)
    with pytest.raises(ValueError, match="2 logical axes"):
        sharding.constrain(x, ("batch", "seq"))
