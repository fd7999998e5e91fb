"""The judge_btl experiment on a comparisons file: validated before any other work, labelled with the
data set's own name, real-data and simulation numbers under separate keys of metrics.json."""

import csv
import json
import os
import re

import numpy as np
import pytest

from algorithms.ranking import LEFT, RIGHT, TIE
from experiments import judge_btl
from experiments.configs import judge_btl as judge_btl_config
from tests.algorithms.ranking.test_judge_btl_diagnosis import _comparisons as btl_truth_comparisons

NAMES = ["alpha", "beta", "gamma", "delta", "eps"]


def _rows(seed=0, n=300, ties_only=False):
    """Comparisons from a BTL truth (scores 1, 0.5, 0, -0.5, -1), three workers, 10% ties (the
    draws of the library tests' generator), as file records."""
    word = {LEFT: "left", RIGHT: "right", TIE: "tie"}
    return [dict(left=NAMES[a], right=NAMES[b], worker=f"w{j}",
                 winner="tie" if ties_only else word[o])
            for a, b, j, o in btl_truth_comparisons(seed, n)]


def _csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return str(path)


def _config(path, **overrides):
    config = judge_btl_config.get_config("smoke")
    config.data_path = path
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


def _must_not_run(*_, **__):
    raise AssertionError("a simulation part ran before the data file was validated")


STUDIES = ("simulation_study", "recovery_replicates", "coverage_study", "choix_agreement")


@pytest.fixture
def no_simulation(monkeypatch):
    for part in STUDIES:
        monkeypatch.setattr(judge_btl.studies, part, _must_not_run)
    monkeypatch.setattr(judge_btl.speed, "speed_comparison", _must_not_run)


def test_all_ties_file_is_an_error_before_any_work(tmp_path, no_simulation):
    # Used to exit 0 with an alphabetical leaderboard of +0.000 scores.
    path = _csv(tmp_path / "ties.csv", _rows(ties_only=True))
    want = f"{path}: no decisive comparison: all 300 comparisons are ties"
    with pytest.raises(ValueError, match="^" + re.escape(want)):
        judge_btl.run(_config(path), str(tmp_path / "work"))
    assert not os.path.exists(tmp_path / "work" / "judge_btl")


