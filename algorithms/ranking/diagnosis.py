"""Why the unpenalised judge-aware MLE of a comparisons set has no finite value, or that it has.

Dimension legend: C comparisons, M table rows, N models, J judges.

The model's log-likelihood in one judge's discrimination ``gamma_k``, the scores held fixed, is
concave, ``sum_c log sigmoid(gamma_k y_c m_c)`` over the judge's comparisons ``c`` (``m_c`` the
fitted score lead of the first model, ``y_c`` +1 / -1 / a half of each for a win / loss / tie;
Xu et al., 2026, Section 3). So the unpenalised fit sends ``gamma_k`` to infinity when the judge
has no tie and agrees with the fitted order in every comparison (separation: a larger ``gamma_k``
always fits better), and to 0 when the judge's comparisons lean against the fitted order,
``sum_c y_c m_c <= 0`` (the slope at ``gamma_k = 0``; ties add 0). A judge whose every comparison
is a tie has its maximum at ``gamma_k = 0`` whatever the scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from algorithms.ranking import btl
from algorithms.ranking.studies import Comparisons, table_of


def mle_diagnosis(comps: Comparisons, models: Sequence[str], judges: Sequence[str]) -> dict:
    """Why the unpenalised judge-aware MLE of ``comps`` (all of them) is not finite, or that it is.

    Fits the MLE (:func:`btl.solve`, float64, default :class:`btl.FitConfig`), takes the parameters
    :func:`btl.diverging` flags and sorts them by the conditions of the module docstring,
    evaluated where the fit stopped.

    Args:
      comps: int arrays [C] ``left``, ``right``, ``judge`` ids and ``outcome``.
      models: the models' names [N], indexed by the ids in ``left`` and ``right``.
      judges: the judges' names [J], indexed by the ids in ``judge``.

    Returns:
      dict: ``exists`` (bool); ``only_ties`` (judges, by name, with only tied comparisons; the fit
      is not run then), ``to_infinity`` (``{"judge", "comparisons"}`` per judge that agrees with the
      fitted order in every comparison, none tied), ``to_zero`` (``{"judge", "comparisons",
      "lead_sum"}`` per judge with ``sum_c y_c m_c <= 0``), ``other_judges`` (flagged, neither
      condition), ``models`` (models whose score the fit flags).
    """
    n, nj = len(models), len(judges)
    table = table_of(comps, np.arange(comps.left.shape[0]), n, nj)
    out = dict(exists=True, only_ties=[], to_infinity=[], to_zero=[], other_judges=[], models=[])
    k = np.asarray(table.judge)
    wins, losses, ties = (np.asarray(a, np.float64) for a in (table.wins, table.losses, table.ties))
    decisive = np.bincount(k, wins + losses, nj)
    if nj > 1 and np.any(decisive <= 0):
        out.update(exists=False, only_ties=[str(judges[j]) for j in np.flatnonzero(decisive <= 0)])
        return out
    config = btl.FitConfig()
    with jax.enable_x64(True):
        t = table.astype(np.float64)
        params, conv = btl.solve(t, config)
        flat_s, flat_a, _ = (np.asarray(a) for a in btl.diverging(t, config, conv.information))
        scores = np.asarray(params.scores)
    lead = scores[np.asarray(table.i)] - scores[np.asarray(table.j)]   # [M], first model's lead
    agree = np.bincount(k, wins * (lead > 0) + losses * (lead < 0), nj)
    total = np.bincount(k, wins + losses + ties, nj)
    lead_sum = np.bincount(k, (wins - losses) * lead, nj)
    for j in np.flatnonzero(flat_a):
        name, count = str(judges[j]), int(total[j])
        if agree[j] == total[j]:  # every comparison decisive and won by the fitted leader
            out["to_infinity"].append(dict(judge=name, comparisons=count))
        elif lead_sum[j] <= 0:
            out["to_zero"].append(dict(judge=name, comparisons=count, lead_sum=float(lead_sum[j])))
        else:
            out["other_judges"].append(name)
    out["models"] = [str(models[m]) for m in np.flatnonzero(flat_s)]
    out["exists"] = not (out["to_infinity"] or out["to_zero"] or out["other_judges"] or out["models"])
    return out


def _names(items: list, limit: int = 6) -> str:
    shown = ", ".join(f"'{x}'" for x in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def explain(diagnosis: dict) -> str:
    """One or two sentences (ending in a full stop, no trailing space) on :func:`mle_diagnosis`'s
    ``diagnosis`` of a whole comparisons file: that the MLE exists on the file (so it failed only
    on a split's training part), or which judges and models keep it from existing and why."""
    g = diagnosis
    if g["exists"]:
        return ("The unpenalised judge-aware MLE exists on the whole file but not on the training "
                "part of a split.")
    if g["only_ties"]:
        return (f"The unpenalised judge-aware MLE does not exist: judges {_names(g['only_ties'])} "
                "have only tied comparisons, so their likelihood is highest at discrimination "
                "gamma = 0 (log-discrimination at -inf).")
    parts = []
    if g["to_infinity"]:
        inf = g["to_infinity"]
        counts = sorted(e["comparisons"] for e in inf)
        span = f"{counts[0]}-{counts[-1]}" if counts[0] != counts[-1] else f"{counts[0]}"
        one = len(inf) == 1
        parts.append(f"{'judge' if one else f'{len(inf)} judges'} {_names([e['judge'] for e in inf])} "
                     f"({span} comparisons{'' if one else ' each'}) "
                     f"agree{'s' if one else ''} with the fitted order in every comparison, none tied, "
                     "so a larger discrimination gamma always fits those votes better and it runs to "
                     "infinity (the data separate)")
    if g["to_zero"]:
        zero = sorted(g["to_zero"], key=lambda e: -e["comparisons"])
        one = len(zero) == 1
        parts.append(f"{'judge' if one else f'{len(zero)} judges'} {_names([e['judge'] for e in zero])} "
                     f"({', '.join(str(e['comparisons']) for e in zero[:6])}"
                     f"{', ...' if len(zero) > 6 else ''} comparisons) vote{'s' if one else ''} against "
                     "the fitted order on balance (the fitted score lead of the winner sums to <= 0 "
                     "over the comparisons), so the likelihood is highest at gamma = 0 and the "
                     f"discrimination{'' if one else 's'} fall{'s' if one else ''} to 0")
    if g["other_judges"]:
        parts.append(f"judges {_names(g['other_judges'])} have a vanishing information where the fit "
                     "stopped")
    if g["models"]:
        parts.append(f"the scores of models {_names(g['models'])} run to infinity")
    ridge = (" The MAP's ridge on the log-discriminations keeps every discrimination finite."
             if g["to_infinity"] or g["to_zero"] or g["other_judges"] else "")
    return ("The unpenalised judge-aware MLE does not exist: on the whole file " + "; ".join(parts)
            + "." + ridge)
