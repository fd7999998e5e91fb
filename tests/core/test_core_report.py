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
