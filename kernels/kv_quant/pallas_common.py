"""In-kernel QVG dequantization and the online-softmax step shared by the Pallas kernels.

Dimensions as in :mod:`kernels.kv_quant.reference`; W is the piece width (below), T the tokens
dequantized at once (a chunk on TPU, a tile on GPU), Rp query rows.

The cache stores a chunk tokens minor (:class:`~kernels.kv_quant.reference.QVGCode`: codes
[P, N], scales [NB, N], assignments [S, N]), and the kernels dequantize it in that orientation:
channels on sublanes, tokens on lanes. A chunk is dequantized in row pieces of W channels,
W = gcd(P, block, D / 2 with RoPE else D), so each piece lies inside one bit plane of the planar
packing, one scale block and one RoPE half: bytes ``[b0, b0 + W)`` of plane ``j`` (rows of the
codes) shifted right by ``j * bits`` and masked, times its block's scale row, plus the stage
centroids' rows of the tokens' assignments. No concatenation or reshape is needed inside the kernel.

Keys stored before RoPE are rotated in the kernel by angle addition (:func:`rope_cos_sin`) from
:class:`RopeTables`: the chunk starts' cos, sin and angle ([3, D/2, NC]) and the in-chunk
offsets' ([3, D/2, N], the same for every chunk), at exactly the reference's float32 angles.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from kernels.rope import is_rope_frequencies, rope_angles

Loader = Callable[..., jax.Array]


def piece_width(d: int, bits: int, block: int, rope: bool) -> int:
    """W = gcd(P, block, D/2 or D): the widest column piece inside one plane, block and half."""
    p = d * bits // 8
    return math.gcd(math.gcd(p, block), d // 2 if rope else d)


def dequant_pieces(load_codes: Loader, load_scale: Loader, centroid_rows: Loader | None, *,
                   d: int, bits: int, block: int, stages: int, w: int) -> list[jax.Array]:
    """Dequantized tokens as D / W float32 pieces [W, T], channels by tokens
    (``x_hat = sum_s C_s[a_s] + scale * q``).

    Loaders read the current tokens: ``load_codes(b0, w)`` -> integer [w, T] (packed byte rows
    ``b0 .. b0 + w - 1``); ``load_scale(bi)`` -> [1, T] (block ``bi``'s scales);
    ``centroid_rows(s, c0, w)`` -> float [w, T]: channels ``c0 .. c0 + w - 1`` of the stage-s
    centroids of the tokens' assignments (a one-hot matmul on TPU, a gather on GPU; exact).
    """
    p = d * bits // 8
    mask = jnp.int32((1 << bits) - 1)
    offset = float(2 ** (bits - 1))
    pieces = []
    for i in range(d // w):
        c0 = i * w
        j, b0 = divmod(c0, p)
        raw = load_codes(b0, w).astype(jnp.int32)
        code = lax.shift_right_logical(raw, jnp.int32(bits * j)) & mask
        x = (code.astype(jnp.float32) - offset) * load_scale(c0 // block).astype(jnp.float32)
        for s in range(stages):
            x = x + centroid_rows(s, c0, w).astype(jnp.float32)
        pieces.append(x)
    return pieces


def rope_pieces(pieces: list[jax.Array], rotation: Callable[[int, int], tuple[jax.Array, jax.Array]]
                ) -> list[jax.Array]:
    """Half-split RoPE on pieces [W, T] (piece i pairs with piece i + D / 2W); ``rotation(c0, w)``
    gives the cos and sin [w, T] of frequencies ``c0 .. c0 + w - 1`` (:func:`rope_cos_sin`)."""
    h = len(pieces) // 2
    w = pieces[0].shape[0]
    first, second = [], []
    for i in range(h):
        cos, sin = rotation(i * w, w)
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
    """(acc / l, m + log l) with (0, -inf) for rows with l = 0 (that saw no slot); a NaN ``l``
    (a NaN logit) gives NaN, as dense attention does (``l > 0`` would take it for an empty row)."""
    empty = l == 0
    l_safe = jnp.where(empty, 1.0, l)
    return jnp.where(empty, 0.0, acc / l_safe), jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))


class RopeTables(NamedTuple):
    """Float32 tables from which the kernels rotate a chunk's keys by angle addition, frequencies
    on sublanes (as the dequantized pieces' channels).

    A slot at position ``p = c N + j`` (chunk c, offset j < N) has the angle ``fl(p f)`` (the
    float32 product of :func:`kernels.rope.rope_angles`, as the reference rotates it). With
    ``B = fl(c N f)`` and ``b = fl(j f)``, ``fl(p f) = B + b + e`` where the residual ``e`` is a few
    float32 ulps of the angle; the kernels combine ``cos, sin`` of ``B`` (per chunk) and of ``b``
    (the same for every chunk) by the addition formulas and rotate by ``e`` with a short series
    (:func:`rope_cos_sin`). No table grows with both the chunk count and the chunk length.
    """

    freq: jax.Array  # [D/2, 1]: the frequencies f (radians per position)
    offsets: jax.Array  # [3, D/2, N]: cos, sin and angle fl(j f) of the in-chunk offsets j
    starts: jax.Array  # [3, D/2, NCp]: cos, sin and angle fl(c N f) of the chunk starts (NCp >= NC)


def rope_tables(num_chunks: int, chunk: int, d: int, base: Any, pad_to: int = 1) -> RopeTables:
    """:class:`RopeTables` for NC = ``num_chunks`` chunks of N = ``chunk`` slots, head dim D and
    RoPE ``base`` (a float or an object with ``inv_freq``, :func:`kernels.rope.rope_angles`);
    the chunk axis of ``starts`` is padded to NCp, a multiple of ``pad_to`` (pad columns: chunks
    past NC, never read for a slot).

    Every angle comes from :func:`kernels.rope.rope_angles`, so the frequencies and the angle
    roundings are the reference's. Bytes: ``4 (D/2 + 3 N D/2 + 3 NCp D/2)``.
    """
    def planes(pos):  # [M] int32 -> [3, D/2, M]
        ang = rope_angles(pos, d, base)
        return jnp.stack([jnp.cos(ang), jnp.sin(ang), ang], axis=0).transpose(0, 2, 1)

    ncp = -(-num_chunks // pad_to) * pad_to
    freq = rope_angles(jnp.ones((1,), jnp.int32), d, base).T  # 1 * f: f exactly
    offsets = planes(jnp.arange(chunk, dtype=jnp.int32))
    starts = planes(jnp.arange(ncp, dtype=jnp.int32) * chunk)
    return RopeTables(freq, offsets, starts)


def rope_series_terms(slots: int, d: int, base: Any) -> int:
    """Terms m of the series :func:`rope_cos_sin` evaluates for the residual angle ``e`` of slot
    positions ``0 .. slots - 1``: the least m >= 1 whose Taylor remainder
    ``E^(2m + 2) / (2m + 2)!`` is below 2^-27 for the bound ``E = 2 ulp(max angle)`` on ``|e|``
    (three half-ulp roundings: of ``fl(p f)``, of the chunk start's and of the offset's angle).
    m = 1 up to angles of 2^17 rad (128k positions at f = 1), 2 up to 2^20, 7 at 2^24.

    Raises:
      ValueError: ``slots`` above 2^24 (positions would not be exact float32 integers).
    """
    if not 1 <= slots <= 2 ** 24:
        raise ValueError(f"in-kernel RoPE: {slots} slot positions; expected 1 .. 2^24 (float32 "
                         "represents positions exactly only up to 2^24)")
    if is_rope_frequencies(base):
        fmax = float(np.max(np.asarray(base.inv_freq(d), np.float64)))
    else:
        fmax = float(np.max(float(base) ** (-np.arange(0, d, 2) / d)))
    top = max((slots - 1) * fmax, 1.0)
    bound = 2.0 ** (math.floor(math.log2(top)) - 22)  # 2 ulp of the largest float32 angle
    m = 1
    while bound ** (2 * m + 2) / math.factorial(2 * m + 2) > 2.0 ** -27:
        m += 1
    return m


def _series(x2: jax.Array, coefs: list[float]) -> jax.Array:
    """``1 + x2 (coefs[0] + x2 (coefs[1] + ...))`` by Horner's rule: 2 len(coefs) FLOPs."""
    acc = coefs[-1]
    for c in reversed(coefs[:-1]):
        acc = c + x2 * acc
    return 1.0 + x2 * acc


def rope_cos_sin(pos: jax.Array, freq: jax.Array,
                 offset: tuple[jax.Array, jax.Array, jax.Array],
                 start: tuple[jax.Array, jax.Array, jax.Array], terms: int, zero: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
    """cos and sin float32 [w, T] of the reference's angles ``fl(p f)`` of T slots of one chunk.

    Args:
      pos: float32 [1, T] slot positions p = c N + j (exact integers below 2^24).
      freq: float32 [w, 1] frequencies f (:attr:`RopeTables.freq`).
      offset: cos, sin, angle [w, T] of the slots' offsets j (:attr:`RopeTables.offsets`).
      start: cos, sin, angle [w, 1] of the chunk start c N (:attr:`RopeTables.starts`).
      terms: m of :func:`rope_series_terms`.
      zero: int32 scalar that is 0 at run time but unknown to the compiler (the kernels pass
        ``min(num_quantized, 0)``; see below).

    ``A = fl(p f)`` is the reference's float32 product; ``A - B`` is exact (Sterbenz: ``B <= A <=
    2B`` for c >= 1, and B = 0 for c = 0), so ``e = (A - B) - b`` is the residual to float32
    precision, and ``cos A = cos(B + b) cos e - sin(B + b) sin e`` (likewise sin A) with
    ``cos(B + b)``, ``sin(B + b)`` from the tables by the addition formulas and ``cos e``, ``sin e``
    from their Taylor series (m terms). The offset and start angles must be loaded from memory
    (kernel operands), and the product must be rounded to float32 before the subtraction: a
    compiler that contracts ``p * f - B`` into a fused multiply-add (XLA CPU does, also through a
    ``where``) would yield the exact ``p f``, half an ulp of the angle away from the reference's
    (up to 4e-3 rad at p = 128k). So the product's bits are OR-ed with ``zero``: no floating-point
    contraction crosses an integer operation, and none can be folded away with an unknown operand.

    Result: within a few float32 ulps of ``cos(A)``, ``sin(A)`` (table roundings and the addition
    formulas); FLOPs per element ``17 + 4 m`` (the OR is an integer operation).
    """
    oc, os_, oa = offset
    sc, ss, sa = start
    ce, se = _cos_sin_series((_rounded_angle(pos, freq, zero) - sa) - oa, terms)
    c1 = sc * oc - ss * os_  # cos(B + b)
    s1 = ss * oc + sc * os_  # sin(B + b)
    return c1 * ce - s1 * se, s1 * ce + c1 * se


def rope_start_table(num_chunks: int, chunk: int, d: int, base: Any, pad_to: int = 1
                     ) -> jax.Array:
    """float32 [2, D, NCp]: the cos and sin of the chunk starts' angles ``fl(c N f)`` (those of
    :attr:`RopeTables.starts`), chunks on the last axis, each frequency's value at channel i and
    i + D/2 (a kernel transposes a block of columns into query rows). The chunk axis is padded
    to NCp, a multiple of ``pad_to``.

    A kernel rotates the query back by the chunk start instead of rotating every key forward by
    it: ``q . R(B + a) k = (R(-B) q) . (R(a) k)`` (2-D rotations commute), with
    ``R(-B) q = q cos B + [q_2, -q_1] sin B`` for the halves ``q_1, q_2``. Bytes ``8 D NCp``."""
    ncp = -(-num_chunks // pad_to) * pad_to
    ang = rope_angles(jnp.arange(ncp, dtype=jnp.int32) * chunk, d, base)  # [NCp, D/2]
    both = jnp.concatenate([ang, ang], axis=-1)
    return jnp.stack([jnp.cos(both), jnp.sin(both)], axis=0).transpose(0, 2, 1)


def rope_cos_sin_from_start(pos: jax.Array, freq: jax.Array,
                            offset: tuple[jax.Array, jax.Array, jax.Array], start_angle: jax.Array,
                            terms: int, zero: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin float32 [w, T] of ``fl(p f) - B``, the reference's angle of T slots of one
    chunk less the chunk start's angle ``B = fl(c N f)`` (a query rotated back by B,
    :func:`rope_start_table`, supplies the rest).

    Args as :func:`rope_cos_sin`, with ``start_angle`` the float32 [w, 1] angle B (computed as
    :func:`kernels.rope.rope_angles` does, one float32 product) in place of the start's table.

    As there, ``e = (fl(p f) - B) - b`` is exact to float32 (Sterbenz), so the angle is ``b + e``:
    ``cos(b + e) = cos b cos e - sin b sin e`` and ``sin(b + e) = sin b cos e + cos b sin e`` with
    the offset's tabulated cos b, sin b and the m-term series of cos e, sin e. FLOPs per element
    ``11 + 4 m`` (6 fewer than :func:`rope_cos_sin`: no addition formula for the start).
    """
    oc, os_, oa = offset
    ce, se = _cos_sin_series((_rounded_angle(pos, freq, zero) - start_angle) - oa, terms)
    return oc * ce - os_ * se, os_ * ce + oc * se


def _rounded_angle(pos: jax.Array, freq: jax.Array, zero: jax.Array) -> jax.Array:
    """fl(p f) as float32, its bits OR-ed with the runtime ``zero`` so that no floating-point
    contraction folds the product into the subtractions that follow."""
    bits = lax.bitcast_convert_type(pos * freq, jnp.int32) | zero
    return lax.bitcast_convert_type(bits, jnp.float32)


def _cos_sin_series(e: jax.Array, terms: int) -> tuple[jax.Array, jax.Array]:
    """The m-term Taylor series of cos e and sin e (``terms`` = m)."""
    e2 = e * e
    ce = _series(e2, [(-1.0) ** i / math.factorial(2 * i) for i in range(1, terms + 1)])
    se = e * _series(e2, [(-1.0) ** i / math.factorial(2 * i + 1) for i in range(1, terms + 1)])
    return ce, se


def check_inputs(q, k_code, v_code, cfg, num_new: int) -> None:
    """Raises ValueError on inconsistent shapes (codes [B, K, NC, P, N], tokens minor)."""
    b, kh, r, d = q.shape
    cfg.check_head_dim(d)
    if num_new < 1 or r % num_new:
        raise ValueError(f"num_new={num_new} must be >= 1 and divide the {r} query rows")
    p, nb = d * cfg.bits // 8, d // cfg.block
    for name, code in (("k_code", k_code), ("v_code", v_code)):
        if code.codes.ndim != 5 or code.codes.shape[:2] != (b, kh) or code.codes.shape[3] != p:
            raise ValueError(f"{name}.codes has shape {code.codes.shape}; expected "
                             f"[{b}, {kh}, NC, {p}, N] (tokens minor)")
        nc, n = code.codes.shape[2], code.codes.shape[4]
        if code.scales.shape != (b, kh, nc, nb, n):
            raise ValueError(f"{name}.scales has shape {code.scales.shape}; expected "
                             f"[{b}, {kh}, {nc}, {nb}, {n}] (tokens minor)")
        if code.assign.shape[3] != cfg.stages:
            raise ValueError(f"{name} has {code.assign.shape[3]} stages; cfg.stages={cfg.stages}")
