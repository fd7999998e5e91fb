"""Parameter sharding on 8 fake CPU devices: FSDP, tensor-parallel and FSDP x TP train steps equal
the one-device step; parameters and Adam moments really are split; a checkpoint written on one mesh
restores on another and on one device and continues identically (run in its own process)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from core import sharding
from core.checkpoint import Checkpointer
from core.training import init_train_state, make_train_step
from models.losses import next_token_nll
from models.transformer import PARAM_AXES, Transformer, TransformerConfig

pytestmark = pytest.mark.multidevice

CFG = TransformerConfig(vocab_size=64, max_len=16, d_model=32, num_layers=2, num_heads=8,
                        num_kv_heads=2, mlp_dim=64)


def loss_fn(model, batch, key):
    del key
    return next_token_nll(model(batch), batch).mean(), {}


def _setup():
    if jax.device_count() < 8:
        pytest.fail("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (see Makefile)")
    graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    tx = optax.adamw(1e-2, weight_decay=0.1)
    batch = np.random.default_rng(0).integers(0, 64, size=(16, 16)).astype(np.int32)
    return graphdef, params, tx, batch


def _run(graphdef, params, tx, batch, mesh, rules, steps=2):
    """``steps`` train steps with the state placed by ``rules`` on ``mesh``; returns (state,
    losses, state shardings)."""
    state = init_train_state(jax.tree.map(jnp.copy, params), tx)  # the step donates its input
    p_sh = sharding.param_shardings(params, PARAM_AXES, mesh, rules, CFG.logical_sizes)
    st_sh = sharding.train_state_shardings(state, p_sh, tx, mesh)
    state = jax.device_put(state, st_sh)
    step = jax.jit(sharding.constrain_step(make_train_step(graphdef, tx, loss_fn), st_sh),
                   donate_argnums=0)
    losses = []
    for i in range(steps):
        state, metrics = step(state, sharding.shard_batch(batch, mesh), jax.random.key(i))
        losses.append(float(metrics["loss"]))
    return state, losses, st_sh


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("shape,rules_name", [((8, 1), "PARAM_RULES"), ((1, 8), "PARAM_RULES"),
                                              ((2, 4), "PARAM_RULES"),
                                              ((8, 1), "REPLICATED_RULES")])
def test_sharded_train_step_equals_one_device(shape, rules_name):
    graphdef, params, tx, batch = _setup()
    rules = getattr(sharding, rules_name)
    ref_state, ref_losses, _ = _run(graphdef, params, tx, batch,
                                    sharding.make_mesh(devices=jax.devices()[:1]), rules)
    mesh = sharding.make_mesh(model_parallelism=shape[1])
    CFG.check_model_parallelism(shape[1])
    state, losses, st_sh = _run(graphdef, params, tx, batch, mesh, rules)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    _assert_same(state["params"], ref_state["params"])
    _assert_same(state["opt_state"], ref_state["opt_state"])
    # the shardings were kept through the donated steps
    for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(st_sh), strict=True):
        assert x.sharding.is_equivalent_to(s, x.ndim)
    # bytes per device of parameters + Adam moments fall as 1/N where everything splits
    full = sharding.bytes_per_device(ref_state["params"]) + sharding.bytes_per_device(
        ref_state["opt_state"])
    ours = sharding.bytes_per_device(state["params"]) + sharding.bytes_per_device(state["opt_state"])
    if rules_name == "REPLICATED_RULES":
        assert ours == full
    else:
        # every matrix splits 8 ways except k/v projections under TP (2 kv heads, replicated over a
        # model axis of 4 or 8 but FSDP-split over data) and the norm scales
        assert ours <= full / 4, (ours, full)


def test_layout_of_fsdp_x_tp():
    graphdef, params, tx, _ = _setup()
    mesh = sharding.make_mesh(model_parallelism=4)
    p_sh = sharding.param_shardings(params, PARAM_AXES, mesh, logical_sizes=CFG.logical_sizes)
    spec = {"/".join(map(str, p)): s.spec for p, s in nnx.to_flat_state(p_sh)}
    P = jax.sharding.PartitionSpec
    assert spec["blocks/0/attn/q_proj/kernel"] == P("data", "model")  # [E, H*D]
    assert spec["blocks/0/attn/k_proj/kernel"] == P("data", None)  # 2 kv heads: not split by 4
    assert spec["blocks/0/attn/o_proj/kernel"] == P("model", "data")
    assert spec["blocks/0/mlp/down/kernel"] == P("model", "data")
    assert spec["embed/embedding"] == P("model", "data")
    assert spec["blocks/0/norm1/scale"] == P(None)
    with pytest.raises(ValueError, match="does not divide"):
        CFG.check_model_parallelism(3)
    with pytest.raises(ValueError, match="not one of"):
        sharding.param_shardings(params, PARAM_AXES, mesh, {**sharding.PARAM_RULES, "mlp": "tensor"})
    with pytest.raises(ValueError, match="no entry in the sharding table"):
        sharding.param_shardings(params, {("q_proj", "kernel"): ("embed", "heads")}, mesh)


def test_checkpoint_restores_onto_another_mesh_and_continues(tmp_path):
    graphdef, params, tx, batch = _setup()
    mesh8 = sharding.make_mesh(model_parallelism=1)
    state8, _, _ = _run(graphdef, params, tx, batch, mesh8, sharding.PARAM_RULES, steps=1)
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, state8, {"note": "fsdp 8"})

    def continue_on(mesh):
        state = init_train_state(params, tx)
        st_sh = sharding.train_state_shardings(
            state, sharding.param_shardings(params, PARAM_AXES, mesh, logical_sizes=CFG.logical_sizes),
            tx, mesh)
        abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                state, st_sh)
        restored, _ = Checkpointer(str(tmp_path / "ckpt")).restore(abstract, 1)
        for x, s in zip(jax.tree.leaves(restored), jax.tree.leaves(st_sh), strict=True):
            assert x.sharding.is_equivalent_to(s, x.ndim)
        step = jax.jit(sharding.constrain_step(make_train_step(graphdef, tx, loss_fn), st_sh))
        new, metrics = step(restored, sharding.shard_batch(batch, mesh), jax.random.key(1))
        return new, float(metrics["loss"])

    a, loss_a = continue_on(sharding.make_mesh(model_parallelism=4))  # (2, 4)
    b, loss_b = continue_on(sharding.make_mesh(devices=jax.devices()[:1]))
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-6)
    _assert_same(a["params"], b["params"])
    # and equal to never having stopped
    ref, ref_losses, _ = _run(graphdef, params, tx, batch, mesh8, sharding.PARAM_RULES, steps=2)
    np.testing.assert_allclose(loss_b, ref_losses[1], rtol=1e-6)
    _assert_same(b["params"], ref["params"])
    assert jnp.asarray(b["step"]) == 2
