"""Bad input at the public model entry points (KV cache, sampling, Llama) gives one clear
ValueError naming the argument, before XLA sees it.

Each case is (callable, args, kwargs, message fragment). A tiny Transformer and Llama (V=32,
E=32, 2 layers, H=4, K=2, D=8, max_len 16) serve as the models.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import kv_cache as kvc
from models import sampling
from models.llama import Llama, LlamaConfig
from models.transformer import Transformer, TransformerConfig

B, K, H, D, S = 2, 2, 4, 8, 16
_rng = np.random.default_rng(0)


def _f32(*shape):
    return jnp.asarray(_rng.standard_normal(shape), jnp.float32)


DENSE = kvc.DenseKVCache()
CACHE = DENSE.init(B, S, K, D, jnp.float32)
KNEW, VNEW = _f32(B, K, 3, D), _f32(B, K, 3, D)
Q4 = _f32(B, H, 1, D)
START = jnp.array([0, 2], jnp.int32)

TCFG = TransformerConfig(vocab_size=32, max_len=S, d_model=32, num_layers=2, num_heads=H,
                         num_kv_heads=K)
TGRAPH, TPARAMS = nnx.split(Transformer(TCFG, rngs=nnx.Rngs(0)))
LCFG = LlamaConfig(vocab_size=32, max_len=S, d_model=32, num_layers=2, num_heads=H,
                   num_kv_heads=K, mlp_dim=64)
LLAMA = Llama(LCFG, rngs=nnx.Rngs(0))
LCACHE = LLAMA.init_cache(B)
PROMPT = jnp.array([[1, 2, 3], [4, 5, 6]], jnp.int32)
KEY = jax.random.key(0)


def _generate(prompt, **kw):
    kw.setdefault("max_new_tokens", 2)
    return sampling.generate(TGRAPH, TPARAMS, prompt, KEY, **kw)


def _cases():
    c = []

    def add(fn, args, kwargs, frag, id_):
        c.append(pytest.param(fn, args, kwargs, frag, id=id_))

    # -- kv_cache -----------------------------------------------------------------------------
    add(DENSE.init, (-1, S, K, D, jnp.float32), {}, "batch_size must", "Dense.init-negative-batch")
    add(DENSE.init, (B, 0, K, D, jnp.float32), {}, "max_len must", "Dense.init-zero-capacity")
    add(DENSE.init, (B, S, K, D, jnp.int32), {}, "dtype must", "Dense.init-int-dtype")
    add(DENSE.update, (CACHE, KNEW, VNEW, jnp.int32(0)), {}, "start must", "Dense.update-scalar")
    add(DENSE.update, (CACHE, KNEW, VNEW, START.astype(jnp.float32)), {}, "start must",
        "Dense.update-float-start")
    add(DENSE.update, (CACHE, KNEW, _f32(B, K, 2, D), START), {}, "v must",
        "Dense.update-v-shape")
    add(DENSE.update, (CACHE, _f32(B, K, 3, 16), _f32(B, K, 3, 16), START), {}, "k must",
        "Dense.update-head-dim")
    add(DENSE.update, (CACHE, KNEW, VNEW, jnp.array([0, 14], jnp.int32)), {}, "start must",
        "Dense.update-beyond-capacity")
    add(DENSE.attend, (CACHE, Q4, jnp.int32(3)), {}, "start must", "Dense.attend-scalar")
    add(DENSE.attend, (CACHE, Q4[:, :, 0], START), {}, "q must", "Dense.attend-rank3")
    add(DENSE.attend, (CACHE, _f32(B, 3, 1, D), START), {}, "query heads", "Dense.attend-heads")
    add(DENSE.attend, (CACHE, Q4, jnp.array([0, 16], jnp.int32)), {}, "start must",
        "Dense.attend-beyond-capacity")
    add(kvc.grouped_attention, (Q4[0], CACHE["k"], CACHE["v"], True), {}, "q must",
        "grouped_attention-rank3-q")
    add(kvc.grouped_attention, (Q4, CACHE["k"], CACHE["v"][:, :, :8], True), {}, "v must",
        "grouped_attention-kv-mismatch")
    add(kvc.grouped_attention, (_f32(B, 3, 1, D), CACHE["k"], CACHE["v"], True), {},
        "query heads", "grouped_attention-heads")
    add(kvc.get_backend, ("bogus",), {}, "unknown KV-cache backend", "get_backend-unknown")
    add(kvc.get_backend, ("ffd",), {"bogus_option": 1}, "bogus_option", "get_backend-bad-kwarg")

    # -- sampling -------------------------------------------------------------------------------
    add(sampling.sample_logits, (KEY, _f32(B, 32), -1.0), {}, "temperature must",
        "sample_logits-negative-temperature")
    add(sampling.sample_logits, (KEY, _f32(B, 32), float("nan")), {}, "temperature must",
        "sample_logits-nan-temperature")
    add(sampling.sample_logits, (KEY, jnp.ones((B, 32), jnp.int32), 1.0), {}, "logits must",
        "sample_logits-int-logits")
    add(_generate, (PROMPT.astype(jnp.float32),), {}, "prompt must", "generate-float-prompt")
    add(_generate, (PROMPT[0],), {}, "prompt must", "generate-rank1-prompt")
    add(_generate, (PROMPT[:, :0],), {}, "prompt must", "generate-empty-prompt")
    add(_generate, (PROMPT[:0],), {}, "prompt must", "generate-empty-batch")
    add(_generate, (PROMPT,), {"temperature": -1.0}, "temperature must",
        "generate-negative-temperature")
    add(_generate, (PROMPT,), {"max_new_tokens": 0}, "max_new_tokens", "generate-zero-new")
    add(_generate, (PROMPT,), {"max_new_tokens": 2.0}, "max_new_tokens", "generate-float-new")
    add(_generate, (PROMPT,), {"banned_ids": (99,)}, "banned_ids", "generate-banned-out-of-range")
    add(_generate, (PROMPT,), {"backend": "dense"}, "backend must", "generate-backend-string")
    add(_generate, (jnp.array([[1, 2, 40], [0, 1, 2]], jnp.int32),), {}, "prompt must",
        "generate-prompt-id-out-of-vocab")
    add(_generate, (jnp.array([[1, 2, -1], [0, 1, 2]], jnp.int32),), {}, "prompt must",
        "generate-prompt-negative-id")

    # -- llama ----------------------------------------------------------------------------------
    add(LLAMA, (PROMPT.astype(jnp.float32),), {}, "tokens must", "Llama-float-tokens")
    add(LLAMA, (PROMPT[:, :0],), {}, "tokens must", "Llama-empty-tokens")
    add(LLAMA, (jnp.array([[1, 2, 40]], jnp.int32),), {}, "tokens must", "Llama-id-out-of-vocab")
    add(LLAMA, (PROMPT,), {"positions": jnp.zeros((B, 2), jnp.int32)}, "positions must",
        "Llama-positions-shape")
    add(LLAMA.init_cache, (0,), {}, "batch_size must", "Llama.init_cache-zero-batch")
    add(LLAMA.init_cache, (B, -4), {}, "max_len must", "Llama.init_cache-negative-len")
    add(LLAMA.decode, (PROMPT, LCACHE, jnp.zeros((3,), jnp.int32)), {}, "start must",
        "Llama.decode-start-batch")
    add(LLAMA.decode, (PROMPT, LCACHE, jnp.zeros((B,), jnp.float32)), {}, "start must",
        "Llama.decode-float-start")
    add(LLAMA.decode, (PROMPT, LCACHE, jnp.array([0, 15], jnp.int32)), {}, "start must",
        "Llama.decode-beyond-capacity")
    add(LLAMA.decode, (PROMPT.astype(jnp.float32), LCACHE, START), {}, "tokens must",
        "Llama.decode-float-tokens")
    add(LlamaConfig, (), dict(vocab_size=32, max_len=S, d_model=32, num_layers=2, num_heads=H,
                              num_kv_heads=K, mlp_dim=64.5), "mlp_dim must", "LlamaConfig-float-mlp")
    add(LlamaConfig, (), dict(vocab_size="32", max_len=S, d_model=32, num_layers=2, num_heads=H,
                              num_kv_heads=K, mlp_dim=64), "vocab_size must",
        "LlamaConfig-string-vocab")
    add(LlamaConfig, (), dict(vocab_size=32, max_len=S, d_model=32, num_layers=2, num_heads=H,
                              num_kv_heads=K, mlp_dim=64, norm_eps=-1.0), "norm_eps must",
        "LlamaConfig-negative-eps")
    add(LlamaConfig, (), dict(vocab_size=32, max_len=S, d_model=32, num_layers=2, num_heads=H,
                              num_kv_heads=K, mlp_dim=64, dtype=jnp.int32), "dtype must",
        "LlamaConfig-int-dtype")
    return c


CASES = _cases()


@pytest.mark.parametrize("fn, args, kwargs, fragment", CASES)
def test_bad_input_is_one_clear_value_error(fn, args, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        fn(*args, **kwargs)


def test_good_input_still_passes_the_checks():
    cache = DENSE.update(CACHE, KNEW, VNEW, START)
    assert DENSE.attend(cache, Q4, START + 3).shape == Q4.shape
    toks, logps = _generate(PROMPT, temperature=0.0)
    assert toks.shape == (B, 2) and logps.shape == (B, 2)
    logits, _ = LLAMA.decode(PROMPT, LCACHE, jnp.zeros((B,), jnp.int32))
    assert logits.shape == (B, 3, LCFG.vocab_size)
    assert sampling.sample_logits(KEY, _f32(B, 32), 0.0).dtype == jnp.int32
