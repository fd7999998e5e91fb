"""Sparse long-context decode attention: the jnp specification of FFD (and the dense baseline).

Faster Flash Decoding (FFD, "Faster Flash Decoding", ICML 2026) decodes one token against a paged KV
cache by scanning a 2-bit quantized copy of the keys, keeping a page only when its estimated logit can
matter, and attending exactly (refined keys, bf16 values) over the kept pages. This module is what
the implementations must equal: the cache format, the selection rule (:func:`ffd_keep`) and the
attention over the kept pages (:func:`ffd_decode_reference`). The XLA path that runs on a CPU is
:mod:`kernels.sparse_decode.xla`, the kernels :mod:`kernels.sparse_decode.pallas_tpu` and
:mod:`kernels.sparse_decode.pallas_gpu`; the Quest baseline is :mod:`kernels.sparse_decode.quest`.

Dimensions: B batch, H query heads, K kv heads, G = H / K query heads per kv head, D head dim,
p page size (tokens per page), P pages (capacity S = P * p), W = D / 16 packed 32-bit words per key,
M gathered page slots, NS kernel splits.

FFD cache (a dict pytree, one per layer; "full" pages are those with all p slots written):

* ``codes``  int32 [B, K, P, W, p]: 2-bit codes c in {0..3}, 16 per 32-bit word (4 per byte),
  token-minor: one (W, p) tile per page (a single (8, 128) int32 tile at D = 128, p = 128, so a
  TPU stores it without lane padding). Channel ``d`` of token ``t`` lives in word ``[d % W, t]`` at
  bits ``2 * (d // W)`` ("planar" order: unpacking slab ``s`` yields the contiguous channels
  ``s*W .. s*W+W-1``, so kernels never permute lanes). :func:`quantize_pages` returns the
  token-major [.., p, W] words; :func:`token_major_codes` converts the stored layout back.
* ``scale``  float32 [B, K, P, D]: symmetric per-(page, kv head, channel) scale ``absmax / 1.5``;
  ``k_hat = (c - 1.5) * scale``.
* ``resid``  float8_e4m3fn [B, K, P, p, D]: ``(k - k_hat) / scale``, clipped to [-0.5, 0.5] (stored
  relative to the scale, so no finite key can overflow float8's range, max 448); refined key
  ``k_ref = (c - 1.5 + resid) * scale``. ``scale`` is float32, so it cannot overflow either.
* ``tail``   [B, K, p, D] in the model dtype: exact keys of the unfinished page ``length // p``.
* ``v``      bfloat16 [B, K, P, p, D]: values (a paged view of the sequence-contiguous layout).

Estimated and refined logits carry the ``1/sqrt(D)`` factor, so they are natural-log softmax logits.
Selection (top-delta, the paper's rule): with ``m_j[g]`` the largest estimated logit of full page
``j`` for query head ``g``, ``theta[g] = max(m_0[g], m_last[g]) - delta`` from the first and last full
pages only (no global pass), and page ``j`` is kept iff ``m_j[g] >= theta[g]`` for some ``g`` of the
kv group. ``delta`` is in nats here: a skipped page's estimated weights are below ``exp(-delta)``
times the largest estimated weight on the two reference pages. (The authors' kernel subtracts delta
from base-2 logits; their ``delta_2`` is ``delta_2 * ln 2`` nats, see :func:`delta_in_nats`.) The
top-k variant keeps exactly ``min(k, full pages)`` pages with the largest ``max_g m_j[g]`` (ties go to
the lower page index; it needs a global pass, like Quest). ``max_pages`` then caps the kept set at the
pages with the largest ``max_g m_j[g]``. The tail page is always attended.

The specification of the selection: :func:`ffd_keep` computes the kept-page mask; the reference
and the Pallas kernels attend exactly the pages of that rule (the kernels get the mask as a page
list, :func:`page_list`, except the TPU top-delta path, whose scan kernel applies the rule to its
own float32 estimates), so the page that sets the threshold is always kept and every row attends
at least one token. The XLA path on a CPU may attend a superset: its int8 scan
(:func:`kernels.sparse_decode.xla.ffd_keep_superset`) keeps every page of the rule plus the pages
within its proven quantization margin of the threshold.

Non-finite input: a NaN in a key within a row's length makes that page's estimated maximum NaN; NaN
compares as "keep" (for top-delta, a NaN on a reference page makes the threshold NaN and keeps every
page; for top-k and ``max_pages``, NaN ranks first), so the NaN reaches the row's output, which is
NaN, as with dense attention. A NaN value in an attended slot (kept page or tail) makes the output NaN
too; values of skipped pages and of slots beyond the length are never read (masked to zero in the jnp
paths), so they cannot change the output.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from kernels import cache_backend, checks, packing
from kernels.attention_math import grouped_query, merge_partials, softmax_partial

PAGE_SIZE = 128
CODES_PER_WORD = 16
F8 = jnp.float8_e4m3fn


# -- 2-bit packing and page quantization -------------------------------------------------------


def nan_max(x: jax.Array, axis: int) -> jax.Array:
    """``x.max(axis)``, NaN wherever the reduced slice holds a NaN. (XLA:CPU's vectorised max
    reductions may skip NaNs, so ``jnp.max`` alone does not propagate them.)"""
    return jnp.where(jnp.isnan(x).any(axis), jnp.nan, x.max(axis))


def pack_codes(codes: jax.Array) -> jax.Array:
    """Packs 2-bit codes, uint8/int [..., D] with values in 0..3, into int32 words [..., D / 16]
    (:func:`kernels.packing.pack_codes` with 32-bit words).

    Channel ``d`` goes to word ``d % W`` at bit ``2 * (d // W)``, W = D / 16 (planar order).

    Raises:
      ValueError: D not a multiple of 16.
    """
    return packing.pack_codes(codes, 2, word_bits=32)


def unpack_codes(words: jax.Array) -> jax.Array:
    """Inverse of :func:`pack_codes`: int32 [..., W] -> uint8 [..., 16 * W] codes in 0..3."""
    return packing.unpack_codes(words, 2)


def quantize_pages(k: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """2-bit symmetric quantization of full pages of keys (the paper's Sec. 3 key format).

    Args:
      k: [..., p, D] keys of full pages (any float dtype).

    Returns:
      (codes int32 [..., p, D/16] packed, scale float32 [..., D], resid float8_e4m3fn [..., p, D]) with
      ``scale = max_t |k[t, d]| / 1.5``, ``c = round(k / scale + 1.5)`` in {0..3}, and
      ``resid = (k - (c - 1.5) * scale) / scale`` (zero on all-zero channels). ``|k / scale| <= 1.5``
      up to rounding, so ``|resid| <= 0.5``; it is clipped to [-0.5, 0.5] so that no rounding (nor
      a flushed subnormal scale) can push it towards float8 e4m3's overflow at 448. A NaN key makes
      its channel's scale and residual NaN (its code is 0).
    """
    k = k.astype(jnp.float32)
    scale = nan_max(jnp.abs(k), axis=-2) / 1.5
    safe = jnp.where(scale > 0, scale, 1.0)[..., None, :]
    # k / scale with both rescaled by the scale's power of two: XLA:CPU divides through a
    # reciprocal that flushes to zero for scales above ~8.5e37, which would zero the huge keys
    mant, expo = jnp.frexp(safe)
    x = jnp.ldexp(k, -expo) / mant
    codes = jnp.where(jnp.isnan(x), 0.0, jnp.clip(jnp.round(x + 1.5), 0, 3))
    resid = jnp.where(scale[..., None, :] > 0, jnp.clip(x - (codes - 1.5), -0.5, 0.5), 0.0)
    resid = jnp.where(jnp.isnan(scale)[..., None, :], jnp.nan, resid)
    return pack_codes(codes.astype(jnp.uint8)), scale, resid.astype(F8)


def token_major_codes(codes: jax.Array) -> jax.Array:
    """The cache's token-minor code words int32 [..., W, p] as token-major [..., p, W] (the layout
    :func:`quantize_pages` returns and :func:`unpack_codes` reads)."""
    return jnp.swapaxes(codes, -1, -2)


def dequantize_pages(codes: jax.Array, scale: jax.Array, resid: jax.Array | None = None
                     ) -> jax.Array:
    """float32 [..., p, D]: ``k_hat = (c - 1.5) * scale``, or the refined key
    ``(c - 1.5 + resid) * scale`` when ``resid`` is given."""
    x = unpack_codes(codes).astype(jnp.float32) - 1.5
    if resid is not None:
        x = x + resid.astype(jnp.float32)
    return x * scale[..., None, :]


# -- the paged cache ---------------------------------------------------------------------------


def check_layout(max_len: int, head_dim: int, page_size: int, where: str = "paged cache") -> None:
    """Raises ValueError unless ``page_size`` is an integer >= 1 dividing ``max_len`` and 16 divides
    ``head_dim``."""
    checks.integer(page_size, "page_size", where, minimum=1)
    if page_size < 1 or max_len % page_size:
        raise ValueError(f"page size {page_size} must be >= 1 and divide the cache capacity "
                         f"{max_len}")
    if head_dim % CODES_PER_WORD:
        raise ValueError(f"head dim {head_dim} must be a multiple of {CODES_PER_WORD} for 2-bit "
                         "packing into 32-bit words")


def init_ffd_cache(batch_size: int, max_len: int, num_kv_heads: int, head_dim: int, dtype,
                   page_size: int = PAGE_SIZE, scan_copy: bool = False) -> dict[str, jax.Array]:
    """An empty FFD cache (layout in the module docstring).

    With ``scan_copy`` the cache also keeps ``codes_i8`` int8 [B, K, P, p, D], the same codes one
    per byte, which the XLA path scans on a CPU (int8 so that the scan's int8 x int8 -> int32
    product reads it as is, :func:`kernels.sparse_decode.xla.ffd_keep_superset`).

    Raises:
      ValueError: a size that is not an integer >= 1, a dtype that is not floating-point,
        ``page_size`` does not divide ``max_len`` or 16 does not divide ``head_dim``.
    """
    checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype, "init_ffd_cache")
    check_layout(max_len, head_dim, page_size, "init_ffd_cache")
    b, kh, p, d = batch_size, num_kv_heads, page_size, head_dim
    n = max_len // p
    cache = {
        "codes": jnp.zeros((b, kh, n, d // CODES_PER_WORD, p), jnp.int32),
        "scale": jnp.zeros((b, kh, n, d), jnp.float32),
        "resid": jnp.zeros((b, kh, n, p, d), F8),
        "tail": jnp.zeros((b, kh, p, d), dtype),
        "v": jnp.zeros((b, kh, n, p, d), jnp.bfloat16),
    }
    if scan_copy:
        cache["codes_i8"] = jnp.zeros((b, kh, n, p, d), jnp.int8)
    return cache


def update_ffd_cache(cache: dict[str, jax.Array], k: jax.Array, v: jax.Array, start: jax.Array
                     ) -> dict[str, jax.Array]:
    """Appends keys/values ``k, v [B, K, T, D]`` at slots ``start[b] .. start[b] + T - 1``.

    Keys go to the full-precision tail page; every page that fills up is quantized
    (:func:`quantize_pages`) and written to ``codes/scale/resid``; the new tail is the unfinished page
    ``(start + T) // p``. Rows may be ragged. Inside ``jit``, a row whose ``start`` is outside
    ``0..S - T`` is left bit-identical (no page, tail or value written; the capacity rule of
    :class:`kernels.cache_backend.KVCacheBackend`).

    Raises:
      ValueError: ``cache`` is not an FFD cache; ``k`` not float [B, K, T, D] matching the cache;
        ``v`` not of ``k``'s shape; ``start`` not int [B]; a concrete ``start`` outside
        ``0..S - T`` (inside ``jit`` only the shapes and dtypes are checked).
    """
    check_cache(cache, "update_ffd_cache")
    b, kh, n, p, d = cache["resid"].shape
    checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=n * p, head_dim=d,
                        where="update_ffd_cache")
    t, d = k.shape[2], k.shape[3]
    nw = (p - 1 + t) // p + 1  # window pages: the old tail page, the new tokens, the next tail

    scan_copy = "codes_i8" in cache
    ok = cache_backend.rows_in_capacity(start, t, n * p)  # [B]; the other rows are left as they are

    def row(codes, scale, resid, tail, k, start, row_ok, codes_i8):
        off, page0 = start % p, start // p
        win = jnp.zeros((kh, nw * p, d), tail.dtype).at[:, :p].set(tail)
        win = lax.dynamic_update_slice(win, k.astype(tail.dtype), (0, off, 0))
        pages = win.reshape(kh, nw, p, d)
        c, s, r = quantize_pages(pages)
        filled = (off + t) // p  # window pages 0 .. filled-1 are now full
        idx = jnp.where((jnp.arange(nw) < filled) & row_ok, page0 + jnp.arange(nw), n)  # n: dropped
        codes = codes.at[:, idx].set(jnp.swapaxes(c, -1, -2), mode="drop")  # only the new pages
        if n < nw:  # else the scales are written below, row by row
            scale = scale.at[:, idx].set(s, mode="drop")
        resid = resid.at[:, idx].set(r, mode="drop")
        if scan_copy:
            codes_i8 = codes_i8.at[:, idx].set(unpack_codes(c).astype(jnp.int8), mode="drop")
        tail = jnp.where(row_ok, lax.dynamic_index_in_dim(pages, filled, axis=1, keepdims=False),
                         tail)
        return codes, scale, resid, tail, codes_i8, s, filled

    codes, scale, resid, tail, codes_i8, s, filled = jax.vmap(row)(
        cache["codes"], cache["scale"], cache["resid"], cache["tail"], k, start, ok,
        cache.get("codes_i8", jnp.zeros((b,), jnp.int8)))
    # scales and values: per row, a window of whole pages read, changed and written back in place.
    # (Under vmap these writes become scatters, and a write of single token rows into the tiled
    # [.., p, D] dimensions makes XLA:TPU re-lay out the whole array at every step.)
    vals = cache["v"]
    if n >= nw:
        for bi in range(b):
            page0 = start[bi] // p
            at = jnp.clip(page0, 0, n - nw)  # first window page; the new slots lie inside
            i = at + jnp.arange(nw) - page0  # window page of each written page
            use = (i >= 0) & (i < filled[bi]) & ok[bi]
            new = jnp.where(use[:, None], jnp.take(s[bi], jnp.clip(i, 0, nw - 1), axis=1),
                            lax.dynamic_slice(scale, (bi, 0, at, 0), (1, kh, nw, d))[0])
            scale = lax.dynamic_update_slice(scale, new[None], (bi, 0, at, 0))
            old = lax.dynamic_slice(vals, (bi, 0, at, 0, 0), (1, kh, nw, p, d))
            win = lax.dynamic_update_slice(old.reshape(1, kh, nw * p, d),
                                           v[bi:bi + 1].astype(vals.dtype),
                                           (0, 0, start[bi] - at * p, 0))
            vals = lax.dynamic_update_slice(
                vals, jnp.where(ok[bi], win.reshape(old.shape), old), (bi, 0, at, 0, 0))
        vflat = vals
    else:  # a write longer than the cache allows windows for (prefill)
        vflat = cache_backend.write_slots(vals.reshape(b, kh, n * p, d), v, start, ok)
    out = {"codes": codes, "scale": scale, "resid": resid, "tail": tail,
           "v": vflat.reshape(b, kh, n, p, d)}
    if scan_copy:
        out["codes_i8"] = codes_i8
    return out


def refined_keys(cache: dict[str, jax.Array], lengths: jax.Array) -> jax.Array:
    """float32 [B, K, S, D]: refined keys of the full pages with the exact tail page overlaid (slots
    at or beyond ``lengths`` hold unspecified values). Used for prefill and as the dense target."""
    b, kh, n, p, d = cache["resid"].shape
    k = dequantize_pages(token_major_codes(cache["codes"]), cache["scale"],
                         cache["resid"])  # [B, K, P, p, D]
    tail_page = lengths // p
    is_tail = (jnp.arange(n)[None, :] == tail_page[:, None])[:, None, :, None, None]
    k = jnp.where(is_tail, cache["tail"][:, :, None].astype(jnp.float32), k)
    return k.reshape(b, kh, n * p, d)


def check_lengths(lengths, capacity: int, where: str, batch: int | None = None) -> None:
    """Raises ValueError unless ``lengths`` is an integer array [batch] (any length when ``batch``
    is None) whose concrete entries lie in 1..capacity (values of tracers are not checked)."""
    if batch is None:
        batch = getattr(lengths, "shape", (None,))[0] if getattr(lengths, "ndim", 0) == 1 else -1
    checks.lengths(lengths, "lengths", where, batch=batch, low=1, high=capacity,
                   high_is="the cache capacity")


CACHE_FIELDS = ("codes", "scale", "resid", "tail", "v")


def check_cache(cache, where: str) -> None:
    """Raises ValueError unless ``cache`` is an FFD cache (a dict with the fields of
    :func:`init_ffd_cache`, ``resid`` [B, K, P, p, D])."""
    if not isinstance(cache, dict) or any(f not in cache for f in CACHE_FIELDS):
        got = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
        raise checks.error(where, "cache", f"an FFD cache (a dict with fields {CACHE_FIELDS}, "
                           "from init_ffd_cache)", got)
    checks.array(cache["resid"], "cache['resid']", where, ndim=5)


# -- dense decode (the baseline) ---------------------------------------------------------------


def dense_decode(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array) -> jax.Array:
    """Dense decode attention of one new token per row over a [B, K, S, D] cache.

    The fast XLA formulation on CPU: keys sequence-contiguous per kv head, the G query heads of a
    group batched into one [G, D] x [D, S] product, float32 accumulation.

    Args:
      q: [B, H, D]; k, v: [B, K, S, D]; lengths: int [B] in 1..S (slots 0..lengths-1 are attended).

    Returns:
      [B, H, D] in ``q``'s dtype.

    Raises:
      ValueError: ``q`` not a non-empty float [B, H, D]; ``k`` not float [B, K, S, D] with H a
        multiple of K; ``v`` not of ``k``'s shape; ``lengths`` not int [B]; concrete ``lengths``
        outside 1..S.
    """
    where = "dense_decode"
    checks.array(q, "q", where, ndim=3, kind="float", nonempty=True)
    b, h, d = q.shape
    checks.array(k, "k", where, ndim=4, kind="float", shape=(b, None, None, d), nonempty=True)
    checks.array(v, "v", where, kind="float", shape=k.shape)
    kh, s = k.shape[1], k.shape[2]
    if h % kh:
        raise checks.error(where, "q", f"a number of query heads that is a multiple of the {kh} "
                           "kv heads", f"{h} query heads")
    check_lengths(lengths, s, where, batch=b)
    qg = q.reshape(b, kh, h // kh, d).astype(k.dtype) / jnp.sqrt(d).astype(k.dtype)
    # logits as [S, G] per head (keys x queries): the long axis is the product's rows, which
    # XLA:CPU runs ~1.2x faster than the [G, S] form at 64k
    logits = jnp.einsum("bksd,bkgd->bksg", k, qg, preferred_element_type=jnp.float32)
    logits = jnp.where(jnp.arange(s)[None, None, :, None] < lengths[:, None, None, None], logits,
                       -jnp.inf)
    m = logits.max(2, keepdims=True)
    e = jnp.exp(logits - m)
    o = jnp.einsum("bksg,bksd->bkgd", e.astype(v.dtype), v, preferred_element_type=jnp.float32)
    o = o / e.sum(2)[..., None]
    return o.reshape(b, h, d).astype(q.dtype)


# -- FFD: selection and attention --------------------------------------------------------------

DELTA_UNITS = ("nats", "log2")


def delta_in_nats(delta, unit: str = "nats"):
    """The top-delta margin in nats, from ``delta`` given in ``unit``.

    ``"nats"``: natural-log logits (this module's unit). ``"log2"``: base-2 logits, the unit of the
    authors' kernel, which scales ``q.k / sqrt(D)`` by ``log2(e)`` before subtracting delta, so
    ``delta_2`` base-2 units are ``delta_2 * ln 2`` nats (their defaults 5 and 7 are 3.47 and 4.85
    nats; our 6 nats is 8.66 there).

    Raises:
      ValueError: ``unit`` not one of :data:`DELTA_UNITS`.
    """
    if unit == "nats":
        return delta
    if unit == "log2":
        return delta * math.log(2.0)
    raise ValueError(f"delta_unit must be one of {DELTA_UNITS}, got {unit!r}")


def rankable(score: jax.Array) -> jax.Array:
    """Scores as finite ranks: NaN first (largest), +-inf clipped to the float32 range."""
    big = jnp.finfo(jnp.float32).max
    return jnp.where(jnp.isnan(score), big, jnp.clip(score, -big, big))


def top_mask(rank: jax.Array, k: int) -> jax.Array:
    """bool [B, K, P]: the ``k`` largest entries of ``rank [B, K, P]`` (ties: lower index first)."""
    b, kh, n = rank.shape
    _, idx = lax.top_k(rank, min(k, n))
    return jnp.zeros((b, kh, n), bool).at[
        jnp.arange(b)[:, None, None], jnp.arange(kh)[None, :, None], idx].set(True)


def select_pages(page_max: jax.Array, num_full: jax.Array, delta: float | jax.Array,
                 top_k: int | None = None, max_pages: int | None = None) -> jax.Array:
    """bool [B, K, P]: which full pages to attend (paper Sec. 3, the top-delta rule).

    Args:
      page_max: float32 [B, K, G, P], the largest estimated logit of each page per query head
        (values on pages that are not full are ignored).
      num_full: int [B], number of full pages per row.
      delta: top-delta margin in nats (>= 0; ``inf`` keeps every full page). Ignored with ``top_k``.
        Page ``j`` is kept unless ``page_max[..., g, j] < theta[g]`` for every head ``g`` of the
        group, with ``theta = max(page_max[..., 0], page_max[..., last full]) - delta``; a NaN
        estimate (or threshold) therefore keeps the page.
      top_k: keep exactly ``min(top_k, num_full)`` pages, those with the largest
        ``score = max_g page_max`` (NaN first, ties to the lower page index), instead of top-delta.
      max_pages: then keep at most ``max_pages`` of the selected pages, those with the largest
        ``score`` (NaN first, ties to the lower page index).
    """
    n = page_max.shape[-1]
    valid = (jnp.arange(n)[None, :] < num_full[:, None])[:, None, :]  # [B, 1, P]
    score = nan_max(page_max, axis=2)  # [B, K, P]
    if top_k is not None:
        keep = top_mask(jnp.where(valid, rankable(score), -jnp.inf), top_k) & valid
    else:
        first = page_max[..., 0]
        last_idx = jnp.maximum(num_full - 1, 0)[:, None, None, None]
        last = jnp.take_along_axis(
            page_max, jnp.broadcast_to(last_idx, page_max.shape[:-1] + (1,)), axis=-1)[..., 0]
        theta = ffd_threshold(first, last, delta)  # [B, K, G]
        keep = jnp.any(~(page_max < theta[..., None]), axis=2)
        # The page that sets the threshold is kept by its index, not by comparing its estimate
        # with itself: XLA may compute the estimate once per consumer (in two fusions, say, one of
        # them with a fused multiply-add), and two evaluations that differ in the last bit must
        # not leave a row whose masked maximum skips the page that its exponential sum attends.
        # In exact arithmetic the rule keeps this page anyway.
        ref_page = jnp.where(jnp.any(~(first < last), axis=2), 0, last_idx[:, :, 0, 0])  # [B, K]
        keep = (keep | (jnp.arange(n) == ref_page[..., None])) & valid
    if max_pages is not None and max_pages < n:
        keep = keep & top_mask(jnp.where(keep, rankable(score), -jnp.inf), max_pages)
    return keep


def ffd_threshold(page_max_first: jax.Array, page_max_last: jax.Array, delta) -> jax.Array:
    """theta = max(first, last) - delta, float32 [B, K, G] (the paper's top-delta threshold; NaN if
    either reference page's estimate is NaN)."""
    return jnp.maximum(page_max_first, page_max_last) - delta


@functools.partial(jax.jit, static_argnames=("top_k", "max_pages"))
def ffd_keep(q: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array, delta,
             top_k: int | None = None, max_pages: int | None = None) -> jax.Array:
    """bool [B, K, P]: the pages FFD attends, the one selection every implementation uses.

    Page maxima from the packed scan (:func:`ffd_scan_page_max`), then :func:`select_pages`.

    Args:
      q: [B, H, D] float queries; cache: an FFD cache; lengths: int32 [B] in 1..S.
      delta: top-delta margin in nats; top_k, max_pages: see :func:`select_pages`.
    """
    p = cache["tail"].shape[2]
    qg = grouped_query(q, cache["resid"].shape[1])
    num_full = lengths // p
    return select_pages(ffd_scan_page_max(qg, cache, num_full), num_full, delta, top_k, max_pages)


def page_list(keep: jax.Array, m_slots: int) -> tuple[jax.Array, jax.Array]:
    """The kept pages as a list: (idx int32 [B, K, m_slots], count int32 [B, K]).

    ``idx[b, k, :count[b, k]]`` are the kept page indices in increasing order; later slots hold
    unspecified (valid) page indices. ``keep [B, K, P]`` must hold at most ``m_slots`` pages per
    (row, kv head).
    """
    n = keep.shape[-1]
    order = jnp.where(keep, n - jnp.arange(n, dtype=jnp.int32), 0)  # earlier pages rank higher
    _, idx = lax.top_k(order, min(m_slots, n))
    if m_slots > n:
        idx = jnp.pad(idx, ((0, 0), (0, 0), (0, m_slots - n)))
    return idx.astype(jnp.int32), keep.sum(-1, dtype=jnp.int32)


def tail_partial(qg: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array):
    """Exact attention partial (acc [B,K,G,D], m [B,K,G], l [B,K,G]) over the tail page (values
    beyond the length are not read)."""
    p = cache["tail"].shape[2]
    logits = jnp.einsum("bkgd,bktd->bkgt", qg, cache["tail"].astype(jnp.float32))
    ok = jnp.arange(p)[None, :] < (lengths % p)[:, None]
    logits = jnp.where(ok[:, None, None, :], logits, -jnp.inf)
    tail_page = jnp.minimum(lengths // p, cache["v"].shape[2] - 1)  # a full cache has no tail
    v = jnp.take_along_axis(cache["v"], tail_page[:, None, None, None, None], axis=2)[:, :, 0]
    return softmax_partial(logits, jnp.where(ok[:, None, :, None], v, 0))


def ffd_page_max(qg: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array) -> jax.Array:
    """float32 [B, K, G, P]: largest estimated logit ``q.k_hat/sqrt(D)`` per page and query head;
    ``-inf`` on pages that are not full. (Spec form: dequantizes every page; equal to
    :func:`ffd_scan_page_max`, which the selection uses, up to float32 rounding.)"""
    p = cache["tail"].shape[2]
    k_hat = dequantize_pages(token_major_codes(cache["codes"]), cache["scale"])
    est = nan_max(jnp.einsum("bkgd,bkptd->bkgpt", qg, k_hat), -1)
    full = jnp.arange(est.shape[-1])[None, :] < (lengths // p)[:, None]
    return jnp.where(full[:, None, None, :], est, -jnp.inf)


def ffd_decode_reference(q: jax.Array, cache: dict[str, jax.Array], lengths: jax.Array, *,
                         delta: float = 8.0, top_k: int | None = None,
                         max_pages: int | None = None, keep: jax.Array | None = None
                         ) -> tuple[jax.Array, jax.Array]:
    """FFD decode attention, the specification (masked and dense over all pages).

    Args:
      q: [B, H, D] float queries of the new tokens (RoPE applied).
      cache: FFD cache holding ``lengths[b]`` tokens per row (the new token included).
      lengths: int32 [B], 1..S.
      delta: top-delta margin in nats (paper Sec. 3; ``inf`` = dense over refined keys).
      top_k: use the top-k-pages variant instead of top-delta.
      max_pages: keep at most this many pages, by score (:func:`select_pages`).
      keep: bool [B, K, P], a precomputed :func:`ffd_keep` (then delta/top_k/max_pages are unused).

    Returns:
      (out [B, H, D] in ``q``'s dtype, keep bool [B, K, P] of attended full pages). The output is
      NaN in a row whose attended keys or values hold a NaN (module docstring).
    """
    b, h, d = q.shape
    kh, n, p = cache["resid"].shape[1], cache["resid"].shape[2], cache["resid"].shape[3]
    qg = grouped_query(q, kh)
    if keep is None:
        keep = ffd_keep(q, cache, lengths, delta, top_k, max_pages)
    k_ref = dequantize_pages(token_major_codes(cache["codes"]), cache["scale"], cache["resid"])
    logits = jnp.einsum("bkgd,bkptd->bkgpt", qg, k_ref)
    logits = jnp.where(keep[:, :, None, :, None], logits, -jnp.inf).reshape(b, kh, -1, n * p)
    v = jnp.where(keep[..., None, None], cache["v"], 0)  # skipped pages' values are not read
    acc, m, l = softmax_partial(logits, v.reshape(b, kh, n * p, d))
    ta, tm, tl = tail_partial(qg, cache, lengths)
    out = merge_partials(jnp.stack([acc, ta], 2), jnp.stack([m, tm], 2), jnp.stack([l, tl], 2), 2)
    return out.reshape(b, h, d).astype(q.dtype), keep


# -- FFD: the page scan of the selection ---------------------------------------------------------


def ffd_scan_page_max(qg: jax.Array, cache: dict[str, jax.Array], num_full: jax.Array
                      ) -> jax.Array:
    """:func:`ffd_page_max` computed without a dequantized key copy, as
    ``q.k_hat = (q*scale) . c - 1.5 * sum_d (q*scale)_d``: the page maxima :func:`ffd_keep` selects
    from, so its float32 values are part of the specification of the kept pages.

    Reads the byte-per-code scan copy ``codes_i8`` [B, K, P, p, D] when the cache has one (the CPU
    layout: XLA on a CPU fuses the uint8 -> float conversion into the small batched products, while
    unpacking 2-bit words with shifts costs ~10x more there), else the packed words slab by slab.
    qg float32 [B, K, G, D] (already / sqrt(D)). Returns float32 [B, K, G, P] (``-inf`` beyond
    ``num_full``).
    """
    b, kh, g, d = qg.shape
    qs = qg[:, :, :, None, :] * cache["scale"][:, :, None, :, :]  # [B, K, G, P, D]
    offset = 1.5 * qs.sum(-1)  # [B, K, G, P]
    if "codes_i8" in cache:
        est = jnp.einsum("bkgpd,bkptd->bkgpt", qs, cache["codes_i8"].astype(jnp.float32))
    else:
        codes = cache["codes"]  # [B, K, P, W, p]
        w = codes.shape[-2]
        qs = qs.reshape(b, kh, g, -1, CODES_PER_WORD, w)
        u = lax.bitcast_convert_type(codes, jnp.uint32)
        est = 0.0
        for s in range(CODES_PER_WORD):
            c = ((u >> (2 * s)) & 3).astype(jnp.float32)  # channels s*W .. s*W+W-1
            est = est + jnp.einsum("bkgpw,bkpwt->bkgpt", qs[..., s, :], c)
    page_max = est.max(-1) - offset  # a NaN scale or query makes the offset (a sum) NaN
    full = jnp.arange(page_max.shape[-1])[None, :] < num_full[:, None]
    return jnp.where(full[:, None, None, :], page_max, -jnp.inf)
