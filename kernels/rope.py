"""RoPE (Su et al. 2021, "RoFormer", Sec. 3.4.2), half-split form: the rotation the models and the
KV-cache kernels apply.

Dimensions: B batch, L positions, N heads, K kv heads, S cache slots, D head dim (even).

The frequencies are a float base or any object with an ``inv_freq(head_dim)`` method
(``models.rope.RotaryEmbedding``, which adds the context-extension rescalings).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def is_rope_frequencies(base: Any) -> bool:
    """True for an object that supplies RoPE frequencies (an ``inv_freq(head_dim)`` method, e.g.
    ``models.rope.RotaryEmbedding``) rather than a plain float base."""
    return callable(getattr(base, "inv_freq", None))


def rope_angles(positions: jax.Array, head_dim: int, base: Any = 10_000.0) -> jax.Array:
    """Rotation angles float32 [..., D/2] (radians) for integer ``positions`` [...]:
    ``pos * base^(-2i/D)``, or ``pos * base.inv_freq(D)`` when ``base`` supplies frequencies
    (:func:`is_rope_frequencies`)."""
    if is_rope_frequencies(base):
        inv_freq = jnp.asarray(base.inv_freq(head_dim))
    else:
        inv_freq = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    return positions.astype(jnp.float32)[..., None] * inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, base: Any = 10_000.0) -> jax.Array:
    """Rotates pairs (x_i, x_{i+D/2}) of ``x`` [B, L, N, D] by the angles of ``positions`` [B, L].

    The map is orthogonal, so ``apply_rope(apply_rope(x, p), -p) == x`` up to rounding, and
    ``<R_p q, R_s k>`` depends on ``p - s`` only. YaRN's ``attention_scale`` is not applied here
    (the rotation stays orthogonal and invertible); models multiply the queries by its square.
    Returns an array of ``x``'s dtype (computed in float32).
    """
    d = x.shape[-1]
    ang = rope_angles(positions, d, base)[:, :, None, :]  # [B, L, 1, D/2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rope_slots(k: jax.Array, base: Any, offset: jax.Array | int = 0, sign: int = 1) -> jax.Array:
    """RoPE on cache-layout keys ``k [B, K, S, D]`` at positions ``offset + 0 .. S-1`` (``offset``
    int or int [B]); ``sign=-1`` undoes it. Returns ``k``'s dtype."""
    b, _, s, _ = k.shape
    pos = jnp.broadcast_to(jnp.asarray(offset, jnp.int32).reshape(-1, 1) + jnp.arange(s), (b, s))
    return apply_rope(k.transpose(0, 2, 1, 3), sign * pos, base).transpose(0, 2, 1, 3)
