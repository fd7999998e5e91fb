"""Float64 oracles for the KV-cache attention kernels, written from the documented definitions.

Nothing here calls the code under test: the bit unpacking follows the storage format stated in
``kernels/sparse_decode/reference.py`` and ``kernels/kv_quant/reference.py`` (planar packing),
dequantization follows the papers' formulas, RoPE is the standard half-split rotation (Su et al.
2021, RoFormer, Sec. 3.4.2) with exact float64 frequencies, FFD's page selection is the top-delta
rule (Faster Flash Decoding, Sec. 3) re-implemented from its description, and attention is a
float64 softmax. Stored low-precision numbers (bfloat16, float8) are read with ``ml_dtypes``
through NumPy.

Each oracle also returns a per-element tolerance from a rounding-error analysis of the float32
computation the implementations perform (not from observed errors):

* a float32 inner product of n terms is off by at most ``gamma(n) * sum_c |x_c y_c|`` with the
  probabilistic constant ``gamma(n) = exp(LAMBDA sqrt(n) u + n u^2 / (1 - u)) - 1`` of Higham and
  Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41 (2019)
  (rounding errors modelled as independent and mean zero; u = 2^-24, float32's unit roundoff); a
  key formed from several stored terms (dequantization, RoPE) adds the rounding of those terms,
  bounded by their absolute values ("key_abs" below);
* a logit error ``e_i`` moves softmax weight ``w_i`` to ``w_i'`` with
  ``|w_i' / w_i - 1| <= r_i = max(exp(e_i + sum_j w_j e_j) - 1, 1 - exp(-e_i) / sum_j w_j exp(e_j))``
  (Jensen's inequality bounds the normaliser), and by no more than the other slots can give up
  (``sum_{j != i} w_j r_j``); since the weights sum to one the output moves by at most
  ``sum_i |w_i' - w_i| |v_i - out|``: only slots that carry weight count, so a logit of 1e5 on a
  slot of weight 1e-300 costs nothing, and neither does the error of a dominant slot's logit;
* the weighted sum of values is a float32 sum (the same ``gamma`` on ``sum_i w_i |v_i|``), with one
  more rounding per online-softmax rescaling block;
* below float32's smallest normal number (2^-126) weights, products and sums may flush to zero:
  an absolute ``2^-126`` times the largest value per term.

Dimensions: B batch, K kv heads, G query heads per kv head, R query rows per kv head, D head dim,
S slots, P pages, p page size, N chunk size, NC chunks, W packed words per vector.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

U32 = 2.0 ** -24  # float32 unit roundoff
F32_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32, 2^-126
BF16_REL = 2.0 ** -8  # bfloat16 round-to-nearest: half an ulp, relative to the value
LAMBDA = 4.0  # the bound's confidence parameter: an error beyond it needs the n roundings to line
#               up, with a probability that decays like exp(-LAMBDA^2 / 2)


def f64(x) -> np.ndarray:
    """Any array (JAX, NumPy, bfloat16 / float8 through ml_dtypes) as float64 NumPy."""
    return np.asarray(x).astype(np.float64)


def gamma(n) -> np.ndarray:
    """Higham and Mary's probabilistic constant for n float32 roundings (see the module docstring)."""
    n = np.asarray(n, np.float64)
    return np.expm1(LAMBDA * np.sqrt(n) * U32 + n * U32 ** 2 / (1 - U32))


# -- storage formats ------------------------------------------------------------------------------


