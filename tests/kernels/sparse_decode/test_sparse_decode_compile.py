"""FFD decode compiled for TPU and GPU targets on compile-only devices (core.aot).

Runs in .venv-aot (``make test-aot``, marker ``aot``). Compiling runs Mosaic's tiling rules and
Triton/ptxas, which lowering alone does not: the head dims cover the power-of-two chunking of the GPU
kernel (96 = 64 + 32) and the lane slices of the TPU kernel.
"""

import jax
import jax.numpy as jnp
import pytest

from core import aot
from kernels.sparse_decode import api
from kernels.sparse_decode import reference as ref

pytestmark = pytest.mark.aot


def _args(d, b=2, kh=2, g=4, p=16, n=4):
    cache = jax.eval_shape(lambda: ref.init_ffd_cache(b, n * p, kh, d, jnp.bfloat16, p))
    return (jax.ShapeDtypeStruct((b, kh * g, d), jnp.bfloat16), cache,
            jax.ShapeDtypeStruct((b,), jnp.int32))


@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("target,impl", [("h100", "pallas_gpu"), ("tpu-v5e", "pallas_tpu")])
def test_ffd_decode_compiles(target, impl, d):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env)")
    f = jax.jit(lambda q, c, l: api.ffd_decode(q, c, l, delta=3.0, max_pages=3,
                                               implementation=impl))
    res = aot.compile_for(f, _args(d), target)
    assert res.memory["output"] >= 2 * 8 * d * 2  # [B, H, D] bf16 (TPU pads to its tiles)
