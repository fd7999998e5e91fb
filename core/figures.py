"""The shared style of the experiments' figures (matplotlib, Agg backend) and checks of it.

Every experiment draws its plots with matplotlib and saves them with :func:`core.report.save_figure`.
The helpers here keep the figures readable the same way everywhere:

- :func:`legend_outside` / :func:`figure_legend`: legends beside the axes, never over the data;
- :func:`method_colors`: one colour per method, the same in every panel of a figure;
- :func:`readable`: axis labels and legend entries from a mapping, never a raw metric key;
- :func:`integer_ticks`, :func:`log_ticks`: counts on integer ticks, log axes without
  overlapping labels;
- :func:`include_baseline`: a bar or error axis that starts at a stated baseline (e.g. 0), so small
  differences are not blown up by a truncated axis.

The checks (:func:`raw_key_labels`, :func:`legend_overlaps_data`, :func:`overlapping_tick_labels`)
state the same rules as predicates on a finished figure, for tests.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

# The ten colours of matplotlib's default cycle ("tab10"), in order.
PALETTE = tuple(plt.rcParams["axes.prop_cycle"].by_key()["color"])


def method_colors(methods: Iterable[Hashable]) -> dict[Hashable, str]:
    """One colour per method (any hashable name: a string, a rollout count), in the order given:
    pass the experiment's full, fixed method list (not the methods of one panel) so that a method
    keeps its colour in every panel and figure.

    Returns ``{method: colour}`` (hex strings of :data:`PALETTE`).

    Raises:
      ValueError: more methods than :data:`PALETTE` has colours, or a method named twice.
    """
    methods = list(methods)
    if len(set(methods)) != len(methods):
        raise ValueError(f"method_colors: a method is named twice in {methods}")
    if len(methods) > len(PALETTE):
        raise ValueError(f"method_colors: {len(methods)} methods but only {len(PALETTE)} distinct colours")
    return dict(zip(methods, PALETTE, strict=False))


def readable(key: str, labels: Mapping[str, str]) -> str:
    """The reader-facing text of ``key`` (a metric or method key such as ``"pass_at_1"``) from
    ``labels``.

    Raises:
      KeyError: ``key`` has no entry in ``labels`` (so a raw key never reaches a figure).
    """
    try:
        return labels[key]
    except KeyError:
        raise KeyError(f"no readable label for {key!r}; known: {sorted(labels)}") from None


def legend_outside(ax: plt.Axes, *, fontsize: float = 7, **kwargs) -> plt.Legend | None:
    """Draws ``ax``'s legend to the right of the axes (top-aligned), outside the data area.

    :func:`core.report.save_figure` lays the figure out around it. Returns the legend, or ``None``
    when ``ax`` has no labelled artist.
    """
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     fontsize=fontsize, **kwargs)


def figure_legend(fig: plt.Figure, *, fontsize: float = 7, **kwargs) -> plt.Legend | None:
    """One legend for all panels of ``fig``, to the right of the panels: each label once, in the
    order it first appears (panels left to right, top to bottom). Use it with
    :func:`method_colors` so that an entry means the same line in every panel.

    Returns the legend, or ``None`` when no panel has a labelled artist.
    """
    seen: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    if not seen:
        return None
    fig.tight_layout()
    return fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.0, 0.95),
                      fontsize=fontsize, **kwargs)


def integer_ticks(ax: plt.Axes, axis: str = "x") -> None:
    """Puts only integer ticks on ``axis`` (``"x"`` or ``"y"``): steps, counts, levels."""
    target = {"x": ax.xaxis, "y": ax.yaxis}[axis]
    target.set_major_locator(ticker.MaxNLocator(integer=True))


def compact_number(value: float) -> str:
    """``value`` in a short form for a tick label: ``"380"``, ``"20k"``, ``"1.5M"``, ``"0.002"``."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def log_ticks(ax: plt.Axes, axis: str = "x") -> None:
    """Readable labels on a log ``axis`` whose limits are already set (call after plotting).

    Under one decade: a few evenly spaced round numbers (matplotlib's default labels every minor
    tick there, as ``2x10^4 3x10^4 4x10^4``, and they run into each other). One to three
    decades: ticks at 1, 2 and 5 times the powers of ten. More: powers of ten only. Labels are
    :func:`compact_number` up to three decades, ``10^k`` beyond; minor ticks are never labelled.
    """
    target = {"x": ax.xaxis, "y": ax.yaxis}[axis]
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    if lo <= 0:
        raise ValueError(f"log_ticks: {axis} axis limits {lo:g}..{hi:g} are not positive")
    decades = np.log10(hi / lo)
    if decades < 1:
        target.set_major_locator(ticker.MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]))
    elif decades <= 3:
        target.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    else:
        target.set_major_locator(ticker.LogLocator(base=10, numticks=8))
    if decades <= 3:
        target.set_major_formatter(ticker.FuncFormatter(lambda v, _: compact_number(v)))
    target.set_minor_formatter(ticker.NullFormatter())


