"""Mesh axes of ``shard_map``ped kernel calls (the sharded cache backends of every op)."""

from __future__ import annotations

from typing import Any


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
