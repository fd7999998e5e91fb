"""core.data.files: every way of failing to read a data file is one error naming the file;
core.files: reports, metrics and plots written under a gs:// workdir land in the bucket."""

import gzip
import json
import os

import matplotlib.pyplot as plt
import numpy as np
import pytest

from core import files, report
from core.data.files import read_bytes, read_text
from tests.core.fake_bucket import fake_gcs


def test_plain_gzip_and_bom_text(tmp_path):
    (tmp_path / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(b"x,y\n3,4\n"))
    (tmp_path / "c.csv").write_bytes(gzip.compress(b"x\n5\n"))  # gzip without the extension
    (tmp_path / "d.csv").write_bytes("\ufeffx\n6\n".encode())
    assert read_text(str(tmp_path / "a.csv")) == "x,y\n1,2\n"
    assert read_text(str(tmp_path / "b.csv.gz")) == "x,y\n3,4\n"
    assert read_text(str(tmp_path / "c.csv")) == "x\n5\n"
    assert read_text(str(tmp_path / "d.csv")) == "x\n6\n"


def test_each_failure_is_one_error_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        read_text(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="is a directory; expected a file"):
        read_text(str(tmp_path), "series")
    (tmp_path / "fake.csv.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="fake.csv.gz' ends in .gz but is not a gzip file"):
        read_bytes(str(tmp_path / "fake.csv.gz"))
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"a" * 1000)[:20])
    with pytest.raises(ValueError, match="cut.gz' is a corrupt or truncated gzip file"):
        read_bytes(str(tmp_path / "cut.gz"))
    (tmp_path / "latin.txt").write_bytes(b"ok line\nsecond \xff line\n")
    with pytest.raises(ValueError, match=r"latin.txt', line 2, column 8: not UTF-8 text \(byte 0xff\)"):
        read_text(str(tmp_path / "latin.txt"))


# -- core.files: output paths that may be object-store URLs ------------------------------------

def test_path_helpers_keep_urls_and_make_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert files.join("gs://b/run", "lm", "report.md") == "gs://b/run/lm/report.md"
    assert files.display("gs://b/run") == "gs://b/run"
    assert files.display("run") == os.path.join(str(tmp_path), "run")
    assert files.display("file:///x/y") == "/x/y"
    assert files.parent("gs://b/run/report.md") == "gs://b/run"
    assert files.parent("run/report.md") == os.path.join(str(tmp_path), "run")
    assert files.relative("gs://b/run/lm/loss.png", "gs://b/run") == "lm/loss.png"
    assert files.relative("gs://b/run/loss.png", "gs://b/run/lm") == "../loss.png"
    assert files.relative("gs://other/loss.png", "gs://b/run") == "gs://other/loss.png"
    assert files.relative("run/lm/loss.png", "run") == "lm/loss.png"
    assert files.relative("gs://b/x.png", "run") == "gs://b/x.png"
    assert (files.scheme("GS://b/x"), files.scheme("/a/b"), files.scheme("a://")) == ("gs", None, "a")
    assert files.is_local("file:///x") and files.is_local("x/y") and not files.is_local("s3://b/k")


def test_reports_metrics_and_plots_are_written_into_the_bucket(tmp_path, monkeypatch):
    """Every writer of core.report under a gs:// folder: the objects land in the bucket, the
    report's image link is relative to the report, and nothing appears locally under 'gs:'."""
    bucket, cwd = tmp_path / "store", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with fake_gcs(bucket):
        out = "gs://b/run/exp"
        report.write_json(files.join(out, "m.json"), {"x": np.float32(1.5), "nan": float("nan")})
        writer = report.JsonLinesWriter(files.join(out, "log.jsonl"))
        for step in (1, 2, 3):
            writer.write({"step": step, "loss": 1.0 / step})
        # a second writer (a resumed run) keeps what the object holds and drops steps after 2
        again = report.JsonLinesWriter(files.join(out, "log.jsonl"))
        assert again.truncate(lambda r: r["step"] <= 2) == 1
        again.write({"step": 3, "loss": 0.25})
        records = report.read_json_lines(files.join(out, "log.jsonl"))
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        png = report.save_figure(fig, files.join(out, "loss.png"))
        section = report.Section("exp", "body", figures=[png], headline=None)
        report.write_report("gs://b/run/report.md", "T", [section])
    assert png == "gs://b/run/exp/loss.png" and section.figures == [png]
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["loss"] == 0.25
    local = bucket / "b" / "run"
    assert json.loads((local / "exp" / "m.json").read_text()) == {"nan": "nan", "x": 1.5}
    assert (local / "exp" / "log.jsonl").read_text().count("\n") == 3
    assert (local / "exp" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![loss.png](exp/loss.png)" in (local / "report.md").read_text()
    assert sorted(p.name for p in (local / "exp").iterdir()) == ["log.jsonl", "loss.png", "m.json"]
    assert list(cwd.iterdir()) == []  # no local 'gs:' folder, no temporary files


def test_data_files_are_read_from_a_bucket(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "t.csv.gz").write_bytes(gzip.compress(b"x\n7\n"))
    with fake_gcs(tmp_path):
        assert read_text("gs://b/t.csv.gz") == "x\n7\n"
        with pytest.raises(FileNotFoundError, match="'gs://b/missing.csv' does not exist"):
            read_text("gs://b/missing.csv", "series")
        with pytest.raises(ValueError, match="'gs://b' is a directory"):
            read_text("gs://b", "series")


def test_a_missing_client_library_is_one_line_naming_the_path_and_the_fix():
    error = ImportError("No module named 'gcsfs'\nmore detail")
    assert files.missing_client("gs://b/x", error) == (
        "no client library for gs:// paths (No module named 'gcsfs'); for gs:// install the gcs "
        "extra: pip install -e '.[gcs]'")
    assert files.missing_client("s3://b/x", ImportError()) == (
        "no client library for s3:// paths (ImportError)")
    import importlib.util

    if importlib.util.find_spec("gcsfs") is None:  # else the check would reach the network
        with pytest.raises(ValueError, match=r"^data file 'gs://b/d\.csv': no client library for "
                                             r"gs:// paths .*pip install -e '\.\[gcs\]'$"):
            read_text("gs://b/d.csv")
