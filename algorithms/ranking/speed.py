"""Speed of the judge-aware fit against ``choix`` on the same comparisons, and where its time goes.

Dimension legend: C comparisons, M table rows, N models, J judges.

The fit is aggregation of the C comparisons into per-(pair, judge) counts (numpy, O(C)) plus the
compiled float64 Newton solve (:func:`algorithms.ranking.btl.solve`, O(M) per iteration); the
``choix`` estimators (Maystre and Grossglauser, 2015) fit plain BTL on the same comparisons. All are
timed in one :func:`core.timing.best_seconds` call, so they see the same background load;
compilation is timed apart. :func:`fit_step_spec` is the same fit as an ahead-of-time compile row.
"""

from __future__ import annotations

import jax
import numpy as np

from algorithms.ranking import btl, data, simulate
from algorithms.ranking.studies import Comparisons, winner_loser_pairs
from core import aot_steps, sharding, steps, timing

CHOIX_ESTIMATORS = ("ilsr", "mm", "opt")


FIT_CONFIG = btl.FitConfig()  # the fit the timing study times: maximum likelihood, defaults


def solve(table: data.ComparisonTable) -> tuple[btl.Params, btl.Convergence]:
    """The timed solve: :func:`algorithms.ranking.btl.solve` of ``table`` under
    :data:`FIT_CONFIG` (float64 when the table is; no validation)."""
    return btl.solve(table, FIT_CONFIG)


def table_rows(num_models: int, num_judges: int) -> int:
    """Rows of the timing study's table: one per (i < j, judge) cell, N (N - 1) / 2 J."""
    return num_models * (num_models - 1) // 2 * num_judges


def aot_precision(platform: str) -> tuple[bool, tuple[str, str] | None]:
    """(fit in float64, fallback) for the timed fit compiled for ``platform`` (a device's
    ``platform``): float64 as the experiment fits, except on TPU, where the fit is compiled in
    float32 with the stated reason (measured with libtpu 0.0.42: XLA:TPU refuses the float64
    Newton fit on a 16-chip mesh with "A tuple parameter that is being flattened shouldn't have
    frontend attributes"; TPUs have no float64 units and XLA:TPU emulates float64, without e.g. an
    LU decomposition for it; the float32 fit compiles on the mesh in seconds)."""
    if platform != "tpu":
        return True, None
    return False, ("float32 counts and Newton steps (the experiment fits in float64)",
                   "TPUs have no float64 units: XLA:TPU emulates float64 and refuses this float64 "
                   "fit on a pod mesh (\"A tuple parameter that is being flattened shouldn't have "
                   "frontend attributes\"); the float32 fit compiles. Run the float64 fit on a CPU or "
                   "GPU host: it is one small dense solve")


def fit_step_spec(num_models: int, num_judges: int, devices) -> aot_steps.StepSpec:
    """The Newton fit the timing study times (:func:`solve`: judge-aware BTL, float64,
    :data:`FIT_CONFIG`) as an ahead-of-time compile row: the table :func:`speed_comparison`
    aggregates for N = ``num_models`` models and J = ``num_judges`` judges (padded to every
    (i < j, judge) cell, :func:`table_rows`; ``data.aggregate`` of one comparison gives its
    layout), abstract and replicated on ``devices`` (one small dense solve); in float32 on TPU
    (:func:`aot_precision`). Returns a ``core.aot_steps.StepSpec``."""
    n, nj = num_models, num_judges
    rows = table_rows(n, nj)
    rep = sharding.replicated(sharding.make_mesh(1, devices=devices))
    x64, fallback = aot_precision(devices[0].platform)
    table = data.aggregate([0], [1], [data.LEFT], [0], n_models=n, n_judges=nj, pad_to=rows,
                           dtype=np.float64 if x64 else np.float32)
    return aot_steps.StepSpec(solve, steps.place((table,), rep, as_abstract=True), (), None,
                              n + nj + 1, f"{n} models x {nj} judges, {rows} rows, "
                              f"float{64 if x64 else 32} Newton", x64=x64, fallback=fallback)


