"""Quantized-cache decode attention with dequantization fused into the attention (XLA, CPU path).

Dimensions as in :mod:`kernels.kv_quant.reference`: B batch, K kv heads, R = G * T query rows per
kv head, D head dim, N tokens per chunk, NC chunks, P = D * bits / 8 packed bytes per token, NB
scale blocks per token, NG = N / group key groups (KIVI), S k-means stages, C centroids, W piece
width (below).

The jnp reference dequantizes the whole cache to float32 and then attends: it writes and reads
4 bytes per cached element on top of the codes, 8-10x the time of dense bfloat16 attention on a
CPU. Here a loop over the chunks (``lax.fori_loop``, flash-decoding style online softmax) reads one
chunk's packed codes per step, dequantizes it into pieces that stay in cache and attends to it at
once; chunks past the longest row's quantized prefix are not visited. So the bytes read per decode
step are the storage bytes: the bit-packed codes, scales, zeros, assignments and centroids (an
8-fold saving on 2-bit codes against bfloat16 before scales).

Pieces. Codes are packed planar (byte ``i`` holds channels ``i, i + P, ...``; see
:func:`kernels.packing.pack_codes`), so bit plane ``j`` of the packed bytes is the contiguous
channel range ``[j P, (j + 1) P)``: unpacking a plane is one shift and one mask of the bytes, with no
lane permutation and no concatenation (a concatenation inside an XLA CPU fusion selects its operand
per element and does not vectorise). A chunk is dequantized as D / W pieces [B, K, N, W] (W = P, or
D / 2 when one plane would straddle the two RoPE halves), each piece is contracted with its slice of
the query (logits = sum over pieces) and each value piece gives its slice of the output.

QVG keys stored before RoPE are rotated to their slot positions in the loop: piece ``i`` pairs with
piece ``i + D / 2W`` (half-split RoPE), with the cosines and sines of the chunk's positions computed
once per step and shared by every batch row and kv head.

KIVI follows the cache's layout (:class:`kernels.kv_quant.cache.KIVICache`): keys quantized per
channel in chunks of N = ``residual`` tokens with statistics over groups of ``group`` tokens,
values per token in a per-slot store; the last ``residual`` values are exact, so the loop covers
slots below ``length - residual`` and one more partial attends the last complete key chunk and the
incomplete one against the exact values of the ring.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from kernels import attention_math
from kernels.kv_quant.reference import KIVICode, KIVIConfig, QVGCode, QVGConfig
from kernels.rope import rope_angles


def _piece_width(d: int, bits: int, rope: bool) -> int:
    """W: a bit plane (P channels), halved when a plane would straddle the RoPE halves."""
    p = d * bits // 8
    return min(p, d // 2) if rope else p


def _unpacked_pieces(packed: jax.Array, bits: int, w: int) -> list[tuple[int, jax.Array]]:
    """(first channel, uint8 codes [..., W]) for every piece of packed bytes [..., P]."""
    p = packed.shape[-1]
    mask = jnp.uint8((1 << bits) - 1)
    out = []
    for j in range(8 // bits):
        plane = (packed >> jnp.uint8(bits * j)) & mask if bits < 8 else packed
        for b0 in range(0, p, w):
            piece = plane if w == p else lax.slice_in_dim(plane, b0, b0 + w, axis=-1)
            out.append((j * p + b0, piece))
    return out


def _block_scale(scales: jax.Array, c0: int, w: int, block: int) -> jax.Array:
    """Per-channel scales of channels [c0, c0 + W) from per-block scales [..., NB] as a float32
    array broadcastable to [..., W]: [..., 1] when the piece lies in one block."""
    if c0 // block == (c0 + w - 1) // block:
        return lax.slice_in_dim(scales, c0 // block, c0 // block + 1, axis=-1).astype(jnp.float32)
    idx = np.arange(c0, c0 + w) // block
    return jnp.take(scales, jnp.asarray(idx), axis=-1).astype(jnp.float32)


def _qvg_pieces(code: QVGCode, cfg: QVGConfig, w: int) -> list[jax.Array]:
    """float32 pieces [B, K, N, W] of one chunk: ``sum_s C_s[a_s] + scale * (code - 2^(n-1))``.

    ``code`` fields: codes [B, K, P, N], scales [B, K, NB, N], assign [B, K, S, N], centroids
    [B, K, S, C, D] (tokens minor, :class:`~kernels.kv_quant.reference.QVGCode`); one chunk's
    codes and scales are brought to tokens-major here (on the CPU path a transpose of one chunk
    costs what reading it does)."""
    code = code._replace(codes=jnp.swapaxes(code.codes, -1, -2),
                         scales=jnp.swapaxes(code.scales, -1, -2))
    offset = float(2 ** (cfg.bits - 1))
    cents = []
    for s in range(cfg.stages):
        a = code.assign[:, :, s].astype(jnp.int32)[..., None]  # [B, K, N, 1]
        cents.append(jnp.take_along_axis(code.centroids[:, :, s], a, axis=2))  # [B, K, N, D]
    pieces = []
    for c0, q in _unpacked_pieces(code.codes, cfg.bits, w):
        x = (q.astype(jnp.float32) - offset) * _block_scale(code.scales, c0, w, cfg.block)
        for cent in cents:
            x = x + lax.slice_in_dim(cent, c0, c0 + w, axis=-1).astype(jnp.float32)
        pieces.append(x)
    return pieces


def rope_tables(n: int, num_chunks: int, d: int, rope_base) -> tuple[jax.Array, ...]:
    """cos, sin float32 [N, D/2] of the angles of in-chunk offsets 0 .. N-1 and cos, sin
    float32 [NC, D/2] of the chunk starts 0, N, 2N, ... (computed once per call)."""
    ang = rope_angles(jnp.arange(n, dtype=jnp.int32), d, rope_base)
    ang0 = rope_angles(jnp.arange(num_chunks, dtype=jnp.int32) * n, d, rope_base)
    return jnp.cos(ang), jnp.sin(ang), jnp.cos(ang0), jnp.sin(ang0)


def _rotate(pieces: list[jax.Array], c: jax.Array, tables: tuple[jax.Array, ...]
            ) -> list[jax.Array]:
    """Half-split RoPE on chunk ``c``'s pieces [B, K, N, W] at positions ``c N + 0 .. N-1``.

    Piece i pairs with piece i + len / 2. The angles are ``(c N + j) f`` by angle addition from
    :func:`rope_tables`, so the loop evaluates no sine or cosine: XLA CPU fuses them into every
    piece's loop and evaluates them per element (measured 7-15x slower than the whole fused
    attention without RoPE at 16k slots). The rotation then differs from the reference's
    ``float32(pos) * f`` angle by float32 rounding of the two products and the sum (about
    ``eps * pos * f`` radians, the size of the reference's own rounding of the angle).
    """
    cj, sj, c0, s0 = tables
    c0 = lax.dynamic_index_in_dim(c0, c, axis=0)  # [1, D/2]
    s0 = lax.dynamic_index_in_dim(s0, c, axis=0)
    cos = cj * c0 - sj * s0  # cos((c N + j) f), [N, D/2]
    sin = sj * c0 + cj * s0
    h = len(pieces) // 2
    w = pieces[0].shape[-1]
    first, second = [], []
    for i in range(h):
        cw = lax.slice_in_dim(cos, i * w, (i + 1) * w, axis=-1)
        sw = lax.slice_in_dim(sin, i * w, (i + 1) * w, axis=-1)
        x1, x2 = pieces[i], pieces[i + h]
        first.append(x1 * cw - x2 * sw)
        second.append(x2 * cw + x1 * sw)
    return first + second


def _logits(q_pieces: list[jax.Array], k_pieces: list[jax.Array]) -> jax.Array:
    """sum_i q_i . k_i: [B, K, R, W] x [B, K, N, W] -> float32 [B, K, R, N]."""
    out = None
    for qx, kx in zip(q_pieces, k_pieces, strict=True):
        part = jnp.einsum("bkrw,bknw->bkrn", qx, kx, precision=lax.Precision.HIGHEST)
        out = part if out is None else out + part
    return out


def _split(x: jax.Array, w: int) -> list[jax.Array]:
    return [lax.slice_in_dim(x, c0, c0 + w, axis=-1) for c0 in range(0, x.shape[-1], w)]


def _online_chunks(qr: jax.Array, num_steps: jax.Array, w: int, step_fn) -> tuple[jax.Array, ...]:
    """Online softmax over ``num_steps`` chunks (``lax.fori_loop``).

    ``step_fn(c, q_pieces) -> (logits float32 [B, K, R, N] (scaled, -inf where masked), value
    pieces [B, K, N, W])``. Returns the unnormalised partial (acc [B, K, R, D], m [B, K, R],
    l [B, K, R]) of :func:`kernels.attention_math.softmax_partial`.
    """
    b, kh, r, d = qr.shape
    q_pieces = _split(qr.astype(jnp.float32), w)

    def body(c, carry):
        acc, m, l = carry
        logits, v_pieces = step_fn(c, q_pieces)
        m_new = jnp.maximum(m, logits.max(-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        corr = jnp.exp(m - m_safe)
        p = jnp.exp(logits - m_safe[..., None])
        out = jnp.concatenate(
            [jnp.einsum("bkrn,bknw->bkrw", p, vx, precision=lax.Precision.HIGHEST)
             for vx in v_pieces], axis=-1)
        return corr[..., None] * acc + out, m_new, corr * l + p.sum(-1)

    init = (jnp.zeros((b, kh, r, d), jnp.float32), jnp.full((b, kh, r), -jnp.inf, jnp.float32),
            jnp.zeros((b, kh, r), jnp.float32))
    return lax.fori_loop(0, num_steps, body, init)


def _finish(acc, m, l):
    """(acc / l, m + log l), with (0, -inf) for rows that saw no slot (``l == 0``); a NaN logit
    or value (NaN ``l`` or ``acc``) gives NaN, as dense attention does."""
    empty = l == 0
    l_safe = jnp.where(empty, 1.0, l)
    out = jnp.where(empty[..., None], 0.0, acc / l_safe[..., None])
    return out, jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))


def _positions(start: jax.Array, rows: int, num_new: int) -> jax.Array:
    """int32 [B, R]: position of query row r of batch b (row r is new token r % T)."""
    return start[:, None] + jnp.arange(rows, dtype=jnp.int32) % num_new


def _chunk(code, c: jax.Array):
    """Fields [B, K, NC, ...] -> chunk ``c``'s fields [B, K, ...]."""
    return jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, c, axis=2, keepdims=False), code)


