"""Exact categorical draws: frequencies match the law down to probabilities of 1e-9 (where
``jax.random.categorical``'s float32 Gumbel noise draws nothing), batched rows, edge cases, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import sampling


def _within(count, n, p, k):
    """``count`` of ``n`` draws lies within ``k`` binomial standard errors of ``n p``."""
    se = np.sqrt(n * p * (1 - p))
    return abs(count - n * p) <= k * se, f"{count} vs {n * p:.1f} +- {se:.1f}"


def _log(p):
    p = np.asarray(p, np.float64)
    return np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), -np.inf).astype(np.float32)


def test_tiers_down_to_1e9_are_drawn_at_their_probability():
    """One law over 2^20 ids: tiers of 1, 100, 10^4 and 10^6 ids at 1e-3, 1e-5, 1e-7 and 1e-9 each
    (1e-3 of mass per tier), the rest of the mass on id 0, and 38,475 ids of probability 0.

    N = 2e5 draws from the shared law (the tree is built once; a Gumbel-max draw would need 2e11
    noise values): 200 expected per tier, binomial s.e. 14; each tier must be within 4 s.e.
    Power against float32 Gumbel-max (``jax.random.categorical``, mode "low", largest noise 15.94):
    an id at ratio r to the top is drawn at ``r (1 + a) e^-a``, ``a = 1.19e-7 / r``: 0 for the
    1e-9 tier (14 s.e. below), 0.67 of its rate for the 1e-7 tier (134 expected, 4.7 s.e. below).
    """
    v = 1 << 20
    tiers = [(1e-3, 1), (1e-5, 100), (1e-7, 10_000), (1e-9, 1_000_000)]
    p = np.zeros(v)
    start, spans = 1, []
    for q, count in tiers:
        p[start:start + count] = q
        spans.append((start, start + count))
        start += count
    p[0] = 1.0 - p.sum()
    n = 200_000
    draws = np.asarray(jax.jit(lambda k, lg: sampling.categorical(k, lg, shape=(n,)))(
        jax.random.key(3), jnp.asarray(_log(p))))
    assert draws.dtype == np.int32 and draws.shape == (n,)
    for (a, b), (q, count) in zip(spans, tiers):
        ok, msg = _within(int(((draws >= a) & (draws < b)).sum()), n, q * count, 4)
        assert ok, f"tier {q}: {msg}"
    assert not np.any(draws >= start), "an id of probability 0 was drawn"


def test_batched_rows_match_softmax():
    """Per-row laws (with -inf entries and V = 7, not a power of two), drawn 40,000 times each
    through leading axes of ``shape``; every cell within 4.5 s.e. of softmax."""
    logits = jax.random.normal(jax.random.key(0), (3, 7)) * 3.0
    logits = logits.at[0, 2].set(-jnp.inf).at[2, 6].set(-jnp.inf).at[1, 0].set(-18.0)
    n = 40_000
    draws = np.asarray(jax.jit(lambda k: sampling.categorical(k, logits, shape=(n, 3)))(
        jax.random.key(1)))
    probs = np.asarray(jax.nn.softmax(logits.astype(jnp.float32)), np.float64)
    for r in range(3):
        counts = np.bincount(draws[:, r], minlength=7)
        assert counts.size == 7
        for j in range(7):
            if probs[r, j] == 0:
                assert counts[j] == 0
            else:
                ok, msg = _within(counts[j], n, probs[r, j], 4.5)
                assert ok, f"row {r}, id {j}: {msg}"


def test_default_shape_dtypes_and_edge_cases():
    key = jax.random.key(2)
    logits = jax.random.normal(key, (4, 5, 3))
    out = sampling.categorical(key, logits)
    assert out.shape == (4, 5) and out.dtype == jnp.int32
    assert 0 <= int(out.min()) and int(out.max()) < 3
    np.testing.assert_array_equal(sampling.categorical(key, logits.astype(jnp.bfloat16)).shape,
                                  (4, 5))
    # V = 1; a row with no finite logit gives 0; a one-hot row gives its id.
    np.testing.assert_array_equal(sampling.categorical(key, jnp.zeros((6, 1))), 0)
    np.testing.assert_array_equal(sampling.categorical(key, jnp.full((6, 5), -jnp.inf)), 0)
    one_hot = jnp.full((6, 5), -jnp.inf).at[:, 4].set(0.0)
    np.testing.assert_array_equal(sampling.categorical(key, one_hot), 4)
    # jit with a traced key and vmap over keys
    keys = jax.random.split(key, 3)
    out = jax.vmap(lambda k: sampling.categorical(k, logits[0]))(keys)
    assert out.shape == (3, 5)


@pytest.mark.parametrize("logits, shape, match", [
    (jnp.ones((3, 4), jnp.int32), None, "floating-point"),
    (jnp.float32(1.0), None, r"\[\.\.\., V\]"),
    (jnp.zeros((3, 0)), None, "V >= 1"),
    (jnp.zeros((3, 4)), (2, 4), "batch shape"),
    (jnp.zeros((3, 4)), (3, 2), "batch shape"),
    (jnp.zeros((3, 4)).at[1, 1].set(jnp.nan), None, "NaN"),
    (jnp.zeros((3, 4)).at[1, 1].set(jnp.inf), None, r"\+inf"),
])
def test_bad_input_raises(logits, shape, match):
    with pytest.raises(ValueError, match=match):
        sampling.categorical(jax.random.key(0), logits, shape=shape)
