"""Pairwise judgements ("judge k compared models a and b; a won / b won / tie") from files.

Dimension legend: C comparisons, N models, J judges.

Three file shapes load, chosen by content rather than by name alone:

* CSV with a header row (any extension other than the JSON ones);
* JSON lines: one JSON object per line (``.jsonl``, ``.ndjson``, or ``.json`` whose first character
  is not ``[``);
* a JSON array of objects (``.json``, ``.jsonl`` or ``.ndjson`` whose first non-blank character is ``[``).

Every row names its two models, its judge and its outcome in configurable columns; outcome values
map to :data:`LEFT`, :data:`RIGHT` and :data:`TIE` (the codes of ``algorithms.ranking.data``).
Errors name the file and the line (1-based; a CSV's header is line 1).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import os
from collections.abc import Mapping

import numpy as np

from core.data.files import check_file, read_text
from core.data.series import check_delimiter

# The outcome codes of ``algorithms.ranking.data`` (core does not import algorithms).
LEFT, RIGHT, TIE = 0, 1, 2
JSON_EXTENSIONS = (".json", ".jsonl", ".ndjson")


@dataclasses.dataclass(frozen=True)
class Judgments:
    """Comparisons read from one file.

    Attributes:
      left, right: int64 [C], indices into ``models`` (sorted names).
      judge: int64 [C], indices into ``judges`` (sorted names).
      outcome: int64 [C], :data:`LEFT` (left won), :data:`RIGHT` or :data:`TIE`.
      models, judges: the names, sorted.
      path: the file read.
      name: the data set's name (by default the file name without its extensions).
      dropped: ``{outcome value: rows}`` of the rows dropped for an unknown outcome (only with
        ``drop_unknown=True``).
    """

    left: np.ndarray
    right: np.ndarray
    judge: np.ndarray
    outcome: np.ndarray
    models: list[str]
    judges: list[str]
    path: str
    name: str
    dropped: dict[str, int]

    @property
    def num_comparisons(self) -> int:
        return int(self.left.shape[0])

    @property
    def num_dropped(self) -> int:
        return int(sum(self.dropped.values()))


def dataset_name(path: str) -> str:
    """The file name without its last extension: ``"dir/llmfao.csv"`` -> ``"llmfao"``."""
    return os.path.splitext(os.path.basename(path))[0]


def _json_rows(path: str, text: str) -> list[tuple[int, object]]:
    """(line, value) of each element of a JSON array or each line of JSON lines."""
    start = len(text) - len(text.lstrip())
    if text[start:start + 1] == "[":
        decoder = json.JSONDecoder()
        try:
            values = decoder.decode(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON array ({e.msg}, column {e.colno})") from None
        if not isinstance(values, list):  # unreachable for text starting with "[", kept for clarity
            raise ValueError(f"{path}:1: expected a JSON array of objects")
        # Line of each element: decode the array again, element by element, to learn its position.
        lines, pos, ws = [], start + 1, " \t\r\n"
        for _ in values:
            while text[pos] in ws + ",":
                pos += 1
            lines.append(text.count("\n", 0, pos) + 1)
            _, pos = decoder.raw_decode(text, pos)
        return list(zip(lines, values))
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: invalid JSON line ({e.msg}, column {e.colno}); expected one "
                             "JSON object per line, or one JSON array of objects") from None
    return rows


def _read_rows(path: str) -> list[tuple[int, object]]:
    text = read_text(path, "judgement file")
    first = text.lstrip()[:1]
    if path.lower().endswith(JSON_EXTENSIONS) or first in ("[", "{"):
        return _json_rows(path, text)
    reader = csv.DictReader(io.StringIO(text))
    no, header = next(((i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()),
                      (1, ""))
    if len(next(csv.reader([header]), [])) == 1:  # another separator reads as missing columns
        check_delimiter(header, ",", f"{path}:{no}")
    rows = []
    try:
        for r in reader:
            rows.append((reader.line_num, r))  # the row's (last) line; the header is line 1
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
    return rows


def read_judgments(path: str, *, left: str = "left", right: str = "right", judge: str = "judge",
                   outcome: str = "winner", left_value: str = "left", right_value: str = "right",
                   tie_value: str = "tie", drop_unknown: bool = False, name: str | None = None,
                   column_options: Mapping[str, str] | None = None) -> Judgments:
    """Reads pairwise judgements from a CSV, JSON-lines or JSON-array file (module docstring).

    Args:
      path: the file.
      left, right, judge, outcome: column (key) names.
      left_value, right_value, tie_value: outcome values meaning "left won", "right won", "tie"
        (compared as strings, so JSON numbers work too).
      drop_unknown: drop rows whose outcome is none of the three values (counted in
        :attr:`Judgments.dropped`) instead of stopping at the first.
      name: the data set's name; default :func:`dataset_name` of ``path``.
      column_options: for the error on a missing column, the option that sets each column's
        name ({"left": "--config.columns.left", ...}, keyed by the argument names ``left``,
        ``right``, ``judge``, ``outcome``); the message then says which to set.

    Returns:
      :class:`Judgments`.

    Raises:
      FileNotFoundError: no such file.
      ValueError: a directory or unreadable file (:func:`core.data.files.read_text`), unreadable
        content (invalid JSON, malformed CSV, not UTF-8, a CSV separated by semicolons, tabs
        or vertical bars instead of commas), a row that is not an
        object, a missing column, an empty model or judge name, a model compared with itself, an
        unknown outcome (unless ``drop_unknown``), the three outcome values not distinct, or no
        comparisons left; each names the file and, for a row, its line.
    """
    check_file(path, "judgement file")
    code = {str(left_value): LEFT, str(right_value): RIGHT, str(tie_value): TIE}
    if len(code) != 3:
        raise ValueError(f"{path}: the outcome values left={left_value!r}, right={right_value!r}, "
                         f"tie={tie_value!r} must be distinct")
    need = (left, right, judge, outcome)
    recs, dropped = [], collections.Counter()
    for line, row in _read_rows(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{line}: expected an object with keys {list(need)}, got "
                             f"{type(row).__name__}")
        missing = [c for c in need if c not in row]
        if missing:
            roles = dict(zip(("left", "right", "judge", "outcome"), need))
            hint = "; ".join(f"{opt}=<column> names the {role} column"
                             for role, opt in (column_options or {}).items()
                             if roles.get(role) in missing)
            raise ValueError(f"{path}:{line}: missing column(s) {missing}; present: {sorted(row)}"
                             + (f" ({hint})" if hint else ""))
        o = str(row[outcome])
        if o not in code:
            if drop_unknown:
                dropped[o] += 1
                continue
            raise ValueError(f"{path}:{line}: outcome {o!r} in column {outcome!r}; expected one of "
                             f"{sorted(code)} (or drop such rows)")
        a, b, k = (str(row[c]).strip() for c in (left, right, judge))
        for col, v in ((left, a), (right, b), (judge, k)):
            if not v or row[col] is None:
                raise ValueError(f"{path}:{line}: empty value in column {col!r}")
        if a == b:
            raise ValueError(f"{path}:{line}: model {a!r} is compared with itself")
        recs.append((a, b, k, code[o]))
    if not recs:
        extra = f" ({sum(dropped.values())} rows dropped for unknown outcomes)" if dropped else ""
        raise ValueError(f"{path}: no comparisons{extra}")
    models = sorted({r[0] for r in recs} | {r[1] for r in recs})
    judges = sorted({r[2] for r in recs})
    mi = {m: i for i, m in enumerate(models)}
    ji = {j: i for i, j in enumerate(judges)}
    cols = list(zip(*recs))
    return Judgments(left=np.array([mi[x] for x in cols[0]], np.int64),
                     right=np.array([mi[x] for x in cols[1]], np.int64),
                     judge=np.array([ji[x] for x in cols[2]], np.int64),
                     outcome=np.array(cols[3], np.int64), models=models, judges=judges, path=path,
                     name=dataset_name(path) if name is None else name, dropped=dict(dropped))
