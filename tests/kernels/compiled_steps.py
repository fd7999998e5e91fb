"""One layer's decode step of a KV-cache backend compiled for an accelerator target, shared by the
compile tests of the kernel ops (``tests/kernels/*/test_*_compile.py``, run in .venv-aot)."""

import jax
import jax.numpy as jnp
import pytest

from core import aot


def decode_step_hlo(backend, target: str, *, batch: int, slots: int, kv_heads: int,
                    group: int, head_dim: int) -> tuple[str, dict]:
    """(compiled HLO text, abstract layer cache) of ``backend.update`` of one new token followed
    by ``backend.attend`` of ``batch`` x ``kv_heads * group`` query heads, the bfloat16 layer
    cache of ``slots`` slots donated, compiled for ``target`` (``core.aot.compile_for``); skips
    the test when the target's compile extras are not installed."""
    if not aot.extras_available(target):
        pytest.skip(f"compile extras for {target} are not installed here (make aot-env)")
    b, d = batch, head_dim
    cache = jax.eval_shape(lambda: backend.init(b, slots, kv_heads, d, jnp.bfloat16))

    def step(cache, k, v, q, start):
        cache = backend.update(cache, k, v, start)
        return cache, backend.attend(cache, q, start)

    S = jax.ShapeDtypeStruct
    kv = S((b, kv_heads, 1, d), jnp.bfloat16)
    args = (cache, kv, kv, S((b, kv_heads * group, 1, d), jnp.bfloat16), S((b,), jnp.int32))
    res = aot.compile_for(jax.jit(step, donate_argnums=0), args, target)
    return res.compiled.as_text(), cache
