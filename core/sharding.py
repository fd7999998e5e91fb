"""Device mesh and sharding rules.

One rules table maps logical array axes to mesh axes. The mesh has a ``data`` axis (batch
parallelism; the default uses every device) and a ``model`` axis (tensor parallelism; size 1 by
default). Multi-host runs call :func:`initialize_distributed` before anything touches devices;
``jax.devices()`` then lists every host's devices and the same code shards over all of them.

Logical axes: ``batch`` (examples), ``embed`` (model width), ``heads``/``kv_heads``, ``mlp``
(hidden width), ``vocab``, ``seq`` (sequence). Unlisted axes are replicated.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA, MODEL = "data", "model"

# logical axis -> mesh axis (None = replicated)
RULES: dict[str, str | None] = {
    "batch": DATA,
    "seq": None,
    "embed": None,
    "heads": MODEL,
    "kv_heads": MODEL,
    "mlp": MODEL,
    "vocab": MODEL,
}


def initialize_distributed(enabled: bool) -> None:
    """Calls ``jax.distributed.initialize()`` (multi-host; coordinator from the environment, e.g. on
    Cloud TPU or SLURM) when ``enabled``; a no-op otherwise. Must run before any device is used."""
    if enabled:
        jax.distributed.initialize()


def make_mesh(model_parallelism: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 2-D ``Mesh`` with axes (``data``, ``model``) over all devices.

    Args:
      model_parallelism: size of the ``model`` axis; must divide the number of devices.
      devices: defaults to ``jax.devices()`` (all hosts).

    Raises:
      ValueError: ``model_parallelism`` does not divide the device count.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if model_parallelism < 1 or n % model_parallelism:
        raise ValueError(f"model_parallelism={model_parallelism} must divide the {n} devices")
    grid = np.asarray(devices, dtype=object).reshape(n // model_parallelism, model_parallelism)
    return Mesh(grid, (DATA, MODEL))


def logical_to_spec(logical_axes: Sequence[str | None], rules: dict[str, str | None] = RULES
                    ) -> PartitionSpec:
    """``PartitionSpec`` for an array whose dimensions have the given logical names."""
    return PartitionSpec(*(rules.get(a) if a is not None else None for a in logical_axes))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a batch-leading array of rank ``ndim``: dimension 0 on ``data``."""
    return NamedSharding(mesh, PartitionSpec(DATA, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def shard_batch(batch, mesh: Mesh):
    """Places a pytree of host arrays with leading batch dimension on ``mesh``, split over ``data``.

    Raises:
      ValueError: a leaf's batch size is not divisible by the ``data`` axis size.
    """
    n_data = mesh.shape[DATA]

    def put(x):
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[0] % n_data:
            raise ValueError(
                f"batch leaf of shape {x.shape} cannot be split over {n_data} data-parallel devices"
            )
        return jax.device_put(x, batch_sharding(mesh, x.ndim))

    return jax.tree.map(put, batch)


def replicate(tree, mesh: Mesh):
    """Places every leaf of ``tree`` fully replicated on ``mesh``."""
    return jax.device_put(tree, replicated(mesh))
