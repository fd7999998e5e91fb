"""FFD decode attention (Pallas TPU and GPU kernels) compiled for TPU v5e / v6e and H100 / H200 on
compile-only devices (core.aot), at one small shape, through the public ``ffd_decode``. Runs in
.venv-aot: ``make test-aot``."""

import functools

import jax
import jax.numpy as jnp
import pytest

from core import aot
from kernels.sparse_decode import api
from kernels.sparse_decode import reference as ref

pytestmark = pytest.mark.aot

B, H, K, D, PAGE, MAX_LEN = 2, 8, 2, 128, 16, 256


@pytest.mark.parametrize("target,impl", [("tpu-v5e", "pallas_tpu"), ("tpu-v6e", "pallas_tpu"),
                                         ("h100", "pallas_gpu"), ("h200", "pallas_gpu")])
def test_ffd_decode_compiles(target, impl):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env installs them)")
    cache = jax.eval_shape(functools.partial(ref.init_ffd_cache, B, MAX_LEN, K, D, jnp.bfloat16,
                                             page_size=PAGE))
    q = jax.ShapeDtypeStruct((B, H, D), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((B,), jnp.int32)
    fn = lambda q, c, n: api.ffd_decode(q, c, n, delta=8.0, implementation=impl)  # noqa: E731
    res = aot.compile_for(fn, (q, cache, lengths), target)
    assert res.memory["output"] >= B * H * D * 2
