"""PPM training: the learning-rate schedule, the objectives as ``loss_fn(model, batch, key)`` for
``core.training.make_train_step``, jitted evaluation/sampling functions, and :func:`fit_network`
(epochs of shuffled windows with early stopping on ``core.training.train_loop``).

A batch is ``(x, y)``: inputs f32 [B, L, N] and targets f32 [B, H, N] (B windows, L input length,
H horizon, N channels, S samples).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from algorithms.forecasting import data, losses
from core import sharding
from core import steps as core_steps
from core.training import (
    EarlyStopping,
    LoopConfig,
    make_train_step,
    train_loop,
)


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


def epoch_steps(num_train_windows: int, config: FitConfig) -> int:
    """Optimizer steps per epoch of :func:`fit_network`: whole batches of the training windows,
    capped at ``config.max_steps_per_epoch`` (when set); may be 0 (too few windows)."""
    steps = num_train_windows // config.batch_size
    if config.max_steps_per_epoch:
        steps = min(steps, config.max_steps_per_epoch)
    return steps


def build_step(graphdef: nnx.GraphDef, params: Any, loss_fn, config: FitConfig,
               steps_per_epoch: int, channels: int, mesh: jax.sharding.Mesh,
               key: int | jax.Array) -> core_steps.Step:
    """The train step :func:`fit_network` runs, ``(state, (x, y), key) -> (state, metrics)``:
    ``loss_fn`` under Adam with :func:`halving_schedule`, with its arguments on ``mesh``
    (``core.steps.train_step``): the replicated state of ``params``; x f32 [B, L, N], y f32 [B, H,
    N] (N = ``channels``); ``key``. Abstract ``params`` give abstract arguments (``make aot``).

    Raises:
      ValueError: as :func:`halving_schedule`.
    """
    tx = optax.adam(halving_schedule(config.learning_rate, steps_per_epoch))
    B, L, H = config.batch_size, config.input_len, config.horizon
    batch = (jax.ShapeDtypeStruct((B, L, channels), jnp.float32),
             jax.ShapeDtypeStruct((B, H, channels), jnp.float32))
    return core_steps.train_step(make_train_step(graphdef, tx, loss_fn), params, tx, mesh,
                                 batch=batch, key=key)


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


# ----------------------------------------------------------------------------------------------
# Fitting a network: epochs over shuffled windows, early stopping on the validation objective


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """How :func:`fit_network` trains.

    Attributes:
      input_len: L, steps of history per window.
      horizon: H, steps forecast per window.
      batch_size: training windows per step (the last partial batch of an epoch is dropped).
      eval_batch_size: validation windows per evaluation batch.
      learning_rate: Adam's rate in epochs 1 and 2; halved every epoch after
        (:func:`halving_schedule`).
      max_epochs: passes over the training windows at most.
      patience: epochs without a lower validation objective before stopping.
      max_steps_per_epoch: cap on the steps of one epoch (0: one full pass).
      seed: the windows' shuffling seed (one permutation per epoch, from one generator).
      progress: show a progress bar.
    """

    input_len: int
    horizon: int
    batch_size: int = 64
    eval_batch_size: int = 64
    learning_rate: float = 1e-4
    max_epochs: int = 30
    patience: int = 5
    max_steps_per_epoch: int = 0
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if min(self.input_len, self.horizon, self.batch_size, self.eval_batch_size,
               self.max_epochs, self.patience) < 1 or self.max_steps_per_epoch < 0:
            raise ValueError(f"invalid FitConfig {self}: input_len, horizon, batch_size, "
                             "eval_batch_size, max_epochs and patience must be >= 1 and "
                             "max_steps_per_epoch >= 0")


class EpochWindows:
    """Training batches over epochs of shuffled windows, a positioned iterator for
    ``core.training.train_loop``.

    Epoch ``e`` visits ``starts`` in the order of the ``(e + 1)``-th permutation drawn from
    ``numpy.random.default_rng(seed)``, ``batch_size`` windows per step, ``steps_per_epoch`` steps
    (the rest of the permutation is dropped). Batch ``position`` depends on ``position`` alone, so
    a resumed run sees the same batches.

    Yields:
      ``(x f32 [B, L, N], y f32 [B, H, N])`` as jax arrays.

    Raises:
      ValueError: fewer than ``steps_per_epoch * batch_size`` start offsets.
    """

    def __init__(self, series: np.ndarray, starts: np.ndarray, input_len: int, horizon: int,
                 batch_size: int, steps_per_epoch: int, seed: int):
        if steps_per_epoch < 1 or len(starts) < steps_per_epoch * batch_size:
            raise ValueError(f"EpochWindows: {len(starts)} training windows cannot fill "
                             f"{steps_per_epoch} step(s) of {batch_size}")
        self.series, self.starts = series, np.asarray(starts)
        self.input_len, self.horizon, self.batch_size = input_len, horizon, batch_size
        self.steps_per_epoch, self.seed = steps_per_epoch, seed
        self.position = 0
        self._epoch, self._order = -1, None

    def _order_of(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng(self.seed)
            for _ in range(epoch + 1):
                order = rng.permutation(self.starts)
            self._epoch, self._order = epoch, order
        return self._order

    def __next__(self) -> tuple[jax.Array, jax.Array]:
        epoch, i = divmod(self.position, self.steps_per_epoch)
        rows = self._order_of(epoch)[i * self.batch_size:(i + 1) * self.batch_size]
        x, y = data.gather_windows(self.series, rows, self.input_len, self.horizon)
        self.position += 1
        return jnp.asarray(x), jnp.asarray(y)


def window_batches(series: np.ndarray, starts: np.ndarray, input_len: int, horizon: int,
                   batch_size: int):
    """The windows starting at ``starts`` in order, ``batch_size`` at a time (the last batch may be
    smaller): ``(x f32 [B, L, N], y f32 [B, H, N])`` jax arrays."""
    for i in range(0, len(starts), batch_size):
        x, y = data.gather_windows(series, starts[i:i + batch_size], input_len, horizon)
        yield jnp.asarray(x), jnp.asarray(y)


@dataclasses.dataclass
class FitResult:
    """What :func:`fit_network` returns.

    Attributes:
      graphdef: the network's graph definition.
      params: the parameters of the epoch with the lowest validation objective (host arrays).
      epochs: per epoch ``{"epoch", "train_loss" (mean over its steps), "val_loss"}``.
      best_val_loss: the lowest validation objective; best_epoch: its epoch (1-based).
      train_seconds: wall-clock seconds of training and validation.
      steps_per_epoch: optimizer steps per epoch.
    """

    graphdef: nnx.GraphDef
    params: nnx.State
    epochs: list[dict[str, float]]
    best_val_loss: float
    best_epoch: int
    train_seconds: float
    steps_per_epoch: int

    def history(self) -> dict[str, Any]:
        """The JSON-able record of the fit (no parameters)."""
        return {"epochs": self.epochs, "best_val_loss": self.best_val_loss,
                "best_epoch": self.best_epoch, "train_seconds": self.train_seconds,
                "steps_per_epoch": self.steps_per_epoch}


def fit_network(model: nnx.Module, loss_fn, series: np.ndarray, train_starts: np.ndarray,
                val_starts: np.ndarray, config: FitConfig, key: jax.Array,
                desc: str = "fit") -> FitResult:
    """Trains a forecasting network as the PPM authors do (their ``exp_main`` loop): Adam with the
    halving schedule, one pass per epoch over shuffled training windows (:class:`EpochWindows`),
    the mean validation objective after every epoch, early stopping after ``patience`` epochs
    without improvement, and the best epoch's parameters kept.

    Runs on ``core.training.train_loop`` (step ``i`` uses ``fold_in(key, i)``; epoch ``e``'s
    validation uses ``fold_in(key, 10**9 + e)``, e 0-based), data-parallel over every device
    (``core.sharding.make_mesh``) with the parameters replicated.

    Args:
      model: an NNX network (:class:`models.forecasting.PPM` or ``GaussianPrior``).
      loss_fn: ``loss_fn(model, (x, y), key) -> (loss, aux)`` (:func:`ppm_loss_fn`,
        :func:`gaussian_loss_fn`); create it once (it keys a jit cache).
      series: f32 [T, N] standardised series.
      train_starts, val_starts: int [W] window start rows.
      config: :class:`FitConfig`.
      key: PRNG key.
      desc: progress-bar label.

    Returns:
      :class:`FitResult`.

    Raises:
      ValueError: fewer training windows than one batch; no validation window; a validation
        objective never finite.
      core.training.NonFiniteLossError: a NaN/inf training loss.
    """
    B = config.batch_size
    steps = epoch_steps(len(train_starts), config)
    if steps < 1:
        raise ValueError(f"{desc}: {len(train_starts)} training windows, fewer than one batch of {B}")
    if len(val_starts) < 1:
        raise ValueError(f"{desc}: no validation window")
    graphdef, params = nnx.split(model)
    mesh = sharding.make_mesh()  # data parallel over every device (one on a CPU run)
    fit = build_step(graphdef, params, loss_fn, config, steps, series.shape[1], mesh, key)
    L, H = config.input_len, config.horizon

    def evaluate(step: int, state) -> dict[str, float]:
        vkey = jax.random.fold_in(key, 10**9 + step // steps - 1)
        total = sum(eval_loss(graphdef, state["params"], b, vkey, loss_fn) * b[0].shape[0]
                    for b in window_batches(series, val_starts, L, H, config.eval_batch_size))
        return {"val_loss": float(total) / len(val_starts)}

    loop = LoopConfig(num_steps=config.max_epochs * steps, log_every=steps,
                      progress=config.progress, desc=desc, steps_per_epoch=steps,
                      eval_every_epoch=True,
                      early_stopping=EarlyStopping("val_loss", patience=config.patience))
    result = train_loop(fit.fn, fit.args[0],
                        EpochWindows(series, train_starts, L, H, B, steps, config.seed),
                        fit.args[2], loop,
                        put_batch=lambda b: sharding.shard_batch(b, mesh), evaluate=evaluate)
    epochs = [{"epoch": int(round(r["epoch"])), "train_loss": r["train_loss"],
               "val_loss": r["val_loss"]} for r in result.evals]
    if result.best_step is None:
        raise ValueError(f"{desc}: the validation objective was never finite "
                         f"({[e['val_loss'] for e in epochs]})")
    best = jax.tree.map(np.asarray, jax.device_get(result.best_state["params"]))
    return FitResult(graphdef, best, epochs, float(result.best_value),
                     int(result.best_step // steps), result.seconds, steps)
