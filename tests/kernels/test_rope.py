"""kernels.rope: RoPE invariants (orthogonal, relative) and frequency objects."""

import jax
import jax.numpy as jnp
import numpy as np

from kernels import rope


def test_rope_is_orthogonal_and_relative():
    x = jax.random.normal(jax.random.key(2), (1, 5, 2, 16))
    pos = jnp.arange(5)[None] * 37
    y = rope.apply_rope(x, pos)
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(rope.apply_rope(y, -pos), x, atol=1e-5)
    # <R_p q, R_s k> depends on p - s only
    q, k = x[:, :1], x[:, 1:2]
    a = jnp.sum(rope.apply_rope(q, jnp.array([[9]])) * rope.apply_rope(k, jnp.array([[4]])))
    b = jnp.sum(rope.apply_rope(q, jnp.array([[105]])) * rope.apply_rope(k, jnp.array([[100]])))
    np.testing.assert_allclose(a, b, rtol=1e-4)
    # rope_slots is apply_rope in the cache layout [B, K, S, D]
    kc = x.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(rope.rope_slots(kc, 10_000.0, 3),
                               rope.apply_rope(x, jnp.arange(3, 8)[None]).transpose(0, 2, 1, 3),
                               atol=1e-6)


def test_rope_accepts_a_frequency_object():
    class Half:
        def inv_freq(self, head_dim):
            return 0.5 * 10_000.0 ** (-np.arange(0, head_dim, 2) / head_dim)

    pos = jnp.arange(4)
    np.testing.assert_allclose(rope.rope_angles(pos, 8, Half()),
                               0.5 * rope.rope_angles(pos, 8), rtol=1e-6)