def timing_data(num_models: int, num_judges: int, num_comparisons: int, seed: int
                ) -> tuple[btl.Params, Comparisons]:
    """Scores ~ N(0, 1), discriminations log-uniform-ish on [0.2, 3] (random generator ``seed + 5``)
    and C comparisons (key ``seed + 6``): the data of :func:`speed_comparison`."""
    rng = np.random.default_rng(seed + 5)
    a = np.log(rng.uniform(0.2, 3.0, num_judges))
    truth = btl.Params(rng.normal(size=num_models), a - a.mean(), np.zeros(()))
    with jax.enable_x64(True):
        comps = Comparisons(*(np.asarray(x) for x in simulate.sample_comparisons(
            jax.random.key(seed + 6), truth, num_comparisons)))
    return truth, comps


def speed_comparison(num_models: int, num_judges: int, num_comparisons: int,
                     choix_estimators=("ilsr",), seed: int = 0, repeats: int = 2) -> dict:
    """Times aggregation + judge-aware fit against the ``choix`` estimators of plain BTL.

    Args:
      num_models, num_judges, num_comparisons: N, J, C of the simulated data (:func:`timing_data`).
      choix_estimators: names from :data:`CHOIX_ESTIMATORS` (``ilsr_pairwise``, ``mm_pairwise``,
        ``opt_pairwise``); the baseline is the fastest.
      seed: data seed.
      repeats: rounds of :func:`core.timing.best_seconds` (best of, alternating fit and ``choix``).

    Returns:
      dict: ``fit_seconds`` (aggregation + compiled fit, blocked on), ``choix_seconds`` (fastest;
      NaN, as is the speed-up, when ``choix_estimators`` is empty: nothing to compare with),
      ``choix_times`` {name: seconds}, ``speedup_vs_choix``, ``compile_seconds``, ``breakdown``
      (seconds of ``aggregate``, ``transfer`` of the table to the device, ``solve``, and
      ``per_iteration``: the solve over its Newton iterations), ``converged``, ``iterations``,
      ``rows`` (non-empty table rows) and ``gamma_recovery_max_abs`` (max |alpha_hat - alpha|).

    Raises:
      ValueError: an unknown estimator name.
    """
    import choix

    bad = [e for e in choix_estimators if e not in CHOIX_ESTIMATORS]
    if bad:
        raise ValueError(f"speed_comparison: unknown choix estimators {bad}; expected names from "
                         f"{CHOIX_ESTIMATORS}")
    truth, c = timing_data(num_models, num_judges, num_comparisons, seed)
    pad = table_rows(num_models, num_judges)
    pairs = winner_loser_pairs(c)
    estimators = dict(ilsr=choix.ilsr_pairwise, mm=choix.mm_pairwise, opt=choix.opt_pairwise)
    with jax.enable_x64(True):
        def aggregate():
            return data.aggregate(c.left, c.right, c.outcome, c.judge, n_models=num_models,
                                  n_judges=num_judges, pad_to=pad)

        def fit():
            return solve(aggregate())

        with timing.Stopwatch() as first:
            table = aggregate()
            jax.block_until_ready(solve(table))
        on_device = jax.device_put(table)
        fns = {"fit": fit, "aggregate": aggregate, "transfer": lambda: jax.device_put(table),
               "solve": lambda: solve(on_device)}
        fns.update({f"choix_{name}": (lambda e=estimators[name]: e(num_models, pairs))
                    for name in choix_estimators})
        sec = timing.best_seconds(fns, repeats=repeats, warmup=0)
        params, conv = jax.device_get(solve(on_device))
    choix_times = {name: sec[f"choix_{name}"] for name in choix_estimators}
    fastest = min(choix_times.values()) if choix_times else float("nan")
    iters = int(conv.iterations)
    return dict(
        fit_seconds=sec["fit"], choix_seconds=fastest, choix_times=choix_times,
        speedup_vs_choix=fastest / sec["fit"], compile_seconds=first.seconds - sec["fit"],
        breakdown=dict(aggregate=sec["aggregate"], transfer=sec["transfer"], solve=sec["solve"],
                       per_iteration=sec["solve"] / max(iters, 1)),
        converged=bool(conv.converged), iterations=iters,
        rows=int(np.sum(np.asarray(table.totals) > 0)),
        gamma_recovery_max_abs=float(np.max(np.abs(np.asarray(params.log_discrimination)
                                                   - truth.log_discrimination))))
