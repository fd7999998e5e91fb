"""Experiment ``benchmark_game``: benchmarks as a Stackelberg game (Chen, Zhang & Hardt,
"Leaderboard Incentives: Model Rankings under Strategic Post-Training", ICML 2026).

For a grid of tune-before-test levels ``Delta`` it counts the pure Nash equilibria of the providers'
subgame (``theta`` on ``levels`` effort levels with two score families, ``theta5`` on ``levels5``),
runs best-response dynamics where none exists, checks the condition under which "no equilibrium at
``Delta = 0``" can hold (effort cheap relative to the reward gap), finds the designer's threshold
``Delta*`` numerically and in closed form, sweeps ``Delta*`` against the quality gap, solves the
two-provider game at ``Delta = 0`` in mixed strategies, and times the equilibrium search. Every
label in the report is derived from the config.

    python -m experiments.benchmark_game --config=experiments/configs/benchmark_game.py:tiny --workdir=workdir
"""

from __future__ import annotations

import jax
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
from tqdm import tqdm

import algorithms.benchmark_game as bg
from core import figures as style
from core import report, timing
from experiments import common

NAME = "benchmark_game"


def game_labels(config: ml_collections.ConfigDict) -> dict[str, str]:
    """Report and legend labels of the three games, from the config."""
    n3, n5 = len(config.theta), len(config.theta5)
    return {"main": f"N={n3}, {config.levels} levels, additive, {config.rewards}",
            "logit": f"N={n3}, {config.levels} levels, logit-in-log-steps, {config.rewards}",
            "five": f"N={n5}, {config.levels5} levels, additive, {config.rewards5}"}


def _plot_counts(results):
    fig, ax = plt.subplots(figsize=(9.0, 3.8))  # wide: the game labels in the legend are long
    for label, r, line in results:
        ax.step(r["deltas"], r["n_pure_ne"], where="mid", label=label, **line)
        ax.axvline(r["delta_star_closed_form"], color=line["color"], ls=":", lw=1)
    ax.set_xlabel("tune-before-test training $\\Delta$")
    ax.set_ylabel("number of pure Nash equilibria")
    ax.set_title("Pure equilibria vs $\\Delta$ (dotted: closed-form $\\Delta^*$)")
    style.integer_ticks(ax, "y")
    style.legend_outside(ax, fontsize=8)
    return fig


def _plot_gaps(add, logit):
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
    for ax, r, title in ((axes[0], add, "additive saturating"), (axes[1], logit, "logit in log-steps")):
        ax.plot(r["gaps"], r["closed_form"], "-", label="closed form")
        ax.plot(r["gaps"], r["numeric_refined"], "o", mfc="none", label="numeric (grid + bisection)")
        ax.set_xlabel("quality gap $\\theta_1 - \\theta_2$")
        ax.set_ylabel("$\\Delta^*$")
        ax.set_title(f"two providers, {title}")
    style.figure_legend(fig, fontsize=8)
    return fig


def _plot_designer(r, objective, cost_per_delta, label):
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(r["deltas"], r["kendall_tau"], "o-", ms=3, label="ranking fidelity (Kendall $\\tau$)")
    ax.plot(r["deltas"], objective, "s-", ms=3, label=f"objective $\\tau - {cost_per_delta:g}\\,\\Delta$")
    ax.axvline(r["delta_star_closed_form"], color="gray", ls=":", lw=1, label="closed-form $\\Delta^*$")
    ax.set_xlabel("tune-before-test training $\\Delta$")
    ax.set_ylabel("Kendall $\\tau$ / objective")
    ax.set_title(f"The designer's objective ({label})")
    style.legend_outside(ax, fontsize=8)
    return fig


