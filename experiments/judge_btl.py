"""Experiment ``judge_btl``: judge-aware Bradley-Terry-Luce ranking with confidence intervals.

Parts (Xu et al., 2026, "A Judge-Aware Ranking Framework for Evaluating Large Language Models
without Ground Truth"):

1. Simulation with known scores and discriminations (reliable, near-random and one adversarial
   judge with tiny discrimination): recovery, held-out log-likelihood, rank intervals.
2. Coverage of the 95% Wald intervals (Fisher information) over many simulated data sets, fitted
   in one vectorised call.
3. Plain BTL against ``choix`` on judge-free data; fit time against the fastest ``choix``
   estimator at 100 models, 20 judges and 1M comparisons.
4. LLMFAO (crowd workers judge pairs of LLM answers), when the file is present: held-out
   log-likelihood of plain BTL, the judge-aware MLE and the judge-aware MAP with a ridge on the
   log-discriminations chosen by cross-validation; the leaderboard with score and rank intervals.

    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny --workdir=workdir
"""

from __future__ import annotations

import csv
import json
import os
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
from tqdm import tqdm

from algorithms.ranking import btl, data, inference, simulate
from algorithms.ranking.data import LEFT, RIGHT, TIE
from core import report
from experiments import common
from experiments.configs.judge_btl import DEFAULT_DATA

NAME = "judge_btl"


# ----------------------------------------------------------------------------------------------
# Data loading (CSV or JSON lines, with a column mapping)
# ----------------------------------------------------------------------------------------------


def load_comparisons(path: str, columns: ml_collections.ConfigDict):
    """Reads pairwise judgements from a CSV (header row) or JSON-lines file.

    Returns:
      dict with int arrays ``left``, ``right``, ``judge``, ``outcome`` [C] and name lists ``models``,
      ``judges`` (ids index these, sorted).

    Raises:
      ValueError: a missing column or an outcome value outside the mapping (file and line named),
        or no rows.
    """
    if path.endswith((".jsonl", ".json")):
        with open(path) as f:
            rows = [(n + 1, json.loads(line)) for n, line in enumerate(f) if line.strip()]
    else:
        with open(path, newline="") as f:
            rows = [(n + 2, r) for n, r in enumerate(csv.DictReader(f))]
    if not rows:
        raise ValueError(f"{path}: no comparisons")
    need = (columns.left, columns.right, columns.judge, columns.outcome)
    code = {str(columns.left_value): LEFT, str(columns.right_value): RIGHT, str(columns.tie_value): TIE}
    recs = []
    for line, r in rows:
        missing = [c for c in need if c not in r]
        if missing:
            raise ValueError(f"{path}:{line}: missing column(s) {missing}; present: {sorted(r)}")
        o = str(r[columns.outcome])
        if o not in code:
            raise ValueError(f"{path}:{line}: outcome {o!r} in column {columns.outcome!r}; expected "
                             f"one of {sorted(code)} (see --config.columns.*_value)")
        recs.append((str(r[columns.left]), str(r[columns.right]), str(r[columns.judge]), code[o]))
    models = sorted({x[0] for x in recs} | {x[1] for x in recs})
    judges = sorted({x[2] for x in recs})
    mi, ji = {m: k for k, m in enumerate(models)}, {j: k for k, j in enumerate(judges)}
    return dict(left=np.array([mi[x[0]] for x in recs]), right=np.array([mi[x[1]] for x in recs]),
                judge=np.array([ji[x[2]] for x in recs]), outcome=np.array([x[3] for x in recs]),
                models=models, judges=judges)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------


def _table(d, idx, n_models, n_judges, pad_to=None):
    return data.aggregate(d["left"][idx], d["right"][idx], d["outcome"][idx], d["judge"][idx],
                          n_models=n_models, n_judges=n_judges, pad_to=pad_to)


def _per_comparison_loglik(params, table) -> float:
    """Mean log-likelihood per comparison (ties count half a win each), nats."""
    t = table.astype(np.float64)
    return float(btl.loglik(params, t, "half")) / t.num_comparisons()


