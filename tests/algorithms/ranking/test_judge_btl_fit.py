"""Judge-aware BTL fit and inference: choix, autodiff, closed forms, recovery, invariances, errors."""

import choix
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.ranking import btl, data, inference, simulate
from algorithms.ranking.data import LEFT, RIGHT, TIE

N, J = 6, 4
TRUE_S = np.array([-1.2, -0.6, -0.1, 0.2, 0.6, 1.1])
TRUE_A = np.log(np.array([3.0, 1.5, 1.0, 0.15]))


def _true_params(tie=0.0):
    s = TRUE_S - TRUE_S.mean()
    a = TRUE_A - TRUE_A.mean()
    return btl.Params(jnp.asarray(s), jnp.asarray(a), jnp.asarray(tie))


def _sample(seed, num, tie_model="half", tie=0.0, pad_to=None):
    with jax.enable_x64(True):
        l, r, k, o = simulate.sample_comparisons(jax.random.key(seed), _true_params(tie), num, tie_model)
    return data.aggregate(np.asarray(l), np.asarray(r), np.asarray(o), np.asarray(k),
                          n_models=N, n_judges=J, pad_to=pad_to)


@pytest.fixture(scope="module")
def big_fit():
    """40k comparisons of the 6-model, 4-judge truth (one judge nearly random)."""
    table = _sample(0, 40_000, pad_to=N * (N - 1) // 2 * J)
    return table, btl.fit(table, btl.FitConfig())


def test_plain_btl_matches_choix():
    rng = np.random.default_rng(1)
    n, c = 8, 3000
    s = rng.normal(size=n)
    left = rng.integers(0, n, c)
    right = (left + rng.integers(1, n, c)) % n
    left_wins = rng.random(c) < 1 / (1 + np.exp(-(s[left] - s[right])))
    table = data.aggregate(left, right, np.where(left_wins, LEFT, RIGHT))
    res = btl.fit(table, btl.FitConfig(judge_aware=False))
    pairs = [(a, b) if w else (b, a) for a, b, w in zip(left, right, left_wins)]
    ref = choix.ilsr_pairwise(n, pairs, alpha=0.0, tol=1e-13, max_iter=10_000)
    np.testing.assert_allclose(res.params.scores, ref - ref.mean(), atol=1e-6)
    assert bool(res.convergence.converged) and float(res.convergence.grad_norm) < 1e-6
    np.testing.assert_allclose(res.params.log_discrimination, 0.0)


@pytest.mark.parametrize("tie_model", btl.TIE_MODELS)
def test_derivatives_match_autodiff_and_finite_differences(tie_model):
    table = _sample(3, 300, pad_to=64)
    cfg = btl.FitConfig(tie_model=tie_model, ridge_scores=0.3, ridge_alpha=0.7)
    with jax.enable_x64(True):
        t = table.astype(np.float64)
        x = jnp.asarray(np.random.default_rng(4).normal(size=N + J + 1) * 0.5)
        obj = lambda y: btl.objective(y, t, cfg)
        eps = 1e-6
        steps = eps * jnp.eye(x.shape[0])

        @jax.jit
        def everything(x):  # one compilation for all the values compared below
            f, g, h = btl.derivatives(x, t, cfg)
            fd = jax.vmap(lambda e: (obj(x + e) - obj(x - e)) / (2 * eps))(steps)
            grad = jax.vmap(lambda y: btl.derivatives(y, t, cfg)[1])
            fd_h = (grad(x + steps) - grad(x - steps)) / (2 * eps)
            return f, g, h, obj(x), jax.grad(obj)(x), fd, fd_h

        f, g, h, f_ad, g_ad, fd, fd_h = everything(x)
        np.testing.assert_allclose(f, f_ad, rtol=1e-12)
        np.testing.assert_allclose(g, g_ad, rtol=1e-9, atol=1e-9)
        if tie_model == "half":  # one full autodiff Hessian (its compilation is the slow part)
            np.testing.assert_allclose(h, jax.jit(jax.hessian(obj))(x), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(h, fd_h, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-5)


def test_outcome_probabilities_are_distributions():
    d = jnp.linspace(-4, 4, 9)
    for tie_model in ("davidson", "rao_kupper"):
        p = jnp.exp(btl.outcome_logprobs(d, jnp.asarray(-0.3), tie_model))
        np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
        np.testing.assert_allclose(p[:, 0], p[::-1, 1], rtol=1e-5)  # symmetric in d
    # Davidson at d = 0: P(tie) = nu / (2 + nu).
    p = jnp.exp(btl.outcome_logprobs(jnp.zeros(()), jnp.log(2.0), "davidson"))
    np.testing.assert_allclose(p, [0.25, 0.25, 0.5], rtol=1e-6)


def test_zero_sum_basis_is_orthonormal():
    q = np.asarray(btl.zero_sum_basis(5))
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-6)
    np.testing.assert_allclose(q.sum(0), 0.0, atol=1e-6)


def test_two_models_closed_form_and_fisher_interval():
    # 30 wins, 10 losses: s1 - s0 = log 3, Var = 1 / (n p (1 - p)) = 1 / (40 * 3/16).
    table = data.aggregate([1, 0], [0, 1], [LEFT, LEFT], weights=[30, 10])
    res = btl.fit(table, btl.FitConfig(judge_aware=False))
    np.testing.assert_allclose(res.params.scores, [-np.log(3) / 2, np.log(3) / 2], rtol=1e-10)
    with jax.enable_x64(True):
        cov = inference.covariance(table.astype(np.float64), res.params, res.config)
        ci = inference.intervals(res.params, cov, level=0.95)
        sand = inference.covariance(table.astype(np.float64), res.params, res.config, "sandwich")
    var_d = 1 / (40 * 0.75 * 0.25)
    np.testing.assert_allclose(ci.diff_se[1, 0], np.sqrt(var_d), rtol=1e-9)
    np.testing.assert_allclose(ci.scores_se, np.sqrt(var_d) / 2, rtol=1e-9)
    np.testing.assert_allclose(ci.diff_hi[1, 0] - ci.diff_lo[1, 0], 2 * 1.959963985 * np.sqrt(var_d),
                               rtol=1e-8)
    # With a saturated binomial model the robust and the model-based variances coincide.
    np.testing.assert_allclose(sand, cov, rtol=1e-8, atol=1e-12)


def test_recovery_of_known_parameters(big_fit):
    table, res = big_fit
    p = res.params
    assert bool(res.convergence.converged)
    np.testing.assert_allclose(np.sum(p.scores), 0.0, atol=1e-10)
    np.testing.assert_allclose(np.sum(p.log_discrimination), 0.0, atol=1e-10)
    with jax.enable_x64(True):
        cov = inference.covariance(table.astype(np.float64), p, res.config)
    ci = inference.intervals(p, cov)
    truth = _true_params()
    z_s = (p.scores - truth.scores) / ci.scores_se
    z_a = (p.log_discrimination - truth.log_discrimination) / np.sqrt(np.diag(cov)[N:N + J])
    assert np.max(np.abs(z_s)) < 4 and np.max(np.abs(z_a)) < 4, (z_s, z_a)
    np.testing.assert_allclose(p.scores, truth.scores, atol=0.12)
    # The nearly random judge is recognised as such.
    assert np.argmin(p.discrimination) == 3 and p.discrimination[3] < 0.35
    plain = btl.fit(table, btl.FitConfig(judge_aware=False)).params
    # The judge-aware fit has the higher likelihood (it nests plain BTL).
    with jax.enable_x64(True):
        t64 = table.astype(np.float64)
        assert btl.loglik(p, t64) > btl.loglik(plain, t64)


def test_invariance_to_relabelling_models_and_judges(big_fit):
    table, res = big_fit
    rng = np.random.default_rng(5)
    pm, pj = rng.permutation(N), rng.permutation(J)
    inv_m, inv_j = np.argsort(pm), np.argsort(pj)
    tot = np.asarray(table.totals) > 0
    # Relabel model m -> inv_m[m]; rebuild from raw (i, j) rows with their counts.
    i, j, k = np.asarray(table.i)[tot], np.asarray(table.j)[tot], np.asarray(table.judge)[tot]
    w, l, t = (np.asarray(a)[tot] for a in (table.wins, table.losses, table.ties))
    left = np.concatenate([inv_m[i], inv_m[i], inv_m[i]])
    right = np.concatenate([inv_m[j], inv_m[j], inv_m[j]])
    judge = np.concatenate([inv_j[k]] * 3)
    out = np.concatenate([np.full(i.size, LEFT), np.full(i.size, RIGHT), np.full(i.size, TIE)])
    relab = data.aggregate(left, right, out, judge, n_models=N, n_judges=J,
                           weights=np.concatenate([w, l, t]), pad_to=table.num_rows)
    res2 = btl.fit(relab, btl.FitConfig())
    np.testing.assert_allclose(res2.params.scores[inv_m], res.params.scores, atol=1e-8)
    np.testing.assert_allclose(res2.params.log_discrimination[inv_j], res.params.log_discrimination,
                               atol=1e-8)


def test_single_judge_is_plain_btl():
    with jax.enable_x64(True):
        l, r, _, o = simulate.sample_comparisons(jax.random.key(6), _true_params(), 2000)
    one = data.aggregate(np.asarray(l), np.asarray(r), np.asarray(o), n_models=N)
    plain = btl.fit(one, btl.FitConfig(judge_aware=False))
    aware = btl.fit(one, btl.FitConfig(judge_aware=True))
    np.testing.assert_allclose(aware.params.scores, plain.params.scores, atol=1e-10)
    np.testing.assert_allclose(aware.params.log_discrimination, 0.0)


@pytest.mark.parametrize("tie_model, tie", [("davidson", np.log(0.8)), ("rao_kupper", np.log(0.5))])
def test_tie_models_recover_tie_parameter(tie_model, tie):
    table = _sample(7, 20_000, tie_model=tie_model, tie=tie, pad_to=N * (N - 1) // 2 * J)
    assert np.sum(table.ties) > 1000
    res = btl.fit(table, btl.FitConfig(tie_model=tie_model))
    with jax.enable_x64(True):
        cov = inference.covariance(table.astype(np.float64), res.params, res.config)
    se = float(np.sqrt(cov[-1, -1]))
    assert abs(float(res.params.tie) - tie) < 4 * se, (float(res.params.tie), tie, se)
    np.testing.assert_allclose(res.params.scores, _true_params().scores, atol=0.15)


def test_rank_intervals_collapse_when_scores_are_far_apart():
    params = btl.Params(jnp.asarray([-6.0, 0.0, 6.0]), jnp.zeros(1), jnp.zeros(()))
    cov = jnp.zeros((5, 5)).at[:3, :3].set(0.01 * (jnp.eye(3) - 1 / 3))
    point, lo, hi = inference.rank_intervals(jax.random.key(0), params, cov, num_draws=500)
    np.testing.assert_array_equal(point, [3, 2, 1])
    np.testing.assert_array_equal(lo, [3, 2, 1])
    np.testing.assert_array_equal(hi, [3, 2, 1])
    # Two indistinguishable models share the interval [1, 2].
    params = btl.Params(jnp.asarray([-6.0, 3.0, 3.0]), jnp.zeros(1), jnp.zeros(()))
    cov = jnp.zeros((5, 5)).at[:3, :3].set(jnp.eye(3) - 1 / 3)
    _, lo, hi = inference.rank_intervals(jax.random.key(1), params, cov, num_draws=2000)
    np.testing.assert_array_equal(lo, [3, 1, 1])
    np.testing.assert_array_equal(hi, [3, 2, 2])


def test_bootstrap_spread_matches_fisher_standard_errors():
    table = _sample(8, 6000, pad_to=N * (N - 1) // 2 * J)
    res = btl.fit(table, btl.FitConfig(judge_aware=False))
    with jax.enable_x64(True):
        t = table.astype(np.float64)
        cov = inference.covariance(t, res.params, res.config)
        draws, ok = inference.bootstrap(jax.random.key(9), t, res.params, res.config, num_samples=64)
        # host copies: float64 jax arrays used outside the x64 scope would be cut to float32
        cov, scores, ok = np.asarray(cov), np.asarray(draws.scores), np.asarray(ok)
    assert bool(np.all(ok))
    summary = inference.bootstrap_intervals(scores, ok)
    assert summary.num_used == 64 and summary.num_dropped == 0
    se = np.sqrt(np.diag(cov)[:N])
    np.testing.assert_allclose(np.std(scores, axis=0), se, rtol=0.3)
    assert np.all(summary.lo < res.params.scores) and np.all(res.params.scores < summary.hi)


def test_divergent_judge_is_reported():
    # A cycle keeps the scores finite; judge 1 judges once, in line with the majority: gamma_1 -> inf.
    left = [0, 1, 2, 0, 1, 2, 1, 0]
    right = [1, 2, 0, 1, 2, 0, 0, 2]
    out = [LEFT, LEFT, LEFT, LEFT, LEFT, LEFT, LEFT, RIGHT]
    judge = [0, 0, 0, 0, 0, 0, 0, 1]
    table = data.aggregate(left, right, out, judge)
    with pytest.raises(ValueError, match=r"log-discriminations alpha of judges \[1\] \(at \+[0-9.]+ "
                       r"where the fit stopped\) run to \+inf: the discrimination gamma grows "
                       r"without bound") as err:
        btl.fit(table, btl.FitConfig())
    assert "falls to 0" not in str(err.value) and "ridge_alpha > 0" in str(err.value)
    res = btl.fit(table, btl.FitConfig(ridge_alpha=1.0))  # the MAP is finite
    assert bool(res.convergence.converged) and np.all(np.abs(res.params.log_discrimination) < 3)


def test_judge_whose_votes_ignore_the_models_is_reported_as_discrimination_to_zero():
    # Judges 0 and 1 follow a score order; judge 2 always votes for the left answer and sees every
    # pair in both orientations, so its votes are independent of the models: its likelihood is
    # highest at gamma_2 = 0 (every comparison a coin flip), alpha_2 -> -inf. The message used to
    # say that it "grows without bound (its comparisons become certain)".
    rng = np.random.default_rng(0)
    s = np.array([0.0, 0.7, 1.4])
    left, right, out, judge = [], [], [], []
    for k in (0, 1):
        for _ in range(60):
            a, b = rng.choice(3, 2, replace=False)
            left.append(a)
            right.append(b)
            judge.append(k)
            out.append(LEFT if rng.random() < 1 / (1 + np.exp(-2 * (s[a] - s[b]))) else RIGHT)
    for a, b in [(0, 1), (1, 2), (0, 2)] * 3:
        left += [a, b]
        right += [b, a]
        out += [LEFT, LEFT]
        judge += [2, 2]
    table = data.aggregate(left, right, out, judge)
    with pytest.raises(ValueError, match=r"log-discriminations alpha of judges \[2\] \(at -[0-9.]+ "
                       r"where the fit stopped\) run to -inf: the discrimination gamma falls to 0") as err:
        btl.fit(table, btl.FitConfig())
    assert "coin flips" in str(err.value) and "grows without bound" not in str(err.value)
    assert "judges [0" not in str(err.value) and "scores of models" not in str(err.value)
    res = btl.fit(table, btl.FitConfig(ridge_alpha=1.0))  # with a prior judge 2 is merely weak
    assert np.argmin(res.params.log_discrimination) == 2


def test_fit_config_validation():
    with pytest.raises(ValueError, match="tie_model"):
        btl.FitConfig(tie_model="bradley")
    with pytest.raises(ValueError, match="ridge_alpha"):
        btl.FitConfig(ridge_alpha=-1.0)
    with pytest.raises(ValueError, match="level"):
        inference.intervals(_true_params(), jnp.zeros((N + J + 1,) * 2), level=1.5)
