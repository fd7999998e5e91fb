"""Benchmark: the judge-aware BTL Newton fit against ``choix`` on the same comparisons.

    python -m experiments.bench.judge_btl [smoke|cpu|accelerator]

Dimensions: N models, J judges, C comparisons. Runs the speed part of the ``judge_btl`` experiment
(:func:`experiments.judge_btl.timing_part`): C comparisons simulated from known scores and judge
discriminations; aggregation into per-(pair, judge) counts plus the compiled joint Newton MLE of
scores and discriminations (:func:`algorithms.ranking.btl.solve`, float64; best of two calls,
compilation reported separately) against ``choix`` estimators of plain BTL on the same comparisons
(one call each; the baseline is the fastest).

Sizes (``SIZES``, variants of ``experiments/configs/judge_btl.py``): ``cpu`` = ``tiny`` (N 100,
J 20, C 1M, ``choix.ilsr_pairwise``; about 15 s on a 2-core CPU); ``accelerator`` = ``paper``
(same data, also ``mm_pairwise`` and ``opt_pairwise``, several minutes of ``choix`` on the CPU);
``smoke`` = ``smoke`` (N 10, J 3, C 5000).
"""

from __future__ import annotations

import sys

import jax

from core.report import markdown_table
from experiments.bench.timing import pick_size
from experiments.configs import judge_btl as judge_config
from experiments.judge_btl import timing_part

SIZES = {"smoke": "smoke", "cpu": "tiny", "accelerator": "paper"}

_CHOIX = {"ilsr": "choix.ilsr_pairwise", "mm": "choix.mm_pairwise", "opt": "choix.opt_pairwise"}


def run(size: str = "cpu") -> str:
    """Times the judge-aware fit and ``choix`` at ``SIZES[size]``; returns a markdown section.

    Raises:
      ValueError: unknown ``size``.
    """
    variant = pick_size(SIZES, size, "bench judge_btl")
    config = judge_config.get_config(variant)
    with jax.enable_x64(True):
        t = timing_part(config)
    c = config.timing
    fit = t["fit_seconds"]
    rows = [[f"{_CHOIX[name]} (plain BTL; baseline)", f"{sec:.3g}", f"{sec / fit:.1f}x"]
            for name, sec in sorted(t["choix_times"].items(), key=lambda kv: kv[1])]
    rows.append(["judge-aware Newton MLE (aggregation + compiled fit)", f"{fit:.3g}", "1.0x"])
    return "\n".join([
        "## judge_btl: judge-aware BTL Newton fit vs choix",
        "",
        f"{c.num_models} models, {c.num_judges} judges, {c.num_comparisons:,} simulated comparisons "
        f"({t['rows']:,} non-empty (pair, judge) rows); size `{size}` (config variant `{variant}`). "
        f"The fit estimates scores and discriminations jointly and converged: {t['converged']} in "
        f"{t['iterations']} Newton iterations; compilation ({t['compile_seconds']:.1f} s) is "
        f"excluded. The choix estimators fit plain BTL (no judges). Speed-up of the fit against "
        f"the fastest choix: **{t['choix_seconds'] / fit:.1f}x** (target in docs/judge_btl.md: >= 10x).",
        "",
        markdown_table(["method", "seconds", "seconds / fit seconds (fit speed-up)"], rows),
        "",
        f"Command: `python -m experiments.bench.judge_btl {size}`",
    ])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
