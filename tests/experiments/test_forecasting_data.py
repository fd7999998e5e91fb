"""The forecasting experiment's data sets by name: ``--config.data`` fails in one line before any
work when the source is unreachable; the paper's case (``benchmark``) is added when its file is
cached and is reported as not measured, with how to get it, when it is not."""

import dataclasses
import hashlib
import os

import pytest

from algorithms.forecasting.benchmark import BenchmarkConfig
from core import config as cfg_lib
from core.data import download
from core.testing import closed_port_url
from experiments import forecasting
from experiments.configs import forecasting as forecasting_config


def _offline(monkeypatch, name="etth1", body=b"date,OT\n"):
    entry = dataclasses.replace(download.DATASETS[name], url=closed_port_url("ETTh1.csv"),
                                sha256=hashlib.sha256(body).hexdigest(), size=len(body))
    monkeypatch.setitem(download.DATASETS, name, entry)
    return entry


def _config(tmp_path, **overrides):
    config = forecasting_config.get_config("smoke")
    config.data_dir = str(tmp_path / "cache")
    config.benchmark.timeout = 5.0
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


def test_data_by_name_offline_is_one_line_before_any_work(tmp_path, monkeypatch):
    entry = _offline(monkeypatch)
    with pytest.raises(download.DataUnavailableError) as e:
        forecasting.run(_config(tmp_path, data="etth1"), str(tmp_path / "work"))
    msg = str(e.value)
    assert "\n" not in msg and entry.url in msg and str(tmp_path / "cache" / "ETTh1.csv") in msg
    assert not os.path.exists(tmp_path / "work" / "forecasting")


def test_benchmark_case_offline_cached_and_merged(tmp_path, monkeypatch):
    body = b"date,OT\n2016-07-01 00:00:00,1.0\n"
    entry = _offline(monkeypatch, body=body)
    config = _config(tmp_path)
    config.benchmark.data, config.benchmark.max_steps_per_epoch = "etth1", 7
    bench = BenchmarkConfig.from_mapping(config)
    cases = [("mine.csv", (12,), 2, bench)]
    # unreachable and not cached: nothing added; the note says where to place which file
    how = forecasting._add_benchmark_case(config, bench, cases)
    assert cases == [("mine.csv", (12,), 2, bench)]
    assert entry.url in how and str(tmp_path / "cache" / "ETTh1.csv") in how and entry.sha256 in how
    # cached (placed by hand): added at the benchmark's horizons with its step cap
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "ETTh1.csv").write_bytes(body)
    assert forecasting._add_benchmark_case(config, bench, cases) == ""
    path, horizons, seeds, b = cases[1]
    assert (path, horizons, seeds) == (str(tmp_path / "cache" / "ETTh1.csv"), (192,), config.num_seeds)
    assert b.max_steps_per_epoch == 7 and b.d_model == bench.d_model
    # a data set already in the run gets the benchmark's horizons added to its own
    cases = [(str(tmp_path / "cache" / "ETTh1.csv"), (12, 400), 2, bench)]
    assert forecasting._add_benchmark_case(config, bench, cases) == ""
    assert cases == [(str(tmp_path / "cache" / "ETTh1.csv"), (12, 192, 400), 2, bench)]


def test_data_names_are_checked_with_the_config():
    config = forecasting_config.get_config("tiny")
    assert config.benchmark.data == "etth1" and config.data == ""
    assert forecasting_config.get_config("smoke").benchmark.data == ""  # smoke never downloads
    config.data = "etth1,exchange_rate"
    cfg_lib.validate_module_config(config, forecasting_config)
    config.data = "etth1,ettm1"
    with pytest.raises(ValueError, match="etth1, etth2, exchange_rate"):
        cfg_lib.validate_module_config(config, forecasting_config)
