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
from models import kv_cache as kvc


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
    be, dense = bcache.BudgetedKVCache(), kvc.DenseKVCache()
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


@settings(max_examples=30, deadline=None)
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
