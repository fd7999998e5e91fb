"""kernels.cache_backend: the backend registry and the lookup of every kernel backend."""

import dataclasses

import pytest

from kernels import cache_backend


def test_registry():
    backends = cache_backend.registered_backends()
    assert backends["dense"] is cache_backend.DenseKVCache
    assert isinstance(cache_backend.DENSE, cache_backend.KVCacheBackend)

    @dataclasses.dataclass(frozen=True)
    class Other(cache_backend.DenseKVCache):
        pass

    with pytest.raises(ValueError, match="taken"):
        cache_backend.register_backend("dense")(Other)
    with pytest.raises(ValueError, match="init, update and attend"):
        cache_backend.register_backend("broken")(type("Broken", (), {}))
    with pytest.raises(ValueError, match="name must"):
        cache_backend.register_backend("")
    assert cache_backend.register_backend("dense")(cache_backend.DenseKVCache) is cache_backend.DenseKVCache
    assert "broken" not in cache_backend.registered_backends()


def test_models_find_every_kernel_backend():
    from models import kv_cache

    names = set(cache_backend.registered_backends())
    assert {"dense", "ffd", "quest", "qvg", "kivi"} <= names
    assert kv_cache.get_backend("ffd", page_size=16).page_size == 16
