"""Baseline tuning over every hyper-parameter, the paired test, the noise memory, the scaling
sweep and the training pieces of SPF."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from algorithms.spf import baselines as B
from algorithms.spf import evaluation as EV
from algorithms.spf import problems as P
from algorithms.spf import spf as S
from algorithms.spf import training as TR
from algorithms.spf import tuning

SMALL = tuning.BaselineGrids(step=(0.05, 0.2), decay_power=(0.6,), decay_offset=(10.0,),
                             adam_step=(0.05, 0.2), adam_b1=(0.0, 0.9), adam_b2=(0.9, 0.999),
                             pc_pred_weight=(0.5,), pc_pred_lr=(0.1, 0.2), pc_pred_iters=2,
                             forgetting=(0.5, 0.9), rls_init_scale=(10.0,))


def test_candidates_are_the_full_products_of_the_grids():
    c = tuning.candidates("lsq", SMALL)
    assert {k: len(v[1]) for k, v in c.items()} == {"sgd": 2, "sgd_decay": 2, "adam": 8, "pc": 4,
                                                   "rls": 2}
    assert {(a.step, a.b1, a.b2) for a in c["adam"][1]} == {
        (s, b1, b2) for s in (0.05, 0.2) for b1 in (0.0, 0.9) for b2 in (0.9, 0.999)}
    assert {(p.step, p.pred_lr) for p in c["pc"][1]} == {(0.05, 0.1), (0.05, 0.2), (0.2, 0.1),
                                                          (0.2, 0.2)}
    assert "rls" not in tuning.candidates("logistic", SMALL)
    with pytest.raises(ValueError, match="adam_b1 is empty"):
        dataclasses.replace(SMALL, adam_b1=())
    with pytest.raises(ValueError, match="b1=1.0"):
        dataclasses.replace(SMALL, adam_b1=(1.0,))


def test_tune_picks_the_grid_point_with_the_lowest_tuning_error_and_scores_match_a_loop():
    problem = P.Problem(kind="lsq", dim=3, batch=4, steps=30)
    eps = P.sample_episodes(jax.random.key(0), problem, 3)
    runner, cands = tuning.candidates("lsq", SMALL)["adam"]
    best, scores = tuning.tune(runner, cands, eps, start=5)
    x0 = jnp.zeros(3)
    by_loop = []
    for c in cands:  # the vmapped grid equals one run per (config, episode)
        err = [np.sum((np.asarray(B.adam(a, y, x0, "lsq", c)) - np.asarray(th)) ** 2, -1)[5:].mean()
               for a, y, th in zip(eps.A, eps.y, eps.theta, strict=True)]
        by_loop.append(np.mean(err))
    np.testing.assert_allclose(scores, by_loop, rtol=1e-4)
    assert best == cands[int(np.argmin(by_loop))]


def test_diverging_candidates_score_infinite_and_all_diverging_raises():
    problem = P.Problem(kind="lsq", dim=3, batch=4, steps=40)
    eps = P.sample_episodes(jax.random.key(1), problem, 2)
    runner, _ = tuning.candidates("lsq", SMALL)["sgd"]
    best, scores = tuning.tune(runner, [B.SGDConfig(step=0.1), B.SGDConfig(step=1e4)], eps, 0)
    assert best.step == 0.1 and np.isinf(scores[1])
    with pytest.raises(ValueError, match="diverged"):
        tuning.tune(runner, [B.SGDConfig(step=1e4)], eps, 0)


def test_grid_edges_are_named():
    best = B.AdamConfig(step=0.2, b1=0.5, b2=0.9)
    assert tuning.on_grid_edge(best, SMALL, "adam") == ["step=0.2 (largest)", "b2=0.9 (smallest)"]


def test_paired_comparison_is_a_two_standard_error_rule():
    rng = np.random.default_rng(0)
    base = rng.uniform(1, 2, 16)
    gap = rng.normal(0, 0.1, 16)
    r = EV.paired_comparison(base + gap, base)
    diff = gap
    assert r["difference"] == pytest.approx(diff.mean())
    assert r["se"] == pytest.approx(stats.sem(diff))
    assert EV.paired_comparison(base - 1.0 + 0.01 * gap, base)["outcome"] == "wins"
    assert EV.paired_comparison(base + 1.0 + 0.01 * gap, base)["outcome"] == "loses"
    assert EV.paired_comparison([1.0], [2.0])["outcome"] == "ties"  # one episode: unknown error
    with pytest.raises(ValueError, match="equal-length"):
        EV.paired_comparison([1.0, 2.0], [1.0])


def test_noise_memory_of_sgd_is_the_closed_form_of_the_linear_recursion():
    # SGD on least squares is linear in the noise: x_T = ... + sum_k Phi_{T,k} eta A_k^T noise eps_k / M,
    # so |d x_T / d eps_k|^2 = || prod_{j>k} (I - eta A_j^T A_j / M) eta A_k^T noise / M ||_F^2.
    problem = P.Problem(kind="lsq", dim=2, batch=3, steps=6, noise=0.7)
    ep = P.sample_episode(jax.random.key(2), problem)
    eta = 0.1
    out = EV.noise_memory(problem, ep, {
        "sgd": lambda A, y, x0: B.sgd(A, y, x0, "lsq", B.SGDConfig(step=eta))})
    A = np.asarray(ep.A, np.float64)
    T, M, d = A.shape
    expect = []
    for k in range(T):
        J = eta * A[k].T * problem.noise / M
        for j in range(k + 1, T):
            J = (np.eye(d) - eta * A[j].T @ A[j] / M) @ J
        expect.append(np.sum(J ** 2))
    np.testing.assert_allclose(out["sgd"]["by_lag"], expect[::-1], rtol=1e-4)
    assert out["sgd"]["clark_ocone_variance"] == pytest.approx(sum(expect), rel=1e-4)
    with pytest.raises(ValueError, match="least-squares"):
        EV.noise_memory(dataclasses.replace(problem, kind="logistic"), ep, {})


def test_scaling_sweep_rescales_steps_and_marks_missing_methods():
    problem = P.Problem(kind="lsq", dim=4, batch=4, steps=12)
    seen = []

    def runners(d, factor):
        seen.append((d, factor))
        out = {"sgd": lambda A, y, x0: B.sgd(A, y, x0, "lsq", B.SGDConfig(step=0.1 * factor))}
        if d <= 4:
            out["rls"] = lambda A, y, x0: B.rls(A, y, x0, B.RLSConfig())
        return out

    res = EV.scaling_sweep(problem, (4, 8), jax.random.key(0), runners, burn_in=0.25, repeats=1)
    assert seen == [(4, 1.0), (8, (4 + 4 + 1) / (4 + 8 + 1))]
    assert res["seconds_per_step"]["rls"][1] is None and res["tracking_mse"]["rls"][0] > 0
    ep = P.sample_episode(jax.random.fold_in(jax.random.key(0), 8), dataclasses.replace(problem, dim=8))
    X = B.sgd(ep.A, ep.y, jnp.zeros(8), "lsq", B.SGDConfig(step=0.1 * 9 / 13))
    mse = float(jnp.mean(jnp.sum((X - ep.theta) ** 2, -1)[3:]))
    assert res["tracking_mse"]["sgd"][1] == pytest.approx(mse, rel=1e-5)
    norm = float(jnp.mean(jnp.sum(ep.theta[3:] ** 2, -1)))
    assert res["relative_error"]["sgd"][1] == pytest.approx(mse / norm, rel=1e-5)


def test_make_problem_and_training_pieces():
    settings = {"dim": 3, "steps": 20, "batch": 2, "dt": 0.1, "noise": 0.3, "omega_min": 0.2,
                "omega_max": 0.5, "ou_kappa": 0.5, "ou_sigma": 1.0}
    problem = TR.make_problem("lsq_ou", settings, steps=10)
    assert (problem.kind, problem.drift, problem.dim, problem.steps) == ("lsq", "ou", 3, 10)
    with pytest.raises(ValueError, match="unknown problem 'lsq_spin'"):
        TR.make_problem("lsq_spin", settings)
    t = TR.spf_training(problem, S.SPFConfig(hidden=4), TR.TrainSettings(episodes=2, episode_steps=5))
    theta, A, y = next(t.batches)
    assert (theta.shape, A.shape, y.shape) == ((2, 5, 3), (2, 5, 2, 3), (2, 5, 2))
    ref = P.sample_episodes(jax.random.fold_in(t.key, 0), dataclasses.replace(problem, steps=5), 2)
    np.testing.assert_array_equal(np.asarray(A), np.asarray(ref.A))
    _, metrics = jax.jit(t.step_fn)(t.state, (theta, A, y), t.key)
    assert np.isfinite(float(metrics["loss"]))
    with pytest.raises(ValueError, match="positive steps"):
        TR.TrainSettings(episodes=0)
