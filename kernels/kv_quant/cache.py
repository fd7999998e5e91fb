"""QVG and KIVI KV-cache backends (registered as ``"qvg"`` and ``"kivi"``).

Dimensions: B batch, K kv heads, H = G * K query heads, T new tokens, D head dim, N chunk tokens,
NC chunks, SP = NC * N padded slots, R = G * T query rows per kv head.

Both caches are streaming: recent tokens are held in full precision (the "window", 2N slots per
row); a complete chunk of N tokens is quantized as a whole (QVG: k-means smoothing + residual INTn
per chunk, Quant VideoGen Sec. 3.4's chunk-wise policy; KIVI: keys per channel, Sec. 4.2) into the
chunk store. Attention is the log-sum-exp merge of attention over the quantized chunks and over
the window. QVG stores keys before RoPE (Sec. 3) and re-rotates them to their slot positions when
attending; KIVI stores post-RoPE keys like the original and keeps its last ``residual`` values exact
(a sliding window). The attention over quantized slots goes through the dispatch table of
:mod:`kernels.kv_quant.api` (``implementation=``: the fused XLA path on CPU, the Pallas kernels on
TPU / GPU for QVG).

Decode and flush. A one-token ``update`` (a decode step) only appends the token to the window:
k-means and the chunk write are not part of the per-token step. :meth:`~_ChunkedQuantCache.flush`
quantizes the window's first N slots of every row whose window holds N tokens or more, writes the
chunk into the store and moves the window on; it is a no-op when no window is full. A decode loop
calls it after every step (:func:`kernels.cache_backend.flush_layers`, the models'
``flush_cache``): its k-means sits in a conditional taken once per N steps. The window has room
for 2N positions, so ``flush`` must run at least once every N one-token updates; an update that
would not fit raises ``ValueError`` outside ``jit`` and, inside it, leaves its row unchanged and
``attend`` returns NaN for that row (the protocol's rule for rows out of capacity). A multi-token
``update`` (prefill) quantizes every chunk it completes at once and leaves fewer than N tokens
in the window.

Numerics (on purpose): the decode step whose token completes a chunk attends that chunk in full
precision (the flush after the step quantizes it), where a cache quantizing inside the step
attended it quantized; every later step sees the same quantized chunk as before, and prefill is
unchanged.

State per row: ``num_quantized`` int32 [B] (positions in the chunk store, a multiple of N) and
``window_len`` int32 [B] (positions in the window); window slot ``j`` holds position
``num_quantized + j``.

Capacity: the chunk buffers hold SP = ceil(max_len / N) * N slots, but the cache accepts positions
``0 .. max_len - 1`` only, as every backend
(:class:`kernels.cache_backend.KVCacheBackend`): the requested
``max_len`` is kept in the cache (field ``max_len``, int32 [B]), so that ``jit``-traced positions
are checked against it too; a row out of capacity raises ``ValueError`` outside ``jit`` and, inside
it, is left unchanged by ``update`` and NaN in ``attend``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kernels import attention_math, cache_backend, checks, dispatch
from kernels.kv_quant import api
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import KIVIConfig, QVGConfig
from kernels.rope import is_rope_frequencies, rope_slots

_FIELDS = ("k", "v", "wk", "wv", "num_quantized", "window_len", "max_len")


@dataclasses.dataclass(frozen=True)
class _ChunkedQuantCache(abc.ABC):
    """Shared streaming logic; subclasses define the chunk quantizer and the quantized attention.

    State per row ``b``: ``num_quantized[b]`` positions (a multiple of N) are quantized in the
    chunk store; the window (``wk`` [B, K, 2N, D]) holds positions ``num_quantized[b] + j`` at slot
    ``j``, of which ``window_len[b]`` are written. A one-token ``update`` only appends to the
    window; :meth:`flush` quantizes a full window's first N slots (module docstring).
    """

    @abc.abstractmethod
    def _chunk(self) -> int:
        """Tokens per quantized chunk."""

    @abc.abstractmethod
    def _check(self, head_dim: int) -> None:
        """Raises ValueError if the cache cannot serve this head dimension."""

    @abc.abstractmethod
    def _quantize(self, x: jax.Array, key: jax.Array, is_key: bool) -> Any:
        """Quantizes one chunk of keys (``is_key``) or values."""

    def _pre_rope(self) -> bool:
        return False

    def _chunked_values(self) -> bool:
        """Whether values are quantized in chunks together with the keys (QVG). A subclass that
        returns False stores values its own way and defines ``_init_values(batch_size, max_len,
        num_kv_heads, head_dim, dtype) -> {"v", "wv"}`` and ``_update_values(layer_cache, v,
        start, ok) -> {"v", "wv"}`` (KIVI's sliding window; rows where ``ok`` [B] is False must
        stay unchanged) and its own ``attend``; ``flush`` then leaves ``v`` and ``wv`` as they
        are."""
        return True

    def _quantize_pair(self, quant, xk, xv, keys):
        return quant(xk, keys, True), quant(xv, keys, False)

    def _rope_base(self) -> float:
        return 10_000.0

    # -- protocol -------------------------------------------------------------------------------

    def _layout(self, layer_cache, where: str) -> tuple[int, int, int, int]:
        """(B, K, capacity, D) of a layer cache, which must be one of this backend's.

        The capacity is ``init``'s ``max_len`` when the cache's ``max_len`` leaf is concrete;
        under ``jit`` it is only known at run time, and this returns the padded buffer's SP =
        NC * N slots (an upper bound, for the shape checks; :meth:`_in_capacity` applies the
        exact one to traced positions)."""
        n = self._chunk()
        if not isinstance(layer_cache, dict) or any(f not in layer_cache for f in _FIELDS):
            got = sorted(layer_cache) if isinstance(layer_cache, dict) else type(layer_cache)
            raise checks.error(where, "layer_cache", f"a {type(self).__name__} layer cache (from "
                               f"init, with fields {_FIELDS})", got)
        b, kh, w, d = layer_cache["wk"].shape
        if w != 2 * n:
            raise checks.error(where, "layer_cache", f"a {type(self).__name__} layer cache with a "
                               f"window of 2N = {2 * n} slots (from init)", f"{w} window slots")
        nc = jax.tree.leaves(layer_cache["k"])[0].shape[2]
        cap = layer_cache["max_len"]
        if not checks.is_traced(cap):
            return b, kh, int(np.min(np.asarray(cap))), d
        return b, kh, nc * n, d

    @staticmethod
    def _in_capacity(layer_cache, start, num_new) -> jax.Array:
        """bool [B]: the rows whose new slots lie in ``0 .. max_len - 1`` (the requested capacity,
        not the padded buffer's)."""
        return cache_backend.rows_in_capacity(start, num_new, layer_cache["max_len"])

    def _in_window(self, layer_cache, start, num_new, where: str, low: bool) -> jax.Array:
        """bool [B]: the rows whose positions ``start[b] .. start[b] + num_new - 1`` the window can
        hold (``start + num_new <= num_quantized + 2N``; with ``low``, also ``start >=
        num_quantized``: an update cannot rewrite quantized positions). Outside ``jit`` (``start``
        and the cache's ``num_quantized`` concrete) a row that fails while in capacity raises
        ``ValueError``."""
        n = self._chunk()
        nq = layer_cache["num_quantized"]
        start = jnp.asarray(start)
        rel = start.astype(jnp.int32) - nq
        ok = rel <= 2 * n - num_new
        if low:
            ok = ok & (rel >= 0)
        if not any(checks.is_traced(x) for x in (start, nq, layer_cache["max_len"])):
            # in NumPy: under a jit that closes over concrete arrays, jnp results are traced
            s_np, q_np = np.asarray(start).astype(np.int64), np.asarray(nq).astype(np.int64)
            cap = (s_np >= 0) & (s_np + num_new <= np.asarray(layer_cache["max_len"]))
            fits = s_np - q_np <= 2 * n - num_new
            if low:
                fits &= s_np >= q_np
            bad = np.flatnonzero(cap & ~fits)
            if bad.size:
                b = int(bad[0])
                s, q = int(np.asarray(start)[b]), int(np.asarray(nq)[b])
                if s < q:
                    raise ValueError(
                        f"{where}: row {b} writes position {s}, below its {q} quantized "
                        f"positions; a {type(self).__name__} cannot rewrite quantized positions "
                        f"(expected start >= {q})")
                span = f"position {s}" if num_new == 1 else f"positions {s}..{s + num_new - 1}"
                raise ValueError(
                    f"{where}: row {b} needs {span}, but its "
                    f"full-precision window holds positions {q}..{q + 2 * n - 1} (2N slots, "
                    f"N = {n}): call flush(layer_cache) at least once every N = {n} one-token "
                    "updates (it quantizes the window's first chunk once the window holds N "
                    "tokens)")
        return ok

    def init(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        checks.cache_init(batch_size, max_len, num_kv_heads, head_dim, dtype,
                          f"{type(self).__name__}.init")
        self._check(head_dim)
        n = self._chunk()
        nc = -(-max_len // n)
        proto = jnp.zeros((n, head_dim), jnp.float32)
        chunked_v = self._chunked_values()
        cache = {}
        for name, is_key in (("k", True), ("v", False))[:2 if chunked_v else 1]:
            shapes = jax.eval_shape(lambda x, ik=is_key: self._quantize(x, jax.random.key(0), ik),
                                    proto)
            cache[name] = jax.tree.map(
                lambda s: jnp.zeros((batch_size, num_kv_heads, nc) + s.shape, s.dtype), shapes)
        window = (batch_size, num_kv_heads, 2 * n, head_dim)
        cache["wk"] = jnp.zeros(window, dtype)
        if chunked_v:  # a buffer of its own: two leaves sharing one could not be donated
            cache["wv"] = jnp.zeros(window, dtype)
        else:
            cache.update(self._init_values(batch_size, max_len, num_kv_heads, head_dim, dtype))
        cache["num_quantized"] = jnp.zeros((batch_size,), jnp.int32)
        cache["window_len"] = jnp.zeros((batch_size,), jnp.int32)
        # The requested capacity: the chunk buffers round it up to NC * N slots, which must not
        # widen the positions the cache accepts.
        cache["max_len"] = jnp.full((batch_size,), max_len, jnp.int32)
        return cache

    def _codes(self, bk, bv, first, nj, head_offset):
        """Codes of ``nj`` consecutive chunks held in window buffers ``bk``, ``bv`` [B, K, >= nj N,
        D] whose slot 0 is chunk ``first[b]``: fields [B, K, nj, ...] (keys un-rotated from their
        positions first when stored before RoPE). k-means keys: ``fold_in(fold_in(seed, chunk),
        head_offset + kv head)``."""
        b, kh, _, d = bk.shape
        n = self._chunk()
        xk = bk[:, :, :nj * n].astype(jnp.float32)
        if self._pre_rope():
            xk = rope_slots(xk, self._rope_base(), first * n, sign=-1)
        xk = xk.reshape(b, kh, nj, n, d)
        base = jax.random.key(getattr(self, "seed", 0))
        chunk_id = first[:, None, None] + jnp.arange(nj)[None, None, :]  # [B, 1, nj]
        head_id = jnp.arange(kh)[None, :, None] + head_offset
        keys = jax.vmap(jax.vmap(jax.vmap(lambda c, h: jax.random.fold_in(
            jax.random.fold_in(base, c), h))))(
            jnp.broadcast_to(chunk_id, (b, kh, nj)), jnp.broadcast_to(head_id, (b, kh, nj)))
        quant = jax.vmap(jax.vmap(jax.vmap(self._quantize, (0, 0, None)), (0, 0, None)),
                         (0, 0, None))
        if self._chunked_values():
            xv = bv[:, :, :nj * n].astype(jnp.float32).reshape(b, kh, nj, n, d)
            return self._quantize_pair(quant, xk, xv, keys)
        return quant(xk, keys, True), None

    def update(self, layer_cache, k, v, start, *, head_offset: Any = 0):
        """Writes ``k, v [B, K, T, D]`` at positions ``start[b] ..`` (the backend protocol).

        T = 1 (a decode step) only appends the token to the full-precision window, at slot
        ``start - num_quantized``: no k-means, no chunk write. The window holds 2N positions, so
        the caller must call :meth:`flush` at least once every N one-token updates; a row whose
        token would not fit (or that would rewrite a quantized position) raises ``ValueError``
        outside ``jit`` and, inside it, is left unchanged and poisoned by ``attend`` (the
        protocol's rule for rows out of capacity).

        T > 1 (prefill): every chunk the window completes is quantized here, a full chunk left
        by earlier one-token updates included (the same codes as :meth:`flush` followed by the
        write), so that fewer than N tokens stay in the window; k-means is seeded per (chunk,
        kv head). ``head_offset`` (an int or a traced int32 scalar) is the global index of the
        first kv head of ``k``: a partitioned update (``ShardedQVGCache``) passes its block's
        offset so that every kv head draws the same k-means keys as in the unpartitioned cache.
        """
        where = f"{type(self).__name__}.update"
        b, kh, cap, d = self._layout(layer_cache, where)
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=cap, head_dim=d,
                            where=where)
        t = k.shape[2]
        start = jnp.asarray(start)
        # the window must hold position start (T = 1: the token; T > 1: where the write begins)
        ok = self._in_capacity(layer_cache, start, t) & self._in_window(
            layer_cache, start, 1, where, low=True)
        if t == 1:
            return self._append(layer_cache, k, v, start, ok)
        return self._write_chunks(layer_cache, k, v, start, ok, head_offset)

    def _append(self, layer_cache, k, v, start, ok):
        """The one-token update: one in-place write per row into the window (B is static; a
        ``vmap`` here would become a scatter)."""
        nq = layer_cache["num_quantized"]
        slot = jnp.where(ok, start.astype(jnp.int32) - nq, 0)
        out = dict(layer_cache)
        out["wk"] = _write_rows(layer_cache["wk"], k, slot, ok)
        if self._chunked_values():
            out["wv"] = _write_rows(layer_cache["wv"], v, slot, ok)
        else:
            out.update(self._update_values(layer_cache, v, jnp.where(ok, start, 0).astype(
                jnp.int32), ok))
        out["window_len"] = jnp.where(ok, slot + 1, layer_cache["window_len"])
        return out

    def _write_chunks(self, layer_cache, k, v, start, ok, head_offset):
        """The multi-token update: window + new tokens, every completed chunk quantized."""
        b, kh, t, d = k.shape
        n = self._chunk()
        nq = layer_cache["num_quantized"]
        off = jnp.where(ok, start.astype(jnp.int32) - nq, 0)  # window slot of start, < 2N
        first = nq // n  # chunk index of window slot 0
        nj = (2 * n - 1 + t) // n  # static: chunks that can complete in this call
        n_full = jnp.where(ok, (off + t) // n, 0)  # [B] chunks completed now

        def buffer(w, new, o):  # w [K, 2N, D], new [K, T, D] -> [K, (nj + 2) N, D]
            buf = jnp.zeros((kh, (nj + 2) * n, d), w.dtype).at[:, :2 * n].set(w)
            return jax.lax.dynamic_update_slice(buf, new.astype(w.dtype), (0, o, 0))

        chunked_v = self._chunked_values()
        bufk = jax.vmap(buffer)(layer_cache["wk"], k, off)
        bufv = jax.vmap(buffer)(layer_cache["wv"], v, off) if chunked_v else None

        def quantize_completed(bufs):
            # Operands: the window buffers only (never the cache's chunk store), so the branch
            # that runs k-means neither reads nor copies the quantized cache.
            return self._codes(bufs[0], bufs[1], first, nj, head_offset)

        def no_chunk(bufs):  # the same shapes as quantize_completed, never written (ok False)
            shapes = jax.eval_shape(quantize_completed, bufs)
            return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)

        # Chunks of this call's new codes [B, K, nj, ...]: k-means runs only when a chunk filled.
        ck, cv = jax.lax.cond(jnp.any(n_full > 0), quantize_completed, no_chunk, (bufk, bufv))
        sk = layer_cache["k"]
        sv = layer_cache["v"] if chunked_v else None
        for j in range(nj):  # in-place writes of single chunks outside the conditional
            okj = j < n_full  # [B]
            sk = _masked_chunk_write(sk, ck, j, first + j, okj)
            if chunked_v:
                sv = _masked_chunk_write(sv, cv, j, first + j, okj)

        def new_window(buf, m, old, okb):
            return jnp.where(okb, jax.lax.dynamic_slice_in_dim(buf, m * n, 2 * n, axis=1), old)

        out = dict(layer_cache)
        out.update(k=sk, wk=jax.vmap(new_window)(bufk, n_full, layer_cache["wk"], ok),
                   num_quantized=nq + n * n_full,
                   window_len=jnp.where(ok, off + t - n * n_full, layer_cache["window_len"]))
        if chunked_v:
            out.update(v=sv, wv=jax.vmap(new_window)(bufv, n_full, layer_cache["wv"], ok))
        else:
            out.update(self._update_values(layer_cache, v, jnp.where(ok, start, 0).astype(
                jnp.int32), ok))
        return out

    def flush(self, layer_cache, *, head_offset: Any = 0):
        """Quantizes the next chunk of every row whose window holds N or more tokens.

        For such a row the window's first N slots (positions ``num_quantized ..
        num_quantized + N - 1``) are quantized as chunk ``num_quantized / N`` with the same
        quantizer and k-means keys as a prefill (keys un-rotated from their positions first
        when stored before RoPE), written in place into the chunk store, and the window moves
        on by N slots; other rows are unchanged, and a cache without a full window is returned
        as it is (a no-op). k-means sits in a conditional taken only when some row is full.

        Call it at least once every N one-token updates (a decode loop: after every step; the
        conditional makes that cheap). ``head_offset``: as in :meth:`update`.

        Args:
          layer_cache: a layer cache of this backend.

        Returns:
          the layer cache, fields as ``init``'s.

        Raises:
          ValueError: ``layer_cache`` is not one of this backend's layer caches.
        """
        self._layout(layer_cache, f"{type(self).__name__}.flush")
        n = self._chunk()
        nq, wl = layer_cache["num_quantized"], layer_cache["window_len"]
        full = wl >= n  # [B]
        first = nq // n
        chunked_v = self._chunked_values()
        names = ("wk", "wv") if chunked_v else ("wk",)
        windows = {name: layer_cache[name] for name in names}
        stores = {name: layer_cache[name] for name in ("k", "v")[:len(names)]}

        def quantize(operands):
            # k-means reads the windows only; the chunk store is written in place, one chunk
            # per full row, so a call without a full row (N - 1 of every N) writes nothing.
            ws, st = operands
            ck, cv = self._codes(ws["wk"], ws.get("wv"), first, 1, head_offset)
            shifted = {name: jnp.where(full[:, None, None, None], jnp.concatenate(
                [w[:, :, n:], jnp.zeros_like(w[:, :, n:])], axis=2), w)
                for name, w in ws.items()}
            st = {name: _masked_chunk_write(x, c, 0, first, full)
                  for (name, x), c in zip(st.items(), (ck, cv))}
            return shifted, st

        windows, stores = jax.lax.cond(jnp.any(full), quantize, lambda ops: ops,
                                       (windows, stores))
        out = dict(layer_cache)
        out.update(windows)
        out.update(stores)
        out["num_quantized"] = nq + n * full
        out["window_len"] = wl - n * full
        return out

    def _check_attend(self, layer_cache, q, start):
        where = f"{type(self).__name__}.attend"
        b, kh, cap, d = self._layout(layer_cache, where)
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=cap, head_dim=d, where=where)
        return self._in_capacity(layer_cache, start, q.shape[2]) & self._in_window(
            layer_cache, start, q.shape[2], where, low=False)

    def attend(self, layer_cache, q, start):
        ok = self._check_attend(layer_cache, q, start)
        b, h, t, d = q.shape
        kh = layer_cache["wk"].shape[1]
        n = self._chunk()
        # A row out of capacity (or past its window) attends as if at position 0 with nothing
        # quantized and is then poisoned: its position must not reach the kernels (the XLA path
        # loops up to the largest row's chunk count).
        start = jnp.where(ok, start, 0).astype(jnp.int32)
        nq = jnp.where(ok, layer_cache["num_quantized"], 0)  # [B] quantized slots
        qr = q.reshape(b, kh, (h // kh) * t, d)
        o1, l1 = self._attend_quantized(qr, layer_cache, start, nq, t)
        rows = qr.shape[2]
        pos = start[:, None] + jnp.arange(rows) % t  # [B, R]
        slot = nq[:, None] + jnp.arange(2 * n)  # [B, 2N]: window slot j holds position nq + j
        valid = (slot[:, None, :] <= pos[:, :, None])[:, None]
        o2, l2 = attention_math.partial_attention(qr, layer_cache["wk"], layer_cache["wv"], valid)
        out = cache_backend.poison_rows(attention_math.merge_lse(o1, l1, o2, l2), ok)
        return out.reshape(b, h, t, d).astype(q.dtype)


def _write_rows(buf, new, slot, ok):
    """``buf`` [B, K, W, D] with ``new`` [B, K, T, D] written at slots ``slot[b] ..`` of the rows
    where ``ok[b]`` (the others read back what lies there): one ``dynamic_update_slice`` per row
    (B is static), in place on a donated buffer."""
    zeros = (0,) * (buf.ndim - 3)
    for b in range(buf.shape[0]):
        at = (b, 0, slot[b]) + zeros
        size = (1,) + new.shape[1:]
        old = jax.lax.dynamic_slice(buf, at, size)
        buf = jax.lax.dynamic_update_slice(
            buf, jnp.where(ok[b], new[b:b + 1].astype(buf.dtype), old), at)
    return buf


def _masked_chunk_write(store, codes, j, index, ok):
    """store fields [B, K, NC, ...] <- codes fields [B, K, nj, ...][:, :, j] at chunk ``index[b]``
    for the rows where ``ok[b]``.

    One ``dynamic_update_slice`` of one chunk per row (B is static; a ``vmap`` here would become
    a scatter): on a donated store XLA writes the chunk in place, and the row mask is applied to
    that chunk alone (the old chunk is read back where ``ok[b]`` is False), never to the store.
    """
    def leaf(s, c):  # s [B, K, NC, ...], c [B, K, nj, ...]
        zeros = (0,) * (s.ndim - 3)
        for b in range(s.shape[0]):
            at = (b, 0, index[b]) + zeros
            size = (1, s.shape[1], 1) + s.shape[3:]
            old = jax.lax.dynamic_slice(s, at, size)
            new = jnp.where(ok[b], c[b:b + 1, :, j:j + 1], old)
            s = jax.lax.dynamic_update_slice(s, new, at)
        return s

    return jax.tree.map(leaf, store, codes)


@cache_backend.register_backend("qvg")
@dataclasses.dataclass(frozen=True)
class QVGCache(_ChunkedQuantCache):
    """QVG-quantized KV cache backend (``get_backend("qvg", config=..., ...)``).

    Attributes:
      config: :class:`QVGConfig` (bits, stages, block, centroids, chunk, k-means iterations).
      rope_base: the model's RoPE base (keys are stored before RoPE when ``config.pre_rope``).
      implementation: quantized attention path, see
        :func:`kernels.kv_quant.api.resolve_implementation` (``"auto"``: the fused XLA path on
        CPU, the Pallas kernel on TPU / GPU).
      seed: k-means++ seeding (folded with chunk and head indices).

    Chunk-wise policy (Quant VideoGen Sec. 3.4): a chunk is quantized once it is complete, by
    :meth:`flush` after a decode step (or by a prefill ``update``); the step whose token completes
    a chunk attends that chunk in full precision, later steps attend its codes.

    Cache fields: ``k``, ``v`` (:class:`~kernels.kv_quant.reference.QVGCode` of the quantized
    chunks, fields [B, K, NC, ...]), ``wk``, ``wv`` [B, K, 2N, D] (the window, full precision),
    ``num_quantized``, ``window_len`` int32 [B] and ``max_len`` int32 [B] (module docstring).
    """

    config: QVGConfig = QVGConfig()
    rope_base: float = 10_000.0
    implementation: str = "auto"
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.config, QVGConfig):
            raise checks.error("QVGCache", "config", "a QVGConfig", repr(self.config))
        # a float base, or the model's RoPE (an object with inv_freq, e.g. with its scaling)
        if not is_rope_frequencies(self.rope_base):
            checks.number(self.rope_base, "rope_base", "QVGCache", minimum=0.0, open_min=True)
        checks.integer(self.seed, "seed", "QVGCache")
        api.resolve_implementation(self.implementation, "QVGCache", api.QVG)

    def _chunk(self):
        return self.config.chunk

    def _check(self, head_dim):
        self.config.check_head_dim(head_dim)
        # at init, on the platform in use: a shape the picked kernel cannot tile is refused here
        dispatch.check_kernel_shape(api.TABLE, self.implementation,
                                    api.kernel_shapes(self.config.chunk, head_dim),
                                    "QVGCache.init", entry=api.QVG)

    def _pre_rope(self):
        return self.config.pre_rope

    def _rope_base(self):
        return self.rope_base

    def _quantize(self, x, key, is_key):
        del is_key
        return ref.qvg_quantize_chunk(x, self.config, key)

    def _quantize_pair(self, quant, xk, xv, keys):
        # One batched quantizer for keys and values (same method): half the compiled graph.
        both = quant(jnp.concatenate([xk, xv], axis=0),
                     jnp.concatenate([keys, jax.vmap(jax.vmap(jax.vmap(
                         lambda k: jax.random.fold_in(k, 1))))(keys)], axis=0), True)
        b = xk.shape[0]
        return jax.tree.map(lambda a: a[:b], both), jax.tree.map(lambda a: a[b:], both)

    def _attend_quantized(self, qr, layer_cache, start, nq, t):
        rope = self.rope_base if self.config.pre_rope else None
        return api.qvg_chunk_attention(qr, layer_cache["k"], layer_cache["v"], self.config, start, nq,
                                   t, rope, self.implementation)


@cache_backend.register_backend("kivi")
@dataclasses.dataclass(frozen=True)
class KIVICache(_ChunkedQuantCache):
    """KIVI KV cache backend (``get_backend("kivi", config=KIVIConfig(...))``), after Liu et al.
    (2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", Sec. 3.3 and Alg. 1).

    Keys are quantized per channel, ``residual`` tokens at a time (statistics over groups of
    ``group`` tokens); until a chunk of keys is complete, and flushed (:meth:`flush` after a
    decode step; a prefill ``update`` quantizes at once), it stays in full precision: the step
    whose token completes a chunk attends its keys exactly. Values are
    quantized per token (blocks of ``block`` channels) and the most recent ``residual`` values are
    always exact: a sliding full-precision window, the oldest value leaving it at each new token.
    Because per-token quantization does not depend on other tokens, each value is quantized once on
    arrival (into a per-token store) and its exact copy kept in a ring buffer of ``residual`` slots;
    attention reads the exact copy for the last ``residual`` positions of each row and the
    dequantized one before them: the same numbers as quantizing a value when it leaves the window.
    (The store also holds codes for the window's tokens: ``residual * D * bits`` bits per head more
    than the paper's layout.) Attention goes through :func:`kernels.kv_quant.api.kivi_attention`
    (``implementation``: the fused XLA path by default, or the dequantize-everything reference).

    Cache fields: ``k`` (key chunks), ``wk`` [B, K, 2N, D] (the key window), ``v`` (per-token
    value codes over SP slots), ``wv`` [B, K, R, D] (ring of exact values, position p at slot
    p mod R), ``num_quantized``, ``window_len`` and ``max_len`` int32 [B] (module docstring), with
    N = R = ``residual``.
    """

    config: KIVIConfig = KIVIConfig()
    implementation: str = "auto"

    def _chunk(self):
        return self.config.chunk

    def _check(self, head_dim):
        self.config.check_head_dim(head_dim)

    def _quantize(self, x, key, is_key):
        del key
        return ref.kivi_quantize_chunk(x, self.config, per_channel=is_key)

    def _chunked_values(self):
        return False

    def _init_values(self, batch_size, max_len, num_kv_heads, head_dim, dtype):
        n = self._chunk()
        slots = -(-max_len // n) * n  # SP: the same padded slots as the key chunks
        shapes = jax.eval_shape(lambda x: self._quantize(x, None, False),
                                jnp.zeros((1, head_dim), jnp.float32))
        store = jax.tree.map(
            lambda s: jnp.zeros((batch_size, num_kv_heads, slots) + s.shape[1:], s.dtype), shapes)
        ring = jnp.zeros((batch_size, num_kv_heads, self.config.residual, head_dim), dtype)
        return {"v": store, "wv": ring}

    def _update_values(self, layer_cache, v, start, ok):
        b, kh, t, d = v.shape
        r = self.config.residual
        quant = jax.vmap(jax.vmap(lambda x: self._quantize(x.astype(jnp.float32), None, False)))
        codes = quant(v)  # fields [B, K, T, ...]: one token per row
        store = jax.tree.map(lambda a, c: cache_backend.write_slots(a, c, start, ok),
                             layer_cache["v"],
                             codes)
        # Only the last min(T, R) new values can still be in the window; their ring slots differ.
        keep = min(t, r)
        tail = v[:, :, t - keep:].astype(layer_cache["wv"].dtype)
        slot = (start[:, None] + (t - keep) + jnp.arange(keep)[None, :]) % r  # [B, keep]
        ring = jax.vmap(lambda w, x, i, o: w.at[:, i].set(jnp.where(o, x, w[:, i])))(
            layer_cache["wv"], tail, slot, ok)
        return {"v": store, "wv": ring}

    def __post_init__(self):
        if not isinstance(self.config, KIVIConfig):
            raise checks.error("KIVICache", "config", "a KIVIConfig", repr(self.config))
        api.resolve_implementation(self.implementation, "KIVICache", api.KIVI)

    def attend(self, layer_cache, q, start):
        ok = self._check_attend(layer_cache, q, start)
        b, h, t, d = q.shape
        kh = layer_cache["wk"].shape[1]
        qr = q.reshape(b, kh, (h // kh) * t, d)
        # attend out-of-capacity rows at position 0, then poison them (as QVG's attend)
        out = api.kivi_attention(qr, layer_cache["k"], layer_cache["wk"], layer_cache["v"],
                                 layer_cache["wv"], self.config,
                                 jnp.where(ok, start, 0).astype(jnp.int32), t, self.implementation,
                                 num_quantized=jnp.where(ok, layer_cache["num_quantized"], 0))
        out = cache_backend.poison_rows(out, ok)
        return out.reshape(b, h, t, d).astype(q.dtype)


def cache_bytes(layer_caches: list[Any]) -> int:
    """Bytes held by a list of per-layer caches (every leaf, windows included)."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(layer_caches)))
