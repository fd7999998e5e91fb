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

import warnings

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


def _datetime_index(timestamps: tuple[str, ...]):
    """The timestamps as a ``pandas.DatetimeIndex``, or ``None`` for undated rows (plain numbers
    other than ``YYYYMMDD``) and text pandas cannot read."""
    import pandas as pd

    stamps = [t.strip() for t in timestamps]
    if all(t.lstrip("+-").replace(".", "", 1).isdigit() for t in stamps) and not all(
            len(t) == 8 and t.isdigit() for t in stamps):
        return None  # indices, or years as plain integers: no calendar step to read
    for fmt in ("ISO8601", None):  # None: pandas' own guess, which reads YYYYQn
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return pd.DatetimeIndex(pd.to_datetime(stamps, format=fmt))
        except (ValueError, TypeError, OverflowError):
            continue
    return None


def seasonal_period_guess(timestamps: tuple[str, ...] | None) -> int:
    """The seasonal period, in steps, of a series at the timestamps ``timestamps`` (used by the
    seasonal-naive baseline when ``seasonal_period = 0``).

    The step is the frequency ``pandas.infer_freq`` finds (every one it can infer); the period is
    the length of the calendar cycle above it, as forecasting texts set a series' frequency
    (Hyndman & Athanasopoulos, *Forecasting: Principles and Practice*, 3rd ed., Sec. 2.1):

      * k minutes or k hours (``min``, ``h``): one day, 1440 / (minutes per step);
      * k seconds (``s``; not whole minutes): one hour, 3600 / k;
      * k business hours (``bh``): one business day, (opening hours, 8 by default) / k;
      * k days (``D``): one week, 7 / k;  k business days (``B``): one business week, 5 / k;
      * k weeks (``W-SUN``, ...): one year, 52 / k;
      * k months (``MS``, ``ME``, ``BMS``, ``BME``, one week a month ``WOM-1MON``): 12 / k;
      * k quarters (``QS-JAN``, ``QE-DEC``, ``BQS-JAN``, ``BQE-DEC``): 4 / k;
      * years (``YS-JAN``, ``YE-DEC``, ``BYS-JAN``, ``BYE-DEC``): 1 (no cycle above the step).

    As gluonts' ``get_seasonality``, a multiple k of the step that does not divide the cycle
    (5 hours, 2 days, 3 weeks) gets 1, as do years, sub-second steps, undated rows (plain numbers
    such as exchange-rate indices), fewer than 3 timestamps and timestamps at no single pandas
    frequency (e.g. business days with holidays left out): period 1 is the naive last-value
    forecast. gluonts uses the same cycles but for days and weeks, where it sets 1 (no weekly or
    yearly season); 7 and 52 are the cycles a seasonal-naive forecast of daily and weekly data
    repeats (the forecasting texts' ``frequency``).

    Args:
      timestamps: T strings as :class:`core.data.series.Table` keeps them (ISO 8601, ``YYYYMMDD``,
        ``YYYYQn``, plain numbers) or ``None``.

    Returns:
      int >= 1.
    """
    import pandas as pd

    if not timestamps or len(timestamps) < 3:
        return 1
    index = _datetime_index(timestamps)
    if index is None:
        return 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas 3 announces infer_freq's return type
            freq = pd.infer_freq(index)
    except (ValueError, TypeError):
        return 1
    if freq is None:
        return 1
    offset = pd.tseries.frequencies.to_offset(freq)
    k, o = int(offset.n), pd.offsets
    if k < 1:
        return 1
    if isinstance(offset, o.Tick):  # fixed durations: hours, minutes, seconds and below
        nanos = int(offset.nanos)
        minute, second = 60 * 10**9, 10**9
        if nanos % minute == 0:
            cycle, k = 24 * 60, nanos // minute
        elif nanos % second == 0:
            cycle, k = 60 * 60, nanos // second
        else:
            return 1
    elif isinstance(offset, o.Day):
        cycle = 7
    elif isinstance(offset, o.BusinessHour):
        opens = [h.hour * 60 + h.minute for h in offset.start]
        closes = [h.hour * 60 + h.minute for h in offset.end]
        minutes = sum((c - a) % (24 * 60) for a, c in zip(opens, closes, strict=True))
        cycle = minutes // 60 if minutes % 60 == 0 else 1
    elif isinstance(offset, (o.BusinessDay, o.CustomBusinessDay)):
        cycle = 5
    elif isinstance(offset, o.Week):
        cycle = 52
    elif isinstance(offset, (o.MonthBegin, o.MonthEnd, o.BusinessMonthBegin, o.BusinessMonthEnd,
                             o.CustomBusinessMonthBegin, o.CustomBusinessMonthEnd,
                             o.WeekOfMonth, o.LastWeekOfMonth)):
        cycle = 12
    elif isinstance(offset, (o.SemiMonthBegin, o.SemiMonthEnd)):
        cycle = 24
    elif isinstance(offset, (o.QuarterBegin, o.QuarterEnd, o.BQuarterBegin, o.BQuarterEnd)):
        cycle = 4
    else:  # years, and anything else: no cycle above the step
        return 1
    period, rest = divmod(cycle, k)
    return period if period >= 1 and rest == 0 else 1
