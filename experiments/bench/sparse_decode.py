"""Benchmark: FFD decode attention against the dense baseline and Quest, in one run.

    python -m experiments.bench.sparse_decode [smoke|cpu|accelerator]

Times :func:`kernels.sparse_decode.benchmark.speed_table` on a workload whose attention is
concentrated on a few pages (an attention sink, a recent window and retrieval pages over noise;
:func:`kernels.sparse_decode.workload.concentrated_workload`): dense decode in f32 and bf16, FFD with
the paper's top-delta rule on the XLA path (its two stages, the float32 scan with the selection and
the attention over the kept pages, timed in every call and summing to FFD's time; the int8
selection timed beside it), FFD's top-k
budget variant and Quest at the same budget, 32 query / 8 kv heads, D = 128, pages of 128; every
method once per round, in interleaved rounds after a warm-up
(:func:`kernels.sparse_decode.benchmark.interleaved_seconds`); times and ratios are medians with
their range over the rounds, ratios taken round by round against the faster dense variant;
bandwidth fractions against the machine's read bandwidth measured in the same run
(:func:`core.timing.read_bandwidth_gbs`).

Sizes (``SIZES``, variants of ``experiments/configs/sparse_decode.py``): ``cpu`` = ``tiny``
(contexts 4k, 16k, 64k, batch 1); ``accelerator`` = ``paper`` (contexts up to 256k, batch 1 and 8);
``smoke`` = ``smoke`` (one 2k context, seconds).
"""

from __future__ import annotations

import math
import sys

import jax

from core import report, timing
from experiments.bench.timing import pick_size
from experiments.configs import sparse_decode as sd_config
from kernels.sparse_decode import benchmark

SIZES = {"smoke": "smoke", "cpu": "tiny", "accelerator": "paper"}


def run(size: str = "cpu") -> str:
    """Times dense, FFD and Quest decode attention at ``SIZES[size]``; returns a markdown section.

    Raises:
      ValueError: unknown ``size``.
    """
    variant = pick_size(SIZES, size, "bench sparse_decode")
    c = sd_config.get_config(variant)
    bandwidth = timing.read_bandwidth_gbs(c.bandwidth_mb)
    setup = benchmark.SpeedSetup(num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                                 head_dim=c.head_dim, page_size=c.page_size, delta=c.delta,
                                 budget_fraction=c.max_density, repeats=c.timing_reps)
    rows = benchmark.speed_table(jax.random.key(c.seed), c.contexts, c.batch_sizes, setup,
                                 bandwidth)
    fmt, breakdown = benchmark.fmt_summary, benchmark.fmt_breakdown
    table = report.markdown_table(
        ["context", "batch", "pages attended (rule's)", "kept mass", "dense f32 ms",
         "dense bf16 ms", "FFD ms", "median round: scan + attend = FFD", "int8 scan ms",
         "FFD / dense", "FFD speed-up",
         "top-k budget speed-up", "Quest speed-up", "bytes ratio accel / CPU", "dense BW frac",
         "FFD BW frac"],
        [[r["context"], r["batch"], f"{r['kept_fraction']:.1%} ({r['rule_kept_fraction']:.1%})",
          f"{r['kept_mass']:.4f}", fmt(r["dense_f32"]), fmt(r["dense_bf16"]),
          fmt(r["ffd"]), breakdown(r), fmt(r["int8_scan"]),
          fmt(r["ffd_over_dense"], ".2f"), fmt(r["speedup"], ".2f"),
          fmt(r["budget_speedup"], ".2f"), fmt(r["quest_speedup"], ".2f"),
          f"{r['bytes_ratio']:.3g} / {r['cpu_bytes_ratio']:.3g}", r["dense_bw_fraction"],
          r["ffd_bw_fraction"]] for r in rows], fmt=".3g")
    return "\n".join([
        "## sparse_decode: FFD vs dense decode attention", "",
        f"Read bandwidth {bandwidth:.1f} GB/s. Heads {c.num_heads}q/{c.num_kv_heads}kv, "
        f"D={c.head_dim}, pages of {c.page_size}; FFD's top-delta rule at delta {c.delta:g} nats "
        f"({c.delta / math.log(2):.2f} in the base-2 unit of the authors' kernel, whose defaults "
        "are 5 and 7) on a concentrated workload (per kv head an attention sink, a recent window "
        "and 6% of the pages holding retrieval tokens, logits 11-15 nats above N(0, 1) noise), on "
        "the XLA path with its default float32 scan (the rule's pages; the int8 selection, "
        "which keeps a superset, timed beside it); kept mass is the exact softmax "
        "mass on the rule's pages and the tail. The top-k budget variant and Quest attend "
        f"{c.max_density:.0%} of the pages. Size `{size}` (config variant `{variant}`): "
        f"median (min-max) over {c.timing_reps} interleaved rounds after a warm-up (every method "
        "once per round, the order reversed every other round); FFD's time is the sum of its two "
        "stages in every round, shown for the round of median FFD time. Ratios are taken round by "
        "round against the faster dense variant (by median). Bytes ratio: dense bf16 bytes over "
        "FFD's, in the accelerator format (2-bit codes) / the CPU path's own (one byte per "
        "code). BW frac: analytic bytes / median time over the measured read bandwidth.", "",
        table, "", f"Command: `python -m experiments.bench.sparse_decode {size}`"])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
