"""Pure pieces of PPM training: the learning-rate schedule, the objectives as ``loss_fn(model,
batch, key)`` for ``core.training.make_train_step``, and jitted evaluation/sampling functions.

A batch is ``(x, y)``: inputs f32 [B, L, N] and targets f32 [B, H, N] (B windows, L input length,
H horizon, N channels, S samples).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from algorithms.forecasting import losses


def halving_schedule(base_lr: float, steps_per_epoch: int) -> optax.Schedule:
    """The authors' ``lradj=type1`` schedule: after epoch e (1-based) the rate becomes
    ``base_lr * 0.5 ** (e - 1)``, i.e. epochs 1 and 2 run at ``base_lr``, then it halves every epoch.

    Raises:
      ValueError: ``steps_per_epoch < 1`` or ``base_lr`` not finite and > 0.
    """
    if steps_per_epoch < 1 or not (math.isfinite(base_lr) and base_lr > 0):
        raise ValueError(f"need steps_per_epoch >= 1 and base_lr > 0, got {steps_per_epoch}, {base_lr}")

    def schedule(step):
        epoch = step // steps_per_epoch                     # 0-based epoch being run
        return base_lr * 0.5 ** jnp.maximum(epoch - 1, 0).astype(jnp.float32)

    return schedule


def ppm_loss_fn(tau: float, bandwidth: float, num_samples: int):
    """``loss_fn(model, (x, y), key) -> (loss, {"kde_nll", "mse"})`` with PPM's hybrid objective on
    ``num_samples`` draws per window."""

    def loss_fn(model, batch, key):
        x, y = batch
        return losses.hybrid_loss(model(x, key, num_samples), y, tau, bandwidth)

    return loss_fn


def gaussian_loss_fn():
    """``loss_fn(model, (x, y), key) -> (nll, {"mse"})`` for :class:`models.forecasting.GaussianPrior`."""

    def loss_fn(model, batch, key):
        del key
        x, y = batch
        mean, std = model(x)
        return losses.gaussian_nll(mean, std, y), {"mse": jnp.mean((mean - y) ** 2)}

    return loss_fn


@functools.partial(jax.jit, static_argnames=("graphdef", "loss_fn"))
def eval_loss(graphdef: nnx.GraphDef, params: nnx.State, batch, key: jax.Array, loss_fn) -> jax.Array:
    """The objective on one batch without gradients (f32 scalar). ``loss_fn`` must be hashable and
    stable (create it once)."""
    return loss_fn(nnx.merge(graphdef, params), batch, key)[0]


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples"))
def sample_ppm(graphdef: nnx.GraphDef, params: nnx.State, x: jax.Array, key: jax.Array,
               num_samples: int) -> jax.Array:
    """f32 [B, S, H, N] forecast samples of a PPM model."""
    return nnx.merge(graphdef, params)(x, key, num_samples)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples"))
def sample_gaussian(graphdef: nnx.GraphDef, params: nnx.State, x: jax.Array, key: jax.Array,
                    num_samples: int) -> jax.Array:
    """f32 [B, S, H, N] draws from a GaussianPrior model's forecast."""
    return nnx.merge(graphdef, params).sample(x, key, num_samples)
