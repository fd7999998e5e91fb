"""Reading a sweep: iso-compute curves, n*(C) with intervals, its scaling fits, interference and
seed variance (host-side NumPy over the records of :func:`sweep.run_sweep`).

Dimensions: Q values of n, S seeds, T rollout streams per seed, C compute budgets.

A record is one (n, B_p, seed, stream) run read at one budget C (keys budget, n, bp, seed, stream
(0 when absent) and the objectives easy_pass1, hard_passk, ...): the seed fixes the order of the
training problems, the stream the rollouts' randomness (:mod:`sweep`). At each budget and n the B_p
with the best mean over the S x T runs is taken (the paper tunes B_p per point, Cheng et al. 2026,
Sec. 3), n*(C) is read off a parabola in log2 n (:func:`fit.n_star`) with a bootstrap over seeds
and streams (:func:`fit.resample_mean`), and log2 n*(C) is fitted by a power law and a saturating
sigmoid compared by leave-one-budget-out error, itself bootstrapped
(:func:`fit.bootstrap_scaling`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from algorithms.rl_scaling import fit

OBJECTIVES = {"easy": "easy_pass1", "hard": "hard_passk"}


def _values(records: Sequence[dict], objective: str, budget: int, n: int, bp: int) -> list[float]:
    """``objective`` of the runs of (n, B_p) at ``budget``, ordered by (seed, stream)."""
    runs = [r for r in records if r["budget"] == budget and r["n"] == n and r["bp"] == bp]
    return [r[objective] for r in sorted(runs, key=lambda r: (r["seed"], r.get("stream", 0)))]


def best_curve(records: Sequence[dict], budget: int, ns: Sequence[int], objective: str,
               num_seeds: int, num_streams: int = 1) -> tuple[list[int], np.ndarray, list[int]]:
    """The iso-compute curve at ``budget``: per n, the per-run values of ``objective`` for the B_p
    with the best mean over its S x T runs.

    Returns:
      (the n present (every seed and stream measured), float64 [S, T, Q'] values, the chosen
      B_p per n).
    """
    present, cols, chosen = [], [], []
    for n in ns:
        best = None
        for bp in sorted({r["bp"] for r in records}):
            vals = _values(records, objective, budget, n, bp)
            if (len(vals) == num_seeds * num_streams
                    and (best is None or np.mean(vals) > np.mean(best[0]))):
                best = (vals, bp)
        if best is not None:
            present.append(n)
            cols.append(best[0])
            chosen.append(best[1])
    vals = np.asarray(cols, np.float64).reshape(len(present), num_seeds, num_streams)
    return present, vals.transpose(1, 2, 0), chosen


def n_star_by_budget(records: Sequence[dict], budgets: Sequence[int], ns: Sequence[int],
                     objective: str, num_seeds: int, num_boot: int, seed: int,
                     num_streams: int = 1) -> list[dict]:
    """n*(C) per budget with a percentile bootstrap (90%) over seeds and, within each seed, its
    streams (:func:`fit.bootstrap_n_star`).

    Returns:
      one dict per budget with at least one n: budget, n_star, lo, hi (rollouts per problem), ns
      (the n present), bp (chosen B_p per n), mean (mean objective per n over its runs).
    """
    rows = []
    for j, c in enumerate(budgets):
        present, vals, chosen = best_curve(records, c, ns, objective, num_seeds, num_streams)
        if not present:
            continue
        point, lo, hi = fit.bootstrap_n_star(np.log2(present), vals, num_boot, seed + j)
        rows.append({"budget": c, "n_star": 2**point, "lo": 2**lo, "hi": 2**hi, "ns": present,
                     "bp": chosen, "mean": vals.mean(axis=(0, 1)).tolist()})
    return rows


def fit_n_star(records: Sequence[dict], rows: Sequence[dict], ns: Sequence[int], objective: str,
               num_seeds: int, num_boot: int, seed: int, num_streams: int = 1) -> dict:
    """Power law vs sigmoid for log2 n*(C) (``rows`` from :func:`n_star_by_budget`), with the
    bootstrap over seeds and streams of their leave-one-budget-out comparison.

    The bootstrap keeps each point's chosen B_p and needs every n at every budget; budgets where
    some n did not run are left out of it (``boot_budgets`` says which were used).

    Returns:
      {"power": {a, b}, "sigmoid": {hi, x0, w, lo}, "loo_mse_power", "loo_mse_sigmoid", "winner",
      "loo_diff" (power minus sigmoid) and its 90% interval "loo_diff_ci", "decisive" (the interval
      excludes 0), "slope_ci" (the power law's exponent), "onset_log2c" / "onset_ci" (log2 C where
      the sigmoid reaches 90% of its rise), "boot_budgets", "slope_at_boot_budgets" (the power
      law's exponent over the bootstrapped budgets only: the point that belongs with
      "slope_ci")}.
    """
    lo, hi_max = np.log2(min(ns)), np.log2(2 * max(ns))
    x = np.log2([r["budget"] for r in rows])
    y = np.log2([r["n_star"] for r in rows])
    f = fit.fit_scaling(x, y, lo=lo, hi_max=hi_max)
    out = {"power": f.power, "sigmoid": f.sigmoid, "loo_mse_power": f.loo_power,
           "loo_mse_sigmoid": f.loo_sigmoid, "winner": f.winner,
           "loo_diff": f.loo_power - f.loo_sigmoid,
           "onset_log2c": fit.saturation_onset(**f.sigmoid)}
    full = [r for r in rows if list(r["ns"]) == list(ns)]
    if len(full) >= 3 and num_boot:
        rewards = np.stack([
            np.stack([np.reshape(_values(records, objective, r["budget"], n, bp),
                                 (num_seeds, num_streams)) for n, bp in zip(r["ns"], r["bp"])],
                     axis=-1) for r in full])  # [C, S, T, Q]
        boot = fit.bootstrap_scaling(np.log2([r["budget"] for r in full]), np.log2(ns), rewards,
                                     num_boot, seed, lo, hi_max)
        x_full = np.log2([r["budget"] for r in full])
        y_full = np.log2([r["n_star"] for r in full])
        out.update(loo_diff_ci=boot.interval("loo_diff"), decisive=boot.decisive,
                   slope_ci=boot.interval("slope"), onset_ci=boot.interval("onset"),
                   boot_budgets=[r["budget"] for r in full],
                   slope_at_boot_budgets=float(np.polyfit(x_full, y_full, 1)[0]))
    return out


def mean_table(records: Sequence[dict], objective: str, budgets: Sequence[int], ns: Sequence[int],
               bps: Sequence[int]) -> dict[str, dict[str, dict[str, float]]]:
    """{C: {n: {B_p: seed mean of objective}}} over the configurations that ran."""
    return {str(c): {str(n): {str(bp): float(np.mean(v)) for bp in bps
                              if (v := _values(records, objective, c, n, bp))}
                     for n in ns} for c in budgets}


def seed_std(records: Sequence[dict], budget: int, ns: Sequence[int], bps: Sequence[int],
             num_seeds: int, objective: str = "easy_pass1", num_streams: int = 1
             ) -> dict[str, float | None]:
    """{B_p: mean over n of the standard deviation (ddof 1) of ``objective`` at ``budget`` over
    the S x T runs (seeds x streams)} (None where no n ran with every seed and stream)."""
    out = {}
    for bp in bps:
        stds = [np.std(v, ddof=1) for n in ns if len(
            v := _values(records, objective, budget, n, bp)) == num_seeds * num_streams]
        out[str(bp)] = float(np.mean(stds)) if stds else None
    return out


def interference(step_metrics: dict[tuple[int, ...], dict[str, np.ndarray]],
                 ns: Sequence[int]) -> dict[str, dict[str, float]]:
    """{n: {"fallen": share of batch problems whose exact pass@1 fell after an update,
    "informative_groups": share of groups with mixed rewards}}, averaged over steps and lanes
    (``step_metrics`` keyed by lanes whose first entry is n, e.g. (n, B_p, seed, stream))."""
    out = {}
    for n in ns:
        lanes = [v for lane, v in step_metrics.items() if lane[0] == n]
        if lanes:
            out[str(n)] = {"fallen": float(np.mean([v["fallen"].mean() for v in lanes])),
                           "informative_groups": float(np.mean([v["informative"].mean()
                                                                for v in lanes]))}
    return out
