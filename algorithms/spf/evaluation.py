"""Scoring trackers on held-out episodes: tracking metrics, the paired comparison of SPF with the
best baseline, the Malliavin noise memory, and the dimension sweep.

Dimensions: E episodes, T time steps, M samples per step, d decision dimension.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from algorithms.spf import baselines as B
from algorithms.spf import malliavin as ML
from algorithms.spf import problems as P
from algorithms.spf import spf as S
from core import timing


def squared_error(X: jax.Array, theta: jax.Array) -> jax.Array:
    """``||X - theta||^2`` over the last axis: [..., T, d] -> [..., T]."""
    return jnp.sum((X - theta) ** 2, axis=-1)


def tracking_metrics(kind: str, X: jax.Array, theta: jax.Array, start: int
                     ) -> tuple[dict[str, Any], np.ndarray]:
    """Tracking MSE and population excess risk after burn-in.

    Args:
      kind: ``"lsq"`` or ``"logistic"``. X, theta: f32 [E, T, d]. start: first step counted.

    Returns:
      ``({"tracking_mse", "excess_risk", "per_episode_mse" [E] list}, mean error curve f64 [T])``;
      a run with any non-finite decision scores ``inf``.
    """
    err = np.asarray(squared_error(X, theta))
    exc = np.asarray(jax.jit(P.excess_risk, static_argnums=0)(kind, X, theta))
    finite = bool(np.all(np.isfinite(err)))
    per_episode = err[:, start:].mean(axis=1)
    return {"tracking_mse": float(per_episode.mean()) if finite else float("inf"),
            "excess_risk": float(exc[:, start:].mean()) if finite else float("inf"),
            "per_episode_mse": per_episode.tolist()}, err.mean(axis=0)


def paired_comparison(method: Sequence[float], baseline: Sequence[float],
                      num_se: float = 2.0) -> dict[str, Any]:
    """Paired comparison over the same episodes of per-episode errors (lower is better).

    The gap is ``mean(method - baseline)`` with standard error ``std(ddof=1) / sqrt(E)``; the
    method ``"wins"`` when the gap is below ``-num_se`` standard errors, ``"loses"`` above
    ``+num_se``, and ``"ties"`` otherwise (one episode: always a tie, the error being unknown).

    Returns:
      ``{"difference", "se", "outcome"}``.

    Raises:
      ValueError: arrays of different lengths or empty.
    """
    a, b = np.asarray(method, np.float64), np.asarray(baseline, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired_comparison: need two equal-length 1-D arrays, got {a.shape} and "
                         f"{b.shape}")
    diff = a - b
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("inf")
    mean = float(diff.mean())
    outcome = "wins" if mean < -num_se * se else ("loses" if mean > num_se * se else "ties")
    return {"difference": mean, "se": se, "outcome": outcome}


def noise_memory(problem: P.Problem, episode: P.Episode, runners: Mapping[str, Callable]
                 ) -> dict[str, dict[str, Any]]:
    """Malliavin derivative of the final decision with respect to the observation noise of each
    step (least squares): ``|d x_T / d eps_k|^2`` summed over (d, M), by lag ``T - 1 - k``, and its
    sum, the Clark-Ocone variance of ``x_T`` given the design (``algorithms.spf.malliavin``).

    Args:
      problem: a least-squares problem (``y = A theta + noise * eps``).
      episode: one episode (``A [T, M, d]``, ``theta [T, d]``, ``eps [T, M]``).
      runners: {name: ``(A, y, x0) -> X [T, d]``}.

    Returns:
      {name: {"by_lag": [T] list, "clark_ocone_variance": float}}.

    Raises:
      ValueError: a problem that is not least squares.
    """
    if problem.kind != "lsq":
        raise ValueError(f"noise_memory: needs a least-squares problem, got kind={problem.kind!r}")
    A, theta, eps = episode.A, episode.theta, episode.eps
    signal = jnp.einsum("tmd,td->tm", A, theta)
    x0 = jnp.zeros(problem.dim, jnp.float32)
    out = {}
    for name, run in runners.items():
        D = np.asarray(ML.noise_sensitivity(
            lambda e, run=run: run(A, signal + problem.noise * e, x0)[-1], eps))  # [d, T, M]
        per_lag = (D ** 2).sum(axis=(0, 2))[::-1]
        out[name] = {"by_lag": per_lag.tolist(), "clark_ocone_variance": float(per_lag.sum())}
    return out


def scaling_sweep(problem: P.Problem, dims: Sequence[int], key: jax.Array,
                  runners: Callable[[int, float], Mapping[str, Callable]], burn_in: float,
                  repeats: int = 3) -> dict[str, Any]:
    """Seconds per step and relative tracking error of each method at each dimension.

    One episode of ``problem`` at each ``d`` (key ``fold_in(key, d)``). ``runners(d, factor)``
    gives ``{name: (A, y, x0) -> X}`` at that d, where ``factor = (M + d0 + 1) / (M + d + 1)``
    rescales steps by the mean-square stability limit of mini-batch SGD, ``~ 2 M / (M + d + 1)``
    (d0 = ``problem.dim``). Timing: best of ``repeats`` after a warm-up (``core.timing``).

    Returns:
      ``{"dims", "seconds_per_step": {name: [per d]}, "tracking_mse": ..., "relative_error":
      ...}`` (``||x - x*||^2 / ||x*||^2`` after burn-in); a method absent at some d gets
      ``None`` there.
    """
    res = {"dims": list(dims), "seconds_per_step": {}, "tracking_mse": {}, "relative_error": {}}
    names: list[str] = []
    M = problem.batch
    for i, d in enumerate(dims):
        prob = dataclasses.replace(problem, dim=d)
        ep = P.sample_episode(jax.random.fold_in(key, d), prob)
        x0 = jnp.zeros(d, jnp.float32)
        factor = (M + problem.dim + 1) / (M + d + 1)
        start = int(burn_in * prob.steps)
        norm = float(jnp.mean(jnp.sum(ep.theta[start:] ** 2, -1)))
        here = runners(d, factor)
        for name in here:
            if name not in names:
                names.append(name)
                for k in ("seconds_per_step", "tracking_mse", "relative_error"):
                    res[k][name] = [None] * i
        for name in names:
            if name not in here:
                for k in ("seconds_per_step", "tracking_mse", "relative_error"):
                    res[k][name].append(None)
                continue
            fn = lambda run=here[name], ep=ep, x0=x0: run(ep.A, ep.y, x0)
            sec = timing.seconds(fn, repeats=repeats) / prob.steps
            mse = float(jnp.mean(squared_error(fn(), ep.theta)[start:]))
            res["seconds_per_step"][name].append(sec)
            res["tracking_mse"][name].append(mse)
            res["relative_error"][name].append(mse / norm)
    return res


def lsq_runners(graphdef: nnx.GraphDef, params: nnx.State, spf_cfg: S.SPFConfig,
                chosen: Mapping[str, Any], factor: float = 1.0, with_rls: bool = True
                ) -> dict[str, Callable]:
    """``{name: (A, y, x0) -> X}`` on least squares for SPF and the tuned baselines, steps (and
    prediction-correction's inner step) multiplied by ``factor``.

    ``chosen`` maps baseline names to their tuned configs (``algorithms.spf.baselines``); absent
    baselines are left out, and RLS too unless ``with_rls``.
    """
    cfg = dataclasses.replace(spf_cfg, step=spf_cfg.step * factor)
    out = {"spf": lambda A, y, x0: S.spf(graphdef, params, A, y, x0, "lsq", cfg)}
    if "sgd" in chosen:
        c = dataclasses.replace(chosen["sgd"], step=chosen["sgd"].step * factor)
        out["sgd"] = lambda A, y, x0, c=c: B.sgd(A, y, x0, "lsq", c)
    if "adam" in chosen:
        out["adam"] = lambda A, y, x0, c=chosen["adam"]: B.adam(A, y, x0, "lsq", c)
    if "pc" in chosen:
        c = dataclasses.replace(chosen["pc"], step=chosen["pc"].step * factor,
                                pred_lr=chosen["pc"].pred_lr * factor)
        out["pc"] = lambda A, y, x0, c=c: B.prediction_correction(A, y, x0, "lsq", c)
    if "rls" in chosen and with_rls:
        out["rls"] = lambda A, y, x0, c=chosen["rls"]: B.rls(A, y, x0, c)
    return out


def evaluate_runner(run: Callable[[jax.Array, jax.Array, jax.Array], jax.Array], kind: str,
                    episodes: P.Episode, start: int) -> tuple[dict[str, Any], np.ndarray]:
    """:func:`tracking_metrics` of ``run(A, y, x0) -> X`` from ``x0 = 0`` on every episode
    (vmapped, jitted)."""
    x0 = jnp.zeros(episodes.A.shape[-1], jnp.float32)
    X = jax.jit(jax.vmap(lambda a, y: run(a, y, x0)))(episodes.A, episodes.y)
    return tracking_metrics(kind, X, episodes.theta, start)


def kalman_oracle(problem: P.Problem, episodes: P.Episode, start: int
                  ) -> tuple[dict[str, Any], np.ndarray]:
    """The Kalman filter with the true OU model on least squares (the MMSE tracker):
    :func:`tracking_metrics` plus ``riccati_mse``, the mean ``tr P_{k|k}`` after burn-in.

    Raises:
      ValueError: a problem that is not least squares with OU drift.
    """
    if problem.kind != "lsq" or problem.drift != "ou":
        raise ValueError(f"kalman_oracle: needs lsq with OU drift, got {problem.kind}_{problem.drift}")
    cfg = B.KalmanConfig(phi=problem.ou_phi, q=problem.ou_q, noise=problem.noise,
                         init_var=problem.ou_sigma ** 2 / (2 * problem.ou_kappa))
    x0 = jnp.zeros(problem.dim, jnp.float32)
    X, trP = jax.jit(jax.vmap(lambda a, y: B.kalman(a, y, x0, cfg)))(episodes.A, episodes.y)
    metrics, curve = tracking_metrics(problem.kind, X, episodes.theta, start)
    metrics["riccati_mse"] = float(np.asarray(trP)[:, start:].mean())
    return metrics, curve
