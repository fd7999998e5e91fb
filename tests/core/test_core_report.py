"""Reports: every image link of a generated report opens, whatever the working directory and
whether the workdir was given relative (the default) or absolute."""

import dataclasses
import json
import os
import re

import matplotlib.pyplot as plt
import pytest

from core import report
from experiments import main as main_lib

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _section(workdir, name):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = report.save_figure(fig, os.path.join(workdir, name, "loss.png"))
    return report.Section(title=name, body="text", figures=[path],
                          headline={"method": name, "claim": "c", "ours": "o",
                                    "reproduces": "yes"})


def _links(report_path):
    text = open(report_path).read()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert links, text
    return [os.path.join(os.path.dirname(report_path), link) for link in links]


@pytest.mark.parametrize("absolute", [False, True])
def test_every_link_of_the_main_report_opens(tmp_path, monkeypatch, absolute):
    monkeypatch.chdir(tmp_path)
    workdir = str(tmp_path / "workdir") if absolute else "workdir"
    # as in the main job: one section made in this process, one sent back as JSON by a child
    child = _section(workdir, "b")
    sent = report.Section(**json.loads(json.dumps(dataclasses.asdict(child))))
    path = main_lib.write_main_report(workdir, "tiny", ["a", "b"], [_section(workdir, "a"), sent],
                                      1.0)
    links = _links(path)
    assert [os.path.relpath(p, os.path.dirname(path)) for p in links] == \
        [os.path.join("a", "loss.png"), os.path.join("b", "loss.png")]
    # opened from another working directory, relative to the report's folder
    monkeypatch.chdir(os.path.dirname(path))
    for link in _links(os.path.basename(path)):
        with open(link, "rb") as f:
            assert f.read(8) == PNG_MAGIC, link


def test_experiment_report_links_open(tmp_path, monkeypatch):
    # ``python -m experiments.<name>`` writes <workdir>/<name>/report.md beside its figures
    monkeypatch.chdir(tmp_path)
    section = _section("wd", "lm")
    path = report.write_report(os.path.join("wd", "lm", "report.md"), "Report: lm", [section])
    assert "](loss.png)" in open(path).read()
    for link in _links(path):
        with open(link, "rb") as f:
            assert f.read(8) == PNG_MAGIC


# -- claims -------------------------------------------------------------------------------------


def test_claim_checks_compare_metrics_numbers_and_scaled_shifted_metrics():
    from core.report import Claim

    metrics = {"bpb": 2.5, "bigram": 3.6, "fits": {"easy": {"winner": 1.0}}, "ok": True}
    claim = Claim("LM", "under bigram", ("bpb < bigram - 0.3", "bpb >= 2.5", "fits.easy.winner == 1",
                                          "ok == 1", "bpb < 0.5 * bigram + 0.7"), "{bpb:.2f}")
    # 2.5 < 3.3; 2.5 >= 2.5; 1 == 1; True == 1; 2.5 < 1.8 + 0.7 = 2.5 is false
    assert claim.outcomes(metrics) == [True, True, True, True, False]
    assert claim.verdict(metrics) == "partly"
    assert claim.headline(metrics) == {"method": "LM", "claim": "under bigram", "ours": "2.50",
                                       "reproduces": "partly"}
    assert Claim("LM", "s", ("bpb > 9",), "x").verdict(metrics) == "no"
    assert Claim("LM", "s", ("bpb < 9", "bigram > 1e-3"), "x").verdict(metrics) == "yes"


def test_claim_nan_or_none_metric_fails_its_check_and_missing_metric_names_the_key():
    from core.report import Claim

    claim = Claim("m", "s", ("a < 1",), "x")
    assert claim.outcomes({"a": float("nan")}) == [False]
    assert claim.outcomes({"a": None}) == [False]
    with pytest.raises(KeyError, match="metric 'fits.hard' not found; fits has \\['easy'\\]"):
        Claim("m", "s", ("fits.hard < 1",), "x").outcomes({"fits": {"easy": 1}})


@pytest.mark.parametrize("text", ["a <", "a << 1", "1 < a", "a < b +", "a < b * 2", ""])
def test_claim_check_grammar_refuses_malformed_text(text):
    from core.report import Claim

    with pytest.raises(ValueError, match="claim check"):
        Claim("m", "s", (text,), "x")


def test_claim_config_fields_are_validated_with_the_config(tmp_path):
    import ml_collections

    from core import config as cfg_lib
    from core.report import claim_config, finish

    config = ml_collections.ConfigDict({"steps": 1, "claim": claim_config(
        "LM", "under bigram", ("bpb < bigram",), "{bpb:.1f}")})
    rules = {"steps": cfg_lib.integer(1)}
    cfg_lib.validate(config, rules)
    config.claim.checks = ("bpb <",)
    with pytest.raises(ValueError, match="config field 'claim.checks'"):
        cfg_lib.validate(config, rules)
    config.claim.checks = ("bpb < bigram",)
    section = finish(str(tmp_path), title="T", metrics={"bpb": 1.0, "bigram": 2.0}, body="b",
                     claim=config.claim)
    assert section.headline["reproduces"] == "yes" and section.headline["ours"] == "1.0"
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["claim"] == {"statement": "under bigram", "verdict": "yes",
                                "checks": {"bpb < bigram": True}}
