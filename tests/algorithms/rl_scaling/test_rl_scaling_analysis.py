"""The sweep's bookkeeping and its analysis: n*(C) tables, the bootstrap of the power-law vs
sigmoid comparison, the saturation onset, the problem sets and the settings' checks."""

import numpy as np
import pytest

from algorithms.rl_scaling import analysis, fit, grpo, sweep, tasks, warmstart


def test_saturation_onset_is_where_the_sigmoid_covers_that_share_of_its_rise():
    hi, x0, w, lo = 5.0, 9.0, 0.7, 1.0
    for share in (0.5, 0.9, 0.99):
        x = fit.saturation_onset(hi, x0, w, lo, share)
        assert fit.sigmoid_law(x, hi, x0, w, lo) == pytest.approx(lo + share * (hi - lo))
    assert fit.saturation_onset(hi, x0, w, lo, 0.5) == pytest.approx(x0)
    with pytest.raises(ValueError, match="share"):
        fit.saturation_onset(hi, x0, w, lo, 1.0)


def _parabola_rewards(vertices, log2_n, seeds, noise=0.0, seed=0):
    """[J, S, K] rewards -(log2 n - v_j)^2 (+ noise), whose fitted n* is exactly v_j when
    noise = 0."""
    rng = np.random.default_rng(seed)
    base = -(log2_n[None, :] - np.asarray(vertices)[:, None]) ** 2
    return base[:, None, :] + noise * rng.standard_normal((len(vertices), seeds, len(log2_n)))


def test_bootstrap_scaling_on_an_exact_power_law_is_decisive_with_its_slope():
    log2_c = np.arange(6.0, 11.0)  # C = 64 .. 1024
    log2_n = np.arange(0.0, 6.0)
    vertices = 1.0 + 0.5 * (log2_c - 6.0)  # log2 n* = a + 0.5 log2 C, inside the n grid
    boot = fit.bootstrap_scaling(log2_c, log2_n, _parabola_rewards(vertices, log2_n, 4), 8, 0,
                                 lo=0.0, hi_max=6.0)
    # identical seeds: every replicate is the point estimate
    np.testing.assert_allclose(boot.slope, 0.5, atol=1e-9)
    point = fit.fit_scaling(log2_c, vertices, 0.0, 6.0)
    np.testing.assert_allclose(boot.loo_diff, point.loo_power - point.loo_sigmoid, atol=1e-12)
    assert point.loo_power == pytest.approx(0.0, abs=1e-20)
    assert boot.interval("loo_diff")[1] < 0 and boot.decisive  # the power law wins, decisively


def test_a_zero_width_interval_of_rounding_is_not_decisive():
    """Every replicate tying up to float rounding (as in a smoke run) is no verdict; a difference
    above the tolerance either way is."""
    z = np.zeros(8)
    tie = fit.ScalingBootstrap(loo_diff=np.full(8, 3e-17), slope=z, onset=z)
    assert tie.interval("loo_diff")[0] > 0 and not tie.decisive
    assert not fit.ScalingBootstrap(loo_diff=np.full(8, -3e-17), slope=z, onset=z).decisive
    assert fit.ScalingBootstrap(loo_diff=np.full(8, 1e-6), slope=z, onset=z).decisive
    assert fit.ScalingBootstrap(loo_diff=np.linspace(-2e-6, -1e-6, 8), slope=z, onset=z).decisive


def test_bootstrap_scaling_with_noise_has_spread_and_needs_three_budgets():
    log2_c = np.arange(6.0, 11.0)
    log2_n = np.arange(0.0, 6.0)
    rewards = _parabola_rewards(np.full(5, 2.5), log2_n, 3, noise=3.0, seed=1)
    boot = fit.bootstrap_scaling(log2_c, log2_n, rewards, 30, 0, lo=0.0, hi_max=6.0)
    lo, hi = boot.interval("slope")
    assert lo < hi and boot.loo_diff.shape == (30,)
    with pytest.raises(ValueError, match="C="):
        fit.bootstrap_scaling(log2_c[:2], log2_n, rewards[:2], 4, 0, lo=0.0, hi_max=6.0)
    with pytest.raises(ValueError, match="finite"):
        fit.bootstrap_scaling(log2_c, log2_n, rewards * np.nan, 4, 0, lo=0.0, hi_max=6.0)


def _records(vertices, budgets, ns, bps, seeds):
    """Records whose easy_pass1 peaks at log2 n = vertices[j] at budget j; B_p = bps[0] is
    better by 0.1 everywhere; seed s adds 0.01 s."""
    out = []
    for j, c in enumerate(budgets):
        for n in ns:
            for b, bp in enumerate(bps):
                for s in range(seeds):
                    v = 1.0 - 0.01 * (np.log2(n) - vertices[j]) ** 2 - 0.1 * b + 0.01 * s
                    out.append({"budget": c, "n": n, "bp": bp, "seed": s, "easy_pass1": v,
                                "hard_passk": v})
    return out


