"""Two-player mixed equilibria (support and vertex enumeration) against nashpy and closed forms;
strict dominance; scale invariance.

The reference set of a game is every candidate that nashpy's support enumeration or vertex
enumeration returns and that passes the float64 regret check: nashpy's two algorithms each miss
equilibria on degenerate games (and can differ between processors in the last bits), so neither
list alone is the truth.
"""

import warnings

import jax
import jax.numpy as jnp
import nashpy
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import algorithms.benchmark_game as bg
from algorithms.benchmark_game import mixed
from tests.hypothesis_budget import examples


def as_set(pairs, decimals=4):
    return {tuple(np.round(np.concatenate([x, y]), decimals) + 0.0) for x, y in pairs}


def nashpy_support(A, B):
    return list(nashpy.Game(A, B).support_enumeration(non_degenerate=True))


def verified_reference(A, B):
    """Candidates from both of nashpy's exact algorithms that are equilibria by their float64 regrets
    (each regret at most 1e-9 of the player's payoff range)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nashpy's note on degenerate games
        game = nashpy.Game(A, B)
        cands = list(game.support_enumeration()) + list(game.vertex_enumeration())
    out = []
    for x, y in cands:
        x, y = np.clip(x, 0, None), np.clip(y, 0, None)
        ra = np.max(A @ y) - x @ A @ y
        rb = np.max(x @ B) - x @ B @ y
        if ra <= 1e-9 * np.ptp(A) and rb <= 1e-9 * np.ptp(B):
            out.append((x, y))
    return out


def assert_all_equilibria(A, B, eqs):
    for x, y in eqs:
        np.testing.assert_allclose([x.sum(), y.sum()], 1.0, atol=1e-12)
        assert (x >= 0).all() and (y >= 0).all()
        ra, rb = mixed.regrets(A, B, x, y)
        assert ra <= 1e-9 * np.ptp(A) and rb <= 1e-9 * np.ptp(B)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_games_match_nashpy(size, seed):
    rng = np.random.default_rng(100 * size + seed)
    A = rng.normal(size=(size, size)).round(3)
    B = rng.normal(size=(size, size)).round(3)
    ours = bg.distinct(bg.support_enumeration(A, B))
    assert len(ours) >= 1  # a finite game has an equilibrium (Nash 1951); generic ones an odd number
    assert len(ours) % 2 == 1
    assert as_set(ours) == as_set(nashpy_support(A, B))
    assert as_set(bg.nash_equilibria(A, B)) == as_set(verified_reference(A, B))
    assert_all_equilibria(A, B, ours)


def test_matching_pennies_and_battle_of_sexes():
    A = np.array([[1.0, -1.0], [-1.0, 1.0]])
    (x, y), = bg.nash_equilibria(A, -A)
    np.testing.assert_allclose(x, [0.5, 0.5], atol=1e-12)
    np.testing.assert_allclose(y, [0.5, 0.5], atol=1e-12)
    A = np.array([[3.0, 0.0], [0.0, 2.0]])
    B = np.array([[2.0, 0.0], [0.0, 3.0]])
    # Two pure equilibria and the mixed one: row plays (3/5, 2/5), column (2/5, 3/5).
    want = as_set([(np.array([1.0, 0.0]), np.array([1.0, 0.0])),
                   (np.array([0.0, 1.0]), np.array([0.0, 1.0])),
                   (np.array([0.6, 0.4]), np.array([0.4, 0.6]))])
    assert as_set(bg.distinct(bg.support_enumeration(A, B))) == want
    assert as_set(bg.vertex_enumeration(A, B)) == want
    assert as_set(bg.nash_equilibria(A, B)) == want


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0, 100.0, 1e6])
def test_zero_sum_equilibrium_does_not_depend_on_payoff_scale(scale):
    # A = [[3, -1], [-1, 1]]: the row player mixes (1/3, 2/3) so that the column player is
    # indifferent (3p - (1 - p) = -p + (1 - p) -> p = 1/3), and the column player likewise.
    A = scale * np.array([[3.0, -1.0], [-1.0, 1.0]])
    for eqs in (bg.distinct(bg.support_enumeration(A, -A)), bg.vertex_enumeration(A, -A),
                bg.nash_equilibria(A, -A)):
        (x, y), = eqs
        np.testing.assert_allclose(x, [1 / 3, 2 / 3], atol=1e-12)
        np.testing.assert_allclose(y, [1 / 3, 2 / 3], atol=1e-12)


def test_contest_at_zero_has_only_a_mixed_equilibrium():
    # The hand-computed contest of test_benchmark_game_pure: no pure equilibrium at Delta = 0.
    c = bg.make_contest([1.0, 0.8], [0.0, 1.0, 2.0], bg.winner_take_all(2), bg.PowerCost(0.2, 1))
    A, B = bg.contest_bimatrix(bg.payoff_tensor(bg.observed_scores(bg.AdditiveSaturating(), c, 0.0),
                                                c.costs, c.rewards))
    A, B = np.asarray(A, np.float64), np.asarray(B, np.float64)
    ours = bg.nash_equilibria(A, B)
    assert as_set(ours) == as_set(verified_reference(A, B))
    assert len(ours) == 1
    x, y = ours[0]
    assert (x > 0).sum() > 1 and (y > 0).sum() > 1  # genuinely mixed
    # Indifference: the row player's payoff is constant on its support, and so is the column's.
    row_pay, col_pay = A @ y, x @ B
    np.testing.assert_allclose(row_pay[x > 0], row_pay[x > 0][0], atol=1e-12)
    np.testing.assert_allclose(col_pay[y > 0], col_pay[y > 0][0], atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_strictly_dominated_strategy_never_in_support(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(4, 4))
    B = rng.normal(size=(4, 4))
    A[2] = A[0] - rng.uniform(0.1, 1.0, 4)  # row 2 strictly dominated by row 0
    B[:, 1] = B[:, 3] - rng.uniform(0.1, 1.0, 4)  # column 1 strictly dominated by column 3
    dom_rows = np.asarray(bg.strictly_dominated(A))
    dom_cols = np.asarray(bg.strictly_dominated(B.T))
    assert dom_rows[2] and dom_cols[1]
    eqs = bg.nash_equilibria(A, B)
    assert len(eqs) >= 1
    assert as_set(eqs) == as_set(verified_reference(A, B))
    assert_all_equilibria(A, B, eqs)
    for x, y in eqs:
        assert np.all(x[dom_rows] == 0) and np.all(y[dom_cols] == 0)


def test_seed_2_game_has_three_equilibria():
    """The 4x4 game of ``default_rng(2)`` above: nashpy's support enumeration misses the mixed
    equilibrium (two of its column payoffs agree to 6e-6, which it reads as degeneracy) and a
    float32 enumeration missed the pure one (row 1, column 0) on some processors. All three hold."""
    rng = np.random.default_rng(2)
    A = rng.normal(size=(4, 4))
    B = rng.normal(size=(4, 4))
    A[2] = A[0] - rng.uniform(0.1, 1.0, 4)
    B[:, 1] = B[:, 3] - rng.uniform(0.1, 1.0, 4)
    # The mixed one on rows {1, 3} x columns {0, 2}, from the 2x2 indifference conditions:
    # the column mix q on column 0 makes rows 1 and 3 pay the same, the row mix p on row 1 makes
    # columns 0 and 2 pay the same.
    q = (A[3, 2] - A[1, 2]) / ((A[1, 0] - A[3, 0]) - (A[1, 2] - A[3, 2]))
    p = (B[3, 2] - B[3, 0]) / ((B[1, 0] - B[3, 0]) - (B[1, 2] - B[3, 2]))
    e = np.eye(4)
    want = [(e[1], e[0]), (e[3], e[2]),
            (p * e[1] + (1 - p) * e[3], q * e[0] + (1 - q) * e[2])]
    assert 0 < p < 1 and 0 < q < 1
    assert as_set(bg.nash_equilibria(A, B), decimals=9) == as_set(want, decimals=9)
    assert as_set(bg.vertex_enumeration(A, B), decimals=9) == as_set(want, decimals=9)


def test_degenerate_game_extreme_equilibria():
    # Column 1 duplicates column 0 for the column player and ties for the row player: the pure
    # profile (row 0, column 0) and (row 0, column 1) are both equilibria, with the whole segment
    # between them; support enumeration on equal supports finds the two pure ones only through
    # degenerate systems, vertex enumeration returns the segment's end points.
    A = np.array([[2.0, 2.0], [1.0, 0.0]])
    B = np.array([[1.0, 1.0], [0.0, 2.0]])
    e = np.eye(2)
    eqs = bg.nash_equilibria(A, B)
    assert as_set(eqs) == as_set([(e[0], e[0]), (e[0], e[1])])
    assert_all_equilibria(A, B, eqs)
    # every pure profile of a constant game is an equilibrium (extreme points of the continuum)
    assert len(bg.nash_equilibria(np.full((3, 2), 7.0), np.full((3, 2), -1.0))) == 6


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1),
       scale_a=st.floats(1e-4, 1e4), scale_b=st.floats(1e-4, 1e4),
       shift_a=st.floats(-1e3, 1e3), shift_b=st.floats(-1e3, 1e3))
def test_equilibria_invariant_to_positive_affine_payoff_maps(seed, scale_a, scale_b, shift_a,
                                                            shift_b):
    rng = np.random.default_rng(seed)
    A = rng.integers(-5, 6, size=(3, 3)).astype(np.float64)  # small integers: ties and degeneracy
    B = rng.integers(-5, 6, size=(3, 3)).astype(np.float64)
    base = bg.nash_equilibria(A, B)
    moved = bg.nash_equilibria(scale_a * A + shift_a, scale_b * B + shift_b)
    assert len(base) >= 1
    assert as_set(moved, decimals=6) == as_set(base, decimals=6)
    assert as_set(base) >= as_set(verified_reference(A, B))
    assert_all_equilibria(A, B, base)


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
    with pytest.raises(ValueError, match="too large"):
        bg.nash_equilibria(np.zeros((11, 11)), np.zeros((11, 11)))
    with pytest.raises(ValueError, match="finite"):
        bg.vertex_enumeration(np.array([[np.inf, 0.0], [0.0, 1.0]]), np.zeros((2, 2)))
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
