"""Multivariate time series tables: parsing, chronological splits, standardisation and windows.

Pure functions on text and NumPy arrays; the experiment opens the files and passes their text in.

Dimension legend: T time steps, N channels, L input length, H horizon, B windows.

Two text layouts are read:
  * ETT-style CSV: a header row, a first column of timestamps (any non-numeric text) and N numeric
    channel columns (ETTh1/ETTh2 from Zhou et al. 2021; statsmodels' ``mstl_elec_vic.csv``).
  * headerless numeric rows (the ``exchange_rate`` file of Lai et al. 2018).

Splits follow the forecasting literature (Informer/Autoformer loaders, which the PPM code uses):
ETT hourly data are cut at 12/4/4 months of 30 days (8640/2880/2880 rows), ETT 15-minute data at
4x that, everything else 70/10/20 %. The validation and test segments start L steps early so their
first window's input lies in the previous split. Data are standardised per channel with the
training segment's mean and (population) standard deviation.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SPLITS = ("auto", "ett_hour", "ett_minute", "ratio")


@dataclasses.dataclass(frozen=True)
class Table:
    """A parsed series. ``values`` f64 [T, N]; ``columns`` N names; ``timestamps`` T strings or
    ``None`` for a headerless file; ``source`` the name used in error messages."""

    values: np.ndarray
    columns: tuple[str, ...]
    timestamps: tuple[str, ...] | None
    source: str


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _missing(cell: str) -> bool:
    return cell.strip().lower() in ("", "nan", "na", "null", "none")


def parse_table(text: str, source: str = "<text>", columns: tuple[str, ...] | None = None,
                delimiter: str = ",") -> Table:
    """Parses an ETT-style CSV (header, timestamp column, numeric columns) or headerless numeric rows.

    The layout is detected from the first non-empty line: if every cell is a number the file has no
    header and no timestamp column.

    Args:
      text: the file's contents.
      source: file name for messages.
      columns: channel names to keep, in this order (``None``: all numeric columns). Only for files
        with a header.
      delimiter: cell separator.

    Returns:
      :class:`Table`.

    Raises:
      ValueError: empty input; a requested column is missing; a row with the wrong number of cells;
        a non-numeric cell (message gives file, line and column); missing values (the message gives
        the column and the line range of the first run of them).
    """
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if not lines:
        raise ValueError(f"{source}: no data rows")
    first_no, first = lines[0]
    head = [c.strip() for c in first.split(delimiter)]
    headerless = all(_is_number(c) for c in head)
    if headerless:
        if columns is not None:
            raise ValueError(f"{source}: has no header row, so columns {columns} cannot be selected")
        names = tuple(f"c{j}" for j in range(len(head)))
        rows, has_time = lines, False
    else:
        has_time = True
        names = tuple(head[1:])
        rows = lines[1:]
        if not rows:
            raise ValueError(f"{source}: header only, no data rows")
    width = len(head)
    if columns is None:
        keep = list(range(len(names)))
    else:
        missing = [c for c in columns if c not in names]
        if missing:
            raise ValueError(f"{source}: missing column(s) {missing}; the header has {list(names)}")
        keep = [names.index(c) for c in columns]
    if not keep:
        raise ValueError(f"{source}: no value columns (expected a timestamp column and channels)")
    offset = 1 if has_time else 0
    values = np.empty((len(rows), len(keep)), np.float64)
    stamps = []
    line_no = np.empty(len(rows), np.int64)
    for r, (no, ln) in enumerate(rows):
        cells = ln.split(delimiter)
        if len(cells) != width:
            raise ValueError(f"{source}, line {no}: {len(cells)} cells, expected {width} as in line "
                             f"{first_no}")
        line_no[r] = no
        if has_time:
            stamps.append(cells[0].strip())
        for j, k in enumerate(keep):
            cell = cells[k + offset]
            if _missing(cell):
                values[r, j] = np.nan
                continue
            try:
                values[r, j] = float(cell)
            except ValueError:
                raise ValueError(f"{source}, line {no}, column {names[k]!r}: non-numeric cell "
                                 f"{cell.strip()!r}") from None
    bad = ~np.isfinite(values)
    if bad.any():
        r, j = map(int, np.argwhere(bad)[0])
        end = r
        while end + 1 < len(rows) and bad[end + 1, j]:
            end += 1
        raise ValueError(f"{source}: column {names[keep[j]]!r} has {end - r + 1} missing or non-finite "
                         f"value(s) in a run at lines {line_no[r]}-{line_no[end]} "
                         f"({int(bad.sum())} in the file); fill or drop them before forecasting")
    return Table(values, tuple(names[k] for k in keep), tuple(stamps) if has_time else None, source)


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