def games(config: ml_collections.ConfigDict) -> dict[str, tuple]:
    """The three games of the config, name -> (score family, contest, theta float64 [N], rewards
    [N], Delta grid float64 [G]): ``"main"`` (additive score, N = len(theta)), ``"logit"`` (the
    logit family on the same contest) and ``"five"`` (additive, the five-provider contest)."""
    additive = bg.AdditiveSaturating(config.amplitude, config.rate)
    logit = bg.LogitLogSteps(config.logit_slope)
    cost = bg.PowerCost(config.cost_scale, config.cost_power)
    theta, theta5 = np.asarray(config.theta, np.float64), np.asarray(config.theta5, np.float64)
    rewards = bg.named_rewards(config.rewards, len(theta))
    rewards5 = bg.named_rewards(config.rewards5, len(theta5))
    contest = bg.make_contest(theta, np.linspace(0.0, config.max_effort, config.levels), rewards,
                              cost)
    contest5 = bg.make_contest(theta5, np.linspace(0.0, config.max_effort, config.levels5),
                               rewards5, cost)
    return {
        "main": (additive, contest, theta, rewards, np.linspace(0.0, config.max_delta, config.num_deltas)),
        "logit": (logit, contest, theta, rewards,
                  np.linspace(0.0, config.logit_max_delta, config.num_deltas)),
        "five": (additive, contest5, theta5, rewards5,
                 np.linspace(0.0, config.max_delta5, config.num_deltas5)),
    }


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out_dir = common.experiment_dir(workdir, NAME)
    cost = bg.PowerCost(config.cost_scale, config.cost_power)
    labels = game_labels(config)
    with timing.Stopwatch() as total:
        games_ = games(config)
        additive, contest, theta, _, _ = games_["main"]
        logit = games_["logit"][0]
        contest5, theta5 = games_["five"][1], games_["five"][2]
        res = {k: bg.analyse(s, cost, c, th, rw, d, config.max_rounds, config.bisection_steps)
               for k, (s, c, th, rw, d) in tqdm(games_.items(), desc=NAME, leave=False)}
        seconds = timing.best_seconds({
            f"n{len(theta)}_m{config.levels}": lambda: bg.pure_equilibria(additive, contest, 0.5),
            f"n{len(theta5)}_m{config.levels5}": lambda: bg.pure_equilibria(additive, contest5, 0.5),
        }, repeats=config.timing_repeats)
        gap_args = (config.max_effort, config.gap_levels, config.gap_deltas, config.bisection_steps)
        gaps = {"additive": bg.gap_sweep(additive, cost, config.gaps, *gap_args),
                "logit": bg.gap_sweep(logit, cost, config.logit_gaps, *gap_args)}
        mixed = bg.mixed_at_zero(additive, cost, theta, config.max_effort, config.mixed_levels)
    main = res["main"]
    for r in res.values():
        r["n_pure_ne_at_zero"] = int(r["n_pure_ne"][0])
    objective = bg.designer_objective(main["deltas"], main["kendall_tau"], config.cost_per_delta)
    best = int(np.nanargmax(objective))
    metrics = {
        **{k: main[k] for k in ("deltas", "n_pure_ne", "kendall_tau", "kendall_tau_source",
                                "delta_star_numeric", "delta_star_refined", "delta_star_closed_form",
                                "zero_effort_margin", "n_pure_ne_at_zero", "ne_ranks_by_quality",
                                "br_cycle_at_zero", "br_cycle_length_at_zero")},
        "game_labels": labels, "seconds": seconds,
        "designer": {"cost_per_delta": config.cost_per_delta, "objective": objective,
                     "best_delta": float(main["deltas"][best]), "best_objective": float(objective[best])},
        "logit_family": res["logit"], "five_providers": res["five"],
        "delta_star_vs_gap": gaps, "mixed_two_providers_at_zero": mixed,
        "config": config.to_dict(), "total_seconds": total.seconds,
    }
    figures = {
        "n_pure_ne_vs_delta": _plot_counts([(labels["main"], main, {"color": "C0"}),
                                            (labels["logit"], res["logit"], {"color": "C1", "ls": "--"}),
                                            (labels["five"], res["five"], {"color": "C2", "ls": "-."})]),
        "delta_star_vs_gap": _plot_gaps(gaps["additive"], gaps["logit"]),
        "designer_objective": _plot_designer(main, objective, config.cost_per_delta, labels["main"]),
    }
    return report.finish(out_dir, title="Benchmarks as a Stackelberg game", metrics=metrics,
                         body=_body(config, labels, res, gaps, mixed, seconds, objective, best),
                         claim=config.claim, figures=figures)


