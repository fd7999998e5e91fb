"""Shared helpers for benchmarks: interleaved best-of wall-clock timing, size presets.

Every benchmark module exposes ``SIZES`` (a dict of named problem sizes) and ``run(size="cpu")``:
``"smoke"`` runs every code path in seconds (numbers meaningless; used by the tests), ``"cpu"`` is
the default sized for a 2-core CPU, ``"accelerator"`` the size meant for a GPU or TPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

SIZE_NAMES = ("smoke", "cpu", "accelerator")


def best_seconds(fns: Mapping[str, Callable[[], object]], repeats: int = 5,
                 warmup: int = 1) -> dict[str, float]:
    """Best (minimum) wall-clock seconds of each ``fns[name]()``, outputs blocked on.

    Every function is called ``warmup`` times first (compilation), then the functions are timed
    in turn, ``repeats`` rounds, alternating the order each round, so that the baseline and the
    method see the same background load; the minimum is the least disturbed call.

    Returns:
      {name: seconds}.

    Raises:
      ValueError: no functions, ``repeats`` < 1 or ``warmup`` < 0.
    """
    if not fns or repeats < 1 or warmup < 0:
        raise ValueError(f"best_seconds: need functions, repeats >= 1 and warmup >= 0, got "
                         f"{len(fns)} functions, {repeats}, {warmup}")
    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    best = dict.fromkeys(fns, math.inf)
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name]())
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def pick_size(sizes: Mapping[str, Any], size: str, where: str) -> Any:
    """``sizes[size]``, or a one-line ``ValueError`` naming the benchmark and the known sizes."""
    if size not in sizes:
        raise ValueError(f"{where}: unknown size {size!r}; expected one of {sorted(sizes)}")
    return sizes[size]
