"""Measurements of FFD on a real model: the kept-fraction fit (closed forms on exact power laws)
and the contexts and window shapes the quality measurement uses."""

import math

import numpy as np
import pytest

from algorithms.sparse_decode import measure


def test_exact_power_law_is_recovered_and_extrapolated():
    rng = np.random.default_rng(0)
    b, a = -0.4, rng.uniform(5.0, 20.0)
    lengths = np.array([700.0, 1300.0, 1900.0])
    # every unit follows the same law: the interval collapses onto the fit
    units = np.repeat((a * lengths ** b)[:, None], 12, axis=1)
    f = measure.kept_fraction_fit(lengths, units, 131072, draws=50)
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
    f = measure.kept_fraction_fit(lengths, units, 131072, draws=400, seed=2)
    assert f["exponent"] == pytest.approx(-0.2, abs=1e-9)
    assert f["lo"] < f["at_target"] < f["hi"] <= 1.0


def test_fit_refuses_a_single_context():
    with pytest.raises(ValueError, match="kept_fraction_fit: expected >= 2 distinct lengths"):
        measure.kept_fraction_fit([1000.0], [[0.5, 0.6]], 131072)


def test_quality_contexts_are_whole_pages_within_the_capture():
    # 100 is under two pages, 5000 beyond the capture; 300 -> 256, 1000 -> 896; the capture itself
    assert measure.quality_contexts((100, 300, 1000, 5000), 128, 2048) == [256, 896, 2048]


def test_context_window_shape_stitches_short_windows_and_pages_a_long_one():
    # a model of max_len 64: 1024 // 64 windows of 64, stitched
    assert measure.context_window_shape(1024, 16, 64, stitch=True) == (64, 16)
    # one window: min(1000, 4096) = 1000 tokens -> 7 whole pages of 128
    assert measure.context_window_shape(1000, 128, 4096, stitch=False) == (896, 1)
    assert measure.context_window_shape(8192, 128, 2048, stitch=False) == (2048, 1)
    with pytest.raises(ValueError, match="real_context=1024 and real_page_size=128.*fewer than two"):
        measure.context_window_shape(1024, 128, 128, stitch=False)
