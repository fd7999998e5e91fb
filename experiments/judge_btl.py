"""Experiment ``judge_btl``: judge-aware Bradley-Terry-Luce ranking with confidence intervals.

Parts (Xu et al., 2026, "A Judge-Aware Ranking Framework for Evaluating Large Language Models
without Ground Truth"), each a call into :mod:`algorithms.ranking.studies` or
:mod:`algorithms.ranking.speed`:

1. Simulation with known scores and discriminations (reliable, near-random and one adversarial
   judge): recovery on a common scale, held-out log-likelihood, rank intervals; recovery over
   replicate data sets for this panel and for a panel of equally discriminating judges.
2. Coverage of the 95% Wald intervals over many simulated data sets, fitted in one vectorised call.
3. Plain BTL against ``choix`` on judge-free data; fit time against the fastest ``choix``
   estimator at 100 models, 20 judges and 1M comparisons, with where the fit's time goes.
4. Real comparisons from ``--config.data_path`` (LLMFAO, or any CSV, JSON-lines or JSON-array
   file), read and validated before any other work: held-out log-likelihood of plain BTL, the
   judge-aware MLE and the MAP with a cross-validated ridge on the log-discriminations; the
   leaderboard with score and rank intervals. A named file that is missing is an error; with no
   file (the default) this part is left out and the held-out numbers come from the simulation.

    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny --workdir=workdir
"""

from __future__ import annotations

import time

import jax
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
from tqdm import tqdm

from algorithms.ranking import diagnosis, speed, studies
from core import cli, report, timing
from core import figures as style
from core.data import download, judgments
from experiments import common

NAME = "judge_btl"


def load_comparisons(path: str, config: ml_collections.ConfigDict) -> dict:
    """Reads and validates a judgements file (:func:`core.data.judgments.read_judgments`) with the
    config's column mapping: int arrays ``left``, ``right``, ``judge``, ``outcome`` [C], name lists
    ``models`` and ``judges``, the data set's ``name``, ``path`` and ``dropped`` (rows per unknown
    outcome value, with ``config.drop_unknown_outcomes``).

    Raises:
      ValueError: unreadable rows (file and line named), or data that cannot rank the models (no
        decisive comparison, a model that never loses or never wins, a disconnected graph).
    """
    c = config.columns
    js = judgments.read_judgments(path, left=c.left, right=c.right, judge=c.judge, outcome=c.outcome,
                                  left_value=c.left_value, right_value=c.right_value,
                                  tie_value=c.tie_value, drop_unknown=config.drop_unknown_outcomes,
                                  name=config.data_name or None,
                                  column_options={f: f"--config.columns.{f}"
                                                  for f in ("left", "right", "judge", "outcome")})
    try:  # the leaderboard's ridge on the log-discriminations keeps every judge's parameter finite
        studies.check_comparisons(studies.Comparisons(js.left, js.right, js.judge, js.outcome),
                                  js.models, js.judges, ridge_alpha=1.0)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return dict(left=js.left, right=js.right, judge=js.judge, outcome=js.outcome, models=js.models,
                judges=js.judges, name=js.name, path=path, dropped=js.dropped)


def _recovery_figure(truth, sim):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].errorbar(truth.scores, sim["scores_hat"], yerr=1.96 * sim["scores_se"], fmt="o", ms=3)
    lim = float(np.max(np.abs(truth.scores))) * 1.15
    axes[0].plot([-lim, lim], [-lim, lim], "k--", lw=0.8, label="perfect recovery (y = x)")
    axes[0].set(xlabel="true score $s$", ylabel="estimated score (95% CI)", title="scores")
    axes[1].errorbar(sim["gamma_true"], sim["gamma_hat"], yerr=1.96 * sim["gamma_se"], fmt="o", ms=3)
    g = float(np.max(sim["gamma_true"])) * 1.2
    axes[1].plot([0, g], [0, g], "k--", lw=0.8, label="perfect recovery (y = x)")
    axes[1].set(xlabel="true discrimination $\\gamma$", ylabel="estimated $\\gamma$ (95% CI, delta method)",
                title="judges (reliable, near random, adversarial)")
    style.figure_legend(fig)
    return fig


