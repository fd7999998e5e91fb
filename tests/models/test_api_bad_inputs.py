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

from core.testing import BadInputs
from kernels import cache_backend
from kernels.attention_math import grouped_attention
from models import kv_cache as kvc
from models import sampling
from models.llama import Llama, LlamaConfig
from models.transformer import Transformer, TransformerConfig

B, K, H, D, S = 2, 2, 4, 8, 16
_rng = np.random.default_rng(0)


def _f32(*shape):
    return jnp.asarray(_rng.standard_normal(shape), jnp.float32)


DENSE = cache_backend.DenseKVCache()
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


CASES = BadInputs()
# -- kv_cache -----------------------------------------------------------------------------
CASES.add("Dense.init-negative-batch", DENSE.init, -1, S, K, D, jnp.float32, match="batch_size must")
CASES.add("Dense.init-zero-capacity", DENSE.init, B, 0, K, D, jnp.float32, match="max_len must")
CASES.add("Dense.init-int-dtype", DENSE.init, B, S, K, D, jnp.int32, match="dtype must")
CASES.add("Dense.update-scalar", DENSE.update, CACHE, KNEW, VNEW, jnp.int32(0), match="start must")
CASES.add("Dense.update-float-start", DENSE.update, CACHE, KNEW, VNEW, START.astype(jnp.float32), match="start must")
CASES.add("Dense.update-v-shape", DENSE.update, CACHE, KNEW, _f32(B, K, 2, D), START, match="v must")
CASES.add("Dense.update-head-dim", DENSE.update, CACHE, _f32(B, K, 3, 16), _f32(B, K, 3, 16), START, match="k must")
CASES.add("Dense.update-beyond-capacity", DENSE.update, CACHE, KNEW, VNEW, jnp.array([0, 14], jnp.int32),
          match="start must")
CASES.add("Dense.attend-scalar", DENSE.attend, CACHE, Q4, jnp.int32(3), match="start must")
CASES.add("Dense.attend-rank3", DENSE.attend, CACHE, Q4[:, :, 0], START, match="q must")
CASES.add("Dense.attend-heads", DENSE.attend, CACHE, _f32(B, 3, 1, D), START, match="query heads")
CASES.add("Dense.attend-beyond-capacity", DENSE.attend, CACHE, Q4, jnp.array([0, 16], jnp.int32), match="start must")
CASES.add("grouped_attention-rank3-q", grouped_attention, Q4[0], CACHE["k"], CACHE["v"], True, match="q must")
CASES.add("grouped_attention-kv-mismatch", grouped_attention, Q4, CACHE["k"], CACHE["v"][:, :, :8], True,
          match="v must")
CASES.add("grouped_attention-heads", grouped_attention, _f32(B, 3, 1, D), CACHE["k"], CACHE["v"], True,
          match="query heads")
CASES.add("get_backend-unknown", kvc.get_backend, "bogus", match="unknown KV-cache backend")
CASES.add("get_backend-bad-kwarg", kvc.get_backend, "ffd", match="bogus_option", bogus_option=1)

# -- sampling -------------------------------------------------------------------------------
CASES.add("sample_logits-negative-temperature", sampling.sample_logits, KEY, _f32(B, 32), -1.0,
          match="temperature must")
CASES.add("sample_logits-nan-temperature", sampling.sample_logits, KEY, _f32(B, 32), float("nan"),
          match="temperature must")
CASES.add("sample_logits-int-logits", sampling.sample_logits, KEY, jnp.ones((B, 32), jnp.int32), 1.0,
          match="logits must")
CASES.add("generate-float-prompt", _generate, PROMPT.astype(jnp.float32), match="prompt must")
CASES.add("generate-rank1-prompt", _generate, PROMPT[0], match="prompt must")
CASES.add("generate-empty-prompt", _generate, PROMPT[:, :0], match="prompt must")
CASES.add("generate-empty-batch", _generate, PROMPT[:0], match="prompt must")
CASES.add("generate-negative-temperature", _generate, PROMPT, match="temperature must", temperature=-1.0)
CASES.add("generate-zero-new", _generate, PROMPT, match="max_new_tokens", max_new_tokens=0)
CASES.add("generate-float-new", _generate, PROMPT, match="max_new_tokens", max_new_tokens=2.0)
CASES.add("generate-banned-out-of-range", _generate, PROMPT, match="banned_ids", banned_ids=(99,))
CASES.add("generate-backend-string", _generate, PROMPT, match="backend must", backend="dense")
CASES.add("generate-prompt-id-out-of-vocab", _generate, jnp.array([[1, 2, 40], [0, 1, 2]], jnp.int32),
          match="prompt must")
