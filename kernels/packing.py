"""Bit packing of low-bit codes into 8- or 32-bit words (the KV-cache kernels' storage format).

Dimensions: D codes per vector, W packed words per vector.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernels import checks

_WORD_DTYPES = {8: jnp.uint8, 32: jnp.uint32}


def _packing(bits: int, word_bits: int, where: str) -> int:
    if bits not in (1, 2, 4, 8):
        raise checks.error(where, "bits", "one of 1, 2, 4, 8", repr(bits))
    if word_bits not in _WORD_DTYPES:
        raise checks.error(where, "word_bits", "8 or 32", repr(word_bits))
    return word_bits // bits


def pack_codes(codes: jax.Array, bits: int, word_bits: int = 8) -> jax.Array:
    """Packs unsigned ``bits``-bit codes [..., D] (values in 0 .. 2^bits - 1) into words [..., W].

    ``n = word_bits / bits`` codes per word, W = D / n, planar order: channel ``d`` goes to word
    ``d % W`` at bit ``bits * (d // W)``, so unpacking plane ``s`` yields the contiguous channels
    ``s*W .. s*W + W - 1`` (kernels unpack without permuting lanes).

    Returns:
      uint8 [..., W] (``word_bits=8``) or int32 [..., W] (``word_bits=32``, the bits of a uint32).

    Raises:
      ValueError: ``bits`` not in {1, 2, 4, 8}, ``word_bits`` not 8 or 32, or D not a multiple of
        the codes per word.
    """
    n = _packing(bits, word_bits, "pack_codes")
    d = codes.shape[-1]
    if d % n:
        raise checks.error("pack_codes", "codes", f"[..., D] with D a multiple of {n} ({bits}-bit "
                           f"codes in {word_bits}-bit words)", f"D = {d}")
    wd = _WORD_DTYPES[word_bits]
    c = codes.astype(wd).reshape(*codes.shape[:-1], n, d // n)
    shifts = (bits * jnp.arange(n, dtype=jnp.uint32)).astype(wd)
    words = jnp.sum(c << shifts[:, None], axis=-2, dtype=wd)  # disjoint bits: sum == or
    return lax.bitcast_convert_type(words, jnp.int32) if word_bits == 32 else words


def unpack_codes(words: jax.Array, bits: int) -> jax.Array:
    """Inverse of :func:`pack_codes`: uint8 or int32 words [..., W] -> uint8 codes [..., n * W].

    Raises:
      ValueError: ``bits`` not in {1, 2, 4, 8} or ``words`` not uint8 / int32 / uint32.
    """
    if words.dtype == jnp.uint8:
        word_bits, u = 8, words
    elif words.dtype in (jnp.int32, jnp.uint32):
        word_bits, u = 32, lax.bitcast_convert_type(words, jnp.uint32)
    else:
        raise checks.error("unpack_codes", "words", "uint8, int32 or uint32", str(words.dtype))
    n = _packing(bits, word_bits, "unpack_codes")
    shifts = (bits * jnp.arange(n, dtype=jnp.uint32)).astype(u.dtype)
    c = (u[..., None, :] >> shifts[:, None]) & jnp.asarray((1 << bits) - 1, u.dtype)
    return c.reshape(*words.shape[:-1], n * words.shape[-1]).astype(jnp.uint8)