def _real_figures(config, d, r):
    order = np.argsort(r["rank"])
    n, y = len(order), np.arange(len(order))
    fig1, ax = plt.subplots(figsize=(7, max(3, 0.16 * n + 1)))
    ax.hlines(y, r["rank_lo"][order], r["rank_hi"][order], color="tab:blue", lw=2,
              label="95% rank interval")
    ax.plot(r["rank"][order], y, "k|", ms=8, label="estimated rank")
    ax.set_yticks(y, [f"{d['models'][k]} ({r['scores'][k]:+.2f})" for k in order], fontsize=6)
    ax.invert_yaxis()
    ax.set(xlabel="rank (1 = best)", ylabel="model (estimated score)")
    ax.set_title(f"{d['name']}, judge-aware MAP (ridge on alpha = {r['ridge_alpha']:g}): "
                 f"{config.level:.0%} rank intervals", fontsize=9)
    style.legend_outside(ax)
    fig2, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(r["comparisons_per_judge"], r["gamma"], yerr=1.96 * r["gamma_se"], fmt="o", ms=3, alpha=0.6)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="$\\gamma = 1$ (plain BTL)")
    ax.set(xscale="log", xlabel="comparisons by the judge", ylabel="discrimination $\\gamma$ (95% CI)",
           title=f"{d['name']}: judges")
    style.legend_outside(ax)
    stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in d["name"]) or "data"
    return {f"{stem}_rank_intervals": fig1, f"{stem}_judges": fig2}


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    # a named file must exist (FileNotFoundError naming it); a data set by name is downloaded
    # once (one-line error offline); "" = simulation only, or the benchmark data set if reachable
    path = cli.check_data_path(config.data_path, "judge_btl comparisons (--config.data_path)")
    if config.data:
        path = download.fetch(config.data, config.data_dir)
    data_only, missing, benchmark = config.data_only, "", None
    if path is None and config.benchmark.data:
        benchmark = config.benchmark.data
        data_only = False  # the benchmark is fitted beside the studies
        path, missing = download.fetch_if_reachable(benchmark, config.data_dir,
                                                    timeout=config.benchmark.timeout)
    real = load_comparisons(path, config) if path else None  # validated before any other work
    out_dir = common.experiment_dir(workdir, NAME)
    if real is not None and data_only:
        return _run_data_only(config, real, out_dir)
    sim_c, cov_c, tim_c = config.sim, config.coverage, config.timing
    panel = studies.judge_panel(sim_c.num_reliable, sim_c.num_noisy, sim_c.reliable_gamma,
                                sim_c.noisy_gamma, sim_c.adversarial_gamma)
    truth = studies.simulation_truth(sim_c.num_models, panel, sim_c.score_spread, config.seed)
    equal = studies.simulation_truth(sim_c.num_models, np.ones_like(panel), sim_c.score_spread, config.seed)
    cov_truth = studies.simulation_truth(cov_c.num_models, np.resize(studies.judge_panel(
        2, 2, 2.0, 0.5, 0.2), cov_c.num_judges), 1.0, config.seed + 7)
    steps = {
        "simulation": lambda: studies.simulation_study(truth, sim_c.num_comparisons, config.heldout_fraction,
                                                       config.level, config.rank_draws, config.seed),
        "replicates": lambda: {name: studies.recovery_replicates(t, sim_c.num_comparisons,
                                                                 sim_c.num_replicates, config.seed + 13)
                               for name, t in (("panel", truth), ("equal_judges", equal))},
        "coverage": lambda: studies.coverage_study(cov_truth, cov_c.per_cell, cov_c.num_datasets,
                                                   config.level, config.seed + 11),
        "choix": lambda: studies.choix_agreement(config.choix.num_models, config.choix.num_comparisons,
                                                 config.seed),
        "timing": lambda: speed.speed_comparison(tim_c.num_models, tim_c.num_judges, tim_c.num_comparisons,
                                                 tim_c.choix_estimators, config.seed, tim_c.repeats),
    }
    if real is not None:
        steps["real_data"] = lambda: _real_data_study(config, real)
    res, part_seconds = _run_parts(steps)
    sim, cov, tim, llm = res["simulation"], res["coverage"], res["timing"], res.get("real_data")
    figures = {"simulation_recovery": _recovery_figure(truth, sim)}
    if llm is not None:
        figures.update(_real_figures(config, real, llm))
        llm = _real_metrics(real, llm, config.level)
    metrics = dict(
        headline=dict(
            heldout_source=llm["name"] if llm else "simulation",
            heldout_loglik_judge_aware=llm["heldout_judge_aware_map"] if llm else sim["heldout"]["judge_aware"],
            heldout_loglik_btl=llm["heldout_btl"] if llm else sim["heldout"]["btl"],
            ci_coverage=cov["scores"], choix_max_abs_diff=res["choix"],
            speedup_vs_choix=tim["speedup_vs_choix"]),
        sim_rmse_judge_aware=sim["rmse_aligned"]["judge_aware"], sim_rmse_btl=sim["rmse_aligned"]["btl"],
        simulation=dict(heldout_loglik_judge_aware=sim["heldout"]["judge_aware"],
                        heldout_loglik_btl=sim["heldout"]["btl"], score_rmse=sim["score_rmse"],
                        score_rmse_btl=sim["score_rmse_btl"], scale=sim["scale"],
                        replicates=res["replicates"],
                        **{k: sim[k] for k in ("gamma_true", "gamma_hat", "rank_ci_width",
                                               "rank_ci_covers_truth", "iterations",
                                               "se_ratio_observed_to_expected")}),
        coverage=cov, choix=dict(max_abs_diff=res["choix"]),
        timing=dict(fit_compile_seconds=tim["compile_seconds"], models=tim_c.num_models,
                    judges=tim_c.num_judges, comparisons=tim_c.num_comparisons,
                    **{k: v for k, v in tim.items() if k not in ("compile_seconds", "gamma_recovery_max_abs")}),
        real_data=llm, part_seconds=part_seconds, data_only=False,
        benchmark=benchmark and {"data": benchmark, "measured": not missing,
                                 "how_to_get": missing or None})
    metrics["summary"] = _summary(metrics)
    if missing:
        metrics["summary"] += f"; {benchmark} not measured here: {missing}"
    return report.finish(out_dir, title=TITLE, metrics=metrics,
                         body=_body(config, metrics), claim=config.claim, figures=figures)


