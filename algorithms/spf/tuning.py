"""Tuning the online baselines over all of their usual hyper-parameters.

Dimensions: G grid points, E episodes, T time steps, M samples per step, d decision dimension.

Every baseline of :mod:`algorithms.spf.baselines` is tuned on a grid over the hyper-parameters a
practitioner would tune, on tuning episodes that are never the test episodes:

* constant-step SGD: the step ``eta``;
* decaying-step SGD ``eta / (1 + k / k0)^p``: ``eta``, the power ``p`` and the offset ``k0``;
* Adam: the learning rate and both moment rates ``(b1, b2)``;
* prediction-correction: the correction step, the prediction weight and the inner (Newton
  iteration) step ``pred_lr``;
* RLS: the forgetting factor and the initial covariance scale ``P_0 = delta I``.

A grid is one vmapped, jitted call over the G candidates and E episodes (the configs are pytrees
whose float fields are traced); the chosen candidate has the lowest mean tracking error
``||x_t - x*(t)||^2`` after a burn-in, non-finite scores counting as infinite.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.spf import baselines as B
from algorithms.spf.problems import KINDS, Episode

Runner = Callable[[jax.Array, jax.Array, jax.Array, Any], jax.Array]  # (A, y, x0, cfg) -> X


@dataclasses.dataclass(frozen=True)
class BaselineGrids:
    """The grid of every baseline hyper-parameter (all tuples of positive numbers, except the
    prediction weights and decay powers, which may be 0).

    Attributes:
      step: SGD's and prediction-correction's step ``eta``; also decaying SGD's initial step.
      decay_power, decay_offset: decaying SGD's ``p`` and ``k0``.
      adam_step, adam_b1, adam_b2: Adam's learning rate and moment rates (``b1, b2`` in [0, 1)).
      pc_pred_weight, pc_pred_lr: prediction-correction's prediction weight and inner step.
      pc_pred_iters: prediction-correction's inner iterations (fixed, not tuned).
      forgetting, rls_init_scale: RLS's ``lambda`` in (0, 1] and ``delta``.
    """

    step: tuple[float, ...] = (0.0125, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
    decay_power: tuple[float, ...] = (0.1, 0.3, 0.6, 1.0)
    decay_offset: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)
    adam_step: tuple[float, ...] = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
    adam_b1: tuple[float, ...] = (0.0, 0.5, 0.8, 0.9)
    adam_b2: tuple[float, ...] = (0.5, 0.9, 0.99, 0.999)
    pc_pred_weight: tuple[float, ...] = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
    pc_pred_lr: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
    pc_pred_iters: int = 5
    forgetting: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
    rls_init_scale: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 100.0)

    # the experiment config's field of each grid
    CONFIG_FIELDS: ClassVar[dict[str, str]] = {"step": "step_grid", "decay_power": "decay_power_grid",
                     "decay_offset": "decay_offset_grid", "adam_step": "adam_grid",
                     "adam_b1": "adam_b1_grid", "adam_b2": "adam_b2_grid",
                     "pc_pred_weight": "pc_pred_weights", "pc_pred_lr": "pc_pred_lr_grid",
                     "pc_pred_iters": "pc_pred_iters", "forgetting": "forgetting_grid",
                     "rls_init_scale": "rls_init_scale_grid"}

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "pc_pred_iters":
                if v < 0:
                    raise ValueError(f"BaselineGrids.pc_pred_iters={v}: must be >= 0")
                continue
            if not v:
                raise ValueError(f"BaselineGrids.{f.name} is empty: expected at least one value")
        candidates("lsq", self)  # the configs check their own ranges: a bad value fails here

    @classmethod
    def from_config(cls, config: Any) -> BaselineGrids:
        """The grids of an experiment config (fields named in ``CONFIG_FIELDS``)."""
        return cls(**{k: config[v] if k == "pc_pred_iters" else tuple(config[v])
                      for k, v in cls.CONFIG_FIELDS.items()})


def candidates(kind: str, grids: BaselineGrids) -> dict[str, tuple[Runner, list[Any]]]:
    """``{baseline: (runner(A, y, x0, cfg) -> X, [candidate configs])}`` for problem ``kind``
    (RLS for least squares only).

    Raises:
      ValueError: unknown ``kind``, or a grid value out of a config's range (the config's
        message).
    """
    if kind not in KINDS:
        raise ValueError(f"candidates: kind={kind!r}; expected one of {KINDS}")
    g, prod = grids, itertools.product
    out = {
        "sgd": (lambda A, y, x0, c: B.sgd(A, y, x0, kind, c),
                [B.SGDConfig(step=s) for s in g.step]),
        "sgd_decay": (lambda A, y, x0, c: B.sgd(A, y, x0, kind, c),
                      [B.SGDConfig(step=s, decay_power=p, decay_offset=o)
                       for s, p, o in prod(g.step, g.decay_power, g.decay_offset)]),
        "adam": (lambda A, y, x0, c: B.adam(A, y, x0, kind, c),
                 [B.AdamConfig(step=s, b1=b1, b2=b2)
                  for s, b1, b2 in prod(g.adam_step, g.adam_b1, g.adam_b2)]),
        "pc": (lambda A, y, x0, c: B.prediction_correction(A, y, x0, kind, c),
               [B.PCConfig(step=s, pred_iters=g.pc_pred_iters, pred_lr=lr, pred_weight=w)
                for s, w, lr in prod(g.step, g.pc_pred_weight, g.pc_pred_lr)]),
    }
    if kind == "lsq":
        out["rls"] = (lambda A, y, x0, c: B.rls(A, y, x0, c),
                      [B.RLSConfig(forgetting=f, init_scale=s)
                       for f, s in prod(g.forgetting, g.rls_init_scale)])
    return out


def stack_configs(configs: list[Any]) -> Any:
    """The configs as one pytree whose float leaves are [G] arrays (for ``jax.vmap``)."""
    return jax.tree.map(lambda *xs: jnp.asarray(xs, jnp.float32), *configs)


@jax.jit
def grid_score(X: jax.Array, theta: jax.Array, start: jax.Array) -> jax.Array:
    """Mean tracking error after burn-in per grid point.

    Args:
      X: f32 [G, E, T, d] decisions; theta: f32 [E, T, d] optimum path; start: int, first step
        counted.

    Returns:
      f32 [G]: ``mean over E and t >= start of ||X - theta||^2``.
    """
    T = X.shape[2]
    w = (jnp.arange(T) >= start).astype(X.dtype)
    err = jnp.sum((X - theta[None]) ** 2, axis=-1)
    return jnp.sum(err * w, axis=-1).mean(axis=1) / jnp.sum(w)


def run_grid(runner: Runner, configs: list[Any], episodes: Episode) -> jax.Array:
    """Every config on every episode from ``x0 = 0``: f32 [G, E, T, d] (one compile)."""
    x0 = jnp.zeros(episodes.A.shape[-1], jnp.float32)
    run_all = jax.jit(jax.vmap(jax.vmap(lambda c, a, y: runner(a, y, x0, c), (None, 0, 0)),
                               (0, None, None)))
    return run_all(stack_configs(configs), episodes.A, episodes.y)


def tune(runner: Runner, configs: list[Any], episodes: Episode, start: int
         ) -> tuple[Any, np.ndarray]:
    """The config with the lowest tracking error on ``episodes`` (the tuning episodes).

    Returns:
      ``(best config, scores f64 [G])`` (non-finite scores as ``inf``).

    Raises:
      ValueError: no candidate, or no candidate with a finite score.
    """
    if not configs:
        raise ValueError("tune: no candidate configs")
    scores = np.asarray(grid_score(run_grid(runner, configs, episodes), episodes.theta, start),
                        np.float64)
    scores = np.where(np.isfinite(scores), scores, np.inf)
    if not np.isfinite(scores).any():
        raise ValueError(f"tune: every one of the {len(configs)} candidates ({configs[0]}, ...) "
                         "diverged on the tuning episodes")
    return configs[int(np.argmin(scores))], scores


def on_grid_edge(best: Any, grids: BaselineGrids, baseline: str) -> list[str]:
    """The hyper-parameters of a tuned config that sit at an end of their grid (the optimum may
    lie outside it): names such as ``"step=3.2 (largest)"``."""
    fields = {"sgd": {"step": "step"},
              "sgd_decay": {"step": "step", "decay_power": "decay_power",
                            "decay_offset": "decay_offset"},
              "adam": {"step": "adam_step", "b1": "adam_b1", "b2": "adam_b2"},
              "pc": {"step": "step", "pred_weight": "pc_pred_weight", "pred_lr": "pc_pred_lr"},
              "rls": {"forgetting": "forgetting", "init_scale": "rls_init_scale"}}[baseline]
    out = []
    for attr, grid_name in fields.items():
        grid, v = getattr(grids, grid_name), float(getattr(best, attr))
        if len(grid) > 1 and v == max(grid):
            out.append(f"{attr}={v:g} (largest)")
        elif len(grid) > 1 and v == min(grid):
            out.append(f"{attr}={v:g} (smallest)")
    return out
