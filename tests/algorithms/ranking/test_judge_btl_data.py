"""Aggregation and identifiability checks of the judge-aware BTL data layer (host-side numpy)."""

import numpy as np
import pytest

from algorithms.ranking import data
from algorithms.ranking.data import LEFT, RIGHT, TIE


def test_aggregate_canonicalises_pairs_and_sums_outcomes():
    # (left, right, outcome, judge); 2 vs 0 by judge 1 appears in both orders.
    left = [0, 2, 0, 1, 2]
    right = [2, 0, 2, 0, 0]
    outcome = [LEFT, LEFT, TIE, RIGHT, RIGHT]
    judge = [1, 1, 1, 0, 1]
    t = data.aggregate(left, right, outcome, judge, n_models=3, n_judges=2)
    rows = {(int(a), int(b), int(k)): (float(w), float(l), float(x))
            for a, b, k, w, l, x in zip(t.i, t.j, t.judge, t.wins, t.losses, t.ties)}
    # Canonical i < j; wins count for i = the smaller id.
    assert rows == {(0, 1, 0): (1.0, 0.0, 0.0),          # 1 vs 0, right (0) won
                    (0, 2, 1): (2.0, 1.0, 1.0)}          # 0 won twice, 2 won once, one tie
    assert t.num_comparisons() == 5


def test_aggregate_sorted_path_matches_dense_path(monkeypatch):
    rng = np.random.default_rng(0)
    left = rng.integers(0, 7, 500)
    right = (left + rng.integers(1, 7, 500)) % 7
    out = rng.integers(0, 3, 500)
    k = rng.integers(0, 3, 500)
    dense = data.aggregate(left, right, out, k)
    monkeypatch.setattr(data, "_DENSE_CELL_LIMIT", 0)
    sort = data.aggregate(left, right, out, k)
    for f in ("i", "j", "judge", "wins", "losses", "ties"):
        np.testing.assert_array_equal(getattr(dense, f), getattr(sort, f))


def test_pad_adds_zero_rows():
    t = data.aggregate([0, 1], [1, 2], [LEFT, RIGHT], pad_to=8)
    assert t.num_rows == 8 and t.num_comparisons() == 2
    assert np.all(np.asarray(t.totals)[2:] == 0)
    with pytest.raises(ValueError, match="cannot pad"):
        data.pad(t, 4)


@pytest.mark.parametrize("args, kwargs, match", [
    (([], [], []), {}, "empty"),
    (([0, 1], [0, 2], [LEFT, LEFT]), {}, "self-comparison of model 0 at position 0"),
    (([0, 1], [1, 5], [LEFT, LEFT]), {"n_models": 3}, "unknown right id 5 at position 1"),
    (([0, -1], [1, 2], [LEFT, LEFT]), {}, "unknown left id -1"),
    (([0, 1], [1, 2], [LEFT, 3]), {}, "outcome 3 at position 1"),
    (([0, 1], [1, 2], [LEFT, LEFT], [0, 4]), {"n_judges": 2}, "unknown judge id 4"),
    (([0, 1], [1], [LEFT, LEFT]), {}, "right has 1 entries"),
    (([0.5], [1], [LEFT]), {}, "integer ids"),
])
def test_aggregate_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.aggregate(*args, **kwargs)


def _cycle(n, judge=None):
    """Models 0..n-1 in a cycle of wins (strongly connected)."""
    left = list(range(n))
    right = [(a + 1) % n for a in left]
    return left, right, [LEFT] * n, judge


def test_identifiable_cycle_passes():
    t = data.aggregate(*_cycle(4))
    data.check_identifiable(t, judge_aware=False)


def test_disconnected_graph_names_components():
    t = data.aggregate([0, 1, 2, 3], [1, 0, 3, 2], [LEFT] * 4)
    with pytest.raises(ValueError, match=r"not connected: 2 components \(\[0, 1\]; \[2, 3\]\)"):
        data.check_identifiable(t, judge_aware=False)
    # A prior does not make components comparable.
    with pytest.raises(ValueError, match="not connected"):
        data.check_identifiable(t, judge_aware=False, ridge_scores=1.0)


def test_model_that_never_loses_or_never_wins():
    # 0 beats 1 and 2; 1 and 2 trade wins; 3 loses to everyone.
    left, right = [0, 0, 1, 2, 0, 1, 2], [1, 2, 2, 1, 3, 3, 3]
    t = data.aggregate(left, right, [LEFT] * 7)
    names = ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match=r"models \['a'\] never lose.*models \['d'\] never win"):
        data.check_identifiable(t, judge_aware=False, model_names=names)
    data.check_identifiable(t, judge_aware=False, ridge_scores=0.1)  # the MAP exists
    # A tie with the top model is half a loss: 0 is no longer unbeaten.
    t2 = data.aggregate(left + [3, 3], right + [0, 1], [LEFT] * 7 + [TIE, LEFT])
    data.check_identifiable(t2, judge_aware=False)


def test_model_without_comparisons_and_judges_without_decisive_comparisons():
    left, right, out, _ = _cycle(3)
    t = data.aggregate(left, right, out, n_models=4)
    with pytest.raises(ValueError, match=r"models \[3\] appear in no comparison"):
        data.check_identifiable(t, judge_aware=False)
    # Judge 1 only ties, judge 2 never judges.
    t = data.aggregate(left + [0], right + [1], out + [TIE], [0, 0, 0, 1], n_judges=3)
    with pytest.raises(ValueError, match=r"judges \[1, 2\] have no decisive"):
        data.check_identifiable(t, judge_aware=True)
    data.check_identifiable(t, judge_aware=False)
    data.check_identifiable(t, judge_aware=True, ridge_alpha=1.0)


def test_no_positive_counts():
    t = data.aggregate([0, 1], [1, 0], [LEFT, LEFT], weights=[0.0, 0.0])
    with pytest.raises(ValueError, match="no comparisons with positive count"):
        data.check_identifiable(t)