TITLE = "Judge-aware BTL ranking (judge_btl)"


def _real_data_study(config: ml_collections.ConfigDict, real: dict) -> dict:
    return studies.real_data_study(
        studies.Comparisons(real["left"], real["right"], real["judge"], real["outcome"]),
        len(real["models"]), len(real["judges"]), seed=config.seed, num_splits=config.num_splits,
        heldout_fraction=config.heldout_fraction, ridge_grid=config.ridge_grid,
        cv_folds=config.cv_folds, level=config.level, rank_draws=config.rank_draws,
        bootstrap_samples=config.bootstrap_samples)


def _run_parts(steps: dict) -> tuple[dict, dict]:
    """Runs each part (in float64) with a progress bar: ({part: result}, {part: seconds})."""
    res, part_seconds = {}, {}
    with jax.enable_x64(True):
        for name, fn in tqdm(steps.items(), desc=NAME, leave=False):
            cpu = time.process_time()
            with timing.Stopwatch() as sw:
                res[name] = fn()
            part_seconds[name] = dict(wall=sw.seconds, cpu=time.process_time() - cpu)
    return res, part_seconds


def _run_data_only(config: ml_collections.ConfigDict, real: dict, out_dir: str) -> report.Section:
    """``data_only``: the fit on the user's comparisons alone. The simulation, coverage, choix and
    timing studies do not run; their metrics are ``None`` (not measured), so the claim is judged
    on the held-out comparison of the user's data only."""
    res, part_seconds = _run_parts({"real_data": lambda: _real_data_study(config, real)})
    figures = _real_figures(config, real, res["real_data"])
    llm = _real_metrics(real, res["real_data"], config.level)
    metrics = dict(
        headline=dict(heldout_source=llm["name"],
                      heldout_loglik_judge_aware=llm["heldout_judge_aware_map"],
                      heldout_loglik_btl=llm["heldout_btl"], ci_coverage=None,
                      choix_max_abs_diff=None, speedup_vs_choix=None),
        sim_rmse_judge_aware=None, sim_rmse_btl=None, simulation=None, coverage=None, choix=None,
        timing=None, real_data=llm, part_seconds=part_seconds, data_only=True)
    metrics["summary"] = _summary(metrics)
    body = "\n".join([
        "Judge-aware BTL (Xu et al., 2026): `P(i beats j | judge k) = sigmoid(gamma_k (s_i - s_j))`, "
        "joint Newton MLE/MAP in zero-sum coordinates, Wald intervals from the expected (Fisher) "
        "information.", "",
        "Data only (`--config.data_only=True`, the default with a comparisons file): the simulation, "
        "interval-coverage, choix and timing studies did not run; run with "
        "`--config.data_only=False` for them.", "", *_real_lines(config, llm)])
    return report.finish(out_dir, title=TITLE, metrics=metrics, body=body, claim=config.claim,
                         figures=figures)


