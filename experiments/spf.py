"""Experiment ``spf``: the Stochastic Path Follower against tuned online baselines on drifting problems.

Three problems with known optimum paths (:mod:`algorithms.spf.problems`): ``lsq_rotation``
(drifting least squares, theta*(t) rotating), ``lsq_ou`` (Ornstein-Uhlenbeck theta*; the Kalman
filter is the MMSE bound) and ``logistic_rotation`` (exact excess risk by quadrature).

Every baseline is tuned over all of its usual hyper-parameters on separate episodes
(:mod:`algorithms.spf.tuning`); SPF starts from the tuned SGD step and is trained on fresh simulated
episodes, data-parallel (:mod:`algorithms.spf.training`). Metrics on held-out episodes
(:mod:`algorithms.spf.evaluation`): tracking MSE ``mean ||x_t - x*(t)||^2`` and population excess
risk after a burn-in, the paired comparison with the best tuned baseline, ``ratio_to_kalman`` on
problem 2, the Malliavin noise memory (a diagnostic: the method does not use it), and on drifting
least squares at d in ``scaling_dims`` seconds per step and error per method.

    python -m experiments.spf --config=experiments/configs/spf.py:tiny --workdir=workdir
"""

from __future__ import annotations

import dataclasses
import os

import jax
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from algorithms.spf import evaluation as EV
from algorithms.spf import problems as P
from algorithms.spf import spf as S
from algorithms.spf import training, tuning
from algorithms.spf.training import (  # noqa: F401  (EpisodeBatches, data_parallel_mesh: public)
    EpisodeBatches,
    TrainSettings,
    data_parallel_mesh,
    make_problem,
    spf_training,
)
from core import figures as style
from core import report
from core.timing import Stopwatch
from core.training import LoopConfig, config_fingerprint, train_loop
from experiments import common

NAME = "spf"
LABELS = {"spf": "SPF (ours)", "sgd": "SGD (constant step)", "sgd_decay": "SGD (decaying step)",
          "adam": "Adam", "pc": "prediction-correction", "rls": "RLS (forgetting)",
          "kalman": "Kalman filter (oracle model)"}
COLORS = style.method_colors(LABELS)  # a method's colour in every panel and figure
_KIND_LABELS = {"lsq": "least squares", "logistic": "logistic regression"}
_DRIFT_LABELS = {"rotation": "rotating optimum", "sinusoid": "sinusoidal drift", "ou": "OU drift"}


def problem_label(name: str) -> str:
    """The reader-facing name of a problem ``"<kind>_<drift>"`` (``"lsq_ou"`` -> ``"least squares,
    OU drift"``). Raises KeyError for a kind or drift not in :mod:`algorithms.spf.problems`."""
    kind, drift = name.split("_", 1)
    return f"{style.readable(kind, _KIND_LABELS)}, {style.readable(drift, _DRIFT_LABELS)}"


def train_settings(config: ml_collections.ConfigDict) -> TrainSettings:
    """How the config trains SPF (``train_*``, ``learning_rate``, ``grad_clip``, ``seed``)."""
    return TrainSettings(steps=config.train_steps, episodes=config.train_episodes,
                         episode_steps=config.train_episode_steps,
                         learning_rate=config.learning_rate, grad_clip=config.grad_clip,
                         seed=config.seed)


def spf_config(config: ml_collections.ConfigDict, step: float | None = None) -> S.SPFConfig:
    """The SPF network of the config; ``step``: the tuned step size (None: the default, which
    changes no shape)."""
    fields = dict(hidden=config.hidden, depth=config.depth,
                  residual_weight=config.residual_weight, burn_in=config.burn_in)
    return S.SPFConfig(**fields) if step is None else S.SPFConfig(step=step, **fields)


