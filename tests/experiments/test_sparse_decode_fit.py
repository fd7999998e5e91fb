"""The kept-fraction fit of the sparse_decode experiment: closed forms on exact power laws."""

import math

import numpy as np
import pytest

from experiments import sparse_decode
from experiments.configs import sparse_decode as sd_config


def test_exact_power_law_is_recovered_and_extrapolated():
    rng = np.random.default_rng(0)
    b, a = -0.4, rng.uniform(5.0, 20.0)
    lengths = np.array([700.0, 1300.0, 1900.0])
    # every unit follows the same law: the interval collapses onto the fit
    units = np.repeat((a * lengths ** b)[:, None], 12, axis=1)
    f = sparse_decode.kept_fraction_fit(lengths, units, 131072, draws=50)
    assert f["exponent"] == pytest.approx(b, abs=1e-9)
    assert f["prefactor"] == pytest.approx(a, rel=1e-9)
    assert f["at_target"] == pytest.approx(a * 131072 ** b, rel=1e-9)
    assert f["lo"] == pytest.approx(f["at_target"], rel=1e-9)
    assert f["hi"] == pytest.approx(f["at_target"], rel=1e-9)
    # the log-linear fit through the same points: by hand, in float64
    d, c = np.polyfit(np.log(lengths), units.mean(axis=1), 1)
    assert f["loglinear_at_target"] == pytest.approx(min(max(c + d * math.log(131072), 0), 1))


def test_units_that_differ_give_an_interval_around_the_fit():
    rng = np.random.default_rng(1)
    lengths = np.array([800.0, 1200.0, 1800.0])
    scale = rng.uniform(0.5, 1.0, 30)  # each unit a law of its own prefactor
    units = scale[None, :] * (2.0 * lengths[:, None] ** -0.2)
    f = sparse_decode.kept_fraction_fit(lengths, units, 131072, draws=400, seed=2)
    assert f["exponent"] == pytest.approx(-0.2, abs=1e-9)
    assert f["lo"] < f["at_target"] < f["hi"] <= 1.0


def test_fit_refuses_a_single_context():
    with pytest.raises(ValueError, match="kept_fraction_fit: expected >= 2 distinct lengths"):
        sparse_decode.kept_fraction_fit([1000.0], [[0.5, 0.6]], 131072)


def test_quality_contexts_are_whole_pages_within_the_capture():
    config = sd_config.get_config("tiny")
    config.fit_contexts = (100, 300, 1000, 5000)
    config.real_page_size = 128
    # 100 is under two pages, 5000 beyond the capture; 300 -> 256, 1000 -> 896; the capture itself
    assert sparse_decode.quality_contexts(config, 2048) == [256, 896, 2048]