def _summary(m: dict) -> str:
    """The opening table's "ours" cell: what this run measured."""
    h, cov = m["headline"], m["coverage"]
    heldout = (f"held-out {h['heldout_loglik_judge_aware']:.4f} vs BTL "
               f"{h['heldout_loglik_btl']:.4f} ({h['heldout_source']})")
    if cov is None:
        return heldout + "; simulation, coverage, choix and timing not run (data only)"
    return (f"coverage {h['ci_coverage']:.3f} (over the {cov['num_used']} of "
            f"{cov['num_datasets']} simulated data sets with a converged, finite MLE); {heldout}; "
            f"score RMSE on a common scale {m['sim_rmse_judge_aware']:.4f} vs BTL "
            f"{m['sim_rmse_btl']:.4f}; choix diff {h['choix_max_abs_diff']:.1e}; "
            f"{h['speedup_vs_choix']:.0f}x faster than choix")


def _real_metrics(d, r, level: float) -> dict:
    """The real-data part's metrics: counts, held-out numbers, the leaderboard (best first) and
    each judge's discrimination by name (most discriminating first); where the judge-aware MLE's
    held-out number is not finite on some split, ``mle_diagnosis``
    (:func:`algorithms.ranking.diagnosis.mle_diagnosis`, else None)."""
    failed = any(not np.isfinite(float(s["judge_aware_mle"])) for s in r["splits"])
    comps = studies.Comparisons(d["left"], d["right"], d["judge"], d["outcome"])
    return dict(judges=studies.judge_table(d["judges"], r["gamma"], r["gamma_se"],
                                           r["comparisons_per_judge"], level),
                mle_diagnosis=diagnosis.mle_diagnosis(comps, d["models"], d["judges"]) if failed else None,
                name=d["name"], path=d["path"], num_comparisons=int(d["left"].shape[0]),
                num_models=len(d["models"]), num_judges=len(d["judges"]),
                dropped_outcomes=dict(d["dropped"]), num_dropped=int(sum(d["dropped"].values())),
                leaderboard=studies.leaderboard(d["models"], r), leaderboard_ridge_alpha=r["ridge_alpha"],
                gamma_quantiles=np.quantile(r["gamma"], [0.05, 0.25, 0.5, 0.75, 0.95]),
                **{k: r[k] for k in ("heldout_btl", "heldout_judge_aware_map", "heldout_judge_aware_mle",
                                     "splits", "rank_ci_width", "kendall_tau_vs_btl", "bootstrap_used",
                                     "bootstrap_dropped", "se_ratio_observed_to_expected")})


