"""algorithms.kv_budget.cache.teacher_forced_nll: held-out NLL decoded through a KV backend."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.kv_budget import cache as budget_cache
from kernels import cache_backend
from models.llama import Llama, LlamaConfig

V, L, P = 29, 12, 5


@pytest.fixture(scope="module")
def model():
    cfg = LlamaConfig(vocab_size=V, max_len=16, d_model=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, mlp_dim=48)
    m = Llama(cfg, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (3, L)), jnp.int32)
    return m, tokens


def _forward_nll(m, tokens, prompt_len):
    """Next-token NLL of the full forward pass on positions prompt_len..L-1, float64 numpy."""
    logits = np.asarray(m(tokens), np.float64)[:, prompt_len - 1:-1]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    tgt = np.asarray(tokens)[:, prompt_len:]
    return -np.take_along_axis(logp, tgt[..., None], -1).sum()


def test_dense_cache_equals_the_forward_pass(model):
    m, tokens = model
    graphdef, params = nnx.split(m)
    total, count = budget_cache.teacher_forced_nll(graphdef, params, tokens, cache_backend.DENSE, P)
    want = _forward_nll(m, tokens, P)
    assert count == 3 * (L - P)
    np.testing.assert_allclose(float(total), want, rtol=1e-5)


def test_a_budget_keeping_every_prompt_slot_is_the_dense_cache(model):
    m, tokens = model
    graphdef, params = nnx.split(m)
    keep = [jnp.ones((3, 2, P), bool)] * 2
    full, _ = budget_cache.teacher_forced_nll(graphdef, params, tokens,
                                              budget_cache.BudgetedKVCache(), P, keep)
    np.testing.assert_allclose(float(full), _forward_nll(m, tokens, P), rtol=1e-5)
    # dropping prompt slots changes the result (the mask is honoured)
    some = [jnp.ones((3, 2, P), bool).at[:, :, :3].set(False)] * 2
    fewer, _ = budget_cache.teacher_forced_nll(graphdef, params, tokens,
                                               budget_cache.BudgetedKVCache(), P, some)
    assert abs(float(fewer) - float(full)) > 1e-4 * abs(float(full))


def test_bad_arguments_are_refused(model):
    m, tokens = model
    graphdef, params = nnx.split(m)
    for p in (0, L, 2.0):
        with pytest.raises(ValueError, match=f"prompt_len={p!r}, expected an integer in"):
            budget_cache.teacher_forced_nll(graphdef, params, tokens, cache_backend.DENSE, p)
    with pytest.raises(ValueError, match=r"tokens must be \[B, L\]"):
        budget_cache.teacher_forced_nll(graphdef, params, tokens[0], cache_backend.DENSE, P)
    with pytest.raises(ValueError, match="keep masks need a BudgetedKVCache"):
        budget_cache.teacher_forced_nll(graphdef, params, tokens, cache_backend.DENSE, P,
                                        [jnp.ones((3, 2, P), bool)] * 2)
