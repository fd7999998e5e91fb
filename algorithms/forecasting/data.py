"""Multivariate time series: chronological splits, standardisation and windows.

Pure functions on NumPy arrays. Tables are read and parsed by :mod:`core.data.series`
(:class:`Table` and :func:`parse_table` are re-exported here).

Dimension legend: T time steps, N channels, L input length, H horizon, B windows.

Splits follow the forecasting literature (Informer/Autoformer loaders, which the PPM code uses):
ETT hourly data are cut at 12/4/4 months of 30 days (8640/2880/2880 rows), ETT 15-minute data at
4x that, everything else 70/10/20 %. The validation and test segments start L steps early so their
first window's input lies in the previous split. Data are standardised per channel with the
training segment's mean and (population) standard deviation.
"""

from __future__ import annotations

import math

import numpy as np

from core.data.series import FILL_GAPS, Table, parse_table  # noqa: F401  (re-exported)

SPLITS = ("auto", "ett_hour", "ett_minute", "ratio")


def resolve_split(split: str, source: str) -> str:
    """``auto`` -> ``ett_hour`` for names starting ETTh, ``ett_minute`` for ETTm, else ``ratio``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if split != "auto":
        return split
    base = source.replace("\\", "/").rsplit("/", 1)[-1]
    if base.startswith("ETTh"):
        return "ett_hour"
    if base.startswith("ETTm"):
        return "ett_minute"
    return "ratio"


def split_borders(num_steps: int, input_len: int, horizon: int, split: str
                  ) -> dict[str, tuple[int, int]]:
    """Row ranges ``[start, end)`` of the train/val/test segments (val/test start L rows early).

    Raises:
      ValueError: the series is too short for the split, or a segment has no window of L + H steps.
    """
    if split in ("ett_hour", "ett_minute"):
        month = 30 * 24 * (4 if split == "ett_minute" else 1)
        n_train, n_val, n_test = 12 * month, 4 * month, 4 * month
        if num_steps < n_train + n_val + n_test:
            raise ValueError(f"split {split!r} needs {n_train + n_val + n_test} steps (12/4/4 months), "
                             f"the series has {num_steps}")
    elif split == "ratio":
        n_train, n_test = int(num_steps * 0.7), int(num_steps * 0.2)
        n_val = num_steps - n_train - n_test
    else:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS[1:]}")
    borders = {
        "train": (0, n_train),
        "val": (n_train - input_len, n_train + n_val),
        "test": (n_train + n_val - input_len, n_train + n_val + n_test),
    }
    need = input_len + horizon
    for name, (a, b) in borders.items():
        if a < 0 or b - a < need:
            raise ValueError(f"series of {num_steps} steps is too short for input length {input_len} "
                             f"and horizon {horizon}: the {name} segment ({max(b - a, 0)} steps) "
                             f"needs at least L + H = {need}")
    return borders


def standardize(values: np.ndarray, train_end: int, columns: tuple[str, ...] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values - mean) / std`` with per-channel statistics of ``values[:train_end]``.

    Returns:
      ``(scaled f32 [T, N], mean f64 [N], std f64 [N])``.

    Raises:
      ValueError: a channel is constant on the training segment.
    """
    train = values[:train_end]
    mean, std = train.mean(0), train.std(0)
    flat = np.flatnonzero(~(std > 0))
    if flat.size:
        name = columns[flat[0]] if columns else f"channel {flat[0]}"
        raise ValueError(f"{name} is constant on the training segment; cannot standardise it")
    return ((values - mean) / std).astype(np.float32), mean, std


def num_windows(length: int, input_len: int, horizon: int) -> int:
    """Windows of L + H consecutive steps in a segment of ``length`` steps (stride 1)."""
    return max(length - input_len - horizon + 1, 0)


def gather_windows(series: np.ndarray, starts: np.ndarray, input_len: int, horizon: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets of the windows starting at ``starts``.

    Args:
      series: [T, N]; starts: int [B] row offsets.

    Returns:
      ``(x [B, L, N], y [B, H, N])`` with ``x = series[s:s+L]`` and ``y = series[s+L:s+L+H]``.
    """
    idx = np.asarray(starts)[:, None] + np.arange(input_len + horizon)[None]
    w = series[idx]
    return w[:, :input_len], w[:, input_len:]


def seasonal_period_guess(timestamps: tuple[str, ...] | None) -> int:
    """A seasonal period from the timestamp spacing (used by the seasonal-naive baseline): one day
    for sub-daily data (24 hourly, 48 half-hourly, 96 at 15 minutes), 7 for daily data, and 1 (the
    naive last-value forecast) for undated rows such as exchange rates."""
    if not timestamps or len(timestamps) < 2:
        return 1
    try:
        a, b = (np.datetime64(t.replace(" ", "T")) for t in timestamps[:2])
    except ValueError:
        return 1
    minutes = (b - a) / np.timedelta64(1, "m")
    if not minutes > 0 or not math.isfinite(minutes):
        return 1
    per_day = 24 * 60 / minutes
    return int(round(per_day)) if per_day >= 2 else 7