def _body(config, m) -> str:
    h, cov, tim, sim, llm = m["headline"], m["coverage"], m["timing"], m["simulation"], m["real_data"]
    b, rep = tim["breakdown"], sim["replicates"]
    lines = [
        "Judge-aware BTL (Xu et al., 2026): `P(i beats j | judge k) = sigmoid(gamma_k (s_i - s_j))`, "
        "joint Newton MLE/MAP in zero-sum coordinates, Wald intervals from the expected (Fisher) "
        "information (the paper's convention; the observed information is offered too).", "",
        report.markdown_table(["quantity", "target", "ours"], [
            ["simulated data sets left out of the coverage (no finite MLE, or no convergence)", "",
             f"{cov['num_dropped']} of {cov['num_datasets']} ({cov['dropped_fraction']:.1%})"],
            [f"95% CI coverage of s_i, expected information (over the {cov['num_used']} data sets "
             "kept; +- its Monte Carlo standard error)", "[0.93, 0.97]",
             f"{cov['scores']:.4g}" + ("" if cov.get("scores_mc_se") is None
                                      else f" +- {cov['scores_mc_se']:.4f}")],
            ["  ... of s_i - s_j / of alpha_k", "[0.93, 0.97]",
             f"{cov['differences']:.3f} / {cov['log_discrimination']:.3f}"],
            ["  ... s_i / s_i - s_j / alpha_k with the observed information", "",
             f"{cov['observed']['scores']:.3f} / {cov['observed']['differences']:.3f} / "
             f"{cov['observed']['log_discrimination']:.3f}"],
            ["max |ours - choix| (plain BTL, simulated)", "<= 1e-6", f"{m['choix']['max_abs_diff']:.2e}"],
            [f"fit seconds (aggregation + fit, synthetic: {tim['models']} models, {tim['judges']} judges, "
             f"{tim['comparisons']:,} comparisons)", "", tim["fit_seconds"]],
            ["fastest choix seconds (" + ", ".join(tim["choix_times"]) + ")", "", tim["choix_seconds"]],
            ["speed-up", ">= 10x", f"{tim['speedup_vs_choix']:.1f}x"],
            [f"held-out log-lik / comparison, judge-aware ({h['heldout_source']})", "> plain BTL",
             h["heldout_loglik_judge_aware"]],
            [f"held-out log-lik / comparison, plain BTL ({h['heldout_source']})", "", h["heldout_loglik_btl"]],
            [f"score RMSE on a common scale (simulation, {config.sim.num_models} models)",
             "judge-aware < plain BTL", f"{m['sim_rmse_judge_aware']:.4f} vs {m['sim_rmse_btl']:.4f}"],
            [f"mean 95% rank-interval width (simulation, {config.sim.num_models} models)", "",
             sim["rank_ci_width"]]]), "",
        f"Fit time: aggregation {b['aggregate']:.3f} s, transfer {b['transfer']:.4f} s, Newton solve "
        f"{b['solve']:.3f} s ({tim['iterations']} iterations, {b['per_iteration'] * 1e3:.1f} ms each); "
        f"compilation {tim['fit_compile_seconds']:.1f} s apart.", "",
        f"Simulation ({config.sim.num_models} models, {len(sim['gamma_true'])} judges, "
        f"{config.sim.num_comparisons:,} comparisons). Scores are identified up to a shift and, with the "
        "discriminations, a common scale (here sum alpha = 0, which ties it to every judge's alpha, the "
        "barely identified adversarial one's included): in that convention the judge-aware RMSE is "
        f"{sim['score_rmse']:.3f} (least-squares factor to the truth's scale "
        f"{sim['scale']['judge_aware']:.3f}), against {sim['score_rmse_btl']:.3f} for plain BTL rescaled "
        "with the truth's spread. On a common scale (least-squares scale alignment, both fits): "
        f"judge-aware {m['sim_rmse_judge_aware']:.4f}, plain BTL {m['sim_rmse_btl']:.4f}. Over "
        f"{rep['panel']['num_used']} replicate data sets: {rep['panel']['rmse_judge_aware']:.4f} vs "
        f"{rep['panel']['rmse_btl']:.4f} (judge-aware better in {rep['panel']['judge_aware_better']:.0%}); "
        f"with equally discriminating judges {rep['equal_judges']['rmse_judge_aware']:.4f} vs "
        f"{rep['equal_judges']['rmse_btl']:.4f} (better in {rep['equal_judges']['judge_aware_better']:.0%}; "
        f"there the extra parameters can only add variance). Rank intervals cover the true rank for "
        f"{sim['rank_ci_covers_truth']:.0%} of models. Score standard errors from the observed "
        "information over those from the expected information (min / median / max over models): "
        + " / ".join(f"{v:.3f}" for v in sim["se_ratio_observed_to_expected"]) + "; in the "
        "coverage study the median of the per-data-set mean ratio is "
        f"{cov['se_ratio_observed_to_expected']:.3f}."]
    if llm is None:
        bm = m.get("benchmark") or {}
        why = (f"{bm['data']} not measured here: {bm['how_to_get']}. " if bm.get("how_to_get")
               else "")
        return "\n".join(lines + ["", f"{why}No comparisons file given (`--config.data_path` or "
                                   "`--config.data`): held-out numbers are from the simulation."])
    return "\n".join(lines + ["", *_real_lines(config, llm)])


