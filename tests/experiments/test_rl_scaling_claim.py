"""The rl_scaling claim's verdict follows the n* slope interval (no training: metrics by hand)."""

import pytest

from core import report
from experiments import rl_scaling
from experiments.configs import rl_scaling as rl_config


def _fit(b, ci=None):
    out = {"power": {"a": 0.0, "b": b}}
    if ci is not None:
        out["slope_ci"] = ci
    return out


@pytest.mark.parametrize("ci, expected", [((-0.02, 0.68), 0), ((0.05, 0.68), 1),
                                          ((-0.5, -0.01), 1), ((0.0, 0.0), 0)])
def test_n_star_slope_excludes_zero_only_when_the_interval_lies_on_one_side(ci, expected):
    s = rl_scaling.n_star_slope(_fit(0.33, ci))
    assert s == {"slope": 0.33, "lo": ci[0], "hi": ci[1], "excludes_zero": expected}


def test_n_star_slope_reads_its_point_on_the_bootstrapped_budgets():
    f = {**_fit(-0.1, (0.2, 0.6)), "slope_at_boot_budgets": 0.4}
    assert rl_scaling.n_star_slope(f) == {"slope": 0.4, "lo": 0.2, "hi": 0.6, "excludes_zero": 1}


def test_n_star_slope_without_a_bootstrap_does_not_resolve():
    assert rl_scaling.n_star_slope(_fit(0.33)) == {"slope": 0.33, "lo": None, "hi": None,
                                                   "excludes_zero": 0}


def test_objective_spread_is_max_minus_min_over_n():
    assert rl_scaling.objective_spread({"mean": [0.501, 0.497, 0.5, 0.4995]}) == pytest.approx(
        0.004)


def _metrics(hard_ci, easy_ci=(0.1, 0.5)):
    # n* grows on both splits by its point estimate (a slope of 0.33 and 0.3), the sigmoid wins
    return {"n_star_growth": {"easy": 2.0, "hard": 1.5}, "sigmoid_decisive": {"easy": 1},
            "n_star_slope": {"easy": rl_scaling.n_star_slope(_fit(0.3, easy_ci)),
                             "hard": rl_scaling.n_star_slope(_fit(0.33, hard_ci))}}


@pytest.mark.parametrize("hard_ci, verdict", [
    ((-0.02, 0.68), "not resolved at this size"),  # the tiny sweep's hard-split interval
    (None, "not resolved at this size"),  # no bootstrap: nothing shows the sweep decides
    ((0.1, 0.68), "yes"),
    # resolved, and hard n* shrinks: the growth check reads the interval, not the point estimate
    ((-0.6, -0.1), "partly"),
])
def test_claim_verdict_follows_the_hard_slope_interval(hard_ci, verdict):
    claim = report.Claim.from_config(rl_config.get_config("tiny").claim)
    assert claim.verdict(_metrics(hard_ci)) == verdict
