"""Experiment ``judge_btl``: judge-aware Bradley-Terry-Luce ranking with confidence intervals.

Parts (Xu et al., 2026, "A Judge-Aware Ranking Framework for Evaluating Large Language Models
without Ground Truth"):

1. Simulation with known scores and discriminations (reliable, near-random and one adversarial
   judge with tiny discrimination): recovery, held-out log-likelihood, rank intervals.
2. Coverage of the 95% Wald intervals (Fisher information) over many simulated data sets, fitted
   in one vectorised call.
3. Plain BTL against ``choix`` on judge-free data; fit time against the fastest ``choix``
   estimator at 100 models, 20 judges and 1M comparisons.
4. Real comparisons (LLMFAO by default: crowd workers judge pairs of LLM answers; any CSV, JSON-lines
   or JSON-array file), when the file is present, read and validated before any other work: held-out
   log-likelihood of plain BTL, the judge-aware MLE and the judge-aware MAP with a ridge on the
   log-discriminations chosen by cross-validation; the leaderboard with score and rank intervals.

    python -m experiments.judge_btl --config=experiments/configs/judge_btl.py:tiny --workdir=workdir
"""

from __future__ import annotations

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
from core.data import judgments
from experiments import common
from experiments.configs.judge_btl import DEFAULT_DATA

NAME = "judge_btl"


# ----------------------------------------------------------------------------------------------
# Data loading and validation (before any other work)
# ----------------------------------------------------------------------------------------------


def load_comparisons(path: str, config: ml_collections.ConfigDict) -> dict:
    """Reads and validates a judgements file (CSV, JSON lines or one JSON array; see
    :func:`core.data.judgments.read_judgments`) with the config's column mapping.

    Returns:
      dict with int arrays ``left``, ``right``, ``judge``, ``outcome`` [C], name lists ``models``,
      ``judges`` (ids index these, sorted), the data set's ``name`` (``config.data_name`` or the file
      name), ``path`` and ``dropped`` (rows dropped per unknown outcome value, with
      ``config.drop_unknown_outcomes``).

    Raises:
      ValueError: unreadable rows (file and line named), or data that cannot rank the models (no
        decisive comparison, a model that never loses or never wins, a disconnected comparison
        graph; the file is named).
    """
    c = config.columns
    if judgments.LEFT != LEFT or judgments.RIGHT != RIGHT or judgments.TIE != TIE:
        raise AssertionError("outcome codes of core.data.judgments and algorithms.ranking.data differ")
    js = judgments.read_judgments(path, left=c.left, right=c.right, judge=c.judge, outcome=c.outcome,
                                  left_value=c.left_value, right_value=c.right_value,
                                  tie_value=c.tie_value, drop_unknown=config.drop_unknown_outcomes,
                                  name=config.data_name or None)
    d = dict(left=js.left, right=js.right, judge=js.judge, outcome=js.outcome, models=js.models,
             judges=js.judges, name=js.name, path=path, dropped=js.dropped)
    table = _table(d, np.arange(js.num_comparisons), len(js.models), len(js.judges))
    try:
        # Plain BTL (the baseline) needs the unpenalised scores; the leaderboard's ridge on the
        # log-discriminations makes every judge's parameter finite.
        data.check_identifiable(table, judge_aware=True, ridge_alpha=1.0, model_names=js.models,
                                judge_names=js.judges)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return d


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
        # A simulated data set can lack a finite MLE (a model or judge separated); such fits are
        # left out of the coverage, not counted as converged.
        return cover_s, cover_d, cover_a, conv.converged & btl.mle_exists(t, cfg, conv.information)

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


