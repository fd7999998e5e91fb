"""kernels.packing: planar packing layouts and the refused widths."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import packing


@pytest.mark.parametrize("bits,word_bits", [(1, 8), (2, 8), (4, 8), (8, 8), (2, 32), (4, 32)])
def test_pack_roundtrip_and_planar_layout(bits, word_bits):
    n = word_bits // bits
    d = 2 * n
    codes = jax.random.randint(jax.random.key(bits + word_bits), (3, 5, d), 0, 2 ** bits)
    words = packing.pack_codes(codes, bits, word_bits)
    assert words.shape == (3, 5, d // n)
    assert words.dtype == (jnp.uint8 if word_bits == 8 else jnp.int32)
    np.testing.assert_array_equal(packing.unpack_codes(words, bits), codes.astype(np.uint8))
    # planar: channel c sits in word c % W at bit bits * (c // W)
    w = d // n
    u = np.asarray(words).view(np.uint8 if word_bits == 8 else np.uint32).astype(np.uint64)
    c = np.asarray(codes)
    for ch in range(d):
        got = (u[..., ch % w] >> (bits * (ch // w))) & (2 ** bits - 1)
        np.testing.assert_array_equal(got, c[..., ch])


def test_pack_rejects_bad_widths():
    with pytest.raises(ValueError, match="bits must"):
        packing.pack_codes(jnp.zeros((4, 8), jnp.uint8), 3)
    with pytest.raises(ValueError, match="word_bits must"):
        packing.pack_codes(jnp.zeros((4, 8), jnp.uint8), 2, word_bits=16)
    with pytest.raises(ValueError, match="multiple of 16"):
        packing.pack_codes(jnp.zeros((4, 8), jnp.uint8), 2, word_bits=32)
    with pytest.raises(ValueError, match="words must"):
        packing.unpack_codes(jnp.zeros((4, 8), jnp.float32), 2)
