"""In-kernel QVG dequantization and the online-softmax step shared by the Pallas kernels.

Dimensions as in :mod:`kernels.kv_quant.reference`; W is the piece width (below), Rp query rows.

A chunk is dequantized in column pieces of W channels, W = gcd(P, block, D / 2 with RoPE else D),
so each piece lies inside one bit plane of the planar packing, one scale block and one RoPE half.
A piece is then a static slice of every operand: bytes ``[b0, b0 + W)`` of plane ``j`` shifted
right by ``j * bits`` and masked, times its block's scale column, plus the stage centroids
gathered by a one-hot matmul. No concatenation, reshape or gather is needed inside the kernel, which
keeps the same code valid for Mosaic TPU and Triton.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from kernels import common

Loader = Callable[..., jax.Array]


def piece_width(d: int, bits: int, block: int, rope: bool) -> int:
    """W = gcd(P, block, D/2 or D): the widest column piece inside one plane, block and half."""
    p = d * bits // 8
    return math.gcd(math.gcd(p, block), d // 2 if rope else d)


def dequant_pieces(load_codes: Loader, load_scale: Loader, load_assign: Loader | None,
                   load_cent: Loader | None, mm: Callable | None, *, d: int, bits: int, block: int,
                   stages: int, num_centroids: int, w: int,
                   gather_cent: Loader | None = None) -> list[jax.Array]:
    """Dequantized chunk as D / W float32 pieces [N, W] (``x_hat = sum_s C_s[a_s] + scale * q``).

    Loaders read the current chunk: ``load_codes(b0, w)`` -> uint8 [N, w] bytes;
    ``load_scale(bi)`` -> [N, 1] scales; ``load_assign(s)`` -> uint8 [N, 1];
    ``load_cent(s, c0, w)`` -> bfloat16 [C, w]. ``mm(a, b)`` is the [M, K] x [K, N] matmul with a
    float32 result; the centroids are gathered with it as a bfloat16 one-hot [N, C] product
    (exact). A backend that can gather from memory passes ``gather_cent(s, c0, w)`` -> [N, w]
    (the stage-s centroid rows of the chunk's tokens) instead, and then ``load_assign``,
    ``load_cent`` and ``mm`` are not used.
    """
    p = d * bits // 8
    mask = jnp.int32((1 << bits) - 1)
    offset = float(2 ** (bits - 1))
    onehots = []
    for s in range(stages if gather_cent is None else 0):
        a = load_assign(s).astype(jnp.int32)  # [N, 1]
        n = a.shape[0]
        cid = lax.broadcasted_iota(jnp.int32, (n, num_centroids), 1)
        # bf16 0/1 times the bf16 centroids, accumulated in f32: an exact gather at half the
        # operand bytes of an f32 product
        onehots.append((a == cid).astype(jnp.bfloat16))  # [N, C]
    pieces = []
    for i in range(d // w):
        c0 = i * w
        j, b0 = divmod(c0, p)
        raw = load_codes(b0, w).astype(jnp.int32)
        code = lax.shift_right_logical(raw, jnp.int32(bits * j)) & mask
        x = (code.astype(jnp.float32) - offset) * load_scale(c0 // block).astype(jnp.float32)
        for s in range(stages):
            if gather_cent is None:
                x = x + mm(onehots[s], load_cent(s, c0, w).astype(jnp.bfloat16))
            else:
                x = x + gather_cent(s, c0, w).astype(jnp.float32)
        pieces.append(x)
    return pieces


def rope_pieces(pieces: list[jax.Array], load_cos: Loader, load_sin: Loader) -> list[jax.Array]:
    """Half-split RoPE on pieces (piece i pairs with piece i + D / 2W); ``load_cos(c0, w)``."""
    h = len(pieces) // 2
    w = pieces[0].shape[1]
    first, second = [], []
    for i in range(h):
        cos, sin = load_cos(i * w, w), load_sin(i * w, w)
        x1, x2 = pieces[i], pieces[i + h]
        first.append(x1 * cos - x2 * sin)
        second.append(x2 * cos + x1 * sin)
    return first + second


def online_softmax_step(logits: jax.Array, valid: jax.Array, m_prev: jax.Array,
                        l_prev: jax.Array):
    """One online-softmax update for logits [R, N] (masked by ``valid``), m, l [R, 1].

    Returns (p [R, N], corr [R, 1], m_new [R, 1], l_new [R, 1]); rows that have seen no slot keep
    m = -inf, l = 0 and get p = 0 (no NaN).
    """
    s = jnp.where(valid, logits, -jnp.inf)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    corr = jnp.exp(m_prev - m_safe)
    prob = jnp.exp(s - m_safe)
    return prob, corr, m_new, corr * l_prev + jnp.sum(prob, axis=1, keepdims=True)


def finalize(acc: jax.Array, m: jax.Array, l: jax.Array):
    """(acc / l, m + log l) with (0, -inf) for rows with l = 0."""
    seen = l > 0
    l_safe = jnp.where(seen, l, 1.0)
    return jnp.where(seen, acc / l_safe, 0.0), jnp.where(seen, m + jnp.log(l_safe), -jnp.inf)


def rope_tables(slots: int, d: int, base: float, chunk: int) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32 [NC, N, D / 2] of slot positions 0..slots-1 (as
    :func:`kernels.common.rope_slots`)."""
    ang = common.rope_angles(jnp.arange(slots), d, base).reshape(slots // chunk, chunk, d // 2)
    return jnp.cos(ang), jnp.sin(ang)


def check_inputs(q, k_code, v_code, cfg, num_new: int) -> None:
    """Raises ValueError on inconsistent shapes."""
    b, kh, r, d = q.shape
    cfg.check_head_dim(d)
    if num_new < 1 or r % num_new:
        raise ValueError(f"num_new={num_new} must be >= 1 and divide the {r} query rows")
    for name, code in (("k_code", k_code), ("v_code", v_code)):
        if code.codes.shape[:2] != (b, kh) or code.codes.shape[-1] != d * cfg.bits // 8:
            raise ValueError(f"{name}.codes has shape {code.codes.shape}; expected "
                             f"[{b}, {kh}, NC, N, {d * cfg.bits // 8}]")
        if code.assign.shape[3] != cfg.stages:
            raise ValueError(f"{name} has {code.assign.shape[3]} stages; cfg.stages={cfg.stages}")
