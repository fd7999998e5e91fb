"""models.capture: per-layer attention inputs of the Transformer and Llama decoders."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import capture
from models import llama as llama_lib
from models.llama import Llama, LlamaConfig
from models.rope import RotaryEmbedding
from models.transformer import Transformer, TransformerConfig, stack_layer_params

V = 37


def _transformer(**kw):
    cfg = TransformerConfig(**{**dict(vocab_size=V, max_len=32, d_model=32, num_layers=2,
                                      num_heads=4, num_kv_heads=2), **kw})
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _llama():
    # YaRN: the queries carry the attention factor squared, as the model's attention does
    cfg = LlamaConfig(vocab_size=V, max_len=32, d_model=32, num_layers=3, num_heads=4,
                      num_kv_heads=1, mlp_dim=48, qkv_bias=True,
                      rope=RotaryEmbedding(theta=500.0, kind="yarn", factor=4.0,
                                           original_max_len=8))
    return Llama(cfg, rngs=nnx.Rngs(1))


MODELS = {"transformer": _transformer, "llama": _llama}


def _scanned(model):
    """The same model with its layers stacked and scanned (``scan_layers=True``)."""
    _, params = nnx.split(model)
    if isinstance(model, Llama):
        _, graphdef, stacked = llama_lib.scanned(model.cfg, params)
    else:
        graphdef = nnx.graphdef(_transformer(scan_layers=True))
        stacked = stack_layer_params(params)
    return nnx.merge(graphdef, stacked)


@pytest.mark.parametrize("name", MODELS)
def test_scanned_layers_capture_what_unrolled_layers_do(name):
    """One lax.scan over stacked layers returns every layer's q, k, v, as the Python loop does
    (float32 rounding of a differently fused program apart)."""
    model = MODELS[name]()
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, V, (2, 16)), jnp.int32)
    want = capture.attention_inputs(model, tokens)
    got = capture.attention_inputs(_scanned(model), tokens)
    assert len(got) == len(want) == model.cfg.num_layers
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(jnp.abs(b).max()))


@pytest.mark.parametrize("name", MODELS)
def test_keys_and_values_are_what_the_dense_cache_stores(name):
    model = MODELS[name]()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 24)), jnp.int32)
    graphdef, params = nnx.split(model)
    got = capture.capture_attention_inputs(graphdef, params, tokens)
    cache = model.init_cache(2, 24)
    _, cache = model.decode(tokens, cache, jnp.zeros((2,), jnp.int32))
    cfg = model.cfg
    assert len(got) == cfg.num_layers
    for (q, k, v), layer in zip(got, cache, strict=True):
        assert q.shape == (2, cfg.num_heads, 24, cfg.dim_per_head)
        assert k.shape == v.shape == (2, cfg.kv_heads, 24, cfg.dim_per_head)
        for a, b in ((k, layer["k"]), (v, layer["v"])):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(jnp.abs(b).max()))


@pytest.mark.parametrize("name", MODELS)
def test_captures_are_causal(name):
    """Captures of a prefix are the prefix of the captures (no position sees a later token)."""
    model = MODELS[name]()
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, V, (1, 20)), jnp.int32)
    full = capture.attention_inputs(model, tokens)
    head = capture.attention_inputs(model, tokens[:, :9])
    changed = capture.attention_inputs(model, tokens.at[:, 9:].set((tokens[:, 9:] + 1) % V))
    for f, h, c in zip(full, head, changed, strict=True):
        for a, b, x in zip(f, h, c, strict=True):
            scale = float(jnp.abs(a).max())
            np.testing.assert_allclose(a[:, :, :9], b, rtol=0, atol=1e-5 * scale)
            np.testing.assert_allclose(x[:, :, :9], b, rtol=0, atol=1e-5 * scale)
    # and the later tokens do matter after the first layer's inputs
    assert float(jnp.abs(changed[-1][0][:, :, 9:] - full[-1][0][:, :, 9:]).max()) > 1e-3


def test_rope_and_refusals():
    llama, tf = _llama(), _transformer(rope_base=123.0)
    assert capture.model_rope(llama.cfg) == llama.cfg.rope
    assert capture.model_rope(tf.cfg) == 123.0
    with pytest.raises(ValueError, match="neither a 'rope' nor a 'rope_base'"):
        capture.model_rope(object())
    with pytest.raises(ValueError, match=r"tokens must be \[B, L\]"):
        capture.attention_inputs(tf, jnp.zeros((4,), jnp.int32))
    with pytest.raises(ValueError, match="exceeds the model's max_len=32"):
        capture.attention_inputs(tf, jnp.zeros((1, 33), jnp.int32))