def train(problem, cfg: S.SPFConfig, config, out: str, name: str):
    """Trains SPF on fresh episodes (resuming from its checkpoints); returns (graphdef, host
    params, loop result, seconds)."""
    settings = train_settings(config)
    fingerprint = config_fingerprint(dataclasses.asdict(cfg), dataclasses.asdict(settings),
                                     dataclasses.asdict(problem))
    t = spf_training(problem, cfg, settings)
    with Stopwatch() as sw:
        result = train_loop(t.step_fn, t.state, t.batches, t.key,
                            LoopConfig(num_steps=settings.steps, log_every=10,
                                       progress=config.progress, desc=f"spf train {name}"),
                            workdir=os.path.join(out, f"train_{name}_{fingerprint}"),
                            fingerprint=fingerprint)
    return t.graphdef, jax.device_get(result.state["params"]), result, sw.seconds


def run_problem(name: str, config, out: str, key) -> dict:
    """Tunes the baselines, trains SPF and evaluates everything on held-out episodes of ``name``."""
    problem = make_problem(name, config)
    start = int(config.burn_in * problem.steps)
    k_tune, k_test, _ = jax.random.split(key, 3)
    tune_eps = P.sample_episodes(k_tune, problem, config.tune_episodes)
    test_eps = P.sample_episodes(k_test, problem, config.test_episodes)
    methods, curves, chosen, edges = {}, {}, {}, {}
    g = tuning.BaselineGrids.from_config(config)
    for m, (runner, cands) in tuning.candidates(problem.kind, g).items():
        chosen[m], _ = tuning.tune(runner, cands, tune_eps, start)
        edges[m] = tuning.on_grid_edge(chosen[m], g, m)
        methods[m], curves[m] = EV.evaluate_runner(
            lambda a, y, x0, run=runner, c=chosen[m]: run(a, y, x0, c), problem.kind, test_eps, start)
    cfg = spf_config(config, chosen["sgd"].step)
    graphdef, params, result, seconds = train(problem, cfg, config, out, name)
    methods["spf"], curves["spf"] = EV.evaluate_runner(
        lambda a, y, x0: S.spf(graphdef, params, a, y, x0, problem.kind, cfg), problem.kind,
        test_eps, start)
    if problem.kind == "lsq" and problem.drift == "ou":
        methods["kalman"], curves["kalman"] = EV.kalman_oracle(problem, test_eps, start)
        for v in methods.values():
            v["ratio_to_kalman"] = v["tracking_mse"] / methods["kalman"]["tracking_mse"]
    learnable = {m: v["tracking_mse"] for m, v in methods.items() if m not in ("kalman", "spf")}
    best = min(learnable, key=learnable.get)
    versus = {"baseline": best, **EV.paired_comparison(methods["spf"]["per_episode_mse"],
                                                       methods[best]["per_episode_mse"])}
    hyper = {m: {k: float(v) for k, v in dataclasses.asdict(c).items()} for m, c in chosen.items()}
    hyper["spf"] = {"step": cfg.step, "hidden": cfg.hidden, "depth": cfg.depth,
                    "train_steps": config.train_steps, "train_seconds": seconds,
                    "final_train_loss": result.history[-1]["loss"] if result.history else None}
    memory = None
    if problem.kind == "lsq":
        episode = P.Episode(*(f[0] for f in test_eps))
        memory = EV.noise_memory(problem, episode, {
            k: v for k, v in EV.lsq_runners(graphdef, params, cfg, chosen).items()
            if k in ("spf", "sgd", "rls")})
    return {"problem": dataclasses.asdict(problem), "methods": methods, "chosen": hyper,
            "grid_edges": edges, "vs_best_baseline": versus, "noise_memory": memory,
            "curves": {m: c.tolist() for m, c in curves.items()},
            "model": (graphdef, params, cfg, chosen)}


