"""The forecasting experiment's seed summary and claim metrics (no training: results by hand)."""

import math

import pytest

from core import report
from experiments import forecasting
from experiments.configs import forecasting as fc_config


def _results(ppm_crps, ppm_qice=3.0):
    m = lambda crps, qice, cov: {"crps": crps, "qice": qice, "coverage_90": cov}  # noqa: E731
    return {"ppm": m(ppm_crps, ppm_qice, 0.73), "gaussian_prior": m(0.30, 0.9, 0.88),
            "linear": m(0.31, 1.2, 0.85)}


def test_seed_row_picks_the_best_baseline_and_the_relative_gap():
    row = forecasting._seed_row(_results(0.291))
    assert row["best_baseline"] == "gaussian_prior"
    assert row["ppm_crps_gap"] == pytest.approx(0.291 / 0.30 - 1)
    assert row["ppm_wins"] == 1 and row["ppm_best_qice"] == 0


def test_seed_summary_student_t_interval_from_the_definition():
    rows = [forecasting._seed_row(_results(0.30 * (1 + g))) for g in (-0.03, -0.02, -0.04)]
    s = forecasting.seed_summary(rows)
    # mean -0.03, sample sd 0.01, t_{0.95, 2} = 2.919985580355516
    half = 2.919985580355516 * 0.01 / math.sqrt(3)
    assert s["ppm_crps_gap_mean"] == pytest.approx(-0.03)
    assert s["ppm_crps_gap_ci"] == pytest.approx([-0.03 - half, -0.03 + half])
    assert s["gap_decided"] == 1 and s["ppm_wins"] == 3 and s["seeds"] == 3
    assert s["best_qice_method"] == "gaussian_prior"
    one = forecasting.seed_summary(rows[:1])
    assert one["ppm_crps_gap_ci"] is None and one["gap_decided"] is None
    with pytest.raises(ValueError, match="no seed rows"):
        forecasting.seed_summary([])


def _case(gaps):
    rows = [forecasting._seed_row(_results(0.30 * (1 + g))) for g in gaps]
    return rows[0], forecasting.seed_summary(rows)


def test_claim_wins_and_loses_by_seed_majority_and_etth1_absent_is_not_measured():
    # H=24: PPM wins 5 of 5 (about 3%); H=96: loses 4 of 5; calibration worse at both
    (r24, s24), (r96, s96) = _case([-0.03, -0.025, -0.035, -0.03, -0.028]), \
        _case([0.04, 0.05, -0.01, 0.06, 0.045])
    results = {"series": {"24": _results(r24["crps"]["ppm"]), "96": _results(r96["crps"]["ppm"])}}
    m = forecasting._claim_metrics(results, {"series": {"24": s24, "96": s96}})
    assert (m["ppm_crps_wins"], m["ppm_qice_wins"], m["cases"]) == (1, 0, 2)
    assert s96["ppm_wins"] == 1 and s96["gap_decided"] == 1
    assert m["crps_undecided"] == 0 and m["etth1_192_vs_paper"] is None
    claim = report.Claim.from_config(fc_config.get_config("tiny").claim)
    assert claim.record(m)["checks"]["etth1_192_vs_paper <= 1.0"] == "not measured here"
    assert claim.verdict(m) == "partly"
    # seeds that disagree on the sign of a gap leave the claim undecided
    _, s_mixed = _case([0.04, -0.05, 0.01, -0.02, 0.03])
    m = forecasting._claim_metrics(results, {"series": {"24": s24, "96": s_mixed}})
    assert m["crps_undecided"] == 1 and claim.verdict(m) == "not resolved at this size"
    # one seed has no interval: nothing is decided
    m = forecasting._claim_metrics(results, {"series": {
        "24": forecasting.seed_summary([r24]), "96": forecasting.seed_summary([r96])}})
    assert m["crps_undecided"] == 2 and claim.verdict(m) == "not resolved at this size"


def test_small_is_tiny_with_more_seeds_and_every_test_window():
    # small extends tiny's numbers: same network, training and cases, only seeds and test windows
    tiny, small = fc_config.get_config("tiny"), fc_config.get_config("small")
    differ = {k for k in set(tiny) | set(small) if k not in ("variant", "benchmark")
              and tiny[k] != small[k]}
    assert differ == {"num_seeds", "test_stride"}
    assert small.num_seeds > tiny.num_seeds and small.test_stride == 1
    assert small.benchmark.data == tiny.benchmark.data == "etth1"
    assert small.benchmark.num_seeds > tiny.benchmark.num_seeds
    assert small.benchmark.max_steps_per_epoch == tiny.benchmark.max_steps_per_epoch
    assert small.claim.resolved == tiny.claim.resolved == ("crps_undecided == 0",)


def test_crps_figure_draws_seed_means_with_their_range():
    """With three seeds the bars are the seed means and the whiskers span the seeds' range; with
    one seed the bar is the single run's CRPS (no whisker)."""
    import matplotlib.pyplot as plt
    import numpy as np

    crps = {"ppm": [0.20, 0.26, 0.23], "gaussian_prior": [0.30, 0.30, 0.36], "linear": [0.31] * 3}
    rows = [forecasting._seed_row(_results(crps["ppm"][i])
                                  | {"gaussian_prior": {"crps": crps["gaussian_prior"][i],
                                                        "qice": 0.9, "coverage_90": 0.88}})
            for i in range(3)]
    results = {"data": {"24": {m: {"crps": v[0]} for m, v in crps.items()}}}
    fig = forecasting._crps_figure(results, 8, {"data": {"24": rows}})
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 12) for p in ax.patches)
    assert heights == sorted(round(float(np.mean(v)), 12) for v in crps.values())
    # whiskers: vertical segments from min to max of each seeded method with a spread
    spans = sorted(tuple(round(float(y), 12) for y in sorted(seg[:, 1]))
                   for c in ax.collections for seg in c.get_segments())
    assert spans == sorted({(min(v), max(v)) for m, v in crps.items() if len(set(v)) > 1})
    assert "3 seeds" in ax.get_ylabel()
    one = forecasting._crps_figure(results, 8)
    assert sorted(round(p.get_height(), 12) for p in one.axes[0].patches) == sorted(
        v[0] for v in crps.values())
    assert not any(c.get_segments() for c in one.axes[0].collections)
    plt.close("all")
