"""Scale formats of QVG and KIVI: finite, non-zero scales and bounded error for any finite input.

QVG stored E4M3 scales (largest value 448): a block whose residual scale exceeded it dequantized to
NaN, and small scales flushed to zero. KIVI stored float16 zero points (largest 65504). Both now
store bfloat16 (float32's exponent range), the scale rounded up and the KIVI zero rounded down.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.kv_quant import reference as ref
from tests.hypothesis_budget import examples

D, N = 16, 32  # one shape per function: one compilation for all examples
EXPONENTS = st.floats(min_value=-6.0, max_value=4.0)  # block magnitudes 1e-6 .. 1e4


def _data(seed: int, exps: np.ndarray) -> np.ndarray:
    """[N, D] float32: a normal draw whose rows (or whole array) are scaled by 10^exps."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((N, D)) * 10.0 ** exps).astype(np.float32)


_sym = jax.jit(lambda x: ref.quantize_symmetric(x, 2, 8))
_sym_rt = jax.jit(lambda x: ref.dequantize_symmetric(*ref.quantize_symmetric(x, 4, 8), 4))
_qvg_cfg = ref.QVGConfig(bits=2, stages=1, block=8, num_centroids=4, chunk=N, kmeans_iters=2)
_qvg_rt = jax.jit(lambda x: ref.qvg_roundtrip(x[None], _qvg_cfg, jax.random.key(0))[0])
_qvg0_cfg = ref.QVGConfig(bits=2, stages=0, block=8, chunk=N)
_qvg0_rt = jax.jit(lambda x: ref.qvg_roundtrip(x[None], _qvg0_cfg, jax.random.key(0))[0])
_kivi_cfg = ref.KIVIConfig(bits=2, group=8, block=8, residual=N)
_kivi_rt = jax.jit(lambda k, v: ref.kivi_roundtrip(k[None], v[None], _kivi_cfg))


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2**31 - 1), exp=EXPONENTS, spread=st.floats(0.0, 3.0))
def test_symmetric_scales_finite_and_error_within_half_a_step(seed, exp, spread):
    exps = exp + spread * np.random.default_rng(seed + 1).uniform(-1, 1, (N, 1))
    x = _data(seed, exps)
    packed, scales = _sym(x)
    s = np.asarray(scales.astype(jnp.float32))
    assert scales.dtype == jnp.bfloat16 and np.all(np.isfinite(s))
    amax = np.abs(x).reshape(N, D // 8, 8).max(-1)
    assert np.all((s > 0) == (amax > 0))  # no scale of a non-zero block flushes to zero
    assert np.all(amax <= s * 1.0)  # rounded up: INT2 qmax = 1, nothing clips
    np.testing.assert_array_less(s, amax * (1 + 2.0 ** -7) + 1e-38)  # and by at most one ulp
    x_hat = np.asarray(_sym_rt(x))
    s4 = np.repeat(np.asarray(ref.quantize_symmetric(jnp.asarray(x), 4, 8)[1].astype(jnp.float32)),
                   8, axis=-1)
    assert np.all(np.isfinite(x_hat))
    assert np.all(np.abs(x_hat - x) <= s4 / 2 * (1 + 1e-6))


@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 2**31 - 1), exp=EXPONENTS, offset=st.floats(-3.0, 3.0))
def test_qvg_and_kivi_roundtrips_finite_with_relative_error_bounded(seed, exp, offset):
    x = _data(seed, np.float32(exp))
    x = x + np.float32(offset * 10.0 ** exp)  # a common offset: KIVI's zero point matters
    scale = np.abs(x).max()
    for name, got in (("qvg", _qvg_rt(x)), ("qvg stages=0", _qvg0_rt(x))):
        got = np.asarray(got)
        assert np.all(np.isfinite(got)), name
        # INT2 symmetric: error <= half the block's scale <= max|residual| / 2 <= max|x|-ish
        assert np.max(np.abs(got - x)) <= 1.01 * scale, name
    k_hat, v_hat = (np.asarray(a[0]) for a in _kivi_rt(x, x))
    assert np.all(np.isfinite(k_hat)) and np.all(np.isfinite(v_hat))
    # INT2 asymmetric: error <= half a step = range / 6, with the zero/scale rounding slack
    rng_k = np.ptp(x.reshape(N // 8, 8, D), axis=1).max()
    rng_v = np.ptp(x.reshape(N, D // 8, 8), axis=2).max()
    assert np.max(np.abs(k_hat - x)) <= rng_k / 6 * 1.02 + 2.0 ** -8 * scale
    assert np.max(np.abs(v_hat - x)) <= rng_v / 6 * 1.02 + 2.0 ** -8 * scale


def test_scale_above_e4m3_range_no_longer_gives_nan():
    """The reported case: one key entry of 500 at stages=0 (INT2: scale 500 > 448)."""
    x = np.asarray(_data(0, np.float32(-1.0)))
    x[3, 5] = 500.0
    got = np.asarray(_qvg0_rt(x))
    assert np.all(np.isfinite(got))
    assert got[3, 5] == 500.0  # max of its block: scale 500 (bf16-exact) times code 1
    # E4M3 would have been inf here; bfloat16 holds the scale exactly
    assert float(jnp.asarray(500.0, jnp.float8_e4m3fn).astype(jnp.float32)) != 500.0


def test_tiny_blocks_keep_their_scale():
    x = np.full((N, D), 3e-6, np.float32) * np.sign(_data(1, np.float32(0.0)))
    got = np.asarray(_qvg0_rt(x))
    np.testing.assert_allclose(got, x, rtol=2.0 ** -7)  # |x| is constant: each element is +-scale


@pytest.mark.parametrize("big", [7e4, 1e30])
def test_kivi_beyond_float16_range_is_finite(big):
    """float16 zero points overflowed above 65504; bfloat16 ones do not."""
    x = _data(2, np.float32(0.0)) + np.float32(big)
    k_hat, v_hat = (np.asarray(a[0]) for a in _kivi_rt(x, x))
    assert np.all(np.isfinite(k_hat)) and np.all(np.isfinite(v_hat))
    np.testing.assert_allclose(k_hat, x, rtol=2.0 ** -7)
    np.testing.assert_allclose(v_hat, x, rtol=2.0 ** -7)


@functools.cache
def _keys_of_zero():
    return _sym(jnp.zeros((N, D), jnp.float32))


def test_all_zero_block_has_zero_scale_and_zero_output():
    packed, scales = _keys_of_zero()
    np.testing.assert_array_equal(np.asarray(scales.astype(jnp.float32)), 0.0)
    np.testing.assert_array_equal(np.asarray(ref.dequantize_symmetric(packed, scales, 2)), 0.0)
