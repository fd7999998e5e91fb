"""Policy rollouts with the KV cache, per-token log-probs, and completion masks.

Dimensions: R rollouts, G distinct prompts, Lp prompt length, T max new tokens, V vocabulary.

Sampling is a jitted prefill of the prompts followed by a ``lax.scan`` of single-token decode
steps through the transformer's KV cache (as :func:`models.sampling.generate`), but a row stops at
the end token: later positions are filled with the end token and masked out, so the loss and the
KL see each completion exactly up to and including its first end token.

Shared prompts. GRPO samples n completions of each prompt, so a batch of R rollouts holds only
G = R / n distinct prompts. Both :func:`rollout` and :func:`completion_logprobs` accept the G
distinct prompts with ``prompt_rows`` int32 [R] (the prompt of each rollout): the prompts are
prefilled once into a KV cache of G rows, the cache rows are gathered to R rows, and only the
completion tokens run per rollout (prefix sharing, as in vLLM's prefix caching, Kwon et al. 2023,
Sec. 4.4). The log-probabilities are the same numbers as those of the full forward pass over the
repeated prompts (the same per-position arithmetic; their gradients agree to float32 rounding), at
G Lp + R T instead of R (Lp + T) token positions (with Lp = 10, T = 4 and n = 4, 2x fewer).

Temperature. Sampling at temperature tau draws from pi_tau = softmax(logits / tau), and every
log-prob here is log pi_tau, so that the policy-gradient loss sees the policy that produced the
samples (the behaviour, current and reference log-probs of GRPO alike; at tau != 1 the
temperature-1 log-probs differ from the sampling policy's by nats and make the importance ratio
differ from 1 on-policy). TRL, verl and open-instruct divide the training logits by the rollout
temperature in the same way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from core import sampling
from kernels import cache_backend


def completion_mask(tokens: jax.Array, end_id: int) -> jax.Array:
    """bool [R, T]: True at positions up to and including the first ``end_id`` (all True for a
    row without an end token, i.e. a truncated completion)."""
    is_end = (tokens == end_id).astype(jnp.int32)
    ends_before = jnp.cumsum(is_end, axis=1) - is_end  # end tokens strictly before t
    return ends_before == 0


def _check_rows(prompts: jax.Array, prompt_rows: jax.Array | None, where: str) -> int:
    """The number of rollouts R (``prompt_rows`` [R] indexes the G rows of ``prompts`` [G, Lp])."""
    if prompt_rows is None:
        return prompts.shape[0]
    if prompt_rows.ndim != 1 or not jnp.issubdtype(prompt_rows.dtype, jnp.integer):
        raise ValueError(f"{where}: prompt_rows must be an int array [R], got {prompt_rows.dtype}"
                         f"{list(prompt_rows.shape)}")
    return prompt_rows.shape[0]


def _gather_rows(cache, prompt_rows: jax.Array | None):
    """The cache of G prompts expanded to one row per rollout (rows ``prompt_rows``)."""
    if prompt_rows is None:
        return cache
    return jax.tree.map(lambda a: jnp.take(a, prompt_rows, axis=0), cache)


def rollout(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array, key: jax.Array, *,
            max_new_tokens: int, end_id: int, temperature: float = 1.0,
            backend: cache_backend.KVCacheBackend = cache_backend.DENSE,
            prompt_rows: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Samples completions of ``prompts`` until the end token or ``max_new_tokens``.

    Traceable (call it inside ``jit``/``vmap``; ``graphdef``, ``max_new_tokens``, ``end_id``,
    ``temperature`` and ``backend`` are static).

    Args:
      graphdef, params: a causal :class:`models.transformer.Transformer`, split with nnx.
      prompts: int32 [R, Lp], or the G distinct prompts [G, Lp] with ``prompt_rows``.
      key: PRNG key.
      max_new_tokens: T >= 1, with Lp + T <= the model's max_len.
      end_id: the end token; sampling of a row stops after it.
      temperature: sampling temperature tau (> 0); tokens are drawn from softmax(logits / tau)
        exactly (:func:`core.sampling.categorical`: no float32 Gumbel truncation of tokens below
        about 1e-7 of the most likely one) and their log-probs are under that policy.
      backend: KV-cache backend (its layer cache must be a pytree of arrays with a leading batch
        axis when ``prompt_rows`` is given).
      prompt_rows: optional int32 [R] with values in [0, G): the prompt of each rollout. The
        prompts are then prefilled once (G rows) and the cache gathered to R rows; the samples
        are those of ``rollout(prompts[prompt_rows])`` with the same key.

    Returns:
      (tokens int32 [R, T] (end_id after the end), logp float32 [R, T] of the sampled tokens under
      the sampling policy, log softmax(logits / tau), mask bool [R, T] from
      :func:`completion_mask`).

    Raises:
      ValueError: T < 1, Lp + T > max_len, temperature <= 0, or ``prompt_rows`` not an int
        vector.
    """
    if max_new_tokens < 1 or not temperature > 0:
        raise ValueError(f"rollout: need max_new_tokens >= 1 and temperature > 0, got "
                         f"{max_new_tokens}, {temperature}")
    model = nnx.merge(graphdef, params)
    g, p = prompts.shape
    r = _check_rows(prompts, prompt_rows, "rollout")
    if p + max_new_tokens > model.cfg.max_len:
        raise ValueError(f"rollout: prompt length {p} + {max_new_tokens} new tokens exceeds "
                         f"max_len={model.cfg.max_len}")
    cache = model.init_cache(g, p + max_new_tokens, backend)
    logits, cache = model.decode(prompts, cache, jnp.zeros((g,), jnp.int32), backend)
    logits, cache = logits[:, -1], _gather_rows(cache, prompt_rows)
    if prompt_rows is not None:
        logits = logits[prompt_rows]

    def body(carry, key_t):
        cache, last, pos, done = carry
        scaled = last / temperature
        tok = sampling.categorical(key_t, scaled)
        tok = jnp.where(done, end_id, tok)
        logp = jnp.take_along_axis(jax.nn.log_softmax(scaled), tok[:, None], axis=-1)[:, 0]
        logits, cache = model.decode(tok[:, None], cache, pos, backend)
        cache = model.flush_cache(cache, backend)  # QVG / KIVI: chunk quantization
        return (cache, logits[:, 0], pos + 1, done | (tok == end_id)), (tok, logp)

    init = (cache, logits, jnp.full((r,), p, jnp.int32), jnp.zeros((r,), bool))
    _, (toks, logps) = jax.lax.scan(body, init, jax.random.split(key, max_new_tokens))
    toks, logps = toks.T, logps.T
    return toks, logps, completion_mask(toks, end_id)


