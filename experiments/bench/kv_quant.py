"""Benchmark: decode attention over a QVG-quantized KV cache against the dense bf16 cache.

    python -m experiments.bench.kv_quant [smoke|cpu|accelerator]

Dimensions: S cache slots, D head dim, K kv heads, G queries per kv head. One new query token
attends to a full cache of S slots, through :class:`kernels.kv_quant.api.QVGCache` (INT2, one
k-means stage; on the CPU the jnp reference dequantizes then attends, on GPU/TPU ``auto`` picks
the Pallas kernel) and through the dense cache (:class:`models.kv_cache.DenseKVCache`, bf16), timed
in the same run. Reports the time ratio, the bytes both caches allocate (the QVG cache keeps a
full-precision window of one chunk) and the true storage bits per element
(:func:`kernels.kv_quant.reference.effective_bits`).

Sizes (``SIZES``): ``cpu`` (default; S 4096, D 64, K 4, G 4) takes about 20 s on a 2-core CPU;
``accelerator`` (S 65536, D 128, K 8, G 4) is meant for a GPU/TPU; ``smoke`` runs in seconds.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from core.report import markdown_table
from core.timing import best_seconds
from experiments.bench.timing import pick_size
from kernels.kv_quant import api
from kernels.kv_quant import reference as ref
from models import kv_cache as kvc

SIZES = {
    "smoke": dict(slots=256, head_dim=64, kv_heads=2, groups=2, chunk=64, num_centroids=16,
                  repeats=1),
    "cpu": dict(slots=4096, head_dim=64, kv_heads=4, groups=4, chunk=1024, num_centroids=64,
                repeats=20),
    "accelerator": dict(slots=65536, head_dim=128, kv_heads=8, groups=4, chunk=1024,
                        num_centroids=256, repeats=10),
}


def run(size: str = "cpu") -> str:
    """Times QVG and dense decode attention at ``SIZES[size]``; returns a markdown section.

    Raises:
      ValueError: unknown ``size``.
    """
    s = pick_size(SIZES, size, "bench kv_quant")
    slots, head_dim, kv_heads = s["slots"], s["head_dim"], s["kv_heads"]
    b, h = 1, kv_heads * s["groups"]
    cfg = ref.QVGConfig(bits=2, stages=1, block=64, num_centroids=s["num_centroids"],
                        chunk=s["chunk"], kmeans_iters=4)
    be = api.QVGCache(config=cfg)
    ks = jax.random.split(jax.random.key(0), 3)
    k = jax.random.normal(ks[0], (b, kv_heads, slots, head_dim))
    v = jax.random.normal(ks[1], (b, kv_heads, slots, head_dim))
    q = jax.random.normal(ks[2], (b, h, 1, head_dim))
    start = jnp.full((b,), slots - 1, jnp.int32)
    zero = jnp.zeros((b,), jnp.int32)
    qlayer = jax.jit(be.update)(be.init(b, slots, kv_heads, head_dim, jnp.bfloat16), k, v, zero)
    dense = kvc.DenseKVCache()
    dlayer = jax.jit(dense.update)(dense.init(b, slots, kv_heads, head_dim, jnp.bfloat16), k, v, zero)
    q_attend, d_attend = jax.jit(be.attend), jax.jit(dense.attend)
    t = best_seconds({"qvg": lambda: q_attend(qlayer, q, start),
                      "dense": lambda: d_attend(dlayer, q, start)}, s["repeats"])
    t_q, t_d = t["qvg"], t["dense"]
    bytes_q, bytes_d = api.cache_bytes([qlayer]), api.cache_bytes([dlayer])
    bits = ref.effective_bits(cfg, head_dim, context_len=slots)
    rows = [["dense bf16 (baseline)", f"{1e3 * t_d:.2f}", "1.00x", f"{bytes_d:,}", "1.00", "16"],
            [f"QVG INT2 ({api.resolve_implementation('auto')})", f"{1e3 * t_q:.2f}",
             f"{t_q / t_d:.2f}x", f"{bytes_q:,}", f"{bytes_q / bytes_d:.3f}",
             f"{bits['effective']:.2f} ({bits['compression']:.1f}x smaller)"]]
    return "\n".join([
        "## kv_quant: QVG-quantized decode attention vs dense (bf16)",
        "",
        f"One new token against {slots} cached slots, D={head_dim}, {kv_heads} kv heads x "
        f"{s['groups']} queries, QVG chunk {cfg.chunk} with {cfg.num_centroids} centroids "
        f"(size `{size}`, best of {s['repeats']} interleaved calls after a warm-up). Time ratio > 1 means "
        "slower than dense; allocated bytes include the QVG cache's full-precision window of one "
        "chunk (empty here), true bits count codes, scales, assignments and centroids.",
        "",
        markdown_table(["cache", "ms per decode step", "time / dense", "bytes allocated",
                        "bytes / dense", "true bits per element"], rows),
        "",
        f"Command: `python -m experiments.bench.kv_quant {size}`",
    ])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
