"""When the paper's statements can hold: the cost condition for "no equilibrium at Delta = 0", and
qualities closer than float32 resolves."""

import itertools

import numpy as np
import pytest

import algorithms.benchmark_game as bg

ADD = bg.AdditiveSaturating(amplitude=1.0, rate=1.0)
EFFORTS = np.linspace(0.0, 5.0, 41)
THETA = (1.0, 0.8, 0.6)


def test_zero_effort_margin_closed_form_two_providers():
    # Margin = 1 - kappa * e_10(0), e_10(0) = -log(1 - g / A) / rate (just overtaking at Delta = 0).
    for kappa, g in ((0.25, 0.2), (5.0, 0.2), (1.0, 0.5)):
        want = 1.0 - kappa * -np.log(1.0 - g)
        got = bg.zero_effort_margin(ADD, bg.PowerCost(kappa, 1.0), (1.0, 1.0 - g), bg.winner_take_all(2))
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("kappa, cheap", [(0.25, True), (5.0, False)])
def test_no_equilibrium_at_zero_only_when_effort_is_cheap(kappa, cheap):
    cost = bg.PowerCost(kappa, 1.0)
    rewards = bg.winner_take_all(3)
    margin = bg.zero_effort_margin(ADD, cost, THETA, rewards)
    delta_star = bg.delta_star_closed_form(ADD, cost, THETA, rewards)
    assert (margin > 0) == cheap and (delta_star > 0) == cheap
    eq = bg.pure_equilibria(ADD, bg.make_contest(THETA, EFFORTS, rewards, cost), 0.0)
    if cheap:  # the paper's statement: no pure equilibrium at Delta = 0
        assert int(eq.count) == 0
    else:  # effort too dear: zero effort, ranked by quality, is the only equilibrium already
        assert int(eq.count) == 1 and bool(eq.zero_effort_unique)


def _brute_force_count_float64(theta, delta, kappa):
    """Pure equilibria of the two-provider winner-take-all game, scores and payoffs in float64."""
    v = np.asarray(theta)[:, None] + 1.0 - np.exp(-(delta + EFFORTS101[None, :]))
    cost = kappa * EFFORTS101
    m = len(EFFORTS101)
    u = np.zeros((2, m, m))
    for a, b in itertools.product(range(m), range(m)):
        first_wins = v[0, a] >= v[1, b]  # ties go to the better model
        u[0, a, b] = float(first_wins) - cost[a]
        u[1, a, b] = float(not first_wins) - cost[b]
    best0 = u[0] >= u[0].max(axis=0, keepdims=True) - 1e-12
    best1 = u[1] >= u[1].max(axis=1, keepdims=True) - 1e-12
    return int(np.sum(best0 & best1))


EFFORTS101 = np.linspace(0.0, 5.0, 101)


@pytest.mark.parametrize("delta", [16.5, 17.5, 18.3, 18.5])
def test_qualities_closer_than_float32_resolution_are_not_tied(delta):
    # 1 and 1 - 1e-8 are one float32 number. With float32 observed scores (about 2) the lower model's
    # remaining headroom fell below their resolution from Delta ~ 16.25 on, and the game had a
    # spurious zero-effort equilibrium there, below the continuum threshold 18.40.
    theta, kappa = (1.0, 1.0 - 1e-8), 0.25
    contest = bg.make_contest(theta, EFFORTS101, bg.winner_take_all(2), bg.PowerCost(kappa, 1.0))
    eq = bg.pure_equilibria(ADD, contest, delta)
    assert int(eq.count) == _brute_force_count_float64(theta, delta, kappa)
    closed = bg.delta_star_closed_form(ADD, bg.PowerCost(kappa, 1.0), theta, bg.winner_take_all(2))
    gap = theta[0] - theta[1]  # 1e-8 up to the float64 rounding of 1 - 1e-8
    np.testing.assert_allclose(closed, np.log((1 - np.exp(-4.0)) / gap), rtol=1e-12)
    assert bool(eq.zero_effort_unique) == (delta > closed)


def test_threshold_of_nearly_equal_qualities_matches_closed_form():
    theta, cost = (1.0, 1.0 - 1e-8), bg.PowerCost(0.25, 1.0)
    contest = bg.make_contest(theta, EFFORTS101, bg.winner_take_all(2), cost)
    closed = bg.delta_star_closed_form(ADD, cost, theta, bg.winner_take_all(2))
    numeric = bg.refine_delta_star(ADD, contest, 17.0, 20.0, 30)
    # On a grid the numeric threshold is at or below the continuum one, by at most one effort step
    # over the slope de/dDelta = e^{c^-1(R)} - 1 (docs/benchmark_game.md).
    assert closed - (EFFORTS101[1] / (np.exp(4.0) - 1)) - 1e-4 <= numeric <= closed + 1e-4


def test_ranking_scores_order_like_observed_scores():
    contest = bg.make_contest((1.0, 0.9, 0.5, 0.2), EFFORTS, bg.linear_rewards(4), bg.PowerCost(0.3, 1))
    for score in (ADD, bg.LogitLogSteps(0.5)):
        for delta in (0.0, 0.7, 3.0):
            obs = np.asarray(bg.observed_scores(score, contest, delta), np.float64).ravel()
            rel = np.asarray(bg.ranking_scores(score, contest, delta), np.float64).ravel()
            gap = np.abs(obs[:, None] - obs[None, :]) > 1e-5  # pairs float32 tells apart
            assert np.all(np.sign(obs[:, None] - obs[None, :])[gap] == np.sign(rel[:, None] - rel[None, :])[gap])


def test_unresolvable_qualities_are_refused():
    # 1 and 1 - 1e-8 at distance 1 from the best: float32 scores relative to the best cannot split them.
    with pytest.raises(ValueError, match=r"theta\[1\]=1.0 and theta\[2\]=0.99999999 .*float32"):
        bg.make_contest((2.0, 1.0, 1.0 - 1e-8), EFFORTS, bg.winner_take_all(3), bg.PowerCost(0.25, 1))
    bg.make_contest((2.0, 1.0, 1.0), EFFORTS, bg.winner_take_all(3), bg.PowerCost(0.25, 1),
                    allow_tied_theta=True)  # exact ties stay allowed
