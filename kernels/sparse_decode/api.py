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

Every implementation attends the same pages: :func:`ffd_decode` computes the kept-page mask once
(:func:`kernels.sparse_decode.reference.ffd_keep`) and hands it, or its page list, to the chosen
implementation; :func:`ffd_select` returns that same mask.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from kernels import checks
from kernels.sparse_decode import reference as ref
from models import kv_cache as kvc

IMPLEMENTATIONS = ("reference", "xla", "pallas_tpu", "pallas_gpu")
DELTA_UNITS = ref.DELTA_UNITS


def default_implementation() -> str:
    """``pallas_tpu`` on TPU, ``pallas_gpu`` on GPU, ``xla`` otherwise."""
    return {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}.get(jax.default_backend(), "xla")


def resolve_implementation(implementation: str | None, where: str = "ffd_decode") -> str:
    """``None`` or ``"auto"``: :func:`default_implementation` (dispatch by platform); otherwise one of
    :data:`IMPLEMENTATIONS`.

    Raises:
      ValueError: an unknown name (the message lists the valid ones).
    """
    if implementation is None or implementation == "auto":
        return default_implementation()
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{where}: unknown implementation {implementation!r}; expected None, "
                         f"'auto' or one of {IMPLEMENTATIONS}")
    return implementation


def _check_delta(delta, delta_unit: str, where: str) -> None:
    checks.one_of(delta_unit, "delta_unit", where, DELTA_UNITS)
    checks.number(delta, "delta", where, minimum=0.0, finite=False)  # inf: attend every page


def _check_count(value, name: str, where: str) -> None:
    checks.integer(value, name, where, minimum=1, allow_none=True)


def _check(q: jax.Array, cache: dict[str, Any], delta, delta_unit: str, top_k: int | None,
           max_pages: int | None, where: str) -> None:
    checks.array(q, "q", where, ndim=3, kind="float", nonempty=True)
    ref.check_cache(cache, where)
    b, kh, n, p, d = cache["resid"].shape
    if q.shape[-1] != d:
        raise ValueError(f"{where}: query head dim {q.shape[-1]} != cache head dim {d}")
    if q.shape[0] != b:
        raise ValueError(f"{where}: query batch {q.shape[0]} != cache batch {b}")
    if q.shape[1] % kh:
        raise ValueError(f"{where}: {q.shape[1]} query heads are not a multiple of {kh} kv heads")
    if top_k is None:
        _check_delta(delta, delta_unit, where)
    _check_count(top_k, "top_k", where)
    _check_count(max_pages, "max_pages", where)


def ffd_select(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, *, delta: float = 8.0,
               delta_unit: str = "nats", top_k: int | None = None,
               max_pages: int | None = None) -> jax.Array:
    """bool [B, K, P]: the full pages FFD attends for queries ``q [B, H, D]`` (paper Sec. 3 rule,
    see :func:`kernels.sparse_decode.reference.select_pages`); the mask :func:`ffd_decode` uses,
    arguments and errors as there (the same checks: lengths outside 1..S are refused by both)."""
    _check(q, cache, delta, delta_unit, top_k, max_pages, "ffd_select")
    n, p = cache["resid"].shape[2], cache["resid"].shape[3]
    ref.check_lengths(lengths, n * p, "ffd_select", batch=q.shape[0])
    return ref.ffd_keep(q, cache, jnp.asarray(lengths, jnp.int32),
                        ref.delta_in_nats(delta, delta_unit), top_k, max_pages)