def _mle_failures(splits: list) -> str:
    """After the judge-aware MLE's held-out number: on how many splits it has no finite value."""
    bad = sum(not np.isfinite(float(s["judge_aware_mle"])) for s in splits)
    if not bad:
        return ""
    if bad == len(splits):
        return (" (no finite MLE on the training part of " + ("the split" if bad == 1 else
                f"any of the {bad} splits") + ")")
    return f" (the mean over the {len(splits) - bad} of {len(splits)} splits with a finite MLE)"


def _mle_reason(llm: dict) -> str:
    """Why the unpenalised judge-aware MLE has no finite value (:func:`diagnosis.explain` of the
    whole file's diagnosis), ending in a space; "" when it was finite on every split."""
    g = llm.get("mle_diagnosis")
    if g is None:
        return ""
    return diagnosis.explain(g) + " Each split's reason is in metrics.json (real_data.splits, mle_error). "


def _real_lines(config, llm) -> list[str]:
    """The report's lines on the real comparisons: counts, held-out numbers, the leaderboard's
    top 10 and the judges' discriminations."""
    dropped = (f"; {llm['num_dropped']:,} rows with unknown outcomes dropped ("
               + ", ".join(f"{k!r}: {v}" for k, v in sorted(llm["dropped_outcomes"].items())) + ")"
               if llm["num_dropped"] else "")
    boot = ("" if llm["bootstrap_used"] is None else f" Bootstrap: {llm['bootstrap_used']} replicates "
            f"used, {llm['bootstrap_dropped']} dropped (not converged or MLE at infinity).")
    judges = llm["judges"]
    shown = judges if len(judges) <= 20 else judges[:10] + judges[-10:]
    return [
        f"{llm['name']} ({llm['num_comparisons']:,} comparisons, {llm['num_models']} models, "
        f"{llm['num_judges']} judges{dropped}), {config.num_splits} random {1 - config.heldout_fraction:.0%}/"
        f"{config.heldout_fraction:.0%} splits, ties as half wins. Held-out log-likelihood per comparison: "
        f"plain BTL {llm['heldout_btl']:.4f}, judge-aware MLE {llm['heldout_judge_aware_mle']:.4f}"
        f"{_mle_failures(llm['splits'])}, judge-aware MAP (ridge on alpha by {config.cv_folds}-fold CV) "
        f"{llm['heldout_judge_aware_map']:.4f}. " + _mle_reason(llm) +
        f"The leaderboard uses the MAP with ridge {llm['leaderboard_ridge_alpha']:g}; Kendall tau with the "
        f"plain-BTL order {llm['kendall_tau_vs_btl']:.3f}; mean rank-interval width "
        f"{llm['rank_ci_width']:.1f}; score standard errors, observed over expected information "
        "(min / median / max): " + " / ".join(f"{v:.3f}" for v in llm["se_ratio_observed_to_expected"])
        + "." + boot, "",
        report.markdown_table(["rank", "model", "score (95% CI)", "rank interval", "plain BTL rank"], [
            [e["rank"], e["model"], f"{e['score']:+.3f} [{e['lo']:+.3f}, {e['hi']:+.3f}]",
             f"{e['rank_lo']}-{e['rank_hi']}", e["btl_rank"]] for e in llm["leaderboard"][:10]]),
        "", "(top 10; the full leaderboard is in metrics.json under real_data)", "",
        f"Judges' discriminations gamma ({config.level:.0%} Wald interval), most discriminating "
        "first" + ("" if shown is judges else f"; the 10 highest and 10 lowest of {len(judges)}, "
                   "all in metrics.json under real_data.judges") + ":", "",
        report.markdown_table(["judge", "gamma", f"{config.level:.0%} interval", "comparisons"], [
            [e["judge"], f"{e['gamma']:.3f}", f"[{e['lo']:.3f}, {e['hi']:.3f}]", e["comparisons"]]
            for e in shown])]


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compile of the paper step (``experiments.aot``)

aot_precision = speed.aot_precision  # the fit's precision per platform, named in experiments.aot


def paper_steps():
    """The AOT row of ``judge_btl``: the ``paper`` timing study's fit, as
    ``core.aot_steps.PaperSteps``."""
    from experiments.configs import judge_btl as jb_config

    t = jb_config.get_config("paper").timing
    return {f"{NAME}/fit": (lambda devices: speed.fit_step_spec(t.num_models, t.num_judges, devices),
                            "judge-aware BTL Newton fit")}


if __name__ == "__main__":
    common.app_main(NAME, run)
