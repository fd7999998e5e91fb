"""Existence of the MLE, tie-parameter identifiability, rank conventions and property tests of the
judge-aware BTL fit (invariance to relabelling models and judges, agreement with choix)."""

import itertools

import choix
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from algorithms.ranking import btl, data, inference
from algorithms.ranking.data import LEFT, RIGHT, TIE
from tests.hypothesis_budget import examples

N, J = 4, 2
CELLS = [(i, j, k) for i, j in itertools.combinations(range(N), 2) for k in range(J)]


def _table(counts, n=N, nj=J, cells=None):
    """A table over every (pair, judge) cell (fixed shape: jitted code compiles once)."""
    cells = CELLS if cells is None else cells
    c = np.asarray(counts, np.float64).reshape(len(cells), 3)
    i, j, k = (np.asarray(x, np.int32) for x in zip(*cells))
    return data.ComparisonTable(i, j, k, c[:, 0], c[:, 1], c[:, 2], n, nj)


# --- existence of the MLE in bootstrap replicates -------------------------------------------------

def test_bootstrap_drops_replicates_whose_mle_is_at_infinity():
    # 10 comparisons among 4 models: many resamples lose a loss or a win of some model, and their
    # scores then run off (ranges up to ~100); all 400 used to be reported as converged.
    left = [0, 1, 2, 3, 0, 1, 2, 0, 1, 3]
    right = [1, 2, 3, 0, 2, 3, 0, 3, 0, 1]
    out = [LEFT, LEFT, LEFT, LEFT, LEFT, RIGHT, LEFT, RIGHT, LEFT, LEFT]
    table = data.aggregate(left, right, out)
    res = btl.fit(table, btl.FitConfig(judge_aware=False))
    with jax.enable_x64(True):
        draws, ok = inference.bootstrap(jax.random.key(0), table.astype(np.float64), res.params,
                                        res.config, num_samples=400)
        draws, ok = np.asarray(draws.scores), np.asarray(ok)
    spread = np.ptp(draws, axis=1)
    assert 0 < ok.sum() < ok.size
    assert np.all(~ok[spread > 8])  # every runaway replicate is dropped
    # Kept replicates have a finite MLE: 10 comparisons bound the score range (a pair at logit
    # difference d with one win each way has likelihood at most ~e^{-d}); it stays modest.
    assert spread[ok].max() < 5
    summary = inference.bootstrap_intervals(draws, ok)
    assert summary.num_used == ok.sum() and summary.num_dropped == ok.size - ok.sum()
    assert np.all(summary.lo <= summary.hi) and np.all(np.abs(summary.hi) < 5)


@settings(max_examples=examples(120), deadline=None)
@given(counts=st.lists(st.integers(0, 2), min_size=3 * len(CELLS), max_size=3 * len(CELLS)),
       tie_model=st.sampled_from(btl.TIE_MODELS), judge_aware=st.booleans(),
       ridge_scores=st.sampled_from([0.0, 1.0]), ridge_alpha=st.sampled_from([0.0, 1.0]))
def test_mle_exists_agrees_with_graph_checks(counts, tie_model, judge_aware, ridge_scores, ridge_alpha):
    # The traceable check of a resample agrees with the host-side check (scipy's strongly connected
    # components) on every table.
    table = _table(counts)
    assume(np.sum(counts) > 0)
    cfg = btl.FitConfig(judge_aware=judge_aware, tie_model=tie_model, ridge_scores=ridge_scores,
                        ridge_alpha=ridge_alpha)
    try:
        data.check_identifiable(table, judge_aware=judge_aware, ridge_scores=ridge_scores,
                                ridge_alpha=ridge_alpha, tie_model=tie_model)
        host = True
    except ValueError:
        host = False
    assert bool(jax.jit(btl.mle_exists)(table, cfg)) == host


# --- the tie parameter ----------------------------------------------------------------------------

