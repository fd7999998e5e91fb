"""Pure equilibria, best-response dynamics and the designer's threshold of the benchmark game."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms.benchmark_game as bg
from algorithms.benchmark_game.game import _first_true
from tests.hypothesis_budget import examples

ADD = bg.AdditiveSaturating(amplitude=1.0, rate=1.0)


def hand_contest():
    """theta = (1.0, 0.8), efforts {0, 1, 2}, cost 0.2 e, winner takes all (worked out below)."""
    return bg.make_contest([1.0, 0.8], [0.0, 1.0, 2.0], bg.winner_take_all(2), bg.PowerCost(0.2, 1))


def test_hand_case_has_no_pure_equilibrium_and_cycles():
    # Scores 1 + (1 - e^-e1) = 1, 1.632, 1.865 and 0.8 + (1 - e^-e2) = 0.8, 1.432, 1.665: the weaker
    # provider wins at (0, 1), (0, 2) and (1, 2) - it just overtakes - and loses elsewhere.
    c = hand_contest()
    u = bg.payoff_tensor(bg.observed_scores(ADD, c, 0.0), c.costs, c.rewards)
    want_1 = np.array([[1.0, 0.0, 0.0], [0.8, 0.8, -0.2], [0.6, 0.6, 0.6]])
    want_2 = np.array([[0.0, 0.8, 0.6], [0.0, -0.2, 0.6], [0.0, -0.2, -0.4]])
    np.testing.assert_allclose(u[0], want_1, atol=1e-6)
    np.testing.assert_allclose(u[1], want_2, atol=1e-6)
    eq = bg.pure_equilibria(ADD, c, 0.0)
    assert int(eq.count) == 0
    assert not bool(eq.zero_effort_unique)
    # Best responses: 1 matches 2's effort, 2 overtakes by one level (or gives up at e1 = 2):
    # (0,0) -> (0,1) -> (1,2) -> (2,0) -> (0,1): a cycle of 3 rounds.
    dyn = bg.best_response_dynamics(ADD, c, 0.0, jnp.zeros(2, jnp.int32))
    assert bool(dyn.cycled) and not bool(dyn.converged)
    assert int(dyn.cycle_length) == 3 and int(dyn.cycle_start) == 1
    np.testing.assert_array_equal(dyn.history[:5], [[0, 0], [0, 1], [1, 2], [2, 0], [0, 1]])
    np.testing.assert_allclose(bg.cycle_taus(ADD, c, 0.0, dyn), [-1.0, -1.0, 1.0])


def test_hand_case_above_threshold():
    # Overtaking is impossible once A e^-Delta <= 0.2, i.e. Delta >= log 5; with at most 2 units of
    # effort it already is once e^-Delta (1 - e^-2) <= 0.2, i.e. Delta >= log(5 (1 - e^-2)) = 1.464.
    c = hand_contest()
    below, above = np.log(5 * (1 - np.exp(-2.0))) - 1e-3, np.log(5 * (1 - np.exp(-2.0))) + 1e-3
    assert int(bg.pure_equilibria(ADD, c, below).count) == 0
    eq = bg.pure_equilibria(ADD, c, above)
    assert int(eq.count) == 1 and bool(eq.zero_effort_unique)
    np.testing.assert_array_equal(eq.profiles[0], [0, 0])
    np.testing.assert_array_equal(eq.ranks[0], [0, 1])
    dyn = bg.best_response_dynamics(ADD, c, above, jnp.array([2, 2], jnp.int32))
    assert bool(dyn.converged)
    np.testing.assert_array_equal(dyn.history[int(dyn.cycle_start)], [0, 0])


def brute_force(score, c, delta):
    """Payoffs and pure equilibria by explicit loops over profiles (the reference path)."""
    theta, eff = np.asarray(c.theta, np.float64), np.asarray(c.efforts, np.float64)
    costs, rewards = np.asarray(c.costs, np.float64), np.asarray(c.rewards, np.float64)
    n, m = len(theta), len(eff)
    s = np.asarray(score(jnp.asarray(theta[:, None], jnp.float32),
                         jnp.float32(delta) + jnp.asarray(eff[None, :], jnp.float32)))
    u = np.zeros((n,) + (m,) * n)
    for prof in itertools.product(range(m), repeat=n):
        for i in range(n):
            above = sum(1 for j in range(n) if j != i and (
                s[j, prof[j]] > s[i, prof[i]] or (s[j, prof[j]] == s[i, prof[i]] and j < i)))
            u[(i,) + prof] = rewards[above] - costs[prof[i]]
    ne = [prof for prof in itertools.product(range(m), repeat=n)
          if all(u[(i,) + prof] >= max(u[(i,) + prof[:i] + (k,) + prof[i + 1:]] for k in range(m))
                 - 1e-6 for i in range(n))]
    return u, ne


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_payoffs_and_equilibria_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    theta = np.sort(rng.uniform(0.0, 1.0, 3))[::-1]
    eff = np.concatenate([[0.0], np.sort(rng.uniform(0.1, 3.0, 3))])
    score = [ADD, bg.LogitLogSteps(0.7), bg.AdditiveSaturating(0.6, 2.0)][seed]
    rewards = bg.linear_rewards(3) if seed % 2 else np.array([1.0, 0.3, 0.0])
    c = bg.make_contest(theta, eff, rewards, bg.PowerCost(0.1 + 0.1 * seed, 1 + seed % 2))
    for delta in (0.0, 0.4):
        u_ref, ne_ref = brute_force(score, c, delta)
        u = bg.payoff_tensor(bg.observed_scores(score, c, delta), c.costs, c.rewards)
        np.testing.assert_allclose(u, u_ref, atol=1e-6)
        want = np.array(ne_ref).reshape(-1, 3)
        np.testing.assert_array_equal(np.argwhere(np.asarray(bg.pure_nash_mask(u))), want)
        eq = bg.pure_equilibria(score, c, delta)
        assert int(eq.count) == len(ne_ref)
        np.testing.assert_array_equal(eq.profiles[: len(ne_ref)], np.array(ne_ref).reshape(-1, 3))
        # Every best response computed without the tensor agrees with the tensor's argmax set.
        prof = jnp.asarray(rng.integers(0, 4, 3), jnp.int32)
        scores = bg.observed_scores(score, c, delta)
        for i in range(3):
            b = int(bg.best_response(scores, c.costs, c.rewards, prof, i))
            idx = tuple(slice(None) if k == i else int(prof[k]) for k in range(3))
            row = np.asarray(u[i][idx])
            assert row[b] == row.max()


def test_first_true_matches_argwhere():
    first = jax.jit(jax.vmap(lambda m: _first_true(m, 6)))
    rng = np.random.default_rng(0)
    for shape in [(5, 5), (4, 4, 4)]:
        masks = np.stack([rng.uniform(size=shape) < p for p in (0.0, 0.02, 0.1, 0.5)])
        got = np.asarray(first(jnp.asarray(masks)))
        for mask, g in zip(masks, got, strict=True):
            want = np.full((6, len(shape)), -1)
            hits = np.argwhere(mask)[:6]
            want[: len(hits)] = hits
            np.testing.assert_array_equal(g, want)


def test_kendall_tau_matches_scipy():
    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 8):
        ranks = np.stack([rng.permutation(n) for _ in range(4)])
        got = bg.kendall_tau_to_quality(jnp.asarray(ranks))
        want = [scipy.stats.kendalltau(np.arange(n), r).statistic for r in ranks]
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(bg.kendall_tau_to_quality(jnp.arange(4)), 1.0)
    np.testing.assert_allclose(bg.kendall_tau_to_quality(jnp.arange(4)[::-1]), -1.0)


def random_instance(rng, n, m):
    theta = np.sort(rng.uniform(0.0, 1.0, n))[::-1]
    theta -= np.arange(n) * 0.02  # gaps of at least 0.02
    e_max = 6.0
    eff = np.linspace(0.0, e_max, m)
    return theta, eff


@pytest.mark.parametrize("family", ["additive", "logit"])
def test_pure_equilibria_preserve_quality_order(family):
    rng = np.random.default_rng(7)
    for trial in range(6):
        n = 2 + trial % 2
        theta, eff = random_instance(rng, n, 7)
        score = (bg.AdditiveSaturating(float(rng.uniform(0.3, 1.5)), float(rng.uniform(0.5, 2.0)))
                 if family == "additive" else bg.LogitLogSteps(float(rng.uniform(0.3, 1.0))))
        rewards = bg.winner_take_all(n) if trial % 3 else bg.linear_rewards(n)
        c = bg.make_contest(theta, eff, rewards, bg.PowerCost(float(rng.uniform(0.05, 0.4)), 1 + trial % 2))
        for delta in (0.0, 0.5, 1.5):
            eq = bg.pure_equilibria(score, c, delta)
            k = min(int(eq.count), 16)
            np.testing.assert_array_equal(eq.taus[:k], 1.0)


CASES = [
    ("additive-wta-linear", ADD, "wta", bg.PowerCost(0.25, 1)),
    ("additive-linear-quadratic", bg.AdditiveSaturating(1.5, 0.8), "linear", bg.PowerCost(0.05, 2)),
    ("logit-wta-linear", bg.LogitLogSteps(0.5), "wta", bg.PowerCost(0.3, 1)),
    ("logit-linear-quadratic", bg.LogitLogSteps(0.8), "linear", bg.PowerCost(0.1, 2)),
]


@pytest.mark.parametrize("name,score,reward,cost", CASES, ids=[c[0] for c in CASES])
def test_threshold_numeric_matches_closed_form(name, score, reward, cost):
    theta = np.array([1.0, 0.8, 0.55])
    rewards = bg.winner_take_all(3) if reward == "wta" else bg.linear_rewards(3)
    e_r = float(cost.inverse(rewards[0] - rewards[-1]))
    # Fine effort grid reaching past the effort whose cost equals the largest reward gap.
    eff = np.linspace(0.0, 1.25 * e_r, 81)
    c = bg.make_contest(theta, eff, rewards, cost)
    closed = bg.delta_star_closed_form(score, cost, theta, rewards)
    assert 0.05 < closed < 15.0, closed
    deltas = jnp.linspace(0.0, 2.0 * closed, 41)  # fixed length: one compilation per family
    step = float(deltas[1] - deltas[0])
    sweep = bg.sweep_deltas(score, c, deltas)
    numeric = bg.delta_star_numeric(deltas, sweep.zero_effort_unique)
    assert abs(numeric - closed) <= step + 1e-6, (numeric, closed)
    # Above the threshold: exactly one equilibrium, zero effort, ranked by quality.
    above = np.asarray(deltas) >= numeric
    np.testing.assert_array_equal(sweep.count[above], 1)
    np.testing.assert_array_equal(sweep.mean_tau[above], 1.0)
    refined = bg.refine_delta_star(score, c, numeric - step, numeric, iters=20)
    assert abs(refined - closed) <= 0.02 * closed, (refined, closed)


def test_closed_form_additive_pair_formula():
    # One pair, winner takes all, linear cost k e: Delta* = log((A / g)(1 - exp(-rate / k))) / rate.
    score, cost = bg.AdditiveSaturating(2.0, 0.5), bg.PowerCost(0.4, 1)
    got = bg.delta_star_closed_form(score, cost, [1.0, 0.7], bg.winner_take_all(2))
    np.testing.assert_allclose(got, np.log((2.0 / 0.3) * (1 - np.exp(-0.5 / 0.4))) / 0.5, rtol=1e-12)
    # Never above the impossibility threshold log(A / g) / rate, and reaches it as effort gets free.
    assert got < score.impossibility_threshold(0.7, 1.0)
    cheap = bg.delta_star_closed_form(score, bg.PowerCost(1e-6, 1), [1.0, 0.7], bg.winner_take_all(2))
    np.testing.assert_allclose(cheap, score.impossibility_threshold(0.7, 1.0), rtol=1e-9)
    # Just overtaking at Delta*: e_jk(Delta*) costs exactly the reward gap.
    np.testing.assert_allclose(cost(score.overtake_effort(0.7, 1.0, got)), 1.0, rtol=1e-9)
    # Expensive effort: no threshold needed.
    assert bg.delta_star_closed_form(score, bg.PowerCost(50.0, 1), [1.0, 0.7], bg.winner_take_all(2)) == 0.0


def test_logit_overtake_effort_closed_form():
    score = bg.LogitLogSteps(0.6)
    e = score.overtake_effort(0.2, 0.5, 1.5)
    lhs = score(jnp.float32(0.2), jnp.float32(1.5 + e))
    rhs = score(jnp.float32(0.5), jnp.float32(1.5))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-6)


def test_tied_theta_when_allowed_goes_to_lower_index():
    c = bg.make_contest([1.0, 1.0], [0.0, 1.0], bg.winner_take_all(2), bg.PowerCost(2.0, 1),
                        allow_tied_theta=True)
    eq = bg.pure_equilibria(ADD, c, 0.0)
    assert int(eq.count) == 1
    np.testing.assert_array_equal(eq.profiles[0], [0, 0])
    np.testing.assert_array_equal(eq.ranks[0], [0, 1])


def test_designer_helpers():
    deltas = np.array([0.0, 0.5, 1.0, 1.5])
    assert bg.delta_star_numeric(deltas, [False, True, False, True]) == 1.5
    assert bg.delta_star_numeric(deltas, [True] * 4) == 0.0
    assert bg.delta_star_numeric(deltas, [True, True, True, False]) == float("inf")
    np.testing.assert_allclose(bg.designer_objective(deltas, [0.0, 0.0, 1.0, 1.0], 0.1),
                               [0.0, -0.05, 0.9, 0.85])
    c = hand_contest()
    sweep = bg.sweep_deltas(ADD, c, jnp.array([0.0, 2.0]))
    fid, source = bg.fidelity(ADD, c, [0.0, 2.0], sweep)
    assert source == ["br_cycle", "pure_ne"]
    np.testing.assert_allclose(fid, [-1.0 / 3.0, 1.0], atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(theta=[0.5, 1.0]), "sorted"),
    (dict(theta=[1.0, 1.0]), "tie"),
    (dict(theta=[1.0]), "at least 2"),
    (dict(theta=[1.0, np.nan]), "finite"),
    (dict(efforts=[]), "non-empty"),
    (dict(efforts=[0.5, 1.0]), "start at 0"),
    (dict(efforts=[0.0, 2.0, 1.0]), "strictly increasing"),
    (dict(rewards=[0.0, 1.0]), "non-increasing"),
    (dict(rewards=[1.0, 0.5, 0.0]), "one entry per rank"),
    (dict(cost=np.sqrt), "convex"),
    (dict(cost=lambda e: -e), "strictly increasing"),
    (dict(cost=[0.0, 1.0, 1.5]), "convex"),
])
def test_bad_input_raises(kwargs, match):
    args = dict(theta=[1.0, 0.5], efforts=[0.0, 1.0, 2.0], rewards=[1.0, 0.0], cost=bg.PowerCost(1.0, 1))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        bg.make_contest(args["theta"], args["efforts"], args["rewards"], args["cost"])


def test_bad_hyperparameters_raise():
    with pytest.raises(ValueError, match="convex"):
        bg.PowerCost(1.0, 0.5)
    with pytest.raises(ValueError, match="strictly increasing"):
        bg.PowerCost(0.0, 1.0)
    with pytest.raises(ValueError, match="concave"):
        bg.LogitLogSteps(1.5)
    with pytest.raises(ValueError, match="amplitude"):
        bg.AdditiveSaturating(-1.0, 1.0)
    with pytest.raises(ValueError, match="strictly decreasing"):
        bg.delta_star_closed_form(ADD, bg.PowerCost(1.0, 1), [1.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="strictly increasing"):
        bg.delta_star_numeric([1.0, 0.0], [True, True])


def test_outputs_have_documented_shapes_and_dtypes():
    c = bg.make_contest([1.0, 0.8, 0.5], np.linspace(0, 2, 4), bg.linear_rewards(3), bg.PowerCost(0.3, 2))
    eq = bg.pure_equilibria(ADD, c, 0.3)
    chex.assert_shape(eq.profiles, (16, 3))
    chex.assert_shape(eq.ranks, (16, 3))
    chex.assert_shape(eq.taus, (16,))
    chex.assert_type([eq.profiles, eq.ranks, eq.count], jnp.int32)
    u = bg.payoff_tensor(bg.observed_scores(ADD, c, 0.3), c.costs, c.rewards)
    chex.assert_shape(u, (3, 4, 4, 4))
    chex.assert_type(u, jnp.float32)


# ----------------------------------------------------------------------------------------------
# Bad values, exact ties and scale invariance.


def test_reward_helpers_one_rank_and_bad_n():
    np.testing.assert_array_equal(bg.linear_rewards(1), [1.0])
    np.testing.assert_array_equal(bg.winner_take_all(1), [1.0])
    np.testing.assert_allclose(bg.linear_rewards(5), [1.0, 0.75, 0.5, 0.25, 0.0])
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="linear_rewards: the number of ranks n"):
            bg.linear_rewards(bad)
        with pytest.raises(ValueError, match="winner_take_all: the number of ranks n"):
            bg.winner_take_all(bad)


@pytest.mark.parametrize("delta", [np.nan, np.inf, -np.inf, -0.5])
def test_non_finite_or_negative_delta_is_rejected(delta):
    c = hand_contest()
    with pytest.raises(ValueError, match="delta must be finite and >= 0"):
        bg.pure_equilibria(ADD, c, delta)
    with pytest.raises(ValueError, match="delta must be finite and >= 0"):
        bg.best_response_dynamics(ADD, c, delta, jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match=r"deltas\[1\]"):
        bg.sweep_deltas(ADD, c, jnp.array([0.0, delta, 1.0]))


def test_traced_bad_delta_gives_flagged_outputs():
    # Inside the caller's jit the check cannot run on the host: count -1, taus NaN, no zero-effort
    # claim; a good delta through the same traced path agrees with the eager call.
    c = hand_contest()
    eq_fn = jax.jit(lambda d: bg.pure_equilibria(ADD, c, d))
    dyn_fn = jax.jit(lambda d: bg.best_response_dynamics(ADD, c, d, jnp.zeros(2, jnp.int32)))
    for delta in (np.nan, np.inf, -1.0):
        eq = eq_fn(jnp.float32(delta))
        assert int(eq.count) == -1 and not bool(eq.zero_effort_unique)
        assert np.all(np.asarray(eq.profiles) == -1) and np.all(np.isnan(eq.taus))
        dyn = dyn_fn(jnp.float32(delta))
        assert not bool(dyn.converged) and not bool(dyn.cycled) and int(dyn.cycle_start) == -1
        assert np.all(np.asarray(dyn.history) == -1)
    good = eq_fn(jnp.float32(2.0))
    assert int(good.count) == 1 and bool(good.zero_effort_unique)


def test_mismatched_reward_and_cost_lengths_are_rejected():
    c = bg.make_contest([1.0, 0.8, 0.5], [0.0, 1.0], bg.linear_rewards(3), bg.PowerCost(0.3, 1))
    scores = bg.observed_scores(ADD, c, 0.0)
    with pytest.raises(ValueError, match=r"rewards has shape \(2,\) but scores has 3 players"):
        bg.payoff_tensor(scores, c.costs, c.rewards[:2])
    with pytest.raises(ValueError, match=r"costs has shape \(3,\) but scores has 2 effort levels"):
        bg.payoff_tensor(scores, jnp.zeros(3), c.rewards)
    with pytest.raises(ValueError, match=r"rewards has shape \(4,\)"):
        bg.best_response(scores, c.costs, jnp.zeros(4), jnp.zeros(3, jnp.int32), 0)
    with pytest.raises(ValueError, match="start must hold integer effort indices"):
        bg.best_response_dynamics(ADD, c, 0.0, jnp.array([0, 2, 0]))


TIE_THETA, TIE_EFFORTS = np.array([1.0, 0.9, 0.5]), np.array([0.0, 1.0, 2.0, 3.0])
TIE_REWARDS, TIE_COST = np.array([1.0, 0.3, 0.0]), bg.PowerCost(0.7, 1)


@pytest.mark.parametrize("scale", [1.0, 1.0 / 3.0, 0.007, 123.4])
def test_exact_payoff_ties_survive_any_scale(scale):
    # r_1 - c(1) = 1 - 0.7 = 0.3 = r_2 - c(0): equal payoffs in exact arithmetic that float32 rounds
    # apart (1 - f32(0.7) != f32(0.3)). The reference is the float64 brute force at scale 1.
    c1 = bg.make_contest(TIE_THETA, TIE_EFFORTS, TIE_REWARDS, TIE_COST)
    c = bg.make_contest(TIE_THETA, TIE_EFFORTS, scale * TIE_REWARDS, scale * TIE_COST(TIE_EFFORTS))
    for delta in (0.0, 0.3, 1.0):
        _, ne_ref = brute_force(ADD, c1, delta)
        eq = bg.pure_equilibria(ADD, c, delta)
        assert int(eq.count) == len(ne_ref), (delta, int(eq.count), ne_ref)
        np.testing.assert_array_equal(eq.profiles[: len(ne_ref)], np.array(ne_ref).reshape(-1, 3))
    assert len(brute_force(ADD, c1, 0.3)[1]) == 2  # the tie matters: two equilibria


N_P, M_P = 3, 5
_EFFORTS_P = np.linspace(0.0, 2.0, M_P)


@st.composite
def games(draw):
    gaps = draw(st.lists(st.floats(0.01, 0.5), min_size=N_P - 1, max_size=N_P - 1))
    theta = 1.0 - np.concatenate([[0.0], np.cumsum(gaps)])
    # Rewards and costs on a coarse grid, so that exact payoff ties are common.
    rewards = np.sort(draw(st.lists(st.integers(0, 4), min_size=N_P, max_size=N_P)))[::-1] / 4.0
    cost = bg.PowerCost(draw(st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.7])), draw(st.sampled_from([1, 2])))
    family = draw(st.sampled_from(["additive", "logit"]))
    score = (bg.AdditiveSaturating(draw(st.floats(0.2, 2.0)), draw(st.floats(0.3, 3.0)))
             if family == "additive" else bg.LogitLogSteps(draw(st.floats(0.2, 1.0))))
    delta = draw(st.sampled_from([0.0, 0.25, 1.0, 3.0]))
    return theta, rewards, cost, score, delta


@settings(max_examples=examples(40), deadline=None)
@given(games(), st.floats(-6.0, 6.0))
def test_pure_equilibria_invariant_to_positive_payoff_scale(game, log10_scale):
    theta, rewards, cost, score, delta = game
    a = 10.0 ** log10_scale
    base = bg.pure_equilibria(score, bg.make_contest(theta, _EFFORTS_P, rewards, cost), delta)
    scaled = bg.pure_equilibria(
        score, bg.make_contest(theta, _EFFORTS_P, a * rewards, a * cost(_EFFORTS_P)), delta)
    assert int(base.count) >= 0
    assert int(scaled.count) == int(base.count)
    np.testing.assert_array_equal(scaled.profiles, base.profiles)
    assert bool(scaled.zero_effort_unique) == bool(base.zero_effort_unique)


@settings(max_examples=examples(30), deadline=None)
@given(st.floats(-30.0, 30.0), st.floats(-6.0, 6.0), st.floats(-3.0, 3.0), st.floats(0.0, 5.0))
def test_finite_inputs_give_finite_outputs_over_wide_magnitudes(log10_pay, log10_theta, log10_amp,
                                                                 delta):
    pay, th, amp = 10.0 ** log10_pay, 10.0 ** log10_theta, 10.0 ** log10_amp
    theta = th * np.array([1.0, 0.5, 0.25])
    c = bg.make_contest(theta, _EFFORTS_P, pay * bg.linear_rewards(N_P), bg.PowerCost(pay, 2))
    score = bg.AdditiveSaturating(amp, 1.0)
    u = bg.payoff_tensor(bg.observed_scores(score, c, delta), c.costs, c.rewards)
    assert np.all(np.isfinite(np.asarray(u)))
    eq = bg.pure_equilibria(score, c, delta)
    k = int(eq.count)
    assert k >= 0
    assert np.all(np.isfinite(np.asarray(eq.taus)[: min(k, 16)]))
    dyn = bg.best_response_dynamics(score, c, delta, jnp.zeros(N_P, jnp.int32))
    assert int(dyn.rounds) >= 1 and np.all(np.asarray(dyn.history[: int(dyn.rounds) + 1]) >= 0)


def test_designer_helpers_reject_non_finite_input():
    cost = bg.PowerCost(1.0, 1)
    with pytest.raises(ValueError, match="finite, strictly decreasing theta"):
        bg.delta_star_closed_form(ADD, cost, [1.0, np.nan], [1.0, 0.0])
    with pytest.raises(ValueError, match="rewards must be finite"):
        bg.delta_star_closed_form(ADD, cost, [1.0, 0.5], [np.nan, 0.0])
    with pytest.raises(ValueError, match="finite, strictly increasing"):
        bg.delta_star_numeric([0.0, np.nan, 1.0], [True, True, True])
    with pytest.raises(ValueError, match="non-empty"):
        bg.delta_star_numeric([], [])
    with pytest.raises(ValueError, match="cost_per_unit must be finite"):
        bg.designer_objective([0.0, 1.0], [0.0, 1.0], np.nan)
    with pytest.raises(ValueError, match="finite 0 <= lo <= hi"):
        bg.refine_delta_star(ADD, hand_contest(), np.nan, 1.0)
