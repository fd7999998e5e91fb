"""The QVG / KIVI cache keeps k-means out of the per-token path: a one-token update has no
conditional and no loop (it only appends to the window); a multi-token update and ``flush`` run
the quantizer in one conditional whose operands and results are window-sized (never the chunk
store), and write the store outside it, one chunk at a time."""

import jax
import jax.extend
import jax.numpy as jnp
import pytest

from kernels.kv_quant.cache import KIVICache, QVGCache
from kernels.kv_quant.reference import KIVIConfig, QVGConfig

B, K, D, NC = 2, 2, 64, 32
BACKENDS = [QVGCache(config=QVGConfig(bits=2, stages=1, block=32, num_centroids=4, chunk=128)),
            KIVICache(config=KIVIConfig(bits=2, group=32, block=32, residual=128))]


def _primitives(jaxpr):
    """Names of every primitive in ``jaxpr`` and its sub-jaxprs (cond branches, loops, pjit)."""
    names = []
    for e in jaxpr.eqns:
        names.append(e.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(e.params):
            names += _primitives(sub)
    return names


def _abstract(backend, t):
    cache = jax.eval_shape(lambda: backend.init(B, NC * backend.config.chunk, K, D, jnp.float32))
    return cache, jax.ShapeDtypeStruct((B, K, t, D), jnp.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_token_update_has_no_conditional_and_no_loop(backend):
    cache, new = _abstract(backend, 1)
    jaxpr = jax.make_jaxpr(backend.update)(cache, new, new,
                                           jax.ShapeDtypeStruct((B,), jnp.int32)).jaxpr
    prims = _primitives(jaxpr)
    # k-means is a scan of Lloyd steps and a fori_loop of k-means++ draws: neither may appear
    assert not {"cond", "while", "scan"} & set(prims), sorted(set(prims))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [0, 3])  # 0: flush; 3: a multi-token update
def test_conditional_never_sees_the_chunk_store(backend, t):
    n = backend.config.chunk
    cache, new = _abstract(backend, max(t, 1))
    if t:
        jaxpr = jax.make_jaxpr(backend.update)(cache, new, new,
                                               jax.ShapeDtypeStruct((B,), jnp.int32)).jaxpr
        window = B * K * ((2 * n - 1 + t) // n + 2) * n * D  # window + new tokens, padded
    else:
        jaxpr = jax.make_jaxpr(backend.flush)(cache).jaxpr
        window = B * K * 2 * n * D
    conds = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    assert len(conds) == 1
    store = max(x.size for x in jax.tree.leaves(cache["k"]))  # the largest chunk-store leaf
    sizes = [v.aval.size for v in conds[0].invars[1:]] + [v.aval.size for v in conds[0].outvars]
    # every operand and result of the conditional is at most the window buffer, far below the
    # store of NC = 32 chunks: no store leaf passes through it
    assert max(sizes) <= window < store
