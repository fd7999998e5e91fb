"""Rotary position embeddings (RoPE; Su et al. 2021, "RoFormer", Sec. 3.4.2), half-split form.

Dimensions: B batch, L positions, N heads, D head dim (even).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_angles(positions: jax.Array, head_dim: int, base: float = 10_000.0) -> jax.Array:
    """Rotation angles [..., D/2] (radians) for integer ``positions`` [...]:
    ``pos * base^(-2i/D)``."""
    inv_freq = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    return positions.astype(jnp.float32)[..., None] * inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotates pairs (x_i, x_{i+D/2}) of ``x`` [B, L, N, D] by the angles of ``positions`` [B, L].

    The map is orthogonal, so ``apply_rope(apply_rope(x, p), -p) == x`` up to rounding, and
    ``<R_p q, R_s k>`` depends on ``p - s`` only. Returns an array of ``x``'s dtype.
    """
    d = x.shape[-1]
    ang = rope_angles(positions, d, base)[:, :, None, :]  # [B, L, 1, D/2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
