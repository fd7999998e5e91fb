"""The queries, keys and values each attention layer of a causal decoder sees, for measurements.

Dimensions: B batch, L sequence length, H query heads, K kv heads (GQA: H = G * K), D head dim,
N layers.

Works on any decoder with the interface shared by :class:`models.transformer.Transformer` (causal,
unconditioned) and :class:`models.llama.Llama`: ``model.embed``, ``model.blocks`` (a list, or with
``cfg.scan_layers`` one module with stacked parameters, applied in one ``lax.scan``) whose blocks
have ``norm1``, ``attn.qkv(x, positions)`` and ``block(x, positions, mask)``. The captured
tensors come from the same computation as the forward pass, so attention over them
(``softmax(q k^T / sqrt(D)) v`` under the causal mask) is exactly what each layer attends to: the
keys and values are the ones a dense KV cache stores after prefill.

Measuring sparse or quantized KV caches on these captures (kept softmax mass, attention-output
error) needs nothing else from the model. Sliding windows (Mistral, Qwen2) are not applied to the
captures: the caller that attends over them decides the mask.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models.rope import RotaryEmbedding


def model_rope(cfg: Any) -> float | RotaryEmbedding:
    """The RoPE a decoder config applies: ``LlamaConfig.rope`` (theta and scaling) or
    ``TransformerConfig.rope_base`` (a base frequency). Either is accepted as the ``base`` of
    :func:`kernels.rope.apply_rope` and as a QVG cache's ``rope_base``.

    Raises:
      ValueError: ``cfg`` has neither attribute.
    """
    if isinstance(getattr(cfg, "rope", None), RotaryEmbedding):
        return cfg.rope
    if hasattr(cfg, "rope_base"):
        return cfg.rope_base
    raise ValueError(f"model_rope: {type(cfg).__name__} has neither a 'rope' nor a 'rope_base' "
                     "field; expected a TransformerConfig or a LlamaConfig")


def attention_inputs(model: Any, tokens: jax.Array) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """Per layer, the (q, k, v) that layer's attention uses in the causal forward pass.

    Traceable (call it under ``jax.jit``; :func:`capture_attention_inputs` is the jitted form).

    Args:
      model: a merged decoder (see the module docstring).
      tokens: int [B, L], L <= the model's ``max_len``; positions are 0..L-1.

    Returns:
      N tuples: q [B, H, L, D] (RoPE applied; a Llama with YaRN also multiplies by its attention
      factor squared, as its attention does), k [B, K, L, D] (RoPE applied), v [B, K, L, D], in
      the model's computation dtype.

    Raises:
      ValueError: tokens not [B, L] or longer than ``max_len``.
    """
    if tokens.ndim != 2:
        raise ValueError(f"attention_inputs: tokens must be [B, L] integers, got shape "
                         f"{tokens.shape}")
    b, l = tokens.shape
    if l > model.cfg.max_len:
        raise ValueError(f"attention_inputs: sequence length {l} exceeds the model's "
                         f"max_len={model.cfg.max_len}")
    positions = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    mask = jnp.tril(jnp.ones((l, l), bool))[None]
    x = model.embed(tokens)
    if getattr(model.cfg, "scan_layers", False):
        block_def, block_params = nnx.split(model.blocks)

        def layer(h, params):
            block = nnx.merge(block_def, params)
            return block(h, positions, mask), block.attn.qkv(block.norm1(h), positions)

        _, (q, k, v) = jax.lax.scan(layer, x, block_params)
        return [(q[i], k[i], v[i]) for i in range(q.shape[0])]
    out = []
    for block in model.blocks:
        out.append(block.attn.qkv(block.norm1(x), positions))
        x = block(x, positions, mask)
    return out


@functools.partial(jax.jit, static_argnames=("graphdef",))
def capture_attention_inputs(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array
                             ) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """:func:`attention_inputs` of ``nnx.merge(graphdef, params)``, jitted (one compile per
    token shape)."""
    return attention_inputs(nnx.merge(graphdef, params), tokens)
