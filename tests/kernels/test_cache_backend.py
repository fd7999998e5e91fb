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


def test_flush_layers_per_layer_and_stacked():
    """flush_layers applies the backend's flush to each layer of a list or of a stacked [L, ...]
    cache (the same as flushing each layer alone); a backend without flush returns the cache."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kernels.kv_quant.cache import QVGCache
    from kernels.kv_quant.reference import QVGConfig

    be = QVGCache(config=QVGConfig(bits=4, stages=1, block=16, num_centroids=2, chunk=8,
                                   kmeans_iters=1))
    rng = np.random.default_rng(0)
    layers = []
    for wl in (8, 3):  # layer 0's window holds a full chunk, layer 1's does not
        c = be.init(2, 24, 1, 16, jnp.float32)
        layers.append(dict(c, wk=jnp.asarray(rng.standard_normal(c["wk"].shape), jnp.float32),
                           wv=jnp.asarray(rng.standard_normal(c["wv"].shape), jnp.float32),
                           window_len=jnp.full((2,), wl, jnp.int32)))
    want = [jax.jit(be.flush)(c) for c in layers]
    assert int(want[0]["num_quantized"][0]) == 8 and int(want[1]["num_quantized"][0]) == 0
    same = lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # noqa: E731
    jax.tree.map(same, cache_backend.flush_layers(be, layers), want)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    got = jax.jit(cache_backend.flush_layers, static_argnums=0)(be, stacked)
    jax.tree.map(same, got, jax.tree.map(lambda *xs: jnp.stack(xs), *want))
    assert cache_backend.flush_layers(cache_backend.DENSE, layers) is layers
    with pytest.raises(ValueError, match="flush_layers: cache must be a list of layer caches or a "
                       "stacked cache"):
        cache_backend.flush_layers(be, {"a": jnp.zeros((2, 3)), "b": jnp.zeros((3, 3))})
    with pytest.raises(ValueError, match=r"QVGCache\.flush: layer_cache must be"):
        cache_backend.flush_layers(be, [{"k": jnp.zeros((2, 3))}])
