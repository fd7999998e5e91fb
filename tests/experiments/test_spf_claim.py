"""The spf claim is unresolved only when a tie could change one of its checks."""

import pytest

from core import report
from experiments import spf
from experiments.configs import spf as spf_config


@pytest.mark.parametrize("wins, ties, expected", [
    (1, 1, 0),  # win, loss, tie: both checks already decided
    (0, 1, 1),  # no win: the tie could be the one win
    (2, 1, 1),  # no loss: the tie could make it every problem
    (0, 0, 0), (3, 0, 0), (0, 3, 1),
])
def test_ties_matter_only_where_they_could_flip_a_check(wins, ties, expected):
    assert spf.ties_matter(wins, ties, 3) == expected


def test_ties_matter_refuses_impossible_counts():
    with pytest.raises(ValueError, match="wins=3, ties=1 of 3 problems"):
        spf.ties_matter(3, 1, 3)


@pytest.mark.parametrize("wins, ties, matter, scaling, verdict", [
    (3, 0, 0, 1.0, "yes"), (1, 0, 0, 1.0, "partly"), (0, 0, 0, 2.0, "no"),
    # win, loss, tie (the tiny run): the loss already decides "every problem", the win "one"
    (1, 1, 0, 2.0, "partly"),
    # two wins and a tie: deciding the tie could make "every problem" hold
    (2, 1, 1, 1.0, "not resolved at this size"),
])
def test_spf_verdict_follows_wins_and_ties(wins, ties, matter, scaling, verdict):
    claim = report.Claim.from_config(spf_config.get_config("tiny").claim)
    assert spf.ties_matter(wins, ties, 3) == matter
    metrics = {"spf_wins": wins, "spf_ties": ties, "spf_ties_matter": matter, "num_problems": 3,
               "scaling_error_vs_sgd": scaling}
    assert claim.verdict(metrics) == verdict