def _figures(results, scale) -> dict:
    figs, n = {}, len(results)
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, 3.4), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        for m, c in r["curves"].items():
            ax.plot(np.arange(len(c)) * r["problem"]["dt"], c, label=LABELS[m], color=COLORS[m],
                    lw=2.0 if m == "spf" else 1.0, ls="--" if m == "kalman" else "-")
        ax.set(yscale="log", xlabel="time t", ylabel="tracking error $\\|x_t - x^*(t)\\|^2$",
               title=problem_label(name))
        style.log_ticks(ax, "y")
    style.figure_legend(fig)
    figs["tracking_error"] = fig
    if scale:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.5, 3.4))
        for m in scale["seconds_per_step"]:
            nan = lambda vs: [np.nan if v is None else v for v in vs]  # noqa: E731
            a1.plot(scale["dims"], np.asarray(nan(scale["seconds_per_step"][m])) * 1e3, "o-",
                    label=LABELS[m], color=COLORS[m])
            a2.plot(scale["dims"], nan(scale["relative_error"][m]), "o-", label=LABELS[m], color=COLORS[m])
        a1.set(xscale="log", yscale="log", xlabel="dimension d", ylabel="ms per step",
               title="time per step")
        a2.set(xscale="log", xlabel="dimension d", ylabel="$\\|x - x^*\\|^2 / \\|x^*\\|^2$",
               title="tracking error vs d\n(least squares, rotating optimum)")
        for ax in (a1, a2):  # ticks at the measured dimensions
            ax.set_xticks(scale["dims"], [style.compact_number(d) for d in scale["dims"]])
            ax.xaxis.set_minor_formatter(plt.NullFormatter())
        style.figure_legend(fig)
        figs["scaling"] = fig
    mem = [(name, r["noise_memory"]) for name, r in results.items() if r["noise_memory"]]
    if mem:
        fig, axes = plt.subplots(1, len(mem), figsize=(4.6 * len(mem), 3.4), squeeze=False)
        for ax, (name, nm) in zip(axes[0], mem, strict=True):
            for m, v in nm.items():
                ax.plot(np.asarray(v["by_lag"])[:60], label=LABELS[m], color=COLORS[m])
            ax.set(yscale="log", xlabel="lag $T - 1 - k$ (steps)",
                   ylabel="$|\\partial x_T / \\partial \\varepsilon_k|^2$",
                   title=f"noise memory (Malliavin diagnostic),\n{problem_label(name)}")
        style.figure_legend(fig)
        figs["noise_memory"] = fig
    return figs


def ties_matter(wins: int, ties: int, num_problems: int) -> int:
    """1 when deciding the ties (paired gaps within 2 standard errors) could change a check of
    the claim: "SPF wins on a problem" while no problem is a win, or "on every problem" while
    none is a loss; else 0.

    Raises:
      ValueError: counts that do not fit ``0 <= wins + ties <= num_problems``.
    """
    losses = num_problems - wins - ties
    if min(wins, ties, losses) < 0:
        raise ValueError(f"ties_matter: wins={wins}, ties={ties} of {num_problems} problems")
    return int(ties > 0 and (wins == 0 or losses == 0))


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    key = jax.random.key(config.seed)
    results = {name: run_problem(name, config, out, jax.random.fold_in(key, i))
               for i, name in enumerate(config.problems)}
    first_lsq = next((n for n in config.problems if n.startswith("lsq")), None)
    scale = None
    if first_lsq:
        graphdef, params, cfg, chosen = results[first_lsq]["model"]
        problem = make_problem("lsq_rotation", config, steps=config.scaling_steps)
        scale = EV.scaling_sweep(
            problem, config.scaling_dims, jax.random.fold_in(key, 1000),
            lambda d, f: EV.lsq_runners(graphdef, params, cfg, chosen, f, d <= config.rls_max_dim),
            config.burn_in)
        scale["spf_params"] = S.param_count(params)
    wins = sum(r["vs_best_baseline"]["outcome"] == "wins" for r in results.values())
    ties = sum(r["vs_best_baseline"]["outcome"] == "ties" for r in results.values())
    matter = ties_matter(wins, ties, len(results))
    ratio = max((s / g for s, g in zip(scale["relative_error"]["spf"],
                                       scale["relative_error"]["sgd"], strict=True)),
                default=None) if scale else None
    summary = "; ".join(f"{n}: {r['methods']['spf']['tracking_mse']:.3g} vs "
                        f"{LABELS[r['vs_best_baseline']['baseline']]} "
                        f"{r['methods'][r['vs_best_baseline']['baseline']]['tracking_mse']:.3g} "
                        f"({r['vs_best_baseline']['outcome']})" for n, r in results.items())
    metrics = {"problems": {n: {k: v for k, v in r.items() if k not in ("model", "curves")}
                            for n, r in results.items()},
               "scaling": scale, "spf_wins": wins, "spf_ties": ties,
               "spf_ties_matter": matter, "num_problems": len(results),
               "scaling_error_vs_sgd": ratio, "summary": summary}
    return report.finish(out, title="Stochastic Path Follower (spf)", metrics=metrics,
                         body=_body(config, results, scale), claim=config.claim,
                         figures=_figures(results, scale))


