"""Language-model losses.

Dimensions: B batch, L sequence, V vocabulary.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax


def next_token_nll(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Per-position negative log-likelihood (nats) of ``tokens[:, 1:]`` given the prefix.

    Args:
      logits: float [B, L, V] from a causal model fed ``tokens``.
      tokens: int [B, L].

    Returns:
      float32 [B, L - 1].
    """
    return optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1].astype(jnp.float32), tokens[:, 1:])


def bits_per_byte(nll_nats_per_token: float, bytes_per_token: float = 1.0) -> float:
    """Converts mean NLL in nats per token to bits per byte (byte tokenizer: 1 byte per token)."""
    return nll_nats_per_token / math.log(2.0) / bytes_per_token
