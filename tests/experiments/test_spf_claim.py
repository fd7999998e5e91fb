"""The spf claim is resolved only when no problem's paired comparison is a tie."""

import pytest

from core import report
from experiments.configs import spf as spf_config


@pytest.mark.parametrize("wins, ties, scaling, verdict", [
    (2, 0, 1.0, "yes"), (1, 0, 1.0, "partly"), (0, 0, 2.0, "no"),
    (1, 1, 1.0, "not resolved at this size"),  # a tie within 2 standard errors decides nothing
])
def test_spf_verdict_follows_wins_and_ties(wins, ties, scaling, verdict):
    claim = report.Claim.from_config(spf_config.get_config("tiny").claim)
    metrics = {"spf_wins": wins, "spf_ties": ties, "num_problems": 2, "scaling_error_vs_sgd": scaling}
    assert claim.verdict(metrics) == verdict
