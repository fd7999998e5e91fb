"""Expected vs observed information of the judge-aware BTL model: exact expectations by enumeration,
statsmodels' logistic regression for plain BTL, the canonical-link identity, and the covariance
conventions."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import statsmodels.api as sm

from algorithms.ranking import btl, data, inference
from algorithms.ranking.data import LEFT, RIGHT

# A small design: 3 models, 2 judges, 5 single comparisons (enumerable: 2^5 or 3^5 outcomes).
ROWS = [(0, 1, 0), (1, 2, 0), (0, 2, 1), (0, 1, 1), (1, 2, 1)]
N, J = 3, 2


def _x(seed, tau=0.0):
    """A point that is not an optimum: random scores and log-discriminations (sum 0 not needed)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=N), rng.normal(scale=0.6, size=J), [tau]])


def _outcome_probs(x, tie_model):
    """Per-row outcome probabilities [M, 3] written from the model's definitions (numpy)."""
    out = []
    for i, j, k in ROWS:
        d = np.exp(x[N + k]) * (x[i] - x[j])
        if tie_model == "half":
            p = 1 / (1 + np.exp(-d))
            out.append([p, 1 - p, 0.0])
        elif tie_model == "davidson":
            w = np.array([np.exp(d / 2), np.exp(-d / 2), np.exp(x[-1])])
            out.append(w / w.sum())
        else:  # Rao-Kupper: P(i) = sigmoid(d - eta), P(j) = sigmoid(-d - eta)
            eta = np.exp(x[-1])
            pi, pj = 1 / (1 + np.exp(-(d - eta))), 1 / (1 + np.exp(d + eta))
            out.append([pi, pj, 1 - pi - pj])
    return np.asarray(out)


def _tables(outcomes):
    """One table per outcome vector (each row judged once): counts [K, M] for wins/losses/ties."""
    o = np.asarray(outcomes)
    i, j, k = (np.asarray(v, np.int32) for v in zip(*ROWS))
    return data.ComparisonTable(np.broadcast_to(i, o.shape), np.broadcast_to(j, o.shape),
                                np.broadcast_to(k, o.shape), (o == 0).astype(np.float64),
                                (o == 1).astype(np.float64), (o == 2).astype(np.float64), N, J)


@pytest.mark.parametrize("tie_model, tau", [("half", 0.0), ("davidson", np.log(0.7)),
                                            ("rao_kupper", np.log(0.4))])
def test_expected_information_is_the_average_observed_information(tie_model, tau):
    # Each comparison is a categorical draw: enumerate every outcome of the 5 comparisons, weight
    # the observed information (the Hessian) by its exact probability, and compare.
    x = _x(0, tau)
    probs = _outcome_probs(x, tie_model)
    k = 2 if tie_model == "half" else 3
    outcomes = np.asarray(list(itertools.product(range(k), repeat=len(ROWS))))
    weights = np.prod(probs[np.arange(len(ROWS)), outcomes], axis=1)
    np.testing.assert_allclose(weights.sum(), 1.0, rtol=1e-12)
    cfg = btl.FitConfig(tie_model=tie_model)
    tables = _tables(outcomes)
    with jax.enable_x64(True):
        xj = jnp.asarray(x)
        hess = jax.jit(jax.vmap(lambda t: btl.derivatives(xj, t, cfg)[2]))(tables)
        expected = jax.jit(btl.expected_information, static_argnums=2)(
            xj, jax.tree.map(lambda a: a[0], tables), cfg)
        hess, expected = np.asarray(hess), np.asarray(expected)
    avg = np.einsum("k,kab->ab", weights, hess)
    np.testing.assert_allclose(expected, avg, rtol=1e-10, atol=1e-12)
    # The two conventions differ outcome by outcome (the test could fail).
    assert np.max(np.abs(hess - expected)) > 0.05


def test_plain_btl_expected_covariance_matches_statsmodels_logit():
    # Plain BTL is a logistic regression without intercept on the difference design
    # (+1 at the left model, -1 at the right); in zero-sum (Helmert) coordinates its covariance is
    # statsmodels' cov_params (the inverse Fisher information of the logit model).
    rng = np.random.default_rng(3)
    n, c = 5, 400
    s = rng.normal(size=n)
    left = rng.integers(0, n, c)
    right = (left + rng.integers(1, n, c)) % n
    y = (rng.random(c) < 1 / (1 + np.exp(-(s[left] - s[right])))).astype(float)
    table = data.aggregate(left, right, np.where(y > 0, LEFT, RIGHT))
    res = btl.fit(table, btl.FitConfig(judge_aware=False))
    with jax.enable_x64(True):
        basis = np.asarray(btl.zero_sum_basis(n))
        cov = np.asarray(inference.covariance(table.astype(np.float64), res.params, res.config,
                                              information="expected"))
    design = np.zeros((c, n))
    design[np.arange(c), left] += 1.0
    design[np.arange(c), right] -= 1.0
    logit = sm.Logit(y, design @ basis).fit(method="newton", tol=1e-12, disp=0)
    np.testing.assert_allclose(basis @ logit.params, res.params.scores, atol=1e-8)
    np.testing.assert_allclose(cov[:n, :n], basis @ logit.cov_params() @ basis.T, rtol=1e-7,
                               atol=1e-12)
    np.testing.assert_allclose(cov[n:, :], 0.0, atol=0)  # alpha and tau fixed: no variance


