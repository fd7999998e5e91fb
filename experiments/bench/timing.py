"""Shared helpers for benchmarks: size presets (the timer is :mod:`core.timing`).

Every benchmark module exposes ``SIZES`` (a dict of named problem sizes) and ``run(size="cpu")``:
``"smoke"`` runs every code path in seconds (numbers meaningless; used by the tests), ``"cpu"`` is
the default sized for a 2-core CPU, ``"accelerator"`` the size meant for a GPU or TPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SIZE_NAMES = ("smoke", "cpu", "accelerator")


def pick_size(sizes: Mapping[str, Any], size: str, where: str) -> Any:
    """``sizes[size]``, or a one-line ``ValueError`` naming the benchmark and the known sizes."""
    if size not in sizes:
        raise ValueError(f"{where}: unknown size {size!r}; expected one of {sorted(sizes)}")
    return sizes[size]