def data_part(config, out_dir, d):
    """The real-data part on comparisons ``d`` from :func:`load_comparisons`."""
    nm, nj = len(d["models"]), len(d["judges"])
    c_all = d["left"].shape[0]
    full = _table(d, np.arange(c_all), nm, nj)
    pad = full.num_rows
    rng = np.random.default_rng(config.seed)
    grid = tuple(float(x) for x in config.ridge_grid)
    rows = []
    for split in tqdm(range(config.num_splits), desc=f"judge_btl {d['name']} splits", leave=False):
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
        summ = inference.bootstrap_intervals(draws.scores, ok, config.level)
        boot = dict(lo=summ.lo, hi=summ.hi, used=summ.num_used, dropped=summ.num_dropped)
    s = np.asarray(res.params.scores)
    label = d["name"]
    stem = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in label) or "data"
    fig1 = _rank_plot(d["models"], np.asarray(point), np.asarray(lo), np.asarray(hi), s,
                      f"{label}, judge-aware MAP (ridge on alpha = {lam:g}): "
                      f"{config.level:.0%} rank intervals",
                      os.path.join(out_dir, f"{stem}_rank_intervals.png"))
    gam, gse = np.asarray(ci.gamma), np.asarray(ci.gamma_se)
    per_judge = np.bincount(d["judge"], minlength=nj)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(per_judge, gam, yerr=1.96 * gse, fmt="o", ms=3, alpha=0.6)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("comparisons by the judge")
    ax.set_ylabel("discrimination gamma (95% CI)")
    ax.set_title(f"{label}: judges")
    fig2 = report.save_figure(fig, os.path.join(out_dir, f"{stem}_judges.png"))
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
        name=label, path=d["path"], num_comparisons=int(c_all), num_models=nm, num_judges=nj,
        dropped_outcomes=dict(d["dropped"]), num_dropped=int(sum(d["dropped"].values())),
        heldout_btl=mean("btl"), heldout_judge_aware_map=mean("judge_aware_map"),
        heldout_judge_aware_mle=mean("judge_aware_mle") if any(np.isfinite(r["judge_aware_mle"])
                                                               for r in rows) else float("nan"),
        splits=rows, leaderboard_ridge_alpha=lam, leaderboard=board,
        rank_ci_width=float(np.mean(np.asarray(hi - lo))),
        kendall_tau_vs_btl=float(kendalltau(np.asarray(point), plain_rank)[0]),
        gamma_quantiles=np.quantile(gam, [0.05, 0.25, 0.5, 0.75, 0.95]),
        bootstrap_used=None if boot is None else boot["used"],
        bootstrap_dropped=None if boot is None else boot["dropped"],
        figures=[fig1, fig2])


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    path = config.data_path
    if path and not os.path.exists(path) and path == DEFAULT_DATA:
        path = None  # the embedded default: simulation only
    path = common.check_data_path(path, "judge_btl comparisons (--config.data_path)")
    # The data file is read and validated first, so a bad file fails in seconds, not after the
    # simulation parts.
    real = load_comparisons(path, config) if path else None
    out_dir = common.experiment_dir(workdir, NAME)
    timings = {}
    with jax.enable_x64(True):
        steps = [("simulation", lambda: simulation_part(config, out_dir)),
                 ("coverage", lambda: coverage_part(config)),
                 ("choix", lambda: choix_part(config)),
                 ("timing", lambda: timing_part(config))]
        if real is not None:
            steps.append(("real_data", lambda: data_part(config, out_dir, real)))
        results = {}
        for name, fn in tqdm(steps, desc="judge_btl", leave=False):
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            timings[name] = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0)
    sim, cov, tim, llm = (results["simulation"], results["coverage"], results["timing"],
                          results.get("real_data"))
    # Every number sits under the part that produced it: "simulation", "coverage", "choix",
    # "timing" (synthetic data at the timing scale) and "real_data" (the file's data set); the
    # headline names its source.
    metrics = dict(
        headline=dict(
            heldout_source=llm["name"] if llm else "simulation",
            heldout_loglik_judge_aware=llm["heldout_judge_aware_map"] if llm else sim["heldout"]["judge_aware"],
            heldout_loglik_btl=llm["heldout_btl"] if llm else sim["heldout"]["btl"],
            ci_coverage=cov["scores"], choix_max_abs_diff=results["choix"],
            speedup_vs_choix=tim["choix_seconds"] / tim["fit_seconds"]),
        simulation=dict(heldout_loglik_judge_aware=sim["heldout"]["judge_aware"],
                        heldout_loglik_btl=sim["heldout"]["btl"], score_rmse=sim["score_rmse"],
                        score_rmse_btl=sim["score_rmse_btl"], gamma_true=sim["gamma_true"],
                        gamma_hat=sim["gamma_hat"], rank_ci_width=sim["rank_ci_width"],
                        rank_ci_covers_truth=sim["rank_ci_covers_truth"],
                        iterations=sim["iterations"]),
        coverage=dict(scores=cov["scores"], differences=cov["differences"],
                      log_discrimination=cov["log_discrimination"], converged=cov["converged"],
                      num_datasets=cov["num_datasets"],
                      comparisons_per_dataset=cov["comparisons_per_dataset"]),
        choix=dict(max_abs_diff=results["choix"]),
        timing=dict(fit_seconds=tim["fit_seconds"], choix_seconds=tim["choix_seconds"],
                    choix_times=tim["choix_times"], fit_compile_seconds=tim["compile_seconds"],
                    speedup_vs_choix=tim["choix_seconds"] / tim["fit_seconds"],
                    models=config.timing.num_models, judges=config.timing.num_judges,
                    comparisons=config.timing.num_comparisons, rows=tim["rows"],
                    converged=tim["converged"], iterations=tim["iterations"]),
        real_data=None if llm is None else {k: v for k, v in llm.items() if k != "figures"},
        part_seconds=timings,
    )
    report.write_json(os.path.join(out_dir, "metrics.json"), metrics)
    return _section(config, metrics, sim, llm)


