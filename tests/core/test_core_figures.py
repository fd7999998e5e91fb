"""The figure style helpers and the checks that the experiments' figure tests rely on: each check
must flag a figure that breaks its rule and pass one that keeps it."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from core import figures


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_legend_over_a_line_is_flagged_and_a_legend_outside_is_not():
    fig, ax = plt.subplots(figsize=(4, 3))
    x = np.linspace(0, 1, 50)
    ax.plot(x, np.full_like(x, 0.9), label="high")  # runs under an upper legend
    ax.plot(x, x, label="diagonal")
    ax.legend(loc="upper center")
    assert figures.legend_overlaps_data(ax)
    figures.legend_outside(ax)
    assert not figures.legend_overlaps_data(ax)


def test_legend_over_markers_bars_and_bands_is_flagged():
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(9, 3))
    a.plot([0.05, 0.5], [0.95, 0.0], "o", label="points")  # a marker in the upper-left corner
    a.set(xlim=(0, 1), ylim=(0, 1))
    a.legend(loc="upper left")
    b.bar([0, 1, 2], [1.0, 1.0, 1.0], label="bars")
    b.legend(loc="upper center")
    c.fill_between([0, 1], [0, 0], [1, 1], alpha=0.3, label="band")
    c.legend(loc="center")
    assert all(figures.legend_overlaps_data(ax) for ax in (a, b, c))


def test_markers_away_from_the_legend_are_not_flagged():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0.9, 1.0], [0.0, 0.1], "o", label="low right")  # markers only, no line between
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.legend(loc="upper left")
    assert not figures.legend_overlaps_data(ax)


def test_raw_keys_are_flagged_outside_math_only():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="pass_at_1")
    ax.set(xlabel="rollout budget C", ylabel="$\\|x_t - x^*(t)\\|^2$", title="mstl_elec_vic")
    ax.legend()
    assert figures.raw_key_labels(fig) == ["pass_at_1"]  # a data set's file name in a title is fine
    ax.set_xlabel("val_bpb per step")
    ax.legend(["pass@1"])
    assert figures.raw_key_labels(fig) == ["val_bpb per step"]
    ax.set_xlabel("held-out bits per byte")
    assert figures.raw_key_labels(fig) == []


def test_readable_refuses_an_unknown_key():
    assert figures.readable("val_bpb", {"val_bpb": "held-out bits per byte"}) == "held-out bits per byte"
    with pytest.raises(KeyError, match="val_loss"):
        figures.readable("val_loss", {"val_bpb": "held-out bits per byte"})


def test_crowded_tick_labels_are_flagged():
    fig, ax = plt.subplots(figsize=(1.5, 2))
    ax.set_xticks(range(10), [f"label {i}" for i in range(10)])
    assert figures.overlapping_tick_labels(ax, "x")
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.set_xticks(range(3), ["a", "b", "c"])
    assert figures.overlapping_tick_labels(ax, "x") == []


@pytest.mark.parametrize("lo, hi, expected", [
    (3e3, 7e4, ["5k", "10k", "20k", "50k"]),  # one to three decades: 1, 2, 5 x 10^k
    (370.0, 480.0, ["400", "450"]),  # under a decade: round numbers, no minor labels
])
def test_log_ticks_labels_a_narrow_log_axis_without_overlap(lo, hi, expected):
    fig, ax = plt.subplots(figsize=(2.6, 2))
    ax.plot([lo, hi], [1, 2])
    ax.set(xscale="log", xlim=(lo, hi))
    figures.log_ticks(ax, "x")
    fig.canvas.draw()
    shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text()
             and lo <= t.get_position()[0] <= hi]
    assert shown == expected
    assert figures.overlapping_tick_labels(ax, "x") == []


def test_default_minor_labels_of_a_narrow_log_axis_are_flagged():
    fig, ax = plt.subplots(figsize=(2.6, 2))
    ax.plot([8e3, 7e4], [1, 2])
    ax.set(xscale="log", xlim=(8e3, 7e4))  # labels 2x10^4 ... 6x10^4 on the minor ticks
    assert figures.overlapping_tick_labels(ax, "x")


def test_log_ticks_refuses_a_non_positive_axis():
    fig, ax = plt.subplots()
    ax.set_xlim(-1, 10)
    with pytest.raises(ValueError, match="not positive"):
        figures.log_ticks(ax, "x")


def test_include_baseline_widens_a_truncated_axis():
    fig, ax = plt.subplots()
    ax.bar(["a", "b"], [2.31, 2.32])
    ax.set(ylim=(2.30, 2.33), ylabel="bits per byte")  # a 0.01 difference filling the panel
    assert figures.figure_faults(fig, baselines=[(0, 0.0)]) == [
        "panel 0: y axis 2.3..2.33 leaves out the baseline 0"]
    figures.include_baseline(ax, 0.0)
    assert ax.get_ylim() == (0.0, 2.33)
    assert figures.figure_faults(fig, baselines=[(0, 0.0)]) == []


def test_unlabelled_axes_honours_shared_labels_and_categorical_bars():
    fig, (a, b) = plt.subplots(1, 2, sharey=True)
    a.plot([1, 2], [1, 2])
    b.plot([1, 2], [2, 1])
    a.set(xlabel="step", ylabel="loss")
    assert figures.unlabelled_axes(fig) == ["panel 1: x"]
    b.set_xlabel("step")
    assert figures.unlabelled_axes(fig) == []
    fig, ax = plt.subplots()
    ax.bar(["qvg", "kivi"], [1, 2])
    ax.set_ylabel("bits per byte")
    assert figures.unlabelled_axes(fig) == []
    fig, axes = plt.subplots(2, 2)
    for ax in axes.flat:
        ax.plot([1, 2], [1, 2])
    fig.supxlabel("steps from the forecast origin")
    assert figures.unlabelled_axes(fig) == ["panel 0: y", "panel 1: y", "panel 2: y", "panel 3: y"]
    fig.supylabel("value_std")
    assert figures.unlabelled_axes(fig) == []
    assert figures.raw_key_labels(fig) == ["value_std"]


def test_method_colors_are_fixed_by_the_full_list():
    colors = figures.method_colors(["spf", "sgd", "kalman"])
    assert colors == {"spf": figures.PALETTE[0], "sgd": figures.PALETTE[1], "kalman": figures.PALETTE[2]}
    with pytest.raises(ValueError, match="twice"):
        figures.method_colors(["spf", "spf"])
    with pytest.raises(ValueError, match="11 methods"):
        figures.method_colors([str(i) for i in range(11)])


def test_figure_legend_lists_each_method_once_beside_the_panels():
    colors = figures.method_colors(["a", "b", "c"])
    fig, axes = plt.subplots(1, 2)
    for ax, methods in zip(axes, (["a", "b"], ["b", "c"]), strict=True):
        for m in methods:
            ax.plot([0, 1], [0, 1], color=colors[m], label=m)
    legend = figures.figure_legend(fig)
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert all(box.x0 >= ax.get_window_extent().x1 for ax in axes)
