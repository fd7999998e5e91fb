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


def test_claim_nan_fails_its_check_none_is_unmeasured_and_missing_metric_names_the_key():
    from core.report import Claim

    claim = Claim("m", "s", ("a < 1",), "x")
    assert claim.outcomes({"a": float("nan")}) == [False]
    assert claim.outcomes({"a": 0.5, "b": float("nan")}) == [True]
    assert Claim("m", "s", ("a < b",), "x").outcomes({"a": 0.5, "b": float("nan")}) == [False]
    assert claim.outcomes({"a": None}) == [None]
    assert Claim("m", "s", ("a < b",), "x").outcomes({"a": 0.5, "b": None}) == [None]
    with pytest.raises(KeyError, match="metric 'fits.hard' not found; fits has \\['easy'\\]"):
        Claim("m", "s", ("fits.hard < 1",), "x").outcomes({"fits": {"easy": 1}})


@pytest.mark.parametrize("text", ["a <", "a << 1", "1 < a", "a < b +", "a < b * 2", ""])
def test_claim_check_grammar_refuses_malformed_text(text):
    from core.report import Claim

    with pytest.raises(ValueError, match="claim check"):
        Claim("m", "s", (text,), "x")


@dataclasses.dataclass(frozen=True)
class _Config:
    steps: int = 1
    claim: report.Claim = report.Claim("LM", "under bigram", ("bpb < bigram",), "{bpb:.1f}")


def test_claim_fields_are_validated_with_the_config(tmp_path):
    import ml_collections

    from core import config as cfg_lib
    from core.report import finish

    config = ml_collections.ConfigDict(cfg_lib.defaults(_Config))
    cfg_lib.validate(config, _Config)
    config.claim.checks = ("bpb <",)
    with pytest.raises(ValueError, match="config field 'claim.checks' = .*: claim check 'bpb <'"):
        cfg_lib.validate(config, _Config)
    config.claim.checks = ("bpb < bigram",)
    config.claim.resolved = ("ci_width <",)
    with pytest.raises(ValueError, match="config field 'claim.resolved'"):
        cfg_lib.validate(config, _Config)
    config.claim.resolved = ()
    config.claim.method = " "
    with pytest.raises(ValueError, match="config field 'claim.method' = ' ': expected a non-empty"):
        cfg_lib.validate(config, _Config)
    config.claim.method = "LM"
    section = finish(str(tmp_path), title="T", metrics={"bpb": 1.0, "bigram": 2.0}, body="b",
                     claim=config.claim)
    assert section.headline["reproduces"] == "yes" and section.headline["ours"] == "1.0"
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["claim"] == {
        "statement": "under bigram", "verdict": "yes", "checks": {"bpb < bigram": True},
        "resolved": {}, "reason": "yes: 1 of 1 measured checks hold",
        "rule": "Rule: 'not measured here' if no check's metric was measured; else 'yes' if the "
                "check holds, 'no' if not (a check on an unmeasured metric is left out)."}
    assert section.body.startswith("b\n\n**Verdict — yes: 1 of 1 measured checks hold.** Rule: ")


# One claim, every verdict: two checks on a slope, one resolved check on its interval's width.
_SLOPE_CLAIM = dict(method="m", statement="n* grows", checks=("slope > 0", "easy_slope > 0"),
                    ours="{slope}", resolved=("slope_ci.width <= 0.5",))