def test_json_array_file_with_unknown_outcomes(tmp_path, no_simulation):
    # A .json file holding one array used to fail with "Expecting value: line 2 column 1", naming no
    # file, after the simulation parts had run.
    rows = _rows()
    rows[7]["winner"] = "unknown"
    rows[20]["winner"] = "unknown"
    path = str(tmp_path / "arena.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    line = 1 + 6 * 7 + 5  # "[", 7 objects of 6 lines, then the 8th object's "winner" line
    assert '"unknown"' in open(path).read().splitlines()[line - 1]
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}:{line - 4}: outcome 'unknown' in column 'winner'")):
        judge_btl.run(_config(path), str(tmp_path / "work"))
    d = judge_btl.load_comparisons(path, _config(path, drop_unknown_outcomes=True))
    assert d["dropped"] == {"unknown": 2} and d["left"].shape == (298,)
    assert d["name"] == "arena" and d["models"] == sorted(NAMES)


def _stub_parts(monkeypatch, tmp_path):
    """Replaces the simulation, replicate, coverage, choix and timing studies by fixed numbers."""
    n = 3
    sim = dict(heldout=dict(judge_aware=-0.1, btl=-0.2), score_rmse=0.3, score_rmse_btl=0.4,
               rmse_aligned=dict(judge_aware=0.05, btl=0.06), scale=dict(judge_aware=1.1, btl=0.8),
               gamma_true=np.ones(3), gamma_hat=np.ones(3), gamma_se=np.ones(3), scores_hat=np.zeros(n),
               scores_se=np.ones(n), rank_ci_width=111.0, rank_ci_covers_truth=0.5, iterations=7,
               se_ratio_observed_to_expected=[0.9, 1.0, 1.1])
    monkeypatch.setattr(judge_btl.studies, "simulation_study", lambda *a, **k: sim)
    monkeypatch.setattr(judge_btl.studies, "simulation_truth", lambda *a, **k: judge_btl.studies.btl.Params(
        np.linspace(-1, 1, n), np.zeros(3), np.zeros(())))
    monkeypatch.setattr(judge_btl.studies, "recovery_replicates", lambda *a, **k: dict(
        rmse_judge_aware=0.01, rmse_btl=0.02, judge_aware_better=1.0, num_used=2, num_dropped=0))
    monkeypatch.setattr(judge_btl.studies, "coverage_study", lambda *a, **k: dict(
        scores=0.95, scores_mc_se=0.005, differences=0.95, log_discrimination=0.95,
        converged=0.75, num_datasets=8,
        num_used=6, num_dropped=2, dropped_fraction=0.25, se_ratio_observed_to_expected=0.97,
        observed=dict(scores=0.94, differences=0.93, log_discrimination=0.92),
        comparisons_per_dataset=10.0))
    monkeypatch.setattr(judge_btl.studies, "choix_agreement", lambda *a, **k: 1e-12)
    monkeypatch.setattr(judge_btl.speed, "speed_comparison", lambda *a, **k: dict(
        fit_seconds=222.0, compile_seconds=1.0, choix_seconds=444.0, choix_times={"ilsr": 444.0},
        speedup_vs_choix=2.0, breakdown=dict(aggregate=1.0, transfer=0.1, solve=2.0, per_iteration=0.5),
        converged=True, iterations=3, rows=10, gamma_recovery_max_abs=0.0))


def test_without_data_the_headline_comes_from_the_simulation(tmp_path, monkeypatch):
    _stub_parts(monkeypatch, tmp_path)
    section = judge_btl.run(_config(""), str(tmp_path))
    m = json.load(open(tmp_path / "judge_btl" / "metrics.json"))
    assert m["real_data"] is None and m["headline"]["heldout_source"] == "simulation"
    assert m["headline"]["heldout_loglik_judge_aware"] == -0.1 and m["headline"]["speedup_vs_choix"] == 2.0
    assert "No comparisons file" in section.body
    # The coverage says how many simulated data sets it left out and over how many it is taken.
    assert "| 2 of 8 (25.0%) |" in section.body and "(over the 6 data sets kept;" in section.body
    assert "| [0.93, 0.97] | 0.95 +- 0.0050 |" in section.body  # with its Monte Carlo error
    assert m["claim"]["resolved"] == {"coverage.scores_mc_se <= 0.01": True}
    assert "(over the 6 of 8 simulated data sets" in section.headline["ours"]
    # The common-scale recovery numbers are top-level keys and part of the claim.
    assert (m["sim_rmse_judge_aware"], m["sim_rmse_btl"]) == (0.05, 0.06)
    assert m["claim"]["checks"]["sim_rmse_judge_aware < sim_rmse_btl"] is True
    assert m["claim"]["checks"]["headline.speedup_vs_choix >= 10"] is False


def test_real_data_numbers_are_kept_apart_and_named(tmp_path, monkeypatch):
    _stub_parts(monkeypatch, tmp_path)
    rows = _rows(n=400)
    rows[3]["winner"] = "??"
    path = _csv(tmp_path / "my_votes.csv", rows)
    section = judge_btl.run(_config(path, drop_unknown_outcomes=True, data_name="My votes",
                                    data_only=False), str(tmp_path))
    m = json.load(open(tmp_path / "judge_btl" / "metrics.json"))
    assert "rank_ci_width" not in m and "fit_seconds" not in m
    assert m["simulation"]["rank_ci_width"] == 111.0 and m["timing"]["fit_seconds"] == 222.0
    real = m["real_data"]
    assert real["name"] == "My votes" and real["num_comparisons"] == 399
    assert real["num_dropped"] == 1 and real["dropped_outcomes"] == {"??": 1}
    assert real["rank_ci_width"] != 111.0 and m["headline"]["heldout_source"] == "My votes"
    assert "My votes (399 comparisons, 5 models, 3 judges; 1 rows with unknown outcomes dropped" in \
        section.body
    assert "LLMFAO" not in section.body and "workers" not in section.body
    # The leaderboard: the truth's order, and every point rank inside its interval.
    board = real["leaderboard"]
    assert [b["model"] for b in board[:2]] == ["alpha", "beta"]
    assert all(b["rank_lo"] <= b["rank"] <= b["rank_hi"] for b in board)
    assert os.path.exists(tmp_path / "judge_btl" / "My_votes_rank_intervals.png")


LLMFAO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "llmfao.csv")


@pytest.mark.skipif(not os.path.exists(LLMFAO),
                    reason="LLMFAO benchmark file ../shared/data/llmfao.csv not present (optional data)")
def test_llmfao_file_validates():
    d = judge_btl.load_comparisons(LLMFAO, _config(LLMFAO))
    assert (d["left"].shape[0], len(d["models"]), len(d["judges"])) == (8931, 59, 124)
    assert d["name"] == "llmfao"


