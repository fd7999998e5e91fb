"""algorithms.kv_budget.cache.teacher_forced_nll: held-out NLL decoded through a KV backend."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.kv_budget import cache as budget_cache
from kernels import cache_backend
from kernels.kv_quant.reference import KIVIConfig, QVGConfig
from models import kv_cache as kvc
from models import llama
from models.llama import Llama, LlamaConfig
from models.transformer import Transformer, TransformerConfig

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
    with pytest.raises(ValueError, match="windows of 17 tokens exceed the model's max_len=16"):
        budget_cache.teacher_forced_nll(graphdef, params, jnp.zeros((1, 17), jnp.int32),
                                        cache_backend.DENSE, P)
    with pytest.raises(ValueError, match="keep masks need a BudgetedKVCache"):
        budget_cache.teacher_forced_nll(graphdef, params, tokens, cache_backend.DENSE, P,
                                        [jnp.ones((3, 2, P), bool)] * 2)


@functools.partial(jax.jit, static_argnames=("graphdef", "backend", "prompt_len"))
def _token_major_nll(graphdef, params, tokens, backend, prompt_len, keep=None):
    """The definition, decoded as a generator decodes: the whole model one token at a time
    (prefill, then per step decode every layer and flush), the logits after token i-1 scoring
    token i."""
    m = nnx.merge(graphdef, params)
    b, l = tokens.shape
    cache = m.init_cache(b, l, backend)
    logits, cache = m.decode(tokens[:, :prompt_len], cache, jnp.zeros((b,), jnp.int32), backend)
    if keep is not None:
        cache = budget_cache.with_keep(cache, keep)

    def step(carry, i):
        cache, last = carry
        tok = jax.lax.dynamic_index_in_dim(tokens, i, axis=1, keepdims=False)
        nll = -jnp.take_along_axis(jax.nn.log_softmax(last), tok[:, None], axis=-1)[:, 0]
        lg, cache = m.decode(tok[:, None], cache, jnp.full((b,), i, jnp.int32), backend)
        return (m.flush_cache(cache, backend), lg[:, 0]), nll

    _, nll = jax.lax.scan(step, (cache, logits[:, -1]), jnp.arange(prompt_len, l))
    return jnp.sum(nll)


# Chunks of 4 so that the 7 decoded tokens cross two chunk boundaries (QVG / KIVI flush there).
_LOSSY = {"qvg": dict(config=QVGConfig(bits=2, stages=1, block=8, num_centroids=2, chunk=4,
                                       kmeans_iters=2)),
          "kivi": dict(config=KIVIConfig(bits=2, group=4, block=8, residual=4))}


@pytest.mark.parametrize("name", ["dense", "qvg", "kivi"])
def test_layer_by_layer_equals_token_by_token_decoding(model, name):
    """On a cache whose result depends on when each token was quantized (QVG and KIVI flush
    whole chunks), layer-major evaluation gives token-major decoding's NLL."""
    m, tokens = model
    graphdef, params = nnx.split(m)
    backend = kvc.get_backend(name, **_LOSSY.get(name, {}))
    got, _ = budget_cache.teacher_forced_nll(graphdef, params, tokens, backend, P)
    want = float(_token_major_nll(graphdef, params, tokens, backend, P))
    np.testing.assert_allclose(float(got), want, rtol=2e-5)
    if name != "dense":  # the cache is lossy here: the comparison is not dense vs dense
        assert abs(want - _forward_nll(m, tokens, P)) > 1e-4 * abs(want)


def test_budgeted_and_stacked_layers_equal_token_by_token_decoding(model):
    m, tokens = model
    graphdef, params = nnx.split(m)
    keep = [jnp.ones((3, 2, P), bool).at[:, 0, 1:3].set(False),
            jnp.ones((3, 2, P), bool).at[:, 1, :2].set(False)]
    be = budget_cache.BudgetedKVCache()
    want = float(_token_major_nll(graphdef, params, tokens, be, P, keep))
    got, _ = budget_cache.teacher_forced_nll(graphdef, params, tokens, be, P, keep)
    np.testing.assert_allclose(float(got), want, rtol=2e-5)
    # the same weights with the layers stacked (scan_layers) give the same NLL
    cfg, sgraph, sparams = llama.scanned(m.cfg, params)
    stacked, _ = budget_cache.teacher_forced_nll(sgraph, sparams, tokens, be, P, keep)
    np.testing.assert_allclose(float(stacked), want, rtol=2e-5)


def test_the_byte_level_transformer_equals_token_by_token_decoding():
    cfg = TransformerConfig(vocab_size=V, max_len=16, d_model=32, num_layers=2, num_heads=4,
                            num_kv_heads=2, causal=True)
    m = Transformer(cfg, rngs=nnx.Rngs(1))
    graphdef, params = nnx.split(m)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, V, (2, L)), jnp.int32)
    backend = kvc.get_backend("kivi", **_LOSSY["kivi"])
    got, _ = budget_cache.teacher_forced_nll(graphdef, params, tokens, backend, P)
    np.testing.assert_allclose(float(got), float(_token_major_nll(graphdef, params, tokens, backend, P)),
                               rtol=2e-5)


def test_keep_masks_must_match_the_layers(model):
    m, tokens = model
    graphdef, params = nnx.split(m)
    with pytest.raises(ValueError, match="1 keep masks for 2 layers"):
        budget_cache.teacher_forced_nll(graphdef, params, tokens, budget_cache.BudgetedKVCache(),
                                        P, [jnp.ones((3, 2, P), bool)])


def test_a_sliding_window_shorter_than_the_tokens_is_refused():
    cfg = LlamaConfig(vocab_size=V, max_len=16, d_model=32, num_layers=2, num_heads=4,
                      num_kv_heads=2, mlp_dim=48, layer_windows=(None, 6))
    graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(0)))
    tokens = jnp.zeros((1, L), jnp.int32)
    with pytest.raises(ValueError, match="sliding window of 6 tokens, shorter than the 12-token"):
        budget_cache.teacher_forced_nll(graphdef, params, tokens, cache_backend.DENSE, P)
    # a window no shorter than the positions it would cut is no window: accepted, and exact
    total, _ = budget_cache.teacher_forced_nll(graphdef, params, tokens[:, :7],
                                               cache_backend.DENSE, 3)
    np.testing.assert_allclose(float(total), _forward_nll(nnx.merge(graphdef, params),
                                                          tokens[:, :7], 3), rtol=1e-5)