@pytest.mark.parametrize("metrics, verdict, checks, resolved, reason", [
    ({"slope": 0.3, "easy_slope": 0.2, "slope_ci": {"lo": 0.1, "width": 0.4}}, "yes",
     [True, True], [True], "yes: 2 of 2 measured checks hold"),
    ({"slope": 0.3, "easy_slope": -0.2, "slope_ci": {"lo": 0.1, "width": 0.4}}, "partly",
     [True, False], [True], "partly: 1 of 2 measured checks hold"),
    ({"slope": -0.3, "easy_slope": -0.2, "slope_ci": {"lo": -0.5, "width": 0.4}}, "no",
     [False, False], [True], "no: 0 of 2 measured checks hold"),
    # the point estimates pass but the interval [-0.02, 0.68] is 0.7 wide: the size cannot decide
    ({"slope": 0.3, "easy_slope": 0.2, "slope_ci": {"lo": -0.02, "width": 0.70}},
     "not resolved at this size", [True, True], [False],
     "not resolved at this size: `slope_ci.width <= 0.5` does not hold"),
    # an interval this run did not measure (a part that did not run) is left out, like a check;
    # an experiment that must show its size records a failing value instead (NaN fails)
    ({"slope": 0.3, "easy_slope": 0.2, "slope_ci": None}, "yes", [True, True],
     ["not measured here"], "yes: 2 of 2 measured checks hold"),
    ({"slope": 0.3, "easy_slope": 0.2, "slope_ci": {"lo": 0.1, "width": float("nan")}},
     "not resolved at this size", [True, True], [False],
     "not resolved at this size: `slope_ci.width <= 0.5` does not hold"),
    # one check unmeasured: left out of the verdict, named in the reason
    ({"slope": 0.3, "easy_slope": None, "slope_ci": {"lo": 0.1, "width": 0.4}}, "yes",
     [True, "not measured here"], [True],
     "yes: 1 of 1 measured checks hold; not measured here: `easy_slope > 0`"),
    ({"slope": None, "easy_slope": None, "slope_ci": {"lo": None, "width": None}},
     "not measured here", ["not measured here"] * 2, ["not measured here"],
     "not measured here: no check's metric was measured by this run"),
])
def test_claim_gives_each_verdict_by_its_rule(tmp_path, metrics, verdict, checks, resolved,
                                                reason):
    from core.report import VERDICTS, Claim, finish

    assert verdict in VERDICTS
    claim = Claim(**_SLOPE_CLAIM)
    assert claim.verdict(metrics) == verdict
    assert claim.reason(metrics) == reason
    section = finish(str(tmp_path), title="T", metrics=metrics, body="b",
                     claim=dataclasses.asdict(claim))
    assert section.headline["reproduces"] == verdict
    assert f"**Verdict — {reason}.**" in section.body
    assert "'not resolved at this size' unless `slope_ci.width <= 0.5`" in section.body
    written = json.loads((tmp_path / "metrics.json").read_text())["claim"]
    assert written["verdict"] == verdict and written["reason"] == reason
    assert written["checks"] == dict(zip(claim.checks, checks))
    assert written["resolved"] == dict(zip(claim.resolved, resolved))
    assert written["rule"] == claim.rule()


def test_claim_resolved_checks_are_parsed_and_a_config_without_them_still_loads():
    from core.report import Claim

    with pytest.raises(ValueError, match="claim check 'w <'"):
        Claim("m", "s", ("a < 1",), "x", resolved=("w <",))
    old = {"method": "m", "statement": "s", "checks": ("a < 1",), "ours": "x"}
    assert Claim.from_config(old).resolved == ()
    assert Claim.from_config(old).verdict({"a": 0.0}) == "yes"


def test_a_meaningless_variant_has_no_verdict_in_table_or_section(tmp_path):
    """At smoke the opening table and the section's own verdict line both read n/a; a failed
    experiment stays failed; a tiny section keeps its verdict."""
    claim = report.Claim(method="M", statement="x >= 1", checks=("x >= 1",), ours="{x}")
    smoke = report.finish(str(tmp_path / "a"), title="A", metrics={"x": 2}, body="text",
                          claim=claim)
    assert "**Verdict — yes" in smoke.body  # finish writes the verdict line
    failed = dataclasses.replace(smoke, title="B", headline={**smoke.headline,
                                                             "reproduces": "failed"})
    md = (tmp_path / "r.md")
    report.write_report(str(md), "R", [smoke, failed], no_verdict="smoke")
    text = md.read_text()
    assert "**Verdict — yes" not in text.split("## B")[0]
    assert "**Verdict — n/a (smoke: the numbers are meaningless" in text
    rows = [r for r in text.splitlines() if r.startswith("| M |")]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["n/a (smoke)", "failed"]
    kept = report.write_report(str(tmp_path / "t.md"), "T", [smoke])
    assert "**Verdict — yes" in open(kept).read()