def test_data_only_fits_the_file_alone_and_reports_judges_by_name(tmp_path, no_simulation):
    # data_only is on by default with a comparisons file: no simulation, coverage, choix or timing
    path = _csv(tmp_path / "votes.csv", _rows(n=400))
    section = judge_btl.run(_config(path), str(tmp_path))
    m = json.load(open(tmp_path / "judge_btl" / "metrics.json"))
    assert m["data_only"] is True and m["simulation"] is None and m["timing"] is None
    assert m["headline"]["heldout_source"] == "votes" and m["headline"]["ci_coverage"] is None
    # the simulation-only checks are not measured; the held-out one is judged on the file
    checks = m["claim"]["checks"]
    assert checks["headline.ci_coverage >= 0.93"] == "not measured here"
    assert checks["sim_rmse_judge_aware < sim_rmse_btl"] == "not measured here"
    held = checks["headline.heldout_loglik_judge_aware > headline.heldout_loglik_btl"]
    assert held in (True, False) and m["claim"]["verdict"] == ("yes" if held else "no")
    # three judges of ~130 comparisons each from one BTL truth: the unpenalised MLE is a number
    mle = m["real_data"]["heldout_judge_aware_mle"]
    assert isinstance(mle, float) and -0.7 < mle < -0.5 and m["real_data"]["mle_diagnosis"] is None
    assert f"judge-aware MLE {mle:.4f}, judge-aware MAP" in section.body
    assert "does not exist" not in section.body and "no finite MLE" not in section.body
    assert "not run (data only)" in section.headline["ours"]
    # one row per judge of the file's judge column, named, with its interval around gamma
    judges = m["real_data"]["judges"]
    assert sorted(j["judge"] for j in judges) == ["w0", "w1", "w2"]
    assert sum(j["comparisons"] for j in judges) == 400
    assert [j["gamma"] for j in judges] == sorted((j["gamma"] for j in judges), reverse=True)
    for j in judges:
        assert j["lo"] == pytest.approx(j["gamma"] - 1.959963984540054 * j["se"])
        assert j["hi"] == pytest.approx(j["gamma"] + 1.959963984540054 * j["se"])
        assert f"| {j['judge']} | {j['gamma']:.3f} |" in section.body
    assert "--config.data_only=False" in section.body


def test_missing_column_error_names_the_flag_to_set(tmp_path, no_simulation):
    rows = [dict(left=r["left"], right=r["right"], annotator=r["worker"], winner=r["winner"])
            for r in _rows(n=20)]
    path = _csv(tmp_path / "votes.csv", rows)
    want = (f"{path}:2: missing column(s) ['worker']; present: ['annotator', 'left', 'right', "
            "'winner'] (--config.columns.judge=<column> names the judge column)")
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        judge_btl.run(_config(path), str(tmp_path / "work"))
    d = judge_btl.load_comparisons(path, _config(path, columns=dict(
        judge_btl_config.get_config("smoke").columns, judge="annotator")))
    assert d["judges"] == ["w0", "w1", "w2"]


def test_data_only_report_says_why_the_judge_aware_mle_is_nan(tmp_path, no_simulation):
    # Judge 'sep' prefers the better model in all of its 4 comparisons (none tied): a larger
    # discrimination always fits it better, so the unpenalised MLE has gamma_sep = inf. Judge 'adv'
    # prefers the worse model in all of its 4: its likelihood peaks at gamma_adv = 0.
    good = [("alpha", "eps"), ("beta", "delta"), ("alpha", "gamma"), ("beta", "eps")]
    rows = _rows(n=400) + [dict(left=a, right=b, worker="sep", winner="left") for a, b in good] + [
        dict(left=a, right=b, worker="adv", winner="right") for a, b in good]
    path = _csv(tmp_path / "votes.csv", rows)
    section = judge_btl.run(_config(path), str(tmp_path))
    real = json.load(open(tmp_path / "judge_btl" / "metrics.json"))["real_data"]
    assert real["heldout_judge_aware_mle"] == "nan" and real["splits"][0]["judge_aware_mle"] == "nan"
    diag = real["mle_diagnosis"]
    assert diag["exists"] is False and diag["to_infinity"] == [dict(judge="sep", comparisons=4)]
    assert [(e["judge"], e["comparisons"]) for e in diag["to_zero"]] == [("adv", 4)]
    assert diag["to_zero"][0]["lead_sum"] < 0 and diag["other_judges"] == diag["models"] == []
    assert "judge-aware MLE nan (no finite MLE on the training part of the split), judge-aware MAP" \
        in section.body
    assert ("The unpenalised judge-aware MLE does not exist: on the whole file judge 'sep' (4 "
            "comparisons) agrees with the fitted order in every comparison, none tied, so a larger "
            "discrimination gamma always fits those votes better and it runs to infinity (the data "
            "separate); judge 'adv' (4 comparisons) votes against the fitted order on balance") \
        in section.body
    assert real["heldout_judge_aware_map"] > -0.7  # the MAP, with its ridge, is a number


