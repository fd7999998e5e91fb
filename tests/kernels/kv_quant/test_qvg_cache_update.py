"""The QVG / KIVI cache update keeps k-means out of the per-token path: the conditional that
quantizes a completed chunk takes the full-precision window buffers only and returns the new
chunk's codes; the chunk store is written outside it, one chunk at a time."""

import jax
import jax.numpy as jnp
import pytest

from kernels.kv_quant.cache import KIVICache, QVGCache
from kernels.kv_quant.reference import KIVIConfig, QVGConfig

B, K, D, NC = 2, 2, 64, 32


@pytest.mark.parametrize("backend", [
    QVGCache(config=QVGConfig(bits=2, stages=1, block=32, num_centroids=4, chunk=128)),
    KIVICache(config=KIVIConfig(bits=2, group=32, block=32, residual=128))])
@pytest.mark.parametrize("t", [1, 3])
def test_conditional_never_sees_the_chunk_store(backend, t):
    n = backend.config.chunk
    cache = jax.eval_shape(lambda: backend.init(B, NC * n, K, D, jnp.float32))
    new = jax.ShapeDtypeStruct((B, K, t, D), jnp.float32)
    jaxpr = jax.make_jaxpr(backend.update)(cache, new, new,
                                           jax.ShapeDtypeStruct((B,), jnp.int32)).jaxpr
    conds = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    assert len(conds) == 1
    store = max(x.size for x in jax.tree.leaves(cache["k"]))  # the largest chunk-store leaf
    window = B * K * ((n + t) // n + 1) * n * D  # the buffer of window + new tokens
    sizes = [v.aval.size for v in conds[0].invars[1:]] + [v.aval.size for v in conds[0].outvars]
    # every operand and result of the conditional is at most the window buffer, far below the
    # store of NC = 32 chunks: no store leaf passes through it
    assert max(sizes) <= window < store