def _body(config, results, scale) -> str:
    rows = [[name, LABELS[m], v["tracking_mse"], v["excess_risk"], v.get("ratio_to_kalman", "")]
            for name, r in results.items()
            for m, v in sorted(r["methods"].items(), key=lambda kv: kv[1]["tracking_mse"])]
    body = [f"Tracking of a moving optimum from a stream of mini-batches (d = {config.dim}, M = "
            f"{config.batch} per step, T = {config.steps} steps of dt = {config.dt}; metrics after "
            f"a {int(100 * config.burn_in)}% burn-in, {config.test_episodes} held-out episodes). "
            "Every baseline tuned over all of its hyper-parameters on separate episodes; SPF "
            "starts from the tuned SGD step. The Malliavin derivative is a diagnostic here (noise "
            "memory); the SPF update does not use it.", "",
            report.markdown_table(["problem", "method", "tracking MSE", "excess risk",
                                   "MSE / Kalman"], rows), ""]
    for name, r in results.items():
        v = r["vs_best_baseline"]
        edge = "; ".join(f"{LABELS[m]}: {', '.join(e)}" for m, e in r["grid_edges"].items() if e)
        body.append(f"- {name}: SPF minus {LABELS[v['baseline']]} {v['difference']:+.4g} ± "
                    f"{v['se']:.2g} (paired s.e.): SPF {v['outcome']}."
                    + (f" Tuned values at a grid edge: {edge}." if edge else ""))
    if scale:
        srows = [[LABELS[m]] + ["-" if s is None else f"{s * 1e3:.3g} ms / {e:.3g}"
                                for s, e in zip(scale["seconds_per_step"][m],
                                                scale["relative_error"][m], strict=True)]
                 for m in scale["seconds_per_step"]]
        body += ["", "Time per step / relative tracking error on drifting least squares (SPF and "
                 f"the baselines tuned at d = {config.dim}, steps rescaled by the SGD stability "
                 f"limit; {scale['spf_params']} SPF parameters at every d):", "",
                 report.markdown_table(["method"] + [f"d = {d}" for d in scale["dims"]], srows)]
    return "\n".join(body)


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compile of the paper step (``experiments.aot``)


def paper_steps():
    """The AOT row of ``spf``, as ``core.aot_steps.PaperSteps``: the run's
    :func:`algorithms.spf.training.build_step` of the ``paper`` config on drifting least squares
    (rotation drift), abstract, on :func:`data_parallel_mesh` over the pod's devices (no analytic
    FLOP count, so no MFU). The step size (tuned on data in the experiment) is the default: it
    changes no shape."""
    from core import aot_steps
    from experiments.configs import spf as spf_config_module

    def build(devices):
        config = spf_config_module.get_config("paper")
        settings = train_settings(config)
        problem = make_problem("lsq_rotation", config)
        cfg = spf_config(config)
        step = training.build_step(problem, cfg, settings,
                                   data_parallel_mesh(settings.episodes, devices), abstract=True)
        k = S.param_count(step.args[0]["params"])
        return aot_steps.StepSpec.of(
            step, model_flops=None, params=k,
            shape=f"{settings.episodes} episodes x {settings.episode_steps} steps x batch "
            f"{problem.batch}, d {problem.dim}, hidden {cfg.hidden} x depth {cfg.depth}, {k} params")

    return {f"{NAME}/train": (build, "SPF train step")}


if __name__ == "__main__":
    common.app_main(NAME, run)
