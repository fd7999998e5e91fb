"""Pairwise comparisons: aggregation into a count table and identifiability checks.

Dimension legend: C raw comparisons, M aggregated rows (one per unordered model pair and judge),
N models, J judges.

A raw comparison is ``(left, right, outcome, judge)`` with ``outcome`` one of :data:`LEFT` (the
left model won), :data:`RIGHT` or :data:`TIE`. :func:`aggregate` canonicalises every pair to
``i < j`` and sums the outcomes of identical ``(i, j, judge)`` triples, so the likelihood costs
O(M) instead of O(C). The checks in :func:`check_identifiable` run on concrete (host) arrays
before any jitted fit: they are the conditions under which the maximum-likelihood estimate of the
judge-aware Bradley-Terry-Luce model exists and is unique up to its normalisation (Ford, 1957;
Hunter, 2004, Assumption 1; Xu et al., 2026, Section 3 on identifiability).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

LEFT, RIGHT, TIE = 0, 1, 2

# Above this many (i, j, judge) cells the aggregation sorts instead of using a dense bincount.
_DENSE_CELL_LIMIT = 1 << 25


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["i", "j", "judge", "wins", "losses", "ties"],
    meta_fields=["n_models", "n_judges"],
)
@dataclasses.dataclass(frozen=True)
class ComparisonTable:
    """Aggregated comparison counts; a pytree (arrays are leaves, sizes are static).

    Attributes:
      i, j: int32 [M], model indices with ``i < j`` on real rows.
      judge: int32 [M], judge index in ``[0, n_judges)``.
      wins: float [M], comparisons of row (i, j, judge) that ``i`` won.
      losses: float [M], comparisons that ``j`` won.
      ties: float [M], tied comparisons.
      n_models: N (static).
      n_judges: J (static); 1 for judge-free data.

    Padding rows (all counts zero) are allowed and contribute nothing; see ``pad_to``.
    """

    i: np.ndarray
    j: np.ndarray
    judge: np.ndarray
    wins: np.ndarray
    losses: np.ndarray
    ties: np.ndarray
    n_models: int
    n_judges: int

    @property
    def num_rows(self) -> int:
        return int(np.shape(self.i)[0])

    @property
    def totals(self):
        """Comparisons per row, float [M]."""
        return self.wins + self.losses + self.ties

    def num_comparisons(self) -> float:
        return float(np.sum(np.asarray(self.totals)))

    def astype(self, dtype) -> ComparisonTable:
        """The same table with counts cast to ``dtype`` (e.g. float64 for a precise fit)."""
        return dataclasses.replace(self, wins=np.asarray(self.wins, dtype),
                                   losses=np.asarray(self.losses, dtype),
                                   ties=np.asarray(self.ties, dtype))


def _as_int_ids(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of integer ids, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        if not np.all(np.equal(np.mod(a, 1), 0)):
            raise ValueError(f"{name}: expected integer ids, got dtype {a.dtype} with fractions")
        a = a.astype(np.int64)
    return a.astype(np.int64)


def aggregate(
    left: Sequence[int] | np.ndarray,
    right: Sequence[int] | np.ndarray,
    outcome: Sequence[int] | np.ndarray,
    judge: Sequence[int] | np.ndarray | None = None,
    *,
    n_models: int | None = None,
    n_judges: int | None = None,
    weights: Sequence[float] | np.ndarray | None = None,
    pad_to: int | None = None,
    dtype=np.float64,
) -> ComparisonTable:
    """Aggregates C raw comparisons into a :class:`ComparisonTable` of M rows.

    Args:
      left, right: int [C], the two models compared (ids in ``[0, n_models)``).
      outcome: int [C], :data:`LEFT`, :data:`RIGHT` or :data:`TIE`.
      judge: int [C] judge ids in ``[0, n_judges)``, or ``None`` for one judge (plain BTL data).
      n_models, n_judges: sizes; default ``max id + 1``. Ids that exceed a given size are errors.
      weights: float [C] non-negative multiplicities (default 1 each).
      pad_to: pad the table with zero-count rows up to this many rows (a fixed shape lets jitted
        fits of different data sets share one compilation); must be >= M.
      dtype: float dtype of the counts.

    Returns:
      The table with rows sorted by ``(i, j, judge)``; only cells with at least one comparison.

    Raises:
      ValueError: empty input, mismatched lengths, negative or out-of-range ids, self-comparisons
        (a model against itself: the position of the first is named), unknown outcome codes,
        negative or non-finite weights, ``pad_to`` < M.
    """
    left_a, right_a = _as_int_ids(left, "left"), _as_int_ids(right, "right")
    out_a = _as_int_ids(outcome, "outcome")
    c = left_a.shape[0]
    if c == 0:
        raise ValueError("aggregate: no comparisons (empty input)")
    judge_a = np.zeros(c, np.int64) if judge is None else _as_int_ids(judge, "judge")
    for name, arr in (("right", right_a), ("outcome", out_a), ("judge", judge_a)):
        if arr.shape[0] != c:
            raise ValueError(f"aggregate: {name} has {arr.shape[0]} entries, left has {c}")
    w = None if weights is None else np.asarray(weights, dtype)
    if w is not None and w.shape != (c,):
        raise ValueError(f"aggregate: weights have shape {w.shape}, expected ({c},)")
    if w is not None and (not np.all(np.isfinite(w)) or np.any(w < 0)):
        raise ValueError("aggregate: weights must be finite and non-negative")
    max_model = int(max(left_a.max(), right_a.max()))
    n_models = max_model + 1 if n_models is None else int(n_models)
    n_judges = int(judge_a.max()) + 1 if n_judges is None else int(n_judges)
    for name, arr, n in (("left", left_a, n_models), ("right", right_a, n_models),
                         ("judge", judge_a, n_judges)):
        bad = np.flatnonzero((arr < 0) | (arr >= n))
        if bad.size:
            raise ValueError(f"aggregate: unknown {name} id {int(arr[bad[0]])} at position "
                             f"{int(bad[0])} ({bad.size} such); expected ids in [0, {n})")
    selfc = np.flatnonzero(left_a == right_a)
    if selfc.size:
        raise ValueError(f"aggregate: self-comparison of model {int(left_a[selfc[0]])} at position "
                         f"{int(selfc[0])} ({selfc.size} such); a model cannot be compared with itself")
    bad = np.flatnonzero((out_a < 0) | (out_a > 2))
    if bad.size:
        raise ValueError(f"aggregate: outcome {int(out_a[bad[0]])} at position {int(bad[0])}; expected "
                         f"{LEFT} (left wins), {RIGHT} (right wins) or {TIE} (tie)")

    i = np.minimum(left_a, right_a)
    j = np.maximum(left_a, right_a)
    # Outcome seen from the canonical order: 0 = i wins, 1 = j wins, 2 = tie (LEFT = 0 and
    # RIGHT = 1 swap when the pair was given in the other order; integer ops, no temporaries).
    oc = out_a ^ ((left_a > right_a) & (out_a != TIE))
    cell = (i * n_models + j) * n_judges + judge_a
    n_cells = n_models * n_models * n_judges
    if n_cells <= _DENSE_CELL_LIMIT:
        # Without weights the integer bincount is about twice as fast as the weighted one.
        counts = np.bincount(cell * 3 + oc, weights=w, minlength=3 * n_cells).reshape(n_cells, 3)
        keys = np.flatnonzero(counts.any(axis=1))
        counts = counts[keys]
    else:
        keys, inv = np.unique(cell, return_inverse=True)
        counts = np.zeros((keys.shape[0], 3), np.float64)
        np.add.at(counts, (inv, oc), 1.0 if w is None else w)
    ri, rest = np.divmod(keys, n_models * n_judges)
    rj, rk = np.divmod(rest, n_judges)
    counts = counts.astype(dtype)
    table = ComparisonTable(i=ri.astype(np.int32), j=rj.astype(np.int32), judge=rk.astype(np.int32),
                            wins=counts[:, 0], losses=counts[:, 1], ties=counts[:, 2],
                            n_models=n_models, n_judges=n_judges)
    return table if pad_to is None else pad(table, pad_to)


def pad(table: ComparisonTable, rows: int) -> ComparisonTable:
    """Appends zero-count rows (pair (0, 1), judge 0) so the table has exactly ``rows`` rows.

    Raises:
      ValueError: ``rows`` is smaller than the table, or the table has fewer than two models.
    """
    m = table.num_rows
    if rows < m:
        raise ValueError(f"pad: the table has {m} rows, cannot pad to {rows}")
    if table.n_models < 2:
        raise ValueError("pad: need at least two models")
    extra = rows - m

    def cat(a, fill, dt):
        return np.concatenate([np.asarray(a), np.full(extra, fill, dt)])

    fdt = np.asarray(table.wins).dtype
    return ComparisonTable(i=cat(table.i, 0, np.int32), j=cat(table.j, 1, np.int32),
                           judge=cat(table.judge, 0, np.int32), wins=cat(table.wins, 0, fdt),
                           losses=cat(table.losses, 0, fdt), ties=cat(table.ties, 0, fdt),
                           n_models=table.n_models, n_judges=table.n_judges)


def _names(ids, names: Sequence[str] | None, limit: int = 8) -> str:
    ids = [int(x) for x in ids]
    shown = [repr(names[x]) if names is not None else str(x) for x in ids[:limit]]
    more = f" ... ({len(ids)} in all)" if len(ids) > limit else ""
    return "[" + ", ".join(shown) + more + "]"


def check_identifiable(
    table: ComparisonTable,
    *,
    judge_aware: bool = True,
    ridge_scores: float = 0.0,
    ridge_alpha: float = 0.0,
    tie_model: str = "half",
    model_names: Sequence[str] | None = None,
    judge_names: Sequence[str] | None = None,
) -> None:
    """Raises ``ValueError`` unless the (penalised) MLE exists and is unique up to normalisation.

    Conditions checked, on host arrays:
      0. With a tie parameter (``tie_model`` ``"davidson"`` or ``"rao_kupper"``, which has no prior):
         some comparisons are ties and some are not. With no tie the tie parameter's MLE is at
         ``-inf``, with only ties at ``+inf`` (and the scores are then not identified either).
      1. There is at least one comparison and at least one decisive (non-tied) comparison: ties
         alone say nothing about which model is better (any ranking of all-equal scores would be an
         arbitrary order); every model appears in some comparison.
      2. The comparison graph (models joined when compared) is connected; otherwise the score
         offset between components is not identified, whatever the prior. The components are named.
      3. Without a ridge on the scores: the directed graph with an edge i -> j whenever i beat or
         tied j is strongly connected (Ford, 1957; Hunter, 2004). Otherwise a group of models never
         loses (or never wins) against the rest and its score difference runs to infinity; the
         message names the group and suggests ``ridge_scores > 0`` (a Gaussian prior, giving the MAP).
      4. Judge-aware without a ridge on log-discriminations: every judge has at least one decisive
         (non-tied) comparison; a judge with none has discrimination 0 at the MLE (log at -inf).

    Args:
      table: the counts.
      judge_aware, ridge_scores, ridge_alpha, tie_model: the fit's settings
        (:class:`algorithms.ranking.btl.FitConfig`).
      model_names, judge_names: used in the messages only.

    Raises:
      ValueError: the first violated condition, naming the models, judges or parameter concerned.
    """
    tot = np.asarray(table.totals)
    live = tot > 0
    if not np.any(live):
        raise ValueError("no comparisons with positive count")
    num_ties = float(np.sum(np.asarray(table.ties)))
    num_decisive = float(np.sum(np.asarray(table.wins)) + np.sum(np.asarray(table.losses)))
    if tie_model != "half":
        what = {"davidson": "log nu of Davidson's model", "rao_kupper": "log eta of Rao-Kupper's model"}
        name = f"the tie parameter tau ({what.get(tie_model, tie_model)})"
        if num_decisive <= 0:
            raise ValueError(f"every comparison is a tie: {name} is unbounded (its MLE is at +inf) and "
                             "no decisive comparison identifies the scores; such data cannot rank models")
        if num_ties <= 0:
            raise ValueError(f"no comparison is a tie: {name} is unbounded (its MLE is at -inf); fit "
                             "with tie_model='half' (no tie parameter) instead")
    if num_decisive <= 0:
        raise ValueError(f"no decisive comparison: all {num_ties:g} comparisons are ties, which say "
                         "nothing about which model is better (every score would be 0 and any ranking "
                         "arbitrary)")
    n = table.n_models
    i, j = np.asarray(table.i)[live], np.asarray(table.j)[live]
    seen = np.zeros(n, bool)
    seen[i] = True
    seen[j] = True
    if not seen.all():
        raise ValueError(f"models {_names(np.flatnonzero(~seen), model_names)} appear in no comparison; "
                         "their scores are not identified (drop them or give them comparisons)")
    adj = sparse.coo_matrix((np.ones(i.shape[0]), (i, j)), shape=(n, n)).tocsr()
    ncomp, lab = csgraph.connected_components(adj, directed=False)
    if ncomp > 1:
        groups = "; ".join(_names(np.flatnonzero(lab == c), model_names) for c in range(min(ncomp, 5)))
        raise ValueError(f"the comparison graph is not connected: {ncomp} components ({groups}"
                         f"{' ...' if ncomp > 5 else ''}); scores of different components cannot be "
                         "compared - fit each component separately")
    if ridge_scores <= 0:
        w = np.asarray(table.wins)[live] + np.asarray(table.ties)[live]
        l = np.asarray(table.losses)[live] + np.asarray(table.ties)[live]
        src = np.concatenate([i[w > 0], j[l > 0]])  # edge winner -> loser
        dst = np.concatenate([j[w > 0], i[l > 0]])
        win = sparse.coo_matrix((np.ones(src.shape[0]), (src, dst)), shape=(n, n)).tocsr()
        ncomp, lab = csgraph.connected_components(win, directed=True, connection="strong")
        if ncomp > 1:
            # A component no outside model ever beats: its members never lose to the rest.
            beaten = np.zeros(ncomp, bool)
            cross = lab[src] != lab[dst]
            beaten[lab[dst[cross]]] = True
            beats = np.zeros(ncomp, bool)
            beats[lab[src[cross]]] = True
            top = [c for c in range(ncomp) if not beaten[c]]
            bottom = [c for c in range(ncomp) if not beats[c]]
            msg = []
            if top:
                msg.append(f"models {_names(np.flatnonzero(lab == top[0]), model_names)} never lose "
                           "to any other model")
            if bottom:
                msg.append(f"models {_names(np.flatnonzero(lab == bottom[0]), model_names)} never "
                           "win against any other model")
            raise ValueError("the maximum-likelihood scores are at infinity: " + " and ".join(msg)
                             + "; add comparisons, or set ridge_scores > 0 (Gaussian prior, MAP)")
    if judge_aware and ridge_alpha <= 0:
        decisive = np.zeros(table.n_judges)
        np.add.at(decisive, np.asarray(table.judge),
                  np.asarray(table.wins) + np.asarray(table.losses))
        bad = np.flatnonzero(decisive <= 0)
        if bad.size:
            raise ValueError(f"judges {_names(bad, judge_names)} have no decisive (non-tied) comparison: "
                             "their discrimination is not identified (MLE at 0); drop them, or set "
                             "ridge_alpha > 0 (Gaussian prior on log-discriminations)")
