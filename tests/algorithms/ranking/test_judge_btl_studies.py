"""Studies of the judge-aware fit: recovery on a common scale, replicates, cross-validation, speed."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from algorithms.ranking import btl, data, inference, simulate, speed, studies


def test_aligned_rmse_closed_forms():
    rng = np.random.default_rng(0)
    truth = rng.normal(size=12)
    truth -= truth.mean()
    # A rescaled, shifted copy is recovered exactly, with the inverse scale.
    rmse, b = studies.aligned_rmse(0.4 * truth + 3.0, truth)
    np.testing.assert_allclose([rmse, b], [0.0, 2.5], atol=1e-12)
    # In general the aligned RMSE is std(truth) * sqrt(1 - r^2).
    est = truth + rng.normal(scale=0.3, size=12)
    r = np.corrcoef(est, truth)[0, 1]
    np.testing.assert_allclose(studies.aligned_rmse(est, truth)[0], np.std(truth) * np.sqrt(1 - r * r),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="aligned_rmse"):
        studies.aligned_rmse(np.zeros(3), truth[:3])


def test_simulation_truth_keeps_the_products_gamma_times_s():
    panel = studies.judge_panel(2, 1, 2.5, 0.25, 0.05)
    t = studies.simulation_truth(6, panel, 1.5, seed=3)
    np.testing.assert_allclose([np.sum(t.scores), np.sum(t.log_discrimination)], 0.0, atol=1e-12)
    rng = np.random.default_rng(3)
    s = np.linspace(-1.5, 1.5, 6)
    rng.shuffle(s)
    gam = panel * np.exp(rng.normal(0, 0.1, 4))
    # gamma_k (s_i - s_j) of the normalised truth equals that of the raw draw.
    d_raw = gam[:, None, None] * (s[:, None] - s[None, :])[None]
    d = np.exp(t.log_discrimination)[:, None, None] * (t.scores[:, None] - t.scores[None, :])[None]
    np.testing.assert_allclose(d, d_raw, rtol=1e-12, atol=1e-12)


def test_judge_aware_recovers_scores_better_on_a_common_scale_with_unequal_judges():
    # Two sharp judges and three near-random ones: plain BTL weighs the noise like the signal.
    truth = studies.simulation_truth(8, studies.judge_panel(2, 2, 3.0, 0.2, 0.05), 1.5, seed=1)
    rep = studies.recovery_replicates(truth, 4000, 4, seed=2)
    assert rep["num_used"] + rep["num_dropped"] == 4 and rep["num_used"] >= 3
    assert rep["rmse_judge_aware"] < rep["rmse_btl"] and rep["judge_aware_better"] >= 0.75


def test_simulation_study_separates_scale_from_ordering():
    truth = studies.simulation_truth(8, studies.judge_panel(2, 2, 3.0, 0.2, 0.05), 1.5, seed=1)
    sim = studies.simulation_study(truth, 4000, 0.2, 0.95, 200, seed=4)
    # The raw error in the fit's own normalisation is the aligned error plus the scale error.
    s_true, s_hat = np.asarray(truth.scores), sim["scores_hat"]
    b = sim["scale"]["judge_aware"]
    np.testing.assert_allclose(sim["rmse_aligned"]["judge_aware"],
                               np.sqrt(np.mean((b * s_hat - s_true) ** 2)), rtol=1e-12)
    assert sim["rmse_aligned"]["judge_aware"] <= sim["score_rmse"] + 1e-15
    assert 0.0 <= sim["rank_ci_covers_truth"] <= 1.0 and sim["iterations"] > 0


def test_cross_validation_picks_a_grid_point():
    truth = studies.simulation_truth(6, studies.judge_panel(2, 1, 2.0, 0.5, 0.2), 1.0, seed=0)
    comps = studies.simulate_comparisons(truth, 3000, jax.random.key(0))
    grid = (0.5, 5.0)
    best, scores = studies.cross_validate_ridge(comps, np.arange(3000), 6, 4, grid, 3, 60,
                                                np.random.default_rng(0))
    assert best in grid and scores.shape == (2,) and np.all(np.isfinite(scores)) and np.all(scores < 0)
    assert best == grid[int(np.argmax(scores))]


def test_speed_comparison_reports_where_the_time_goes():
    t = speed.speed_comparison(6, 2, 3000, ("ilsr",), seed=0, repeats=1)
    assert t["converged"] and t["iterations"] > 0 and t["rows"] <= 15 * 2
    b = t["breakdown"]
    assert all(v > 0 for v in b.values())
    np.testing.assert_allclose(b["per_iteration"] * t["iterations"], b["solve"], rtol=1e-12)
    np.testing.assert_allclose(t["speedup_vs_choix"], t["choix_seconds"] / t["fit_seconds"])
    with pytest.raises(ValueError, match="unknown choix estimators"):
        speed.speed_comparison(6, 2, 300, ("lsr",))


def test_timing_data_matches_its_truth():
    truth, comps = speed.timing_data(5, 3, 20_000, seed=1)
    fit = btl.fit(data.aggregate(comps.left, comps.right, comps.outcome, comps.judge,
                                     n_models=5, n_judges=3), btl.FitConfig())
    assert np.max(np.abs(fit.params.log_discrimination - truth.log_discrimination)) < 0.15


def test_coverage_study_counts_the_data_sets_it_leaves_out():
    # A sparse design (4 models, 3 judges, 2 comparisons per cell): most data sets have no finite
    # judge-aware MLE (or a fit that creeps towards one without converging). The study must say
    # how many it dropped, and its coverage must be the fraction over the others: recomputed here
    # one data set at a time with the checked fit.
    truth = studies.simulation_truth(4, studies.judge_panel(1, 1, 2.0, 0.5, 0.2), 1.0, seed=7)
    r, level, seed = 12, 0.9, 3
    cov = studies.coverage_study(truth, per_cell=2, num_datasets=r, level=level, seed=seed)
    z = scipy.stats.norm.ppf(0.5 + level / 2)
    used, hits = 0, {"expected": [], "observed": []}
    with jax.enable_x64(True):
        design = simulate.full_design(4, 3, 2, jnp.float64)
        for key in jax.random.split(jax.random.key(seed), r):
            t = simulate.resample_counts(key, truth, design)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    res = btl.fit(t, btl.FitConfig())
            except ValueError:  # no finite MLE: left out
                continue
            if not bool(res.convergence.converged):  # Newton did not converge: left out as well
                continue
            used += 1
            for info in hits:
                c = np.asarray(inference.covariance(t, res.params, res.config, information=info))
                se = np.sqrt(np.diag(c)[:4])
                hits[info].append(np.abs(np.asarray(res.params.scores) - truth.scores) <= z * se)
    assert 0 < used < r  # the design drops some data sets and keeps some
    assert (cov["num_used"], cov["num_dropped"], cov["num_datasets"]) == (used, r - used, r)
    np.testing.assert_allclose(cov["dropped_fraction"], (r - used) / r, rtol=1e-12)
    np.testing.assert_allclose(cov["scores"], np.mean(hits["expected"]), rtol=1e-12)
    np.testing.assert_allclose(cov["observed"]["scores"], np.mean(hits["observed"]), rtol=1e-12)
    # Monte Carlo error of the coverage: spread over data sets of each one's covered share
    shares = np.mean(hits["expected"], axis=1)
    np.testing.assert_allclose(cov["scores_mc_se"], np.std(shares, ddof=1) / np.sqrt(used),
                               rtol=1e-12)


def test_check_comparisons_names_models_and_passes_a_cycle():
    comps = studies.Comparisons(np.array([0, 1, 2]), np.array([1, 2, 0]), np.array([0, 0, 1]),
                                np.array([data.LEFT] * 3))
    studies.check_comparisons(comps, ["a", "b", "c"], ["j0", "j1"])  # a 3-cycle: identifiable
    ties = comps._replace(outcome=np.array([data.TIE] * 3))
    with pytest.raises(ValueError, match="no decisive comparison"):
        studies.check_comparisons(ties, ["a", "b", "c"], ["j0", "j1"])
    never_loses = comps._replace(outcome=np.array([data.LEFT, data.LEFT, data.RIGHT]))
    with pytest.raises(ValueError, match="'a'"):  # a beats b and c; named, not numbered
        studies.check_comparisons(never_loses, ["a", "b", "c"], ["j0", "j1"])
