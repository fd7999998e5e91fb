"""Experiment ``rl_scaling``: compute-optimal allocation of RL rollouts (IsoCompute Playbook).

A small byte-level transformer is warm-started by supervised training on sums (an easy and a hard
split, :mod:`algorithms.rl_scaling.warmstart`), then trained with GRPO under rollout budgets
C = n * B_p * M for a grid of rollouts per problem n, problems per batch B_p, seeds (orders of the
training problems) and rollout streams (the rollouts' randomness within a seed)
(:mod:`algorithms.rl_scaling.sweep`). Measured (:mod:`algorithms.rl_scaling.analysis`): held-out
exact pass@1 (easy) and pass@k (hard), n*(C) with bootstrap intervals over seeds and streams,
power law vs sigmoid for
n*(C) with a bootstrap of their leave-one-budget-out comparison, interference, seed variance per
B_p, and rollout throughput.

    python -m experiments.rl_scaling --config=experiments/configs/rl_scaling.py:tiny --workdir=workdir
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
from flax import nnx

from algorithms.rl_scaling import (
    allocation,
    analysis,
    fit,
    grpo,
    metrics,
    sweep,
    tasks,
    trainer,
    warmstart,
)
from core import figures as style
from core import report
from core.timing import Stopwatch
from experiments import common
from models.transformer import Transformer, param_count

NAME = "rl_scaling"
TITLE = "Compute-optimal RL rollouts: GRPO IsoCompute sweep (rl_scaling)"


def settings(config: ml_collections.ConfigDict):
    """(warm-start config, sweep config) of ``config``; raises ValueError on bad settings."""
    w = config.warmup
    warm = warmstart.WarmStartConfig(**w.to_dict(), grad_clip=config.grad_clip, seed=config.seed)
    gcfg = grpo.GRPOConfig(advantage=config.advantage, aggregation=config.aggregation,
                           clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high,
                           kl_beta=config.kl_beta, kl_estimator=config.kl_estimator,
                           inner_steps=config.inner_steps)
    budgets = allocation.budget_grid(config.smallest_budget, config.num_budgets)
    cfg = sweep.SweepConfig(ns=tuple(config.ns), problems_per_batch=tuple(config.problems_per_batch),
                            num_seeds=config.num_seeds, budgets=budgets, grpo=gcfg,
                            learning_rate=config.learning_rate, grad_clip=config.grad_clip,
                            temperature=config.temperature, pass_k=config.pass_k, seed=config.seed,
                            num_streams=config.num_streams)
    for pairs in cfg.groups().values():
        for n, bp in pairs:
            allocation.Allocation(budgets[-1], n, bp, gcfg.advantage == "grpo")
    return warm, cfg


def arithmetic_tasks(config: ml_collections.ConfigDict) -> tuple[tasks.ArithmeticTask, ...]:
    """The (easy, hard) arithmetic tasks of the config."""
    return (tasks.ArithmeticTask(config.easy.terms, config.easy.digits, "easy"),
            tasks.ArithmeticTask(config.hard.terms, config.hard.digits, "hard"))


def validate(config: ml_collections.ConfigDict) -> tuple[int, ...]:
    """The budget grid of ``config`` after checking every setting (ValueError otherwise)."""
    return settings(config)[1].budgets


def plot_nstar(nstar: dict, fits: dict, n_max: float | None = None) -> plt.Figure:
    """n*(C) per split with its 90% interval and the two fitted laws (leave-one-out MSE of each in
    the panel's title); ``n_max``, the largest n of the sweep's grid, drawn as the ceiling n* cannot
    pass (an n* at it may be capped by the grid)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, split in zip(axes, ("easy", "hard")):
        rows, f = nstar[split], fits[split]
        c = np.asarray([r["budget"] for r in rows], float)
        y = np.asarray([r["n_star"] for r in rows])
        err = np.stack([y - [r["lo"] for r in rows], np.asarray([r["hi"] for r in rows]) - y])
        ax.errorbar(c, y, yerr=np.maximum(err, 0), fmt="o", capsize=3, label="$n^*(C)$, 90% CI")
        grid = np.linspace(np.log2(c.min()), np.log2(c.max()), 50)
        ax.plot(2**grid, 2**fit.power_law(grid, **f["power"]), "--", label="power law")
        ax.plot(2**grid, 2**fit.sigmoid_law(grid, **f["sigmoid"]), "-", label="sigmoid")
        if n_max is not None:
            ax.axhline(n_max, color="0.5", ls=":", lw=1, label="largest n tried")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set(xlabel="rollout budget C", ylabel="best rollouts per problem $n^*$")
        ax.set_title(f"{split} split (LOO MSE: power {f['loo_mse_power']:.2f}, "
                     f"sigmoid {f['loo_mse_sigmoid']:.2f})", fontsize=9)
    style.figure_legend(fig)
    return fig


# Axis labels of the sweep's objectives (analysis.OBJECTIVES); {k} is the sweep's pass_k.
OBJECTIVE_LABELS = {"easy_pass1": "held-out pass@1, easy sums", "hard_passk": "held-out pass@{k}, hard sums"}


def plot_curves(records: list, cfg: sweep.SweepConfig) -> plt.Figure:
    """The best-B_p iso-compute curves: per split, the objective against the budget for each n."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    colors = style.method_colors(cfg.ns)
    for ax, (split, obj) in zip(axes, analysis.OBJECTIVES.items()):
        for n in cfg.ns:
            pts = [(c, v.mean()) for c in cfg.budgets
                   for p, v, _ in [analysis.best_curve(records, c, [n], obj, cfg.num_seeds,
                                                       cfg.num_streams)] if p]
            if pts:
                ax.plot(*zip(*pts), "o-", color=colors[n], label=f"n = {n}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="rollout budget C", ylabel=style.readable(obj, OBJECTIVE_LABELS).format(k=cfg.pass_k),
               title=f"{split} split")
    style.figure_legend(fig, fontsize=8, title="rollouts per problem", title_fontsize=8)
    return fig


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    with Stopwatch() as total:
        out = common.experiment_dir(workdir, NAME)
        warm_cfg, cfg = settings(config)
        train, held, prompt_len, answer_len = tasks.problem_sets(
            arithmetic_tasks(config), config.num_train, config.num_heldout, config.seed)
        evals = {k: tuple(jnp.asarray(v[f]) for f in ("prompts", "targets", "lens"))
                 for k, v in held.items()}
        gd, params = nnx.split(Transformer(
            trainer.policy_config(config.model, prompt_len, answer_len),
            rngs=nnx.Rngs(config.seed)))
        params0, warm_info = warmstart.warm_start(
            warm_cfg, gd, params, train["easy"], train["hard"],
            workdir=os.path.join(out, "warmstart"), desc=f"{NAME} warm start",
            fingerprint=(config.seed, config.grad_clip, config.warmup, config.model,
                         config.easy, config.hard, config.num_train))
        warm = {k: np.asarray(trainer.answer_prob(gd, params0, *evals[k], config.temperature))
                for k in evals}
        warm_metrics = {"easy_pass1": float(warm["easy"].mean()),
                        "hard_pass1": float(warm["hard"].mean()),
                        "hard_passk": float(metrics.expected_pass_at_k(warm["hard"],
                                                                       config.pass_k).mean()),
                        **warm_info}
        pool = {k: jnp.asarray(v) for k, v in tasks.mixed_pool(
            train["easy"], train["hard"], config.num_train, config.hard_fraction_rl).items()}
        res = sweep.run_sweep(cfg, gd, params0, pool, evals, desc=f"{NAME} sweep")
        recs, ns, bps = res.records, cfg.ns, cfg.problems_per_batch
        nstar, fits = {}, {}
        for j, (split, obj) in enumerate(analysis.OBJECTIVES.items()):
            nstar[split] = analysis.n_star_by_budget(recs, cfg.budgets, ns, obj, cfg.num_seeds,
                                                     config.num_boot, config.seed, cfg.num_streams)
            fits[split] = analysis.fit_n_star(recs, nstar[split], ns, obj, cfg.num_seeds,
                                              config.fit_boot, config.seed + 100 * (j + 1),
                                              cfg.num_streams)
        inter = analysis.interference(res.step_metrics, ns)
        if config.cosine_problems:
            ids = np.linspace(0, len(pool["lens"]) - 1, config.cosine_problems).astype(int)
            cos_fn = jax.jit(functools.partial(trainer.group_gradient_cosine, gd, ns=tuple(ns),
                                               max_new_tokens=answer_len, cfg=cfg.grpo,
                                               temperature=config.temperature))
            cos, pairs = jax.device_get(cos_fn(params0, jax.random.key(config.seed + 7),
                                               *(pool[f][ids] for f in ("prompts", "targets",
                                                                        "lens"))))
            for j, n in enumerate(ns):
                inter[str(n)].update(grad_cosine=float(cos[j]), grad_cosine_pairs=int(pairs[j]))
        sampled = {}
        if config.sampled_eval:
            correct = trainer.sampled_correct(gd, params0, jax.random.key(config.seed + 11),
                                              *evals["hard"], num_samples=config.sampled_eval,
                                              temperature=config.temperature)
            for k in sorted({1, config.pass_k}):
                sampled[f"pass@{k}_unbiased"] = float(metrics.pass_at_k(
                    jnp.full_like(correct, config.sampled_eval), correct, k).mean())
                sampled[f"pass@{k}_exact"] = float(metrics.expected_pass_at_k(warm["hard"],
                                                                              k).mean())
    c_max = cfg.budgets[-1]
    result = {
        "n_star": nstar, "fit": fits, "interference": inter, "warm_start": warm_metrics,
        "easy_pass1": analysis.mean_table(recs, "easy_pass1", cfg.budgets, ns, bps),
        "hard_coverage": analysis.mean_table(recs, "hard_passk", cfg.budgets, ns, bps),
        "hard_pass1": analysis.mean_table(recs, "hard_pass1", cfg.budgets, ns, bps),
        "seed_std": analysis.seed_std(recs, c_max, ns, bps, cfg.num_seeds,
                                      num_streams=cfg.num_streams),
        "replicates": {"seeds": cfg.num_seeds, "streams": cfg.num_streams},
        "rollouts_per_s": res.rollouts_per_second, "compile_seconds": res.compile_seconds,
        "budgets": list(cfg.budgets), "pass_k": config.pass_k, "sampled_check": sampled,
        "params": param_count(params0), "records": recs, "seconds": total.seconds,
        "best_at_max_budget": max((r for r in recs if r["budget"] == c_max),
                                  key=lambda r: r["easy_pass1"]),
        "n_star_growth": {s: v[-1]["n_star"] / v[0]["n_star"] for s, v in nstar.items()},
        "sigmoid_decisive": {s: int(f["winner"] == "sigmoid" and f.get("decisive", False))
                             for s, f in fits.items()},
        "fit_winner": {s: f["winner"] for s, f in fits.items()},
        "n_star_slope": {s: n_star_slope(f) for s, f in fits.items()},
        "objective_spread": {s: objective_spread(v[-1]) for s, v in nstar.items()}}
    result["n_star_slope_text"] = ", ".join(
        f"{s} {v['slope']:.2f} " + ("[no interval]" if v["lo"] is None
                                   else f"[{v['lo']:.2f}, {v['hi']:.2f}]")
        for s, v in result["n_star_slope"].items())
    return report.finish(out, title=TITLE, metrics=result, claim=config.claim,
                         body=describe(config, cfg, result, warm_info),
                         figures={"n_star": plot_nstar(nstar, fits, max(cfg.ns)),
                                  "reward_vs_c": plot_curves(recs, cfg)})


def n_star_slope(fit_result: dict) -> dict:
    """The power law's exponent b of log2 n* = a + b log2 C and its 90% bootstrap interval over
    seeds and rollout streams (:func:`analysis.fit_n_star`): {"slope", "lo", "hi", "excludes_zero"}; ``excludes_zero``
    is 1 when the interval lies wholly above or below 0 (the sweep is large enough to tell
    whether n* grows), else 0. Without a bootstrap (fewer than 3 budgets where every n ran, or
    ``fit_boot = 0``) ``lo`` and ``hi`` are None and ``excludes_zero`` is 0: nothing shows that
    the sweep can tell."""
    if "slope_ci" not in fit_result:
        return {"slope": fit_result["power"]["b"], "lo": None, "hi": None, "excludes_zero": 0}
    # the interval bootstraps only the budgets where every n ran: its point is the fit over those
    slope = fit_result.get("slope_at_boot_budgets", fit_result["power"]["b"])
    lo, hi = fit_result["slope_ci"]
    return {"slope": slope, "lo": lo, "hi": hi, "excludes_zero": int(lo > 0 or hi < 0)}


def objective_spread(row: dict) -> float:
    """max - min over n of the seed-mean objective at one budget (a row of
    :func:`analysis.n_star_by_budget`): how much choosing n matters there at all."""
    return float(max(row["mean"]) - min(row["mean"]))


def describe(config, cfg: sweep.SweepConfig, r: dict, warm_info: dict) -> str:
    """The report section's markdown."""
    w, k = r["warm_start"], config.pass_k
    rows = [[e["budget"], f"{e['n_star']:.1f} [{e['lo']:.1f}, {e['hi']:.1f}]",
             f"{h['n_star']:.1f} [{h['lo']:.1f}, {h['hi']:.1f}]"]
            for e, h in zip(r["n_star"]["easy"], r["n_star"]["hard"])]

    def fit_line(split):
        f = r["fit"][split]
        ci = f.get("loo_diff_ci", (float("nan"),) * 2)
        return (f"{split} -> {f['winner']} (LOO MSE power {f['loo_mse_power']:.3f}, sigmoid "
                f"{f['loo_mse_sigmoid']:.3f}; power - sigmoid 90% bootstrap [{ci[0]:.3f}, "
                f"{ci[1]:.3f}]{', decisive' if f.get('decisive') else ', within the spread'}; "
                f"sigmoid's 90%-of-rise budget 2^{f['onset_log2c']:.1f}"
                + (f" [2^{f['onset_ci'][0]:.1f}, 2^{f['onset_ci'][1]:.1f}]" if "onset_ci" in f
                   else "") + ")")

    return "\n".join([
        f"Policy: {r['params']:,}-parameter transformer. Warm start: held-out easy pass@1 "
        f"{w['easy_pass1']:.3f}, hard pass@1 {w['hard_pass1']:.3f}, hard pass@{k} "
        f"{w['hard_passk']:.3f} after {warm_info['easy_steps']} easy-only and "
        f"{warm_info['mixed_steps']} mixed steps"
        + ("." if warm_info["reached"] else " (a stage hit its step cap before its target)."),
        "", f"Sweep: C = {', '.join(map(str, cfg.budgets))} rollouts; n in {cfg.ns}; B_p in "
        f"{cfg.problems_per_batch}; {cfg.num_seeds} seeds x {cfg.num_streams} rollout streams; "
        f"GRPO ({cfg.grpo.advantage}, "
        f"{cfg.grpo.aggregation}, {cfg.grpo.inner_steps} inner steps).", "",
        report.markdown_table(["C", "n* easy (pass@1) [90% CI]", f"n* hard (pass@{k}) [90% CI]"],
                              rows), "",
        f"Fit of log2 n*(C): {fit_line('easy')}; {fit_line('hard')}.", "",
        f"Power-law slope of log2 n* in log2 C, 90% bootstrap over seeds and streams: "
        f"{r['n_star_slope_text']}; an interval that contains 0 cannot tell growth from none. "
        f"Spread of the seed-mean objective across n at the largest budget: "
        + ", ".join(f"{s} {v:.4f}" for s, v in r["objective_spread"].items()) + ".", "",
        report.markdown_table(["n", "share of batch problems whose pass@1 fell",
                               "informative groups", "per-problem gradient cosine"],
                              [[n, v["fallen"], v["informative_groups"],
                                v.get("grad_cosine", float("nan"))]
                               for n, v in r["interference"].items()]), "",
        "Std over seeds x streams of final easy pass@1 per B_p: " + ", ".join(
            f"B_p={b}: {v:.4f}" for b, v in r["seed_std"].items() if v is not None)
        + f". Rollout + update throughput {r['rollouts_per_s']:,.0f} rollouts/s (vmapped lanes, "
        f"compilation excluded; {r['compile_seconds']:.0f} s in first steps).",
        *([f"\nUnbiased pass@k from {config.sampled_eval} samples vs exact (warm start, hard): "
           + ", ".join(f"pass@{j} {r['sampled_check'][f'pass@{j}_unbiased']:.3f} vs "
                       f"{r['sampled_check'][f'pass@{j}_exact']:.3f}" for j in sorted({1, k}))
           + "."] if r["sampled_check"] else [])])


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compile of the paper step (``experiments.aot``)


def paper_steps():
    """The AOT row of ``rl_scaling``, as ``core.aot_steps.PaperSteps``: the run's
    :func:`algorithms.rl_scaling.sweep.group_step` of the ``paper`` sweep (:func:`settings`) for
    the lanes sharing the largest R (rollouts per step), abstract, on a mesh over the pod's
    devices: every (n, B_p, seed) lane of the group samples R rollouts from the policy, scores
    them and takes ``inner_steps`` clipped-surrogate updates (no analytic FLOP count, so no
    MFU)."""
    from core import aot_steps, sharding, steps
    from experiments.configs import rl_scaling as rl_config

    def build(devices):
        config = rl_config.get_config("paper")
        _, cfg = settings(config)
        groups = cfg.groups()
        r = max(groups)
        prompt_len, answer_len = tasks.geometry(arithmetic_tasks(config))
        mcfg = trainer.policy_config(config.model, prompt_len, answer_len)
        gd, params = steps.split(lambda: Transformer(mcfg, rngs=nnx.Rngs(0)), abstract=True)
        n = config.num_train
        pool = {"prompts": jax.ShapeDtypeStruct((n, prompt_len), jnp.int32),
                "targets": jax.ShapeDtypeStruct((n, answer_len), jnp.int32),
                "lens": jax.ShapeDtypeStruct((n,), jnp.int32)}
        step = sweep.group_step(cfg, gd, params, pool, r, sharding.make_mesh(1, devices=devices))
        k = param_count(params)
        return aot_steps.StepSpec.of(
            step, model_flops=None, params=k,
            shape=f"{len(step.aux)} lanes x R {r} rollouts ({len(groups[r])} (n, B_p) x "
            f"{cfg.num_seeds} seeds" + (f" x {cfg.num_streams} streams" if cfg.num_streams > 1 else "")
            + f", padded), prompt {prompt_len} + {answer_len} tokens, d {mcfg.d_model} x "
            f"{mcfg.num_layers} layers, {mcfg.dtype.name}, remat {mcfg.remat}, {k / 1e6:.0f}M params")

    return {f"{NAME}/grpo": (build, "GRPO step, largest rollouts-per-step group")}


if __name__ == "__main__":
    common.app_main(NAME, run)
