"""``implementation="auto"`` never swaps kernels in silence: on a GPU a chunk or head dim the
Triton kernel cannot tile (not a power of two) is one ValueError naming the value, raised before
anything is compiled; ``implementation="xla"`` serves the same cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import dispatch
from kernels.kv_quant import api
from kernels.kv_quant.cache import QVGCache
from kernels.kv_quant.reference import QVGConfig


def _filled(cfg, d, tokens=None):
    """A QVG cache (XLA path) with two quantized chunks of random keys and values, and q rows."""
    n = cfg.chunk
    tokens = 2 * n if tokens is None else tokens
    backend = QVGCache(config=cfg, implementation="xla")
    cache = backend.init(1, tokens + 1, 1, d, jnp.float32)
    kk, kv, kq = jax.random.split(jax.random.key(3), 3)
    k = jax.random.normal(kk, (1, 1, tokens, d))
    v = jax.random.normal(kv, (1, 1, tokens, d))
    cache = jax.jit(backend.update)(cache, k, v, jnp.zeros((1,), jnp.int32))
    q = jax.random.normal(kq, (1, 1, 2, d))
    return cache, q, jnp.full((1,), tokens, jnp.int32), jnp.full((1,), tokens, jnp.int32)


@pytest.fixture
def on_gpu(monkeypatch):
    """``auto`` resolves as on a GPU (the platform is read through jax.default_backend)."""
    monkeypatch.setattr(api.jax, "default_backend", lambda: "gpu")
    assert api.resolve_implementation("auto") == "pallas_gpu"


@pytest.mark.parametrize("chunk, d, name, value", [(96, 64, "chunk", 96), (64, 96, "head dim", 96)])
def test_auto_on_gpu_refuses_a_non_power_of_two_shape(on_gpu, chunk, d, name, value):
    cfg = QVGConfig(bits=2, stages=1, block=32, num_centroids=4, chunk=chunk, kmeans_iters=2)
    # the cache backend refuses at init, before any update or attend is traced
    with pytest.raises(ValueError, match=f"{name} {value}.*implementation='xla'"):
        QVGCache(config=cfg).init(1, 4 * chunk, 1, d, jnp.float32)


@pytest.mark.parametrize("chunk, d, name, value", [(96, 64, "chunk", 96), (64, 96, "head dim", 96)])
def test_auto_attention_on_gpu_raises_and_xla_serves_the_same_codes(monkeypatch, chunk, d, name,
                                                                   value):
    cfg = QVGConfig(bits=2, stages=1, block=32, num_centroids=4, chunk=chunk, kmeans_iters=2)
    cache, q, start, nq = _filled(cfg, d)  # built on the CPU platform (xla)
    monkeypatch.setattr(api.jax, "default_backend", lambda: "gpu")
    args = (q, cache["k"], cache["v"], cfg, start, nq, 2, None)
    with pytest.raises(ValueError, match=f"{name} {value}.*implementation='xla'"):
        api.qvg_chunk_attention(*args, implementation="auto")
    with pytest.raises(ValueError, match=f"{name} {value}"):
        api.qvg_chunk_attention(*args, implementation="pallas_gpu")
    out, lse = api.qvg_chunk_attention(*args, implementation="xla")  # concrete: checked for "gpu"
    # the reference, jitted (one compile instead of one per op)
    want, want_lse = jax.jit(lambda q, kc, vc, s, m: api.qvg_chunk_attention(
        q, kc, vc, cfg, s, m, 2, None, implementation="reference"))(q, cache["k"], cache["v"],
                                                                    start, nq)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)
    assert np.all(np.isfinite(np.asarray(out)))


def test_auto_on_gpu_accepts_powers_of_two(on_gpu):
    cfg = QVGConfig(bits=2, stages=1, block=32, num_centroids=4, chunk=64, kmeans_iters=2)
    QVGCache(config=cfg).init(1, 256, 1, 64, jnp.float32)  # no error
    dispatch.check_kernel_shape(api.TABLE, "pallas_gpu", api.kernel_shapes(1024, 256), "here",
                                entry=api.QVG)
