"""Tests of EntroKV budgets, entropy, SnapKV selection and the budgeted cache."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.kv_budget import cache as bcache
from algorithms.kv_budget import entrokv
from kernels import cache_backend
from tests.hypothesis_budget import examples


@pytest.mark.parametrize("total", [8, 9, 50, 113, 160])
def test_budgets_sum_exactly_and_respect_bounds(total):
    scores = jax.random.uniform(jax.random.key(total), (8,), minval=0.05, maxval=1.0)
    b = np.asarray(entrokv.allocate_budgets(scores, total, min_budget=1, capacity=20))
    assert b.sum() == total and b.min() >= 1 and b.max() <= 20


def test_budgets_proportional_when_exact():
    b = entrokv.allocate_budgets(jnp.array([1.0, 1.0, 2.0]), 40)
    np.testing.assert_array_equal(b, [10, 10, 20])
    # capped head: the excess goes to the others in proportion
    b = entrokv.allocate_budgets(jnp.array([1.0, 1.0, 8.0]), 30, capacity=12)
    np.testing.assert_array_equal(b, [9, 9, 12])
    np.testing.assert_array_equal(np.sort(np.asarray(entrokv.uniform_budgets(3, 10))), [3, 3, 4])


def test_budget_below_heads_raises():
    with pytest.raises(ValueError, match="below num_heads"):
        entrokv.allocate_budgets(jnp.ones(8), 7)
    with pytest.raises(ValueError, match="exceeds"):
        entrokv.allocate_budgets(jnp.ones(2), 30, capacity=10)
    with pytest.raises(ValueError, match="alpha"):
        entrokv.EntroKVConfig(alpha=1.5)
    with pytest.raises(ValueError, match="window"):
        entrokv.observation_probs(jnp.ones((1, 2, 4, 8)), jnp.ones((1, 2, 4, 8)), 5)


def test_normalized_entropy_limits_and_blend():
    p = 6
    valid = jnp.ones((2, p), bool)
    uniform = jnp.full((2, p), 1.0 / p)
    onehot = jax.nn.one_hot(jnp.array([1, 4]), p)
    np.testing.assert_allclose(entrokv.normalized_entropy(uniform, valid), 1.0, rtol=1e-6)
    np.testing.assert_allclose(entrokv.normalized_entropy(onehot, valid), 0.0, atol=1e-7)
    cfg = entrokv.EntroKVConfig(alpha=0.5, prior=0.3)
    np.testing.assert_allclose(entrokv.blend_scores(jnp.array([0.0, 1.0]), cfg), [0.15, 0.65],
                               rtol=1e-6)


def test_snapkv_selection_keeps_window_and_exact_counts():
    votes_src = jax.random.uniform(jax.random.key(0), (2, 3, 4, 20))  # [B, K, W, P]
    votes = entrokv.snapkv_votes(votes_src, window=4, pool=3)
    budgets = jnp.array([5, 9, 20])
    keep = jax.vmap(entrokv.select_tokens, (0, None))(votes, budgets)
    np.testing.assert_array_equal(keep.sum(-1), np.broadcast_to([5, 9, 20], (2, 3)))
    assert bool(jnp.all(keep[..., 16:]))  # the observation window is always kept
    # the selected prefix tokens are the top votes
    v0 = np.asarray(votes[0, 0, :16])
    chosen = np.flatnonzero(np.asarray(keep[0, 0, :16]))
    assert set(chosen) == set(np.argsort(-v0, kind="stable")[:1])


def test_budgeted_cache_all_kept_equals_dense_and_mask_excludes():
    b, kh, h, s, d = 1, 2, 4, 10, 8
    k = jax.random.normal(jax.random.key(0), (b, kh, s, d))
    v = jax.random.normal(jax.random.key(1), (b, kh, s, d))
    q = jax.random.normal(jax.random.key(2), (b, h, 1, d))
    start = jnp.full((b,), s - 1, jnp.int32)
    be, dense = bcache.BudgetedKVCache(), cache_backend.DenseKVCache()
    z = jnp.zeros((b,), jnp.int32)
    layer = be.update(be.init(b, s, kh, d, jnp.float32), k, v, z)
    dl = dense.update(dense.init(b, s, kh, d, jnp.float32), k, v, z)
    chex.assert_trees_all_close(be.attend(layer, q, start), dense.attend(dl, q, start), atol=1e-6)
    keep = jnp.zeros((b, kh, s), bool).at[:, :, 3].set(True)
    (masked,) = bcache.with_keep([layer], [keep])
    out = be.attend(masked, q, start)  # only slot 3 visible -> its value
    chex.assert_trees_all_close(out.reshape(b, kh, 2, d), jnp.broadcast_to(
        v[:, :, 3][:, :, None], (b, kh, 2, d)), atol=1e-6)


@pytest.mark.parametrize("p,window,budget", [(64, 32, 19), (64, 32, 1), (5000, 32, 13)])
def test_budget_below_window_keeps_the_newest_window_tokens(p, window, budget):
    """1e30 + position rounded to one float32 for every position, so the stable sort kept the
    oldest window tokens (positions 32-50 of 64 at budget 19); the newest are the ones to keep."""
    probs = jax.random.uniform(jax.random.key(p), (1, window, p))
    votes = entrokv.snapkv_votes(probs, window=window, pool=3)
    keep = np.asarray(entrokv.select_tokens(votes, jnp.array([budget])))[0]
    np.testing.assert_array_equal(np.flatnonzero(keep), np.arange(p - budget, p))


@settings(max_examples=examples(30), deadline=None)
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(1, 48), levels=st.integers(2, 50))
def test_selection_is_newest_window_then_top_votes(seed, budget, levels):
    """Against a plain numpy ranking: the window (newest first), then the prefix by vote (ties:
    oldest first). Few distinct vote levels make ties common."""
    p, window = 48, 12
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, levels, (1, 2, p)).astype(np.float32)  # [K, Wq, P], ties likely
    votes = entrokv.snapkv_votes(jnp.asarray(raw), window=window, pool=1)  # [1, P]
    keep = np.asarray(entrokv.select_tokens(votes, jnp.array([budget])))[0]
    prefix_votes = raw.sum(axis=1)[0, :p - window]
    want_order = list(range(p - 1, p - window - 1, -1)) + list(
        np.argsort(-prefix_votes, kind="stable"))
    want = np.zeros(p, bool)
    want[want_order[:budget]] = True
    np.testing.assert_array_equal(keep, want)


def test_snapkv_pools_the_prefix_only():
    """16 tokens, window 4, pool 3, budget 5; votes 0.01 but 0.5 on token 2 and 2.0 on the window.
    SnapKV pools the prefix alone, so tokens 1-3 tie at 0.5 and one of them is kept with the
    window 12-15; pooling over the whole prompt gave token 11 the window's 2.0 (kept 11-15)."""
    vote = np.full(16, 0.01, np.float32)
    vote[2], vote[12:] = 0.5, 2.0
    votes = entrokv.snapkv_votes(jnp.asarray(vote)[None, None], window=4, pool=3)  # [1, 16]
    np.testing.assert_allclose(votes[0, :12], [0.01, 0.5, 0.5, 0.5] + [0.01] * 8)
    assert bool(jnp.all(jnp.isposinf(votes[0, 12:])))
    kept = set(np.flatnonzero(np.asarray(entrokv.select_tokens(votes, jnp.array([5])))[0]))
    assert len(kept) == 5 and set(range(12, 16)) <= kept and len(kept & {1, 2, 3}) == 1
    assert kept == {1, 12, 13, 14, 15}  # ties go to the oldest token


