"""Pieces every KV-cache kernel shares: the backend protocol and registry, dense grouped attention,
partial-attention merging, bit packing of low-bit codes and the RoPE rotation.

A leaf module: it imports only JAX, NumPy and :mod:`kernels.checks`, so ``kernels/<op>/`` and
``models/`` can both build on it (``models`` -> ``kernels`` is the one allowed direction).

Dimensions: B batch, H query heads, K kv heads, G = H / K, S cache slots, T new tokens, D head dim,
R query rows per kv head, L positions, N heads (RoPE), W packed words per vector.

* Backends (:class:`KVCacheBackend`, :func:`register_backend`, :func:`registered_backends`): a
  backend is a frozen (hashable) dataclass with three methods, all traceable under ``jit``:

  - ``init(batch_size, max_len, num_kv_heads, head_dim, dtype) -> layer_cache`` (a pytree);
  - ``update(layer_cache, k, v, start) -> layer_cache`` writes new keys/values ``k, v [B, K, T, D]``
    (RoPE already applied to ``k``; a backend that wants pre-RoPE keys undoes it exactly with
    ``apply_rope(k, -positions)``) at slots ``start[b] .. start[b] + T - 1``;
  - ``attend(layer_cache, q, start) -> out``: attention of ``q [B, H, T, D]`` over slots
    ``0 .. start[b] + t`` for new token ``t`` (causal), ``[B, H, T, D]`` in ``q``'s dtype.

  Capacity: a cache from ``init(..., max_len, ...)`` holds positions ``0 .. max_len - 1``, for
  every backend (one that allocates a buffer rounded up to whole chunks or pages still refuses
  positions ``>= max_len``). A row ``b`` whose slots ``start[b] .. start[b] + T - 1`` do not all
  lie in that range is out of capacity:

  - outside ``jit`` (concrete ``start``), ``update`` and ``attend`` raise ``ValueError`` naming
    the backend, the positions and the capacity;
  - inside ``jit`` (``start`` traced, no exception possible), ``update`` leaves that row of the
    cache bit-identical (no write is clamped onto the last slots) and ``attend`` returns NaN for
    every output of that row, so the fault is visible; other rows are unaffected
    (:func:`rows_in_capacity`, :func:`poison_rows`, :func:`write_slots`).

  A fresh cache can be donated (``jax.jit(update, donate_argnums=0)``): no two of its leaves
  share a buffer.

  Each backend module registers its classes by name with ``@register_backend("name")``;
  ``models.kv_cache.get_backend`` (the one lookup) imports every backend module by an explicit
  list and builds a backend from its name and options.
* Dense attention: :func:`grouped_attention` (GQA softmax over a cache), :func:`causal_cache_mask`,
  :class:`DenseKVCache` (the reference backend, ``"dense"``).
* Partials of attention over disjoint key sets (split-K / flash decoding): unnormalised
  ``(acc, m, l)`` from :func:`softmax_partial`, merged by :func:`merge_partials`; or normalised
  ``(out, lse)`` from :func:`partial_attention`, merged by :func:`merge_lse`.
* Bit packing (:func:`pack_codes`, :func:`unpack_codes`): unsigned ``bits``-bit codes, planar, into
  8- or 32-bit words.
* RoPE (Su et al. 2021, "RoFormer", Sec. 3.4.2, half-split form): :func:`rope_angles`,
  :func:`apply_rope`, :func:`rope_slots`. The frequencies are a float base or any object with an
  ``inv_freq(head_dim)`` method (``models.rope.RotaryEmbedding``, which adds the context-extension
  rescalings).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import lax

from kernels import checks

# -- KV-cache backends: the protocol and the registry -----------------------------------------


@runtime_checkable
class KVCacheBackend(Protocol):
    """What ``Transformer.decode`` calls on a KV-cache backend (methods: the module docstring).

    The contract at the edges, for every backend: the capacity is ``init``'s ``max_len``; a row
    whose new slots ``start[b] .. start[b] + T - 1`` leave ``0 .. max_len - 1`` is refused with a
    ``ValueError`` outside ``jit`` and, inside ``jit``, left unchanged by ``update`` and poisoned
    (all NaN) by ``attend``. A fresh cache has no two leaves sharing a buffer, so it can be donated.
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


# -- dense attention over a cache ---------------------------------------------------------------


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
    """bool [B, 1, 1, T, S]: new token t of row b sees slots s <= start[b] + t (``start`` int [B])."""
    limit = start[:, None] + jnp.arange(num_new)[None, :]  # [B, T]
    return (jnp.arange(num_slots)[None, None, :] <= limit[:, :, None])[:, None, None]


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


