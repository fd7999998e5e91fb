"""Studies of the judge-aware BTL fit: recovery on simulated data, interval coverage, agreement with
``choix``, cross-validation of the ridge and the held-out evaluation of a real comparisons set.

Dimension legend: C raw comparisons, M table rows, N models, J judges, R replicate data sets,
G ridge grid points, F folds.

Every study is a function of arrays and seeds (no files, no plots); the experiment ``judge_btl``
calls them and reports. Scores are compared on a common scale (:func:`aligned_rmse`): the
judge-aware model identifies scores only up to a shift and, with the judges' discriminations, up
to a common scale (Xu et al., 2026, Section 3), fixed by ``sum alpha = 0``; plain BTL estimates the
scores times an average discrimination. Error in that scale is not error in the ranking.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.ranking import btl, data, inference, simulate


class Comparisons(NamedTuple):
    """Raw comparisons, int arrays [C]: ``left``, ``right``, ``judge`` ids and ``outcome``
    (:data:`~algorithms.ranking.data.LEFT`, ``RIGHT`` or ``TIE``)."""

    left: np.ndarray
    right: np.ndarray
    judge: np.ndarray
    outcome: np.ndarray


def table_of(comps: Comparisons, idx, n_models: int, n_judges: int, pad_to: int | None = None
             ) -> data.ComparisonTable:
    """The table of the comparisons ``idx`` (int [C'] positions) of ``comps``."""
    return data.aggregate(comps.left[idx], comps.right[idx], comps.outcome[idx], comps.judge[idx],
                          n_models=n_models, n_judges=n_judges, pad_to=pad_to)


def check_comparisons(comps: Comparisons, model_names, judge_names, ridge_alpha: float = 1.0) -> None:
    """Raises ``ValueError`` unless the judge-aware fit of all of ``comps`` with a ridge
    ``ridge_alpha`` on the log-discriminations is identifiable: :func:`data.check_identifiable` of
    their table, naming models and judges by ``model_names`` [N] and ``judge_names`` [J]."""
    table = table_of(comps, np.arange(comps.left.shape[0]), len(model_names), len(judge_names))
    data.check_identifiable(table, judge_aware=True, ridge_alpha=ridge_alpha, model_names=model_names,
                            judge_names=judge_names)


def per_comparison_loglik(params: btl.Params, table: data.ComparisonTable) -> float:
    """Mean log-likelihood per comparison of ``table`` under ``params`` (ties half a win), nats."""
    t = table.astype(np.float64)
    with jax.enable_x64(True):
        return float(btl.loglik(params, t, "half")) / t.num_comparisons()


def aligned_rmse(estimate, truth) -> tuple[float, float]:
    """RMSE of ``b * estimate`` against ``truth`` with the least-squares scale ``b``, and ``b``.

    Both vectors [N] sum to zero (the shift is identified), so the affine least-squares alignment
    reduces to a scale: ``b = <estimate, truth> / |estimate|^2``. The aligned RMSE equals
    ``std(truth) sqrt(1 - r^2)`` with ``r`` the correlation: it measures the recovered ordering
    and spacing, not the scale convention of the fit.

    Raises:
      ValueError: shapes differ or ``estimate`` is all zero.
    """
    est, tru = np.asarray(estimate, np.float64), np.asarray(truth, np.float64)
    if est.shape != tru.shape or not np.any(est):
        raise ValueError(f"aligned_rmse: estimate {est.shape} and truth {tru.shape} must have one "
                         "shape and a non-zero estimate")
    est, tru = est - est.mean(), tru - tru.mean()
    b = float(est @ tru / (est @ est))
    return float(np.sqrt(np.mean((b * est - tru) ** 2))), b


def se_ratio_quantiles(cov_observed, cov_expected, n_models: int) -> list[float]:
    """Min, median and max over the N models of ``se_observed(s_i) / se_expected(s_i)``, the score
    standard errors from the two covariances [D, D] (:func:`algorithms.ranking.inference.covariance`
    with ``information="observed"`` and ``"expected"``); below 1 where the observed information is
    the larger."""
    se_o = np.sqrt(np.clip(np.diagonal(np.asarray(cov_observed))[:n_models], 0.0, None))
    se_e = np.sqrt(np.clip(np.diagonal(np.asarray(cov_expected))[:n_models], 0.0, None))
    r = se_o / se_e
    return [float(np.min(r)), float(np.median(r)), float(np.max(r))]


def judge_panel(num_reliable: int, num_noisy: int, reliable_gamma: float, noisy_gamma: float,
                adversarial_gamma: float) -> np.ndarray:
    """Discriminations [J] of a simulated panel: reliable judges, near-random ones, one adversarial
    judge (tiny or negative ``gamma``)."""
    return np.concatenate([np.full(num_reliable, reliable_gamma), np.full(num_noisy, noisy_gamma),
                           [adversarial_gamma]])


def simulation_truth(num_models: int, gammas, score_spread: float, seed: int) -> btl.Params:
    """Known parameters: scores evenly spread over ``[-spread, spread]`` in random order; the panel's
    discriminations with 10% log-normal jitter; normalised like the fit (``sum s = sum alpha = 0``,
    the scale of ``s`` absorbing the geometric mean of ``gamma`` so that ``gamma * s`` is kept)."""
    rng = np.random.default_rng(seed)
    s = np.linspace(-score_spread, score_spread, num_models)
    rng.shuffle(s)
    gam = np.asarray(gammas, np.float64)
    gam = gam * np.exp(rng.normal(0, 0.1, gam.shape[0]))
    a = np.log(gam)
    s = s * np.exp(a.mean())
    # numpy float64 leaves: they stay float64 wherever 64-bit JAX is enabled
    return btl.Params(s - s.mean(), a - a.mean(), np.zeros(()))


def simulate_comparisons(truth: btl.Params, num: int, key) -> Comparisons:
    """C = ``num`` comparisons from ``truth`` (:func:`algorithms.ranking.simulate.sample_comparisons`
    in float64, key ``key``) as host arrays."""
    with jax.enable_x64(True):
        return Comparisons(*(np.asarray(a) for a in simulate.sample_comparisons(key, truth, num)))


def simulation_study(truth: btl.Params, num_comparisons: int, heldout_fraction: float, level: float,
                     rank_draws: int, seed: int) -> dict:
    """One simulated data set (key ``seed``): held-out log-likelihood of both fits, score recovery,
    Wald intervals and rank intervals of the judge-aware fit on all comparisons.

    Returns:
      dict with ``heldout`` ({judge_aware, btl}: log-likelihood per held-out comparison),
      ``score_rmse`` (judge-aware, in its own normalisation ``sum alpha = 0``), ``score_rmse_btl``
      (plain BTL rescaled to the truth's standard deviation), ``rmse_aligned`` ({judge_aware, btl}:
      :func:`aligned_rmse`, the common scale) and ``scale`` (their least-squares scales),
      ``gamma_true``, ``gamma_hat``, ``gamma_se``, ``scores_hat``, ``scores_se`` [N] (standard
      errors from the expected information), ``se_ratio_observed_to_expected``
      (:func:`se_ratio_quantiles`), ``rank_ci_width``, ``rank_ci_covers_truth`` and ``iterations``.
    """
    n, nj = truth.scores.shape[0], truth.log_discrimination.shape[0]
    comps = simulate_comparisons(truth, num_comparisons, jax.random.key(seed))
    pad = n * (n - 1) // 2 * nj
    test = np.random.default_rng(seed).random(comps.left.shape[0]) < heldout_fraction
    t_tr = table_of(comps, np.flatnonzero(~test), n, nj, pad)
    t_te = table_of(comps, np.flatnonzero(test), n, nj)
    held = dict(judge_aware=per_comparison_loglik(btl.fit(t_tr, btl.FitConfig()).params, t_te),
                btl=per_comparison_loglik(btl.fit(t_tr, btl.FitConfig(judge_aware=False)).params, t_te))
    t_all = table_of(comps, np.arange(comps.left.shape[0]), n, nj, pad)
    full = btl.fit(t_all, btl.FitConfig())
    plain = np.asarray(btl.fit(t_all, btl.FitConfig(judge_aware=False)).params.scores)
    with jax.enable_x64(True):
        cov = inference.covariance(t_all.astype(np.float64), full.params, full.config)
        obs = inference.covariance(t_all.astype(np.float64), full.params, full.config,
                                   information="observed")
        se_ratio = se_ratio_quantiles(obs, cov, n)
        ci = inference.intervals(full.params, cov, level)
        point, lo, hi = (np.asarray(a) for a in inference.rank_intervals(
            jax.random.key(seed + 1), full.params, cov, level, rank_draws))
        ci = jax.device_get(ci)
    s_true, s_hat = np.asarray(truth.scores), np.asarray(full.params.scores)
    true_rank = np.asarray(inference.ranks(truth.scores))
    (rmse_aw, b_aw), (rmse_btl, b_btl) = aligned_rmse(s_hat, s_true), aligned_rmse(plain, s_true)
    return dict(
        heldout=held, score_rmse=float(np.sqrt(np.mean((s_hat - s_true) ** 2))),
        score_rmse_btl=float(np.sqrt(np.mean((plain * np.std(s_true) / np.std(plain) - s_true) ** 2))),
        rmse_aligned=dict(judge_aware=rmse_aw, btl=rmse_btl), scale=dict(judge_aware=b_aw, btl=b_btl),
        gamma_true=np.exp(np.asarray(truth.log_discrimination)), gamma_hat=np.asarray(ci.gamma),
        gamma_se=np.asarray(ci.gamma_se), scores_hat=s_hat, scores_se=np.asarray(ci.scores_se),
        rank_ci_width=float(np.mean(hi - lo)),
        rank_ci_covers_truth=float(np.mean((lo <= true_rank) & (true_rank <= hi))),
        se_ratio_observed_to_expected=se_ratio, iterations=int(full.convergence.iterations))


def recovery_replicates(truth: btl.Params, num_comparisons: int, num_datasets: int, seed: int) -> dict:
    """Score recovery of both fits on R = ``num_datasets`` data sets from ``truth`` (keys from
    ``seed``), on the common scale of :func:`aligned_rmse`. Data sets whose judge-aware MLE does not
    exist (a near-random judge that agreed with the order in every comparison, whose ``gamma`` runs
    to infinity, or whose votes did not follow it, whose ``gamma`` falls to 0) are left out and
    counted.

    Returns:
      dict: ``rmse_judge_aware`` and ``rmse_btl`` (means over the data sets used),
      ``judge_aware_better`` (fraction of data sets where its aligned RMSE is lower), ``num_used``,
      ``num_dropped``.

    Raises:
      ValueError: ``num_datasets < 1``, or no data set with a finite MLE.
    """
    if num_datasets < 1:
        raise ValueError(f"recovery_replicates: num_datasets={num_datasets}; expected >= 1")
    n, nj = truth.scores.shape[0], truth.log_discrimination.shape[0]
    s_true, pad = np.asarray(truth.scores), n * (n - 1) // 2 * nj
    aw, pl = [], []
    for key in jax.random.split(jax.random.key(seed), num_datasets):
        comps = simulate_comparisons(truth, num_comparisons, key)
        table = table_of(comps, np.arange(comps.left.shape[0]), n, nj, pad)
        try:
            fit = btl.fit(table, btl.FitConfig())
        except ValueError:  # the MLE is at infinity on this data set
            continue
        aw.append(aligned_rmse(fit.params.scores, s_true)[0])
        pl.append(aligned_rmse(btl.fit(table, btl.FitConfig(judge_aware=False)).params.scores, s_true)[0])
    if not aw:
        raise ValueError(f"recovery_replicates: none of the {num_datasets} data sets has a finite "
                         "judge-aware MLE; use more comparisons per judge")
    aw, pl = np.asarray(aw), np.asarray(pl)
    return dict(rmse_judge_aware=float(np.mean(aw)), rmse_btl=float(np.mean(pl)),
                judge_aware_better=float(np.mean(aw < pl)), num_used=int(aw.size),
                num_dropped=int(num_datasets - aw.size))


def coverage_study(truth: btl.Params, per_cell: int, num_datasets: int, level: float, seed: int) -> dict:
    """Coverage of the Wald intervals for ``s_i``, ``s_i - s_j`` and ``alpha_k`` over R data sets on
    the full design (every pair judged ``per_cell`` times by every judge), fitted in one vectorised
    call (``lax.map`` in batches of 50), with the covariance from the expected information (the
    paper's convention; the headline) and from the observed information.

    A data set whose judge-aware MLE does not exist (a judge whose comparisons all agree with the
    fitted order, or whose votes do not follow it: its ``alpha`` runs to infinity), or whose Newton
    fit does not converge within ``max_iter`` (in sparse designs, one creeping towards such a
    divergence), has no interval; it is left out, and the coverage is the fraction over the
    R' = ``num_used`` data sets that remain. ``num_dropped`` = R - R' says how many were left out.
    Conditioning on existence can bias the coverage; the count lets a reader judge by how much.

    Returns:
      dict: ``scores``, ``differences``, ``log_discrimination`` (coverage fractions over the data
      sets used, expected information), ``observed`` (the same three with the observed
      information), ``se_ratio_observed_to_expected`` (median over the data sets used of the mean
      ratio of the score standard errors), ``num_datasets`` (R), ``num_used`` (R'),
      ``num_dropped`` (R - R'), ``dropped_fraction``, ``converged`` (R' / R, kept for older
      readers), ``comparisons_per_dataset``, and ``scores_mc_se``: the Monte Carlo standard error
      of ``scores``, from the spread over data sets of each one's share of covered models
      (``std(ddof=1) / sqrt(R')``, so the models of one data set are not taken as independent;
      ``None`` with R' = 1).

    Raises:
      ValueError: ``num_datasets`` or ``per_cell`` < 1, or no data set with a finite MLE.
    """
    if num_datasets < 1 or per_cell < 1:
        raise ValueError(f"coverage_study: num_datasets={num_datasets}, per_cell={per_cell}; "
                         "expected both >= 1")
    n, nj = truth.scores.shape[0], truth.log_discrimination.shape[0]
    cfg = btl.FitConfig()
    with jax.enable_x64(True):
        design = simulate.full_design(n, nj, per_cell, jnp.float64)
        z = float(jax.scipy.stats.norm.ppf(0.5 + level / 2))

        def covers(p, cov):
            se = jnp.sqrt(jnp.clip(jnp.diagonal(cov), 0.0))
            cover_s = jnp.abs(p.scores - truth.scores) <= z * se[:n]
            cover_a = jnp.abs(p.log_discrimination - truth.log_discrimination) <= z * se[n:n + nj]
            dv = se[:n, None] ** 2 + se[None, :n] ** 2 - 2 * cov[:n, :n]
            dd = (p.scores[:, None] - p.scores[None, :]) - (truth.scores[:, None] - truth.scores[None, :])
            cover_d = (jnp.abs(dd) <= z * jnp.sqrt(jnp.clip(dv, 0.0)))[jnp.triu_indices(n, 1)]
            return (cover_s, cover_d, cover_a), se[:n]

        @jax.jit
        def one(key):
            t = simulate.resample_counts(key, truth, design)
            p, conv = btl.solve(t, cfg)
            exp_cov, exp_se = covers(p, inference.covariance(t, p, cfg, information="expected"))
            obs_cov, obs_se = covers(p, inference.covariance(t, p, cfg, information="observed"))
            ok = conv.converged & btl.mle_exists(t, cfg, conv.information)
            return exp_cov, obs_cov, jnp.mean(obs_se / exp_se), ok

        keys = jax.random.split(jax.random.key(seed), num_datasets)
        exp_c, obs_c, ratio, ok = jax.device_get(jax.lax.map(one, keys, batch_size=50))
        ok = np.asarray(ok)
        total = float(np.sum(design.wins))
    used = int(ok.sum())
    if not used:
        raise ValueError(f"coverage_study: none of the {num_datasets} data sets has a finite MLE; "
                         "raise per_cell")

    def fractions(c):
        return {k: float(np.mean(np.asarray(v)[ok]))
                for k, v in zip(("scores", "differences", "log_discrimination"), c)}

    per_dataset = np.asarray(exp_c[0], np.float64)[ok].mean(axis=1)  # [R'] share covered
    mc_se = float(per_dataset.std(ddof=1) / np.sqrt(used)) if used > 1 else None
    return dict(**fractions(exp_c), observed=fractions(obs_c), scores_mc_se=mc_se,
                se_ratio_observed_to_expected=float(np.median(np.asarray(ratio)[ok])),
                num_datasets=int(num_datasets), num_used=used, num_dropped=int(num_datasets - used),
                dropped_fraction=float(1.0 - used / num_datasets), converged=float(used / num_datasets),
                comparisons_per_dataset=total)


def choix_agreement(num_models: int, num_comparisons: int, seed: int) -> float:
    """Max |plain-BTL scores - ``choix.ilsr_pairwise``| on judge-free simulated data (scores drawn
    from N(0, 1) with ``seed``, comparisons with key ``seed + 3``)."""
    import choix

    truth = btl.Params(np.random.default_rng(seed).normal(size=num_models), np.zeros(1), np.zeros(()))
    comps = simulate_comparisons(truth, num_comparisons, jax.random.key(seed + 3))
    ours = btl.fit(data.aggregate(comps.left, comps.right, comps.outcome), btl.FitConfig(judge_aware=False))
    ref = choix.ilsr_pairwise(num_models, winner_loser_pairs(comps), alpha=0.0, tol=1e-13,
                              max_iter=100_000)
    return float(np.max(np.abs(np.asarray(ours.params.scores) - (ref - ref.mean()))))


def winner_loser_pairs(comps: Comparisons) -> list[tuple[int, int]]:
    """``(winner, loser)`` pairs of the decisive comparisons (``choix``'s input format)."""
    return [(a, b) if w == data.LEFT else (b, a)
            for a, b, w in zip(comps.left.tolist(), comps.right.tolist(), comps.outcome.tolist())
            if w != data.TIE]


def cross_validate_ridge(comps: Comparisons, train_idx, n_models: int, n_judges: int, grid, folds: int,
                         pad_to: int, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    """K-fold cross-validation of the ridge on ``alpha`` within ``train_idx``; one vmapped fit per
    grid point over the F folds.

    Returns:
      (the ridge with the best mean held-out log-likelihood per comparison, that mean per grid
      point [G]).

    Raises:
      ValueError: a training fold that cannot identify the model (see ``check_identifiable``).
    """
    parts = np.array_split(rng.permutation(train_idx), folds)
    fits, tests = [], []
    for f in range(folds):
        t = table_of(comps, np.concatenate([parts[g] for g in range(folds) if g != f]),
                     n_models, n_judges, pad_to)
        data.check_identifiable(t, judge_aware=True, ridge_alpha=1.0)
        fits.append(t.astype(np.float64))
        tests.append(table_of(comps, parts[f], n_models, n_judges))
    scores = np.zeros(len(grid))
    with jax.enable_x64(True):
        stack = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *fits)
        for g, lam in enumerate(grid):
            cfg = btl.FitConfig(ridge_alpha=float(lam))
            params, _ = jax.vmap(lambda t, cfg=cfg: btl.solve(t, cfg))(stack)
            params = jax.device_get(params)
            for f in range(folds):
                p = jax.tree.map(lambda x, f=f: x[f], params)
                scores[g] += per_comparison_loglik(p, tests[f]) / folds
    return float(grid[int(np.argmax(scores))]), scores


def real_data_study(comps: Comparisons, n_models: int, n_judges: int, *, seed: int, num_splits: int,
                    heldout_fraction: float, ridge_grid, cv_folds: int, level: float, rank_draws: int,
                    bootstrap_samples: int = 0) -> dict:
    """Held-out evaluation and leaderboard on a real comparisons set.

    For each of ``num_splits`` random splits (random generator ``seed``): held-out log-likelihood
    per comparison of plain BTL, of the judge-aware MLE (NaN where it does not exist, with the
    reason) and of the judge-aware MAP whose ridge on ``alpha`` is chosen by ``cv_folds``-fold
    cross-validation on the training part (:func:`cross_validate_ridge`). Then the leaderboard: the
    MAP on all comparisons with the median chosen ridge, Wald intervals (expected information),
    rank intervals (key ``seed + 2``), optionally a multinomial bootstrap (key ``seed + 4``), and
    plain BTL's ranks.

    Returns:
      dict: ``heldout_btl``, ``heldout_judge_aware_mle``, ``heldout_judge_aware_map`` (means over
      splits), ``splits`` (per-split records), ``ridge_alpha`` (the leaderboard's), arrays [N]
      ``scores``, ``scores_lo``, ``scores_hi``, ``rank``, ``rank_lo``, ``rank_hi``, ``btl_rank``
      (and ``boot_lo``, ``boot_hi`` with a bootstrap), [J] ``gamma``, ``gamma_se``,
      ``comparisons_per_judge``, and ``rank_ci_width``, ``se_ratio_observed_to_expected``
      (:func:`se_ratio_quantiles`; the intervals use the expected information), ``kendall_tau_vs_btl``,
      ``bootstrap_used``, ``bootstrap_dropped`` (None without a bootstrap).
    """
    from scipy.stats import kendalltau

    c_all = comps.left.shape[0]
    pad = table_of(comps, np.arange(c_all), n_models, n_judges).num_rows
    rng = np.random.default_rng(seed)
    grid = tuple(float(x) for x in ridge_grid)
    rows = []
    for split in range(num_splits):
        test = rng.random(c_all) < heldout_fraction
        tr, te = np.flatnonzero(~test), np.flatnonzero(test)
        t_tr, t_te = table_of(comps, tr, n_models, n_judges, pad), table_of(comps, te, n_models, n_judges)
        rec = dict(split=split)
        rec["btl"] = per_comparison_loglik(btl.fit(t_tr, btl.FitConfig(judge_aware=False)).params, t_te)
        try:
            rec["judge_aware_mle"] = per_comparison_loglik(btl.fit(t_tr, btl.FitConfig()).params, t_te)
        except ValueError as e:  # the unpenalised MLE does not exist on this split
            rec["judge_aware_mle"], rec["mle_error"] = float("nan"), str(e)[:400]
        lam, cv = cross_validate_ridge(comps, tr, n_models, n_judges, grid, cv_folds, pad, rng)
        rec["ridge_alpha"], rec["cv_loglik"] = lam, cv
        rec["judge_aware_map"] = per_comparison_loglik(
            btl.fit(t_tr, btl.FitConfig(ridge_alpha=lam)).params, t_te)
        rows.append(rec)
    lam = float(np.median([r["ridge_alpha"] for r in rows]))
    t_pad = table_of(comps, np.arange(c_all), n_models, n_judges, pad)
    res = btl.fit(t_pad, btl.FitConfig(ridge_alpha=lam))
    plain_rank = np.asarray(inference.ranks(btl.fit(t_pad, btl.FitConfig(judge_aware=False)).params.scores))
    out = {}
    with jax.enable_x64(True):
        cov = inference.covariance(t_pad.astype(np.float64), res.params, res.config)
        obs = inference.covariance(t_pad.astype(np.float64), res.params, res.config,
                                   information="observed")
        se_ratio = se_ratio_quantiles(obs, cov, n_models)
        ci = jax.device_get(inference.intervals(res.params, cov, level))
        point, lo, hi = (np.asarray(a) for a in inference.rank_intervals(
            jax.random.key(seed + 2), res.params, cov, level, rank_draws))
        if bootstrap_samples:
            draws, ok = inference.bootstrap(jax.random.key(seed + 4), t_pad.astype(np.float64),
                                            res.params, res.config, bootstrap_samples)
            summ = inference.bootstrap_intervals(draws.scores, ok, level)
            out = dict(boot_lo=np.asarray(summ.lo), boot_hi=np.asarray(summ.hi),
                       bootstrap_used=summ.num_used, bootstrap_dropped=summ.num_dropped)

    def mean(key):
        return float(np.nanmean([r[key] for r in rows]))

    mle_ok = any(np.isfinite(r["judge_aware_mle"]) for r in rows)
    return dict(
        heldout_btl=mean("btl"), heldout_judge_aware_map=mean("judge_aware_map"),
        heldout_judge_aware_mle=mean("judge_aware_mle") if mle_ok else float("nan"),
        splits=rows, ridge_alpha=lam, scores=np.asarray(res.params.scores),
        scores_lo=np.asarray(ci.scores_lo), scores_hi=np.asarray(ci.scores_hi), rank=point,
        rank_lo=lo, rank_hi=hi, btl_rank=plain_rank, gamma=np.asarray(ci.gamma),
        gamma_se=np.asarray(ci.gamma_se),
        comparisons_per_judge=np.bincount(comps.judge, minlength=n_judges),
        rank_ci_width=float(np.mean(hi - lo)), se_ratio_observed_to_expected=se_ratio,
        kendall_tau_vs_btl=float(kendalltau(point, plain_rank)[0]),
        **{"bootstrap_used": None, "bootstrap_dropped": None, **out})


def leaderboard(models, result: dict) -> list[dict]:
    """Rows of :func:`real_data_study`'s ``result`` by decreasing score: ``model`` (from the names
    ``models`` [N]), ``score``, ``lo``, ``hi`` (Wald interval), ``rank``, ``rank_lo``, ``rank_hi``,
    ``btl_rank`` and, with a bootstrap, ``boot_lo``, ``boot_hi``."""
    cols = dict(score=result["scores"], lo=result["scores_lo"], hi=result["scores_hi"],
                rank=result["rank"], rank_lo=result["rank_lo"], rank_hi=result["rank_hi"],
                btl_rank=result["btl_rank"], boot_lo=result.get("boot_lo"), boot_hi=result.get("boot_hi"))
    return [dict(model=models[m], **{k: (int if "rank" in k else float)(v[m])
                                     for k, v in cols.items() if v is not None})
            for m in np.argsort(-np.asarray(result["scores"]))]


def judge_table(names, gamma, gamma_se, comparisons, level: float) -> list[dict]:
    """Each judge's discrimination by name, most discriminating first: ``{"judge", "gamma", "se",
    "lo", "hi", "comparisons"}``, with the Wald interval ``gamma +- z se`` at ``level`` (``z`` the
    standard normal's ``0.5 + level / 2`` quantile).

    Args:
      names: the judges' names [J].
      gamma, gamma_se: float [J], discriminations and their (delta-method) standard errors, e.g.
        :func:`real_data_study`'s ``gamma`` and ``gamma_se``.
      comparisons: int [J], comparisons per judge (``comparisons_per_judge``).
      level: the intervals' confidence level, in (0, 1).
    """
    from scipy import stats

    z = float(stats.norm.ppf(0.5 + level / 2))
    rows = [{"judge": str(n), "gamma": float(g), "se": float(s), "lo": float(g - z * s),
             "hi": float(g + z * s), "comparisons": int(c)}
            for n, g, s, c in zip(names, gamma, gamma_se, comparisons)]
    return sorted(rows, key=lambda e: -e["gamma"])
