"""QVG attention over quantized chunks partitioned over a device mesh: the Pallas kernels inside
``shard_map``.

Dimensions: B batch, K kv heads, R = G * T query rows per kv head, D head dim, NC chunks.

XLA's SPMD partitioner does not split a ``pallas_call`` (an opaque custom call), so on a mesh the
kernel works on each device's block of the operands only inside ``jax.shard_map``. QVG's
quantized attention is independent per (row, kv head): the codes, scales, k-means assignments and
centroids of row b and kv head k (``QVGCode`` fields [B, K, NC, ...]) and that head's query rows
give its output and log-sum-exp alone. Splitting the batch over one mesh axis and the kv heads
over another is therefore exact, with any implementation of
:func:`kernels.kv_quant.api.qvg_chunk_attention`, and needs no communication.

* :func:`qvg_chunk_attention_sharded` -- the partitioned attention.
* :class:`ShardedQVGCache` -- :class:`kernels.kv_quant.cache.QVGCache` whose quantized attention runs
  partitioned; :meth:`ShardedQVGCache.cache_sharding` places a layer's cache to match.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kernels import cache_backend, checks
from kernels.kv_quant import api
from kernels.kv_quant import reference as ref
from kernels.kv_quant.cache import QVGCache
from kernels.mesh import mesh_axis


def qvg_chunk_attention_sharded(q: jax.Array, k_code: ref.QVGCode, v_code: ref.QVGCode,
                                cfg: ref.QVGConfig, start: jax.Array, num_quantized: jax.Array,
                                num_new: int, rope_base: Any, mesh: Mesh, *,
                                batch_axis: str | None = "data", head_axis: str | None = "model",
                                implementation: str = "auto", interpret: bool = False
                                ) -> tuple[jax.Array, jax.Array]:
    """:func:`kernels.kv_quant.api.qvg_chunk_attention` run blockwise on ``mesh``.

    Args:
      q: [B, K, R, D] query rows; k_code, v_code: ``QVGCode`` with fields [B, K, NC, ...].
      cfg, start, num_quantized, num_new, rope_base, implementation, interpret: as
        ``qvg_chunk_attention``.
      mesh: the device mesh.
      batch_axis: mesh axis of the rows (unused when its size does not divide B).
      head_axis: mesh axis of the kv heads (unused when its size does not divide K).

    Returns:
      (out float32 [B, K, R, D], lse float32 [B, K, R]), equal to the unpartitioned call.

    Raises:
      ValueError: as ``qvg_chunk_attention``; a mesh axis name the mesh lacks.
    """
    where = "qvg_chunk_attention_sharded"
    b, kh = k_code.codes.shape[:2]
    checks.array(q, "q", where, ndim=4, kind="float", shape=(b, kh, None, None), nonempty=True)
    bax, hax = mesh_axis(mesh, batch_axis, b, where), mesh_axis(mesh, head_axis, kh, where)
    blocks = PartitionSpec(bax, hax)

    def block(q, k_code, v_code, start, num_quantized):
        return api.qvg_chunk_attention(q, k_code, v_code, cfg, start, num_quantized, num_new,
                                       rope_base, implementation, interpret)

    code_specs = jax.tree.map(lambda _: blocks, k_code)
    return jax.shard_map(block, mesh=mesh,
                         in_specs=(blocks, code_specs, code_specs, PartitionSpec(bax),
                                   PartitionSpec(bax)),
                         out_specs=(blocks, blocks), check_vma=False)(
        q, k_code, v_code, start, num_quantized)


@cache_backend.register_backend("qvg_sharded")
@dataclasses.dataclass(frozen=True)
class ShardedQVGCache(QVGCache):
    """:class:`~kernels.kv_quant.cache.QVGCache` whose attention over the quantized chunks runs on
    ``mesh`` with :func:`qvg_chunk_attention_sharded` and whose cache updates and flushes run
    blockwise in ``jax.shard_map`` (rows on ``batch_axis``, kv heads on ``head_axis``): they write
    the window and a filled chunk row by row, which XLA's SPMD partitioner would otherwise turn
    into gathers of whole cache arrays across ``batch_axis``. The full-precision window's attention and the merge
    are ordinary jitted code, which XLA partitions itself.

    Attributes (besides ``QVGCache``'s):
      mesh: the device mesh (None: no partitioning, as ``QVGCache``).
      batch_axis, head_axis: mesh axes of the rows and of the kv heads.
      interpret: run the Pallas kernels in interpret mode (CPU tests).
    """

    mesh: Mesh | None = None
    batch_axis: str | None = "data"
    head_axis: str | None = "model"
    interpret: bool = False

    def cache_sharding(self, layer_cache: dict[str, Any]) -> dict[str, Any]:
        """The ``NamedSharding`` of each leaf of ``layer_cache`` (arrays or abstract shapes):
        leaves of rank >= 2 that lead with [B, K] get rows on ``batch_axis`` and kv heads on
        ``head_axis``; any other leaf is replicated.

        Raises:
          ValueError: no mesh, or an axis name the mesh lacks.
        """
        if self.mesh is None:
            raise ValueError("ShardedQVGCache.cache_sharding: the backend has no mesh")
        b, kh = layer_cache["wk"].shape[:2]
        where = "ShardedQVGCache.cache_sharding"
        spec = PartitionSpec(mesh_axis(self.mesh, self.batch_axis, b, where),
                             mesh_axis(self.mesh, self.head_axis, kh, where))

        def leaf(x):
            lead = tuple(x.shape[:2])
            return NamedSharding(self.mesh, spec if lead == (b, kh) else PartitionSpec(
                spec[0] if x.shape[:1] == (b,) else None))
        return jax.tree.map(leaf, layer_cache)

    def update(self, layer_cache, k, v, start):
        """:meth:`QVGCache.update` on each (rows, kv heads) block of ``mesh``; equal to the
        unpartitioned update (each block passes its first kv head's global index, so k-means draws
        the same keys)."""
        if self.mesh is None:
            return super().update(layer_cache, k, v, start)
        where = "ShardedQVGCache.update"
        b, kh, cap, d = self._layout(layer_cache, where)
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=cap, head_dim=d,
                            where=where)
        self._in_window(layer_cache, start, 1, where, low=True)  # raises on concrete values
        specs, hax, plain = self._blocks(layer_cache)
        rows = PartitionSpec(specs["wk"][0], hax)

        def block(cache, kb, vb, sb):
            offset = 0 if hax is None else jax.lax.axis_index(hax) * kb.shape[1]
            return plain.update(cache, kb, vb, sb, head_offset=offset)

        return jax.shard_map(block, mesh=self.mesh,
                             in_specs=(specs, rows, rows, PartitionSpec(specs["wk"][0])),
                             out_specs=specs, check_vma=False)(
            layer_cache, k, v, jnp.asarray(start, jnp.int32))

    def flush(self, layer_cache):
        """:meth:`QVGCache.flush` on each (rows, kv heads) block of ``mesh``; equal to the
        unpartitioned flush (each block passes its first kv head's global index, so k-means draws
        the same keys). Call it at least once every N one-token updates; a no-op when no window
        is full.

        Raises:
          ValueError: ``layer_cache`` is not a QVG layer cache.
        """
        if self.mesh is None:
            return super().flush(layer_cache)
        self._layout(layer_cache, "ShardedQVGCache.flush")
        specs, hax, plain = self._blocks(layer_cache)
        kh = layer_cache["wk"].shape[1]
        kb = kh if hax is None else kh // self.mesh.shape[hax]

        def block(cache):
            offset = 0 if hax is None else jax.lax.axis_index(hax) * kb
            return plain.flush(cache, head_offset=offset)

        return jax.shard_map(block, mesh=self.mesh, in_specs=(specs,), out_specs=specs,
                             check_vma=False)(layer_cache)

    def _blocks(self, layer_cache):
        """(the cache's partition specs, the kv-head mesh axis or None, the plain QVGCache that
        runs on each block)."""
        specs = jax.tree.map(lambda s: s.spec, self.cache_sharding(layer_cache))
        plain = QVGCache(**{f.name: getattr(self, f.name) for f in dataclasses.fields(QVGCache)})
        return specs, specs["wk"][1], plain

    def _attend_quantized(self, qr, layer_cache, start, nq, t):
        if self.mesh is None:
            return super()._attend_quantized(qr, layer_cache, start, nq, t)
        rope = self.rope_base if self.config.pre_rope else None
        return qvg_chunk_attention_sharded(
            qr, layer_cache["k"], layer_cache["v"], self.config, start, nq, t, rope, self.mesh,
            batch_axis=self.batch_axis, head_axis=self.head_axis,
            implementation=self.implementation, interpret=self.interpret)
