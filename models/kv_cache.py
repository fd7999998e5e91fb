"""KV-cache backends: the protocol the transformer decodes through, the backends, lookup by name.

Dimensions: B batch, H query heads, K kv heads, G = H / K, S cache slots, T new tokens, D head dim.

The protocol (:class:`kernels.cache_backend.KVCacheBackend`: ``init`` / ``update`` / ``attend``)
and the dense backend (:class:`kernels.cache_backend.DenseKVCache`) live in
:mod:`kernels.cache_backend` with the backend registry. Every backend class registers its name
there (``@register_backend("ffd")``); this module imports the backend modules of every kernel op
registered in :data:`kernels.dispatch.OPS` (:data:`BACKEND_MODULES`, ``models`` -> ``kernels``,
the allowed direction; a new op registers there, not here), and defines the one backend that lives
at this layer, EntroKV's keep-mask cache (:class:`BudgetedKVCache`, ``"budgeted"``: the budgets
and selection that fill its mask are in :mod:`algorithms.kv_budget`). So :func:`get_backend` is
the one lookup, and it knows every name (today's, :func:`registered_names` lists them):

========================  ==============================================================
``"dense"``               :class:`kernels.cache_backend.DenseKVCache`
``"ffd"``, ``"quest"``    :mod:`kernels.sparse_decode.cache` (Faster Flash Decoding, Quest)
``"ffd_sharded"``         :mod:`kernels.sparse_decode.sharded` (FFD inside ``shard_map``)
``"qvg"``, ``"kivi"``     :mod:`kernels.kv_quant.cache` (Quant VideoGen, KIVI)
``"qvg_sharded"``         :mod:`kernels.kv_quant.sharded` (QVG inside ``shard_map``)
``"budgeted"``            :class:`BudgetedKVCache` (EntroKV keep mask)
========================  ==============================================================

A config selects a backend by a dict, ``kv_cache = dict(name="ffd", page_size=16, delta=6.0)``,
built by ``get_backend(**kv_cache)``.

Every backend follows the protocol's contract at the edges (:class:`KVCacheBackend`): the capacity
is ``init``'s ``max_len``; a row whose new positions leave ``0 .. max_len - 1`` raises
``ValueError`` outside ``jit`` and, inside it, is left unchanged by ``update`` and NaN in
``attend``; a fresh cache can be donated.
"""
from __future__ import annotations

import dataclasses
import importlib

import jax.numpy as jnp

from kernels import attention_math, cache_backend, checks, dispatch
from kernels.cache_backend import (
    DENSE,  # also read as kv_cache.DENSE by experiments/sparse_decode.py
    KVCacheBackend,  # also read by experiments/generate.py
)

# The modules that define (and register) KV-cache backends, those of every op of
# kernels.dispatch.OPS, imported here so that the registry is complete whenever this module is.
BACKEND_MODULES = dispatch.backend_modules()
for _module in BACKEND_MODULES:
    importlib.import_module(_module)


@cache_backend.register_backend("budgeted")
@dataclasses.dataclass(frozen=True)
class BudgetedKVCache:
    """Dense ``[B, K, S, D]`` cache with a per-head keep mask bool ``[B, K, S]``, ``"budgeted"``.

    EntroKV's cache (:mod:`algorithms.kv_budget.cache` installs the masks): evicted prompt slots
    are masked out of attention, new tokens are always kept. It measures the quality of a budget
    (which tokens each head may see) exactly; the memory saving itself would come from compacting
    the kept slots, which this reference does not do.

    It follows the backend protocol of :class:`kernels.cache_backend.KVCacheBackend`, its capacity
    rule
    included (S = ``max_len``; a row out of capacity raises ``ValueError`` outside ``jit`` and,
    inside it, is left unchanged by ``update`` and NaN in ``attend``): ``update`` and the checks
    are the dense backend's. A row whose keep mask hides every slot it may see attends to nothing
    and is NaN as well (:func:`kernels.attention_math.grouped_attention` needs one key per query).
    """

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype,
                          "BudgetedKVCache.init")
        cache = DENSE.init(batch_size, max_len, num_kv_heads, head_dim, dtype)
        cache["keep"] = jnp.ones((batch_size, num_kv_heads, max_len), bool)
        return cache

    def update(self, layer_cache, k, v, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="BudgetedKVCache.update")
        new = DENSE.update({"k": layer_cache["k"], "v": layer_cache["v"]}, k, v, start)
        return {**new, "keep": layer_cache["keep"]}

    def attend(self, layer_cache, q, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="BudgetedKVCache.attend")
        mask = (attention_math.causal_cache_mask(start, q.shape[2], s)
                & layer_cache["keep"][:, :, None, None, :])
        out = attention_math.grouped_attention(q, layer_cache["k"], layer_cache["v"], mask)
        return cache_backend.poison_rows(out, cache_backend.rows_in_capacity(start, q.shape[2], s))


def registered_names() -> list[str]:
    """The names :func:`get_backend` accepts, sorted."""
    return sorted(cache_backend.registered_backends())


def get_backend(name: str, **options) -> KVCacheBackend:
    """The KV-cache backend registered as ``name``, configured with ``options`` (its dataclass
    fields; the table in the module docstring lists the names). A config's backend dict
    ``dict(name=..., **options)`` is built by ``get_backend(**spec)``.

    Returns:
      a frozen (hashable) backend instance, usable as a static argument of ``jit``.

    Raises:
      ValueError: ``name`` is not registered (the message lists the registered names), an option
        is not one of the backend's fields (the message lists them), or the backend's own checks
        refuse a value.
    """
    backends = cache_backend.registered_backends()
    if not isinstance(name, str) or name not in backends:
        raise ValueError(f"get_backend: unknown KV-cache backend {name!r}; registered: "
                         f"{', '.join(sorted(backends))}")
    cls = backends[name]
    fields = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f"get_backend: the {name!r} backend ({cls.__qualname__}) has no option "
                         f"{', '.join(unknown)}; its fields are: {', '.join(fields) or 'none'}")
    return cls(**options)
