"""KV-cache backends: the protocol the transformer decodes through, the dense reference, lookup by name.

Dimensions: B batch, H query heads, K kv heads, G = H / K, S cache slots, T new tokens, D head dim.

The protocol (:class:`KVCacheBackend`: ``init`` / ``update`` / ``attend``), the dense backend
(:class:`DenseKVCache`), :func:`grouped_attention` and :func:`causal_cache_mask` live in
:mod:`kernels.common` with the backend registry, and are re-exported here. Every backend module
registers its classes there (``@register_backend("ffd")``); this module imports the ``cache`` module
of every kernel package (``models`` -> ``kernels``, the allowed direction) so that
:func:`get_backend` finds ``"dense"``, ``"ffd"``, ``"quest"``, ``"qvg"`` and ``"kivi"``; EntroKV's
``"budgeted"`` cache registers when :mod:`algorithms.kv_budget.cache` is imported (``models``
cannot import ``algorithms``).

Every backend follows the protocol's contract at the edges (:class:`KVCacheBackend`): the capacity
is ``init``'s ``max_len``; a row whose new positions leave ``0 .. max_len - 1`` raises
``ValueError`` outside ``jit`` and, inside it, is left unchanged by ``update`` and NaN in
``attend``; a fresh cache can be donated.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil

import kernels
from kernels import common
from kernels.common import (  # noqa: F401  (re-exported: the models' names for these)
    DENSE,
    DenseKVCache,
    KVCacheBackend,
    causal_cache_mask,
    grouped_attention,
)


def _import_kernel_backends() -> None:
    """Imports ``kernels/<op>/cache.py`` of every kernel package, so that its backends register."""
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.ispkg and importlib.util.find_spec(f"kernels.{info.name}.cache") is not None:
            importlib.import_module(f"kernels.{info.name}.cache")


_import_kernel_backends()


def get_backend(name: str, **kwargs) -> KVCacheBackend:
    """Instantiates the KV-cache backend registered as ``name`` with ``kwargs``.

    Raises:
      ValueError: unknown name (the message lists the known ones) or ``kwargs`` the backend does
        not take.
    """
    backends = common.registered_backends()
    if name not in backends:
        raise ValueError(f"unknown KV-cache backend {name!r}; known: {sorted(backends)}")
    cls = backends[name]
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None
    unknown = sorted(set(kwargs) - names) if names is not None else []
    if unknown:
        raise ValueError(f"get_backend: {name!r} backend has no option {', '.join(unknown)}; its "
                         f"options are {sorted(names)}")
    return cls(**kwargs)