@pytest.mark.parametrize("tie_model, name", [("davidson", "log nu"), ("rao_kupper", "log eta")])
@pytest.mark.parametrize("ridges", [{}, {"ridge_scores": 1.0, "ridge_alpha": 1.0}])
def test_ties_only_data_name_the_tie_parameter(tie_model, name, ridges):
    # Ties only: the scores are 0 and well defined; the tie parameter runs to +inf. With a ridge on the
    # scores this used to "converge" with tau ~ 1e14; without, the error blamed the scores.
    table = data.aggregate([0, 1, 2, 0], [1, 2, 0, 2], [TIE] * 4)
    with pytest.raises(ValueError, match=rf"every comparison is a tie: the tie parameter tau \({name}"):
        btl.fit(table, btl.FitConfig(tie_model=tie_model, **ridges))
    # No ties at all: tau runs to -inf.
    table = data.aggregate([0, 1, 2, 0], [1, 2, 0, 2], [LEFT, LEFT, LEFT, RIGHT])
    with pytest.raises(ValueError, match=r"no comparison is a tie: the tie parameter tau .* -inf"):
        btl.fit(table, btl.FitConfig(tie_model=tie_model, **ridges))
    btl.fit(table, btl.FitConfig(tie_model="half", judge_aware=False))  # no tie parameter: fine


def test_no_decisive_comparison_is_an_error():
    table = data.aggregate([0, 1, 2, 0], [1, 2, 0, 2], [TIE] * 4)
    for cfg in (btl.FitConfig(), btl.FitConfig(judge_aware=False, ridge_scores=1.0, ridge_alpha=1.0)):
        with pytest.raises(ValueError, match="no decisive comparison: all 4 comparisons are ties"):
            btl.fit(table, cfg)


# --- ranks and rank intervals ---------------------------------------------------------------------

@settings(max_examples=examples(40), deadline=None)
@given(scores=st.lists(st.integers(-3, 3), min_size=6, max_size=6))
def test_ranks_share_the_best_rank_on_ties(scores):
    s = np.asarray(scores, np.float64)
    want = scipy.stats.rankdata(-s, method="min")
    np.testing.assert_array_equal(np.asarray(inference.ranks(jnp.asarray(s, jnp.float32))), want)


@settings(max_examples=examples(25), deadline=None)
@given(scores=st.lists(st.integers(-2, 2), min_size=6, max_size=6),
       log_scale=st.floats(-4, 2), seed=st.integers(0, 2**16))
def test_point_rank_lies_in_its_interval(scores, log_scale, seed):
    # Near-equal scores with wide draws: the rank of the estimate need not be central in the draws'
    # rank distribution; the interval must still contain it.
    n = 6
    s = np.asarray(scores, np.float32) * np.float32(0.1)
    a = np.random.default_rng(seed).normal(size=(n, n))
    cov = np.zeros((n + 2, n + 2), np.float32)
    center = np.eye(n) - 1.0 / n
    cov[:n, :n] = np.exp(log_scale) * center @ (a @ a.T / n + np.eye(n)) @ center
    params = btl.Params(jnp.asarray(s - s.mean()), jnp.zeros(1), jnp.zeros(()))
    point, lo, hi = (np.asarray(x) for x in inference.rank_intervals(
        jax.random.key(seed), params, jnp.asarray(cov), 0.9, 256))
    assert np.all((lo <= point) & (point <= hi)), (point, lo, hi)
    np.testing.assert_array_equal(point, scipy.stats.rankdata(-(s - s.mean()), method="min"))
    assert np.all((1 <= lo) & (hi <= n))


def test_all_equal_scores_rank_one_inside_their_intervals():
    # An all-ties leaderboard used to show rank 1 with interval 4-55.
    params = btl.Params(jnp.zeros(5), jnp.zeros(1), jnp.zeros(()))
    cov = jnp.zeros((7, 7)).at[:5, :5].set(jnp.eye(5) - 0.2)
    point, lo, hi = inference.rank_intervals(jax.random.key(0), params, cov, num_draws=500)
    np.testing.assert_array_equal(point, np.ones(5))
    np.testing.assert_array_equal(lo, np.ones(5))
    np.testing.assert_array_equal(hi, np.full(5, 5))