def include_baseline(ax: plt.Axes, baseline: float = 0.0, axis: str = "y") -> None:
    """Widens ``axis``'s limits to include ``baseline`` (e.g. 0 for bars), keeping the upper/lower
    data margin; an axis that already includes it is left alone."""
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    lo, hi = min(lo, baseline), max(hi, baseline)
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo, hi)


# ----------------------------------------------------------------------------- checks (for tests)

# A snake_case identifier (two or more lowercase words joined by "_") outside $...$ math.
_RAW_KEY = re.compile(r"(?<![\w\\])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?!\w)")


def _texts(fig: plt.Figure) -> list[str]:
    out = [t.get_text() for t in (fig._supxlabel, fig._supylabel) if t is not None]
    for ax in fig.axes:
        out += [ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        if legend is not None:
            out += [t.get_text() for t in legend.get_texts()]
    for legend in fig.legends:
        out += [t.get_text() for t in legend.get_texts()]
    return [t for t in out if t]


def raw_key_labels(fig: plt.Figure) -> list[str]:
    """The axis labels and legend entries of ``fig`` that contain a raw snake_case key
    (``"val_bpb"``, ``"pass_at_1"``) outside ``$...$`` math. Empty when the figure is clean.
    Titles are not checked: they may name a data set by its file name (``mstl_elec_vic``)."""
    bad = []
    for text in _texts(fig):
        plain = re.sub(r"\$[^$]*\$", "", text)
        if _RAW_KEY.search(plain):
            bad.append(text)
    return bad


def unlabelled_axes(fig: plt.Figure) -> list[str]:
    """``"panel i: x"`` / ``"panel i: y"`` for each panel with data whose axis has no label and
    shares it with no labelled panel (a shared y label on the left column, a shared x label on the
    bottom row, count, and so do the figure's ``supxlabel`` / ``supylabel``). A categorical x axis
    (bars named by their tick labels) needs no label."""
    missing = []
    sup_x = fig._supxlabel is not None and fig._supxlabel.get_text()
    sup_y = fig._supylabel is not None and fig._supylabel.get_text()
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.has_data():
            continue
        if not sup_x and not any(s.get_xlabel() for s in ax.get_shared_x_axes().get_siblings(ax)):
            categorical = bool(ax.patches) and all(t.get_text() for t in ax.get_xticklabels())
            if not categorical:
                missing.append(f"panel {i}: x")
        if not sup_y and not any(s.get_ylabel() for s in ax.get_shared_y_axes().get_siblings(ax)):
            missing.append(f"panel {i}: y")
    return missing


def _draw(fig: plt.Figure):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _data_paths(ax: plt.Axes):
    """Every drawn data element of ``ax`` in display space, as ``(kind, item)``: ``"line"`` (a
    path), ``"area"`` (a filled path: bands), ``"points"`` (an ``[n, 2]`` array: markers) or
    ``"bbox"`` (a box: bars)."""
    for line in ax.lines:
        if not line.get_visible() or not len(line.get_xdata()):
            continue
        path = line.get_transform().transform_path(line.get_path())
        if line.get_linestyle() in ("None", "none", "", " "):
            yield "points", path.vertices
        else:
            yield "line", path
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection):  # scatter markers at their offsets
            offsets = np.asarray(coll.get_offsets(), float).reshape(-1, 2)
            yield "points", coll.get_offset_transform().transform(offsets)
            continue
        kind = "line" if isinstance(coll, LineCollection) else "area"
        for p in coll.get_paths():
            yield kind, coll.get_transform().transform_path(p)
    for patch in ax.patches:
        if patch.get_visible():
            yield "bbox", patch.get_window_extent()