def _body(config, labels, res, gaps, mixed, seconds, objective, best) -> str:
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    rows = [[labels[k], f"{r['zero_effort_margin']:.3f}", r["n_pure_ne_at_zero"], yes(r["br_cycle_at_zero"]),
             r["br_cycle_length_at_zero"], r["delta_star_closed_form"], r["delta_star_numeric"],
             r["delta_star_refined"], yes(r["ne_ranks_by_quality"])] for k, r in res.items()]
    table = report.markdown_table(
        ["game", "max overtaking profit at Delta=0 (> 0 needed)", "pure NE at Delta=0",
         "BR cycles at 0", "cycle length (rounds)", "Delta* closed form", "Delta* numeric (grid)",
         "Delta* numeric (bisection)", "unique zero-effort NE, tau = 1, for Delta >= Delta*"],
        rows, fmt=".3f")
    mixed_rows = [[f"{e['p_better_ranks_first']:.3f}", f"{e['expected_kendall_tau']:.3f}",
                   f"{e['expected_effort'][0]:.2f} / {e['expected_effort'][1]:.2f}"]
                  for e in mixed["equilibria"]]
    main = res["main"]
    names = {f"n{len(config.theta)}_m{config.levels}": f"N={len(config.theta)}, {config.levels} levels",
             f"n{len(config.theta5)}_m{config.levels5}": f"N={len(config.theta5)}, {config.levels5} levels"}
    timed = ", ".join(f"{s * 1e3:.1f} ms ({names[k]})" for k, s in seconds.items())
    return "\n".join([
        "Providers choose benchmark-specific effort after the designer fixes the tune-before-test "
        f"training Delta; payoff = rank reward - cost. Cost {config.cost_scale:g} e^{config.cost_power:g}, "
        f"effort grid [0, {config.max_effort:g}].",
        "", table, "",
        "No equilibrium at Delta = 0 needs effort to be cheap relative to the reward gap: some provider "
        "must gain more by just overtaking a better one than the effort costs, max over pairs of "
        "(r_k - r_j) - c(e_jk(0)) > 0 (equivalently Delta* > 0); otherwise zero effort ranked by "
        "quality is already an equilibrium at Delta = 0. The second column gives it for these settings.",
        "",
        f"Designer (fidelity - {config.cost_per_delta:g} Delta, {labels['main']}): best grid Delta = "
        f"{main['deltas'][best]:.2f}, objective {objective[best]:.3f}.",
        "Delta* vs quality gap (two providers): largest |numeric - closed form| = "
        f"{gaps['additive']['max_abs_diff']:.3g} (additive), {gaps['logit']['max_abs_diff']:.3g} (logit).",
        f"The two best providers (theta {config.theta[0]:g}, {config.theta[1]:g}, winner takes all) at "
        f"Delta = 0 on {config.mixed_levels} levels: {mixed['n_pure_ne']} pure, "
        f"{mixed['n_mixed_ne']} mixed equilibria (support and vertex enumeration).", "",
        report.markdown_table(["P(better model ranks first)", "expected Kendall tau",
                               "expected effort (better / worse)"], mixed_rows) if mixed_rows else "",
        "",
        f"Equilibrium search after compilation: {timed} on {jax.devices()[0].platform}.",
    ])


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compile of the paper step (``experiments.aot``)


def paper_steps():
    """The AOT rows of ``benchmark_game``, as ``core.aot_steps.PaperSteps``: the pure-equilibrium
    sweeps over the Delta grid that :func:`run` computes for the ``paper`` 3- and 5-provider games
    (``designer.sweep_step``, as ``bg.analyse`` runs it; one payoff tensor [N, M**N] per Delta),
    abstract and replicated on the pod's devices."""
    from algorithms.benchmark_game import designer
    from core import aot_steps, sharding
    from experiments.configs import benchmark_game as bg_config

    def build(game):
        def builder(devices):
            score, contest, theta, _, deltas = games(bg_config.get_config("paper"))[game]
            step = designer.sweep_step(score, contest, deltas,
                                       sharding.make_mesh(1, devices=devices))
            n, levels = len(theta), contest.efforts.shape[0]
            return aot_steps.StepSpec.of(
                step, model_flops=None, params=0, shape=f"N {n} providers x {levels} effort "
                f"levels, {len(deltas)} deltas (payoff tensor {n} x {levels}^{n} per delta)")
        return builder

    return {f"{NAME}/n3": (build("main"), "pure-equilibrium sweep, 3 providers"),
            f"{NAME}/n5": (build("five"), "pure-equilibrium sweep, 5 providers")}


if __name__ == "__main__":
    common.app_main(NAME, run)
