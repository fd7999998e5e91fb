"""Autoregressive sampling with the KV cache (jitted prefill + ``lax.scan`` decode).

Dimensions: B batch, Lp prompt length, T new tokens, V vocabulary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core import sampling
from kernels import cache_backend, checks


def sample_logits(key: jax.Array, logits: jax.Array, temperature: float) -> jax.Array:
    """Samples ids from ``logits`` [..., V] at ``temperature`` (0 = greedy argmax). int32 [...].

    The draw is exact in float32 (:func:`core.sampling.categorical`): ``jax.random.categorical``'s
    default Gumbel noise never draws a token below about 1.4e-9 of the most likely one and
    under-samples those below about 1e-7.

    Raises:
      ValueError: ``logits`` not a float array of rank >= 1; a concrete ``temperature`` that is
        not a finite number >= 0.
    """
    checks.array(logits, "logits", "sample_logits", kind="float")
    if logits.ndim < 1:
        raise checks.error("sample_logits", "logits", "an array [..., V]", "a scalar")
    checks.number(temperature, "temperature", "sample_logits", minimum=0.0)
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return sampling.categorical(key, logits / temperature)


def generate(graphdef: nnx.GraphDef, params: nnx.State, prompt: jax.Array, key: jax.Array, *,
             max_new_tokens: int, temperature: float = 1.0,
             backend: cache_backend.KVCacheBackend = cache_backend.DENSE,
             banned_ids: tuple[int, ...] = ()) -> tuple[jax.Array, jax.Array]:
    """Samples ``max_new_tokens`` continuations of ``prompt`` with the KV cache.

    Args:
      graphdef, params: from ``nnx.split`` of a causal :class:`models.transformer.Transformer`.
      prompt: int32 [B, Lp], Lp >= 1.
      key: PRNG key.
      max_new_tokens: T >= 1; Lp + T must not exceed the model's ``max_len``.
      temperature: softmax temperature; 0 is greedy.
      backend: KV-cache backend (hashable, static).
      banned_ids: token ids never sampled (e.g. a tokenizer's BOS/MASK specials); their logits are
        set to -inf, so the model is renormalised over the other ids.

    Returns:
      (tokens int32 [B, T], log-probabilities float32 [B, T] of the sampled tokens under the
      temperature-1 model restricted to the allowed ids).

    Raises:
      ValueError: ``prompt`` not a non-empty int [B, Lp] or, when concrete, holding ids outside
        [0, vocab_size); ``max_new_tokens`` not an int >= 1; Lp + T exceeds ``max_len``;
        ``temperature`` not a finite number >= 0; ``backend`` not a KV-cache backend; a banned
        id outside [0, vocab_size) or every id banned. All before compiling.
    """
    where = "generate"
    checks.array(prompt, "prompt", where, ndim=2, kind="int", nonempty=True)
    checks.integer(max_new_tokens, "max_new_tokens", where, minimum=1)
    checks.number(temperature, "temperature", where, minimum=0.0, allow_traced=False)
    if not all(hasattr(backend, m) for m in ("init", "update", "attend")):
        raise checks.error(where, "backend", "a KV-cache backend (models.kv_cache.get_backend)",
                           repr(backend))
    vocab = getattr(getattr(graphdef, "cfg", None), "vocab_size", None)
    if vocab is None:  # the config lives on the module; merging is cheap next to sampling
        vocab = nnx.merge(graphdef, params).cfg.vocab_size
    if not checks.is_traced(prompt):
        ids = np.asarray(prompt)
        if ids.min() < 0 or ids.max() >= vocab:
            raise checks.error(where, "prompt", f"token ids in [0, {vocab})",
                               f"min {ids.min()}, max {ids.max()}")
    return _generate(graphdef, params, prompt, key, max_new_tokens=int(max_new_tokens),
                     temperature=temperature, backend=backend, banned_ids=tuple(banned_ids))


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature",
                                              "backend", "banned_ids"))
def _generate(graphdef, params, prompt, key, *, max_new_tokens, temperature, backend, banned_ids):
    model = nnx.merge(graphdef, params)
    b, p = prompt.shape
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    if p + max_new_tokens > model.cfg.max_len:
        raise ValueError(
            f"prompt length {p} + max_new_tokens {max_new_tokens} exceeds max_len={model.cfg.max_len}"
        )
    vocab = model.cfg.vocab_size
    if any(not 0 <= i < vocab for i in banned_ids) or len(set(banned_ids)) >= vocab:
        raise ValueError(f"banned_ids={banned_ids}: need ids in [0, {vocab}) and at least one "
                         "allowed id")
    allowed = jnp.ones((vocab,), bool).at[jnp.asarray(banned_ids, jnp.int32)].set(False) \
        if banned_ids else None

    def restrict(logits):
        return logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)

    cache = model.init_cache(b, p + max_new_tokens, backend)
    logits, cache = model.decode(prompt, cache, jnp.zeros((b,), jnp.int32), backend)
    last = restrict(logits[:, -1])

    def body(carry, key_t):
        cache, last, pos = carry
        tok = sample_logits(key_t, last, temperature)
        logp = jnp.take_along_axis(jax.nn.log_softmax(last), tok[:, None], axis=-1)[:, 0]
        logits, cache = model.decode(tok[:, None], cache, pos, backend)
        # the backend's work kept out of the one-token step (QVG / KIVI chunk quantization)
        cache = model.flush_cache(cache, backend)  # QVG / KIVI: chunk quantization
        return (cache, restrict(logits[:, 0]), pos + 1), (tok, logp)

    keys = jax.random.split(key, max_new_tokens)
    _, (toks, logps) = jax.lax.scan(body, (cache, last, jnp.full((b,), p, jnp.int32)), keys)
    return toks.T, logps.T