def completion_logprobs(model: nnx.Module, prompts: jax.Array, completions: jax.Array,
                        prompt_rows: jax.Array | None = None, temperature: float = 1.0
                        ) -> jax.Array:
    """Teacher-forced log-probs of ``completions`` [R, T] after their prompts: float32 [R, T],
    log softmax(logits / ``temperature``) of each completion token (pass the rollout's sampling
    temperature to get the sampling policy's log-probs, as :func:`rollout` returns them).

    Without ``prompt_rows``, ``prompts`` is [R, Lp] and this is one full forward pass over the
    Lp + T - 1 input tokens. With ``prompt_rows`` int32 [R] (values in [0, G)), ``prompts`` holds
    the G distinct prompts [G, Lp]: they are prefilled once through the dense KV cache and the
    T - 1 completion inputs of every rollout attend to their prompt's cache rows (see the module
    docstring); the result equals the full pass over ``prompts[prompt_rows]``. Differentiable in
    the parameters either way.

    Raises:
      ValueError: ``prompt_rows`` not an int vector of length R, Lp + T - 1 > max_len, or
        ``temperature`` not > 0.
    """
    if not temperature > 0:
        raise ValueError(f"completion_logprobs: temperature={temperature}: expected > 0")
    g, p = prompts.shape
    if prompt_rows is None:
        seq = jnp.concatenate([prompts, completions], axis=1)
        logits = model(seq[:, :-1])[:, p - 1:]
    else:
        r = _check_rows(prompts, prompt_rows, "completion_logprobs")
        if completions.shape[0] != r:
            raise ValueError(f"completion_logprobs: completions has {completions.shape[0]} rows, "
                             f"prompt_rows {r}")
        t = completions.shape[1]
        cache = model.init_cache(g, p + t - 1)
        first, cache = model.decode(prompts, cache, jnp.zeros((g,), jnp.int32))
        rest, _ = model.decode(completions[:, :-1], _gather_rows(cache, prompt_rows),
                               jnp.full((r,), p, jnp.int32))
        logits = jnp.concatenate([first[prompt_rows, -1:], rest], axis=1)
    logp = jax.nn.log_softmax(logits / temperature)
    return jnp.take_along_axis(logp, completions[..., None], axis=-1)[..., 0]
