"""IsoFLOP fits recover known laws; the matched-compute ratio recovers a known factor."""

import numpy as np
import pytest

from algorithms.diffusion_lm import scaling

BUDGETS = np.array([1e15, 4e15, 1.6e16, 6.4e16])
SIZES = np.geomspace(1e5, 1e8, 9)


def _grid(a=0.5, n0=1e-2, big_a=20.0, b=0.08, curvature=0.05, shift=1.0):
    """Loss = A (shift C)^-b + k (log N - log N*(shift C))^2, with N*(C) = n0 C^a."""
    c = BUDGETS[:, None] * shift
    n_opt = n0 * c ** a
    return big_a * c ** (-b) + curvature * (np.log(SIZES)[None] - np.log(n_opt)) ** 2


def test_fit_recovers_exponents_and_optima():
    fit = scaling.fit_isoflop(BUDGETS, SIZES, _grid())
    np.testing.assert_allclose(fit.exponent, 0.5, rtol=1e-6)
    np.testing.assert_allclose(fit.coef, 1e-2, rtol=1e-4)
    np.testing.assert_allclose(fit.loss_exponent, 0.08, rtol=1e-6)
    np.testing.assert_allclose(fit.n_opt, 1e-2 * BUDGETS ** 0.5, rtol=1e-6)
    assert not fit.concave.any()
    np.testing.assert_allclose(fit.compute_for_loss(fit.loss_at(3e15)), 3e15, rtol=1e-9)


def test_matched_compute_ratio_recovers_a_known_factor():
    """Family 1 at C behaves as family 2 at 1.25 C: it needs 1/1.25 = 0.8x the FLOPs."""
    fit_2 = scaling.fit_isoflop(BUDGETS, SIZES, _grid())
    fit_1 = scaling.fit_isoflop(BUDGETS, SIZES, _grid(shift=1.25))
    np.testing.assert_allclose(scaling.matched_compute_ratio(fit_1, fit_2), 0.8, rtol=1e-6)
    boot = scaling.bootstrap_ratio(BUDGETS, SIZES, _grid(shift=1.25), np.full((4, 9), 1e-3),
                                   _grid(), np.full((4, 9), 1e-3), num_samples=200)
    assert boot["lo"] < 0.8 < boot["hi"]
    assert boot["hi"] - boot["lo"] < 0.2


def test_parabola_vertex_and_concave_fallback():
    x = np.log(np.array([1.0, 2.0, 4.0, 8.0]))
    x_opt, l_opt, concave = scaling.parabola_vertex(x, (x - np.log(3.0)) ** 2 + 1.0)
    np.testing.assert_allclose([np.exp(x_opt), l_opt], [3.0, 1.0], rtol=1e-9)
    assert not concave
    _, l_opt, concave = scaling.parabola_vertex(x, -((x - 1.0) ** 2))
    assert concave and l_opt == pytest.approx(-((x[3] - 1.0) ** 2))
    with pytest.raises(ValueError, match=">= 3"):
        scaling.parabola_vertex(x[:2], x[:2])
    with pytest.raises(ValueError, match="positive"):
        scaling.power_law(np.array([1.0, -2.0]), np.array([1.0, 2.0]))
