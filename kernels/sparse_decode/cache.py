"""Sparse-decode KV-cache backends: FFD and Quest, registered as ``"ffd"`` and ``"quest"``.

Dimensions: B batch, H query heads, K kv heads, T new tokens, D head dim, p page size, P pages,
S = P * p capacity.

Both implement the :class:`kernels.cache_backend.KVCacheBackend` protocol, so
``Transformer.decode`` and
``models.sampling.generate`` run with ``models.kv_cache.get_backend("ffd")`` / ``"quest"``.
Prefill (T > 1) attends densely (causal) over the cache contents; the sparse rules apply to decode
steps (T = 1), the regime the papers target. The capacity is ``max_len`` (a multiple of the page
size); rows out of capacity are refused outside ``jit`` and, inside it, left unchanged by
``update`` and NaN in ``attend`` (the protocol's rule).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from kernels import attention_math, cache_backend, checks
from kernels.sparse_decode import api, cost, quest
from kernels.sparse_decode import reference as ref


def _check_backend(page_size: int, top_k: int | None, name: str) -> None:
    checks.integer(page_size, "page_size", name, minimum=1)
    checks.integer(top_k, "top_k", name, minimum=1, allow_none=True)


@cache_backend.register_backend("ffd")
@dataclasses.dataclass(frozen=True)
class FFDCache:
    """FFD KV-cache backend: paged 2-bit keys + float8 residual + bf16 values, sparse decode.

    Attributes:
      page_size: tokens per page p (must divide the cache capacity).
      delta: top-delta margin (>= 0; ``inf`` = dense over refined keys), in ``delta_unit``.
      delta_unit: ``"nats"`` or ``"log2"`` (the paper's base-2 unit), see
        :func:`kernels.sparse_decode.api.ffd_decode`.
      top_k: use the top-k-pages variant instead.
      max_pages: attend at most this many pages by score (``None`` = no cap), see ``ffd_decode``.
      implementation: ``"auto"`` (dispatch by platform) or a name, see ``ffd_decode``.
      scan_copy: keep byte-per-code codes for the XLA scan (default: on CPU).
      assumed_kept_fraction: the fraction of the pages the Pallas kernels' declared cost assumes
        attended (``ffd_decode``'s argument; it changes the cost XLA sees, never the output).

    Raises:
      ValueError: on construction, a field outside the ranges above.
    """

    page_size: int = ref.PAGE_SIZE
    delta: float = 8.0
    delta_unit: str = "nats"
    top_k: int | None = None
    max_pages: int | None = None
    implementation: str = "auto"
    scan_copy: bool | None = None
    assumed_kept_fraction: float = cost.DEFAULT_KEPT_FRACTION

    def __post_init__(self):
        _check_backend(self.page_size, self.top_k, "FFDCache")
        api.check_delta(self.delta, self.delta_unit, "FFDCache")
        api.check_count(self.max_pages, "max_pages", "FFDCache")
        api.resolve_implementation(self.implementation, "FFDCache")
        if self.scan_copy not in (None, True, False):
            raise checks.error("FFDCache", "scan_copy", "None or a bool", repr(self.scan_copy))
        cost.check_kept_fraction(self.assumed_kept_fraction, "FFDCache")

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype, "FFDCache.init")
        scan = jax.default_backend() == "cpu" if self.scan_copy is None else self.scan_copy
        return ref.init_ffd_cache(batch_size, max_len, num_kv_heads, head_dim, dtype,
                                  self.page_size, scan_copy=scan)

    def update(self, layer_cache, k, v, start):
        """Appends ``k, v [B, K, T, D]`` at slots ``start[b] ..`` (:func:`ref.update_ffd_cache`,
        which leaves a row out of capacity bit-identical under ``jit``)."""
        ref.check_cache(layer_cache, "FFDCache.update")
        b, kh, n, p, d = layer_cache["resid"].shape
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=n * p, head_dim=d,
                            where="FFDCache.update")
        return ref.update_ffd_cache(layer_cache, k, v, start)

    def attend(self, layer_cache, q, start):
        ref.check_cache(layer_cache, "FFDCache.attend")
        b, kh, n, p, d = layer_cache["resid"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=n * p, head_dim=d,
                            where="FFDCache.attend")
        t = q.shape[2]
        ok = cache_backend.rows_in_capacity(start, t, n * p)
        start = jnp.where(ok, start, 0)  # out-of-capacity rows: attend at 0, then poison them
        if t == 1:
            out = api.ffd_decode(q[:, :, 0], layer_cache, start + 1, delta=self.delta,
                                 delta_unit=self.delta_unit, top_k=self.top_k,
                                 max_pages=self.max_pages, implementation=self.implementation,
                                 assumed_kept_fraction=self.assumed_kept_fraction)
            return cache_backend.poison_rows(out[:, :, None], ok)
        k = ref.refined_keys(layer_cache, start + t)
        v = layer_cache["v"].reshape(b, kh, n * p, d)
        mask = attention_math.causal_cache_mask(start, t, n * p)
        out = attention_math.grouped_attention(q, k, v, mask)
        return cache_backend.poison_rows(out, ok)


@cache_backend.register_backend("quest")
@dataclasses.dataclass(frozen=True)
class QuestCache:
    """Quest KV-cache backend: dense [B, K, S, D] keys/values plus per-page min/max key metadata;
    decode attends the ``top_k`` pages with the largest logit upper bound and the unfinished page.

    Raises:
      ValueError: on construction, ``page_size`` or ``top_k`` not an int >= 1.
    """

    page_size: int = ref.PAGE_SIZE
    top_k: int = 8

    def __post_init__(self):
        _check_backend(self.page_size, self.top_k, "QuestCache")

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype, "QuestCache.init")
        ref.check_layout(max_len, head_dim, self.page_size, "QuestCache.init")
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        meta = (batch_size, num_kv_heads, max_len // self.page_size, head_dim)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
                "kmin": jnp.zeros(meta, jnp.float32), "kmax": jnp.zeros(meta, jnp.float32)}

    def update(self, layer_cache, k, v, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="QuestCache.update")
        dense = cache_backend.DENSE.update({"k": layer_cache["k"], "v": layer_cache["v"]}, k, v,
                                           start)
        p = self.page_size
        n, t = s // p, k.shape[2]
        nw = (p - 1 + t) // p + 1
        in_cap = cache_backend.rows_in_capacity(start, t, s)  # other rows: no metadata write either

        def row(kmin, kmax, keys, st, row_ok):  # keys [K, S, D]
            pages = keys.reshape(kh, n, p, d)
            ids = st // p + jnp.arange(nw)
            ok = (ids >= 0) & (ids < n) & row_ok
            got = pages[:, jnp.clip(ids, 0, n - 1)].astype(jnp.float32)  # [K, NW, p, D]
            ids = jnp.where(ok, ids, n)
            return (kmin.at[:, ids].set(got.min(2), mode="drop"),
                    kmax.at[:, ids].set(got.max(2), mode="drop"))

        kmin, kmax = jax.vmap(row)(layer_cache["kmin"], layer_cache["kmax"], dense["k"], start,
                                   in_cap)
        return {**dense, "kmin": kmin, "kmax": kmax}

    def attend(self, layer_cache, q, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="QuestCache.attend")
        t = q.shape[2]
        ok = cache_backend.rows_in_capacity(start, t, s)
        start = jnp.where(ok, start, 0)  # out-of-capacity rows: attend at 0, then poison them
        if t == 1:
            out, _ = quest.quest_decode(q[:, :, 0], layer_cache["k"], layer_cache["v"],
                                      layer_cache["kmin"], layer_cache["kmax"], start + 1,
                                      top_k=self.top_k, page_size=self.page_size)
            return cache_backend.poison_rows(out[:, :, None], ok)
        mask = attention_math.causal_cache_mask(start, t, s)
        return cache_backend.poison_rows(
            attention_math.grouped_attention(q, layer_cache["k"], layer_cache["v"], mask), ok)
