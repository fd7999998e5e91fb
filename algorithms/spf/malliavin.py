"""Euler-Maruyama paths and their Malliavin derivatives by automatic differentiation.

Dimensions: N time steps, d state dimension (the Brownian motion is d-dimensional, diagonal noise).

For ``dX_t = a(X_t, t) dt + b(X_t, t) dW_t`` discretised as
``X_{k+1} = X_k + a(X_k, t_k) dt + b(X_k, t_k) * dW_k`` with increments ``dW_k ~ N(0, dt I)``, the
simulated path is a smooth function of the increments. A functional ``F(dW_0..dW_{N-1})`` has the
Malliavin derivative ``D_s F = sum_k dF/d(dW_k) 1[t_k <= s < t_{k+1}]`` (Nualart, "The Malliavin
Calculus and Related Topics", 2nd ed., Sec. 1.2, for smooth cylindrical functionals), so
``D_s X_T`` on step ``k`` is the Jacobian ``dX_N / d(dW_k)`` — one reverse-mode pass through the
``lax.scan`` per output coordinate.

The Clark-Ocone formula (ibid., Prop. 1.3.14) writes any such ``F`` as
``F = E[F] + int_0^T E[D_s F | F_s] dW_s``; with the Ito isometry,
``Var F = E int_0^T |E[D_s F | F_s]|^2 ds <= E int_0^T |D_s F|^2 ds``, with equality when ``D_s F``
is deterministic (additive noise, linear dynamics). In the Stochastic Path Follower the integrand
``E[D_s X_t | F_s]`` is the decision's response to the innovation at time ``s``; its value at
``s = t`` is the diffusion coefficient ``b_t`` of the decision process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

Coefficient = Callable[[jax.Array, jax.Array], jax.Array]  # (x [d], t []) -> [d]


def euler_maruyama(drift: Coefficient, diffusion: Coefficient, x0: jax.Array, dW: jax.Array,
                   dt: float) -> jax.Array:
    """Simulates ``X_{k+1} = X_k + a(X_k, t_k) dt + b(X_k, t_k) * dW_k`` in ``lax.scan``.

    Args:
      drift, diffusion: ``(x [d], t scalar) -> [d]`` (diffusion acts elementwise on dW).
      x0: [d] initial state.
      dW: [N, d] Brownian increments (variance ``dt`` each).
      dt: time step > 0.

    Returns:
      The path [N + 1, d] including ``x0``.

    Raises:
      ValueError: ``dW`` not [N, d] with d = ``x0.shape[0]``, or ``dt <= 0``.
    """
    if x0.ndim != 1 or dW.ndim != 2 or dW.shape[1] != x0.shape[0]:
        raise ValueError(f"euler_maruyama: expected x0 [d] and dW [N, d], got {x0.shape} and {dW.shape}")
    if not dt > 0:
        raise ValueError(f"euler_maruyama: dt={dt} must be positive")

    def step(x, inp):
        k, dw = inp
        t = k * dt
        x = x + drift(x, t) * dt + diffusion(x, t) * dw
        return x, x

    ks = jnp.arange(dW.shape[0], dtype=x0.dtype)
    _, xs = jax.lax.scan(step, x0, (ks, dW))
    return jnp.concatenate([x0[None], xs], axis=0)


def malliavin_derivative(drift: Coefficient, diffusion: Coefficient, x0: jax.Array, dW: jax.Array,
                         dt: float) -> jax.Array:
    """Pathwise Malliavin derivative of the terminal state, ``D_{t_k} X_T = dX_N / d(dW_k)``.

    Returns:
      [d, N, d]: entry ``[i, k, j]`` is ``D^j_{t_k} X^i_T`` (derivative of coordinate i of the terminal
      state with respect to the j-th Brownian component on step k).
    """
    return jax.jacrev(lambda w: euler_maruyama(drift, diffusion, x0, w, dt)[-1])(dW)


def clark_ocone_variance(D: jax.Array, dt: float) -> jax.Array:
    """``sum_k |D_{t_k} X|^2 dt`` per output coordinate, from ``D`` [d_out, N, d_noise]: the Ito-isometry
    variance of the Clark-Ocone representation when ``D`` is deterministic (otherwise the expectation
    of this quantity bounds the variance from above). Returns [d_out]."""
    return jnp.sum(D ** 2, axis=(1, 2)) * dt


@functools.partial(jax.jit, static_argnames=("rollout",))
def noise_sensitivity(rollout: Callable[[jax.Array], jax.Array], eps: jax.Array) -> jax.Array:
    """Malliavin derivative of a decision with respect to the observation noise of a stream.

    ``rollout(eps [T, M]) -> x_T [d]`` re-simulates the decision process with the stream's noise
    ``eps`` (standard normal per sample, i.e. the increments of a Brownian motion in units of
    ``sqrt(dt)``). Returns ``d x_T / d eps`` [d, T, M]; its norm over (d, M) against lag ``T - 1 - k``
    is how long each method remembers the noise of step ``k``.
    """
    return jax.jacrev(rollout)(eps)