CASES.add("generate-prompt-negative-id", _generate, jnp.array([[1, 2, -1], [0, 1, 2]], jnp.int32), match="prompt must")

# -- llama ----------------------------------------------------------------------------------
CASES.add("Transformer-float-tokens", nnx.merge(TGRAPH, TPARAMS), PROMPT.astype(jnp.float32),
          match="Transformer.__call__: tokens must be an integer array, got dtype float32")
CASES.add("Transformer-rank1-tokens", nnx.merge(TGRAPH, TPARAMS), PROMPT[0], match="tokens must be an array of rank 2")
CASES.add("Transformer.decode-float-tokens", nnx.merge(TGRAPH, TPARAMS).decode, PROMPT.astype(jnp.float32),
          cache_backend.DenseKVCache().init(B, S, K, D, jnp.float32), START,
          match="Transformer.decode: tokens must")
CASES.add("Llama-float-tokens", LLAMA, PROMPT.astype(jnp.float32), match="tokens must")
CASES.add("Llama-empty-tokens", LLAMA, PROMPT[:, :0], match="tokens must")
CASES.add("Llama-id-out-of-vocab", LLAMA, jnp.array([[1, 2, 40]], jnp.int32), match="tokens must")
CASES.add("Llama-positions-shape", LLAMA, PROMPT, match="positions must", positions=jnp.zeros((B, 2), jnp.int32))
CASES.add("Llama.init_cache-zero-batch", LLAMA.init_cache, 0, match="batch_size must")
CASES.add("Llama.init_cache-negative-len", LLAMA.init_cache, B, -4, match="max_len must")
CASES.add("Llama.decode-start-batch", LLAMA.decode, PROMPT, LCACHE, jnp.zeros((3,), jnp.int32), match="start must")
CASES.add("Llama.decode-float-start", LLAMA.decode, PROMPT, LCACHE, jnp.zeros((B,), jnp.float32), match="start must")
CASES.add("Llama.decode-beyond-capacity", LLAMA.decode, PROMPT, LCACHE, jnp.array([0, 15], jnp.int32),
          match="start must")
CASES.add("Llama.decode-float-tokens", LLAMA.decode, PROMPT.astype(jnp.float32), LCACHE, START, match="tokens must")
CASES.add("LlamaConfig-float-mlp", LlamaConfig, match="mlp_dim must", vocab_size=32, max_len=S, d_model=32,
          num_layers=2, num_heads=H, num_kv_heads=K, mlp_dim=64.5)
CASES.add("LlamaConfig-string-vocab", LlamaConfig, match="vocab_size must", vocab_size="32", max_len=S, d_model=32,
          num_layers=2, num_heads=H, num_kv_heads=K, mlp_dim=64)
CASES.add("LlamaConfig-negative-eps", LlamaConfig, match="norm_eps must", vocab_size=32, max_len=S, d_model=32,
          num_layers=2, num_heads=H, num_kv_heads=K, mlp_dim=64, norm_eps=-1.0)
CASES.add("LlamaConfig-int-dtype", LlamaConfig, match="dtype must", vocab_size=32, max_len=S, d_model=32,
          num_layers=2, num_heads=H, num_kv_heads=K, mlp_dim=64, dtype=jnp.int32)


@pytest.mark.parametrize("case", CASES.params())
def test_bad_input_is_one_clear_value_error(case):
    case.check()


def test_good_input_still_passes_the_checks():
    cache = DENSE.update(CACHE, KNEW, VNEW, START)
    assert DENSE.attend(cache, Q4, START + 3).shape == Q4.shape
    toks, logps = _generate(PROMPT, temperature=0.0)
    assert toks.shape == (B, 2) and logps.shape == (B, 2)
    logits, _ = LLAMA.decode(PROMPT, LCACHE, jnp.zeros((B,), jnp.int32))
    assert logits.shape == (B, 3, LCFG.vocab_size)
    assert sampling.sample_logits(KEY, _f32(B, 32), 0.0).dtype == jnp.int32
