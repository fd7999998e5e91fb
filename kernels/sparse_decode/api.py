"""Sparse decode attention: dispatch (XLA / Pallas TPU / Pallas GPU) and the KV-cache backends.

Dimensions: B batch, H query heads, K kv heads, G = H / K, T new tokens, D head dim, p page size,
P pages, S = P * p capacity.

* :func:`ffd_decode` -- FFD decode attention of one new token per row (``implementation`` =
  ``"xla"`` (the CPU default), ``"reference"``, ``"pallas_tpu"`` (TPU default), ``"pallas_gpu"``
  (GPU default)).
* :func:`ffd_select` -- the kept-page mask alone (for density and kept-mass statistics).
* :class:`FFDCache`, :class:`QuestCache` -- :class:`models.kv_cache.KVCacheBackend` implementations,
  so ``Transformer.decode`` and ``models.sampling.generate`` run with ``get_backend("ffd")`` /
  ``get_backend("quest")``. Prefill (T > 1) attends densely (causal) over the cache contents; the
  sparse rules apply to decode steps (T = 1), the regime the papers target.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from kernels.sparse_decode import reference as ref
from models import kv_cache as kvc

IMPLEMENTATIONS = ("reference", "xla", "pallas_tpu", "pallas_gpu")


def default_implementation() -> str:
    """``pallas_tpu`` on TPU, ``pallas_gpu`` on GPU, ``xla`` otherwise."""
    return {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}.get(jax.default_backend(), "xla")


def _check(q: jax.Array, cache: dict[str, Any], delta: float, top_k: int | None,
           where: str) -> None:
    if q.ndim != 3:
        raise ValueError(f"{where}: q must be [B, H, D], got shape {q.shape}")
    b, kh, n, p, d = cache["resid"].shape
    if q.shape[-1] != d:
        raise ValueError(f"{where}: query head dim {q.shape[-1]} != cache head dim {d}")
    if q.shape[0] != b:
        raise ValueError(f"{where}: query batch {q.shape[0]} != cache batch {b}")
    if q.shape[1] % kh:
        raise ValueError(f"{where}: {q.shape[1]} query heads are not a multiple of {kh} kv heads")
    if top_k is None and not isinstance(delta, jax.core.Tracer) and not delta >= 0:
        raise ValueError(f"{where}: delta must be >= 0 (nats), got {delta}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"{where}: top_k must be >= 1, got {top_k}")


def _theta(qg: jax.Array, cache: dict[str, Any], num_full: jax.Array, delta, top_k):
    """Per-head thresholds [B, K, G]. Top-delta needs the first and last full pages only."""
    if top_k is not None:
        page_max = ref.ffd_scan_page_max(qg, cache, num_full)
        score = page_max.max(axis=2)
        if top_k >= score.shape[-1]:
            return jnp.full(qg.shape[:3], -jnp.inf)
        # halfway between the k-th and (k+1)-th scores, so the kernel's own (differently rounded)
        # estimates select the same k pages
        top = lax.top_k(score, top_k + 1)[0]
        kth, nxt = top[..., -2], top[..., -1]
        theta = jnp.where(jnp.isfinite(nxt), 0.5 * (kth + nxt), -jnp.inf)
        return jnp.broadcast_to(theta[:, :, None], qg.shape[:3])
    last = jnp.maximum(num_full - 1, 0)
    two = jnp.stack([jnp.zeros_like(last), last], axis=1)  # [B, 2]
    idx = jnp.broadcast_to(two[:, None, :], (qg.shape[0], qg.shape[1], 2))
    k_hat = ref.dequantize_pages(ref.gather_pages(cache["codes"], idx),
                                 ref.gather_pages(cache["scale"], idx))  # [B, K, 2, p, D]
    est = jnp.einsum("bkgd,bkjtd->bkgjt", qg, k_hat).max(-1)  # [B, K, G, 2]
    theta = ref.ffd_threshold(est[..., 0], est[..., 1], delta)
    return jnp.where((num_full > 0)[:, None, None], theta, jnp.inf)


def ffd_select(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, *, delta: float = 8.0,
               top_k: int | None = None) -> jax.Array:
    """bool [B, K, P]: the full pages FFD attends for queries ``q [B, H, D]`` (paper Sec. 3 rule,
    see :func:`kernels.sparse_decode.reference.select_pages`)."""
    _check(q, cache, delta, top_k, "ffd_select")
    p = cache["resid"].shape[3]
    qg = ref._grouped_query(q, cache["resid"].shape[1])
    return ref.select_pages(ref.ffd_scan_page_max(qg, cache, lengths // p), lengths // p, delta,
                            top_k)


def ffd_decode(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, *, delta: float = 8.0,
               top_k: int | None = None, max_pages: int | None = None,
               num_splits: int | None = None, implementation: str | None = None,
               interpret: bool = False) -> jax.Array:
    """FFD decode attention: ``q [B, H, D]`` over an FFD cache holding ``lengths [B]`` tokens.

    Args:
      q: queries of the new tokens (RoPE applied), any float dtype.
      cache: from :func:`kernels.sparse_decode.reference.init_ffd_cache` / ``update_ffd_cache``.
      lengths: int32 [B] in 1..S, tokens in each row (the new token included).
      delta: top-delta margin in nats (>= 0; ``inf`` attends every page). Skipped pages have
        estimated weights below ``exp(-delta)`` of the largest estimated weight of the first and last
        full pages.
      top_k: if set, the top-k-pages variant (a global pass over the page scores).
      max_pages: XLA path only: the static gather budget (``None`` = P).
      num_splits: Pallas paths: split-K factor (must divide P; default: GPU 8 or fewer, TPU 1).
      implementation: one of :data:`IMPLEMENTATIONS` (default :func:`default_implementation`).
      interpret: run Pallas kernels in interpret mode (CPU testing).

    Returns:
      [B, H, D] in ``q``'s dtype.

    Raises:
      ValueError: shape mismatch (head dim, batch, heads), ``delta < 0``, ``top_k < 1``, concrete
        ``lengths`` outside 1..S, or an unknown implementation.
    """
    _check(q, cache, delta, top_k, "ffd_decode")
    impl = implementation or default_implementation()
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"ffd_decode: unknown implementation {impl!r}; known: {IMPLEMENTATIONS}")
    b, kh, n, p, d = cache["resid"].shape
    ref.check_lengths(lengths, n * p, "ffd_decode")
    lengths = jnp.asarray(lengths, jnp.int32)
    if impl == "reference":
        return ref.ffd_decode_reference(q, cache, lengths, delta=delta, top_k=top_k)[0]
    if impl == "xla":
        return ref.ffd_decode_xla(q, cache, lengths, delta=delta, top_k=top_k,
                                  max_pages=max_pages)[0]
    h = q.shape[1]
    qg = ref._grouped_query(q, kh)
    num_full = lengths // p
    if impl == "pallas_gpu":
        from kernels.sparse_decode import pallas_gpu

        splits = num_splits or math.gcd(n, 8)
        theta = _theta(qg, cache, num_full, delta, top_k)
        acc, m, l = pallas_gpu.ffd_fused_attention(qg, theta, num_full, cache["codes"],
                                                   cache["scale"], cache["resid"], cache["v"],
                                                   num_splits=splits, interpret=interpret)
    else:
        from kernels.sparse_decode import pallas_tpu

        splits = num_splits or 1
        keep = ref.select_pages(ref.ffd_scan_page_max(qg, {k: v for k, v in cache.items()
                                                            if k != "codes_u8"}, num_full),
                                num_full, delta, top_k)
        idx = jnp.argsort(~keep, axis=-1, stable=True).astype(jnp.int32)  # kept pages first
        count = keep.sum(-1).astype(jnp.int32)
        m_slots = n if max_pages is None else max(1, min(int(max_pages), n))
        m_slots = -(-m_slots // splits) * splits
        if m_slots > n:
            idx = jnp.pad(idx, ((0, 0), (0, 0), (0, m_slots - n)))
        acc, m, l = pallas_tpu.ffd_pages_attention(qg, cache["codes"], cache["scale"],
                                                   cache["resid"], cache["v"], idx[..., :m_slots],
                                                   jnp.minimum(count, m_slots),
                                                   num_splits=splits, interpret=interpret)
        m, l = m[..., 0], l[..., 0]
    ta, tm, tl = ref.tail_partial(qg, cache, lengths)
    out = ref.merge_partials(jnp.concatenate([acc, ta[:, :, None]], 2),
                             jnp.concatenate([m, tm[:, :, None]], 2),
                             jnp.concatenate([l, tl[:, :, None]], 2), 2)
    return out.reshape(b, h, d).astype(q.dtype)


# -- KV-cache backends --------------------------------------------------------------------------


def _check_backend(page_size: int, top_k: int | None, name: str) -> None:
    if page_size < 1:
        raise ValueError(f"{name}: page_size must be >= 1, got {page_size}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"{name}: top_k must be >= 1, got {top_k}")


@dataclasses.dataclass(frozen=True)
class FFDCache:
    """FFD KV-cache backend: paged 2-bit keys + float8 residual + bf16 values, sparse decode.

    Attributes:
      page_size: tokens per page p (must divide the cache capacity).
      delta: top-delta margin in nats (>= 0; ``inf`` = dense over refined keys).
      top_k: use the top-k-pages variant instead.
      max_pages: XLA gather budget (``None`` = all pages).
      implementation: see :func:`ffd_decode`.
      scan_copy: keep byte-per-code codes for the XLA scan (default: on CPU).
    """

    page_size: int = ref.PAGE_SIZE
    delta: float = 8.0
    top_k: int | None = None
    max_pages: int | None = None
    implementation: str | None = None
    scan_copy: bool | None = None

    def __post_init__(self):
        _check_backend(self.page_size, self.top_k, "FFDCache")
        if not self.delta >= 0:
            raise ValueError(f"FFDCache: delta must be >= 0 (nats), got {self.delta}")

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        scan = jax.default_backend() == "cpu" if self.scan_copy is None else self.scan_copy
        return ref.init_ffd_cache(batch_size, max_len, num_kv_heads, head_dim, dtype,
                                  self.page_size, scan_copy=scan)

    def update(self, layer_cache, k, v, start):
        if k.shape[-1] != layer_cache["resid"].shape[-1]:
            raise ValueError(f"FFDCache.update: key head dim {k.shape[-1]} != cache head dim "
                             f"{layer_cache['resid'].shape[-1]}")
        return ref.update_ffd_cache(layer_cache, k, v, start)

    def attend(self, layer_cache, q, start):
        b, kh, n, p, d = layer_cache["resid"].shape
        t = q.shape[2]
        if q.shape[-1] != d:
            raise ValueError(f"FFDCache.attend: query head dim {q.shape[-1]} != cache head dim {d}")
        if t == 1:
            out = ffd_decode(q[:, :, 0], layer_cache, start + 1, delta=self.delta,
                             top_k=self.top_k, max_pages=self.max_pages,
                             implementation=self.implementation)
            return out[:, :, None]
        k = ref.refined_keys(layer_cache, start + t)
        v = layer_cache["v"].reshape(b, kh, n * p, d)
        return kvc.grouped_attention(q, k, v, kvc.causal_cache_mask(start, t, n * p))


@dataclasses.dataclass(frozen=True)
class QuestCache:
    """Quest KV-cache backend: dense [B, K, S, D] keys/values plus per-page min/max key metadata;
    decode attends the ``top_k`` pages with the largest logit upper bound and the unfinished page."""

    page_size: int = ref.PAGE_SIZE
    top_k: int = 8

    def __post_init__(self):
        _check_backend(self.page_size, self.top_k, "QuestCache")

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        ref.check_layout(max_len, head_dim, self.page_size)
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        meta = (batch_size, num_kv_heads, max_len // self.page_size, head_dim)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
                "kmin": jnp.zeros(meta, jnp.float32), "kmax": jnp.zeros(meta, jnp.float32)}

    def update(self, layer_cache, k, v, start):
        dense = kvc.DenseKVCache().update({"k": layer_cache["k"], "v": layer_cache["v"]}, k, v,
                                          start)
        p = self.page_size
        b, kh, s, d = dense["k"].shape
        n, t = s // p, k.shape[2]
        nw = (p - 1 + t) // p + 1

        def row(kmin, kmax, keys, st):  # keys [K, S, D]
            pages = keys.reshape(kh, n, p, d)
            ids = st // p + jnp.arange(nw)
            ok = ids < n
            got = pages[:, jnp.minimum(ids, n - 1)].astype(jnp.float32)  # [K, NW, p, D]
            ids = jnp.where(ok, ids, n)
            return (kmin.at[:, ids].set(got.min(2), mode="drop"),
                    kmax.at[:, ids].set(got.max(2), mode="drop"))

        kmin, kmax = jax.vmap(row)(layer_cache["kmin"], layer_cache["kmax"], dense["k"], start)
        return {**dense, "kmin": kmin, "kmax": kmax}

    def attend(self, layer_cache, q, start):
        t = q.shape[2]
        if t == 1:
            out, _ = ref.quest_decode(q[:, :, 0], layer_cache["k"], layer_cache["v"],
                                      layer_cache["kmin"], layer_cache["kmax"], start + 1,
                                      top_k=self.top_k, page_size=self.page_size)
            return out[:, :, None]
        mask = kvc.causal_cache_mask(start, t, layer_cache["k"].shape[2])
        return kvc.grouped_attention(q, layer_cache["k"], layer_cache["v"], mask)
