"""Reading time-series tables: ETT-style CSVs (a timestamp column, then numeric channels) and
headerless numeric rows, from a file (:func:`load_table`, ``.gz`` allowed) or from text already read
(:func:`parse_table`).

Dimension legend: T time steps, N channels.

Two text layouts are read:
  * ETT-style CSV: a header row, a first column of timestamps and N numeric channel columns
    (ETTh1/ETTh2 from Zhou et al. 2021; statsmodels' ``mstl_elec_vic.csv``). The timestamps must
    be at one step, in order and without repeats (see :func:`parse_table`; missing steps can be
    filled by interpolation on request, and the table says how many rows were filled).
  * headerless numeric rows (the ``exchange_rate`` file of Lai et al. 2018); without timestamps
    the rows are taken to be at one step as they are.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re

import numpy as np

from core.data.files import read_text


@dataclasses.dataclass(frozen=True)
class Table:
    """A parsed series. ``values`` f64 [T, N]; ``columns`` N names; ``timestamps`` T strings or
    ``None`` for a headerless file; ``source`` the name used in error messages; ``step`` the time
    step in words (``"1:00:00"``, ``"1 month"``, ``"1"``; empty without timestamps);
    ``filled_rows`` rows inserted and ``filled_cells`` missing cells interpolated by
    ``fill_gaps="linear"`` (0 otherwise)."""

    values: np.ndarray
    columns: tuple[str, ...]
    timestamps: tuple[str, ...] | None
    source: str
    step: str = ""
    filled_rows: int = 0
    filled_cells: int = 0


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _missing(cell: str) -> bool:
    return cell.strip().lower() in ("", "nan", "na", "null", "none")


# ----------------------------------------------------------------------------------------------
# Timestamps: one step, no repeats, no going backwards.

FILL_GAPS = ("none", "linear")
_QUARTER = re.compile(r"^(\d{4})-?Q([1-4])$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class _Clock:
    """Timestamps as integers on a common scale: ``ticks`` int64 [T] in units of ``unit``
    (seconds, months or plain numbers), and a formatter for generated rows."""

    ticks: np.ndarray
    unit: str
    format: object   # callable int tick -> timestamp text


def _numeric_clock(stamps: list[str]) -> _Clock | None:
    try:
        nums = np.array([float(t) for t in stamps], np.float64)
    except ValueError:
        return None
    if not np.all(np.isfinite(nums)):
        return None
    integral = np.all(nums == np.round(nums))
    if integral and all(len(t) == 8 and t.isdigit() for t in stamps):
        # Compact calendar dates YYYYMMDD (statsmodels' co2.csv).
        try:
            days = np.array([np.datetime64(f"{t[:4]}-{t[4:6]}-{t[6:]}") for t in stamps], "datetime64[s]")
        except ValueError:
            days = None
        if days is not None:
            return _Clock(days.astype(np.int64), "s", lambda k: str(
                np.datetime64(int(k), "s").astype("datetime64[D]")).replace("-", ""))
    if integral and np.all(np.abs(nums) < 2**53):
        return _Clock(nums.astype(np.int64), "", lambda k: str(int(k)))
    return None


def _datetime_clock(stamps: list[str], source: str, line_no: np.ndarray) -> _Clock:
    quarters = [_QUARTER.match(t) for t in stamps]
    if all(quarters):
        months = np.array([12 * int(m[1]) + 3 * (int(m[2]) - 1) for m in quarters], np.int64)
        return _Clock(months, "M", lambda k: f"{int(k) // 12}Q{int(k) % 12 // 3 + 1}")
    parsed = []
    for t, no in zip(stamps, line_no, strict=True):
        try:
            parsed.append(np.datetime64(t.replace(" ", "T", 1)))
        except ValueError:
            raise ValueError(
                f"{source}, line {no}: timestamp {t!r} is not understood; expected ISO 8601 "
                "(2016-07-01 00:00:00, 1959-01-01, 2016-07), YYYYMMDD, YYYYQn or plain numbers, so "
                "that the rows can be checked to lie at one step (a file with a header row reads its "
                "first column as the timestamps; a file without timestamps has no header row)"
                ) from None
    finest = np.array(parsed)
    unit = np.datetime_data(finest.dtype)[0]
    secs = finest.astype("datetime64[s]")
    space = " " in stamps[0]
    diffs = np.diff(secs.astype(np.int64))
    month_start = secs.astype("datetime64[M]").astype("datetime64[s]") == secs
    # Calendar months (or quarters, years) are constant in months, not in seconds.
    months = bool(diffs.size and np.unique(diffs[diffs > 0]).size > 1 and np.all(month_start))
    clock_unit = "M" if months else "s"

    def fmt(k):
        text = str(np.datetime64(int(k), clock_unit).astype(f"datetime64[{unit}]"))
        return text.replace("T", " ", 1) if space else text

    ticks = secs.astype("datetime64[M]") if months else secs
    return _Clock(ticks.astype(np.int64), clock_unit, fmt)


def _describe_step(step: int, unit: str) -> str:
    if unit == "s":
        text = str(datetime.timedelta(seconds=int(step)))   # "1:00:00", "7 days, 0:00:00"
        return text.removesuffix(", 0:00:00")
    if unit == "M":
        return f"{step} month{'s' if step != 1 else ''}"
    return str(step)


def _regular_positions(stamps: list[str], source: str, line_no: np.ndarray, fill: bool
                       ) -> tuple[np.ndarray, _Clock, int, list[tuple[int, int, str]]]:
    """Positions of the rows on the regular grid [T] int64 (row 0 at 0), the clock, the step, and
    the gaps ``(row, missing steps, message)``.

    Raises:
      ValueError: at the first timestamp that repeats the previous one, goes backwards, lies off the
        grid of the step (the most common difference between consecutive rows) or, unless ``fill``,
        leaves out steps; the message names the file and the line.
    """
    clock = _numeric_clock(stamps) or _datetime_clock(stamps, source, line_no)
    diffs = np.diff(clock.ticks)
    positive = diffs[diffs > 0]
    if positive.size == 0:
        if diffs.size:
            r = 1
            raise ValueError(f"{source}, line {line_no[r]}: timestamp {stamps[r]!r} "
                             f"{'repeats' if diffs[0] == 0 else 'goes backwards from'} "
                             f"{stamps[r - 1]!r} at line {line_no[r - 1]}")
        return np.zeros(len(stamps), np.int64), clock, 1, []
    values, counts = np.unique(positive, return_counts=True)
    step = int(values[np.argmax(counts)])        # the most common step (smallest if tied)
    what = _describe_step(step, clock.unit)
    gaps = []
    for r in np.flatnonzero(diffs != step) + 1:
        d = int(diffs[r - 1])
        here = f"{source}, line {line_no[r]}: timestamp {stamps[r]!r}"
        prev = f"{stamps[r - 1]!r} at line {line_no[r - 1]}"
        if d == 0:
            raise ValueError(f"{here} repeats {prev}; the series must have one row per time step")
        if d < 0:
            raise ValueError(f"{here} goes backwards from {prev}; the rows must be in time order")
        if d % step:
            raise ValueError(f"{here} is {_describe_step(d, clock.unit)} after {prev}, not a whole "
                             f"number of steps of {what} (the file's most common step)")
        gap = f"{here} comes {d // step - 1} missing step(s) of {what} after {prev}"
        if not fill:
            raise ValueError(f"{gap}; the series must be at one step. Restore the rows, or pass "
                             "fill_gaps='linear' (config field fill_gaps) to interpolate them")
        gaps.append((int(r), d // step - 1, gap))
    positions = np.concatenate([[0], np.cumsum(diffs // step)]).astype(np.int64)
    return positions, clock, step, gaps


def _interpolate_missing(values: np.ndarray, names, line_of) -> int:
    """Fills NaN cells in place by linear interpolation between the nearest finite rows of their
    column; returns the number filled.

    Raises:
      ValueError: a column starts or ends with missing values (nothing to interpolate from).
    """
    filled = 0
    rows = np.arange(values.shape[0])
    for j in range(values.shape[1]):
        bad = ~np.isfinite(values[:, j])
        if not bad.any():
            continue
        good = np.flatnonzero(~bad)
        edge = np.flatnonzero(bad & ((rows < (good[0] if good.size else rows.size)) |
                                     (rows > (good[-1] if good.size else -1))))
        if edge.size:
            raise ValueError(f"column {names[j]!r} is missing at {line_of(edge[0])}, at the "
                             "start or end of the series, where it cannot be interpolated; trim "
                             "those rows")
        values[bad, j] = np.interp(rows[bad], good, values[good, j])
        filled += int(bad.sum())
    return filled


DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "vertical bar"}


def check_delimiter(line: str, delimiter: str, where: str, numbers: bool = False) -> None:
    """Refuses a first line that is one cell when split on ``delimiter`` but several on another
    common separator (``;``, tab, ``|``, ``,``): the file uses another delimiter, and reading it
    on would report missing columns instead. ``numbers``: the cells hold numbers (the message
    then asks for decimal points too, since semicolon-separated files often use decimal commas).

    Raises:
      ValueError: naming both separators, at ``where`` (file and line).
    """
    counts = {d: line.count(d) for d in DELIMITER_NAMES if d != delimiter}
    other = max(counts, key=counts.get)
    if counts[other]:
        name = DELIMITER_NAMES[other]
        raise ValueError(
            f"{where}: the first line is one cell when split on "
            f"{DELIMITER_NAMES.get(delimiter, repr(delimiter))}s but {counts[other] + 1} on "
            f"{name}s ({line.strip()[:80]!r}): the file looks {name}-separated, and this reader "
            f"expects {DELIMITER_NAMES.get(delimiter, repr(delimiter))}-separated cells; save it "
            f"with {DELIMITER_NAMES.get(delimiter, repr(delimiter))}s"
            + (" (and decimal points)" if numbers else ""))


def parse_table(text: str, source: str = "<text>", columns: tuple[str, ...] | None = None,
                delimiter: str = ",", fill_gaps: str = "none",
                columns_option: str | None = None) -> Table:
    """Parses an ETT-style CSV (header, timestamp column, numeric columns) or headerless numeric rows.

    The layout is detected from the first non-empty line: if every cell is a number the file has no
    header and no timestamp column. Timestamps must lie at one step (the most common difference
    between consecutive rows), in time order, without repeats: windows of consecutive rows are
    only windows of consecutive times then. Understood timestamps: ISO 8601 (``2016-07-01
    00:00:00``, ``1959-01-01``, ``2016-07``; monthly, quarterly or yearly dates on the first of a
    month are stepped in calendar months), compact ``YYYYMMDD``, ``YYYYQn`` and plain integers
    (years or indices). A headerless file has no timestamps, so nothing can be checked there.

    Args:
      text: the file's contents.
      source: file name for messages.
      columns: channel names to keep, in this order (``None``: all numeric columns). Only for files
        with a header.
      delimiter: cell separator.
      fill_gaps: ``"none"`` (default): missing steps and missing values are errors. ``"linear"``:
        rows for missing steps are inserted and missing values (empty, ``nan``, ``NA``, ...) are
        interpolated linearly in time between the nearest rows that have them; the counts are in
        :attr:`Table.filled_rows` and :attr:`Table.filled_cells` (report them). Repeated,
        backwards or off-step timestamps are errors either way.
      columns_option: the option that sets ``columns`` (e.g. ``"--config.columns"``); the error
        on a column the file lacks then says to set it.

    Returns:
      :class:`Table`.

    Raises:
      ValueError: empty input; a first line that is one cell on ``delimiter`` but several on
        another common separator (:func:`check_delimiter`); a requested column is missing; a
        row with the wrong number of cells;
        a non-numeric cell (message gives file, line and column); a timestamp that is not
        understood, repeats, goes backwards, lies off the step or (``fill_gaps="none"``) follows
        missing steps (file and 1-based line of the first one); missing values with
        ``fill_gaps="none"`` (the column and the line range of the first run of them), or at the
        start or end of a column with ``"linear"``; filling that would more than double the
        series; an unknown ``fill_gaps``.
    """
    if fill_gaps not in FILL_GAPS:
        raise ValueError(f"fill_gaps must be one of {FILL_GAPS}, got {fill_gaps!r}")
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if not lines:
        raise ValueError(f"{source}: no data rows")
    first_no, first = lines[0]
    head = [c.strip() for c in first.split(delimiter)]
    if len(head) == 1:
        check_delimiter(first, delimiter, f"{source}, line {first_no}", numbers=True)
    headerless = all(_is_number(c) for c in head)
    if headerless:
        if columns is not None:
            raise ValueError(f"{source}: has no header row, so columns {columns} cannot be selected"
                             + (f" (leave {columns_option} empty)" if columns_option else ""))
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
            raise ValueError(f"{source}: missing column(s) {missing}; the header has {list(names)}"
                             + (f" after its first column {head[0].strip()!r}, read as the "
                                "timestamps" if has_time else "")
                             + (f" (set {columns_option}=<name>,... to some of them, or leave it "
                                "empty for all)" if columns_option else ""))
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
    kept = tuple(names[k] for k in keep)
    filled_rows, step_text = 0, ""
    lines_of_rows = line_no
    if has_time and len(rows) > 1:
        positions, clock, step, gaps = _regular_positions(stamps, source, line_no, fill_gaps == "linear")
        step_text = _describe_step(step, clock.unit)
        if gaps:
            total = int(positions[-1]) + 1
            if total > 2 * len(rows):
                r, k, msg = max(gaps, key=lambda g: g[1])
                raise ValueError(f"{source}: filling the gaps would add {total - len(rows)} rows to "
                                 f"{len(rows)}; the longest: {msg}. Check the timestamps")
            full = np.full((total, values.shape[1]), np.nan)
            full[positions] = values
            full_stamps = [clock.format(clock.ticks[0] + p * step) for p in range(total)]
            for r, p in enumerate(positions):
                full_stamps[p] = stamps[r]
            lines_of_rows = np.full(total, -1, np.int64)
            lines_of_rows[positions] = line_no
            filled_rows = total - len(rows)
            missing_cells = int((~np.isfinite(values)).sum())
            values, stamps = full, full_stamps
        else:
            missing_cells = int((~np.isfinite(values)).sum())
    else:
        missing_cells = int((~np.isfinite(values)).sum())
    if missing_cells and fill_gaps == "none":
        bad = ~np.isfinite(values)
        r, j = map(int, np.argwhere(bad)[0])
        end = r
        while end + 1 < len(values) and bad[end + 1, j]:
            end += 1
        raise ValueError(f"{source}: column {kept[j]!r} has {end - r + 1} missing or non-finite "
                         f"value(s) in a run at lines {line_no[r]}-{line_no[end]} "
                         f"({missing_cells} in the file); fill them, or pass fill_gaps='linear' "
                         "(config field fill_gaps) to interpolate them in time (dropping the rows "
                         "instead leaves a gap in the timestamps)")
    if filled_rows or missing_cells:
        try:
            _interpolate_missing(values, kept, lambda r: f"line {lines_of_rows[r]}")
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
    return Table(values, kept, tuple(stamps) if has_time else None, source, step_text,
                 filled_rows, missing_cells)


def load_table(path: str, columns: str | tuple[str, ...] = "", fill_gaps: str = "none",
               columns_option: str | None = None) -> Table:
    """Reads an ETT-style CSV or a headerless numeric file (``.gz`` allowed) into a :class:`Table`.

    Args:
      path: the file.
      columns: channel names to keep, in order: a tuple or a comma-separated string (empty: all).
      fill_gaps: as in :func:`parse_table` (``"none"``: a gap in the timestamps or a missing value
        is an error naming the file and line; ``"linear"``: interpolated and counted).
      columns_option: the option that sets ``columns`` (``"--config.columns"``), named in the
        error on a column the file lacks.

    Returns:
      :class:`Table` whose ``source`` is the file's base name.

    Raises:
      FileNotFoundError: no such file. ValueError: a directory, an unreadable, corrupt-gzip or
        non-UTF-8 file (:func:`core.data.files.read_text`), or see :func:`parse_table`.
    """
    text = read_text(path, "time-series table")
    if isinstance(columns, str):
        columns = tuple(c.strip() for c in columns.split(",") if c.strip())
    return parse_table(text, os.path.basename(path), tuple(columns) or None, fill_gaps=fill_gaps,
                       columns_option=columns_option)


def statsmodels_series_path(name: str = "mstl_elec_vic.csv") -> str:
    """The path of a series CSV shipped in the installed ``statsmodels`` test results
    (default: hourly Victorian electricity demand, 3,600 hours from 2012-01-01, one channel).

    Raises:
      FileNotFoundError: the file is missing from this statsmodels install.
    """
    import statsmodels

    path = os.path.join(os.path.dirname(statsmodels.__file__), "tsa", "stl", "tests", "results",
                        name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"embedded default series {path!r} is missing from this "
                                "statsmodels install; pass a data path")
    return path
