"""Timing helpers for benchmarks: median wall-clock of a jitted call after warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import numpy as np


def median_seconds(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` (its outputs blocked on) over ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_bandwidth_gbs(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """The machine's read bandwidth in GB/s: a jitted sum over a ``num_bytes`` float32 array."""
    x = jax.device_put(np.ones(num_bytes // 4, np.float32))
    f = jax.jit(lambda a: a.sum())
    return num_bytes / median_seconds(lambda: f(x), repeats) / 1e9
