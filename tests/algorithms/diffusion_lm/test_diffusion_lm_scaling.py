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


# The tiny run's AR grid (nats per byte; sizes in parameters): the lowest loss is at the smallest
# size at every budget, so the grid does not bracket any optimum.
TINY_SIZES = np.array([14992.0, 26328.0, 41760.0, 80304.0])
TINY_AR = np.array([[3.1968, 3.3584, 3.3933, 3.7734],
                    [2.8154, 2.8950, 2.9302, 3.0621],
                    [2.5125, 2.6428, 2.6229, 2.7543]])


def test_fit_refuses_the_exponent_when_the_optimum_is_at_the_grid_edge():
    fit = scaling.fit_isoflop([1e10, 2e10, 4e10], TINY_SIZES, TINY_AR)
    assert fit.at_edge.all() and not fit.resolved
    assert np.isnan(fit.exponent) and np.isnan(fit.coef)
    # every budget's N* is pinned to the smallest size; the loss frontier is still fitted
    np.testing.assert_allclose(fit.n_opt, TINY_SIZES[0], rtol=1e-9)
    assert np.isfinite(fit.loss_exponent)


def test_one_unbracketed_budget_refuses_the_exponent():
    """Optima beyond the largest size at some budgets; a parabola whose vertex lies inside
    the grid does not rescue a budget whose lowest measured loss is at an edge."""
    losses = _grid()
    assert not scaling.fit_isoflop(BUDGETS, SIZES, losses).at_edge.any()
    # N*(C) = 1e-2 C^0.5 = 3.2e5 lies inside [1e5, 5.6e5] at the lowest budget only
    fit = scaling.fit_isoflop(BUDGETS, SIZES[:3], losses[:, :3])
    np.testing.assert_array_equal(fit.at_edge, [False, True, True, True])
    assert np.isnan(fit.exponent)
    log_n = np.log(SIZES[:4])
    edge_min = np.array([1.00, 1.02, 1.01, 1.30])  # lowest at the smallest size, vertex inside
    x_opt, _, _ = scaling.parabola_vertex(log_n, edge_min)
    assert log_n[0] < x_opt < log_n[-1]
    inside = (log_n - log_n[1]) ** 2 + 1.0
    fit = scaling.fit_isoflop(BUDGETS[:2], SIZES[:4], np.stack([inside, edge_min]))
    np.testing.assert_array_equal(fit.at_edge, [False, True])
    assert not fit.resolved and np.isnan(fit.exponent)
    # unsorted sizes: the edges are the smallest and largest sizes, not the first and last
    perm = np.array([2, 0, 3, 1])
    fit = scaling.fit_isoflop(BUDGETS[:2], SIZES[:4][perm], np.stack([inside, edge_min])[:, perm])
    np.testing.assert_array_equal(fit.at_edge, [False, True])


def test_unresolved_grid_makes_the_claim_not_resolved():
    from algorithms.diffusion_lm import grid
    from core import report
    from experiments.configs import diffusion_lm as cfg

    claim = report.Claim.from_config(cfg.get_config("tiny").claim)
    good = {"ratio": 0.9, "lo95": 0.85, "hi95": 0.95, "resolved": True}
    diffs = {k: {"lo": 0.1, "hi": 0.3, "resolved": True}
             for k in ("mdlm_minus_ar", "duo_minus_mdlm")}
    fits = {"mdlm": scaling.fit_isoflop(BUDGETS, SIZES, _grid()),
            "mdlm_ce": scaling.fit_isoflop([1e10, 2e10, 4e10], TINY_SIZES, TINY_AR)}
    assert fits["mdlm"].resolved and not fits["mdlm_ce"].resolved
    iso = {f: grid.isoflop_summary(fit, SIZES, np.ones(3), np.ones(3), np.ones(3))
           for f, fit in fits.items()}
    assert iso["mdlm"]["exponent"] == pytest.approx(fits["mdlm"].exponent)
    assert iso["mdlm_ce"]["exponent"] is None and iso["mdlm_ce"]["resolved"] == 0
    metrics = {"paired_diff_bpb": diffs, "ce_vs_nelbo_flops_ratio": good, "isoflop": iso}
    assert claim.verdict(metrics) == report.NOT_RESOLVED
    iso["mdlm_ce"] = iso["mdlm"]
    assert claim.verdict(metrics) == "yes"
