"""FFD decode attention as an XLA program: the CPU path (``implementation="xla"``).

Dimensions as in :mod:`kernels.sparse_decode.reference`: B batch, H query heads, K kv heads, G query
heads per kv head, D head dim, p page size, P pages, M gathered page slots.

* :func:`ffd_decode_xla`: gather of the kept pages into ``M = min(max_pages, P)`` static slots per
  (row, kv head), refinement from the byte-per-code scan copy (or the packed words) and the float8
  residuals (:func:`f8_to_f32`), softmax, LSE merge with the tail page. It attends the pages it is
  given, so with the rule's mask (:func:`kernels.sparse_decode.reference.ffd_keep`) it agrees with
  the reference to float32 rounding.
* :func:`ffd_keep_superset`: the page selection of ``ffd_decode(..., xla_scan="int8")``, an int8 x
  int8 -> int32 scan with a proven margin that keeps a superset of the rule's pages.

The int8 selection
------------------

Dimensions as in :mod:`kernels.sparse_decode.reference`: B batch, K kv heads, G query heads per kv
head, D head dim, p page size, P pages.

The reference rule (:func:`kernels.sparse_decode.reference.ffd_keep`, paper Sec. 3) estimates each
page's largest logit ``m_j[g] = max_t (qs_j . c_t - 1.5 sum_d qs_j[d])`` with the per-page scaled
query ``qs_j = q_g * scale_j / sqrt(D)`` (float32 [D]) and the 2-bit codes ``c_t`` in {0..3}, and
keeps page ``j`` iff ``m_j[g] >= max(m_first[g], m_last[g]) - delta`` for some ``g``. On a CPU the
float32 product over byte codes converts every code to float32 first; here the product runs on
int8 operands with int32 accumulation instead, which XLA:CPU computes without that conversion.

Quantized query (per row, kv head, query head and page): ``a = max_d |qs[d]| / 127``,
``Q[d] = round(qs[d] / a)`` int8 in [-127, 127], and the page estimate

    m'_j = a * max_t (Q . c_t - 1.5 sum_d Q[d])          (integers exact in int32)

**Margin (the superset guarantee).** For every token t,
``|(a Q - qs) . (c_t - 1.5)| <= sum_d |a Q[d] - qs[d]| * max|c - 1.5| = 1.5 E`` with
``E = sum_d |a Q[d] - qs[d]|`` (computed per page; at most ``D a / 2``), so the maxima over t obey
``|m'_j - m_j| <= 1.5 E_j`` in exact arithmetic. Float32 rounding adds at most
``gamma(D + 4) (4.5 S + |m|)`` to the reference's estimate (``S = sum_d |qs[d]|``; the scan's D
products and sums, the offset, the subtraction) and about ``gamma(D + 1) (2 S + a D) + u |m'|`` to
this one (computing E; the int32 result is exact and is scaled by one multiplication), so with

    mu_j = 1.5 E_j + (D + 8) 2^-23 (8 S_j + 2 a_j D + 2 |m'_j|)

``|m'_j - m_j| <= mu_j`` holds for the float32 values both paths compute. The kept set is

    keep_j  iff  m'_j + mu_j >= max(m'_first - mu_first, m'_last - mu_last) - delta - tol

for some query head of the group (``tol = 2^-21 (|m'_j + mu_j| + |theta'|)`` absorbs the rounding
of this comparison and of the reference's ``theta``). If the reference keeps page j then
``m_j >= max(m_first, m_last) - delta``, hence ``m'_j + mu_j >= m_j >= max(m'_first - mu_first,
m'_last - mu_last) - delta``: every page of the reference rule is kept (a superset). A page outside
the rule is kept only when its estimate lies within ``mu_j + mu_ref`` of the threshold.

Non-finite input: a NaN or infinite scaled query on a page (from a NaN or infinite key) makes that
page's estimate NaN, which keeps it (on a reference page: every page), as the reference does.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernels import attention_math
from kernels.attention_math import merge_partials, softmax_partial
from kernels.sparse_decode import reference as ref

# -- attention over the kept pages -------------------------------------------------------------


def f8_to_f32(x: jax.Array) -> jax.Array:
    """float8_e4m3fn -> float32 by bit arithmetic (exact for every value; the NaN codes
    ``S.1111.111`` decode to NaN). XLA's own conversion is emulated element by element on a CPU and
    ~8x slower than these integer ops."""
    u = lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    sign = (u >> 7) << 31
    e, m = (u >> 3) & 15, u & 7
    normal = lax.bitcast_convert_type(sign | ((e + 120) << 23) | (m << 20), jnp.float32)
    sub = jnp.where(u >> 7 == 1, -1.0, 1.0) * m.astype(jnp.float32) * (2.0 ** -9)
    return jnp.where((u & 0x7F) == 0x7F, jnp.nan, jnp.where(e == 0, sub, normal))


def gather_pages(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x [B, K, P, ...] gathered at page indices idx int [B, K, M] -> [B, K, M, ...].

    Per-(row, head) indexing under ``vmap``: XLA on a CPU copies whole contiguous pages this way,
    several times faster than ``take_along_axis`` with broadcast indices."""
    return jax.vmap(jax.vmap(lambda a, i: a[i]))(x, idx)


