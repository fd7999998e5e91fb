"""Why the unpenalised judge-aware MLE has no finite value: the diagnosis and its explanation."""

import numpy as np
import pytest

from algorithms.ranking import LEFT, RIGHT, TIE, diagnosis, studies

MODELS = ["alpha", "beta", "gamma", "delta", "eps"]


def _comparisons(seed=0, n=300):
    """Comparisons from a BTL truth (scores 1, 0.5, 0, -0.5, -1), judges 0-2, 10% ties."""
    rng = np.random.default_rng(seed)
    s = np.array([1.0, 0.5, 0.0, -0.5, -1.0])
    rows = []
    for _ in range(n):
        a, b = rng.choice(5, 2, replace=False)
        p = 1 / (1 + np.exp(-(s[a] - s[b])))
        u = rng.random()
        rows.append((a, b, rng.integers(3), TIE if u < 0.1 else (LEFT if u < 0.1 + 0.9 * p else RIGHT)))
    return rows


def _comps(rows):
    return studies.Comparisons(*(np.array(c, np.int64) for c in zip(*rows)))


def test_one_btl_truth_has_a_finite_mle():
    diag = diagnosis.mle_diagnosis(_comps(_comparisons(n=400)), MODELS, ["w0", "w1", "w2"])
    assert diag == dict(exists=True, only_ties=[], to_infinity=[], to_zero=[], other_judges=[],
                        models=[])


def test_a_judge_with_only_ties_is_named():
    rows = _comparisons(n=60) + [(0, 1, 3, TIE)] * 3
    diag = diagnosis.mle_diagnosis(_comps(rows), MODELS, ["w0", "w1", "w2", "calm"])
    assert diag["exists"] is False and diag["only_ties"] == ["calm"]
    assert diagnosis.explain(diag).startswith(
        "The unpenalised judge-aware MLE does not exist: judges 'calm' have only tied comparisons")


def test_a_separating_judge_and_an_adversarial_judge():
    # Judge 'sep' prefers the better model in all of its 4 comparisons (none tied): gamma_sep runs
    # to infinity. Judge 'adv' prefers the worse model in all of its 4: gamma_adv falls to 0.
    good = [(0, 4), (1, 3), (0, 2), (1, 4)]
    rows = (_comparisons(n=400) + [(a, b, 3, LEFT) for a, b in good]
            + [(a, b, 4, RIGHT) for a, b in good])
    diag = diagnosis.mle_diagnosis(_comps(rows), MODELS, ["w0", "w1", "w2", "sep", "adv"])
    assert diag["exists"] is False and diag["to_infinity"] == [dict(judge="sep", comparisons=4)]
    assert [(e["judge"], e["comparisons"]) for e in diag["to_zero"]] == [("adv", 4)]
    assert diag["to_zero"][0]["lead_sum"] < 0 and diag["other_judges"] == diag["models"] == []
    text = diagnosis.explain(diag)
    assert text.startswith(
        "The unpenalised judge-aware MLE does not exist: on the whole file judge 'sep' (4 "
        "comparisons) agrees with the fitted order in every comparison, none tied, so a larger "
        "discrimination gamma always fits those votes better and it runs to infinity (the data "
        "separate); judge 'adv' (4 comparisons) votes against the fitted order on balance")
    assert text.endswith("The MAP's ridge on the log-discriminations keeps every discrimination "
                         "finite.")


def test_explain_counts_and_truncates_names():
    diag = dict(exists=False, only_ties=[], to_infinity=[dict(judge=f"j{k}", comparisons=k + 2)
                                                         for k in range(8)],
                to_zero=[], other_judges=[], models=["m"])
    text = diagnosis.explain(diag)
    assert "8 judges 'j0', 'j1', 'j2', 'j3', 'j4', 'j5' and 2 more (2-9 comparisons each) agree " in text
    assert "; the scores of models 'm' run to infinity." in text
    assert diagnosis.explain(dict(diag, exists=True)).startswith(
        "The unpenalised judge-aware MLE exists on the whole file")


@pytest.mark.parametrize("level", [0.9, 0.95])
def test_judge_table_wald_intervals_most_discriminating_first(level):
    import scipy.stats

    gamma, se = np.array([0.5, 2.0, 1.0]), np.array([0.1, 0.3, 0.2])
    rows = studies.judge_table(["a", "b", "c"], gamma, se, np.array([3, 4, 5]), level)
    z = scipy.stats.norm.ppf(0.5 + level / 2)
    assert [r["judge"] for r in rows] == ["b", "c", "a"]
    assert [r["comparisons"] for r in rows] == [4, 5, 3]
    for r in rows:
        assert r["lo"] == pytest.approx(r["gamma"] - z * r["se"], abs=1e-15)
        assert r["hi"] == pytest.approx(r["gamma"] + z * r["se"], abs=1e-15)
