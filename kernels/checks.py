"""Argument checks at the boundary of public kernels, caches and algorithms.

Every check raises one ``ValueError`` of the form ``"<where>: <name> must be <expected>, got
<got>"`` before any tracing or compilation work, so bad input never reaches XLA (no raw
broadcasting errors, no RESOURCE_EXHAUSTED, no silently meaningless result). Shapes and dtypes are
static, so the array checks also run at trace time inside ``jit`` at no cost; value checks
(ranges of concrete integers) are skipped for tracers.

Used by ``kernels``, ``models`` and ``algorithms`` (the lowest package they all depend on).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_KINDS = {
    "float": ("floating-point", lambda dt: jnp.issubdtype(dt, jnp.floating)),
    "int": ("integer", lambda dt: jnp.issubdtype(dt, jnp.integer)),
    "bool": ("boolean", lambda dt: dt == np.bool_),
    "real": ("real (integer or floating-point)",
             lambda dt: jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(dt, jnp.floating)),
}


def error(where: str, name: str, expected: str, got: Any) -> ValueError:
    """The one message format: ``"<where>: <name> must be <expected>, got <got>"``."""
    return ValueError(f"{where}: {name} must be {expected}, got {got}")


def is_traced(x: Any) -> bool:
    """True for a JAX tracer (a value only known at run time), or a pytree holding one."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


