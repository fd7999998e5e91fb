"""The scanned layer layout (``scan_layers=True``) computes the same function as the unrolled one."""

import dataclasses
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels import cache_backend
from models import kv_cache as kvc
from models.sampling import generate
from models.transformer import (
    Transformer,
    TransformerConfig,
    forward_flops_per_token,
    param_count,
    stack_layer_caches,
    stack_layer_params,
    unstack_layer_caches,
    unstack_layer_params,
)

V = 50


def pair(num_layers=3, seed=0, **kw):
    """(unrolled cfg, graphdef, params), (scanned cfg, graphdef, params) with equal random weights.

    The weights are perturbed away from the initialisation so that the zero-initialised adaLN maps
    (time conditioning) are active and every layer differs. Built once per configuration (keyword
    arguments equal to the config's defaults name the same pair).
    """
    cfg = TransformerConfig(**{**dict(vocab_size=V, max_len=32, d_model=32, num_layers=num_layers,
                                      num_heads=4, num_kv_heads=2), **kw})
    return _pair(cfg, seed)


@functools.cache
def _pair(cfg, seed):
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))

    @jax.jit
    def perturb(params):
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
        return jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                         for x, k in zip(leaves, keys)])

    params = perturb(params)
    scfg = dataclasses.replace(cfg, scan_layers=True)
    sgraphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(scfg, rngs=nnx.Rngs(seed))))
    return (cfg, graphdef, params), (scfg, sgraphdef, stack_layer_params(params))


def tokens(b=2, l=12, seed=0):
    return jax.random.randint(jax.random.key(seed), (b, l), 0, V)


def test_param_layout_conversion_round_trips_and_matches_the_scanned_model():
    (cfg, _, params), (scfg, _, sparams) = pair(num_layers=3, time_conditioning=True)
    native = nnx.split(nnx.eval_shape(lambda: Transformer(scfg, rngs=nnx.Rngs(1))))[1]  # abstract
    assert jax.tree.structure(sparams) == jax.tree.structure(native)
    chex.assert_trees_all_equal_shapes_and_dtypes(sparams, native)
    np.testing.assert_array_equal(sparams["blocks"]["attn"]["q_proj"]["kernel"][2],
                                  params["blocks"][2]["attn"]["q_proj"]["kernel"])
    back = unstack_layer_params(sparams)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    chex.assert_trees_all_equal(back, params)
    assert param_count(sparams) == param_count(params) == param_count(native)
    for seq in (1, 17, 32):
        assert forward_flops_per_token(scfg, seq) == forward_flops_per_token(cfg, seq)


