"""Activation sharding of the transformer's FSDP train step, compiled for a compile-only TPU slice
(marker ``aot``: runs in .venv-aot, ``make test-aot``)."""

import re

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from core import aot
from core import sharding as shd
from models.transformer import PARAM_AXES, Transformer, TransformerConfig

pytestmark = pytest.mark.aot


def _make_step(graphdef, tx):
    """A next-token train step (state, tokens, key) -> (state, metrics) with the layout of
    ``core.training.make_train_step``, whose module needs more than the compile extras."""

    def loss_fn(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens).astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(logits, -1)
                        - jnp.take_along_axis(logits, tokens[..., None], -1)[..., 0])

    def step(state, tokens, key):
        del key
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], tokens)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}, {"loss": loss}

    return step


def test_fsdp_step_all_reduces_weights_not_full_batch_activations():
    """With the weights FSDP-sharded over `data`, XLA:TPU left free partitions the matmuls along
    their contracting width and all-reduces full-batch [B, L, F] outputs over the 4 chips (seen
    here: [8, 256, 258], [8, 2, 256, 128]); with the residual stream pinned to the batch
    (models.transformer via core.sharding.constrain) only weight-shaped gradients are
    all-reduced."""
    if not aot.extras_available("tpu-v5e"):
        pytest.fail("compile extras for tpu-v5e are missing (make aot-env installs them)")
    b, L, d = 8, 256, 256
    devices = aot.topology_description("tpu-v5e", "v5e:2x2").devices
    cfg = TransformerConfig(vocab_size=258, max_len=L, d_model=d, num_layers=1, num_heads=2,
                            dtype=jnp.bfloat16, remat="full")
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    tx = optax.adam(1e-3)
    state = jax.eval_shape(lambda p: {"params": p, "opt_state": tx.init(p)}, params)
    mesh = shd.make_mesh(1, devices=devices)
    p_sh = shd.param_shardings(params, PARAM_AXES, mesh, shd.rules_named("fsdp"),
                               logical_sizes=cfg.logical_sizes)
    st_sh = shd.train_state_shardings(state, p_sh, tx, mesh)
    step = shd.constrain_step(_make_step(graphdef, tx), st_sh)
    args = (jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                         st_sh),
            jax.ShapeDtypeStruct((b, L), jnp.int32, sharding=shd.batch_sharding(mesh, 2)),
            jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=shd.replicated(mesh)))
    text = jax.jit(step, donate_argnums=(0,)).lower(*args).compile().as_text()
    reduced = re.findall(r"= \w+\[([\d,]+)\]\S* all-reduce(?:-start)?\(", text)
    assert reduced, "expected the gradients' all-reduce in the compiled step"
    full_batch = [s for s in reduced if s.split(",")[0] == str(b)]
    assert not full_batch, f"full-batch activations all-reduced: {full_batch}"
