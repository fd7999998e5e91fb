"""Training objectives of Parametric Prior Mapping and of the Gaussian baseline.

Dimension legend: B windows, S samples, H horizon steps, N channels.

PPM's hybrid objective (PPM paper, Sec. "training objective"; the authors' ``kde_loss`` +
``mean_loss``):

    L = tau * L_KDE + L_MSE,
    L_KDE = -mean_b max(c, mean_{t,n} log p^_{b,t,n}),   p^(y) = 1/(S h) sum_s phi((y - y_s) / h),
    L_MSE = mean_{b,t,n} (mean_s y_s - y)^2,

with phi the standard normal density, h the kernel bandwidth, and c = -25 the clamp the reference
code applies to each window's mean log-likelihood (it keeps one hopeless window from dominating a
batch; the gradient of a clamped window is zero).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

KDE_CLAMP = -25.0


def kde_log_likelihood(samples: jax.Array, target: jax.Array, bandwidth: float) -> jax.Array:
    """Log density of each target point under a Gaussian KDE of the samples.

    Args:
      samples: f32 [B, S, H, N]; target: f32 [B, H, N]; bandwidth: h > 0 (data units).

    Returns:
      f32 [B, H, N]: ``log(1/(S h) sum_s phi((y - y_s)/h))`` via log-sum-exp (no underflow).
    """
    if not isinstance(bandwidth, jax.core.Tracer) and not (math.isfinite(bandwidth) and bandwidth > 0):
        raise ValueError(f"KDE bandwidth must be positive and finite, got {bandwidth}")
    u = (samples - target[:, None]) / bandwidth
    log_kernel = -0.5 * u * u - 0.5 * math.log(2 * math.pi)
    s = samples.shape[1]
    return jax.nn.logsumexp(log_kernel, axis=1) - math.log(s) - math.log(bandwidth)


def kde_nll(samples: jax.Array, target: jax.Array, bandwidth: float,
            clamp: float = KDE_CLAMP) -> jax.Array:
    """``L_KDE`` above: minus the batch mean of the per-window mean log-likelihood, each window's
    value clamped below at ``clamp``. f32 scalar (nats per point)."""
    log_p = jnp.mean(kde_log_likelihood(samples, target, bandwidth), axis=(1, 2))   # [B]
    return -jnp.mean(jnp.maximum(log_p, clamp))


def sample_mean_mse(samples: jax.Array, target: jax.Array) -> jax.Array:
    """``L_MSE``: mean squared error of the sample mean. f32 scalar."""
    return jnp.mean((jnp.mean(samples, axis=1) - target) ** 2)


def hybrid_loss(samples: jax.Array, target: jax.Array, tau: float, bandwidth: float,
                clamp: float = KDE_CLAMP) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPM's objective ``tau * L_KDE + L_MSE``.

    Args:
      samples: f32 [B, S, H, N] mapped prior draws; target: f32 [B, H, N]; tau >= 0 weight of the
      KDE term; bandwidth: KDE bandwidth h > 0.

    Returns:
      ``(loss, {"kde_nll", "mse"})``, f32 scalars.

    Raises:
      ValueError: shapes disagree, ``tau`` not finite and >= 0 or ``bandwidth`` not finite and > 0
        (checked when they are Python numbers or concrete arrays).
    """
    if samples.ndim != 4 or samples.shape[:1] + samples.shape[2:] != target.shape:
        raise ValueError(f"expected samples [B, S, H, N] and target [B, H, N], got {samples.shape} "
                         f"and {target.shape}")
    if not isinstance(tau, jax.core.Tracer) and not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau must be finite and >= 0, got {tau}")
    kde = kde_nll(samples, target, bandwidth, clamp)
    mse = sample_mean_mse(samples, target)
    return tau * kde + mse, {"kde_nll": kde, "mse": mse}


def gaussian_nll(mean: jax.Array, std: jax.Array, target: jax.Array,
                 clamp: float = -KDE_CLAMP) -> jax.Array:
    """Negative log-likelihood of ``target`` under ``N(mean, std^2)`` (all f32 [B, H, N]), averaged
    per window, each window's value clamped above at ``clamp`` (the counterpart of the KDE clamp: a
    window that is constant in its input has a near-zero instance scale and would otherwise put an
    astronomically large value into a batch mean), then averaged over windows. f32 scalar, nats per
    point."""
    z = (target - mean) / std
    per_window = jnp.mean(0.5 * z * z + jnp.log(std) + 0.5 * math.log(2 * math.pi), axis=(1, 2))
    return jnp.mean(jnp.minimum(per_window, clamp))