def array(x: Any, name: str, where: str, *, ndim: int | None = None, kind: str | None = None,
          shape: Sequence[int | None] | None = None, nonempty: bool = False) -> None:
    """Checks an array argument's rank, dtype kind and shape (``None`` entries match any size).

    Args:
      x: the argument (anything with ``shape``/``dtype``; Python scalars and lists are refused
        when a rank is required, since their shape is not that of a batch).
      kind: ``"float"``, ``"int"``, ``"bool"`` or ``"real"``.
      nonempty: refuse a zero-sized axis.

    Raises:
      ValueError: naming ``name``, what was expected and what was got.
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise error(where, name, "an array" + (f" of rank {ndim}" if ndim is not None else ""),
                    f"{type(x).__name__} {x!r:.60}")
    if ndim is not None and len(x.shape) != ndim:
        raise error(where, name, f"an array of rank {ndim}", f"shape {tuple(x.shape)}")
    if kind is not None:
        label, ok = _KINDS[kind]
        if not ok(np.dtype(x.dtype)):
            article = "an" if label[0] in "aeiou" else "a"
            raise error(where, name, f"{article} {label} array", f"dtype {x.dtype}")
    if shape is not None:
        want = tuple(shape)
        got = tuple(x.shape)
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got)):
            text = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
            raise error(where, name, f"of shape {text}", f"shape {got}")
    if nonempty and 0 in tuple(x.shape):
        raise error(where, name, "non-empty", f"shape {tuple(x.shape)}")


def integer(value: Any, name: str, where: str, *, minimum: int | None = None,
            maximum: int | None = None, allow_none: bool = False) -> None:
    """Checks a static integer (a Python or NumPy integer, not a bool) in [minimum, maximum]."""
    if value is None and allow_none:
        return
    rng = _range_text(minimum, maximum)
    expected = ("None or " if allow_none else "") + f"an integer{rng}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise error(where, name, expected, repr(value))
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise error(where, name, expected, repr(value))


def number(value: Any, name: str, where: str, *, minimum: float | None = None,
           maximum: float | None = None, finite: bool = True, open_min: bool = False,
           allow_traced: bool = True) -> None:
    """Checks a real scalar (Python, NumPy, or a concrete 0-d array; not a bool) in range.

    NumPy scalar types (``np.float32(-1)``) are validated exactly like Python floats. A traced
    value is skipped when ``allow_traced`` (it was validated where it was built).

    Args:
      open_min: ``minimum`` itself is excluded (``> minimum``).
      finite: refuse NaN and +-inf (NaN is always refused when a range is given).
    """
    if allow_traced and is_traced(value):
        return
    lo = "" if minimum is None else (f" > {minimum}" if open_min else f" >= {minimum}")
    hi = "" if maximum is None else f" <= {maximum}"
    expected = ("a finite " if finite else "a ") + "real number" + (lo + (" and" if lo and hi else "") + hi)
    if isinstance(value, (bool, np.bool_)):
        raise error(where, name, expected, repr(value))
    if not isinstance(value, (numbers.Real, np.number)):
        if hasattr(value, "shape") and tuple(value.shape) == () and hasattr(value, "dtype") and \
                _KINDS["real"][1](np.dtype(value.dtype)):
            value = float(value)
        else:
            raise error(where, name, expected, f"{type(value).__name__} {value!r:.60}")
    v = float(value)
    bad = math.isnan(v) or (finite and math.isinf(v))
    if minimum is not None:
        bad = bad or (v <= minimum if open_min else v < minimum)
    if maximum is not None:
        bad = bad or v > maximum
    if bad:
        raise error(where, name, expected, repr(value))


def one_of(value: Any, name: str, where: str, choices: Sequence[Any]) -> None:
    """Checks ``value in choices`` (the message lists them)."""
    try:
        ok = value in tuple(choices)
    except TypeError:  # an unhashable or array value
        ok = False
    if not ok:
        raise error(where, name, f"one of {tuple(choices)}", repr(value))


def lengths(x: Any, name: str, where: str, *, batch: int, low: int, high: int,
            high_is: str = "") -> None:
    """Checks per-row positions or lengths: an integer array of shape [batch], and, when concrete,
    every entry in ``low..high`` (``high_is`` says what sets ``high``, for the message). A list or
    tuple of integers counts as an array; a scalar does not (it would broadcast over the batch
    silently)."""
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    array(x, name, where, kind="int", shape=(batch,))
    if is_traced(x) or batch == 0:
        return
    a = np.asarray(x)
    lo, hi = int(a.min()), int(a.max())
    if lo < low or hi > high:
        bound = f" ({high_is})" if high_is else ""
        raise error(where, name, f"in {low}..{high}{bound}", f"min {lo}, max {hi}")


def fits_in_memory(nbytes: float, where: str, what: str, limit: float | None = None) -> None:
    """Refuses a request whose working set (``nbytes``) exceeds ``limit`` bytes.

    ``limit=None``: half of the default device's memory when the runtime reports it
    (``bytes_limit``), else half of the host's physical memory.

    Raises:
      ValueError: with the estimate, the limit and ``what`` (the sizes that set it).
    """
    if limit is None:
        limit = memory_limit()
    if nbytes > limit:
        raise ValueError(f"{where}: {what} needs about {_gib(nbytes)} of memory, more than the "
                         f"limit of {_gib(limit)}; reduce the problem size")


def memory_limit() -> float:
    """Half of the default device's memory (or of the host's physical memory), in bytes."""
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # some backends do not report memory statistics
        stats = {}
    total = stats.get("bytes_limit")
    if not total:
        try:
            import os

            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 8 * 2**30
    return 0.5 * float(total)


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def _range_text(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


# -- the KV-cache backend protocol (models.kv_cache) -------------------------------------------


def float_dtype(dtype: Any, name: str, where: str) -> None:
    """Checks that ``dtype`` names a floating-point dtype (bfloat16 and float8 included)."""
    try:
        ok = jnp.issubdtype(np.dtype(dtype), jnp.floating)
    except TypeError:
        ok = False
    if not ok:
        raise error(where, name, "a floating-point dtype", repr(dtype))


def cache_init(batch_size: Any, max_len: Any, num_kv_heads: Any, head_dim: Any, dtype: Any,
               where: str) -> None:
    """Checks ``init(batch_size, max_len, num_kv_heads, head_dim, dtype)`` of a KV-cache backend:
    integers >= 1 and a floating-point dtype."""
    for value, name in ((batch_size, "batch_size"), (max_len, "max_len"),
                        (num_kv_heads, "num_kv_heads"), (head_dim, "head_dim")):
        integer(value, name, where, minimum=1)
    float_dtype(dtype, "dtype", where)


def cache_update(k: Any, v: Any, start: Any, *, batch: int, kv_heads: int, capacity: int,
                 head_dim: int, where: str) -> None:
    """Checks ``update(cache, k, v, start)``: ``k`` float [B, K, T, D] with the cache's B, K, D and
    T >= 1, ``v`` of ``k``'s shape, ``start`` int [B] and, when concrete, every
    ``0 <= start[b]`` and ``start[b] + T <= capacity``."""
    array(k, "k", where, ndim=4, kind="float", shape=(batch, kv_heads, None, head_dim),
          nonempty=True)
    array(v, "v", where, kind="float", shape=tuple(k.shape))
    lengths(start, "start", where, batch=batch, low=0, high=capacity - k.shape[2],
            high_is=f"the cache capacity {capacity} less the {k.shape[2]} new tokens")


def cache_attend(q: Any, start: Any, *, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 where: str) -> None:
    """Checks ``attend(cache, q, start)``: ``q`` float [B, H, T, D] with the cache's B and D, H a
    multiple of the K kv heads, T >= 1, ``start`` int [B] and, when concrete, every
    ``0 <= start[b]`` and ``start[b] + T <= capacity``."""
    array(q, "q", where, ndim=4, kind="float", shape=(batch, None, None, head_dim), nonempty=True)
    if q.shape[1] % kv_heads:
        raise error(where, "q", f"a number of query heads that is a multiple of the {kv_heads} kv "
                    "heads", f"{q.shape[1]} query heads")
    lengths(start, "start", where, batch=batch, low=0, high=capacity - q.shape[2],
            high_is=f"the cache capacity {capacity} less the {q.shape[2]} new tokens")
