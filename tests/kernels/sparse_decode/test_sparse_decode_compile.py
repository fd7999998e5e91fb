"""FFD decode (Pallas TPU and GPU kernels, through the public ``ffd_decode``) compiled for TPU
v5e / v6e and H100 / H200 on compile-only devices (core.aot).

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


# every target at D = 128; the other head dims (GPU: 96 = 64 + 32 chunks) on one TPU and one GPU
CASES = ([(t, i, 128) for t, i in (("tpu-v5e", "pallas_tpu"), ("tpu-v6e", "pallas_tpu"),
                                   ("h100", "pallas_gpu"), ("h200", "pallas_gpu"))]
         + [(t, i, d) for t, i in (("tpu-v5e", "pallas_tpu"), ("h100", "pallas_gpu"))
            for d in (64, 96, 256)])


@pytest.mark.parametrize("target,impl,d", CASES)
def test_ffd_decode_compiles(target, impl, d):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env)")
    f = jax.jit(lambda q, c, l: api.ffd_decode(q, c, l, delta=3.0, max_pages=3,
                                               implementation=impl))
    res = aot.compile_for(f, _args(d), target)
    assert res.memory["output"] >= 2 * 8 * d * 2  # [B, H, D] bf16 (TPU pads to its tiles)
