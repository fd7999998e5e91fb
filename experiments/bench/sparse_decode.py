"""Benchmark: FFD decode attention against the dense baseline and Quest, in one run.

    python -m experiments.bench.sparse_decode

Reports wall-clock ratios measured in the same process (best of several calls after a warm-up),
the machine's read bandwidth (a jitted sum over a large array) and each method's effective
bandwidth (analytic bytes it must read / time) as a fraction of it.
"""

from __future__ import annotations

import platform
import sys

import jax

from core import report
from experiments.configs import sparse_decode as sd_config
from experiments.sparse_decode import read_bandwidth_gbs, speed

COMMAND = "python -m experiments.bench.sparse_decode"


def run(variant: str = "tiny") -> str:
    config = sd_config.get_config(variant)
    bandwidth = read_bandwidth_gbs(config.bandwidth_mb)
    rows = speed(config, bandwidth)
    table = report.markdown_table(
        ["context", "batch", "dense f32 ms", "dense bf16 ms", "FFD ms", "Quest ms",
         "FFD / dense", "Quest / dense", "bytes ratio", "dense BW frac", "FFD BW frac"],
        [[r["context"], r["batch"], r["dense_f32_ms"], r["dense_bf16_ms"], r["ffd_ms"],
          r["quest_ms"], r["speedup_vs_dense"], r["quest_speedup_vs_dense"], r["bytes_ratio"],
          r["dense_bw_fraction"], r["ffd_bw_fraction"]] for r in rows], fmt=".3g")
    machine = (f"{jax.devices()[0].device_kind} ({jax.default_backend()}), "
               f"{platform.processor() or platform.machine()}, JAX {jax.__version__}")
    return "\n".join([
        "## sparse_decode: FFD vs dense decode attention", "",
        f"Machine: {machine}; read bandwidth {bandwidth:.1f} GB/s. Heads "
        f"{config.num_heads}q/{config.num_kv_heads}kv, D={config.head_dim}, pages of "
        f"{config.page_size}, FFD gather budget {config.max_density:.0%} of the pages "
        f"(Quest gets the same budget). Speedups are against the faster of dense f32 and bf16.", "",
        table, "", f"Command: `{COMMAND}`", ""])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "tiny"))
