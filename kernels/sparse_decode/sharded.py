"""FFD decode attention partitioned over a device mesh: the Pallas kernels inside ``shard_map``.

Dimensions: B batch, H query heads, K kv heads, G = H / K, D head dim, p page size, P pages.

XLA partitions ordinary jitted code over a mesh by itself, but its SPMD partitioner does not split
a ``pallas_call`` (an opaque custom call), so a kernel works on each device's block only inside
``shard_map``. FFD's decode is independent per (row, kv head): the page scan, the
top-delta page selection (paper Sec. 3) and the attention over the kept pages of row b and kv head
k read only ``cache[..][b, k]`` and the G query heads of that kv head. So the decode is exactly
partitioned by splitting the batch over one mesh axis and the kv heads (with their query heads)
over another, and running :func:`kernels.sparse_decode.api.ffd_decode` -- with any implementation,
the Pallas TPU and GPU kernels included -- on each device's block (``jax.shard_map``). No
communication is needed; the output keeps the operands' sharding.

* :func:`ffd_decode_sharded` -- the partitioned decode.
* :func:`partition_specs` -- the ``PartitionSpec``s it uses for given shapes (an axis that does not
  divide its dimension is not used: that dimension is replicated).
* :class:`ShardedFFDCache` -- :class:`kernels.sparse_decode.cache.FFDCache` whose cache update and
  one-token decode run partitioned; place its cache leaves with :meth:`ShardedFFDCache.cache_sharding`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from kernels import cache_backend, checks
from kernels.mesh import mesh_axis
from kernels.sparse_decode import api
from kernels.sparse_decode import reference as ref
from kernels.sparse_decode.cache import FFDCache


def partition_specs(mesh: Mesh, batch: int, kv_heads: int, *, batch_axis: str | None = "data",
                    head_axis: str | None = "model") -> tuple[str | None, str | None]:
    """(batch mesh axis, head mesh axis) used for a decode of ``batch`` rows and ``kv_heads`` kv
    heads: each axis is used when it divides its dimension, else None (replicated).

    Raises:
      ValueError: an axis name that ``mesh`` does not have.
    """
    where = "ffd_decode_sharded"
    return (mesh_axis(mesh, batch_axis, batch, where), mesh_axis(mesh, head_axis, kv_heads, where))


def ffd_decode_sharded(q: jax.Array, cache: dict[str, Any], lengths: jax.Array, mesh: Mesh, *,
                       batch_axis: str | None = "data", head_axis: str | None = "model",
                       return_keep: bool = False, **kwargs):
    """:func:`kernels.sparse_decode.api.ffd_decode` run blockwise on ``mesh`` (``jax.shard_map``).

    Args:
      q: [B, H, D] queries (query head h belongs to kv head h // G, as in ``ffd_decode``).
      cache: an FFD cache; every leaf [B, K, ...].
      lengths: int32 [B] in 1..S.
      mesh: the device mesh (e.g. ``core.sharding.make_mesh``).
      batch_axis: mesh axis the rows are split over (unused when its size does not divide B).
      head_axis: mesh axis the kv heads are split over (unused when it does not divide K).
      return_keep: also return the attended-page mask bool [B, K, P], partitioned the same way.
      **kwargs: the other arguments of ``ffd_decode`` (``delta``, ``delta_unit``, ``top_k``,
        ``max_pages``, ``num_splits``, ``implementation``, ``interpret``).

    Returns:
      as ``ffd_decode``: [B, H, D] in ``q``'s dtype (and the mask), equal to the unpartitioned
      call with the same implementation: each block is the same computation on fewer rows/heads.

    Raises:
      ValueError: as ``ffd_decode``; a mesh axis name the mesh lacks.
    """
    where = "ffd_decode_sharded"
    checks.array(q, "q", where, ndim=3, kind="float", nonempty=True)
    if not isinstance(cache, dict) or "resid" not in cache:
        raise checks.error(where, "cache", "an FFD cache (dict with 'resid')", type(cache).__name__)
    b, kh = cache["resid"].shape[:2]
    if q.shape[0] != b or q.shape[1] % kh:
        raise ValueError(f"{where}: q of shape {tuple(q.shape)} does not match a cache of batch "
                         f"{b} and {kh} kv heads")
    bax, hax = partition_specs(mesh, b, kh, batch_axis=batch_axis, head_axis=head_axis)
    rows = PartitionSpec(bax, hax)

    def block(q, cache, lengths):
        return api.ffd_decode(q, cache, lengths, return_keep=return_keep, **kwargs)

    out_specs = (rows, rows) if return_keep else rows
    return jax.shard_map(block, mesh=mesh, in_specs=(rows, jax.tree.map(lambda _: rows, cache),
                                                     PartitionSpec(bax)),
                         out_specs=out_specs, check_vma=False)(q, cache, lengths)


@cache_backend.register_backend("ffd_sharded")
@dataclasses.dataclass(frozen=True)
class ShardedFFDCache(FFDCache):
    """:class:`~kernels.sparse_decode.cache.FFDCache` whose one-token decode runs on ``mesh`` with
    :func:`ffd_decode_sharded` and whose cache updates run blockwise in ``shard_map`` too
    (prefill attention is ordinary jitted code, which XLA partitions itself).

    Attributes (besides ``FFDCache``'s):
      mesh: the device mesh (None: no partitioning, as ``FFDCache``).
      batch_axis, head_axis: mesh axes of the rows and of the kv heads.
      interpret: run the Pallas kernels in interpret mode (CPU tests).
    """

    mesh: Mesh | None = None
    batch_axis: str | None = "data"
    head_axis: str | None = "model"
    interpret: bool = False

    def cache_sharding(self, layer_cache: dict[str, Any]) -> dict[str, NamedSharding]:
        """The ``NamedSharding`` of each leaf of ``layer_cache`` (or of its abstract shapes) that
        the partitioned decode expects: rows on ``batch_axis``, kv heads on ``head_axis``.

        Raises:
          ValueError: no mesh, or an axis name the mesh lacks.
        """
        if self.mesh is None:
            raise ValueError("ShardedFFDCache.cache_sharding: the backend has no mesh")
        b, kh = layer_cache["resid"].shape[:2]
        spec = PartitionSpec(*partition_specs(self.mesh, b, kh, batch_axis=self.batch_axis,
                                              head_axis=self.head_axis))
        return jax.tree.map(lambda _: NamedSharding(self.mesh, spec), layer_cache)

    def update(self, layer_cache, k, v, start):
        """:meth:`FFDCache.update` run blockwise on ``mesh`` (``jax.shard_map``, rows on
        ``batch_axis``, kv heads on ``head_axis``): each row's write is independent, and the update
        writes its page windows row by row (``reference.update_ffd_cache``), which XLA's SPMD
        partitioner would otherwise turn into gathers of whole cache arrays across ``batch_axis``."""
        if self.mesh is None:
            return super().update(layer_cache, k, v, start)
        ref.check_cache(layer_cache, "ShardedFFDCache.update")
        b, kh, n, p, d = layer_cache["resid"].shape
        checks.cache_update(k, v, start, batch=b, kv_heads=kh, capacity=n * p, head_dim=d,
                            where="ShardedFFDCache.update")
        bax, hax = partition_specs(self.mesh, b, kh, batch_axis=self.batch_axis,
                                   head_axis=self.head_axis)
        rows = PartitionSpec(bax, hax)
        specs = jax.tree.map(lambda _: rows, layer_cache)
        return jax.shard_map(ref.update_ffd_cache, mesh=self.mesh,
                             in_specs=(specs, rows, rows, PartitionSpec(bax)), out_specs=specs,
                             check_vma=False)(layer_cache, k, v, jnp.asarray(start, jnp.int32))

    def attend(self, layer_cache, q, start):
        if self.mesh is None or q.shape[2] != 1:
            return super().attend(layer_cache, q, start)
        ref.check_cache(layer_cache, "ShardedFFDCache.attend")
        b, kh, n, p, d = layer_cache["resid"].shape
        checks.cache_attend(q, start, batch=b, kv_heads=kh, capacity=n * p, head_dim=d,
                            where="ShardedFFDCache.attend")
        ok = cache_backend.rows_in_capacity(start, 1, n * p)
        start = jnp.where(ok, start, 0)  # out-of-capacity rows: attend at 0, then poison them
        out = ffd_decode_sharded(q[:, :, 0], layer_cache, start + 1, self.mesh,
                                 batch_axis=self.batch_axis, head_axis=self.head_axis,
                                 delta=self.delta, delta_unit=self.delta_unit, top_k=self.top_k,
                                 max_pages=self.max_pages, implementation=self.implementation,
                                 interpret=self.interpret,
                                 assumed_kept_fraction=self.assumed_kept_fraction)
        return cache_backend.poison_rows(out[:, :, None], ok)
