"""Policy rollouts with the KV cache, per-token log-probs, and completion masks.

Dimensions: R rollouts, P prompt length, T max new tokens, V vocabulary.

Sampling is a jitted prefill of the prompts followed by a ``lax.scan`` of single-token decode
steps through the transformer's KV cache (as :func:`models.sampling.generate`), but a row stops at
the end token: later positions are filled with the end token and masked out, so the loss and the
KL see each completion exactly up to and including its first end token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import kv_cache as kvc


def completion_mask(tokens: jax.Array, end_id: int) -> jax.Array:
    """bool [R, T]: True at positions up to and including the first ``end_id`` (all True for a
    row without an end token, i.e. a truncated completion)."""
    is_end = (tokens == end_id).astype(jnp.int32)
    ends_before = jnp.cumsum(is_end, axis=1) - is_end  # end tokens strictly before t
    return ends_before == 0


def rollout(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array, key: jax.Array, *,
            max_new_tokens: int, end_id: int, temperature: float = 1.0,
            backend: kvc.KVCacheBackend = kvc.DENSE) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Samples completions of ``prompts`` until the end token or ``max_new_tokens``.

    Traceable (call it inside ``jit``/``vmap``; ``graphdef``, ``max_new_tokens``, ``end_id``,
    ``temperature`` and ``backend`` are static).

    Args:
      graphdef, params: a causal :class:`models.transformer.Transformer`, split with nnx.
      prompts: int32 [R, P].
      key: PRNG key.
      max_new_tokens: T >= 1, with P + T <= the model's max_len.
      end_id: the end token; sampling of a row stops after it.
      temperature: sampling temperature (> 0); log-probs are under the temperature-1 policy.
      backend: KV-cache backend.

    Returns:
      (tokens int32 [R, T] (end_id after the end), logp float32 [R, T] of the sampled tokens under
      the temperature-1 policy, mask bool [R, T] from :func:`completion_mask`).

    Raises:
      ValueError: T < 1, P + T > max_len, or temperature <= 0.
    """
    if max_new_tokens < 1 or not temperature > 0:
        raise ValueError(f"rollout: need max_new_tokens >= 1 and temperature > 0, got "
                         f"{max_new_tokens}, {temperature}")
    model = nnx.merge(graphdef, params)
    r, p = prompts.shape
    if p + max_new_tokens > model.cfg.max_len:
        raise ValueError(f"rollout: prompt length {p} + {max_new_tokens} new tokens exceeds "
                         f"max_len={model.cfg.max_len}")
    cache = model.init_cache(r, p + max_new_tokens, backend)
    logits, cache = model.decode(prompts, cache, jnp.zeros((r,), jnp.int32), backend)

    def body(carry, key_t):
        cache, last, pos, done = carry
        tok = jax.random.categorical(key_t, last / temperature, axis=-1).astype(jnp.int32)
        tok = jnp.where(done, end_id, tok)
        logp = jnp.take_along_axis(jax.nn.log_softmax(last), tok[:, None], axis=-1)[:, 0]
        logits, cache = model.decode(tok[:, None], cache, pos, backend)
        return (cache, logits[:, 0], pos + 1, done | (tok == end_id)), (tok, logp)

    init = (cache, logits[:, -1], jnp.full((r,), p, jnp.int32), jnp.zeros((r,), bool))
    _, (toks, logps) = jax.lax.scan(body, init, jax.random.split(key, max_new_tokens))
    toks, logps = toks.T, logps.T
    return toks, logps, completion_mask(toks, end_id)


def completion_logprobs(model: nnx.Module, prompts: jax.Array, completions: jax.Array
                        ) -> jax.Array:
    """Teacher-forced log-probs of ``completions`` [R, T] after ``prompts`` [R, P]: float32 [R, T].

    One full forward pass over the P + T - 1 input tokens (differentiable in the parameters).
    """
    p = prompts.shape[1]
    seq = jnp.concatenate([prompts, completions], axis=1)
    logits = model(seq[:, :-1])[:, p - 1:]
    return jnp.take_along_axis(jax.nn.log_softmax(logits), completions[..., None], axis=-1)[..., 0]