def _truth(sim, num_judges, key_seed):
    """Known parameters: scores evenly spread; judges reliable, noisy, and one adversarial."""
    rng = np.random.default_rng(key_seed)
    s = np.linspace(-sim.score_spread, sim.score_spread, sim.num_models)
    rng.shuffle(s)
    gam = np.concatenate([np.full(sim.num_reliable, sim.reliable_gamma),
                          np.full(sim.num_noisy, sim.noisy_gamma), [sim.adversarial_gamma]])
    gam = gam[:num_judges] * np.exp(rng.normal(0, 0.1, num_judges))
    a = np.log(gam)
    s = s * np.exp(a.mean())  # the normalisation sum(alpha) = 0 rescales s, keeping gamma*s fixed
    return btl.Params(jnp.asarray(s - s.mean()), jnp.asarray(a - a.mean()), jnp.zeros(()))


def _cv_select(d, train_idx, n_models, n_judges, grid, folds, pad_to, rng):
    """K-fold cross-validation of the alpha ridge on ``train_idx``; one vmapped fit per grid point.

    Returns (best ridge, mean held-out log-likelihood per grid point).
    """
    perm = rng.permutation(train_idx)
    parts = np.array_split(perm, folds)
    fits, tests = [], []
    for f in range(folds):
        tr = np.concatenate([parts[g] for g in range(folds) if g != f])
        t = _table(d, tr, n_models, n_judges, pad_to)
        data.check_identifiable(t, judge_aware=True, ridge_alpha=1.0)
        fits.append(t)
        tests.append(_table(d, parts[f], n_models, n_judges))
    stack = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float64) if np.asarray(x).dtype
                                                 .kind == "f" else jnp.asarray(x) for x in xs]), *fits)
    scores = np.zeros(len(grid))
    for g, lam in enumerate(grid):
        cfg = btl.FitConfig(ridge_alpha=float(lam))
        params, _ = jax.vmap(lambda t, cfg=cfg: btl.solve(t, cfg))(stack)
        for f in range(folds):
            p = jax.tree.map(lambda x, f=f: x[f], params)
            scores[g] += _per_comparison_loglik(p, tests[f]) / folds
    return float(grid[int(np.argmax(scores))]), scores


