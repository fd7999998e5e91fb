"""Two-player mixed equilibria by support enumeration, checked against nashpy; strict dominance."""

import jax
import jax.numpy as jnp
import nashpy
import numpy as np
import pytest

import algorithms.benchmark_game as bg
from algorithms.benchmark_game import mixed


def as_set(pairs, decimals=4):
    return {tuple(np.round(np.concatenate([x, y]), decimals) + 0.0) for x, y in pairs}


def nashpy_equilibria(A, B):
    return list(nashpy.Game(A, B).support_enumeration(non_degenerate=True))


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_games_match_nashpy(size, seed):
    rng = np.random.default_rng(100 * size + seed)
    A = rng.normal(size=(size, size)).round(3)
    B = rng.normal(size=(size, size)).round(3)
    ours = bg.distinct(bg.support_enumeration(A, B))
    theirs = nashpy_equilibria(A, B)
    assert len(ours) >= 1  # a finite game has an equilibrium (Nash 1951); generic ones an odd number
    assert len(ours) % 2 == 1
    assert as_set(ours) == as_set(theirs)
    for x, y in ours:
        np.testing.assert_allclose([x.sum(), y.sum()], 1.0, atol=1e-5)
        assert (x >= 0).all() and (y >= 0).all()


def test_matching_pennies_and_battle_of_sexes():
    A = np.array([[1.0, -1.0], [-1.0, 1.0]])
    (x, y), = bg.distinct(bg.support_enumeration(A, -A))
    np.testing.assert_allclose(x, [0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(y, [0.5, 0.5], atol=1e-6)
    A = np.array([[3.0, 0.0], [0.0, 2.0]])
    B = np.array([[2.0, 0.0], [0.0, 3.0]])
    eqs = bg.distinct(bg.support_enumeration(A, B))
    # Two pure equilibria and the mixed one: row plays (3/5, 2/5), column (2/5, 3/5).
    assert as_set(eqs) == as_set([(np.array([1.0, 0.0]), np.array([1.0, 0.0])),
                                  (np.array([0.0, 1.0]), np.array([0.0, 1.0])),
                                  (np.array([0.6, 0.4]), np.array([0.4, 0.6]))])


def test_contest_at_zero_has_only_a_mixed_equilibrium():
    # The hand-computed contest of test_benchmark_game_pure: no pure equilibrium at Delta = 0.
    c = bg.make_contest([1.0, 0.8], [0.0, 1.0, 2.0], bg.winner_take_all(2), bg.PowerCost(0.2, 1))
    A, B = bg.contest_bimatrix(bg.payoff_tensor(bg.observed_scores(bg.AdditiveSaturating(), c, 0.0),
                                                c.costs, c.rewards))
    ours = bg.distinct(bg.support_enumeration(A, B))
    assert as_set(ours) == as_set(nashpy_equilibria(A, B))
    assert len(ours) == 1
    x, y = ours[0]
    assert (x > 0).sum() > 1 and (y > 0).sum() > 1  # genuinely mixed
    # Indifference: the row player's payoff is constant on its support, and so is the column's.
    row_pay, col_pay = A @ y, x @ B
    np.testing.assert_allclose(row_pay[x > 0], row_pay[x > 0][0], atol=1e-5)
    np.testing.assert_allclose(col_pay[y > 0], col_pay[y > 0][0], atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_strictly_dominated_strategy_never_in_support(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(4, 4))
    B = rng.normal(size=(4, 4))
    A[2] = A[0] - rng.uniform(0.1, 1.0, 4)  # row 2 strictly dominated by row 0
    B[:, 1] = B[:, 3] - rng.uniform(0.1, 1.0, 4)  # column 1 strictly dominated by column 3
    dom_rows = np.asarray(bg.strictly_dominated(A))
    dom_cols = np.asarray(bg.strictly_dominated(B.T))
    assert dom_rows[2] and dom_cols[1]
    eqs = bg.distinct(bg.support_enumeration(A, B))
    assert len(eqs) >= 1
    assert as_set(eqs) == as_set(nashpy_equilibria(A, B))
    for x, y in eqs:
        assert np.all(x[dom_rows] == 0) and np.all(y[dom_cols] == 0)


def test_support_pairs_count():
    rows, cols = bg.mixed.support_pairs(3, 4)
    # sum_k C(3, k) C(4, k) = C(7, 3) - 1 pairs of non-empty supports of equal size.
    assert rows.shape == (34, 3) and cols.shape == (34, 4)
    np.testing.assert_array_equal(rows.sum(1), cols.sum(1))


def test_bad_input_raises():
    with pytest.raises(ValueError, match="same shape"):
        bg.support_enumeration(np.zeros((2, 2)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="finite"):
        bg.support_enumeration(np.array([[np.nan, 0.0], [0.0, 1.0]]), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="too large"):
        bg.support_enumeration(np.zeros((11, 11)), np.zeros((11, 11)))
    with pytest.raises(ValueError, match="two-player"):
        bg.contest_bimatrix(np.zeros((3, 2, 2, 2)))


@pytest.mark.parametrize("k", [1, 2, 5, 11])
def test_solve_small_matches_numpy_and_flags_singular(k):
    rng = np.random.default_rng(k)
    M = rng.normal(size=(64, k, k)) + 3.0 * np.eye(k)  # well conditioned
    v = rng.normal(size=(64, k))
    got = np.asarray(jax.vmap(mixed.solve_small)(jnp.asarray(M, jnp.float32),
                                                 jnp.asarray(v, jnp.float32)))
    np.testing.assert_allclose(got, np.linalg.solve(M, v[..., None])[..., 0], rtol=2e-4, atol=2e-5)
    # a row permutation that needs pivoting (zero on the diagonal)
    P = np.eye(k)[::-1]
    got = np.asarray(mixed.solve_small(jnp.asarray(P @ M[0], jnp.float32),
                                       jnp.asarray(P @ v[0], jnp.float32)))
    np.testing.assert_allclose(got, np.linalg.solve(M[0], v[0]), rtol=2e-4, atol=2e-5)
    if k > 1:  # a singular system gives non-finite entries
        S = M[0].copy()
        S[-1] = 0.0
        assert not np.all(np.isfinite(np.asarray(mixed.solve_small(jnp.asarray(S, jnp.float32),
                                                                   jnp.ones(k)))))
