"""Every experiment's figures, drawn from small synthetic results shaped like the real ones, keep
the rules of :mod:`core.figures`: no raw metric key in a label, title or legend; no legend over the
data; no overlapping tick labels; every axis labelled; bar charts of small differences start at 0;
a method keeps its colour across panels."""

import types

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import numpy as np
import pytest

from core import figures

RNG = np.random.default_rng(0)


def _benchmark_game():
    from experiments import benchmark_game as e

    deltas = np.linspace(0.0, 15.0, 31)
    results = [(label, {"deltas": deltas, "n_pure_ne": (deltas >= d).astype(int), "delta_star_closed_form": d},
                {"color": f"C{i}", "ls": ls})
               for i, (label, d, ls) in enumerate((("N=3, 11 levels, additive", 1.6, "-"),
                                                   ("N=3, 11 levels, logit", 7.1, "--"),
                                                   ("N=5, 5 levels, additive", 0.9, "-.")))]
    gaps = {"gaps": np.array([0.2, 0.3, 0.4]), "closed_form": np.array([1.6, 1.2, 0.9]),
            "numeric_refined": np.array([1.7, 1.25, 0.92])}
    small = dict(deltas=np.arange(4.0), kendall_tau=np.array([-0.2, 0.55, 1.0, 1.0]),
                 delta_star_closed_form=1.6)
    return {"counts": (e._plot_counts(results), ()),
            "gaps": (e._plot_gaps(gaps, gaps), ()),
            "designer": (e._plot_designer(small, small["kendall_tau"] - 0.05 * small["deltas"], 0.05,
                                          "N=3, 11 levels"), ())}


def _diffusion_lm():
    from experiments import diffusion_lm as e

    fams, budgets = ("ar", "mdlm", "mdlm_ce"), [2e7, 4e7, 8e7]
    sizes = {f: np.array([4.6e3, 7.9e3, 1.2e4]) for f in fams}
    losses = {f: [np.log(2) * (8 + k + RNG.uniform(0, 1, 3)) for k in range(3)] for f in fams}
    fit = types.SimpleNamespace(n_opt=[4.6e3, 1.2e4, 1.2e4], loss_opt=[np.log(2) * 8.5] * 3, exponent=0.31,
                                at_edge=[True, False, False])
    g = types.SimpleNamespace(sizes=sizes, losses=losses)
    all_fams = list(e.LABELS)
    gen = {f: {k: {"ppl": p, "lo": 0.9 * p, "hi": 1.1 * p}
               for k, p in (("2", 380 + 15 * i), ("8", 360 + 12 * i))} for i, f in enumerate(all_fams)}
    tps = {f: {"2": 8e3 * (1 + i), "8": 2e3 * (1 + i)} for i, f in enumerate(all_fams)}
    hist = {f: [{"step": s, "nelbo": np.log(2) * (9 - 0.1 * s + RNG.uniform(0, 2))} for s in range(2, 22, 2)]
            for f in all_fams}
    base = {"unigram": 9.4, "bigram": 8.3}  # the count-based reference lines, drawn in range
    return {"isoflop": (e._plot_isoflop(g, {f: fit for f in fams}, budgets, base),
                        [(i, v) for i in range(len(fams)) for v in base.values()]),
            "pareto": (e._plot_pareto(gen, tps), ()),
            "loss_curves": (e._plot_losses(hist, base), [(0, v) for v in base.values()])}


def _forecasting():
    from experiments import forecasting as e

    n, L, H, S, C = 2, 24, 12, 16, 1
    x = np.sin(np.linspace(0, 6, L))[None, :, None].repeat(n, 0)
    y = np.sin(np.linspace(6, 9, H))[None, :, None].repeat(n, 0)
    fan = {"x": x, "y": y, **{m: y[:, None] + RNG.normal(0, 0.3, (n, S, H, C)) for m in ("ppm", "linear", "arima")}}
    crps = {"mstl_elec_vic": {"12": {m: {"crps": 0.2 + 0.1 * i} for i, m in enumerate(e.METHODS)}}}
    return {"fan": (e._fan_figure(fan, "mstl_elec_vic, L=24, H=12", 0, "y"), ()),
            "crps": (e._crps_figure(crps, 8), [(0, 0.0)])}


