"""Property tests of the RL-scaling metrics: GRPO group advantages (exact zeros for constant groups,
invariance to reward shifts, behaviour under scaling) and the unbiased pass@k estimator (in [0, 1]
and equal to the exact fraction 1 - C(n - c, k) / C(n, k))."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.rl_scaling import grpo, metrics
from tests.hypothesis_budget import examples

R = 24  # one rewards length for every example (eager ops are compiled once per shape)
GROUP_SIZES = st.sampled_from([2, 3, 4, 6, 8, 12])
MODES = st.sampled_from(grpo.ADVANTAGE_MODES)
F32_EPS = float(np.finfo(np.float32).eps)


# --- group advantages ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, n", [(0.1, 3), (3.7, 16), (1000.1, 5)])
@pytest.mark.parametrize("mode", grpo.ADVANTAGE_MODES)
def test_constant_group_gives_exact_zeros(value, n, mode):
    # Mean subtraction in float32 used to leave rounding noise that the tiny std then blew up
    # (-0.0074, -0.32 and -0.98 for these three groups).
    adv = np.asarray(grpo.group_advantages(jnp.full(n, value), n, mode=mode))
    assert np.array_equal(adv, np.zeros(n)), adv


@settings(max_examples=examples(60), deadline=None)
@given(values=st.lists(st.floats(-(2.0**100), 2.0**100, allow_nan=False, width=32), min_size=R // 2,
                       max_size=R // 2),
       n=GROUP_SIZES, mode=MODES, eps=st.sampled_from([0.0, 1e-6]))
def test_constant_groups_are_zero_for_any_value(values, n, mode, eps):
    # Groups of n copies of one value each (any magnitude), next to a varied half.
    per_group = np.repeat(np.asarray(values, np.float32)[: (R // 2) // n], n)
    rewards = np.concatenate([per_group, np.zeros(R - per_group.size, np.float32)])
    rewards[per_group.size::2] = 1.0  # the remaining groups are not constant
    adv = np.asarray(grpo.group_advantages(rewards, n, mode=mode, eps=eps))
    assert np.array_equal(adv[: per_group.size], np.zeros(per_group.size)), adv
    assert np.all(np.isfinite(adv))


@settings(max_examples=examples(60), deadline=None)
@given(eighths=st.lists(st.integers(-512, 512), min_size=R, max_size=R),
       shift=st.integers(-(2**12), 2**12), n=GROUP_SIZES, mode=MODES)
def test_advantages_invariant_to_reward_shift(eighths, shift, n, mode):
    # Multiples of 1/8 shifted by an integer stay exact in float32, so the advantages must agree
    # exactly (the centring subtracts exact differences).
    r = np.asarray(eighths, np.float32) / 8
    a = np.asarray(grpo.group_advantages(r, n, mode=mode))
    b = np.asarray(grpo.group_advantages(r + np.float32(shift), n, mode=mode))
    np.testing.assert_array_equal(a, b)


@settings(max_examples=examples(60), deadline=None)
@given(rewards=st.lists(st.floats(-100, 100, width=32), min_size=R, max_size=R),
       n=GROUP_SIZES, log2_scale=st.integers(-20, 20))
def test_advantages_under_scaling(rewards, n, log2_scale):
    # A power-of-two scale is exact: Dr.GRPO advantages scale with it, GRPO ones (eps = 0) do not
    # change, even for rewards whose squares underflow float32 (down to 1e-30 here). Rewards in the
    # subnormal range are set to 0 (XLA flushes them to zero).
    r = np.asarray(rewards, np.float32)
    r[np.abs(r) < 1e-30] = 0.0
    a = np.float32(2.0**log2_scale)
    dr = np.asarray(grpo.group_advantages(r, n, mode="drgrpo"))
    np.testing.assert_array_equal(np.asarray(grpo.group_advantages(a * r, n, mode="drgrpo")), a * dr)
    g = np.asarray(grpo.group_advantages(r, n, mode="grpo", eps=0.0))
    np.testing.assert_array_equal(np.asarray(grpo.group_advantages(a * r, n, mode="grpo", eps=0.0)), g)
    # Zero mean per group; unit population std per non-constant group (float32 rounding).
    g = g.reshape(-1, n)
    spread = np.ptp(r.reshape(-1, n), axis=1)
    np.testing.assert_allclose(g.mean(axis=1), 0.0, atol=8 * n * F32_EPS * np.abs(g).max(initial=1.0))
    varied = spread > 8 * F32_EPS * np.abs(r.reshape(-1, n)).max(axis=1)
    np.testing.assert_allclose(g.std(axis=1)[varied], 1.0, rtol=16 * n * F32_EPS)
    np.testing.assert_array_equal(g[~varied], 0.0)


def test_advantages_match_float64_reference_on_uneven_rewards():
    rng = np.random.default_rng(0)
    r = (1000.0 + rng.normal(size=R)).astype(np.float32)
    ref = r.astype(np.float64).reshape(-1, 6)
    ref = (ref - ref.mean(1, keepdims=True)) / ref.std(1, keepdims=True)
    got = np.asarray(grpo.group_advantages(r, 6, eps=0.0)).reshape(-1, 6)
    # The float32 inputs are exact; the error is float32 rounding of differences of size ~1.
    np.testing.assert_allclose(got, ref, atol=64 * F32_EPS * 1000.0 / np.ptp(ref))


# --- pass@k -------------------------------------------------------------------------------------

def _exact(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def _tolerance(n, c, k, eps):
    """Error bound of the product form: each of the k log1p terms and divisions is exact to about one
    float unit, so log C(n-c,k)/C(n,k) = L has relative error <= (k + 2) eps, which moves
    p = 1 - e^L by (1 - p) |L| (k + 2) eps; plus one unit of p for expm1."""
    p = float(_exact(n, c, k))
    if p == 1.0:
        return eps
    log_ratio = math.log(math.comb(n - c, k)) - math.log(math.comb(n, k))
    return (k + 3) * eps * ((1 - p) * abs(log_ratio) + p)


@pytest.mark.parametrize("n, c, k, want", [(1000, 1, 1, 0.001), (5000, 1, 1, 0.0002)])
def test_pass_at_k_with_one_correct_in_many(n, c, k, want):
    # Log-gamma differences in float32 gave 0.00195 and a negative number here.
    got = float(metrics.pass_at_k(n, c, k))
    assert got == pytest.approx(want, rel=4 * F32_EPS)


@st.composite
def _nck(draw, max_n=100_000, max_k=64):
    n = draw(st.integers(1, max_n))
    k = draw(st.integers(1, min(n, max_k)))
    c = draw(st.one_of(st.integers(0, n), st.integers(0, min(n, 3)), st.integers(max(0, n - k - 2), n)))
    return n, c, k


# The property tests call pass_at_k compiled (k static): eagerly, every new k compiles each of its
# k-shaped operations on its own (about 0.25 s per k, against 0.07 s for one jit compilation).
# The eager path and its input validation are tested above and below.
_jit_pass_at_k = jax.jit(metrics.pass_at_k, static_argnums=2)


@settings(max_examples=examples(150), deadline=None)
@given(nck=_nck())
def test_pass_at_k_equals_exact_fraction_float32(nck):
    n, c, k = nck
    got = np.asarray(_jit_pass_at_k(n, c, k))
    assert got.dtype == np.float32
    assert 0.0 <= float(got) <= 1.0
    want = float(_exact(n, c, k))
    assert abs(float(got) - want) <= _tolerance(n, c, k, F32_EPS), (float(got), want)
    if c == 0:
        assert float(got) == 0.0
    if n - c < k:
        assert float(got) == 1.0


@settings(max_examples=examples(100), deadline=None)
@given(nck=_nck(max_n=10**7, max_k=256))
def test_pass_at_k_equals_exact_fraction_float64(nck):
    n, c, k = nck
    with jax.enable_x64(True):
        got = np.asarray(_jit_pass_at_k(n, c, k))
    assert got.dtype == np.float64 and 0.0 <= float(got) <= 1.0
    want = float(_exact(n, c, k))
    assert abs(float(got) - want) <= _tolerance(n, c, k, float(np.finfo(np.float64).eps))


def test_pass_at_k_vectorised_and_validated():
    n = np.array([10, 10, 10, 3])
    c = np.array([0, 3, 10, 1])
    got = np.asarray(metrics.pass_at_k(n, c, 3))
    want = [float(_exact(a, b, 3)) for a, b in zip(n, c)]
    np.testing.assert_allclose(got, want, rtol=8 * F32_EPS)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="k="):
            metrics.pass_at_k(5, 1, bad)
    with pytest.raises(ValueError, match="outside"):
        metrics.pass_at_k(np.array([5]), np.array([6]), 1)