def unpack_planar(words, bits: int) -> np.ndarray:
    """Unsigned ``bits``-bit codes int64 [..., D] from planar-packed words [..., W].

    The documented layout: with ``n = word_bits / bits`` codes per word and ``W`` words, channel
    ``d`` lies in word ``d % W`` at bit offset ``bits * (d // W)``. Words are uint8 (8-bit words)
    or int32 (32-bit words, read as the bits of a uint32).
    """
    w = np.asarray(words)
    if w.dtype == np.int32:
        w, word_bits = w.view(np.uint32), 32
    elif w.dtype == np.uint8:
        word_bits = 8
    else:
        raise ValueError(f"unpack_planar: words must be uint8 or int32, got {w.dtype}")
    nw = w.shape[-1]
    d = np.arange(nw * (word_bits // bits))
    planes = w[..., d % nw].astype(np.int64)
    return (planes >> (bits * (d // nw))) & ((1 << bits) - 1)


def rope_rotate(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Half-split RoPE (RoFormer Sec. 3.4.2) in float64: pairs ``(x_i, x_{i + D/2})`` of
    ``x [..., S, D]`` rotated by ``positions[s] * base^(-2i / D)`` (``positions`` [S])."""
    d = x.shape[-1]
    theta = positions[:, None].astype(np.float64) * base ** (-2.0 * np.arange(d // 2) / d)
    c, s = np.cos(theta), np.sin(theta)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rope_angle_error(positions: np.ndarray, d: int, base: float) -> np.ndarray:
    """Bound [S, D/2] on the float32 error (radians, as an error of cos and sin) of the rotation
    angles ``pos * base^(-2i/D)``: the frequency from float32 ``pow`` (``exp(y ln base)``, relative
    error about ``2 |ln base| u``), the product with the position (u), angle addition from two
    tabulated angles and the cos / sin evaluations (a few u absolute)."""
    f = base ** (-2.0 * np.arange(d // 2) / d)
    rel = (2.0 * abs(math.log(base)) + 6.0) * U32
    return positions[:, None].astype(np.float64) * f * rel + 10.0 * U32


# -- attention with its error bound ---------------------------------------------------------------


class Attention(NamedTuple):
    """A float64 oracle result: ``out`` [..., R, D], ``lse`` [..., R] (natural log; -inf for a row
    that sees nothing), and the error bounds ``out_tol`` [..., R, D], ``lse_tol`` [..., R] of a
    float32 evaluation (module docstring)."""

    out: np.ndarray
    lse: np.ndarray
    out_tol: np.ndarray
    lse_tol: np.ndarray


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, *,
              logit_err: np.ndarray, value_abs: np.ndarray | None = None,
              value_terms: int = 0, blocks: int = 1) -> Attention:
    """Softmax attention in float64 with the float32 error bound.

    Args:
      q: [..., R, D] query rows; k, v: [..., S, D]; mask: bool broadcastable to [..., R, S].
      logit_err: [..., R, S] bound on the float32 error of each (scaled) logit from the inner
        product and the key's own rounding (see :func:`dot_error`).
      value_abs: [..., S, D] the absolute values of the terms each value is formed from (default
        ``|v|``: stored exactly); value_terms: roundings in forming one value (0: stored exactly).
      blocks: online-softmax blocks (each rescales the running sum once more).
    """
    d = q.shape[-1]
    mask = np.broadcast_to(mask, q.shape[:-1] + (k.shape[-2],))
    logits = np.einsum("...rd,...sd->...rs", q, k) / math.sqrt(d)
    logits = np.where(mask, logits, -np.inf)
    m = logits.max(-1, keepdims=True, initial=-np.inf)
    seen = np.isfinite(m)
    m = np.where(seen, m, 0.0)
    w = np.exp(logits - m)
    l = w.sum(-1, keepdims=True)
    w = w / np.where(seen, l, 1.0)
    out = np.einsum("...rs,...sd->...rd", w, v)
    lse = np.where(seen[..., 0], m[..., 0] + np.log(np.where(seen, l, 1.0))[..., 0], -np.inf)

    # logit error: the inner product, the subtraction of the running maximum, exp, and the
    # log-sum-exp merges of partials (relative u on |logit| and |max| each)
    finite = np.where(mask, logits, 0.0)
    e = logit_err + 2 * U32 * (np.abs(finite) + np.abs(m)) + 4 * U32
    e = np.where(mask, np.minimum(e, 600.0), 0.0)
    e_bar = (w * e).sum(-1, keepdims=True)
    big_u = (w * np.exp(e)).sum(-1, keepdims=True)
    big_u = np.where(seen, big_u, 1.0)
    # e + e_bar is capped below float64's exp overflow (709): past it the bound is vacuous
    # anyway (dw is capped by max(w, 1 - w) below), and an inf r times a zero weight was NaN
    r = np.maximum(np.expm1(np.minimum(e + e_bar, 700.0)), -np.expm1(-e - np.log(big_u)))
    wr = np.where(mask, w * r, 0.0)
    # |w_i' - w_i| <= w_i r_i; also <= sum_{j != i} w_j r_j (the weights sum to one) and
    # <= max(w_i, 1 - w_i) (they lie in [0, 1]): the dominant slot of a peaked row moves by the
    # little the others can take from it
    dw = np.minimum(np.minimum(wr, wr.sum(-1, keepdims=True) - wr), np.maximum(w, 1 - w))
    dw = np.where(mask, np.maximum(dw, 0.0), 0.0)
    diff = np.abs(v[..., None, :, :] - out[..., :, None, :])  # [..., R, S, D]
    t_weights = np.einsum("...rs,...rsd->...rd", dw, diff)
    vabs = np.abs(v) if value_abs is None else value_abs
    visible = mask.sum(-1)[..., None]  # [..., R, 1]
    acc_err = gamma(visible + value_terms + 2 * blocks + 4)
    t_sum = acc_err * np.einsum("...rs,...sd->...rd", np.minimum(w + dw, 1.0), vabs)
    # float32's range: weights below its smallest normal number (about exp(-87) of the largest)
    # and tiny products or sums may flush to zero, each losing up to F32_TINY times a value
    v_top = np.max(np.where(mask[..., None], vabs[..., None, :, :], 0.0), axis=-2)  # [..., R, D]
    t_flush = (visible + 2 * blocks + 4) * F32_TINY * v_top
    out_tol = np.where(seen, t_weights + t_sum + t_flush, 0.0)
    lse_tol = np.where(seen[..., 0], np.log(big_u[..., 0]) + acc_err[..., 0]
                       + 2 * U32 * np.abs(np.where(seen[..., 0], lse, 0.0)), 0.0)
    return Attention(out, lse, out_tol, lse_tol)


def dot_error(q: np.ndarray, key_abs: np.ndarray, terms: int) -> np.ndarray:
    """[..., R, S]: ``gamma(terms) * sum_c |q_c| key_abs_c / sqrt(D)``, the error bound of the
    scaled float32 logits of ``q [..., R, D]`` against keys whose terms sum (in absolute value) to
    ``key_abs [..., S, D]``; ``terms`` counts every rounding along the way (D products and sums,
    the key's own roundings, the 1/sqrt(D) scaling)."""
    d = q.shape[-1]
    return gamma(terms) * np.einsum("...rd,...sd->...rs", np.abs(q), key_abs) / math.sqrt(d)


def assert_close(got, want: Attention, *, bf16_output: bool = False, lse=None,
                 what: str = "output") -> None:
    """Asserts ``|got - want.out| <= want.out_tol`` elementwise (plus half a bfloat16 ulp of the
    value when the output is bfloat16), and the same for ``lse`` when given (with -inf exactly where
    the oracle's is). Raises AssertionError naming the worst element and the tolerance as a
    fraction of the value range."""
    got = f64(got)
    if got.shape != want.out.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {want.out.shape}")
    tol = want.out_tol + (BF16_REL * (np.abs(want.out) + want.out_tol) if bf16_output else 0.0)
    err = np.abs(got - want.out)
    bad = ~(err <= tol)  # NaN fails
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - tol, -np.inf)), err.shape)
        span = float(np.abs(want.out).max())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements outside the float32 error bound; "
            f"worst at {tuple(int(x) for x in i)}: got {got[i]!r}, want {want.out[i]!r}, "
            f"|error| {err[i]:.3g} > tolerance {tol[i]:.3g} (largest tolerance "
            f"{float(tol.max()):.3g}, output range {span:.3g})")
    if lse is not None:
        lse = f64(lse)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want.lse),
                                      err_msg=f"{what}: rows that see no slot")
        seen = np.isfinite(want.lse)
        lerr = np.abs(lse[seen] - want.lse[seen])
        if not np.all(lerr <= want.lse_tol[seen]):
            j = int(np.argmax(lerr - want.lse_tol[seen]))
            raise AssertionError(f"{what}: log-sum-exp off by {lerr[j]:.3g} > tolerance "
                                 f"{want.lse_tol[seen][j]:.3g}")


# -- FFD ------------------------------------------------------------------------------------------


def ffd_quantized_keys(cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimated keys ``(c - 1.5) scale``, refined keys ``(c - 1.5 + resid) scale``, the refined
    keys' absolute terms ``scale (1.5 + c + |resid|)``) float64 [B, K, P, p, D] from the FFD cache
    fields (2-bit planar codes in token-minor int32 words [B, K, P, W, p], float32 scale, float8
    residual)."""
    c = unpack_planar(np.swapaxes(np.asarray(cache["codes"]), -1, -2), 2).astype(np.float64)
    scale = f64(cache["scale"])[..., None, :]
    resid = f64(cache["resid"])
    return (c - 1.5) * scale, (c - 1.5 + resid) * scale, (1.5 + c + np.abs(resid)) * scale


class Selection(NamedTuple):
    """FFD's kept pages by the rule (bool [B, K, P]) and the pages whose decision lies within the
    float32 rounding of the page estimates (``ambiguous``: either choice is correct)."""

    keep: np.ndarray
    ambiguous: np.ndarray


def ffd_select(q, cache, lengths, *, delta: float = 8.0, top_k: int | None = None,
               max_pages: int | None = None) -> Selection:
    """FFD's page selection (paper Sec. 3), from the rule's definition.

    ``m_j[g]``: the largest estimated logit ``q_g . k_hat / sqrt(D)`` over the slots of full page
    ``j``. Top-delta: ``theta[g] = max(m_0[g], m_last[g]) - delta`` from the first and last full
    pages, page ``j`` kept iff ``m_j[g] >= theta[g]`` for some head ``g`` of the group. Top-k:
    the ``min(k, full pages)`` pages of largest ``max_g m_j[g]``, ties to the lower index.
    ``max_pages``: then at most that many of the kept pages, by the same score. Pages that are
    not full are never kept (the tail page is attended separately).

    A decision is ambiguous when the float32 estimates could order it either way: the margin is
    the inner-product bound of the scan (terms ``|q_c| scale_c c`` and ``1.5 |q_c| scale_c`` of
    the ``(q scale) . c - 1.5 sum(q scale)`` form, or ``|q_c k_hat_c|``, whichever is larger) on
    both estimates. Equal float64 estimates (from identical keys) are equal in float32 too.
    """
    k_hat, _, _ = ffd_quantized_keys(cache)
    b, kh, n, p, d = k_hat.shape
    qg = f64(q).reshape(b, kh, -1, d)
    est = np.einsum("bkgd,bkptd->bkgpt", qg, k_hat) / math.sqrt(d)
    m = est.max(-1)  # [B, K, G, P]
    qs_abs = np.abs(qg)[:, :, :, None, :] * f64(cache["scale"])[:, :, None, :, :]
    err = gamma(d + 4) * 4.5 * qs_abs.sum(-1) / math.sqrt(d) + U32 * np.abs(m)  # [B, K, G, P]
    nf = np.asarray(lengths) // p
    keep = np.zeros((b, kh, n), bool)
    amb = np.zeros((b, kh, n), bool)
    for bi in range(b):
        f = int(nf[bi])
        if f == 0:
            continue
        mb, eb = m[bi, :, :, :f], err[bi, :, :, :f]  # [K, G, f]
        if top_k is not None:
            kb, ab = _top(mb.max(1), eb.max(1), np.ones((kh, f), bool), np.zeros((kh, f), bool),
                          top_k)
        elif math.isinf(delta):
            kb, ab = np.ones((kh, f), bool), np.zeros((kh, f), bool)
        else:
            ref_page = np.where(mb[..., 0] >= mb[..., f - 1], 0, f - 1)  # [K, G]
            m_ref = np.take_along_axis(mb, ref_page[..., None], -1)  # [K, G, 1]
            e_ref = np.take_along_axis(eb, ref_page[..., None], -1)
            theta = m_ref - delta
            diff = mb - theta
            # identical estimates round identically: then only theta's own rounding is left
            margin = np.where(mb == m_ref, U32 * np.abs(theta) if delta else 0.0,
                              eb + e_ref + U32 * np.abs(theta))
            sure_keep = (diff > margin) | ((diff >= 0) & (margin == 0))
            sure_drop = diff < -margin
            kb = sure_keep.any(1)
            ab = ~kb & ~sure_drop.all(1)
        if max_pages is not None and max_pages < n:
            kb, ab = _top(mb.max(1), eb.max(1), kb, ab, max_pages)
        keep[bi, :, :f], amb[bi, :, :f] = kb, ab
    return Selection(keep, amb)


def _top(score: np.ndarray, err: np.ndarray, cand: np.ndarray, amb: np.ndarray, k: int):
    """The ``k`` pages of largest score per row of ``score [K, F]`` (ties to the lower index) among
    the candidates ``cand | amb``. Ambiguous: the pages that were (``amb``), the pages whose rank
    an ambiguous candidate can shift across the cut, and the pages within the rounding error
    (``err``) of the k-th or (k+1)-th score without being exactly equal to it."""
    kh, f = score.shape
    keep = np.zeros((kh, f), bool)
    out_amb = amb.copy()
    for ki in range(kh):
        pool = np.flatnonzero(cand[ki] | amb[ki])
        order = pool[np.lexsort((pool, -score[ki, pool]))]
        keep[ki, order[:k]] = True
        if len(order) <= k:
            continue
        n_amb = int(amb[ki, pool].sum())
        out_amb[ki, order[max(k - n_amb, 0):k + n_amb]] = True
        for edge in order[k - 1:k + 1]:
            s_e, e_e = score[ki, edge], err[ki, edge]
            near = (np.abs(score[ki, order] - s_e) <= err[ki, order] + e_e) & (
                score[ki, order] != s_e)
            out_amb[ki, order[near]] = True
    return keep & ~out_amb, out_amb


def ffd_attention(q, cache, lengths, keep: np.ndarray) -> Attention:
    """Decode attention [B, H, D] over the refined keys of the kept full pages (``keep`` bool
    [B, K, P]) and the exact keys of the tail page (slots ``p * (length // p) .. length - 1``),
    with the FFD cache's bfloat16 values."""
    _, k_ref, k_abs = ffd_quantized_keys(cache)
    b, kh, n, p, d = k_ref.shape
    h = q.shape[1]
    g = h // kh
    lengths = np.asarray(lengths)
    nf = lengths // p
    tail = f64(cache["tail"])  # [B, K, p, D]
    vals = f64(cache["v"])  # [B, K, P, p, D]
    # slots: the P * p page slots, then the p tail slots
    keys = np.concatenate([k_ref.reshape(b, kh, n * p, d), tail], axis=2)
    key_abs = np.concatenate([k_abs.reshape(b, kh, n * p, d), np.abs(tail)], axis=2)
    tail_vals = np.stack([vals[bi, :, min(nf[bi], n - 1)] for bi in range(b)])
    values = np.concatenate([vals.reshape(b, kh, n * p, d), tail_vals], axis=2)
    page_slot = np.repeat(keep, p, axis=-1)  # [B, K, P * p]
    tail_slot = np.arange(p)[None, :] < (lengths % p)[:, None]  # [B, p]
    mask = np.concatenate([page_slot, np.broadcast_to(tail_slot[:, None], (b, kh, p))], -1)
    mask = mask[:, :, None, :]  # [B, K, 1, S]
    qg = f64(q).reshape(b, kh, g, d)
    err = dot_error(qg, key_abs, d + 4)
    att = attention(qg, keys, values, mask, logit_err=err, blocks=n + 2)
    return Attention(att.out.reshape(b, h, d), att.lse.reshape(b, h),
                     att.out_tol.reshape(b, h, d), att.lse_tol.reshape(b, h))


# -- QVG ------------------------------------------------------------------------------------------


def qvg_dequantize(codes, scales, assign, centroids, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """QVG dequantization (Quant VideoGen Sec. 3): ``x = sum_s C_s[a_s] + scale * (code - 2^(n-1))``
    per token, ``scale`` per block of ``D / NB`` channels. Fields [B, K, NC, ...] as in the cache,
    tokens minor: codes uint8 [.., P, N] (planar), scales [.., NB, N], assign [.., S, N], centroids
    [.., S, C, D]. Returns (x, the absolute sum of its terms) float64 [B, K, NC * N, D]."""
    codes, scales = np.swapaxes(np.asarray(codes), -1, -2), np.swapaxes(f64(scales), -1, -2)
    q = unpack_planar(codes, bits).astype(np.float64) - 2 ** (bits - 1)
    b, kh, nc, n, d = q.shape
    s = f64(scales)
    s = np.repeat(s, d // s.shape[-1], axis=-1)
    x = q * s
    xabs = np.abs(x)
    cents = f64(centroids)  # [B, K, NC, S, C, D]
    a = np.asarray(assign).astype(np.int64)  # [B, K, NC, S, N]
    for st in range(a.shape[3]):
        row = np.take_along_axis(cents[:, :, :, st], a[:, :, :, st, :, None], axis=3)
        x = x + row
        xabs = xabs + np.abs(row)
    return x.reshape(b, kh, nc * n, d), xabs.reshape(b, kh, nc * n, d)


def qvg_attention(q, k_code, v_code, *, bits: int, stages: int, start, num_quantized,
                  num_new: int, rope_base: float | None) -> Attention:
    """QVG chunk attention [B, K, R, D] (the contract of ``kernels.kv_quant.api.
    qvg_chunk_attention``): row ``r`` of batch ``b`` sits at position ``start[b] + r % T`` and
    attends slots ``s < num_quantized[b]`` with ``s <= position``; keys stored before RoPE are
    rotated to their slot positions when ``rope_base`` is set. ``k_code``, ``v_code``: objects
    with fields codes, scales, assign, centroids."""
    k, k_abs = qvg_dequantize(*k_code, bits)
    v, v_abs = qvg_dequantize(*v_code, bits)
    qf = f64(q)
    d = qf.shape[-1]
    slots = np.arange(k.shape[2])
    terms = d + stages + 4
    if rope_base is not None:
        pair = np.concatenate([k_abs[..., d // 2:], k_abs[..., : d // 2]], axis=-1)
        k = rope_rotate(k, slots, rope_base)
        k_abs = k_abs + pair  # |x1 cos - x2 sin| <= |x1| + |x2|
        dtheta = rope_angle_error(slots, d, rope_base)  # [S, D/2]
        dtheta = np.concatenate([dtheta, dtheta], axis=-1)
        err = (dot_error(qf, k_abs, terms + 3)
               + np.einsum("bkrd,bksd->bkrs", np.abs(qf), k_abs * dtheta) / math.sqrt(d))
    else:
        err = dot_error(qf, k_abs, terms)
    rows = qf.shape[2]
    pos = np.asarray(start)[:, None] + np.arange(rows) % num_new  # [B, R]
    mask = ((slots[None, None] < np.asarray(num_quantized)[:, None, None])
            & (slots[None, None] <= pos[..., None]))[:, None]  # [B, 1, R, S]
    return attention(qf, k, v, mask, logit_err=err, value_abs=v_abs, value_terms=stages,
                     blocks=k_code[0].shape[2] + 2)


# -- KIVI -----------------------------------------------------------------------------------------


def kivi_attention(q, k_code, window_k, v_code, ring, *, bits: int, group: int, block: int,
                   residual: int, start, num_new: int) -> Attention:
    """KIVI decode attention [B, K, R, D] over the cache's contents (KIVI, Sec. 3.3, Alg. 1), with
    ``length = start + T`` and N = ``residual``:

    * keys: slots below ``nq = N floor(length / N)`` are quantized per channel in chunks of N
      (``k = zero + scale * code``, statistics per group of ``group`` tokens; codes [B, K, NC, N, P],
      scale and zero [B, K, NC, N / group, D]); slots ``nq .. nq + N - 1`` hold the exact keys
      ``window_k [B, K, N, D]``;
    * values: the last N positions are exact, position ``s`` at ``ring[..., s % N, :]``; before
      them, per token (``v = zero + scale * code``, scale and zero per block of ``block`` channels;
      codes [B, K, NC * N, P], scale and zero [B, K, NC * N, D / block]);
    * row ``r`` (new token ``r % T``) sits at ``start + r % T`` and attends slots ``s < length``
      with ``s <= position``.
    """
    kc, ks, kz = k_code
    vc, vs, vz = v_code
    qf = f64(q)
    b, kh, nc, n, _ = np.asarray(kc).shape
    d = qf.shape[-1]
    code = unpack_planar(kc, bits).astype(np.float64).reshape(b, kh, nc, n // group, group, d)
    s, z = f64(ks)[:, :, :, :, None], f64(kz)[:, :, :, :, None]
    kq = (code * s + z).reshape(b, kh, nc * n, d)
    kq_abs = (code * s + np.abs(z)).reshape(b, kh, nc * n, d)
    vcode = unpack_planar(vc, bits).astype(np.float64)
    vsc = np.repeat(f64(vs), block, axis=-1)
    vzr = np.repeat(f64(vz), block, axis=-1)
    vq, vq_abs = vcode * vsc + vzr, vcode * vsc + np.abs(vzr)
    wk, rg = f64(window_k), f64(ring)
    start = np.asarray(start)
    length = start + num_new
    nq = (length // n) * n
    sp = nc * n
    keys, k_abs, vals, v_abs = kq.copy(), kq_abs.copy(), vq.copy(), vq_abs.copy()
    for bi in range(b):
        for sl in range(nq[bi], min(nq[bi] + n, sp)):
            keys[bi, :, sl] = wk[bi, :, sl - nq[bi]]
            k_abs[bi, :, sl] = np.abs(wk[bi, :, sl - nq[bi]])
        for sl in range(max(length[bi] - n, 0), length[bi]):
            vals[bi, :, sl] = rg[bi, :, sl % n]
            v_abs[bi, :, sl] = np.abs(rg[bi, :, sl % n])
    rows = qf.shape[2]
    pos = start[:, None] + np.arange(rows) % num_new
    slots = np.arange(sp)
    mask = ((slots[None, None] < length[:, None, None])
            & (slots[None, None] <= pos[..., None]))[:, None]
    err = dot_error(qf, k_abs, d + 5)
    return attention(qf, keys, vals, mask, logit_err=err, value_abs=v_abs, value_terms=1,
                     blocks=nc + 3)