def _judge_btl():
    from experiments import judge_btl as e

    n, j = 12, 6
    truth = types.SimpleNamespace(scores=np.linspace(-1.5, 1.5, n))
    sim = {"scores_hat": truth.scores + RNG.normal(0, 0.1, n), "scores_se": np.full(n, 0.1),
           "gamma_true": np.linspace(0.2, 3.0, j), "gamma_hat": np.linspace(0.3, 2.9, j), "gamma_se": np.full(j, 0.2)}
    rank = np.arange(1, n + 1)
    r = {"rank": rank, "rank_lo": np.maximum(rank - 2, 1), "rank_hi": np.minimum(rank + 2, n),
         "scores": truth.scores[::-1], "ridge_alpha": 0.1, "comparisons_per_judge": np.geomspace(50, 5000, j),
         "gamma": np.linspace(0.2, 2.0, j), "gamma_se": np.full(j, 0.1)}
    d = {"models": [f"model-{i}" for i in range(n)], "name": "llmfao"}
    real = e._real_figures(types.SimpleNamespace(level=0.95), d, r)
    return {"recovery": (e._recovery_figure(truth, sim), ()),
            **{k: (v, ()) for k, v in real.items()}}


def _kv_quant(post_rope_bpb=2.307):
    from experiments import kv_quant as e

    pct = 25
    metrics = {"synthetic": {m: {"effective_bits": 2.2 + i, "rel_err": 0.2 / (i + 1)} for i, m in enumerate(e.METHODS)}}
    for i, m in enumerate(e.METHODS):
        metrics |= {f"{m}_effective_bits": 2.1 + i, f"{m}_rel_err": 0.25 / (i + 1)}
    bpb = {"full": 2.301, "qvg": 2.305, "qvg_post_rope": post_rope_bpb, "kivi": 2.311,
           f"entrokv_{pct}pct": 2.32, f"uniform_{pct}pct": 2.33}
    metrics |= {f"bpb_{k}": v for k, v in bpb.items()}
    config = types.SimpleNamespace(bits=2, budget_fraction=pct / 100)
    return {"kv_quant": (e._figure(config, metrics, "bits per byte"), [(1, 0.0)])}


def _lm():
    from experiments import lm as e

    hist = [{"step": s, "loss": np.log(2) * (8.5 - 0.012 * s)} for s in range(10, 410, 10)]
    return {"loss": (e.loss_figure(hist, 3.9, 3.85), ())}


def _rl_scaling():
    from experiments import rl_scaling as e

    budgets, ns = (32, 64, 128, 256), (1, 2, 4, 8)
    nstar = {s: [{"budget": c, "n_star": 2 ** (k / 2), "lo": 2 ** (k / 2 - 0.5), "hi": 2 ** (k / 2 + 0.5)}
                 for k, c in enumerate(budgets)] for s in ("easy", "hard")}
    fit = {"power": {"a": -2.5, "b": 0.5}, "sigmoid": {"hi": 2.0, "x0": 6.0, "w": 0.7, "lo": 0.0},
           "loo_mse_power": 0.12, "loo_mse_sigmoid": 0.08}
    records = [{"budget": c, "n": n, "bp": 4, "seed": s, "easy_pass1": 0.1 * np.log2(c) / n,
                "hard_passk": 0.05 * np.log2(c) * n} for c in budgets for n in ns for s in range(2)]
    cfg = types.SimpleNamespace(ns=ns, budgets=budgets, num_seeds=2, num_streams=1, pass_k=8)
    return {"nstar": (e.plot_nstar(nstar, {"easy": fit, "hard": fit}, max(ns)), [(0, 8), (1, 8)]),
            "curves": (e.plot_curves(records, cfg), ())}


def _sparse_decode():
    from experiments import sparse_decode as e

    def ms(x):
        return {"median": x, "min": 0.8 * x, "max": 1.3 * x}

    rows = [{"batch": 1, "context": c, "rounds": 7, "dense": ms(c / 1e3), "ffd": ms(c / 3e3),
             "ffd_budget": ms(c / 2.5e3), "quest": ms(c / 2e3)}
            for c in (4096, 8192, 16384, 32768, 65536)]
    real = {"kept_mass": 0.97, "quest_kept_mass": 0.93, "density": 0.08, "quest_density": 0.12, "context": 2048}
    return {"speed": (e.speed_figure(rows, real, "byte LM"), [(1, 0.0)])}


def _spf():
    from experiments import spf as e

    T, dt = 200, 0.05
    curve = lambda s: list(np.exp(-np.linspace(0, 3, T)) * s + 0.01 * s)  # noqa: E731
    methods_a = ("spf", "sgd", "sgd_decay", "adam", "pc", "rls", "kalman")
    methods_b = ("spf", "sgd", "adam", "pc")
    results = {}
    for name, methods in (("lsq_rotation", methods_a), ("logistic_ou", methods_b)):
        results[name] = {"problem": {"dt": dt}, "curves": {m: curve(1 + i) for i, m in enumerate(methods)},
                         "noise_memory": {m: {"by_lag": list(np.geomspace(1, 1e-4, 80) * (i + 1))}
                                          for i, m in enumerate(("spf", "sgd"))}}
    scale = {"dims": [8, 64, 512], "seconds_per_step": {m: [1e-4, 1e-3, None if m == "rls" else 1e-2]
                                                        for m in ("spf", "sgd", "rls")},
             "relative_error": {m: [0.1, 0.2, None if m == "rls" else 0.3] for m in ("spf", "sgd", "rls")}}
    return {k: (v, ()) for k, v in e._figures(results, scale).items()}