@functools.partial(jax.jit, static_argnames=("cfg", "num_new", "rope_base"))
def qvg_chunk_attention(q: jax.Array, k_code: QVGCode, v_code: QVGCode, cfg: QVGConfig,
                        start: jax.Array, num_quantized: jax.Array, num_new: int,
                        rope_base=None) -> tuple[jax.Array, jax.Array]:
    """Attention of q [B, K, R, D] over QVG chunks, dequantizing one chunk at a time (fused).

    Same contract as :func:`kernels.kv_quant.api.qvg_chunk_attention`: row r of batch b sits at
    position ``start[b] + r % num_new`` and sees slots ``s < num_quantized[b]`` with ``s <= pos``;
    keys stored before RoPE are rotated to their slot positions when ``rope_base`` is set.

    Args:
      q: float [B, K, R, D] (RoPE applied).
      k_code, v_code: :class:`~kernels.kv_quant.reference.QVGCode` fields [B, K, NC, ...].
      cfg: the config the codes were made with.
      start, num_quantized: int32 [B].
      num_new: T.
      rope_base: a float base or an object with ``inv_freq`` (see
        :func:`kernels.rope.rope_angles`); None when keys were stored after RoPE.

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]); rows that see no slot get (0, -inf).
    """
    b, kh, r, d = q.shape
    n = k_code.codes.shape[4]
    rope = rope_base is not None
    w = _piece_width(d, cfg.bits, rope)
    pos = _positions(start.astype(jnp.int32), r, num_new)  # [B, R]
    nq = num_quantized.astype(jnp.int32)
    scale = 1.0 / math.sqrt(d)
    tables = rope_tables(n, k_code.codes.shape[2], d, rope_base) if rope else None

    def step(c, q_pieces):
        slots = c * n + jnp.arange(n, dtype=jnp.int32)
        kp = _qvg_pieces(_chunk(k_code, c), cfg, w)
        if rope:
            kp = _rotate(kp, c, tables)
        logits = _logits(q_pieces, kp) * scale
        valid = (slots[None, None, :] < nq[:, None, None]) & (slots[None, None, :] <= pos[..., None])
        logits = jnp.where(valid[:, None], logits, -jnp.inf)
        return logits, _qvg_pieces(_chunk(v_code, c), cfg, w)

    steps = (jnp.max(nq) + n - 1) // n
    return _finish(*_online_chunks(q, steps, w, step))


