"""The QVG / KIVI cache keeps k-means out of the per-token path: a one-token update has no
conditional and no loop (it only appends to the window); a multi-token update runs the quantizer
in one conditional whose operands and results are window-sized (never the chunk store) and writes
the store outside it, one chunk at a time; ``flush`` writes its chunk inside its conditional, so a
call without a full window (N - 1 of every N decode steps) touches no store at all."""

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
def test_conditional_never_sees_the_chunk_store(backend):
    t = 3  # a multi-token update
    n = backend.config.chunk
    cache, new = _abstract(backend, t)
    jaxpr = jax.make_jaxpr(backend.update)(cache, new, new,
                                           jax.ShapeDtypeStruct((B,), jnp.int32)).jaxpr
    window = B * K * ((2 * n - 1 + t) // n + 2) * n * D  # window + new tokens, padded
    conds = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    assert len(conds) == 1
    store = max(x.size for x in jax.tree.leaves(cache["k"]))  # the largest chunk-store leaf
    sizes = [v.aval.size for v in conds[0].invars[1:]] + [v.aval.size for v in conds[0].outvars]
    # every operand and result of the conditional is at most the window buffer, far below the
    # store of NC = 32 chunks: no store leaf passes through it
    assert max(sizes) <= window < store


@pytest.mark.parametrize("backend", BACKENDS)
def test_flush_touches_the_chunk_store_only_inside_its_conditional(backend):
    cache, _ = _abstract(backend, 1)
    jaxpr = jax.make_jaxpr(backend.flush)(cache).jaxpr
    (cond,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    store = max(x.size for x in jax.tree.leaves(cache["k"]))  # the largest chunk-store leaf
    # the store passes through the conditional (written in its k-means branch, returned as it is
    # by the other) and no equation outside it reads or writes a store-sized array
    assert store in [v.aval.size for v in cond.outvars]
    outside = [(e.primitive.name, v.aval.shape) for e in jaxpr.eqns if e is not cond
               for v in list(e.invars) + list(e.outvars)
               if hasattr(v, "aval") and getattr(v.aval, "size", 0) >= store]
    assert not outside, outside
    keep = cond.params["branches"][0].jaxpr  # branch 0: no row is full
    assert not [e.primitive.name for e in keep.eqns]  # it returns its operands unchanged