def ffd_decode_xla(q: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array, *,
                   delta: float = 8.0, top_k: int | None = None, max_pages: int | None = None,
                   keep: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """FFD decode attention as an XLA program: the packed scan and selection
    (:func:`kernels.sparse_decode.reference.ffd_keep`) unless ``keep`` is given, gather of the kept
    pages into ``M = min(max_pages, P)`` slots per (row, kv head), refinement and softmax, LSE
    merge with the tail.

    Arguments as :func:`kernels.sparse_decode.reference.ffd_decode_reference` (``keep``, when
    given, must hold at most ``M`` pages per (row, kv head), as
    :func:`kernels.sparse_decode.reference.ffd_keep` with the same ``max_pages`` does);
    ``max_pages`` is also the static gather budget. The same pages as the reference are attended,
    so the two agree to float32 rounding.

    Returns:
      (out [B, H, D] in ``q``'s dtype, keep bool [B, K, P] of the attended pages).
    """
    b, h, d = q.shape
    kh, n, p = cache["resid"].shape[1], cache["resid"].shape[2], cache["resid"].shape[3]
    m_slots = n if max_pages is None else max(1, min(int(max_pages), n))
    qg = attention_math.grouped_query(q, kh)
    if keep is None:
        keep = ref.ffd_keep(q, cache, lengths, delta, top_k, max_pages)
    idx, count = ref.page_list(keep, m_slots)  # [B, K, M], [B, K]
    ok = jnp.arange(m_slots)[None, None, :] < count[..., None]

    def gather(x):
        return gather_pages(x, idx)

    # refined logit = (q * scale) . (c - 1.5 + resid): per-page query scaling keeps the product a
    # batch of small [G, D] x [D, p] matmuls over byte-sized operands
    qs = qg[:, :, :, None, :] * gather(cache["scale"])[:, :, None]  # [B, K, G, M, D]
    codes = (gather(cache["codes_i8"]) if "codes_i8" in cache
             else ref.unpack_codes(ref.token_major_codes(gather(cache["codes"]))))
    x = codes.astype(jnp.float32) - 1.5 + f8_to_f32(gather(cache["resid"]))
    logits = jnp.einsum("bkgmd,bkmtd->bkgmt", qs, x)
    logits = jnp.where(ok[:, :, None, :, None], logits, -jnp.inf).reshape(b, kh, -1, m_slots * p)
    v = jnp.where(ok[..., None, None], gather(cache["v"]), 0)  # empty slots: no NaN leaks in
    acc, m, l = softmax_partial(logits, v.reshape(b, kh, m_slots * p, d))
    ta, tm, tl = ref.tail_partial(qg, cache, lengths)
    out = merge_partials(jnp.stack([acc, ta], 2), jnp.stack([m, tm], 2), jnp.stack([l, tl], 2), 2)
    return out.reshape(b, h, d).astype(q.dtype), keep


# -- the int8 page selection (``xla_scan="int8"``) ----------------------------------------------

QUERY_LEVELS = 127  # int8 query codes in [-127, 127]
# The comparison's own rounding (a few float32 ulps of the compared values, with room to spare).
COMPARE_TOL = 2.0 ** -21


def quantize_query(qs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Symmetric int8 quantization of scaled queries over their last axis.

    Args:
      qs: float32 [..., D], the per-page scaled queries ``q * scale / sqrt(D)``.

    Returns:
      (Q int8 [..., D] in [-127, 127], a float32 [...] (the step; 1 where ``qs`` is all zero),
      err float32 [...] = ``sum_d |a Q[d] - qs[d]|``, s float32 [...] = ``sum_d |qs[d]|``); ``a``,
      ``err`` and ``s`` are NaN where ``qs`` holds a NaN or an infinity.
    """
    mag = jnp.abs(qs)
    amax = mag.max(-1)
    finite = jnp.isfinite(qs).all(-1)
    step = amax / QUERY_LEVELS
    step = jnp.where((step > 0) & finite, step, 1.0)
    codes = jnp.clip(jnp.round(qs / step[..., None]), -QUERY_LEVELS, QUERY_LEVELS)
    codes = jnp.where(jnp.isfinite(codes), codes, 0.0)
    err = jnp.abs(step[..., None] * codes - qs).sum(-1)
    nan = jnp.where(finite, 0.0, jnp.nan)
    return codes.astype(jnp.int8), step + nan, err + nan, mag.sum(-1) + nan


def page_bounds(qg: jax.Array, codes_i8: jax.Array, scale: jax.Array, num_full: jax.Array
                ) -> tuple[jax.Array, jax.Array]:
    """The int8 scan: page estimates and their margins (module docstring).

    Args:
      qg: float32 [B, K, G, D], queries already divided by sqrt(D).
      codes_i8: int8 [B, K, P, p, D], the 2-bit codes one per byte (the cache's ``codes_i8``; int8,
        as the product reads it: a uint8 copy would be converted, a full extra pass over the codes).
      scale: float32 [B, K, P, D], the per-page channel scales.
      num_full: int [B], full pages per row.

    Returns:
      (m' float32 [B, K, G, P], mu float32 [B, K, G, P]) with ``|m' - m| <= mu`` for the reference
      scan's float32 estimate ``m`` (:func:`kernels.sparse_decode.reference.ffd_scan_page_max`);
      ``m' = -inf``, ``mu = 0`` on pages that are not full; NaN on pages with a non-finite scaled
      query.
    """
    d = qg.shape[-1]
    qs = qg[:, :, :, None, :] * scale[:, :, None, :, :]  # [B, K, G, P, D], as the reference
    q8, step, err, s = quantize_query(qs)
    dots = jnp.einsum("bkgpd,bkptd->bkgpt", q8, codes_i8, preferred_element_type=jnp.int32)
    # 2 m' / a = 2 max_t Q.c_t - 3 sum Q: an integer below 1143 D in magnitude, exact in float32
    twice = 2 * dots.max(-1) - 3 * q8.astype(jnp.int32).sum(-1)
    est = twice.astype(jnp.float32) * (0.5 * step)
    mu = 1.5 * err + (d + 8) * 2.0 ** -23 * (8.0 * s + 2.0 * step * d + 2.0 * jnp.abs(est))
    full = (jnp.arange(est.shape[-1])[None, :] < num_full[:, None])[:, None, None, :]
    return jnp.where(full, est, -jnp.inf), jnp.where(full, mu, 0.0)


def select_superset(est: jax.Array, mu: jax.Array, num_full: jax.Array, delta,
                    max_pages: int | None = None) -> jax.Array:
    """bool [B, K, P]: the top-delta rule applied with the margins ``mu`` (a superset of the
    reference rule's pages, module docstring), then at most ``max_pages`` pages per (row, kv head),
    those with the largest upper bound ``max_g (m' + mu)`` (NaN first, ties to the lower index).

    ``est``, ``mu``: float32 [B, K, G, P] from :func:`page_bounds`; ``num_full`` int [B]; ``delta``
    in nats (>= 0; ``inf`` keeps every full page).
    """
    n = est.shape[-1]
    valid = (jnp.arange(n)[None, :] < num_full[:, None])[:, None, :]  # [B, 1, P]
    last = jnp.maximum(num_full - 1, 0)[:, None, None, None]
    lower = est - mu

    def at_last(x):
        return jnp.take_along_axis(x, jnp.broadcast_to(last, x.shape[:-1] + (1,)), axis=-1)[..., 0]

    theta = jnp.maximum(lower[..., 0], at_last(lower)) - delta  # [B, K, G]; NaN if either is
    upper = est + mu
    tol = COMPARE_TOL * (jnp.abs(upper) + jnp.abs(theta)[..., None])
    keep = jnp.any(~(upper + tol < theta[..., None]), axis=2) & valid  # NaN keeps
    if max_pages is not None and max_pages < n:
        score = ref.nan_max(upper, axis=2)
        keep = keep & ref.top_mask(jnp.where(keep, ref.rankable(score), -jnp.inf), max_pages)
    return keep


@functools.partial(jax.jit, static_argnames=("max_pages",))
def ffd_keep_superset(q: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array, delta,
                      max_pages: int | None = None) -> jax.Array:
    """bool [B, K, P]: the pages the XLA path attends under the top-delta rule: every page of
    :func:`kernels.sparse_decode.reference.ffd_keep` (when ``max_pages`` does not bind) and the
    pages within the scan's margin of the threshold (module docstring).

    Args:
      q: float [B, H, D] queries. cache: an FFD cache with the byte-per-code ``codes_i8`` copy
        (``init_ffd_cache(..., scan_copy=True)``). lengths: int32 [B] in 1..S. delta: nats, >= 0.
      max_pages: keep at most this many pages per (row, kv head), by upper bound.

    Raises:
      ValueError: the cache has no ``codes_i8`` copy.
    """
    if "codes_i8" not in cache:
        raise ValueError("ffd_keep_superset: the cache has no 'codes_i8' copy; build it with "
                         "init_ffd_cache(..., scan_copy=True) or use reference.ffd_keep")
    kh, p = cache["resid"].shape[1], cache["resid"].shape[3]
    qg = attention_math.grouped_query(q, kh)
    num_full = lengths // p
    est, mu = page_bounds(qg, cache["codes_i8"], cache["scale"], num_full)
    return select_superset(est, mu, num_full, delta, max_pages)


def margin_nats(q: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array) -> jax.Array:
    """float32 [B, K, G, P]: the margin ``mu`` of every page (0 on pages that are not full), for
    reporting how far the superset reaches beyond the threshold."""
    kh, p = cache["resid"].shape[1], cache["resid"].shape[3]
    qg = attention_math.grouped_query(q, kh)
    return page_bounds(qg, cache["codes_i8"], cache["scale"], lengths // p)[1]