def ffd_decode(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, *, delta: float = 8.0,
               delta_unit: str = "nats", top_k: int | None = None, max_pages: int | None = None,
               num_splits: int | None = None, implementation: str | None = None,
               interpret: bool = False, return_keep: bool = False):
    """FFD decode attention: ``q [B, H, D]`` over an FFD cache holding ``lengths [B]`` tokens.

    The pages are chosen once (:func:`ffd_select`, paper Sec. 3) and every implementation attends
    exactly those pages plus the unfinished tail page, so implementations agree to float32 rounding.

    Args:
      q: queries of the new tokens (RoPE applied), any float dtype.
      cache: from :func:`kernels.sparse_decode.reference.init_ffd_cache` / ``update_ffd_cache``.
      lengths: int32 [B] in 1..S, tokens in each row (the new token included).
      delta: top-delta margin (>= 0; ``inf`` attends every page). Skipped pages have estimated
        weights below ``exp(-delta)`` (nats) of the largest estimated weight of the first and last
        full pages.
      delta_unit: ``"nats"`` (natural-log logits, the default) or ``"log2"`` (base-2 logits, the
        unit of the authors' kernel: ``delta_log2 = delta_nats / ln 2``, so their 8.7 is our 6.0
        and a value from the paper can be passed as is with ``delta_unit="log2"``).
      top_k: if set, the top-k-pages variant: exactly ``min(top_k, full pages)`` pages by score
        (a global pass over the page scores).
      max_pages: attend at most this many of the selected pages per (row, kv head), those with the
        largest estimated page score (ties to the lower page index); the same meaning in every
        implementation (``None``: no cap). It is also the static gather budget of the XLA path and
        the slot count of the Pallas kernels.
      num_splits: Pallas paths: split-K factor over the page slots (default: GPU up to 8, TPU 1).
      implementation: ``None`` or ``"auto"`` (dispatch by platform: Pallas on TPU/GPU, XLA on
        CPU, :func:`default_implementation`) or one of :data:`IMPLEMENTATIONS`.
      interpret: run Pallas kernels in interpret mode (CPU testing).
      return_keep: also return the attended-page mask.

    Returns:
      [B, H, D] in ``q``'s dtype; with ``return_keep``, ``(out, keep bool [B, K, P])``. Never NaN
      for finite input (every row attends at least one token). A NaN in a key within a row's
      length, or in a value the row attends, makes that row's output NaN, as dense attention does
      (values of skipped pages are never read).

    Raises:
      ValueError: ``q`` not a non-empty float [B, H, D], ``cache`` not an FFD cache, shape
        mismatch (head dim, batch, heads), ``delta`` not a number >= 0, an unknown ``delta_unit``,
        ``top_k``/``max_pages``/``num_splits`` not an int >= 1, ``lengths`` not int [B] or,
        when concrete, outside 1..S, or an unknown implementation.
    """
    _check(q, cache, delta, delta_unit, top_k, max_pages, "ffd_decode")
    _check_count(num_splits, "num_splits", "ffd_decode")
    impl = resolve_implementation(implementation)
    b, kh, n, p, d = cache["resid"].shape
    ref.check_lengths(lengths, n * p, "ffd_decode", batch=b)
    lengths = jnp.asarray(lengths, jnp.int32)
    keep = ref.ffd_keep(q, cache, lengths, ref.delta_in_nats(delta, delta_unit), top_k, max_pages)
    m_slots = n if max_pages is None else min(max_pages, n)  # keep holds at most m_slots pages
    if impl == "reference":
        out = ref.ffd_decode_reference(q, cache, lengths, keep=keep)[0]
    elif impl == "xla":
        out = ref.ffd_decode_xla(q, cache, lengths, max_pages=max_pages, keep=keep)[0]
    else:
        out = _pallas_decode(q, cache, lengths, keep, m_slots, impl, num_splits, interpret)
    return (out, keep) if return_keep else out


