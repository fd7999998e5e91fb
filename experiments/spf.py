"""Experiment ``spf``: the Stochastic Path Follower against online baselines on drifting problems.

Three problems with known optimum paths (:mod:`algorithms.spf.problems`):

1. ``lsq_rotation``: drifting least squares, theta*(t) rotating; the optimum path is theta*(t).
2. ``lsq_ou``: least squares with an Ornstein-Uhlenbeck theta*; the Kalman filter is the MMSE bound.
3. ``logistic_rotation``: well-specified drifting logistic regression; exact excess risk by quadrature.

Every baseline's step size (or forgetting factor) is tuned on separate episodes; SPF starts from the
tuned SGD step and is trained on fresh simulated episodes. Metrics on held-out episodes: tracking MSE
``mean ||x_t - x*(t)||^2`` and population excess risk after a burn-in, ``ratio_to_kalman`` on problem 2,
and, on drifting least squares at d in ``scaling_dims``, seconds per step and error per method.

SPF training is data-parallel: each step's ``train_episodes`` simulated episodes are split over the
``data`` axis of a mesh over every device (:func:`data_parallel_mesh`, :class:`EpisodeBatches`) with
the network replicated; the trained network does not depend on the device count beyond the order of
the sums over episodes. Baseline tuning, evaluation and the scaling sweep run on one device.

    python -m experiments.spf --config=experiments/configs/spf.py:tiny --workdir=workdir
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh
from tqdm.auto import tqdm

from algorithms.spf import baselines as B
from algorithms.spf import malliavin as ML
from algorithms.spf import problems as P
from algorithms.spf import spf as S
from core import report, sharding
from core.training import LoopConfig, init_train_state, make_train_step, train_loop
from experiments import common

NAME = "spf"
LABELS = {"spf": "SPF (ours)", "sgd": "SGD (constant step)", "sgd_decay": "SGD (decaying step)",
          "adam": "Adam", "pc": "prediction-correction", "rls": "RLS (forgetting)",
          "kalman": "Kalman filter (oracle model)"}


def make_problem(name: str, config: ml_collections.ConfigDict, dim: int | None = None,
                 steps: int | None = None) -> P.Problem:
    """The :class:`~algorithms.spf.problems.Problem` called ``name`` ("<kind>_<drift>")."""
    kind, _, drift = name.partition("_")
    if kind not in P.KINDS or drift not in P.DRIFTS:
        raise ValueError(f"spf config: unknown problem {name!r}; expected '<kind>_<drift>' with kind in "
                         f"{P.KINDS} and drift in {P.DRIFTS}")
    return P.Problem(kind=kind, drift=drift, dim=dim or config.dim, batch=config.batch,
                     steps=steps or config.steps, dt=config.dt, noise=config.noise,
                     omega_min=config.omega_min, omega_max=config.omega_max,
                     ou_kappa=config.ou_kappa, ou_sigma=config.ou_sigma)


def _stack(cfgs):
    return jax.tree.map(lambda *xs: jnp.asarray(xs, jnp.float32), *cfgs)


def _sq_err(X, theta):
    return jnp.sum((X - theta) ** 2, axis=-1)  # [..., T]


@jax.jit
def _grid_score(X, theta, start):
    # X [G, E, T, d] -> mean tracking error after burn-in per grid point [G]
    T = X.shape[2]
    w = (jnp.arange(T) >= start).astype(X.dtype)
    return jnp.sum(_sq_err(X, theta[None]) * w, axis=-1).mean(axis=1) / jnp.sum(w)


def _baselines(problem: P.Problem, config) -> dict:
    """name -> (runner(A, y, x0, cfg) -> X, list of candidate configs)."""
    kind = problem.kind
    lr_pred = 0.2 if kind == "lsq" else 1.0
    out = {
        "sgd": (lambda A, y, x0, c: B.sgd(A, y, x0, kind, c),
                [B.SGDConfig(step=s) for s in config.step_grid]),
        "sgd_decay": (lambda A, y, x0, c: B.sgd(A, y, x0, kind, c),
                      [B.SGDConfig(step=s, decay_power=config.decay_power) for s in config.step_grid]),
        "adam": (lambda A, y, x0, c: B.adam(A, y, x0, kind, c),
                 [B.AdamConfig(step=s) for s in config.adam_grid]),
        "pc": (lambda A, y, x0, c: B.prediction_correction(A, y, x0, kind, c),
               [B.PCConfig(step=s, pred_iters=config.pc_pred_iters, pred_lr=lr_pred, pred_weight=w)
                for s in config.step_grid for w in config.pc_pred_weights]),
    }
    if kind == "lsq":
        out["rls"] = (lambda A, y, x0, c: B.rls(A, y, x0, c),
                      [B.RLSConfig(forgetting=f) for f in config.forgetting_grid])
    return out


def tune(runner, candidates, episodes: P.Episode, start: int):
    """The candidate config with the lowest tracking error on ``episodes`` (one vmapped compile)."""
    x0 = jnp.zeros(episodes.A.shape[-1], jnp.float32)
    run_all = jax.jit(jax.vmap(jax.vmap(lambda c, a, y: runner(a, y, x0, c), (None, 0, 0)),
                               (0, None, None)))
    scores = np.asarray(_grid_score(run_all(_stack(candidates), episodes.A, episodes.y),
                                    episodes.theta, start))
    scores = np.where(np.isfinite(scores), scores, np.inf)
    best = int(np.argmin(scores))
    return candidates[best], scores


def _evaluate(kind, X, theta, start):
    """Tracking MSE, excess risk (means after burn-in) and the error curve over time (mean over E)."""
    err = np.asarray(_sq_err(X, theta))  # [E, T]
    exc = np.asarray(jax.jit(P.excess_risk, static_argnums=0)(kind, X, theta))
    finite = bool(np.all(np.isfinite(err)))
    per_episode = err[:, start:].mean(axis=1)
    return {"tracking_mse": float(per_episode.mean()) if finite else float("inf"),
            "excess_risk": float(exc[:, start:].mean()) if finite else float("inf"),
            "per_episode_mse": per_episode.tolist()}, err.mean(axis=0)


def data_parallel_mesh(episodes: int) -> Mesh:
    """The mesh SPF trains on: a ``data`` axis over every device whose size divides ``episodes``.

    The training batch (``episodes`` simulated episodes per step) is split evenly over the ``data``
    axis, so its size must divide ``episodes``. In a single-process run whose device count does not
    divide it, the mesh takes the first k devices, k the largest divisor of ``episodes`` not above
    the device count, and says so on stderr (the trained network is the same: only the split
    changes); a multi-process run must use every device.

    Raises:
      ValueError: ``episodes < 1``; or, with several processes, ``episodes`` not a multiple of the
        device count.
    """
    if episodes < 1:
        raise ValueError(f"spf config: train_episodes={episodes} must be >= 1")
    devices = jax.devices()
    n = len(devices)
    if episodes % n == 0:
        return sharding.make_mesh()
    if jax.process_count() > 1:
        raise ValueError(f"spf config: train_episodes={episodes} must be a multiple of the {n} "
                         "devices of this multi-process run (each device trains on an equal share)")
    k = max(c for c in range(1, n + 1) if episodes % c == 0)
    print(f"spf: train_episodes={episodes} is not a multiple of the {n} devices; training "
          f"data-parallel over {k} of them (set --config.train_episodes to a multiple of {n} to use "
          "all)", file=sys.stderr)
    return sharding.make_mesh(devices=devices[:k])


class EpisodeBatches:
    """The training loop's batches (a positioned iterator): SPF trains on fresh simulated episodes.

    Batch ``i`` is ``(theta [E, T, d], A [E, T, M, d], y [E, T, M])`` float32, the first fields of
    ``sample_episodes(fold_in(key, i), problem, E)``: a function of ``key`` and ``i`` only, so a
    resumed run sees the same episodes and any mesh the same values. The episodes are simulated on
    the devices by one jitted call whose outputs are laid out along ``mesh``'s ``data`` axis
    (E / n per device; nothing passes through the host). The simulator's batched draw is one
    ``rbg`` stream for all E episodes, which XLA may compute whole on each device before keeping
    its slice; that is O(E T M d), small beside the training step's rollout and backward pass,
    which are split.

    Raises:
      ValueError: E is not a multiple of the size of ``mesh``'s ``data`` axis.
    """

    def __init__(self, problem: P.Problem, episodes: int, key: jax.Array, mesh: Mesh):
        n = mesh.shape[sharding.DATA]
        if episodes < 1 or episodes % n:
            raise ValueError(f"spf: {episodes} training episodes per step cannot be split evenly "
                             f"over {n} data-parallel devices")
        out = tuple(sharding.batch_sharding(mesh, nd) for nd in (3, 4, 3))
        self._sample = jax.jit(lambda k: tuple(P.sample_episodes(k, problem, episodes)[:3]),
                               out_shardings=out)
        self._key = key
        self.position = 0

    def __next__(self):
        batch = self._sample(jax.random.fold_in(self._key, self.position))
        self.position += 1
        return batch


def train_spf(problem: P.Problem, cfg: S.SPFConfig, config, workdir: str, seed: int):
    """Trains the SPF network on fresh episodes of ``problem`` (resumes from ``workdir``),
    data-parallel over :func:`data_parallel_mesh` with the parameters replicated.

    Returns:
      (graphdef, params as host arrays, loop result).
    """
    train_problem = dataclasses.replace(problem, steps=config.train_episode_steps)
    graphdef, params = S.init_spf(cfg, seed)
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip), optax.adam(config.learning_rate))
    step = make_train_step(graphdef, tx, S.make_episode_loss_fn(problem.kind, cfg))
    mesh = data_parallel_mesh(config.train_episodes)
    key = jax.random.key(seed)
    # the episodes of step i come from fold_in(key, i), as the step key does
    batches = EpisodeBatches(train_problem, config.train_episodes, key, mesh)
    result = train_loop(step, sharding.replicate(init_train_state(params, tx), mesh), batches, key,
                        LoopConfig(num_steps=config.train_steps, log_every=10,
                                   progress=config.progress,
                                   desc=f"spf train {problem.kind}_{problem.drift}"),
                        workdir=workdir)
    # evaluation runs on the default device: bring the (replicated) parameters to the host
    return graphdef, jax.device_get(result.state["params"]), result


def _run_dir(out: str, name: str, cfg: S.SPFConfig, config) -> str:
    """A training folder keyed by everything that shapes the trained network."""
    keys = ("dim", "batch", "dt", "noise", "omega_min", "omega_max", "ou_kappa", "ou_sigma",
            "train_steps", "train_episodes", "train_episode_steps", "learning_rate", "grad_clip", "seed")
    blob = json.dumps([dataclasses.asdict(cfg), {k: config[k] for k in keys}], sort_keys=True)
    return os.path.join(out, f"train_{name}_{hashlib.sha1(blob.encode()).hexdigest()[:10]}")


def run_problem(name: str, config, out: str, key) -> dict:
    """Tunes the baselines, trains SPF and evaluates everything on held-out episodes of ``name``."""
    problem = make_problem(name, config)
    start = int(config.burn_in * problem.steps)
    k_tune, k_test, k_train = jax.random.split(key, 3)
    tune_eps = P.sample_episodes(k_tune, problem, config.tune_episodes)
    test_eps = P.sample_episodes(k_test, problem, config.test_episodes)
    x0 = jnp.zeros(problem.dim, jnp.float32)
    methods, curves, chosen = {}, {}, {}
    for m, (runner, cands) in _baselines(problem, config).items():
        best, _ = tune(runner, cands, tune_eps, start)
        X = jax.jit(jax.vmap(lambda a, y, c, run=runner: run(a, y, x0, c), (0, 0, None)))(
            test_eps.A, test_eps.y, best)
        methods[m], curves[m] = _evaluate(problem.kind, X, test_eps.theta, start)
        chosen[m] = {k: float(v) for k, v in dataclasses.asdict(best).items()}
    kalman_trace = None
    if problem.kind == "lsq" and problem.drift == "ou":
        kcfg = B.KalmanConfig(phi=problem.ou_phi, q=problem.ou_q, noise=problem.noise,
                              init_var=problem.ou_sigma ** 2 / (2 * problem.ou_kappa))
        X, trP = jax.jit(jax.vmap(lambda a, y: B.kalman(a, y, x0, kcfg)))(test_eps.A, test_eps.y)
        methods["kalman"], curves["kalman"] = _evaluate(problem.kind, X, test_eps.theta, start)
        kalman_trace = np.asarray(trP)
        methods["kalman"]["riccati_mse"] = float(kalman_trace[:, start:].mean())
    cfg = S.SPFConfig(step=chosen["sgd"]["step"], hidden=config.hidden, depth=config.depth,
                      residual_weight=config.residual_weight, burn_in=config.burn_in)
    t0 = time.perf_counter()
    graphdef, params, result = train_spf(problem, cfg, config, _run_dir(out, name, cfg, config),
                                         config.seed)
    train_seconds = time.perf_counter() - t0
    X = jax.jit(jax.vmap(lambda a, y: S.spf(graphdef, params, a, y, x0, problem.kind, cfg)))(
        test_eps.A, test_eps.y)
    methods["spf"], curves["spf"] = _evaluate(problem.kind, X, test_eps.theta, start)
    chosen["spf"] = {"step": cfg.step, "hidden": cfg.hidden, "depth": cfg.depth,
                     "train_steps": config.train_steps, "train_seconds": train_seconds,
                     "final_train_loss": result.history[-1]["loss"] if result.history else None}
    if "kalman" in methods:
        for m in methods:
            methods[m]["ratio_to_kalman"] = methods[m]["tracking_mse"] / methods["kalman"]["tracking_mse"]
    sens = None
    if problem.kind == "lsq":
        sens = noise_memory(problem, test_eps, graphdef, params, cfg, chosen, x0)
    return {"problem": dataclasses.asdict(problem), "methods": methods, "chosen": chosen,
            "curves": {m: c.tolist() for m, c in curves.items()}, "noise_memory": sens,
            "spf": (graphdef, params, cfg)}


def noise_memory(problem, eps_batch, graphdef, params, cfg, chosen, x0) -> dict:
    """Malliavin derivative of the final decision with respect to the observation noise of each
    step, ``|d x_T / d eps_k|^2`` against lag ``T - 1 - k`` (first test episode), and its sum, the
    Clark-Ocone variance of ``x_T`` given the design."""
    A, theta, eps = eps_batch.A[0], eps_batch.theta[0], eps_batch.eps[0]
    signal = jnp.einsum("tmd,td->tm", A, theta)
    runners = {
        "spf": lambda e: S.spf_rollout(graphdef, params, A, signal + problem.noise * e, x0,
                                       problem.kind, cfg)[-1],
        "sgd": lambda e: B.sgd(A, signal + problem.noise * e, x0, "lsq",
                               B.SGDConfig(step=chosen["sgd"]["step"]))[-1],
    }
    if "rls" in chosen:
        runners["rls"] = lambda e: B.rls(A, signal + problem.noise * e, x0,
                                         B.RLSConfig(**chosen["rls"]))[-1]
    out = {}
    for m, r in runners.items():
        D = np.asarray(ML.noise_sensitivity(r, eps))  # [d, T, M]
        per_step = (D ** 2).sum(axis=(0, 2))[::-1]  # by lag 0..T-1
        out[m] = {"by_lag": per_step.tolist(), "clark_ocone_variance": float(per_step.sum())}
    return out


def _scaling_runners(ep: P.Episode, cfg: S.SPFConfig, factor: float, graphdef, params, config) -> dict:
    """name -> zero-argument function running that method on ``ep`` (least squares)."""
    d = ep.A.shape[-1]
    x0 = jnp.zeros(d, jnp.float32)
    runners = {
        "spf": lambda: S.spf(graphdef, params, ep.A, ep.y, x0, "lsq", cfg),
        "sgd": lambda: B.sgd(ep.A, ep.y, x0, "lsq", B.SGDConfig(step=cfg.step)),
        "adam": lambda: B.adam(ep.A, ep.y, x0, "lsq", B.AdamConfig(step=0.04)),
        "pc": lambda: B.prediction_correction(
            ep.A, ep.y, x0, "lsq", B.PCConfig(step=cfg.step, pred_iters=config.pc_pred_iters,
                                              pred_lr=0.2 * factor, pred_weight=0.5)),
    }
    if d <= config.rls_max_dim:
        runners["rls"] = lambda: B.rls(ep.A, ep.y, x0, B.RLSConfig(forgetting=0.95))
    return runners


def scaling(config, spf_model, key) -> dict:
    """Seconds per step and error on drifting least squares for d in ``scaling_dims``."""
    graphdef, params, cfg0 = spf_model
    res = {"dims": list(config.scaling_dims), "seconds_per_step": {}, "tracking_mse": {},
           "relative_error": {}, "spf_params": {}}
    M = config.batch
    for d in tqdm(config.scaling_dims, desc="spf scaling", disable=not config.progress, leave=False):
        problem = make_problem("lsq_rotation", config, dim=d, steps=config.scaling_steps)
        ep = P.sample_episode(jax.random.fold_in(key, d), problem)
        # steps scale with the mean-square stability limit of mini-batch SGD, ~ 2 M / (M + d + 1)
        factor = (M + config.dim + 1) / (M + d + 1)
        cfg = dataclasses.replace(cfg0, step=cfg0.step * factor)
        runners = _scaling_runners(ep, cfg, factor, graphdef, params, config)
        start = int(config.burn_in * problem.steps)
        tn = float(jnp.mean(jnp.sum(ep.theta[start:] ** 2, -1)))
        for m, r in runners.items():
            X = jax.block_until_ready(r())  # compile + warm up
            t0 = time.perf_counter()
            reps = 0
            while reps < 3 and (reps == 0 or time.perf_counter() - t0 < 1.0):
                X = jax.block_until_ready(r())
                reps += 1
            sec = (time.perf_counter() - t0) / reps / problem.steps
            mse = float(jnp.mean(_sq_err(X, ep.theta)[start:]))
            res["seconds_per_step"].setdefault(m, []).append(sec)
            res["tracking_mse"].setdefault(m, []).append(mse)
            res["relative_error"].setdefault(m, []).append(mse / tn)
        for m in ("rls",):
            if d > config.rls_max_dim:
                for k in ("seconds_per_step", "tracking_mse", "relative_error"):
                    res[k].setdefault(m, []).append(None)
        res["spf_params"][str(d)] = S.param_count(params)
    return res


def _plots(out, results, scale) -> list[str]:
    figs = []
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        dt = r["problem"]["dt"]
        for m, c in r["curves"].items():
            c = np.asarray(c, float)
            ax.plot(np.arange(c.size) * dt, c, label=LABELS[m], lw=2.0 if m == "spf" else 1.0,
                    ls="--" if m == "kalman" else "-")
        ax.set(yscale="log", xlabel="time t", ylabel="||x_t - x*(t)||^2", title=name)
    axes[0][0].legend(fontsize=7)
    figs.append(report.save_figure(fig, os.path.join(out, "tracking_error.png")))

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    dims = scale["dims"]
    for m in scale["seconds_per_step"]:
        ys = [np.nan if v is None else v for v in scale["seconds_per_step"][m]]
        a1.plot(dims, np.asarray(ys) * 1e3, "o-", label=LABELS[m])
        ys = [np.nan if v is None else v for v in scale["relative_error"][m]]
        a2.plot(dims, ys, "o-", label=LABELS[m])
    a1.set(xscale="log", yscale="log", xlabel="dimension d", ylabel="ms per step", title="time per step")
    a2.set(xscale="log", xlabel="dimension d", ylabel="||x - x*||^2 / ||x*||^2",
           title="tracking error vs d (lsq rotation)")
    a1.legend(fontsize=7)
    figs.append(report.save_figure(fig, os.path.join(out, "scaling.png")))

    mem = [(name, r["noise_memory"]) for name, r in results.items() if r["noise_memory"]]
    if mem:
        fig, axes = plt.subplots(1, len(mem), figsize=(4.6 * len(mem), 3.4), squeeze=False)
        for ax, (name, nm) in zip(axes[0], mem, strict=True):
            for m, v in nm.items():
                ax.plot(np.asarray(v["by_lag"])[:60], label=LABELS[m])
            ax.set(yscale="log", xlabel="lag T - 1 - k (steps)", ylabel="|d x_T / d eps_k|^2",
                   title=f"noise memory (Malliavin), {name}")
        axes[0][0].legend(fontsize=7)
        figs.append(report.save_figure(fig, os.path.join(out, "noise_memory.png")))
    return figs


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    key = jax.random.key(config.seed)
    results = {}
    for i, name in enumerate(config.problems):
        results[name] = run_problem(name, config, out, jax.random.fold_in(key, i))
    first_lsq = next((n for n in config.problems if n.startswith("lsq")), None)
    spf_model = results[first_lsq]["spf"] if first_lsq else None
    scale = scaling(config, spf_model, jax.random.fold_in(key, 1000)) if spf_model else None
    metrics = {
        "problems": {n: {k: r.get(k) for k in ("problem", "methods", "chosen", "noise_memory",
                                                 "vs_best_baseline")}
                     for n, r in results.items()},
        "scaling": scale,
        "spf_params": scale["spf_params"] if scale else {},
        "seconds_per_step": scale["seconds_per_step"] if scale else {},
    }
    figs = _plots(out, results, scale) if scale else []
    section = _section(config, results, scale, figs)
    for n, r in results.items():
        metrics["problems"][n]["vs_best_baseline"] = r["vs_best_baseline"]
    report.write_json(os.path.join(out, "metrics.json"), metrics)
    return section


def _section(config, results, scale, figs) -> report.Section:
    rows, wins = [], []
    for name, r in results.items():
        ms = r["methods"]
        learnable = {m: v["tracking_mse"] for m, v in ms.items() if m != "kalman"}
        best_base = min((m for m in learnable if m != "spf"), key=learnable.get)
        # paired over the same held-out episodes: a win needs the gap to exceed 2 standard errors
        diff = (np.asarray(ms["spf"]["per_episode_mse"]) - np.asarray(ms[best_base]["per_episode_mse"]))
        se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("inf")
        outcome = "wins" if diff.mean() < -2 * se else ("loses" if diff.mean() > 2 * se else "ties")
        r["vs_best_baseline"] = {"baseline": best_base, "difference": float(diff.mean()), "se": se,
                                 "outcome": outcome}
        wins.append((name, outcome, learnable["spf"], best_base, learnable[best_base], se))
        for m in sorted(ms, key=lambda m: ms[m]["tracking_mse"]):
            row = [name, LABELS[m], ms[m]["tracking_mse"], ms[m]["excess_risk"]]
            row.append(ms[m].get("ratio_to_kalman", ""))
            rows.append(row)
    body = [
        f"Tracking of a moving optimum from a stream of mini-batches (d = {config.dim}, M = "
        f"{config.batch} per step, T = {config.steps} steps of dt = {config.dt}; metrics after a "
        f"{int(100 * config.burn_in)}% burn-in, {config.test_episodes} held-out episodes). Baseline step "
        "sizes / forgetting factors tuned on separate episodes; SPF starts from the tuned SGD step.",
        "",
        report.markdown_table(["problem", "method", "tracking MSE", "excess risk", "MSE / Kalman"], rows),
        "",
    ]
    for name, outcome, spf_v, b, bv, se in wins:
        body.append(f"- {name}: SPF {spf_v:.4g} vs best baseline {LABELS[b]} {bv:.4g} (paired standard "
                    f"error of the gap {se:.2g}): SPF {outcome}"
                    f"{'' if outcome == 'wins' else ' (SPF does not win here)'}.")
    if scale:
        srows = []
        for m in scale["seconds_per_step"]:
            srows.append([LABELS[m]] + ["-" if v is None else f"{v * 1e3:.3g} ms / {e:.3g}"
                                        for v, e in zip(scale["seconds_per_step"][m],
                                                        scale["relative_error"][m], strict=True)])
        n_params = ", ".join(sorted(set(map(str, scale["spf_params"].values()))))
        body += ["", "Time per step / relative tracking error on drifting least squares (SPF network "
                 f"trained at d = {config.dim} and used unchanged; {n_params} parameters at every d):", "",
                 report.markdown_table(["method"] + [f"d = {d}" for d in scale["dims"]], srows)]
    n_win = sum(w[1] == "wins" for w in wins)
    verdict = "yes" if n_win == len(wins) else ("partly" if n_win else "no")
    if scale and verdict == "yes":
        # the scalability half of the claim: SPF's error must stay near SGD's as d grows
        big = [s_ <= 1.5 * g_ for s_, g_ in zip(scale["relative_error"]["spf"],
                                                scale["relative_error"]["sgd"], strict=True)]
        verdict = "yes" if all(big) else "partly"
    ours = "; ".join(f"{n}: {s:.3g} vs {bv:.3g} ({o})" for n, o, s, _, bv, _ in wins)
    return report.Section(
        title="Stochastic Path Follower (spf)", body="\n".join(body), figures=figs,
        headline={"method": "Stochastic Path Follower (Malliavin)",
                  "claim": "SPF beats gradient- and learning-based methods under drift; "
                           "size independent of d",
                  "ours": f"tracking MSE SPF vs best baseline — {ours}", "reproduces": verdict})


if __name__ == "__main__":
    common.app_main(NAME, run)
