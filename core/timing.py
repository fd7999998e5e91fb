"""One wall-clock timer for every benchmark and experiment.

Every timing in this codebase goes through :func:`best_seconds` (several functions timed in
alternation, so that a method and its baseline see the same background load), :func:`seconds`
(one function) or :class:`Stopwatch` (a block of host code, e.g. a whole training run), and
every clock read through :func:`now`. Outputs are always blocked on (``jax.block_until_ready``):
JAX dispatch is asynchronous, so a timer that does not block measures only the dispatch. Read
bandwidth, the roofline every memory-bound kernel is judged against, is :func:`read_bandwidth_gbs`.

The timers take their clock as an argument (``clock=``, default :func:`now`), so that a test can
drive them with a clock it controls. JAX is imported by the functions that block on its outputs,
not with this module: the main job reads the clock before it imports JAX.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping


def now() -> float:
    """Seconds on the clock every timer here reads: ``time.perf_counter``, monotonic and of the
    finest resolution available. Only differences mean anything; they are unaffected by changes
    to the system's date and time (unlike ``time.time``)."""
    return time.perf_counter()


def best_seconds(fns: Mapping[str, Callable[[], object]], repeats: int = 5,
                 warmup: int = 1, clock: Callable[[], float] = now) -> dict[str, float]:
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
    import jax

    for fn in fns.values():
        for _ in range(warmup):
            jax.block_until_ready(fn())
    best = dict.fromkeys(fns, math.inf)
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = clock()
            jax.block_until_ready(fns[name]())
            best[name] = min(best[name], clock() - t0)
    return best


def seconds(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Best wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls
    (:func:`best_seconds` of one function)."""
    return best_seconds({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def read_bandwidth_gbs(megabytes: int = 512, repeats: int = 3) -> float:
    """Measured read bandwidth (GB/s, 1e9 bytes) of a jitted sum over ``megabytes`` MiB of
    float32: the roofline that memory-bound decode kernels are compared with.

    Raises:
      ValueError: ``megabytes`` < 1.
    """
    if megabytes < 1:
        raise ValueError(f"read_bandwidth_gbs: megabytes must be >= 1, got {megabytes}")
    import jax
    import jax.numpy as jnp

    x = jnp.ones((megabytes * (1 << 20) // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    return x.nbytes / 1e9 / seconds(lambda: total(x), repeats=repeats)


class Stopwatch:
    """Wall-clock seconds of a block of host code: ``with Stopwatch() as sw: ...; sw.seconds``,
    or ``sw = Stopwatch().start(); ...; sw.seconds`` for a span that is not one block.

    For code that runs JAX computations, block on their results inside the block. ``seconds``
    reads the running time while the stopwatch runs, and the total once the block is left.

    Args:
      clock: the time source (seconds; only differences are used).
    """

    def __init__(self, clock: Callable[[], float] = now) -> None:
        self._clock = clock
        self._start: float | None = None
        self._end: float | None = None

    def start(self) -> Stopwatch:
        """Starts (or restarts) the stopwatch and returns it."""
        self._start, self._end = self._clock(), None
        return self

    def __enter__(self) -> Stopwatch:
        return self.start()

    def __exit__(self, *exc) -> None:
        self._end = self._clock()

    @property
    def seconds(self) -> float:
        """Seconds since the start: up to now while running, up to the block's end after it.

        Raises:
          RuntimeError: the stopwatch was never started.
        """
        if self._start is None:
            raise RuntimeError("Stopwatch.seconds read before the stopwatch was started")
        return (self._end if self._end is not None else self._clock()) - self._start
