"""An experiment run with ``--workdir=gs://...``: its report, metrics, plot, training log and
checkpoints land in the bucket (served from a local folder by ``tests.core.fake_bucket``), a rerun
resumes from the bucket's checkpoint, and nothing is written locally under a ``gs:`` folder."""

import importlib.util
import json

import pytest

from core import checkpoint as ckpt_lib
from core import files, report
from core import workdir as workdir_lib
from experiments import lm as lm_experiment
from experiments.configs import lm as lm_config
from tests.core.fake_bucket import fake_gcs


def _run_lm(workdir: str) -> report.Section:
    """What ``python -m experiments.lm --workdir=<workdir>`` does around the experiment."""
    workdir_lib.check_workdir(workdir, ["lm"])
    with workdir_lib.lock_workdir(files.join(workdir, "lm")):
        section = lm_experiment.run(lm_config.get_config("smoke"), workdir)
    report.write_report(files.join(workdir, "lm", "report.md"), "lm", [section])
    return section


def test_lm_writes_into_the_bucket_and_resumes_from_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt_lib, "REMOTE_SETTLE_S", 0.0)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    store = tmp_path / "store"
    with fake_gcs(store):
        first = _run_lm("gs://bucket/run1")
        second = _run_lm("gs://bucket/run1")
    out = store / "bucket" / "run1" / "lm"
    names = {p.name for p in out.iterdir()}
    assert {"metrics.json", "loss.png", "train_metrics.jsonl", "report.md", "checkpoints"} <= names
    assert ckpt_lib.LOCK_FILE not in names  # the lock object is removed on release
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert first.figures == ["gs://bucket/run1/lm/loss.png"]
    assert "![loss.png](loss.png)" in (out / "report.md").read_text()
    steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert steps and steps[-1] == lm_config.get_config("smoke").steps
    # the rerun restored the finished run from the bucket and trained nothing
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from"] == steps[-1]
    assert "Restored from the finished run's checkpoint" in second.body
    logged = [json.loads(line)["step"] for line in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert logged == sorted(set(logged))  # every logged step once, across the two runs
    assert list(cwd.iterdir()) == []  # nothing local: no 'gs:' folder
    assert [p.name for p in (store / "bucket" / "run1").iterdir()] == ["lm"]  # probe removed


def test_a_bucket_without_its_client_library_is_one_clear_error_before_any_work():
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed: the check would reach the network")
    with pytest.raises(ValueError, match=r"^--workdir=gs://b/run: no client library for gs:// "
                                         r"paths .*pip install -e '\.\[gcs\]'$"):
        workdir_lib.check_workdir("gs://b/run", ["lm"])
