"""Judge-aware Bradley-Terry-Luce ranking (Xu et al., 2026): joint MLE of model scores and judge
discriminations from pairwise comparisons, with confidence intervals for scores, differences and ranks.

    table = data.aggregate(left, right, outcome, judge)       # counts per (pair, judge)
    res = btl.fit(table, btl.FitConfig(ridge_alpha=1.0))      # checked, jitted Newton fit
    cov = inference.covariance(res.table, res.params, res.config)
    ci = inference.intervals(res.params, cov)                 # scores, differences, gamma
    point, lo, hi = inference.rank_intervals(key, res.params, cov)
"""

from algorithms.ranking import btl, data, inference, simulate
from algorithms.ranking.btl import Convergence, FitConfig, FitResult, Params, fit, solve
from algorithms.ranking.data import LEFT, RIGHT, TIE, ComparisonTable, aggregate, check_identifiable

__all__ = [
    "LEFT", "RIGHT", "TIE", "ComparisonTable", "Convergence", "FitConfig", "FitResult", "Params",
    "aggregate", "btl", "check_identifiable", "data", "fit", "inference", "simulate", "solve",
]
