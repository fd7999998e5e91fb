"""Metrics and losses of algorithms.forecasting against closed forms and properscoring."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import properscoring
import pytest
from scipy import stats

from algorithms.forecasting import losses, metrics


def _case(seed, b=3, s=17, h=5, n=2):
    rng = np.random.default_rng(seed)
    samples = rng.normal(size=(b, s, h, n)).astype(np.float32) * rng.uniform(0.5, 2.0)
    target = rng.normal(size=(b, h, n)).astype(np.float32) + rng.normal()
    return samples, target


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_crps_matches_properscoring(seed):
    samples, target = _case(seed)
    ours = metrics.crps_ensemble(jnp.asarray(samples), jnp.asarray(target), axis=1)
    ref = properscoring.crps_ensemble(target, np.moveaxis(samples, 1, -1))
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=2e-5, atol=2e-6)


def test_crps_closed_forms():
    # One sample: CRPS = |x - y|. Gaussian ensemble: approaches the closed form of Gneiting & Raftery.
    x = jnp.array([[1.5]]), jnp.array([-0.5])
    np.testing.assert_allclose(metrics.crps_ensemble(x[0], x[1]), [2.0], rtol=1e-6)
    z = jnp.asarray(stats.norm.ppf((np.arange(4000) + 0.5) / 4000), jnp.float32)
    y = 0.7
    closed = y * (2 * stats.norm.cdf(y) - 1) + 2 * stats.norm.pdf(y) - 1 / math.sqrt(math.pi)
    np.testing.assert_allclose(float(metrics.crps_ensemble(z, jnp.float32(y))), closed, rtol=2e-3)


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
    ref_sum = properscoring.crps_ensemble(target.sum(-1), np.moveaxis(samples.sum(-1), 1, -1)).mean()
    np.testing.assert_allclose(one["crps_sum"], ref_sum, rtol=2e-5)
    mean = samples.mean(1)
    np.testing.assert_allclose(one["mse"], ((mean - target) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(one["mae"], np.abs(mean - target).mean(), rtol=1e-5)
    # Univariate: CRPS-sum is CRPS.
    uni = metrics.evaluate(jnp.asarray(samples[..., :1]), jnp.asarray(target[..., :1]))
    np.testing.assert_allclose(uni["crps_sum"], uni["crps"], rtol=1e-6)


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


def test_qice_counts_reference_convention():
    # Samples 0..10 -> deciles at the integers. Targets: 0.5 (bin 1), 9.5 (bin 10), 20 (outside,
    # in no bin), -1 (outside), 5.0 (exactly on a quantile: strict '>' puts it in bin 5).
    samples = jnp.broadcast_to(jnp.arange(11.0)[None, :, None, None], (5, 11, 1, 1))
    target = jnp.array([0.5, 9.5, 20.0, -1.0, 5.0])[:, None, None]
    counts = metrics.qice_bin_counts(samples, target)
    chex.assert_trees_all_close(counts, jnp.array([1, 0, 0, 0, 1, 0, 0, 0, 0, 1.0]))
    expected = np.mean(np.abs(np.asarray(counts) / 5 - 0.1))
    np.testing.assert_allclose(float(metrics.qice_from_counts(counts, 5.0)), expected, rtol=1e-6)


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