@pytest.mark.parametrize("kwargs, match", [
    ({"cov": np.full((7, 7), np.nan)}, "cov has 49 non-finite"),
    ({"cov": np.eye(7), "level": 1.5}, "level 1.5"),
    ({"cov": np.eye(7), "level": 0.0}, "level 0.0"),
    ({"cov": np.eye(7), "num_draws": 0}, "num_draws=0"),
    ({"cov": np.eye(6)}, r"cov has shape \(6, 6\); expected \[7, 7\]"),
])
def test_rank_intervals_reject_bad_input(kwargs, match):
    params = btl.Params(jnp.zeros(5), jnp.zeros(1), jnp.zeros(()))
    with pytest.raises(ValueError, match=match):
        inference.rank_intervals(jax.random.key(0), params, **kwargs)
    if "level" not in kwargs and "num_draws" not in kwargs and kwargs["cov"].shape == (7, 7):
        with pytest.raises(ValueError, match="non-finite"):
            inference.intervals(params, kwargs["cov"])


# --- property tests of the fit --------------------------------------------------------------------

NP, JP = 5, 3
CELLS_P = [(i, j, k) for i, j in itertools.combinations(range(NP), 2) for k in range(JP)]


def _simulate(seed, per_cell, judge_aware):
    """Counts on every (pair, judge) cell from a judge-aware BTL truth (binomial per cell)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=NP)
    a = rng.normal(scale=0.5, size=JP) if judge_aware else np.zeros(JP)
    counts = []
    for i, j, k in CELLS_P:
        p = 1 / (1 + np.exp(-np.exp(a[k]) * (s[i] - s[j])))
        w = rng.binomial(per_cell, p)
        counts.append((w, per_cell - w, 0))
    return np.asarray(counts, np.float64)


@settings(max_examples=examples(12), deadline=None)
@given(seed=st.integers(0, 2**31 - 1), judge_aware=st.booleans())
def test_fit_is_invariant_to_permuting_models_and_judges(seed, judge_aware):
    counts = _simulate(seed, 12, judge_aware)
    table = _table(counts, NP, JP, CELLS_P)
    cfg = btl.FitConfig(judge_aware=judge_aware)
    try:
        res = btl.fit(table, cfg)
    except ValueError:
        assume(False)  # the MLE does not exist on this draw
    rng = np.random.default_rng(seed + 1)
    pm, pj = rng.permutation(NP), rng.permutation(JP)  # model m is called pm[m], judge k pj[k]
    lo, hi = np.minimum(pm[table.i], pm[table.j]), np.maximum(pm[table.i], pm[table.j])
    flip = pm[table.i] > pm[table.j]
    w = np.where(flip, table.losses, table.wins)
    l = np.where(flip, table.wins, table.losses)
    perm = data.ComparisonTable(lo.astype(np.int32), hi.astype(np.int32), pj[table.judge].astype(np.int32),
                                w, l, np.asarray(table.ties), NP, JP)
    res2 = btl.fit(perm, cfg)
    scale = 1.0 + np.max(np.abs(res.params.scores))
    np.testing.assert_allclose(np.asarray(res2.params.scores)[pm], res.params.scores, atol=1e-8 * scale)
    np.testing.assert_allclose(np.asarray(res2.params.log_discrimination)[pj],
                               res.params.log_discrimination, atol=1e-8 * scale)


@settings(max_examples=examples(10), deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_plain_btl_agrees_with_choix(seed):
    counts = _simulate(seed, 10, judge_aware=False)
    table = _table(counts, NP, JP, CELLS_P)
    try:
        res = btl.fit(table, btl.FitConfig(judge_aware=False))
    except ValueError:
        assume(False)
    pairs = []
    for (i, j, _), (w, l, _) in zip(CELLS_P, counts):
        pairs += [(i, j)] * int(w) + [(j, i)] * int(l)
    ref = choix.ilsr_pairwise(NP, pairs, alpha=0.0, tol=1e-13, max_iter=100_000)
    np.testing.assert_allclose(res.params.scores, ref - ref.mean(), atol=1e-6)
