"""Metrics and losses of algorithms.forecasting against closed forms and properscoring."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import properscoring
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from algorithms.forecasting import losses, metrics
from tests.hypothesis_budget import examples


def _fair_crps_ref(samples, target):
    """The fair CRPS from its definition (Ferro 2014), float64: samples [..., S], target [...]."""
    x, y = np.asarray(samples, np.float64), np.asarray(target, np.float64)
    s = x.shape[-1]
    pairs = np.abs(x[..., :, None] - x[..., None, :]).sum((-1, -2))   # sum over i != j (diag 0)
    return np.abs(x - y[..., None]).mean(-1) - pairs / (2 * s * (s - 1))


def _normal_crps(y):
    """Closed-form CRPS of N(0, 1) at y (Gneiting & Raftery 2007)."""
    return y * (2 * stats.norm.cdf(y) - 1) + 2 * stats.norm.pdf(y) - 1 / math.sqrt(math.pi)


def _case(seed, b=3, s=17, h=5, n=2):
    rng = np.random.default_rng(seed)
    samples = rng.normal(size=(b, s, h, n)).astype(np.float32) * rng.uniform(0.5, 2.0)
    target = rng.normal(size=(b, h, n)).astype(np.float32) + rng.normal()
    return samples, target


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_crps_matches_properscoring(seed):
    samples, target = _case(seed)
    plain = metrics.crps_ensemble(jnp.asarray(samples), jnp.asarray(target), axis=1, fair=False)
    ref = properscoring.crps_ensemble(target, np.moveaxis(samples, 1, -1))
    np.testing.assert_allclose(np.asarray(plain), ref, rtol=2e-5, atol=2e-6)
    # properscoring's is the plain estimator A - P/(2S^2) (P: the pair sum); the fair one is
    # A - P/(2S(S-1)) = plain - P/(2 S^2 (S-1)), and the default.
    x = np.moveaxis(samples, 1, -1).astype(np.float64)
    s = x.shape[-1]
    pairs = np.abs(x[..., :, None] - x[..., None, :]).sum((-1, -2))
    fair = metrics.crps_ensemble(jnp.asarray(samples), jnp.asarray(target), axis=1)
    np.testing.assert_allclose(np.asarray(fair), ref - pairs / (2 * s * s * (s - 1)), rtol=2e-5,
                               atol=2e-6)
    np.testing.assert_allclose(np.asarray(fair), _fair_crps_ref(x, target), rtol=2e-5, atol=2e-6)


def test_crps_closed_forms():
    # One sample: the plain CRPS is |x - y|; the fair one needs two.
    x = jnp.array([[1.5]]), jnp.array([-0.5])
    np.testing.assert_allclose(metrics.crps_ensemble(x[0], x[1], fair=False), [2.0], rtol=1e-6)
    with pytest.raises(ValueError, match="at least 2 samples"):
        metrics.crps_ensemble(x[0], x[1])
    with pytest.raises(ValueError, match="at least 2 samples"):
        metrics.metric_sums(jnp.zeros((2, 1, 3, 1)), jnp.zeros((2, 3, 1)))
    # Two samples at -1 and 1, target 0: E|X - y| = 1, E|X - X'| = 2 over distinct pairs (fair: 0)
    # and 1 over all four ordered pairs (plain: 1/2).
    two, zero = jnp.array([-1.0, 1.0]), jnp.float32(0.0)
    assert float(metrics.crps_ensemble(two, zero)) == 0.0
    assert float(metrics.crps_ensemble(two, zero, fair=False)) == 0.5


QUANTILE_Y = np.linspace(-2.5, 2.5, 11)


@pytest.mark.parametrize("s", [50, 400])
def test_quantile_set_needs_the_plain_estimator(s):
    # The midpoint quantile set F^-1((i - 1/2)/S) of N(0, 1): the plain CRPS is a midpoint rule for
    # 2 int_0^1 QS_tau(F^-1(tau), y) d tau, whose integrand has a kink of slope ~1/f(y) at
    # tau = F(y), so it is within O(1/(f(y) S^2)) of the closed form (float64: max |error| S^2 f(y)
    # grows from 0.18 to 0.32 over S = 25..1600, the tails' log factor); the fair one is too low by
    # E|X - X'|/(2(S - 1)) = 1/(sqrt(pi)(S - 1)) to leading order. So a quantile set and iid draws
    # cannot share one estimator.
    q = jnp.asarray(stats.norm.ppf((np.arange(s) + 0.5) / s), jnp.float32)
    qs = jnp.broadcast_to(q, (len(QUANTILE_Y), s))
    y = jnp.asarray(QUANTILE_Y, jnp.float32)
    closed = _normal_crps(QUANTILE_Y)
    plain = np.asarray(metrics.crps_ensemble(qs, y, fair=False))
    assert np.max(np.abs(plain - closed) * stats.norm.pdf(QUANTILE_Y)) <= 0.5 / s**2
    fair = np.asarray(metrics.crps_ensemble(qs, y))
    np.testing.assert_allclose((fair - closed) * math.sqrt(math.pi) * (s - 1), -1.0, atol=0.3)


def test_fair_crps_of_draws_is_unbiased_and_plain_is_not():
    # A perfect N(0, 1) forecast as S = 100 iid draws, R = 192 independent ensembles at each of 48
    # targets spread like N(0, 1) (its midpoint quantiles). For iid draws E[fair] = CRPS(N(0,1), y)
    # exactly; E[plain] = CRPS + E|X - X'|/(2S) = CRPS + 1/(S sqrt(pi)) at every y, which is
    # 1/S = 1.00% of the mean CRPS 1/sqrt(pi) over y ~ N(0, 1).
    s, r, k = 100, 192, 48
    y = stats.norm.ppf((np.arange(k) + 0.5) / k)
    draws = np.random.default_rng(11).standard_normal((k, r, s)).astype(np.float32)
    target = np.broadcast_to(y[:, None], (k, r)).astype(np.float32)
    fair = np.asarray(metrics.crps_ensemble(jnp.asarray(draws), jnp.asarray(target)), np.float64)
    plain = np.asarray(metrics.crps_ensemble(jnp.asarray(draws), jnp.asarray(target), fair=False),
                       np.float64)
    closed = _normal_crps(y)
    se = fair.std(1, ddof=1) / math.sqrt(r)                     # per target
    z = (fair.mean(1) - closed) / se
    assert np.max(np.abs(z)) < 4.0, z                           # no target is off by 4 SE
    pooled_se = math.sqrt(np.sum(se**2)) / k
    assert abs(fair.mean() - closed.mean()) < 4 * pooled_se
    bias = 1 / (s * math.sqrt(math.pi))
    # plain - fair = P/(2 S^2 (S-1)) with E[P] = S(S-1) E|X-X'|: its mean is the bias exactly.
    diff = plain - fair
    assert abs(diff.mean() - bias) < 4 * diff.std(ddof=1) / math.sqrt(diff.size)
    assert abs(plain.mean() - closed.mean() - bias) < 4 * pooled_se
    assert plain.mean() - closed.mean() > 5 * pooled_se       # the plain bias (8.5 SE) shows
    np.testing.assert_allclose(bias / closed.mean(), 1 / s, rtol=0.01)   # 1% of the mean CRPS


def test_perfect_draws_have_the_documented_coverage_and_qice_floor():
    # Uniform F, S = 20 iid draws per point: the rank of y among the S + 1 values is uniform, so y is
    # inside [min, max] with probability (S-1)/(S+1), and inside the central p interval of the
    # interpolated sample quantiles with probability p (S-1)/(S+1), not p (module doc).
    s, n = 20, 8000
    rng = np.random.default_rng(3)
    samples = jnp.asarray(rng.random((n, s, 1, 1)), jnp.float32)
    target = jnp.asarray(rng.random((n, 1, 1)), jnp.float32)
    sums = metrics.metric_sums(samples, target)
    for got, p in ((float(sums["covered_50"]) / n, 0.5), (float(sums["covered_90"]) / n, 0.9),
                   (float(sums["qice_counts"].sum()) / n, 1.0)):
        want = p * (s - 1) / (s + 1)
        assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / n), (p, got, want)


def test_crps_sum_and_streaming_equal_one_shot():
    samples, target = _case(3, b=6)
    one = metrics.evaluate(jnp.asarray(samples), jnp.asarray(target))
    sums = None
    for i in range(0, 6, 2):
        sums = metrics.add_sums(sums, metrics.metric_sums(jnp.asarray(samples[i:i + 2]),
                                                           jnp.asarray(target[i:i + 2])))
    two = metrics.finalize_metrics(sums)
    for k in one:
        np.testing.assert_allclose(two[k], one[k], rtol=1e-5, err_msg=k)
    ref_sum = _fair_crps_ref(np.moveaxis(samples.sum(-1), 1, -1), target.sum(-1))
    np.testing.assert_allclose(one["crps_sum_raw"], ref_sum.mean(), rtol=2e-5)
    np.testing.assert_allclose(one["crps_sum"],
                               ref_sum.sum() / np.abs(target.astype(np.float64).sum(-1)).sum(),
                               rtol=2e-5)
    np.testing.assert_allclose(one["crps"], _fair_crps_ref(np.moveaxis(samples, 1, -1), target).mean(),
                               rtol=2e-5)
    np.testing.assert_allclose(
        one["crps_plain"], properscoring.crps_ensemble(target, np.moveaxis(samples, 1, -1)).mean(),
        rtol=2e-5)
    mean = samples.mean(1)
    np.testing.assert_allclose(one["mse"], ((mean - target) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(one["mae"], np.abs(mean - target).mean(), rtol=1e-5)
    # Univariate: the unnormalised CRPS-sum is CRPS.
    uni = metrics.evaluate(jnp.asarray(samples[..., :1]), jnp.asarray(target[..., :1]))
    np.testing.assert_allclose(uni["crps_sum_raw"], uni["crps"], rtol=1e-6)


def test_crps_sum_is_normalised_by_the_target_sum_as_in_the_literature():
    """A perfect forecast of 7 independent N(0, 1) channels: the channel sum is N(0, 7), whose
    expected CRPS is sqrt(7 / pi) = 1.49 (the unnormalised value) while E|sum y| =
    sqrt(7) sqrt(2 / pi), so the literature's CRPS-sum (CRPS of the sum over sum |sum y|, as
    gluonts computes it) tends to 1 / sqrt(2) = 0.707. Both against a float64 NumPy computation
    from the definitions, and the plain CRPS of the sum against properscoring."""
    rng = np.random.default_rng(44)
    b, s, h, n = 48, 64, 8, 7
    samples = rng.normal(size=(b, s, h, n)).astype(np.float32)
    target = rng.normal(size=(b, h, n)).astype(np.float32)
    got = metrics.evaluate(jnp.asarray(samples), jnp.asarray(target))
    x = np.moveaxis(samples.astype(np.float64).sum(-1), 1, -1)   # [B, H, S]
    y = target.astype(np.float64).sum(-1)                         # [B, H]
    fair = _fair_crps_ref(x, y)
    np.testing.assert_allclose(got["crps_sum_raw"], fair.mean(), rtol=2e-5)
    np.testing.assert_allclose(got["crps_sum"], fair.sum() / np.abs(y).sum(), rtol=2e-5)
    plain = properscoring.crps_ensemble(y, x).mean()
    assert fair.mean() < plain  # the plain estimator's spread charge, on the sum too
    # the limits, within sampling error of b * h = 384 points (standard errors about 2%)
    assert got["crps_sum_raw"] == pytest.approx(math.sqrt(n / math.pi), rel=0.08)
    assert got["crps_sum"] == pytest.approx(1 / math.sqrt(2), rel=0.08)
    # undefined when every channel sum is 0: NaN, not inf
    zero = np.concatenate([target[..., :1], -target[..., :1]], axis=-1)
    assert np.isnan(metrics.evaluate(jnp.asarray(samples[..., :2]), jnp.asarray(zero))["crps_sum"])


def test_qice_and_coverage_calibrated_vs_overconfident():
    rng = np.random.default_rng(0)
    b, s, h = 400, 200, 4
    target = rng.normal(size=(b, h, 1)).astype(np.float32)
    calibrated = rng.normal(size=(b, s, h, 1)).astype(np.float32)
    good = metrics.evaluate(jnp.asarray(calibrated), jnp.asarray(target))
    bad = metrics.evaluate(jnp.asarray(0.3 * calibrated), jnp.asarray(target))
    assert good["qice"] < 0.01
    assert abs(good["coverage_90"] - 0.9) < 0.02 and abs(good["coverage_50"] - 0.5) < 0.03
    assert bad["qice"] > 0.03 and bad["coverage_90"] < 0.5
    assert bad["crps"] > good["crps"]


# Samples 0..10 -> deciles at the integers. Targets: 0.5 (bin 1), 9.5 (bin 10), 20 (above the largest
# sample), -1 (below the smallest), 5.0 (exactly on a quantile: strict '>' puts it in bin 5) and 0.0
# (equal to the smallest sample: no quantile is strictly below it, so it is out of range).
QICE_SAMPLES = jnp.broadcast_to(jnp.arange(11.0)[None, :, None, None], (6, 11, 1, 1))
QICE_TARGET = jnp.array([0.5, 9.5, 20.0, -1.0, 5.0, 0.0])[:, None, None]


def test_qice_counts_ppm_convention():
    # Out-of-range targets (20, -1, 0) are in no bin but count in the denominator (6 points):
    # QICE = (3 |1/6 - 1/10| + 7 |0 - 1/10|) / 10 = (3/15 + 7/10) / 10 = 0.09.
    counts = metrics.qice_bin_counts(QICE_SAMPLES, QICE_TARGET, out_of_range="ppm")
    chex.assert_trees_all_close(counts, jnp.array([1, 0, 0, 0, 1, 0, 0, 0, 0, 1.0]))
    np.testing.assert_allclose(float(metrics.qice_from_counts(counts, 6.0)), 0.09, rtol=1e-6)
    chex.assert_trees_all_close(metrics.qice_bin_counts(QICE_SAMPLES, QICE_TARGET), counts)  # default


def test_qice_counts_card_convention():
    # -1 and 0 join bin 1, 20 joins bin 10: counts (3, 0, 0, 0, 1, 0, 0, 0, 0, 2) of 6;
    # QICE = (|1/2 - 1/10| + |1/6 - 1/10| + |1/3 - 1/10| + 7/10) / 10 = (0.4 + 1/15 + 7/30 + 0.7) / 10
    # = 0.14.
    counts = metrics.qice_bin_counts(QICE_SAMPLES, QICE_TARGET, out_of_range="card")
    chex.assert_trees_all_close(counts, jnp.array([3, 0, 0, 0, 1, 0, 0, 0, 0, 2.0]))
    np.testing.assert_allclose(float(metrics.qice_from_counts(counts, 6.0)), 0.14, rtol=1e-6)
    sums = metrics.metric_sums(QICE_SAMPLES, QICE_TARGET, out_of_range="card")
    chex.assert_trees_all_close(sums["qice_counts"], counts)
    np.testing.assert_allclose(metrics.evaluate(QICE_SAMPLES, QICE_TARGET, out_of_range="card")["qice"],
                               0.14, rtol=1e-6)
    with pytest.raises(ValueError, match="out_of_range must be one of"):
        metrics.qice_bin_counts(QICE_SAMPLES, QICE_TARGET, out_of_range="CARD")


def test_metrics_reject_bad_shapes():
    with pytest.raises(ValueError, match="samples"):
        metrics.metric_sums(jnp.zeros((2, 3, 4, 1)), jnp.zeros((2, 5, 1)))


def test_kde_nll_closed_form_and_limits():
    # One sample at distance d: log p = log phi(d/h) - log h.
    samples = jnp.full((1, 1, 1, 1), 0.4)
    target = jnp.zeros((1, 1, 1))
    h = 0.3
    expected = -(stats.norm.logpdf(0.4 / h) - math.log(h))
    np.testing.assert_allclose(float(losses.kde_nll(samples, target, h)), expected, rtol=1e-6)
    # Many samples from N(0, 1): the KDE is N(0, 1 + h^2) in the limit.
    z = jnp.asarray(stats.norm.ppf((np.arange(5000) + 0.5) / 5000), jnp.float32)[None, :, None, None]
    y = jnp.full((1, 1, 1), 0.8)
    np.testing.assert_allclose(float(jax.jit(losses.kde_nll, static_argnums=2)(z, y, h)),
                               -stats.norm.logpdf(0.8, scale=math.sqrt(1 + h * h)), rtol=1e-3)
    # Far-away targets are clamped at -25 per window (finite loss, zero gradient).
    far = jnp.full((2, 1, 1), 1e3)
    value, g = jax.jit(jax.value_and_grad(lambda s: losses.kde_nll(s, far, h)))(samples.repeat(2, 0))
    assert float(value) == pytest.approx(25.0)
    chex.assert_trees_all_close(g, jnp.zeros_like(g))


def test_hybrid_loss_combines_terms():
    samples, target = _case(4)
    loss, aux = losses.hybrid_loss(jnp.asarray(samples), jnp.asarray(target), 0.1, 0.3)
    np.testing.assert_allclose(float(loss), 0.1 * float(aux["kde_nll"]) + float(aux["mse"]), rtol=1e-6)
    np.testing.assert_allclose(float(aux["mse"]), ((samples.mean(1) - target) ** 2).mean(), rtol=1e-5)
    with pytest.raises(ValueError, match="bandwidth"):
        losses.hybrid_loss(jnp.asarray(samples), jnp.asarray(target), 0.1, 0.0)


def test_gaussian_nll_matches_scipy():
    rng = np.random.default_rng(5)
    m, s, y = rng.normal(size=(3, 2, 4, 1)), rng.uniform(0.2, 2, size=(3, 2, 4, 1)), rng.normal(
        size=(3, 2, 4, 1))
    np.testing.assert_allclose(float(losses.gaussian_nll(jnp.asarray(m), jnp.asarray(s), jnp.asarray(y))),
                               -stats.norm.logpdf(y, m, s).mean(), rtol=1e-5)


def test_sorted_quantiles_match_numpy():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 3, 13)).astype(np.float32)
    levels = [0.0, 0.05, 0.25, 0.5, 0.9, 1.0]
    ours = metrics._quantiles_sorted(jnp.sort(jnp.asarray(x), -1), levels)
    np.testing.assert_allclose(np.asarray(ours), np.moveaxis(np.quantile(x, levels, axis=-1), 0, -1),
                               rtol=1e-5, atol=1e-6)


def test_gaussian_nll_clamps_degenerate_windows():
    mean = jnp.zeros((2, 3, 1))
    std = jnp.stack([jnp.full((3, 1), 1e-6), jnp.ones((3, 1))])   # window 0: collapsed scale
    target = jnp.ones((2, 3, 1))
    value = float(jax.jit(losses.gaussian_nll)(mean, std, target))
    np.testing.assert_allclose(value, 0.5 * (25.0 - stats.norm.logpdf(1.0)), rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# Bad values, empty batches and properties over wide magnitudes.

VALUE_SUMS = ("crps", "crps_plain", "crps_sum", "sum_abs", "se", "ae", "covered_50", "covered_90")


@pytest.mark.parametrize("where,value", [("target", np.nan), ("samples", np.nan),
                                         ("samples", np.inf), ("target", -np.inf)])
def test_non_finite_input_makes_every_dependent_metric_nan(where, value):
    samples, target = _case(8)
    if where == "target":
        target[1, 2, 0] = value
    else:
        samples[1, 4, 2, 0] = value
    sums = metrics.metric_sums(jnp.asarray(samples), jnp.asarray(target))
    for k in VALUE_SUMS:
        assert np.isnan(float(sums[k])), k
    assert np.all(np.isnan(np.asarray(sums["qice_counts"])))
    assert float(sums["points"]) == target.size and float(sums["sum_points"]) == 3 * 5
    final = metrics.finalize_metrics(sums)
    assert all(np.isnan(v) for v in final.values()), final
    # Per point, only the bad point's CRPS is NaN.
    crps = np.asarray(metrics.crps_ensemble(jnp.asarray(samples), jnp.asarray(target), axis=1))
    bad = np.zeros(target.shape, bool)
    bad[1, 2, 0] = True
    assert np.all(np.isnan(crps[bad])) and np.all(np.isfinite(crps[~bad]))
    # The host entry point refuses before computing, naming the array and the index.
    with pytest.raises(ValueError, match=rf"{where} has 1 NaN or infinite value\(s\), the first at "
                                         rf"index \(1, {'2' if where == 'target' else '4, 2'}, 0\)"):
        metrics.evaluate(jnp.asarray(samples), jnp.asarray(target))


@pytest.mark.parametrize("shape", [(0, 4, 3, 2), (2, 0, 3, 2), (2, 4, 0, 2), (2, 4, 3, 0)])
def test_empty_batch_is_rejected(shape):
    samples = jnp.zeros(shape)
    target = jnp.zeros(shape[:1] + shape[2:])
    with pytest.raises(ValueError, match="empty batch"):
        metrics.metric_sums(samples, target)
    with pytest.raises(ValueError, match="empty batch"):
        metrics.evaluate(samples, target)
    with pytest.raises(ValueError, match="empty batch"):
        metrics.qice_bin_counts(samples, target)


def test_crps_accurate_far_from_zero():
    # N(1e6, 1) ensembles in float32: the form E|X - y| - 1/2 E|X - X'| lost ~5% here (its spread
    # term is a difference of numbers of size 1e6); the quantile form is exact to float32 rounding.
    rng = np.random.default_rng(0)
    s = (1e6 + rng.normal(size=(50, 100))).astype(np.float32)
    y = (1e6 + rng.normal(size=50)).astype(np.float32)
    ref = properscoring.crps_ensemble(y.astype(np.float64), s.astype(np.float64))
    ours = np.asarray(metrics.crps_ensemble(jnp.asarray(s), jnp.asarray(y), fair=False))
    np.testing.assert_allclose(ours, ref, rtol=100 * np.finfo(np.float32).eps)
    # The fair form has the same structure (non-negative terms); the reference subtracts exact
    # float64 differences of the float32 samples.
    fair = np.asarray(metrics.crps_ensemble(jnp.asarray(s), jnp.asarray(y)))
    np.testing.assert_allclose(fair, _fair_crps_ref(s, y), rtol=100 * np.finfo(np.float32).eps)


S_P, P_P = 16, 12   # fixed shapes for the property tests (no recompilation per example)


@st.composite
def ensembles(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    loc = draw(st.sampled_from([-1.0, 1.0])) * 10.0 ** draw(st.floats(-8.0, 8.0))
    scale = 10.0 ** draw(st.floats(-8.0, 8.0))
    offset = draw(st.floats(-5.0, 5.0))   # target position in units of the spread
    heavy = draw(st.booleans())
    rng = np.random.default_rng(seed)
    z = rng.standard_cauchy(size=(P_P, S_P)) if heavy else rng.normal(size=(P_P, S_P))
    samples = (loc + scale * z).astype(np.float32)
    target = (loc + scale * (offset + rng.normal(size=P_P))).astype(np.float32)
    return samples, target


@settings(max_examples=examples(60), deadline=None)
@given(ensembles())
def test_crps_nonnegative_and_equals_properscoring(case):
    samples, target = case
    eps = np.finfo(np.float32).eps
    ours = np.asarray(metrics.crps_ensemble(jnp.asarray(samples), jnp.asarray(target), fair=False))
    ref = properscoring.crps_ensemble(target.astype(np.float64), samples.astype(np.float64))
    assert np.all(ours >= 0)
    # A sum of S non-negative float32 terms: relative error below a few S float32 epsilons.
    np.testing.assert_allclose(ours, ref, rtol=4 * S_P * eps, atol=0)
    # Fair: also a sum of non-negative terms, so the same relative bound holds against the
    # definition, whose float64 cancellation is at most ~1e-15 of the plain value.
    fair = np.asarray(metrics.crps_ensemble(jnp.asarray(samples), jnp.asarray(target)))
    assert np.all(fair >= 0) and np.all(fair <= ours * (1 + 4 * S_P * eps))   # fair <= plain
    fair_ref = _fair_crps_ref(samples, target)
    assert np.all(np.abs(fair - fair_ref) <= 4 * S_P * eps * fair_ref + 1e-13 * ref)


@settings(max_examples=examples(40), deadline=None)
@given(ensembles(), st.sampled_from(metrics.OUT_OF_RANGE))
def test_qice_bounds_and_counts(case, out_of_range):
    samples, target = case
    s4, t3 = jnp.asarray(samples.T[None, :, :, None]), jnp.asarray(target[None, :, None])
    counts = np.asarray(metrics.qice_bin_counts(s4, t3, metrics.QICE_BINS, out_of_range))
    m = metrics.QICE_BINS
    assert np.all(counts >= 0) and np.all(counts == np.round(counts))
    if out_of_range == "card":
        assert counts.sum() == P_P
    else:
        assert counts.sum() <= P_P
    qice = float(metrics.qice_from_counts(jnp.asarray(counts), float(P_P)))
    assert 0.0 <= qice <= max(1.0 / m, 2.0 * (m - 1) / m**2) + 1e-6


@settings(max_examples=examples(30), deadline=None)
@given(ensembles())
def test_finite_input_gives_finite_metrics(case):
    samples, target = case
    if np.max(np.abs(np.concatenate([samples.ravel(), target]))) > 1e15:
        samples, target = samples * np.float32(1e-3), target * np.float32(1e-3)  # keep MSE < 1e38
    s4, t3 = jnp.asarray(samples.T[None, :, :, None]), jnp.asarray(target[None, :, None])
    m = metrics.evaluate(s4, t3)
    assert all(np.isfinite(v) for v in m.values()), m
    assert 0.0 <= m["coverage_50"] <= m["coverage_90"] <= 1.0
    assert m["crps"] >= 0 and m["mse"] >= 0 and m["mae"] >= 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -0.1])
def test_non_finite_hyperparameters_are_rejected(bad):
    samples, target = _case(9)
    with pytest.raises(ValueError, match="bandwidth must be positive and finite"):
        losses.hybrid_loss(jnp.asarray(samples), jnp.asarray(target), 0.1, bad)
    if bad != 0.0:
        with pytest.raises(ValueError, match="tau must be finite and >= 0"):
            losses.hybrid_loss(jnp.asarray(samples), jnp.asarray(target), bad, 0.3)