def legend_overlaps_data(ax: plt.Axes, legend: plt.Legend | None = None, renderer=None) -> bool:
    """Whether ``legend`` (default: ``ax``'s own) covers any of ``ax``'s data in the rendered
    figure: a line passing under it, a marker, a bar or a filled band inside its box.
    ``renderer``: of a figure already drawn (default: draw it now)."""
    legend = legend if legend is not None else ax.get_legend()
    if legend is None:
        return False
    renderer = renderer or _draw(ax.figure)
    box = legend.get_window_extent(renderer)
    for kind, item in _data_paths(ax):
        if kind == "bbox":
            if item.overlaps(box):
                return True
        elif kind == "points":
            x, y = np.asarray(item, float).reshape(-1, 2).T
            if np.any((x >= box.x0) & (x <= box.x1) & (y >= box.y0) & (y <= box.y1)):
                return True
        elif item.intersects_bbox(box, filled=(kind == "area")):
            return True
    return False


def overlapping_tick_labels(ax: plt.Axes, axis: str = "x", renderer=None) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty tick labels of ``axis`` whose rendered boxes overlap (the labels
    run into each other). Empty when every label can be read. ``renderer`` as in
    :func:`legend_overlaps_data`."""
    renderer = renderer or _draw(ax.figure)
    getter = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = (ax.get_xlim() if axis == "x" else ax.get_ylim())
    lo, hi = min(lo, hi), max(lo, hi)
    labels = []
    for tick in itertools.chain(getter.get_major_ticks(), getter.get_minor_ticks()):
        label = tick.label1
        if label.get_visible() and label.get_text() and lo <= tick.get_loc() <= hi:
            labels.append((label.get_text(), label.get_window_extent(renderer)))
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(labels, 2)
            if Bbox.intersection(ba, bb) is not None and Bbox.intersection(ba, bb).width > 0.5
            and Bbox.intersection(ba, bb).height > 0.5]


def figure_faults(fig: plt.Figure, baselines: Sequence[tuple[int, float]] = ()) -> list[str]:
    """Every rule of this module that ``fig`` breaks, as readable lines (empty when clean): raw
    keys in text, legends over data, overlapping tick labels, unlabelled axes, and for each
    ``(panel index, value)`` in ``baselines`` a y axis that leaves the value out."""
    faults = [f"raw key in {t!r}" for t in raw_key_labels(fig)]
    faults += [f"unlabelled axis ({m})" for m in unlabelled_axes(fig)]
    renderer = _draw(fig)  # once: the checks below only read the laid-out figure
    for i, ax in enumerate(fig.axes):
        if legend_overlaps_data(ax, renderer=renderer):
            faults.append(f"panel {i}: legend over the data")
        for axis in ("x", "y"):
            pairs = overlapping_tick_labels(ax, axis, renderer=renderer)
            if pairs:
                faults.append(f"panel {i}: overlapping {axis} tick labels {pairs[:3]}")
    for i, value in baselines:
        lo, hi = sorted(fig.axes[i].get_ylim())
        if not lo <= value <= hi:
            faults.append(f"panel {i}: y axis {lo:.4g}..{hi:.4g} leaves out the baseline {value:g}")
    return faults
