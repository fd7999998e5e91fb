"""Benchmark: the judge-aware BTL Newton fit against ``choix`` on the same comparisons.

    python -m experiments.bench.judge_btl [smoke|cpu|accelerator]

Dimensions: N models, J judges, C comparisons. Calls :func:`algorithms.ranking.speed.speed_comparison`:
C comparisons simulated from known scores and judge discriminations; aggregation into per-(pair,
judge) counts plus the compiled joint Newton MLE of scores and discriminations
(:func:`algorithms.ranking.btl.solve`, float64) against ``choix`` estimators of plain BTL on the same
comparisons, all timed in one :func:`core.timing.best_seconds` call (compilation reported apart; the
baseline is the fastest estimator), with the fit's time split into aggregation, transfer and solve.

Sizes (``SIZES``, variants of ``experiments/configs/judge_btl.py``): ``cpu`` = ``tiny`` (N 100,
J 20, C 1M, ``choix.ilsr_pairwise``, best of 2; about 30 s on a 2-core CPU); ``accelerator`` =
``paper`` (same data, also ``mm_pairwise`` and ``opt_pairwise``, several minutes of ``choix`` on the
CPU); ``smoke`` = ``smoke`` (N 10, J 3, C 5000).
"""

from __future__ import annotations

import sys

from algorithms.ranking import speed
from core.report import markdown_table
from experiments.bench.timing import pick_size
from experiments.configs import judge_btl as judge_config

SIZES = {"smoke": "smoke", "cpu": "tiny", "accelerator": "paper"}

_CHOIX = {"ilsr": "choix.ilsr_pairwise", "mm": "choix.mm_pairwise", "opt": "choix.opt_pairwise"}


def run(size: str = "cpu") -> str:
    """Times the judge-aware fit and ``choix`` at ``SIZES[size]``; returns a markdown section.

    Raises:
      ValueError: unknown ``size``.
    """
    variant = pick_size(SIZES, size, "bench judge_btl")
    config = judge_config.get_config(variant)
    c = config.timing
    t = speed.speed_comparison(c.num_models, c.num_judges, c.num_comparisons, c.choix_estimators,
                               config.seed, c.repeats)
    fit, b = t["fit_seconds"], t["breakdown"]
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
        f"the fastest choix: **{t['speedup_vs_choix']:.1f}x** (target in docs/judge_btl.md: >= 10x). "
        f"The fit's time: aggregation {b['aggregate']:.3f} s, transfer {b['transfer']:.4f} s, solve "
        f"{b['solve']:.3f} s ({b['per_iteration'] * 1e3:.1f} ms per iteration).",
        "",
        markdown_table(["method", "seconds", "seconds / fit seconds (fit speed-up)"], rows),
        "",
        f"Command: `python -m experiments.bench.judge_btl {size}`",
    ])


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "cpu"))
