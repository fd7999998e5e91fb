"""Benchmark: FFD decode attention against the dense baseline and Quest, in one run.

    python -m experiments.bench.sparse_decode [smoke|cpu|accelerator]

Times :func:`experiments.sparse_decode.speed` (best of several calls after a warm-up; dense in
f32 and bf16, FFD and Quest at the same page budget, 32 query / 8 kv heads, D = 128, pages of 128)
and reports speed-ups against the faster dense variant, the machine's read bandwidth (a jitted sum
over a large array) and each method's effective bandwidth (analytic bytes it must read / time) as
a fraction of it.

Sizes (``SIZES``, variants of ``experiments/configs/sparse_decode.py``): ``cpu`` = ``tiny``
(contexts 4k, 16k, 64k, batch 1; under a minute on a 2-core CPU); ``accelerator`` = ``paper``
(contexts up to 256k, batch 1 and 8); ``smoke`` = ``smoke`` (one 2k context, seconds).
"""

from __future__ import annotations

import sys

from core import report
from experiments.bench.timing import pick_size
from experiments.configs import sparse_decode as sd_config
from experiments.sparse_decode import read_bandwidth_gbs, speed

SIZES = {"smoke": "smoke", "cpu": "tiny", "accelerator": "paper"}


def run(size: str = "cpu") -> str:
    """Times dense, FFD and Quest decode attention at ``SIZES[size]``; returns a markdown section.

    Raises:
      ValueError: unknown ``size``.
    """
    variant = pick_size(SIZES, size, "bench sparse_decode")
    config = sd_config.get_config(variant)
    bandwidth = read_bandwidth_gbs(config.bandwidth_mb)
    rows = speed(config, bandwidth)
    table = report.markdown_table(
        ["context", "batch", "dense f32 ms", "dense bf16 ms", "FFD ms", "Quest ms",
         "FFD speed-up", "Quest speed-up", "bytes ratio", "dense BW frac", "FFD BW frac"],
        [[r["context"], r["batch"], r["dense_f32_ms"], r["dense_bf16_ms"], r["ffd_ms"],
          r["quest_ms"], f"{r['speedup_vs_dense']:.2f}x", f"{r['quest_speedup_vs_dense']:.2f}x",
          r["bytes_ratio"], r["dense_bw_fraction"], r["ffd_bw_fraction"]] for r in rows], fmt=".3g")
    return "\n".join([
        "## sparse_decode: FFD vs dense decode attention", "",
        f"Read bandwidth {bandwidth:.1f} GB/s. Heads {config.num_heads}q/{config.num_kv_heads}kv, "
        f"D={config.head_dim}, pages of {config.page_size}, FFD gather budget "
        f"{config.max_density:.0%} of the pages (Quest gets the same budget); size `{size}` "
        f"(config variant `{variant}`), best of {config.timing_reps} calls after a warm-up. "
        "Speed-ups are the faster of dense f32 and bf16 divided by the method's time (> 1 is "
        "faster than dense); bytes ratio is the bytes the faster dense variant reads over the "
        "bytes FFD reads (analytic); BW frac is the effective bandwidth as a fraction of the "
        "measured read bandwidth.", "",
        table, "", f"Command: `python -m experiments.bench.sparse_decode {size}`"])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