BUILDERS = {"benchmark_game": _benchmark_game, "diffusion_lm": _diffusion_lm, "forecasting": _forecasting,
            "judge_btl": _judge_btl, "kv_quant": _kv_quant, "lm": _lm, "rl_scaling": _rl_scaling,
            "sparse_decode": _sparse_decode, "spf": _spf}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_figures_keep_the_style_rules(name):
    try:
        for fig_name, (fig, baselines) in BUILDERS[name]().items():
            assert figures.figure_faults(fig, baselines) == [], f"{name}/{fig_name}"
    finally:
        plt.close("all")


def _line_colors(ax):
    return {line.get_label(): line.get_color() for line in ax.lines if not line.get_label().startswith("_")}


def test_spf_methods_keep_their_colour_across_panels_and_figures():
    from experiments import spf as e

    figs = {k: fig for k, (fig, _) in _spf().items()}
    try:
        seen = {}
        for fig in figs.values():
            for ax in fig.axes:
                for label, color in _line_colors(ax).items():
                    assert seen.setdefault(label, color) == color, label
        assert set(seen) <= set(e.LABELS.values())
        assert seen[e.LABELS["kalman"]] != seen[e.LABELS["spf"]]
        titles = [ax.get_title() for ax in figs["tracking_error"].axes]
        assert titles == ["least squares, rotating optimum", "logistic regression, OU drift"]
        # every line in a panel carries a legend entry (no unlabelled line)
        for fig in figs.values():
            for ax in fig.axes:
                assert all(not line.get_label().startswith("_") for line in ax.lines
                           if len(line.get_xdata()) > 2)
    finally:
        plt.close("all")


def test_kv_quant_bars_start_at_zero_so_a_small_difference_stays_small():
    fig, _ = _kv_quant()["kv_quant"]
    try:
        lo, hi = fig.axes[1].get_ylim()
        assert lo == 0.0 and hi >= 2.33
    finally:
        plt.close("all")


@pytest.mark.parametrize("post_rope_bpb", [2.307, None])
def test_kv_quant_bars_are_the_decoded_caches(post_rope_bpb):
    """Post-RoPE QVG has its bar, in its own colour, only when it was decoded (``None``: not)."""
    from experiments import kv_quant as e

    fig, _ = _kv_quant(post_rope_bpb)["kv_quant"]
    try:
        ax = fig.axes[1]
        names = [t.get_text() for t in ax.get_xticklabels()]
        heights = [round(p.get_height(), 3) for p in ax.patches]
        expected = ["full", "QVG", "KIVI", "EntroKV\n25%", "uniform\n25%"]
        if post_rope_bpb is not None:
            expected.insert(2, "QVG\npost-RoPE")
            assert heights[2] == post_rope_bpb
            assert ax.patches[2].get_facecolor() == mcolors.to_rgba(e.COLORS["qvg_post_rope"])
        assert names == expected and len(heights) == len(expected)
    finally:
        plt.close("all")


def test_rl_scaling_marks_the_n_grid_ceiling():
    """The n* panels draw the largest n tried as a horizontal line at that n (an n* there may be
    capped by the grid); without n_max there is none."""
    from experiments import rl_scaling as e

    builders = _rl_scaling()
    try:
        fig = builders["nstar"][0]
        for ax in fig.axes[:2]:
            (ceiling,) = [ln for ln in ax.lines if ln.get_label() == "largest n tried"]
            assert set(np.asarray(ceiling.get_ydata(), float)) == {8.0}
        nstar = {s: [{"budget": 32, "n_star": 2.0, "lo": 1.0, "hi": 4.0}] for s in ("easy", "hard")}
        fit = {"power": {"a": 0.0, "b": 0.1}, "sigmoid": {"hi": 2.0, "x0": 6.0, "w": 0.7, "lo": 0.0},
               "loo_mse_power": 0.1, "loo_mse_sigmoid": 0.1}
        plain = e.plot_nstar(nstar, {"easy": fit, "hard": fit})
        assert not any(ln.get_label() == "largest n tried" for ax in plain.axes for ln in ax.lines)
    finally:
        plt.close("all")