def test_mle_diagnosis_names_a_judge_with_only_ties(tmp_path):
    from algorithms.ranking import diagnosis, studies

    rows = _rows(n=60) + [dict(left="alpha", right="beta", worker="calm", winner="tie")] * 3
    path = _csv(tmp_path / "votes.csv", rows)
    d = judge_btl.load_comparisons(path, _config(path))  # valid: the leaderboard has a ridge
    comps = studies.Comparisons(d["left"], d["right"], d["judge"], d["outcome"])
    diag = diagnosis.mle_diagnosis(comps, d["models"], d["judges"])
    assert diag["exists"] is False and diag["only_ties"] == ["calm"]
    text = judge_btl._mle_reason(dict(mle_diagnosis=diag))
    assert text.startswith("The unpenalised judge-aware MLE does not exist: judges 'calm' have only "
                           "tied comparisons")
    assert text.endswith(" Each split's reason is in metrics.json (real_data.splits, mle_error). ")


def _registry_entry(monkeypatch, url: str, body: bytes):
    """Points the registry's ``llmfao`` at ``url`` (a loopback server or a closed port)."""
    import dataclasses
    import hashlib

    from core.data import download

    entry = dataclasses.replace(download.DATASETS["llmfao"], url=url, size=len(body),
                                sha256=hashlib.sha256(body).hexdigest())
    monkeypatch.setitem(download.DATASETS, "llmfao", entry)
    return entry


def test_data_by_name_is_downloaded_once_then_fitted(tmp_path, monkeypatch, no_simulation):
    from core.testing import LoopbackFileServer

    fitted = []  # the data-only fit (tested above) receives the downloaded comparisons
    monkeypatch.setattr(judge_btl, "_run_data_only", lambda config, real, out: fitted.append(real))
    body = open(_csv(tmp_path / "src.csv", _rows(n=400)), "rb").read()
    with LoopbackFileServer(body) as server:
        _registry_entry(monkeypatch, server.url("llmfao.csv"), body)
        config = _config("", data="llmfao", data_dir=str(tmp_path / "cache"))
        judge_btl.run(config, str(tmp_path / "a"))
        judge_btl.run(config, str(tmp_path / "b"))
        assert server.requests == [None]  # the second run read the cache
    assert open(tmp_path / "cache" / "llmfao.csv", "rb").read() == body
    assert [(r["name"], r["path"], r["left"].shape) for r in fitted] == [
        ("llmfao", str(tmp_path / "cache" / "llmfao.csv"), (400,))] * 2


def test_benchmark_offline_is_not_measured_and_says_how_to_get_it(tmp_path, monkeypatch):
    from core.testing import closed_port_url

    _stub_parts(monkeypatch, tmp_path)
    entry = _registry_entry(monkeypatch, closed_port_url("llmfao.csv"), b"unused")
    config = _config("", data_dir=str(tmp_path / "cache"))
    config.benchmark.data, config.benchmark.timeout = "llmfao", 5.0
    section = judge_btl.run(config, str(tmp_path))
    m = json.load(open(tmp_path / "judge_btl" / "metrics.json"))
    assert m["real_data"] is None and m["headline"]["heldout_source"] == "simulation"
    place = str(tmp_path / "cache" / "llmfao.csv")
    assert m["benchmark"]["measured"] is False
    for text in (m["benchmark"]["how_to_get"], section.headline["ours"], section.body):
        assert entry.url in text and place in text and "python -m core.data.download llmfao" in text
    assert "llmfao not measured here" in section.headline["ours"]


def test_data_path_and_data_together_are_refused():
    from core import config as cfg_lib
    from experiments.configs import judge_btl as module

    config = _config("votes.csv", data="llmfao")
    with pytest.raises(ValueError, match="data_path='votes.csv' and data='llmfao'"):
        cfg_lib.validate_module_config(config, module)
    config = _config("", data="arena")
    with pytest.raises(ValueError, match="llmfao"):
        cfg_lib.validate_module_config(config, module)