@pytest.mark.parametrize("pooling", ["max", "avg"])
@pytest.mark.parametrize("p,window,pool", [(40, 6, 7), (40, 6, 1), (8, 5, 7), (6, 6, 3)])
def test_snapkv_pooling_matches_scipy(pooling, p, window, pool):
    """The prefix's vote pooled as SnapKV's reference does (stride 1, pool // 2 padding: -inf for
    max pooling, zeros counted in the mean for average pooling), against scipy.ndimage."""
    from scipy import ndimage

    rng = np.random.default_rng(p * 100 + pool)
    probs = rng.random((2, 3, 5, p)).astype(np.float32)  # [B, K, Wq, P]
    got = np.asarray(entrokv.snapkv_votes(jnp.asarray(probs), window, pool, pooling))
    vote = probs[..., :p - window].astype(np.float64).sum(axis=-2)
    if pooling == "max":
        want = ndimage.maximum_filter1d(vote, pool, axis=-1, mode="constant", cval=-np.inf)
    else:
        want = ndimage.uniform_filter1d(vote, pool, axis=-1, mode="constant", cval=0.0)
    assert got.shape == (2, 3, p)
    np.testing.assert_allclose(got[..., :p - window], want, rtol=1e-6)
    assert np.all(np.isposinf(got[..., p - window:]))