# -- partial attention and its merge (flash decoding) -------------------------------------------


def softmax_partial(logits: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unnormalised partial of logits [..., R, N] against values [..., N, D]: ``(acc, m, l)`` with
    ``m = max_n logit`` [..., R], ``l = sum_n exp(logit - m)`` [..., R] and
    ``acc = sum_n exp(logit - m) v_n`` float32 [..., R, D]; an all ``-inf`` row gives (0, -inf, 0)."""
    m = logits.max(-1)
    e = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0.0)[..., None])
    acc = jnp.einsum("...gn,...nd->...gd", e, v.astype(jnp.float32))
    return acc, m, e.sum(-1)


def merge_partials(acc: jax.Array, m: jax.Array, l: jax.Array, axis: int) -> jax.Array:
    """Log-sum-exp merge of :func:`softmax_partial` partials stacked on ``axis`` (of ``m`` and ``l``;
    ``acc`` has the extra trailing D): ``sum_s e^{m_s - M} acc_s / sum_s e^{m_s - M} l_s``, float32.

    Empty partials (``m = -inf``, ``l = 0``) weigh nothing; a NaN partial makes the output NaN; if
    every partial is empty the result is 0/0 = NaN, so callers must attend at least one key.
    """
    mm = m.max(axis=axis, keepdims=True)
    w = jnp.exp(m - jnp.where(jnp.isinf(mm), 0.0, mm))  # exp(-inf) = 0 for empty splits
    num = jnp.sum(w[..., None] * acc, axis=axis)
    return num / jnp.sum(w * l, axis=axis)[..., None]


def partial_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
                      ) -> tuple[jax.Array, jax.Array]:
    """Softmax attention of rows ``q [B, K, R, D]`` over ``k, v [B, K, S, D]`` with its log-sum-exp.

    Logits are ``q.k / sqrt(D)`` in float32; ``mask`` bool broadcastable to [B, K, R, S].

    Returns:
      (out float32 [B, K, R, D], 0 where a row sees nothing; lse float32 [B, K, R], -inf there), to
      merge with :func:`merge_lse`.
    """
    d = q.shape[-1]
    s = jnp.einsum("bkrd,bksd->bkrs", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(d)
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m_safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m_safe)
    l = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bkrs,bksd->bkrd", p, v.astype(jnp.float32)) / jnp.where(l > 0, l, 1.0)
    seen = l[..., 0] > 0
    lse = jnp.where(seen, m_safe[..., 0] + jnp.log(jnp.where(seen, l[..., 0], 1.0)), -jnp.inf)
    return out, lse


def merge_lse(o1: jax.Array, lse1: jax.Array, o2: jax.Array, lse2: jax.Array) -> jax.Array:
    """Combines two normalised partials over disjoint key sets: float32 [..., R, D] from
    ``(o1, lse1)`` and ``(o2, lse2)`` (lse [..., R]); two empty partials give 0."""
    m = jnp.maximum(lse1, lse2)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w1, w2 = jnp.exp(lse1 - m)[..., None], jnp.exp(lse2 - m)[..., None]
    return (o1 * w1 + o2 * w2) / jnp.maximum(w1 + w2, 1e-30)


# -- bit packing --------------------------------------------------------------------------------

_WORD_DTYPES = {8: jnp.uint8, 32: jnp.uint32}


def _packing(bits: int, word_bits: int, where: str) -> int:
    if bits not in (1, 2, 4, 8):
        raise checks.error(where, "bits", "one of 1, 2, 4, 8", repr(bits))
    if word_bits not in _WORD_DTYPES:
        raise checks.error(where, "word_bits", "8 or 32", repr(word_bits))
    return word_bits // bits


def pack_codes(codes: jax.Array, bits: int, word_bits: int = 8) -> jax.Array:
    """Packs unsigned ``bits``-bit codes [..., D] (values in 0 .. 2^bits - 1) into words [..., W].

    ``n = word_bits / bits`` codes per word, W = D / n, planar order: channel ``d`` goes to word
    ``d % W`` at bit ``bits * (d // W)``, so unpacking plane ``s`` yields the contiguous channels
    ``s*W .. s*W + W - 1`` (kernels unpack without permuting lanes).

    Returns:
      uint8 [..., W] (``word_bits=8``) or int32 [..., W] (``word_bits=32``, the bits of a uint32).

    Raises:
      ValueError: ``bits`` not in {1, 2, 4, 8}, ``word_bits`` not 8 or 32, or D not a multiple of
        the codes per word.
    """
    n = _packing(bits, word_bits, "pack_codes")
    d = codes.shape[-1]
    if d % n:
        raise checks.error("pack_codes", "codes", f"[..., D] with D a multiple of {n} ({bits}-bit "
                           f"codes in {word_bits}-bit words)", f"D = {d}")
    wd = _WORD_DTYPES[word_bits]
    c = codes.astype(wd).reshape(*codes.shape[:-1], n, d // n)
    shifts = (bits * jnp.arange(n, dtype=jnp.uint32)).astype(wd)
    words = jnp.sum(c << shifts[:, None], axis=-2, dtype=wd)  # disjoint bits: sum == or
    return lax.bitcast_convert_type(words, jnp.int32) if word_bits == 32 else words


def unpack_codes(words: jax.Array, bits: int) -> jax.Array:
    """Inverse of :func:`pack_codes`: uint8 or int32 words [..., W] -> uint8 codes [..., n * W].

    Raises:
      ValueError: ``bits`` not in {1, 2, 4, 8} or ``words`` not uint8 / int32 / uint32.
    """
    if words.dtype == jnp.uint8:
        word_bits, u = 8, words
    elif words.dtype in (jnp.int32, jnp.uint32):
        word_bits, u = 32, lax.bitcast_convert_type(words, jnp.uint32)
    else:
        raise checks.error("unpack_codes", "words", "uint8, int32 or uint32", str(words.dtype))
    n = _packing(bits, word_bits, "unpack_codes")
    shifts = (bits * jnp.arange(n, dtype=jnp.uint32)).astype(u.dtype)
    c = (u[..., None, :] >> shifts[:, None]) & jnp.asarray((1 << bits) - 1, u.dtype)
    return c.reshape(*words.shape[:-1], n * words.shape[-1]).astype(jnp.uint8)


# -- RoPE ---------------------------------------------------------------------------------------


def is_rope_frequencies(base: Any) -> bool:
    """True for an object that supplies RoPE frequencies (an ``inv_freq(head_dim)`` method, e.g.
    ``models.rope.RotaryEmbedding``) rather than a plain float base."""
    return callable(getattr(base, "inv_freq", None))


def rope_angles(positions: jax.Array, head_dim: int, base: Any = 10_000.0) -> jax.Array:
    """Rotation angles float32 [..., D/2] (radians) for integer ``positions`` [...]:
    ``pos * base^(-2i/D)``, or ``pos * base.inv_freq(D)`` when ``base`` supplies frequencies
    (:func:`is_rope_frequencies`)."""
    if is_rope_frequencies(base):
        inv_freq = jnp.asarray(base.inv_freq(head_dim))
    else:
        inv_freq = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    return positions.astype(jnp.float32)[..., None] * inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, base: Any = 10_000.0) -> jax.Array:
    """Rotates pairs (x_i, x_{i+D/2}) of ``x`` [B, L, N, D] by the angles of ``positions`` [B, L].

    The map is orthogonal, so ``apply_rope(apply_rope(x, p), -p) == x`` up to rounding, and
    ``<R_p q, R_s k>`` depends on ``p - s`` only. YaRN's ``attention_scale`` is not applied here
    (the rotation stays orthogonal and invertible); models multiply the queries by its square.
    Returns an array of ``x``'s dtype (computed in float32).
    """
    d = x.shape[-1]
    ang = rope_angles(positions, d, base)[:, :, None, :]  # [B, L, 1, D/2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def rope_slots(k: jax.Array, base: Any, offset: jax.Array | int = 0, sign: int = 1) -> jax.Array:
    """RoPE on cache-layout keys ``k [B, K, S, D]`` at positions ``offset + 0 .. S-1`` (``offset``
    int or int [B]); ``sign=-1`` undoes it. Returns ``k``'s dtype."""
    b, _, s, _ = k.shape
    pos = jnp.broadcast_to(jnp.asarray(offset, jnp.int32).reshape(-1, 1) + jnp.arange(s), (b, s))
    return apply_rope(k.transpose(0, 2, 1, 3), sign * pos, base).transpose(0, 2, 1, 3)


def mesh_axis(mesh: Any, name: str | None, size: int, where: str) -> str | None:
    """The mesh axis a dimension of ``size`` is split over in a ``shard_map``ped kernel call:
    ``name`` when it is one of ``mesh``'s axes and its device count divides ``size``, else None
    (the dimension stays whole on every device).

    Raises:
      ValueError: ``name`` is not an axis of ``mesh`` (the message starts with ``where``).
    """
    if name is None:
        return None
    if name not in mesh.axis_names:
        raise ValueError(f"{where}: mesh axis {name!r} is not one of the mesh's axes "
                         f"{tuple(mesh.axis_names)}")
    return name if size % mesh.shape[name] == 0 else None