def _pallas_decode(q, cache, lengths, keep, m_slots, impl, num_splits, interpret):
    """The Pallas paths: the kept pages as a list, kernel partials, LSE merge with the tail."""
    b, h, d = q.shape
    kh = cache["resid"].shape[1]
    qg = ref._grouped_query(q, kh)
    splits = num_splits or (min(8, m_slots) if impl == "pallas_gpu" else 1)
    idx, count = ref.page_list(keep, -(-m_slots // splits) * splits)  # slots: a multiple of NS
    args = (qg, cache["codes"], cache["scale"], cache["resid"], cache["v"], idx, count)
    if impl == "pallas_gpu":
        from kernels.sparse_decode import pallas_gpu

        acc, m, l = pallas_gpu.ffd_pages_attention(*args, num_splits=splits, interpret=interpret)
    else:
        from kernels.sparse_decode import pallas_tpu

        acc, m, l = pallas_tpu.ffd_pages_attention(*args, num_splits=splits, interpret=interpret)
        m, l = m[..., 0], l[..., 0]
    ta, tm, tl = ref.tail_partial(qg, cache, lengths)
    out = ref.merge_partials(jnp.concatenate([acc, ta[:, :, None]], 2),
                             jnp.concatenate([m, tm[:, :, None]], 2),
                             jnp.concatenate([l, tl[:, :, None]], 2), 2)
    return out.reshape(b, h, d).astype(q.dtype)


# -- KV-cache backends --------------------------------------------------------------------------


def _check_backend(page_size: int, top_k: int | None, name: str) -> None:
    checks.integer(page_size, "page_size", name, minimum=1)
    checks.integer(top_k, "top_k", name, minimum=1, allow_none=True)


@dataclasses.dataclass(frozen=True)
class FFDCache:
    """FFD KV-cache backend: paged 2-bit keys + float8 residual + bf16 values, sparse decode.

    Attributes:
      page_size: tokens per page p (must divide the cache capacity).
      delta: top-delta margin (>= 0; ``inf`` = dense over refined keys), in ``delta_unit``.
      delta_unit: ``"nats"`` or ``"log2"`` (the paper's base-2 unit), see :func:`ffd_decode`.
      top_k: use the top-k-pages variant instead.
      max_pages: attend at most this many pages by score (``None`` = no cap), see
        :func:`ffd_decode`.
      implementation: see :func:`ffd_decode`.
      scan_copy: keep byte-per-code codes for the XLA scan (default: on CPU).
    """

    page_size: int = ref.PAGE_SIZE
    delta: float = 8.0
    delta_unit: str = "nats"
    top_k: int | None = None
    max_pages: int | None = None
    implementation: str | None = None
    scan_copy: bool | None = None

    def __post_init__(self):
        _check_backend(self.page_size, self.top_k, "FFDCache")
        _check_delta(self.delta, self.delta_unit, "FFDCache")
        _check_count(self.max_pages, "max_pages", "FFDCache")
        resolve_implementation(self.implementation, "FFDCache")
        if self.scan_copy not in (None, True, False):
            raise checks.error("FFDCache", "scan_copy", "None or a bool", repr(self.scan_copy))

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype, "FFDCache.init")
        scan = jax.default_backend() == "cpu" if self.scan_copy is None else self.scan_copy
        return ref.init_ffd_cache(batch_size, max_len, num_kv_heads, head_dim, dtype,
                                  self.page_size, scan_copy=scan)

    def update(self, layer_cache, k, v, start):
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
        if t == 1:
            out = ffd_decode(q[:, :, 0], layer_cache, start + 1, delta=self.delta,
                             delta_unit=self.delta_unit, top_k=self.top_k, max_pages=self.max_pages,
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
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="QuestCache.attend")
        t = q.shape[2]
        if t == 1:
            out, _ = ref.quest_decode(q[:, :, 0], layer_cache["k"], layer_cache["v"],
                                      layer_cache["kmin"], layer_cache["kmax"], start + 1,
                                      top_k=self.top_k, page_size=self.page_size)
            return out[:, :, None]
        mask = kvc.causal_cache_mask(start, t, layer_cache["k"].shape[2])
        return kvc.grouped_attention(q, layer_cache["k"], layer_cache["v"], mask)