def _kivi_key_pieces(code: KIVICode, bits: int, group: int, w: int) -> list[jax.Array]:
    """float32 key pieces [B, K, N, W] of one chunk: ``zero + scale * code`` per channel over
    groups of ``group`` tokens (code fields: codes [B, K, N, P], scale, zero [B, K, NG, D])."""
    b, kh, n, _ = code.codes.shape
    pieces = []
    for c0, qc in _unpacked_pieces(code.codes, bits, w):
        s = lax.slice_in_dim(code.scale, c0, c0 + w, axis=-1).astype(jnp.float32)[:, :, :, None]
        z = lax.slice_in_dim(code.zero, c0, c0 + w, axis=-1).astype(jnp.float32)[:, :, :, None]
        x = qc.astype(jnp.float32).reshape(b, kh, n // group, group, w) * s + z
        pieces.append(x.reshape(b, kh, n, w))
    return pieces


def _kivi_value_pieces(code: KIVICode, bits: int, block: int, w: int) -> list[jax.Array]:
    """float32 value pieces [B, K, N, W]: ``zero + scale * code`` per token over blocks of
    ``block`` channels (code fields: codes [B, K, N, P], scale, zero [B, K, N, NB])."""
    pieces = []
    for c0, qc in _unpacked_pieces(code.codes, bits, w):
        pieces.append(qc.astype(jnp.float32) * _block_scale(code.scale, c0, w, block)
                      + _block_scale(code.zero, c0, w, block))
    return pieces


@functools.partial(jax.jit, static_argnames=("cfg", "num_new"))
def kivi_attention(q: jax.Array, k_code: KIVICode, window_k: jax.Array, v_code: KIVICode,
                   ring: jax.Array, cfg: KIVIConfig, start: jax.Array, num_new: int,
                   num_quantized: jax.Array | None = None) -> jax.Array:
    """KIVI decode attention with dequantization fused into the attention loop.

    Slots ``s < nq`` (``num_quantized``, default ``floor(length / N) N`` with ``length = start +
    T``, N = ``cfg.residual``) have quantized keys, slots ``nq + j`` the exact keys
    ``window_k[j]``; slots ``s >= length - N`` have exact values (the sliding window). The loop
    attends the quantized slots below ``min(nq, length - N)`` (quantized keys and values); one
    partial attends the last complete key chunk (quantized keys) and the window (exact keys),
    with the ring's exact values where ``s >= length - N`` and the per-token value codes before
    (window slots below ``length - N`` exist when the window holds more than N tokens); the two
    are merged by log-sum-exp.

    Args:
      q: float [B, K, R, D] query rows (R = G * T, row r is new token r % T).
      k_code: :class:`~kernels.kv_quant.reference.KIVICode`, fields [B, K, NC, ...] (per channel).
      window_k: [B, K, W, D] exact keys of positions ``nq .. nq + W - 1`` (W a multiple of N).
      v_code: per-token value codes, fields [B, K, SP, ...] (SP = NC * N slots).
      ring: [B, K, N, D] exact values, position p at ring slot p mod N.
      cfg: the KIVI config; start: int32 [B]; num_new: T; num_quantized: int32 [B] or None.

    Returns:
      float32 [B, K, R, D] (every row sees at least its own slot).
    """
    b, kh, r, d = q.shape
    n = cfg.residual
    wn = window_k.shape[2]
    w = _piece_width(d, cfg.bits, False)
    start = start.astype(jnp.int32)
    pos = _positions(start, r, num_new)
    length = start + num_new
    nq = (length // n) * n if num_quantized is None else num_quantized.astype(jnp.int32)
    old = length - n  # slots below it have quantized values
    low = jnp.minimum(old, nq)  # the loop's slots: quantized keys and values
    scale = 1.0 / math.sqrt(d)

    def step(c, q_pieces):
        slots = c * n + jnp.arange(n, dtype=jnp.int32)
        kp = _kivi_key_pieces(_chunk(k_code, c), cfg.bits, cfg.group, w)
        logits = _logits(q_pieces, kp) * scale
        valid = (slots[None, None, :] < low[:, None, None]) & (slots[None, None, :] <= pos[..., None])
        logits = jnp.where(valid[:, None], logits, -jnp.inf)
        vcode = jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, c * n, n, axis=2), v_code)
        return logits, _kivi_value_pieces(vcode, cfg.bits, cfg.block, w)

    steps = (jnp.max(low) + n - 1) // n
    acc, m, l = _online_chunks(q, jnp.maximum(steps, 0), w, step)
    o1, lse1 = _finish(acc, m, l)

    # The last complete key chunk (quantized keys) and the window (exact keys).
    last = jnp.maximum(nq // n - 1, 0)  # [B]
    k_last = jax.vmap(lambda code, c: jax.tree.map(
        lambda a: lax.dynamic_index_in_dim(a, c, axis=1, keepdims=False), code))(k_code, last)
    k_last = jax.tree.map(lambda a: a[:, :, None], k_last)  # fields [B, K, 1, ...]
    k_last = jnp.concatenate(_kivi_key_pieces(_chunk(k_last, 0), cfg.bits, cfg.group, w), -1)
    keys = jnp.concatenate([k_last, window_k.astype(jnp.float32)], axis=2)  # [B, K, N + W, D]
    # slot p -> ring[p mod N] (every block of N slots starts at a multiple of N)
    vals = jnp.concatenate([ring] * (1 + wn // n), axis=2).astype(jnp.float32)
    if wn > n:  # window slots nq .. nq + W - N - 1 may lie below length - N: their value codes
        vw = jax.vmap(lambda code, s0: jax.tree.map(
            lambda a: lax.dynamic_slice_in_dim(a, s0, wn - n, axis=1), code))(v_code, nq)
        vw = jnp.concatenate(_kivi_value_pieces(vw, cfg.bits, cfg.block, w), -1)
        # (a slice clamped at the store's end is never used: its slots lie past length - N)
        wslots = nq[:, None] + jnp.arange(wn - n)
        coded = (wslots < old[:, None])[:, None, :, None]
        vals = vals.at[:, :, n:wn].set(jnp.where(coded, vw, vals[:, :, n:wn]))
    slots = jnp.concatenate([last[:, None] * n + jnp.arange(n), nq[:, None] + jnp.arange(wn)], 1)
    in_last = jnp.concatenate([jnp.broadcast_to(nq[:, None] > 0, (b, n)) & (slots[:, :n] >= old[:, None]),
                               jnp.ones((b, wn), bool)], axis=1)
    valid = (in_last & (slots < length[:, None]))[:, None, :]
    valid = valid & (slots[:, None, :] <= pos[..., None])
    o2, lse2 = attention_math.partial_attention(q, keys, vals, valid[:, None])
    return attention_math.merge_lse(o1, lse1, o2, lse2)
