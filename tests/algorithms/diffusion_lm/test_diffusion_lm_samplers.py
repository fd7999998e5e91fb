"""Samplers: no [MASK] left, data ids only, carry-over, Eso-LM phases, bad steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.diffusion_lm import esolm
from algorithms.diffusion_lm.families import FamilySpec, sample, transformer_config
from algorithms.diffusion_lm.processes import Process
from models.transformer import Transformer

V, N, MASK, BOS = 9, 7, 7, 8
B, L = 3, 8


def _model(spec, seed=0):
    cfg = transformer_config(spec, L, d_model=16, num_layers=1, num_heads=2)
    return nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))


@pytest.mark.parametrize("name", ["ar", "mdlm", "duo", "gidd", "esolm"])
def test_samples_are_data_tokens_without_masks(name):
    spec = FamilySpec(name, vocab_size=V, num_classes=N, mask_id=MASK, bos_id=BOS, alpha0=0.5,
                      p_uniform=0.3)
    graphdef, params = _model(spec)
    for steps in (1, 5):
        z = np.asarray(sample(spec, graphdef, params, jax.random.key(steps), batch_size=B,
                              seq_len=L, num_steps=steps))
        assert z.shape == (B, L)
        assert z.min() >= 0 and z.max() < N, z


def test_masked_sampler_carries_over_revealed_tokens():
    """Run the ancestral chain step by step: a token, once unmasked, never changes."""
    proc = Process("masked", V, N, mask_id=MASK)
    z = jnp.full((64,), MASK)
    key = jax.random.key(0)
    x_theta = jax.nn.softmax(jax.random.normal(key, (64, V)).at[:, N:].set(-jnp.inf))
    steps = 6
    history = [np.asarray(z)]
    for i in range(steps):
        t, s = 1 - i / steps, 1 - (i + 1) / steps
        post = proc.posterior(z, x_theta, s, t)
        z = jax.random.categorical(jax.random.fold_in(key, i), jnp.log(post))
        history.append(np.asarray(z))
    for prev, cur in zip(history, history[1:]):
        revealed = prev != MASK
        np.testing.assert_array_equal(cur[revealed], prev[revealed])
    assert np.all(history[-1] != MASK)
    assert 0 < np.sum(history[steps // 2] == MASK) < 64     # gradual unmasking


def test_esolm_reveals_binomial_counts_then_finishes_autoregressively():
    """With a small alpha0 most tokens come from the AR phase; the chain ends with no mask.
    A constant denoiser checks the plumbing of both phases."""
    def apply_fn(tokens, positions, mask):
        del positions, mask
        return jnp.zeros(tokens.shape + (V,)).at[..., 3].set(50.0)

    proc = Process("masked", V, N, mask_id=MASK, alpha0=0.25)
    run = jax.jit(esolm.sample, static_argnums=(0, 1, 3, 4))
    z = np.asarray(run(apply_fn, proc, jax.random.key(1), 4, 16, 4))
    assert np.all(z != MASK) and z.max() < N
    assert np.all(z == 3)       # every position was decoded from the (constant) denoiser


def test_bad_sampling_arguments_raise():
    spec = FamilySpec("mdlm", vocab_size=V, num_classes=N, mask_id=MASK, bos_id=BOS)
    graphdef, params = _model(spec)
    with pytest.raises(ValueError, match="num_steps"):
        sample(spec, graphdef, params, jax.random.key(0), batch_size=B, seq_len=L, num_steps=0)
    with pytest.raises(ValueError, match="batch_size"):
        sample(spec, graphdef, params, jax.random.key(0), batch_size=0, seq_len=L, num_steps=2)