def test_observed_equals_expected_for_plain_btl_and_differs_by_hess_d_for_judge_aware():
    # The logit link is canonical for the scores: observed == expected in the (s, s) block at any
    # point and any data. The (s, alpha) and (alpha, alpha) blocks differ by
    # sum_rows (n p - y) hess d, hess d = gamma at (s_i, alpha_k), -gamma at (s_j, alpha_k),
    # d at (alpha_k, alpha_k), written here from the definitions.
    rng = np.random.default_rng(5)
    x = _x(1)
    wins = rng.integers(0, 4, len(ROWS)).astype(np.float64)
    losses = rng.integers(0, 4, len(ROWS)).astype(np.float64)
    ties = rng.integers(0, 2, len(ROWS)).astype(np.float64)
    i, j, k = (np.asarray(v, np.int32) for v in zip(*ROWS))
    table = data.ComparisonTable(i, j, k, wins, losses, ties, N, J)
    cfg = btl.FitConfig()
    with jax.enable_x64(True):
        hess = jax.jit(lambda y: btl.derivatives(y, table, cfg)[2])(jnp.asarray(x))
        expected = jax.jit(lambda y: btl.expected_information(y, table, cfg))(jnp.asarray(x))
        hess, expected = np.asarray(hess), np.asarray(expected)
    np.testing.assert_allclose(hess[:N, :N], expected[:N, :N], rtol=1e-12, atol=1e-12)
    diff = np.zeros_like(hess)
    for r, (a, b, kk) in enumerate(ROWS):
        g = np.exp(x[N + kk])
        d = g * (x[a] - x[b])
        tot = wins[r] + losses[r] + ties[r]
        resid = tot / (1 + np.exp(-d)) - (wins[r] + 0.5 * ties[r])
        for m, sign in ((a, 1.0), (b, -1.0)):
            diff[m, N + kk] += resid * sign * g
            diff[N + kk, m] += resid * sign * g
        diff[N + kk, N + kk] += resid * d
    np.testing.assert_allclose(hess - expected, diff, rtol=1e-10, atol=1e-12)
    assert np.max(np.abs(diff)) > 0.1


def test_covariance_conventions_at_the_fit():
    rng = np.random.default_rng(2)
    n, nj, c = 5, 3, 3000
    s, a = rng.normal(size=n), np.log([2.5, 1.0, 0.3])
    left = rng.integers(0, n, c)
    right = (left + rng.integers(1, n, c)) % n
    judge = rng.integers(0, nj, c)
    y = rng.random(c) < 1 / (1 + np.exp(-np.exp(a[judge]) * (s[left] - s[right])))
    table = data.aggregate(left, right, np.where(y, LEFT, RIGHT), judge).astype(np.float64)
    plain = btl.fit(table, btl.FitConfig(judge_aware=False))
    aware = btl.fit(table, btl.FitConfig())
    with jax.enable_x64(True):
        cov = {(name, info): np.asarray(inference.covariance(table, r.params, r.config,
                                                             information=info))
               for name, r in (("plain", plain), ("aware", aware))
               for info in ("expected", "observed")}
        default = np.asarray(inference.covariance(table, aware.params, aware.config))
        sandwich_default = np.asarray(inference.covariance(table, aware.params, aware.config,
                                                           "sandwich"))
        sandwich_observed = np.asarray(inference.covariance(table, aware.params, aware.config,
                                                            "sandwich", "observed"))
    np.testing.assert_allclose(cov["plain", "observed"], cov["plain", "expected"], rtol=1e-10,
                               atol=1e-14)
    np.testing.assert_array_equal(default, cov["aware", "expected"])  # expected is the default
    np.testing.assert_array_equal(sandwich_default, sandwich_observed)  # the sandwich's bread
    se_e = np.sqrt(np.diag(cov["aware", "expected"])[:n + nj])
    se_o = np.sqrt(np.diag(cov["aware", "observed"])[:n + nj])
    # At the MLE the two are consistent estimates of one matrix: close, but not equal.
    assert np.max(np.abs(se_o / se_e - 1)) > 1e-4
    np.testing.assert_allclose(se_o, se_e, rtol=0.05)
    with pytest.raises(ValueError, match="information='fisher'"):
        inference.covariance(table, aware.params, aware.config, information="fisher")
