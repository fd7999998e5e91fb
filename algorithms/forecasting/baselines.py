"""Closed-form baselines for probabilistic forecasting (pure jnp).

Dimension legend: B windows, L input length, H horizon, N channels, S samples.

* :func:`fit_linear` / :func:`linear_samples`: a channel-shared linear map from the (mean-centred)
  input window to the horizon, fitted in closed form by ridge least squares, with Gaussian residuals
  whose standard deviation is estimated per horizon step and channel on the training windows.
  DLinear (Zeng et al. 2023) forecasts ``W_s (x - MA(x)) + W_t MA(x)``, a linear function of the
  window, and with ``W_s = W_t = W`` it reaches every linear map, so the least-squares fit here is
  the MSE optimum of DLinear's function class (up to the ridge term) rather than an SGD estimate.
* :func:`seasonal_naive` / :func:`seasonal_naive_samples`: repeat the last season of the window;
  the predictive distribution is the empirical distribution of the training windows' residual
  paths (:func:`seasonal_residuals`), and a forecast is S draws from it (bootstrap: each draw adds
  the whole [H, N] residual of one training window picked uniformly with replacement, so the
  dependence across steps and channels is kept).

Every sampler here returns S iid draws from its predictive distribution, like the networks', so all
methods are scored by the same estimators (:mod:`algorithms.forecasting.metrics`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


class LinearForecaster(NamedTuple):
    """``weight`` f32 [L, H], ``bias`` f32 [H], residual ``std`` f32 [H, N]."""

    weight: jax.Array
    bias: jax.Array
    std: jax.Array


def _centre(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    m = jnp.mean(x, axis=1, keepdims=True)
    return x - m, m


def linear_point(model: LinearForecaster, x: jax.Array) -> jax.Array:
    """Point forecast f32 [B, H, N] of :class:`LinearForecaster` for inputs ``x`` f32 [B, L, N]."""
    xc, m = _centre(x)
    return jnp.einsum("bln,lh->bhn", xc, model.weight) + model.bias[None, :, None] + m


@functools.partial(jax.jit, static_argnames=())
def fit_linear(x: jax.Array, y: jax.Array, ridge: float = 1e-3) -> LinearForecaster:
    """Ridge least-squares fit of ``y - m = W^T (x - m) + b`` over all windows and channels.

    Args:
      x: f32 [B, L, N] training inputs; y: f32 [B, H, N] targets; ridge: penalty on ``W`` relative
        to the mean diagonal of the Gram matrix (scale-free), not applied to ``b``.

    Returns:
      :class:`LinearForecaster` with the residual std (ddof 0) of each horizon step and channel.
    """
    xc, m = _centre(x)
    yc = y - m
    feats = jnp.swapaxes(xc, 1, 2).reshape(-1, x.shape[1])             # [B*N, L]
    targ = jnp.swapaxes(yc, 1, 2).reshape(-1, y.shape[1])              # [B*N, H]
    design = jnp.concatenate([feats, jnp.ones((feats.shape[0], 1), feats.dtype)], axis=1)
    gram = design.T @ design
    penalty = ridge * jnp.trace(gram[:-1, :-1]) / (gram.shape[0] - 1)
    reg = jnp.diag(jnp.concatenate([jnp.full((x.shape[1],), penalty), jnp.zeros((1,))]))
    coef = jnp.linalg.solve(gram + reg.astype(gram.dtype), design.T @ targ)
    model = LinearForecaster(coef[:-1], coef[-1], jnp.zeros((y.shape[1], y.shape[2]), y.dtype))
    resid = y - linear_point(model, x)
    return model._replace(std=jnp.std(resid, axis=0))


@functools.partial(jax.jit, static_argnames="num_samples")
def linear_samples(model: LinearForecaster, x: jax.Array, key: jax.Array,
                   num_samples: int) -> jax.Array:
    """f32 [B, S, H, N] draws from ``N(linear_point(x), std^2)``."""
    point = linear_point(model, x)
    eps = jax.random.normal(key, (x.shape[0], num_samples, *point.shape[1:]), point.dtype)
    return point[:, None] + model.std[None, None] * eps


def seasonal_naive(x: jax.Array, horizon: int, period: int) -> jax.Array:
    """Point forecast f32 [B, H, N]: ``y_t = x[L - p + (t mod p)]`` (the last season repeated).

    Raises:
      ValueError: ``period`` is not in [1, L].
    """
    L = x.shape[1]
    if not 1 <= period <= L:
        raise ValueError(f"seasonal period {period} must be in [1, input length {L}]")
    idx = L - period + jnp.arange(horizon) % period
    return x[:, idx]


@functools.partial(jax.jit, static_argnames=("horizon", "period"))
def seasonal_residuals(x: jax.Array, y: jax.Array, horizon: int, period: int) -> jax.Array:
    """Residual paths f32 [R, H, N] ``y - seasonal_naive(x)`` of R training windows ``x`` f32
    [R, L, N], ``y`` f32 [R, H, N]: the support of the seasonal-naive predictive distribution.

    Raises:
      ValueError: ``period`` is not in [1, L].
    """
    return y - seasonal_naive(x, horizon, period)


@functools.partial(jax.jit, static_argnames=("horizon", "period", "num_samples"))
def seasonal_naive_samples(x: jax.Array, residuals: jax.Array, key: jax.Array, horizon: int,
                           period: int, num_samples: int) -> jax.Array:
    """S iid draws f32 [B, S, H, N] from the seasonal-naive predictive distribution.

    Draw s of window b is ``seasonal_naive(x)[b] + residuals[r]`` with ``r`` uniform on
    ``0..R-1``, independently for each (b, s).

    Args:
      x: f32 [B, L, N] inputs. residuals: f32 [R, H, N] from :func:`seasonal_residuals`, R >= 1.
      key: PRNG key. horizon: H. period: the season, in [1, L]. num_samples: S.

    Raises:
      ValueError: ``period`` not in [1, L], or ``residuals`` empty or not [R, H, N].
    """
    if residuals.ndim != 3 or residuals.shape[0] < 1 or residuals.shape[1:] != (horizon, x.shape[2]):
        raise ValueError(f"residuals must be [R >= 1, H={horizon}, N={x.shape[2]}], got "
                         f"{residuals.shape}")
    point = seasonal_naive(x, horizon, period)
    idx = jax.random.randint(key, (x.shape[0], num_samples), 0, residuals.shape[0])
    return point[:, None] + residuals[idx]