def test_scanned_init_draws_each_layer_separately_and_keeps_adaln_zero():
    cfg = TransformerConfig(vocab_size=V, max_len=32, d_model=32, num_layers=3, num_heads=4,
                            num_kv_heads=2, time_conditioning=True, causal=False,
                            scan_layers=True)
    m = Transformer(cfg, rngs=nnx.Rngs(0))
    q = m.blocks.attn.q_proj.kernel[...]
    assert q.shape == (3, 32, 32)
    assert float(jnp.abs(q[0] - q[1]).min()) > 0 and float(jnp.abs(q[1] - q[2]).min()) > 0
    # same init scale as the unrolled model: std 1/sqrt(E) for q, 1/sqrt(2 N H D) for o
    np.testing.assert_allclose(float(q.std()), 1 / math.sqrt(32), rtol=0.1)
    np.testing.assert_allclose(float(m.blocks.attn.o_proj.kernel[...].std()),
                               1 / math.sqrt(32 * 2 * 3), rtol=0.1)
    x = tokens(2, 8)
    np.testing.assert_allclose(m(x, jnp.array([0.1, 0.9]), return_hidden=True), m.embed(x),
                               atol=1e-6)


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_scanned_forward_equals_unrolled(time_conditioning):
    (_, g, p), (_, sg, sp) = pair(time_conditioning=time_conditioning)
    x = tokens(3, 12, seed=4)
    cond = jnp.array([0.1, 0.5, 0.9]) if time_conditioning else None
    fwd = jax.jit(lambda gd, prm, hid: nnx.merge(gd, prm)(x, cond, return_hidden=hid),
                  static_argnums=(0, 2))
    want, got = fwd(g, p, False), fwd(sg, sp, False)
    assert float(jnp.abs(want).max()) > 1.0  # non-trivial logits
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(fwd(sg, sp, True), fwd(g, p, True), atol=1e-5, rtol=1e-5)
    # eager (un-jitted) call of the scanned model too
    np.testing.assert_allclose(nnx.merge(sg, sp)(x, cond), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_scanned_gradients_equal_unrolled(time_conditioning):
    (_, g, p), (_, sg, sp) = pair(time_conditioning=time_conditioning)
    x = tokens(2, 10, seed=7)
    cond = jnp.array([0.3, 0.8]) if time_conditioning else None

    def loss(prm, gd):
        logits = nnx.merge(gd, prm)(x, cond)
        return jnp.mean(jax.nn.log_softmax(logits)[:, :-1].take(0, axis=-1) * logits[:, 1:, 3])

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    gu, gs = grad(p, g), grad(sp, sg)
    assert float(jnp.abs(gu["blocks"][2]["mlp"]["down"]["kernel"][...]).max()) > 1e-4
    if time_conditioning:
        assert float(jnp.abs(gu["blocks"][1]["ada"]["kernel"][...]).max()) > 1e-4
    chex.assert_trees_all_close(gs, stack_layer_params(gu), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("time_conditioning", [False, True])
def test_scanned_decode_equals_unrolled(time_conditioning):
    (cfg, g, p), (_, sg, sp) = pair(time_conditioning=time_conditioning)
    mu, ms = nnx.merge(g, p), nnx.merge(sg, sp)
    x = tokens(2, 14, seed=2)
    cond = jnp.array([0.2, 0.6]) if time_conditioning else None
    cu, cs = mu.init_cache(2, 20), ms.init_cache(2, 20)
    assert isinstance(cu, list) and len(cu) == cfg.num_layers
    chex.assert_trees_all_equal(cs, stack_layer_caches(cu))
    step = jax.jit(lambda gd, prm, tok, cache, start: nnx.merge(gd, prm).decode(
        tok, cache, start, cond=cond), static_argnums=0)
    lu, cu = step(g, p, x[:, :9], cu, jnp.zeros(2, jnp.int32))
    ls, cs = step(sg, sp, x[:, :9], cs, jnp.zeros(2, jnp.int32))
    np.testing.assert_allclose(ls, lu, atol=1e-5, rtol=1e-5)
    for i in range(9, 14):
        lu, cu = step(g, p, x[:, i:i + 1], cu, jnp.full((2,), i, jnp.int32))
        ls, cs = step(sg, sp, x[:, i:i + 1], cs, jnp.full((2,), i, jnp.int32))
        np.testing.assert_allclose(ls, lu, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(unstack_layer_caches(cs), cu, atol=1e-5, rtol=1e-5)
    # and the scanned decode still equals the scanned full forward
    full = jax.jit(lambda prm: nnx.merge(sg, prm)(x, cond))(sp)
    np.testing.assert_allclose(ls[:, 0], full[:, 13], atol=2e-5, rtol=2e-5)


def test_scanned_generate_greedy_equals_unrolled():
    (_, g, p), (_, sg, sp) = pair()
    prompt = tokens(3, 5, seed=9)
    tu, lpu = generate(g, p, prompt, jax.random.key(0), max_new_tokens=8, temperature=0.0)
    ts, lps = generate(sg, sp, prompt, jax.random.key(0), max_new_tokens=8, temperature=0.0)
    assert len(np.unique(np.asarray(tu))) > 2  # not a constant continuation
    np.testing.assert_array_equal(ts, tu)
    np.testing.assert_allclose(lps, lpu, atol=1e-5)


def test_scanned_decode_with_ffd_backend_equals_unrolled():
    (_, g, p), (_, sg, sp) = pair(num_layers=2, max_len=64, d_model=64)
    backend = kvc.get_backend("ffd", page_size=16, delta=math.inf)
    x = tokens(2, 50, seed=11)

    def run(gd, prm):
        model = nnx.merge(gd, prm)
        cache = model.init_cache(2, 64, backend)
        step = jax.jit(lambda prm, tok, cache, start: nnx.merge(gd, prm).decode(
            tok, cache, start, backend))
        out, cache = step(prm, x[:, :45], cache, jnp.zeros((2,), jnp.int32))
        outs = [out]
        for t in range(45, 50):  # decode steps across the page boundary at 48
            out, cache = step(prm, x[:, t:t + 1], cache, jnp.full((2,), t, jnp.int32))
            outs.append(out)
        return jnp.concatenate(outs, 1), cache

    lu, cu = run(g, p)
    ls, cs = run(sg, sp)
    assert isinstance(cu, list) and cs["codes"].shape[0] == 2
    np.testing.assert_allclose(ls, lu, atol=1e-4, rtol=1e-4)
    # the sparse path stays close to the dense forward (FFD's own tolerance)
    dense = jax.jit(lambda prm: nnx.merge(g, prm)(x))(p)
    np.testing.assert_allclose(ls[:, -1], dense[:, -1], atol=3e-2)


@dataclasses.dataclass(frozen=True)
class _CounterCache(cache_backend.DenseKVCache):
    """A dense cache that also keeps a Python int: not stackable along a layer axis."""

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        return {**super().init(batch_size, max_len, num_kv_heads, head_dim, dtype), "n": 0}


def test_scanned_layout_bad_input_raises():
    (_, g, p), (_, sg, sp) = pair()
    mu, ms = nnx.merge(g, p), nnx.merge(sg, sp)
    with pytest.raises(ValueError, match="cannot be stacked along a layer axis"):
        ms.init_cache(1, 16, _CounterCache())
    assert len(mu.init_cache(1, 16, _CounterCache())) == 3  # fine unrolled
    with pytest.raises(ValueError, match="list of 3 per-layer entries"):
        ms.decode(tokens(1, 3), mu.init_cache(1, 16), jnp.zeros(1, jnp.int32))
    with pytest.raises(ValueError, match="num_layers=3"):
        ms.decode(tokens(1, 3), cache_backend.DENSE.init(1, 16, 2, 8, jnp.float32),
                  jnp.zeros(1, jnp.int32))
    with pytest.raises(ValueError, match="already in the scanned layout"):
        stack_layer_params(sp)
    with pytest.raises(ValueError, match="already per-layer"):
        unstack_layer_params(p)
    with pytest.raises(ValueError, match="nnx.State of a Transformer"):
        stack_layer_params({"blocks": {}})
    with pytest.raises(ValueError, match="different pytree structures"):
        stack_layer_caches([{"k": jnp.zeros(2)}, {"v": jnp.zeros(2)}])
    with pytest.raises(ValueError, match="no layer caches"):
        stack_layer_caches([])
