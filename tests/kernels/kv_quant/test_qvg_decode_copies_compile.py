"""The QVG decode step (cache update + attend, cache donated) compiled for TPU v5e: no copy of a
cache-shaped array besides the kernel's own read. Runs in .venv-aot: ``make test-aot``.

Before the attention kernel's cache operands were constrained to HBM, XLA's memory-space
assignment staged every store in VMEM around the chunk write and the kernel (``copy-start`` of
the whole codes, scales, assignments and centroids, in and out), 154 MB accessed per layer at
128k against the kernel's 14.5 MB.
"""

import re

import jax
import jax.numpy as jnp
import pytest

from core import aot
from kernels.kv_quant.cache import QVGCache
from kernels.kv_quant.reference import QVGConfig

pytestmark = pytest.mark.aot

CFG = QVGConfig(bits=2, stages=1, block=64, num_centroids=16, chunk=256, kmeans_iters=2)


@pytest.fixture(scope="module")
def compiled():
    if not aot.extras_available("tpu-v5e"):
        pytest.skip("compile extras for tpu-v5e are not installed here (make aot-env)")
    backend = QVGCache(config=CFG, rope_base=10_000.0, implementation="pallas_tpu")
    cache = jax.eval_shape(lambda: backend.init(1, 16 * CFG.chunk, 1, 128, jnp.bfloat16))

    def step(cache, k, v, q, start):
        cache = backend.update(cache, k, v, start)
        return cache, backend.attend(cache, q, start)

    S = jax.ShapeDtypeStruct
    args = (cache, S((1, 1, 1, 128), jnp.bfloat16), S((1, 1, 1, 128), jnp.bfloat16),
            S((1, 4, 1, 128), jnp.bfloat16), S((1,), jnp.int32))
    res = aot.compile_for(jax.jit(step, donate_argnums=0), args, "tpu-v5e")
    stores = {f"{x.dtype.name.replace('uint8', 'u8').replace('bfloat16', 'bf16')}"
              f"[{','.join(map(str, x.shape))}]": name
              for name, x in zip(("codes", "scales", "assign", "centroids"),
                                 jax.tree.leaves(cache["k"]))}
    return res.compiled.as_text(), stores


def _copies(text, shape):
    """Instructions (any computation) that copy an array of ``shape`` (an HLO shape string)."""
    pat = re.compile(r"=\s*\(?" + re.escape(shape) + r"\{[^=]*\b(copy|copy-start)\(")
    return [ln.strip()[:160] for ln in text.splitlines() if pat.search(ln)]


@pytest.mark.parametrize("field", ["codes", "scales", "centroids"])
def test_no_store_is_staged_in_vmem(compiled, field):
    """No ``copy-start`` of a whole store between memory spaces (the staging that was; the
    assignments still are, see the xfail below)."""
    text, stores = compiled
    shape = next(s for s, f in stores.items() if f == field)
    staged = [ln for ln in _copies(text, shape) if "copy-start" in ln and "S(1)" in ln
              and not re.search(r"copy-start\(%cache", ln)]
    assert not staged, staged


@pytest.mark.xfail(strict=True, reason="two layout copies remain (XLA:TPU): the uint8 codes are "
                   "re-tiled (32,128) -> (8,128) inside the chunk-write fusion, and the [NC, 1, N] "
                   "assignments are copied (and staged in VMEM) between the kernel's (NC, N) tiling and "
                   "the write's")
def test_no_copy_of_any_cache_shaped_array(compiled):
    text, stores = compiled
    found = {f: _copies(text, s) for s, f in stores.items()}
    assert not any(found.values()), found
