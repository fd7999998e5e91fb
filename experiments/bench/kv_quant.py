"""Benchmark: decode attention over a QVG-quantized cache vs the dense cache, same run.

    python -m experiments.bench.kv_quant
"""

from __future__ import annotations

import platform
import time

import jax
import jax.numpy as jnp

from kernels.kv_quant import api
from kernels.kv_quant import reference as ref
from models import kv_cache as kvc


def _time(fn, *args, reps: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(reps):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - t0) / reps


def run(slots: int = 4096, head_dim: int = 64, kv_heads: int = 4, groups: int = 4) -> str:
    b, h = 1, kv_heads * groups
    cfg = ref.QVGConfig(bits=2, stages=1, block=64, num_centroids=64, chunk=1024, kmeans_iters=4)
    be = api.QVGCache(config=cfg)
    ks = jax.random.split(jax.random.key(0), 3)
    k = jax.random.normal(ks[0], (b, kv_heads, slots, head_dim))
    v = jax.random.normal(ks[1], (b, kv_heads, slots, head_dim))
    q = jax.random.normal(ks[2], (b, h, 1, head_dim))
    start = jnp.full((b,), slots - 1, jnp.int32)
    qlayer = jax.jit(be.update)(be.init(b, slots, kv_heads, head_dim, jnp.float32), k, v,
                                jnp.zeros((b,), jnp.int32))
    dense = kvc.DenseKVCache()
    dlayer = dense.update(dense.init(b, slots, kv_heads, head_dim, jnp.bfloat16), k, v,
                          jnp.zeros((b,), jnp.int32))
    t_q = _time(jax.jit(be.attend), qlayer, q, start)
    t_d = _time(jax.jit(dense.attend), dlayer, q, start)
    nbytes_q = api.cache_bytes([qlayer])
    nbytes_d = api.cache_bytes([dlayer])
    return "\n".join([
        "## kv_quant: QVG-quantized decode attention vs dense (bf16)",
        "",
        "| cache | time per decode step (ms) | bytes | ratio to dense |",
        "|---|---|---|---|",
        f"| dense bf16 | {1e3 * t_d:.2f} | {nbytes_d:,} | 1.00 |",
        f"| QVG INT2 (jnp reference, dequantize then attend) | {1e3 * t_q:.2f} | {nbytes_q:,} | "
        f"time {t_q / t_d:.2f}, bytes {nbytes_q / nbytes_d:.3f} |",
        "",
        f"{slots} slots, D={head_dim}, {kv_heads} kv heads x {groups} queries, one new token; "
        f"machine: {platform.machine()} {jax.default_backend()} ({jax.device_count()} devices). "
        "Command: `python -m experiments.bench.kv_quant`.",
    ])


if __name__ == "__main__":
    print(run())