def test_allocate_budgets_refuses_non_finite_scores():
    """[0.3, nan, 0.5] into 10 slots (min 1, capacity 8) gave [8, 2, 0]: below min_budget."""
    with pytest.raises(ValueError, match=r"scores must be finite, got nan at head 1"):
        entrokv.allocate_budgets(jnp.array([0.3, jnp.nan, 0.5]), 10, 1, 8)
    with pytest.raises(ValueError, match=r"got inf at head 2"):
        entrokv.allocate_budgets(jnp.array([0.3, 0.2, jnp.inf]), 10, 1, 8)
    # Traced (no check possible): NaN counts as tiny, +inf as the largest score; the bounds and
    # the exact sum hold. NaN head: 1 slot, the other 9 split 3:5 = 3.375 / 5.625 -> 3, 6.
    alloc = jax.jit(lambda s: entrokv.allocate_budgets(s, 10, 1, 8))
    np.testing.assert_array_equal(alloc(jnp.array([0.3, jnp.nan, 0.5])), [3, 1, 6])
    np.testing.assert_array_equal(alloc(jnp.array([0.3, jnp.inf, 0.5])), [1, 8, 1])
    with pytest.raises(ValueError, match="min_budget"):
        entrokv.allocate_budgets(jnp.ones(3), 9, min_budget=-1)


def test_public_functions_refuse_non_finite_values():
    nan_probs = jnp.full((2, 6), 1.0 / 6).at[1, 3].set(jnp.nan)
    valid = jnp.ones((2, 6), bool)
    with pytest.raises(ValueError, match=r"normalized_entropy: probs must be finite, got nan at "
                                         r"index \(1, 3\)"):
        entrokv.normalized_entropy(nan_probs, valid)
    with pytest.raises(ValueError, match="probs must be non-negative"):
        entrokv.normalized_entropy(jnp.full((2, 6), 1.0 / 6).at[0, 0].set(-0.1), valid)
    # traced: the NaN propagates to that head instead of being dropped from the sum
    assert bool(jnp.isnan(jax.jit(entrokv.normalized_entropy)(nan_probs, valid)))
    with pytest.raises(ValueError, match="blend_scores: entropy must be finite"):
        entrokv.blend_scores(jnp.array([0.2, jnp.inf]), entrokv.EntroKVConfig())
    with pytest.raises(ValueError, match="snapkv_votes: probs must be finite"):
        entrokv.snapkv_votes(nan_probs, window=2, pool=3)
    with pytest.raises(ValueError, match="snapkv_votes: window"):
        entrokv.snapkv_votes(jnp.ones((2, 6)), window=7, pool=3)
    with pytest.raises(ValueError, match="snapkv_votes: pooling"):
        entrokv.snapkv_votes(jnp.ones((2, 6)), window=2, pool=3, pooling="mean")
    with pytest.raises(ValueError, match=r"select_tokens: votes must be free of NaN, got nan"):
        entrokv.select_tokens(nan_probs, jnp.array([1, 2]))
    with pytest.raises(ValueError, match="select_tokens: budgets must be non-negative"):
        entrokv.select_tokens(jnp.ones((2, 6)), jnp.array([1, -2]))
    with pytest.raises(ValueError, match="select_tokens: budgets"):
        entrokv.select_tokens(jnp.ones((2, 6)), jnp.array([1, 2, 3]))
    q = jnp.ones((1, 4, 6, 8)).at[0, 1, 2, 3].set(jnp.inf)
    with pytest.raises(ValueError, match=r"observation_probs: q must be finite, got inf"):
        entrokv.observation_probs(q, jnp.ones((1, 2, 6, 8)), 2)
    with pytest.raises(ValueError, match="observation_probs: k"):
        entrokv.observation_probs(jnp.ones((1, 4, 6, 8)), jnp.ones((1, 3, 6, 8)), 2)