def _rank_plot(names, point, lo, hi, scores, title, path):
    order = np.argsort(point)
    n = len(order)
    fig, ax = plt.subplots(figsize=(7, max(3, 0.16 * n + 1)))
    y = np.arange(n)
    ax.hlines(y, lo[order], hi[order], color="tab:blue", lw=2, label="95% rank interval")
    ax.plot(point[order], y, "k|", ms=8, label="estimated rank")
    ax.set_yticks(y)
    ax.set_yticklabels([f"{names[k]} ({scores[k]:+.2f})" for k in order], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("rank (1 = best)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return report.save_figure(fig, path)


# ----------------------------------------------------------------------------------------------
# Parts
# ----------------------------------------------------------------------------------------------


def simulation_part(config, out_dir):
    sim = config.sim
    nj = sim.num_reliable + sim.num_noisy + 1
    truth = _truth(sim, nj, config.seed)
    l, r, k, o = (np.asarray(a) for a in simulate.sample_comparisons(
        jax.random.key(config.seed), truth, sim.num_comparisons))
    d = dict(left=l, right=r, judge=k, outcome=o)
    n = sim.num_models
    pad = n * (n - 1) // 2 * nj
    rng = np.random.default_rng(config.seed)
    test = rng.random(l.shape[0]) < config.heldout_fraction
    tr, te = np.flatnonzero(~test), np.flatnonzero(test)
    t_tr, t_te = _table(d, tr, n, nj, pad), _table(d, te, n, nj)
    aware = btl.fit(t_tr, btl.FitConfig())
    plain = btl.fit(t_tr, btl.FitConfig(judge_aware=False))
    held = dict(judge_aware=_per_comparison_loglik(aware.params, t_te),
                btl=_per_comparison_loglik(plain.params, t_te))
    # Full-data fit and intervals.
    t_all = _table(d, np.arange(l.shape[0]), n, nj, pad)
    full = btl.fit(t_all, btl.FitConfig())
    cov = inference.covariance(t_all.astype(np.float64), full.params, full.config)
    ci = inference.intervals(full.params, cov, config.level)
    point, lo, hi = inference.rank_intervals(jax.random.key(config.seed + 1), full.params, cov,
                                             config.level, config.rank_draws)
    true_rank = np.asarray(inference.ranks(truth.scores))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ax = axes[0]
    ax.errorbar(np.asarray(truth.scores), np.asarray(full.params.scores),
                yerr=1.96 * np.asarray(ci.scores_se), fmt="o", ms=3)
    lim = float(np.max(np.abs(truth.scores))) * 1.15
    ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
    ax.set_xlabel("true score s")
    ax.set_ylabel("estimated score (95% CI)")
    ax.set_title("scores")
    ax = axes[1]
    ax.errorbar(np.asarray(truth.discrimination), np.asarray(ci.gamma),
                yerr=1.96 * np.asarray(ci.gamma_se), fmt="o", ms=3)
    g = float(np.max(truth.discrimination)) * 1.2
    ax.plot([0, g], [0, g], "k--", lw=0.8)
    ax.set_xlabel("true discrimination gamma")
    ax.set_ylabel("estimated gamma (95% CI, delta method)")
    ax.set_title("judges (reliable, near random, adversarial)")
    fig_path = report.save_figure(fig, os.path.join(out_dir, "simulation_recovery.png"))
    return dict(
        heldout=held,
        score_rmse=float(np.sqrt(np.mean((np.asarray(full.params.scores - truth.scores)) ** 2))),
        score_rmse_btl=float(np.sqrt(np.mean((np.asarray(
            btl.fit(t_all, btl.FitConfig(judge_aware=False)).params.scores) * np.std(
                np.asarray(truth.scores)) / np.std(np.asarray(btl.fit(
                    t_all, btl.FitConfig(judge_aware=False)).params.scores)) - np.asarray(truth.scores)) ** 2))),
        gamma_true=np.asarray(truth.discrimination), gamma_hat=np.asarray(ci.gamma),
        rank_ci_width=float(np.mean(np.asarray(hi - lo))),
        rank_ci_covers_truth=float(np.mean((lo <= true_rank) & (true_rank <= hi))),
        iterations=int(full.convergence.iterations), figure=fig_path)


def coverage_part(config):
    c = config.coverage
    truth = _truth(ml_collections.ConfigDict(dict(
        num_models=c.num_models, num_reliable=2, num_noisy=2, reliable_gamma=2.0, noisy_gamma=0.5,
        adversarial_gamma=0.2, score_spread=1.0)), c.num_judges, config.seed + 7)
    design = simulate.full_design(c.num_models, c.num_judges, c.per_cell, jnp.float64)
    cfg = btl.FitConfig()
    z = float(jax.scipy.stats.norm.ppf(0.5 + config.level / 2))

    @jax.jit
    def one(key):
        t = simulate.resample_counts(key, truth, design)
        p, conv = btl.solve(t, cfg)
        cov = inference.covariance(t, p, cfg)
        se = jnp.sqrt(jnp.clip(jnp.diagonal(cov), 0.0))
        n = c.num_models
        cover_s = jnp.abs(p.scores - truth.scores) <= z * se[:n]
        cover_a = jnp.abs(p.log_discrimination - truth.log_discrimination) <= z * se[n:n + c.num_judges]
        dv = se[:n, None] ** 2 + se[None, :n] ** 2 - 2 * cov[:n, :n]
        dd = (p.scores[:, None] - p.scores[None, :]) - (truth.scores[:, None] - truth.scores[None, :])
        iu = jnp.triu_indices(n, 1)
        cover_d = (jnp.abs(dd) <= z * jnp.sqrt(jnp.clip(dv, 0.0)))[iu]
        return cover_s, cover_d, cover_a, conv.converged

    keys = jax.random.split(jax.random.key(config.seed + 11), c.num_datasets)
    cs, cd, ca, ok = jax.lax.map(one, keys, batch_size=50)
    ok = np.asarray(ok)
    return dict(scores=float(np.mean(np.asarray(cs)[ok])), differences=float(np.mean(np.asarray(cd)[ok])),
                log_discrimination=float(np.mean(np.asarray(ca)[ok])), converged=float(ok.mean()),
                num_datasets=int(c.num_datasets), comparisons_per_dataset=float(np.sum(design.wins)))


def choix_part(config):
    import choix

    c = config.choix
    truth = btl.Params(jnp.asarray(np.random.default_rng(config.seed).normal(size=c.num_models)),
                       jnp.zeros(1), jnp.zeros(()))
    l, r, _, o = (np.asarray(a) for a in simulate.sample_comparisons(
        jax.random.key(config.seed + 3), truth, c.num_comparisons))
    table = data.aggregate(l, r, o)
    ours = btl.fit(table, btl.FitConfig(judge_aware=False))
    pairs = [(a, b) if w == LEFT else (b, a) for a, b, w in zip(l.tolist(), r.tolist(), o.tolist())]
    ref = choix.ilsr_pairwise(c.num_models, pairs, alpha=0.0, tol=1e-13, max_iter=100_000)
    return float(np.max(np.abs(np.asarray(ours.params.scores) - (ref - ref.mean()))))


def timing_part(config):
    import choix

    c = config.timing
    rng = np.random.default_rng(config.seed + 5)
    a = np.log(rng.uniform(0.2, 3.0, c.num_judges))
    truth = btl.Params(jnp.asarray(rng.normal(size=c.num_models)), jnp.asarray(a - a.mean()),
                       jnp.zeros(()))
    l, r, k, o = (np.asarray(x) for x in simulate.sample_comparisons(
        jax.random.key(config.seed + 6), truth, c.num_comparisons))
    pad = c.num_models * (c.num_models - 1) // 2 * c.num_judges
    cfg = btl.FitConfig()
    t0 = time.perf_counter()
    jax.block_until_ready(btl.solve(data.aggregate(l, r, o, k, pad_to=pad).astype(np.float64), cfg))
    compile_s = time.perf_counter() - t0
    runs = []
    for _ in range(2):  # aggregation + fit, compiled
        t0 = time.perf_counter()
        table = data.aggregate(l, r, o, k, n_models=c.num_models, n_judges=c.num_judges, pad_to=pad)
        params, conv = jax.block_until_ready(btl.solve(table, cfg))
        runs.append(time.perf_counter() - t0)
    pairs = [(x, y) if w == LEFT else (y, x) for x, y, w in zip(l.tolist(), r.tolist(), o.tolist())]
    fns = dict(ilsr=lambda: choix.ilsr_pairwise(c.num_models, pairs),
               mm=lambda: choix.mm_pairwise(c.num_models, pairs),
               opt=lambda: choix.opt_pairwise(c.num_models, pairs))
    choix_times = {}
    for name in c.choix_estimators:
        t0 = time.perf_counter()
        fns[name]()
        choix_times[name] = time.perf_counter() - t0
    return dict(fit_seconds=min(runs), compile_seconds=compile_s - min(runs),
                choix_seconds=min(choix_times.values()), choix_times=choix_times,
                converged=bool(conv.converged), iterations=int(conv.iterations),
                rows=int(np.sum(np.asarray(table.totals) > 0)),
                gamma_recovery_max_abs=float(np.max(np.abs(np.asarray(params.log_discrimination)
                                                           - np.asarray(truth.log_discrimination)))))


def llmfao_part(config, out_dir, path):
    d = load_comparisons(path, config.columns)
    nm, nj = len(d["models"]), len(d["judges"])
    c_all = d["left"].shape[0]
    full = _table(d, np.arange(c_all), nm, nj)
    pad = full.num_rows
    rng = np.random.default_rng(config.seed)
    grid = tuple(float(x) for x in config.ridge_grid)
    rows = []
    for split in tqdm(range(config.num_splits), desc="judge_btl LLMFAO splits", leave=False):
        test = rng.random(c_all) < config.heldout_fraction
        tr, te = np.flatnonzero(~test), np.flatnonzero(test)
        t_tr, t_te = _table(d, tr, nm, nj, pad), _table(d, te, nm, nj)
        rec = dict(split=split)
        rec["btl"] = _per_comparison_loglik(btl.fit(t_tr, btl.FitConfig(judge_aware=False)).params, t_te)
        try:
            mle = btl.fit(t_tr, btl.FitConfig())
            rec["judge_aware_mle"] = _per_comparison_loglik(mle.params, t_te)
        except ValueError as e:  # the unpenalised MLE does not exist on this split
            rec["judge_aware_mle"] = float("nan")
            rec["mle_error"] = str(e)[:160]
        lam, cv = _cv_select(d, tr, nm, nj, grid, config.cv_folds, pad, rng)
        rec["ridge_alpha"], rec["cv_loglik"] = lam, cv
        rec["judge_aware_map"] = _per_comparison_loglik(
            btl.fit(t_tr, btl.FitConfig(ridge_alpha=lam)).params, t_te)
        rows.append(rec)
    # Leaderboard: MAP on all comparisons, with the median of the ridges chosen by cross-validation
    # in the training splits.
    lam = float(np.median([r["ridge_alpha"] for r in rows]))
    t_pad = _table(d, np.arange(c_all), nm, nj, pad)
    res = btl.fit(t_pad, btl.FitConfig(ridge_alpha=lam))
    cov = inference.covariance(t_pad.astype(np.float64), res.params, res.config)
    ci = inference.intervals(res.params, cov, config.level)
    point, lo, hi = inference.rank_intervals(jax.random.key(config.seed + 2), res.params, cov,
                                             config.level, config.rank_draws)
    plain = btl.fit(t_pad, btl.FitConfig(judge_aware=False))
    plain_rank = np.asarray(inference.ranks(plain.params.scores))
    boot = None
    if config.bootstrap_samples:
        draws, ok = inference.bootstrap(jax.random.key(config.seed + 4), t_pad.astype(np.float64),
                                        res.params, res.config, config.bootstrap_samples)
        blo, bhi = inference.percentile_intervals(draws.scores[np.asarray(ok)], config.level)
        boot = dict(lo=np.asarray(blo), hi=np.asarray(bhi), converged=float(np.mean(ok)))
    s = np.asarray(res.params.scores)
    fig1 = _rank_plot(d["models"], np.asarray(point), np.asarray(lo), np.asarray(hi), s,
                      f"LLMFAO, judge-aware MAP (ridge on alpha = {lam:g}): 95% rank intervals",
                      os.path.join(out_dir, "llmfao_rank_intervals.png"))
    gam, gse = np.asarray(ci.gamma), np.asarray(ci.gamma_se)
    per_judge = np.bincount(d["judge"], minlength=nj)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(per_judge, gam, yerr=1.96 * gse, fmt="o", ms=3, alpha=0.6)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("comparisons by the worker")
    ax.set_ylabel("discrimination gamma (95% CI)")
    ax.set_title("LLMFAO crowd workers as judges")
    fig2 = report.save_figure(fig, os.path.join(out_dir, "llmfao_judges.png"))
    order = np.argsort(-s)
    board = [dict(model=d["models"][m], score=float(s[m]), lo=float(ci.scores_lo[m]),
                  hi=float(ci.scores_hi[m]), rank=int(point[m]), rank_lo=int(lo[m]),
                  rank_hi=int(hi[m]), btl_rank=int(plain_rank[m]),
                  **({} if boot is None else dict(boot_lo=float(boot["lo"][m]),
                                                  boot_hi=float(boot["hi"][m]))))
             for m in order]
    from scipy.stats import kendalltau
    mean = lambda key: float(np.nanmean([r[key] for r in rows]))
    return dict(
        num_comparisons=int(c_all), num_models=nm, num_judges=nj,
        heldout_btl=mean("btl"), heldout_judge_aware_map=mean("judge_aware_map"),
        heldout_judge_aware_mle=mean("judge_aware_mle") if any(np.isfinite(r["judge_aware_mle"])
                                                               for r in rows) else float("nan"),
        splits=rows, leaderboard_ridge_alpha=lam, leaderboard=board,
        rank_ci_width=float(np.mean(np.asarray(hi - lo))),
        kendall_tau_vs_btl=float(kendalltau(np.asarray(point), plain_rank)[0]),
        gamma_quantiles=np.quantile(gam, [0.05, 0.25, 0.5, 0.75, 0.95]),
        bootstrap_converged=None if boot is None else boot["converged"],
        figures=[fig1, fig2])


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out_dir = common.experiment_dir(workdir, NAME)
    path = config.data_path
    if path and not os.path.exists(path) and path == DEFAULT_DATA:
        path = None  # the embedded default: simulation only
    path = common.check_data_path(path, "judge_btl comparisons (--config.data_path)")
    timings = {}
    with jax.enable_x64(True):
        steps = [("simulation", lambda: simulation_part(config, out_dir)),
                 ("coverage", lambda: coverage_part(config)),
                 ("choix", lambda: choix_part(config)),
                 ("timing", lambda: timing_part(config))]
        if path:
            steps.append(("llmfao", lambda: llmfao_part(config, out_dir, path)))
        results = {}
        for name, fn in tqdm(steps, desc="judge_btl", leave=False):
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            timings[name] = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0)
    sim, cov, tim, llm = results["simulation"], results["coverage"], results["timing"], results.get("llmfao")
    held_src = "llmfao" if llm else "simulation"
    metrics = dict(
        heldout_source=held_src,
        heldout_loglik_judge_aware=llm["heldout_judge_aware_map"] if llm else sim["heldout"]["judge_aware"],
        heldout_loglik_btl=llm["heldout_btl"] if llm else sim["heldout"]["btl"],
        heldout_loglik_judge_aware_mle=llm["heldout_judge_aware_mle"] if llm else sim["heldout"]["judge_aware"],
        ci_coverage=cov["scores"], ci_coverage_differences=cov["differences"],
        ci_coverage_log_discrimination=cov["log_discrimination"], coverage_converged=cov["converged"],
        coverage_num_datasets=cov["num_datasets"],
        rank_ci_width=sim["rank_ci_width"], rank_ci_covers_truth=sim["rank_ci_covers_truth"],
        choix_max_abs_diff=results["choix"],
        fit_seconds=tim["fit_seconds"], choix_seconds=tim["choix_seconds"],
        choix_times=tim["choix_times"], fit_compile_seconds=tim["compile_seconds"],
        speedup_vs_choix=tim["choix_seconds"] / tim["fit_seconds"],
        timing_scale=dict(models=config.timing.num_models, judges=config.timing.num_judges,
                          comparisons=config.timing.num_comparisons, rows=tim["rows"]),
        simulation=dict(heldout_loglik_judge_aware=sim["heldout"]["judge_aware"],
                        heldout_loglik_btl=sim["heldout"]["btl"], score_rmse=sim["score_rmse"],
                        score_rmse_btl=sim["score_rmse_btl"], gamma_true=sim["gamma_true"],
                        gamma_hat=sim["gamma_hat"]),
        part_seconds=timings,
    )
    if llm:
        metrics["llmfao"] = {k: v for k, v in llm.items() if k != "figures"}
    report.write_json(os.path.join(out_dir, "metrics.json"), metrics)
    return _section(config, metrics, sim, llm)


def _section(config, m, sim, llm) -> report.Section:
    cov_ok = 0.93 <= m["ci_coverage"] <= 0.97
    fast = m["speedup_vs_choix"] >= 10
    agree = m["choix_max_abs_diff"] <= 1e-6
    better = m["heldout_loglik_judge_aware"] > m["heldout_loglik_btl"]
    lines = [
        "Judge-aware BTL (Xu et al., 2026): `P(i beats j | judge k) = sigmoid(gamma_k (s_i - s_j))`, "
        "joint Newton MLE/MAP in zero-sum coordinates, Fisher-information intervals.",
        "",
        report.markdown_table(["quantity", "target", "ours"], [
            ["95% CI coverage of s_i (" + str(m["coverage_num_datasets"]) + " simulated data sets)",
             "[0.93, 0.97]", m["ci_coverage"]],
            ["  ... of s_i - s_j / of alpha_k", "[0.93, 0.97]",
             f"{m['ci_coverage_differences']:.3f} / {m['ci_coverage_log_discrimination']:.3f}"],
            ["max |ours - choix| (plain BTL)", "<= 1e-6", f"{m['choix_max_abs_diff']:.2e}"],
            ["fit seconds (aggregation + fit, "
             f"{config.timing.num_models} models, {config.timing.num_judges} judges, "
             f"{config.timing.num_comparisons:,} comparisons)", "", m["fit_seconds"]],
            ["fastest choix seconds (" + ", ".join(m["choix_times"]) + ")", "", m["choix_seconds"]],
            ["speed-up", ">= 10x", f"{m['speedup_vs_choix']:.1f}x"],
            [f"held-out log-lik / comparison, judge-aware ({m['heldout_source']})", "> plain BTL",
             m["heldout_loglik_judge_aware"]],
            [f"held-out log-lik / comparison, plain BTL ({m['heldout_source']})", "",
             m["heldout_loglik_btl"]],
            ["mean 95% rank-interval width (simulation, "
             f"{config.sim.num_models} models)", "", m["rank_ci_width"]],
        ]),
        "",
        f"Simulation ({config.sim.num_models} models, {len(sim['gamma_true'])} judges, "
        f"{config.sim.num_comparisons:,} comparisons): score RMSE judge-aware "
        f"{sim['score_rmse']:.3f} vs plain BTL {sim['score_rmse_btl']:.3f}; rank intervals cover the "
        f"true rank for {m['rank_ci_covers_truth']:.0%} of models.",
    ]
    figures = [sim["figure"]]
    if llm:
        lines += ["", f"LLMFAO ({llm['num_comparisons']:,} comparisons, {llm['num_models']} models, "
                  f"{llm['num_judges']} workers), {config.num_splits} random "
                  f"{1 - config.heldout_fraction:.0%}/{config.heldout_fraction:.0%} splits, ties as "
                  "half wins. Held-out log-likelihood per comparison: plain BTL "
                  f"{llm['heldout_btl']:.4f}, judge-aware MLE {llm['heldout_judge_aware_mle']:.4f}, "
                  f"judge-aware MAP (ridge on alpha by {config.cv_folds}-fold CV) "
                  f"{llm['heldout_judge_aware_map']:.4f}. The leaderboard uses the MAP with ridge "
                  f"{llm['leaderboard_ridge_alpha']:g}; Kendall tau with the plain-BTL order "
                  f"{llm['kendall_tau_vs_btl']:.3f}; mean rank-interval width {llm['rank_ci_width']:.1f}.",
                  "", report.markdown_table(
                      ["rank", "model", "score (95% CI)", "rank interval", "plain BTL rank"],
                      [[b["rank"], b["model"], f"{b['score']:+.3f} [{b['lo']:+.3f}, {b['hi']:+.3f}]",
                        f"{b['rank_lo']}-{b['rank_hi']}", b["btl_rank"]] for b in llm["leaderboard"][:10]]),
                  "", "(top 10; the full leaderboard is in metrics.json)"]
        figures += llm["figures"]
    else:
        lines += ["", f"LLMFAO not found at {config.data_path!r}: held-out numbers are from the "
                  "simulation."]
    ok = [cov_ok, fast, agree, better]
    verdict = "yes" if all(ok) else ("partly" if any(ok) else "no")
    return report.Section(
        title="Judge-aware BTL ranking (judge_btl)",
        body="\n".join(lines), figures=figures,
        headline=dict(
            method="Judge-aware BTL ranking",
            claim="judge discriminations improve on plain BTL; MLE asymptotically normal, "
                  "calibrated score/rank intervals",
            ours=(f"coverage {m['ci_coverage']:.3f}; held-out {m['heldout_loglik_judge_aware']:.4f} vs "
                  f"BTL {m['heldout_loglik_btl']:.4f} ({m['heldout_source']}); choix diff "
                  f"{m['choix_max_abs_diff']:.1e}; {m['speedup_vs_choix']:.0f}x faster than choix"),
            reproduces=verdict))


if __name__ == "__main__":
    common.app_main(NAME, run)
