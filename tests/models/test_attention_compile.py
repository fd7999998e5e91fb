"""models.attention's splash path compiled for a TPU v5e (compile-only device, one chip).

Interpret mode (tests/models/test_attention.py) checks the values; only Mosaic's compiler checks
that the kernels' tiles fit the chip (lane / sublane tiling, VMEM). Marker ``aot``: runs in
.venv-aot (``make test-aot``), skipped where libtpu is not installed.
"""

import re

import jax
import jax.numpy as jnp
import pytest

from core import aot
from models import attention as attn

pytestmark = pytest.mark.aot


def _need(target):
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env installs them)")


@pytest.mark.parametrize("implementation, mask_kind",
                         [("splash", "causal"), ("splash", "full"), ("auto", "causal")])
def test_splash_forward_and_backward_compile_for_tpu_v5e(implementation, mask_kind):
    """GQA (4 query heads on 2 kv heads), bf16, head dim 64 as in the lm paper model; L = 200 is
    padded to two 128-wide tiles (the full mask then needs segment ids). "auto" lowers its splash
    branch for the TPU."""
    _need("tpu-v5e")
    b, h, kh, l, d = 2, 4, 2, 200, 64
    q = jax.ShapeDtypeStruct((b, h, l, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((b, kh, l, d), jnp.bfloat16)

    def loss(q, k, v):
        out = attn.attention(q, k, v, implementation=implementation, mask_kind=mask_kind,
                              block_size=128)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    res = aot.compile_for(jax.grad(loss, argnums=(0, 1, 2)), (q, kv, kv), "tpu-v5e")
    text = res.compiled.as_text()
    # the three Mosaic kernels (forward, dq, dkv) are custom calls in the compiled program, and no
    # L x L (or padded 256 x 256) score array exists; the reference compiles to f32[2,2,2,200,200]
    assert text.count("tpu_custom_call") == 3
    assert not re.findall(r"\[[\d,]*(?:200|256),(?:200|256)\]", text)


def test_auto_compiles_for_a_gpu_without_the_tpu_kernel():
    """The same "auto" program compiled for an H100 lowers the GPU branch (blockwise here: cuDNN is
    only chosen when JAX runs on a GPU), with no Mosaic TPU kernel in it."""
    _need("h100")
    q = jax.ShapeDtypeStruct((2, 4, 200, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 2, 200, 64), jnp.bfloat16)

    def loss(q, k, v):
        out = attn.attention(q, k, v, implementation="auto", mask_kind="causal", block_size=128)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    text = aot.compile_for(jax.grad(loss, argnums=(0, 1, 2)), (q, kv, kv), "h100").compiled.as_text()
    assert "tpu_custom_call" not in text and "mosaic" not in text.lower()
