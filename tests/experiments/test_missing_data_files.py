"""A data file the user names and that is missing stops the run with an error naming it, before
any work; only an empty field means "no file" (judge_btl then runs its simulation parts alone)."""

import pytest

from experiments import judge_btl
from experiments.configs import judge_btl as judge_btl_config


def _must_not_run(*_, **__):
    raise AssertionError("work started before the data file was checked")


@pytest.mark.parametrize("variant", ["tiny", "paper", "smoke"])
def test_judge_btl_reads_no_file_unless_one_is_named(variant):
    assert judge_btl_config.get_config(variant).data_path == ""


@pytest.mark.parametrize("path", ["../shared/data/llmfao.csv", "missing_votes.csv", "gone/x.jsonl"])
def test_judge_btl_with_a_missing_data_file_is_an_error_naming_it(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)  # the benchmark data folder is not beside this folder
    for part in ("simulation_study", "recovery_replicates", "coverage_study", "choix_agreement"):
        monkeypatch.setattr(judge_btl.studies, part, _must_not_run)
    monkeypatch.setattr(judge_btl.speed, "speed_comparison", _must_not_run)
    config = judge_btl_config.get_config("tiny")
    config.data_path = path
    with pytest.raises(FileNotFoundError, match=rf"--config.data_path\): data file '{path}' does "
                                                "not exist"):
        judge_btl.run(config, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()