def _section(config, m, sim, llm) -> report.Section:
    h, cov, tim = m["headline"], m["coverage"], m["timing"]
    cov_ok = 0.93 <= cov["scores"] <= 0.97
    fast = tim["speedup_vs_choix"] >= 10
    agree = m["choix"]["max_abs_diff"] <= 1e-6
    better = h["heldout_loglik_judge_aware"] > h["heldout_loglik_btl"]
    lines = [
        "Judge-aware BTL (Xu et al., 2026): `P(i beats j | judge k) = sigmoid(gamma_k (s_i - s_j))`, "
        "joint Newton MLE/MAP in zero-sum coordinates, Fisher-information intervals.",
        "",
        report.markdown_table(["quantity", "target", "ours"], [
            ["95% CI coverage of s_i (" + str(cov["num_datasets"]) + " simulated data sets)",
             "[0.93, 0.97]", cov["scores"]],
            ["  ... of s_i - s_j / of alpha_k", "[0.93, 0.97]",
             f"{cov['differences']:.3f} / {cov['log_discrimination']:.3f}"],
            ["max |ours - choix| (plain BTL, simulated)", "<= 1e-6", f"{m['choix']['max_abs_diff']:.2e}"],
            ["fit seconds (aggregation + fit, synthetic: "
             f"{tim['models']} models, {tim['judges']} judges, "
             f"{tim['comparisons']:,} comparisons)", "", tim["fit_seconds"]],
            ["fastest choix seconds (" + ", ".join(tim["choix_times"]) + ")", "", tim["choix_seconds"]],
            ["speed-up", ">= 10x", f"{tim['speedup_vs_choix']:.1f}x"],
            [f"held-out log-lik / comparison, judge-aware ({h['heldout_source']})", "> plain BTL",
             h["heldout_loglik_judge_aware"]],
            [f"held-out log-lik / comparison, plain BTL ({h['heldout_source']})", "",
             h["heldout_loglik_btl"]],
            ["mean 95% rank-interval width (simulation, "
             f"{config.sim.num_models} models)", "", m["simulation"]["rank_ci_width"]],
        ]),
        "",
        f"Simulation ({config.sim.num_models} models, {len(sim['gamma_true'])} judges, "
        f"{config.sim.num_comparisons:,} comparisons): score RMSE judge-aware "
        f"{sim['score_rmse']:.3f} vs plain BTL {sim['score_rmse_btl']:.3f}; rank intervals cover the "
        f"true rank for {sim['rank_ci_covers_truth']:.0%} of models.",
    ]
    figures = [sim["figure"]]
    if llm:
        dropped = (f"; {llm['num_dropped']:,} rows with unknown outcomes dropped "
                   f"({', '.join(f'{k!r}: {v}' for k, v in sorted(llm['dropped_outcomes'].items()))})"
                   if llm["num_dropped"] else "")
        boot = ("" if llm["bootstrap_used"] is None else
                f" Bootstrap: {llm['bootstrap_used']} replicates used, {llm['bootstrap_dropped']} "
                "dropped (not converged or MLE at infinity).")
        lines += ["", f"{llm['name']} ({llm['num_comparisons']:,} comparisons, {llm['num_models']} "
                  f"models, {llm['num_judges']} judges{dropped}), {config.num_splits} random "
                  f"{1 - config.heldout_fraction:.0%}/{config.heldout_fraction:.0%} splits, ties as "
                  "half wins. Held-out log-likelihood per comparison: plain BTL "
                  f"{llm['heldout_btl']:.4f}, judge-aware MLE {llm['heldout_judge_aware_mle']:.4f}, "
                  f"judge-aware MAP (ridge on alpha by {config.cv_folds}-fold CV) "
                  f"{llm['heldout_judge_aware_map']:.4f}. The leaderboard uses the MAP with ridge "
                  f"{llm['leaderboard_ridge_alpha']:g}; Kendall tau with the plain-BTL order "
                  f"{llm['kendall_tau_vs_btl']:.3f}; mean rank-interval width {llm['rank_ci_width']:.1f}."
                  + boot,
                  "", report.markdown_table(
                      ["rank", "model", "score (95% CI)", "rank interval", "plain BTL rank"],
                      [[b["rank"], b["model"], f"{b['score']:+.3f} [{b['lo']:+.3f}, {b['hi']:+.3f}]",
                        f"{b['rank_lo']}-{b['rank_hi']}", b["btl_rank"]] for b in llm["leaderboard"][:10]]),
                  "", "(top 10; the full leaderboard is in metrics.json under real_data)"]
        figures += llm["figures"]
    else:
        lines += ["", f"No comparisons file at {config.data_path!r}: held-out numbers are from the "
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
            ours=(f"coverage {cov['scores']:.3f}; held-out {h['heldout_loglik_judge_aware']:.4f} vs "
                  f"BTL {h['heldout_loglik_btl']:.4f} ({h['heldout_source']}); choix diff "
                  f"{m['choix']['max_abs_diff']:.1e}; {tim['speedup_vs_choix']:.0f}x faster than choix"),
            reproduces=verdict))


if __name__ == "__main__":
    common.app_main(NAME, run)