def test_n_star_by_budget_and_fit_read_the_records():
    budgets, ns, bps = (64, 128, 256, 512), (2, 4, 8, 16, 32), (4, 8)
    vertices = [1.5, 2.0, 2.5, 3.0]
    recs = _records(vertices, budgets, ns, bps, 3)
    rows = analysis.n_star_by_budget(recs, budgets, ns, "easy_pass1", 3, 10, 0)
    np.testing.assert_allclose([r["n_star"] for r in rows], 2.0 ** np.asarray(vertices))
    assert all(r["bp"] == [4] * len(ns) for r in rows)  # the better B_p is chosen
    f = analysis.fit_n_star(recs, rows, ns, "easy_pass1", 3, 5, 0)
    assert f["power"]["b"] == pytest.approx(0.5)
    assert f["winner"] == "power" and f["decisive"]
    assert f["boot_budgets"] == list(budgets)
    table = analysis.mean_table(recs, "easy_pass1", budgets, ns, bps)
    assert table["64"]["2"]["8"] == pytest.approx(1.0 - 0.01 * 0.25 - 0.1 + 0.01)
    assert analysis.seed_std(recs, 512, ns, bps, 3) == pytest.approx({"4": 0.01, "8": 0.01})


def test_interference_summary_averages_steps_and_lanes():
    sm = {(2, 4, 0): {"fallen": np.array([0.5, 0.3]), "informative": np.array([0.0, 1.0])},
          (2, 4, 1): {"fallen": np.array([0.2]), "informative": np.array([0.5])},
          (4, 4, 0): {"fallen": np.array([0.1]), "informative": np.array([1.0])}}
    out = analysis.interference(sm, (2, 4, 8))
    assert out["2"] == {"fallen": pytest.approx(0.3), "informative_groups": pytest.approx(0.5)}
    assert out["4"]["fallen"] == pytest.approx(0.1) and "8" not in out


def test_sweep_config_groups_and_checks():
    cfg = sweep.SweepConfig(ns=(2, 4, 8), problems_per_batch=(4, 8), num_seeds=2,
                            budgets=(32, 64))
    assert cfg.groups() == {8: [(2, 4)], 16: [(2, 8), (4, 4)], 32: [(4, 8), (8, 4)],
                            64: [(8, 8)]}
    with pytest.raises(ValueError, match="increasing"):
        sweep.SweepConfig(ns=(2,), problems_per_batch=(4,), num_seeds=2, budgets=(64, 32))
    with pytest.raises(ValueError, match="no \\(n, B_p\\)"):
        sweep.SweepConfig(ns=(64,), problems_per_batch=(4,), num_seeds=2, budgets=(32,))
    assert sweep.pad_lanes([1, 2, 3], 8) == [1, 2, 3] + [3] * 5
    assert sweep.pad_lanes([1, 2], 2) == [1, 2]
    assert isinstance(cfg.grpo, grpo.GRPOConfig)


def test_problem_sets_share_one_geometry_and_mixed_pool():
    easy, hard = tasks.ArithmeticTask(2, 2, "easy"), tasks.ArithmeticTask(3, 2, "hard")
    train, held, p, t = tasks.problem_sets((easy, hard), 40, 8, seed=0)
    assert (p, t) == (10, 4)  # BOS + "12+34+56=", "891" + END
    assert train["easy"]["prompts"].shape == (40, 10) and held["hard"]["targets"].shape == (8, 4)
    ops_tr, ops_ho = tasks.make_split(easy, 40, 8, 0)
    np.testing.assert_array_equal(train["easy"]["lens"],
                                  tasks.encode_answers(ops_tr, 4)[1])
    pool = tasks.mixed_pool(train["easy"], train["hard"], 40, 0.25)
    np.testing.assert_array_equal(pool["prompts"][:30], train["easy"]["prompts"][:30])
    np.testing.assert_array_equal(pool["prompts"][30:], train["hard"]["prompts"][:10])
    with pytest.raises(ValueError, match="hard_fraction"):
        tasks.mixed_pool(train["easy"], train["hard"], 40, 1.5)
    with pytest.raises(ValueError, match="requested"):
        tasks.mixed_pool(train["easy"], train["hard"], 41, 0.0)


def test_warm_start_config_checks():
    warmstart.WarmStartConfig()
    with pytest.raises(ValueError, match="max_easy_steps"):
        warmstart.WarmStartConfig(max_easy_steps=10, max_steps=10)
    with pytest.raises(ValueError, match="easy_target"):
        warmstart.WarmStartConfig(easy_target=0.0)


def test_slope_interval_and_its_point_use_the_same_budgets():
    # n = 16 did not run at C = 64, whose n* (2^3.5) lies off the line 2^(1.5 + 0.5 j) that the
    # other budgets follow: the bootstrapped interval covers C = 128..512 only, and so must its point.
    budgets, ns, bps = (64, 128, 256, 512), (2, 4, 8, 16), (4,)
    vertices = [3.5, 2.0, 2.5, 3.0]
    recs = [r for r in _records(vertices, budgets, ns, bps, 3)
            if not (r["budget"] == 64 and r["n"] == 16)]
    rows = analysis.n_star_by_budget(recs, budgets, ns, "easy_pass1", 3, 10, 0)
    f = analysis.fit_n_star(recs, rows, ns, "easy_pass1", 3, 5, 0)
    assert f["boot_budgets"] == [128, 256, 512]
    assert f["power"]["b"] < 0.25  # the all-budget fit is pulled down by C = 64
    assert f["slope_at_boot_budgets"] == pytest.approx(0.5)
    assert len(f["slope_ci"]) == 2
