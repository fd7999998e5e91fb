"""Reading pairwise-judgement files: CSV, JSON lines and a JSON array load to the same comparisons;
bad rows are reported with the file and the line; unknown outcomes can be dropped and counted."""

import csv
import json
import os
import re

import numpy as np
import pytest

from core.data import judgments
from core.data.judgments import LEFT, RIGHT, TIE

ROWS = [
    {"a": "m2", "b": "m1", "judge": "j1", "res": "A"},
    {"a": "m1", "b": "m3", "judge": "j2", "res": "B"},
    {"a": "m3", "b": "m2", "judge": "j1", "res": "="},
    {"a": "m1", "b": "m2", "judge": "j2", "res": "A"},
]
COLUMNS = dict(left="a", right="b", judge="judge", outcome="res", left_value="A", right_value="B",
               tie_value="=")


def _write(path, rows, kind):
    with open(path, "w", newline="") as f:
        if kind == "csv":
            w = csv.DictWriter(f, list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        elif kind == "array":
            json.dump(rows, f, indent=2)
        else:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.parametrize("kind, name", [("csv", "v.csv"), ("array", "v.json"), ("lines", "v.jsonl"),
                                        ("lines", "v.json"), ("array", "v.jsonl")])
def test_every_shape_loads_the_same_comparisons(tmp_path, kind, name):
    js = judgments.read_judgments(_write(tmp_path / name, ROWS, kind), **COLUMNS)
    assert js.models == ["m1", "m2", "m3"] and js.judges == ["j1", "j2"]
    np.testing.assert_array_equal(js.left, [1, 0, 2, 0])
    np.testing.assert_array_equal(js.right, [0, 2, 1, 1])
    np.testing.assert_array_equal(js.judge, [0, 1, 0, 1])
    np.testing.assert_array_equal(js.outcome, [LEFT, RIGHT, TIE, LEFT])
    assert js.name == "v" and js.num_dropped == 0 and js.num_comparisons == 4


def test_json_array_errors_name_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.json", ROWS, "array")
    text = open(path).read().replace('"A"', "A", 1)  # the first element's outcome: not JSON
    open(path, "w").write(text)
    bad_line = text.splitlines().index('    "res": A') + 1
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}:{bad_line}: invalid JSON array")):
        judgments.read_judgments(path, **COLUMNS)
    # A missing column in the third element of a valid array: its line is named.
    rows = [dict(r) for r in ROWS]
    del rows[2]["judge"]
    path = _write(tmp_path / "missing.json", rows, "array")
    third = [n for n, line in enumerate(open(path).read().splitlines(), 1) if line.strip() == "{"][2]
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}:{third}: missing column(s) ['judge']")):
        judgments.read_judgments(path, **COLUMNS)


@pytest.mark.parametrize("kind, name, line", [("csv", "u.csv", 4), ("lines", "u.jsonl", 3)])
def test_unknown_outcomes_stop_or_are_dropped_and_counted(tmp_path, kind, name, line):
    rows = [dict(r) for r in ROWS] + [dict(ROWS[0])]
    rows[2]["res"] = "unknown"
    rows[4]["res"] = "unknown"
    path = _write(tmp_path / name, rows, kind)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}:{line}: outcome 'unknown' in column 'res'")):
        judgments.read_judgments(path, **COLUMNS)
    js = judgments.read_judgments(path, drop_unknown=True, **COLUMNS)
    assert js.dropped == {"unknown": 2} and js.num_dropped == 2 and js.num_comparisons == 3
    np.testing.assert_array_equal(js.outcome, [LEFT, RIGHT, LEFT])


@pytest.mark.parametrize("content, match", [
    ("a,b,judge,res\nm1,m1,j,A\n", r":2: model 'm1' is compared with itself"),
    ("a,b,judge,res\nm1,,j,A\n", r":2: empty value in column 'b'"),
    ("a,b,judge,res\n", r": no comparisons$"),
    ('{"a": "m1", "b": "m2", "judge": "j", "res": "A"}\n{"a": oops}\n', r":2: invalid JSON line"),
    ('{"a": "m1", "b": "m2", "judge": "j", "res": "A"}\n[1]\n', r":2: expected an object"),
    ("[1, 2]", r":1: expected an object"),
    ("[]", r": no comparisons$"),
    # another separator than commas: named, not read as missing columns
    ("a\tb\tjudge\tres\nm1\tm2\tj\tA\n",
     r":1: the first line is one cell when split on commas but 4 on tabs .* looks tab-separated"),
    ("\na;b;judge;res\nm1;m2;j;A\n", r":2: .* but 4 on semicolons .* semicolon-separated"),
])
def test_bad_content_is_reported_with_its_line(tmp_path, content, match):
    ext = ".json" if content.lstrip()[:1] in "[{" else ".csv"
    path = str(tmp_path / f"bad{ext}")
    open(path, "w").write(content)
    with pytest.raises(ValueError, match="^" + re.escape(path) + match):
        judgments.read_judgments(path, **COLUMNS)


def test_missing_file_and_clashing_outcome_values(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        judgments.read_judgments(str(tmp_path / "nope.csv"))
    path = _write(tmp_path / "v.csv", ROWS, "csv")
    with pytest.raises(ValueError, match="must be distinct"):
        judgments.read_judgments(path, **{**COLUMNS, "tie_value": "A"})


LLMFAO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "llmfao.csv")


@pytest.mark.skipif(not os.path.exists(LLMFAO), reason="LLMFAO benchmark file ../shared/data/llmfao.csv "
                    "not present (optional data, see its README)")
def test_llmfao_file_loads():
    js = judgments.read_judgments(LLMFAO, judge="worker")
    # Shape given in the data README: 8,931 rows, 59 models, 124 workers.
    assert (js.num_comparisons, len(js.models), len(js.judges)) == (8931, 59, 124)
    assert js.name == "llmfao"
