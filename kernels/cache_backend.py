"""The KV-cache backend protocol, its registry and the capacity rule every backend follows, with
the dense reference backend.

Dimensions: B batch, H query heads, K kv heads, S cache slots, T new tokens, D head dim.

A backend is a frozen (hashable) dataclass with three methods, all traceable under ``jit``:

- ``init(batch_size, max_len, num_kv_heads, head_dim, dtype) -> layer_cache`` (a pytree);
- ``update(layer_cache, k, v, start) -> layer_cache`` writes new keys/values ``k, v [B, K, T, D]``
  (RoPE already applied to ``k``; a backend that wants pre-RoPE keys undoes it exactly with
  ``kernels.rope.apply_rope(k, -positions)``) at slots ``start[b] .. start[b] + T - 1``;
- ``attend(layer_cache, q, start) -> out``: attention of ``q [B, H, T, D]`` over slots
  ``0 .. start[b] + t`` for new token ``t`` (causal), ``[B, H, T, D]`` in ``q``'s dtype.

and one optional method:

- ``flush(layer_cache) -> layer_cache``: work that a backend keeps out of the one-token decode
  step (QVG / KIVI: quantizing a complete chunk of the full-precision window,
  :mod:`kernels.kv_quant.cache`). A decode loop calls it after every one-token step, through
  :func:`flush_layers` (or the models' ``flush_cache``); a backend without it needs none (the
  identity). A backend that has it states how often it must run (QVG / KIVI: at least once every
  N one-token updates) and is a no-op when there is nothing to do.

Capacity: a cache from ``init(..., max_len, ...)`` holds positions ``0 .. max_len - 1``, for every
backend (one that allocates a buffer rounded up to whole chunks or pages still refuses positions
``>= max_len``). A row ``b`` whose slots ``start[b] .. start[b] + T - 1`` do not all lie in that
range is out of capacity:

- outside ``jit`` (concrete ``start``), ``update`` and ``attend`` raise ``ValueError`` naming the
  backend, the positions and the capacity;
- inside ``jit`` (``start`` traced, no exception possible), ``update`` leaves that row of the cache
  bit-identical (no write is clamped onto the last slots) and ``attend`` returns NaN for every
  output of that row, so the fault is visible; other rows are unaffected (:func:`rows_in_capacity`,
  :func:`poison_rows`, :func:`write_slots`).

A fresh cache can be donated (``jax.jit(update, donate_argnums=0)``): no two of its leaves share a
buffer.

Each backend module registers its classes by name with ``@register_backend("name")``;
``models.kv_cache.get_backend`` (the one lookup) imports every backend module by an explicit list
and builds a backend from its name and options. :class:`DenseKVCache` (``"dense"``) is the
reference backend.

A leaf of ``kernels``: it imports only JAX, :mod:`kernels.checks` and
:mod:`kernels.attention_math`, so ``kernels/<op>/`` and ``models/`` can both build on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import lax

from kernels import checks
from kernels.attention_math import causal_cache_mask, grouped_attention


@runtime_checkable
class KVCacheBackend(Protocol):
    """What ``Transformer.decode`` calls on a KV-cache backend (methods: the module docstring).

    The contract at the edges, for every backend: the capacity is ``init``'s ``max_len``; a row
    whose new slots ``start[b] .. start[b] + T - 1`` leave ``0 .. max_len - 1`` is refused with a
    ``ValueError`` outside ``jit`` and, inside ``jit``, left unchanged by ``update`` and poisoned
    (all NaN) by ``attend``. A fresh cache has no two leaves sharing a buffer, so it can be donated.
    The optional ``flush`` (module docstring) is not part of this runtime-checkable protocol.
    """

    def init(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int,
             dtype: Any) -> Any: ...

    def update(self, layer_cache: Any, k: jax.Array, v: jax.Array, start: jax.Array) -> Any: ...

    def attend(self, layer_cache: Any, q: jax.Array, start: jax.Array) -> jax.Array: ...


_REGISTRY: dict[str, type] = {}


def register_backend(name: str):
    """Class decorator: registers a KV-cache backend class under ``name``.

    Registering the same class twice under one name is a no-op (module reloads).

    Raises:
      ValueError: ``name`` not a non-empty string, the class lacks ``init``/``update``/``attend``
        or is not a dataclass (its fields are the options ``get_backend`` accepts), or ``name`` is
        already taken by another class.
    """
    if not isinstance(name, str) or not name:
        raise checks.error("register_backend", "name", "a non-empty string", repr(name))

    def register(cls: type) -> type:
        missing = [m for m in ("init", "update", "attend") if not callable(getattr(cls, m, None))]
        if missing:
            raise checks.error("register_backend", name, "a class with init, update and attend",
                               f"{cls.__name__} without {', '.join(missing)}")
        if not dataclasses.is_dataclass(cls):
            raise checks.error("register_backend", name, "a (frozen) dataclass: its fields are "
                               "the backend's options", f"{cls.__name__}, not a dataclass")
        old = _REGISTRY.get(name)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"register_backend: name {name!r} is taken by {old.__module__}."
                             f"{old.__qualname__}; expected a free name for {cls.__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return register


def registered_backends() -> dict[str, type]:
    """A copy of the registry: backend name -> class (only the modules imported so far)."""
    return dict(_REGISTRY)


def rows_in_capacity(start: jax.Array, num_new: int, capacity: jax.Array | int) -> jax.Array:
    """bool [B]: True where row ``b``'s slots ``start[b] .. start[b] + T - 1`` (T = ``num_new``) all
    lie in ``0 .. capacity - 1``; ``start`` int [B], ``capacity`` an int or int [B].

    Compares ``start <= capacity - T`` rather than ``start + T <= capacity``, so a ``start`` near
    the int32 maximum cannot wrap around into range."""
    start = jnp.asarray(start)
    return (start >= 0) & (start <= jnp.asarray(capacity, start.dtype) - num_new)


def flush_layers(backend: Any, cache: Any) -> Any:
    """Applies the backend's optional ``flush`` (module docstring) to every layer of a model's
    cache: a list (or tuple) of per-layer caches, or one stacked cache whose leaves lead with the
    layer axis [L, ...] (``scan_layers``; flushed layer by layer in a ``lax.fori_loop``, each
    layer's slice written back in place). A backend without ``flush``: ``cache`` unchanged.

    Returns:
      the cache, in the layout it was given.

    Raises:
      ValueError: as the backend's ``flush`` (a cache that is not the backend's); a stacked cache
        whose leaves do not share a leading layer axis.
    """
    flush = getattr(backend, "flush", None)
    if flush is None:
        return cache
    if isinstance(cache, list | tuple):
        return type(cache)(flush(layer) for layer in cache)
    leads = {getattr(x, "shape", ())[:1] for x in jax.tree.leaves(cache)}
    if len(leads) != 1 or () in leads:
        raise checks.error("flush_layers", "cache", "a list of layer caches or a stacked cache "
                           "(every leaf [L, ...])", f"leading axes {sorted(leads)}")
    (num_layers,), = leads

    def layer(i, stacked):
        one = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, i, keepdims=False), stacked)
        return jax.tree.map(lambda a, new: lax.dynamic_update_index_in_dim(a, new, i, 0), stacked,
                            flush(one))

    return lax.fori_loop(0, num_layers, layer, cache)


def poison_rows(out: jax.Array, ok: jax.Array) -> jax.Array:
    """``out`` [B, ...] (float) with every entry of the rows where ``ok`` [B] is False set to NaN:
    how ``attend`` marks a row that is out of capacity inside ``jit`` (protocol above)."""
    return jnp.where(ok.reshape((-1,) + (1,) * (out.ndim - 1)), out, jnp.nan)


def write_slots(buf: jax.Array, new: jax.Array, start: jax.Array, ok: jax.Array) -> jax.Array:
    """``buf`` [B, K, S, ...] with ``new`` [B, K, T, ...] written at slots ``start[b] .. start[b] +
    T - 1`` of the rows where ``ok`` [B]; the other rows stay bit-identical.

    ``lax.dynamic_update_slice`` clamps an out-of-range start onto the last T slots; here a row
    that is not ``ok`` writes back what the (equally clamped) ``lax.dynamic_slice`` read there, so
    nothing changes, at the cost of reading T slots (not a select over the whole buffer, which
    would copy the cache on every decode step). ``new`` is cast to ``buf``'s dtype.
    """
    def row(b, n, s, o):  # b [K, S, ...], n [K, T, ...]
        idx = (0, s) + (0,) * (b.ndim - 2)
        old = lax.dynamic_slice(b, idx, n.shape)
        return lax.dynamic_update_slice(b, jnp.where(o, n.astype(b.dtype), old), idx)

    return jax.vmap(row)(buf, new, jnp.asarray(start, jnp.int32), ok)


@register_backend("dense")
@dataclasses.dataclass(frozen=True)
class DenseKVCache:
    """Full-precision cache laid out ``[B, K, S, D]`` (sequence-contiguous per head, the fast
    layout for decode on CPU), with dense attention over the valid prefix; capacity S =
    ``max_len`` (out-of-capacity rows: the protocol in the module docstring)."""

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype, "DenseKVCache.init")
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

    def update(self, layer_cache, k, v, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="DenseKVCache.update")
        ok = rows_in_capacity(start, k.shape[2], s)
        return {"k": write_slots(layer_cache["k"], k, start, ok),
                "v": write_slots(layer_cache["v"], v, start, ok)}

    def attend(self, layer_cache, q, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="DenseKVCache.attend")
        mask = causal_cache_mask(start, q.shape[2], s)
        out = grouped_attention(q, layer_cache["k"], layer_cache["v"], mask)
        return poison_rows(out, rows_in_capacity(start, q.shape[2], s))


DENSE = DenseKVCache()
