"""KV-cache backends: the protocol the transformer decodes through, and the dense reference.

Dimensions: B batch, H query heads, K kv heads, G = H / K, S cache slots, T new tokens, D head dim.

A backend is a frozen (hashable) dataclass with three methods, all traceable under ``jit``:

* ``init(batch_size, max_len, num_kv_heads, head_dim, dtype) -> layer_cache`` (a pytree);
* ``update(layer_cache, k, v, start) -> layer_cache`` writes new keys/values ``k, v [B, K, T, D]``
  (RoPE already applied to ``k``; a backend that wants pre-RoPE keys may undo it exactly with
  ``models.rope.apply_rope(k, -positions)``) at slots ``start[b] .. start[b] + T - 1``;
* ``attend(layer_cache, q, start) -> out`` returns the attention of ``q [B, H, T, D]`` over slots
  ``0 .. start[b] + t`` for new token ``t`` (causal), as ``[B, H, T, D]`` in ``q``'s dtype.

Backends are looked up by name with :func:`get_backend` (``"dense"`` here; ``"ffd"``, ``"quest"``,
``"qvg"``, ``"kivi"`` live in ``kernels/`` and are imported lazily).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from kernels import checks


class KVCacheBackend(Protocol):
    def init(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int,
             dtype: Any) -> Any: ...

    def update(self, layer_cache: Any, k: jax.Array, v: jax.Array, start: jax.Array) -> Any: ...

    def attend(self, layer_cache: Any, q: jax.Array, start: jax.Array) -> jax.Array: ...


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention with grouped-query heads, computed in float32.

    Args:
      q: [B, H, T, D].
      k, v: [B, K, S, D] with H = G * K (query head h uses kv head h // G).
      mask: bool, broadcastable to [B, K, G, T, S]; True = may attend. Every query row must allow
        at least one key.

    Returns:
      [B, H, T, D] in ``q``'s dtype.

    Raises:
      ValueError: ``q`` not float [B, H, T, D]; ``k`` not [B, K, S, D] with H a multiple of K;
        ``v`` not of ``k``'s shape.
    """
    where = "grouped_attention"
    checks.array(q, "q", where, ndim=4, kind="float")
    b, h, t, d = q.shape
    checks.array(k, "k", where, ndim=4, shape=(b, None, None, d))
    checks.array(v, "v", where, shape=k.shape)
    kh = k.shape[1]
    if h % kh:
        raise checks.error(where, "q", f"a number of query heads that is a multiple of the {kh} "
                           "kv heads", f"{h} query heads")
    qg = q.reshape(b, kh, h // kh, t, d).astype(jnp.float32)
    scores = jnp.einsum("bkgtd,bksd->bkgts", qg, k.astype(jnp.float32)) / jnp.sqrt(d).astype(
        jnp.float32)
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v.astype(jnp.float32))
    return out.reshape(b, h, t, d).astype(q.dtype)


def causal_cache_mask(start: jax.Array, num_new: int, num_slots: int) -> jax.Array:
    """bool [B, 1, 1, T, S]: new token t of row b sees slots s <= start[b] + t."""
    limit = start[:, None] + jnp.arange(num_new)[None, :]  # [B, T]
    return (jnp.arange(num_slots)[None, None, :] <= limit[:, :, None])[:, None, None]


@dataclasses.dataclass(frozen=True)
class DenseKVCache:
    """Full-precision cache laid out ``[B, K, S, D]`` (sequence-contiguous per head, the fast
    layout for decode on CPU), with dense attention over the valid prefix."""

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype, "DenseKVCache.init")
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

    def update(self, layer_cache, k, v, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="DenseKVCache.update")

        def write(buf, new, s):  # buf [K, S, D], new [K, T, D]
            return jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), (0, s, 0))

        return {"k": jax.vmap(write)(layer_cache["k"], k, start),
                "v": jax.vmap(write)(layer_cache["v"], v, start)}

    def attend(self, layer_cache, q, start):
        b, kh, s, d = layer_cache["k"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=s, head_dim=d,
                            where="DenseKVCache.attend")
        mask = causal_cache_mask(start, q.shape[2], layer_cache["k"].shape[2])
        return grouped_attention(q, layer_cache["k"], layer_cache["v"], mask)


DENSE = DenseKVCache()

_BACKENDS = {
    "dense": "models.kv_cache:DenseKVCache",
    "ffd": "kernels.sparse_decode.api:FFDCache",
    "quest": "kernels.sparse_decode.api:QuestCache",
    "qvg": "kernels.kv_quant.api:QVGCache",
    "kivi": "kernels.kv_quant.api:KIVICache",
}


def get_backend(name: str, **kwargs) -> KVCacheBackend:
    """Instantiates the KV-cache backend registered as ``name`` with ``kwargs``.

    Raises:
      ValueError: unknown name (the message lists the known ones), a backend whose module is
        not available, or ``kwargs`` the backend does not take.
    """
    if name not in _BACKENDS:
        raise ValueError(f"unknown KV-cache backend {name!r}; known: {sorted(_BACKENDS)}")
    module, attr = _BACKENDS[name].split(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"KV-cache backend {name!r} ({_BACKENDS[name]}) is unavailable: {e}") from e
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
    unknown = sorted(set(kwargs) - names) if names is not None else []
    if unknown:
        raise ValueError(f"get_backend: {name!r} backend has no option {', '.join(unknown)}; its "
                         f"options are {sorted(names)}")
    return cls(**kwargs)
