"""Experiment ``diffusion_lm``: AR vs masked (MDLM, NELBO and cross-entropy objectives) vs
uniform-state (Duo) vs interpolating (Eso-LM, GIDD) byte-level LMs on the Shakespeare plays.

Sahoo et al. 2026 ("Scaling Beyond Masked Diffusion Language Models") claim that at equal compute
perplexity orders the families AR < masked < uniform-state, that masked diffusion trained with a
plain cross-entropy objective is about 12% more FLOPs-efficient than with the NELBO weighting, and
that perplexity alone misleads across families, so sampling speed and quality are reported too.

Config -> :func:`algorithms.diffusion_lm.grid.run_grid` (IsoFLOP grid + the other families at the
reference size) -> held-out NELBO per family -> samples scored by one larger AR evaluator
(:mod:`algorithms.diffusion_lm.evaluator`) -> IsoFLOP fits (:mod:`algorithms.diffusion_lm.scaling`)
-> metrics, plots and the report section.

    python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:tiny --workdir=workdir

Runs are checkpointed under ``<workdir>/diffusion_lm/runs`` (their evaluations in
``runs/evals.json``), the evaluator under ``<workdir>/diffusion_lm/evaluator``: a restarted
experiment resumes and skips what is done.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from algorithms.diffusion_lm import evaluator as evaluator_lib
from algorithms.diffusion_lm import grid as grid_lib
from algorithms.diffusion_lm import scaling
from algorithms.diffusion_lm.baselines import ngram_counts_bpb
from algorithms.diffusion_lm.processes import nats_to_bpb
from algorithms.lm.evaluation import heldout_bpb
from core import figures as style
from core import report
from core.data import ByteTokenizer, load_corpus
from core.timing import Stopwatch
from experiments import common
from models.transformer import param_count

NAME = "diffusion_lm"
LABELS = {"ar": "AR", "mdlm": "MDLM (NELBO)", "mdlm_ce": "MDLM (CE)", "duo": "Duo (uniform)",
          "esolm": "Eso-LM", "esolm_nelbo": "Eso-LM, NELBO at α0 (ablation)", "gidd": "GIDD"}
COLORS = style.method_colors(LABELS)  # one colour per family in every figure

EDGE = "optimum at the grid edge: not resolved"  # an IsoFLOP fit that refuses its exponent

# Paired differences reported (first minus second, bits/byte): the claims' comparisons and the
# other families against MDLM.
PAIRS = (("mdlm", "ar"), ("duo", "mdlm"), ("mdlm", "mdlm_ce"), ("gidd", "mdlm"),
         ("esolm", "mdlm"), ("esolm_nelbo", "esolm"))


def _steps_effect(gen_ci, steps) -> dict:
    """Per diffusion family, the change of log generative perplexity from the fewest to the most
    sampling steps, its s.e. (independent samples) and whether its 95% interval excludes 0."""
    out = {}
    if len(steps) < 2:
        return out
    lo, hi = str(min(steps)), str(max(steps))
    for fam, by in gen_ci.items():
        if lo in by and hi in by:
            d = math.log(by[hi]["ppl"]) - math.log(by[lo]["ppl"])
            se = math.hypot(by[hi]["log_se"], by[lo]["log_se"])
            out[fam] = {"from": int(lo), "to": int(hi), "log_ratio": d, "se": se,
                        "resolved": abs(d) > 1.96 * se}
    return out


class _JsonCache(dict):
    """A dict kept in a JSON file, rewritten on every assignment."""

    def __init__(self, path: str):
        self.path = path
        if os.path.exists(path):
            with open(path) as f:
                super().__init__(json.load(f))

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        report.write_json(self.path, dict(self))


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    tok = ByteTokenizer()
    corpus = load_corpus(config.data_path or None, val_fraction=config.val_fraction, tokenizer=tok)
    windows = {n: grid_lib.heldout_windows(corpus.val, config.seq_len, n)
               for n in (config.eval_windows, config.final_eval_windows)}
    runner = grid_lib.Runner(config, tok)
    runs = os.path.join(out, "runs")
    g = grid_lib.run_grid(runner, corpus.train, windows[config.eval_windows], runs,
                          _JsonCache(os.path.join(runs, "evals.json")))
    ref = g.reference

    # Held-out NELBO per family on the same windows with the same draws (paired); Eso-LM's
    # also under its sampling process (alpha_0 = sampling.alpha0 < 1).
    final = windows[config.final_eval_windows]
    # count-based reference levels on the same tokens: the unigram (letter frequencies) and
    # the bigram (the previous byte), fitted on the training split
    baselines = ngram_counts_bpb(corpus.train, final, tok.num_bytes)
    key = jax.random.key(config.seed + 11)
    val = {f: runner.evaluate(m, final, config.final_eval_reps, key) for f, m in ref.items()}
    if "esolm" in ref:
        at = dataclasses.replace(ref["esolm"].spec, name="esolm_nelbo",
                                 alpha0=config.sampling.alpha0)
        val_at = runner.evaluate(ref["esolm"], final, config.final_eval_reps, key, spec=at)
    bits = 1.0 / math.log(2.0)
    paired = {f"{a}_minus_{b}": {k: v * bits for k, v in grid_lib.paired_difference(
        val[a]["windows"], val[b]["windows"]).items()} for a, b in PAIRS if a in val and b in val}
    for d in paired.values():  # the 95% interval excludes 0: the sign is decided
        d["resolved"] = bool(d["lo"] > 0 or d["hi"] < 0)

    # Samples scored by the evaluator (trained once, then restored), sampling.batches batches
    # per setting: the perplexity's interval is over the samples.
    with Stopwatch() as sw:
        ev = evaluator_lib.train_evaluator(config, os.path.join(out, "evaluator"))
    ev_bpb = heldout_bpb(ev.graphdef, ev.params, final)
    gen, gen_ci, ent, tps, text = {}, {}, {}, {}, {}
    for fam, m in ref.items():
        gen[fam], gen_ci[fam], ent[fam], tps[fam] = {}, {}, {}, {}
        for n in [config.seq_len] if fam == "ar" else config.sampling.steps:
            smp, tps[fam][str(n)] = runner.samples(m, n)
            gen_ci[fam][str(n)] = evaluator_lib.perplexity_interval(
                evaluator_lib.sample_nll(ev, smp))
            gen[fam][str(n)] = gen_ci[fam][str(n)]["ppl"]
            ent[fam][str(n)] = grid_lib.unigram_entropy(smp, tok.vocab_size)
            text[f"{fam}@{n}"] = tok.decode(smp[0])
    steps_effect = _steps_effect(gen_ci, config.sampling.steps)

    budgets = sorted(float(b) for b in config.budgets)
    fits = {f: scaling.fit_isoflop(budgets, g.sizes[f], g.losses[f]) for f in g.losses}
    nan = float("nan")
    ce_ratio = {"ratio": nan, "lo": nan, "hi": nan, "lo95": nan, "hi95": nan}
    if "mdlm" in fits and "mdlm_ce" in fits:
        ce_ratio = scaling.paired_bootstrap_ratio(
            budgets, g.sizes["mdlm"], g.windows["mdlm_ce"], g.windows["mdlm"],
            num_samples=config.bootstrap_samples, seed=config.seed)
    # the 95% interval excludes 1: whether CE needs fewer FLOPs than NELBO is decided
    ce_ratio["resolved"] = bool(ce_ratio["hi95"] < 1 or ce_ratio["lo95"] > 1)
    metrics = {
        "val_bpb": {f: nats_to_bpb(v["mean"]) for f, v in val.items()},
        "val_bpb_se": {f: nats_to_bpb(v["se"]) for f, v in val.items()},
        "val_ppl_bound": {f: math.exp(v["mean"]) for f, v in val.items()},
        "baseline_bpb": baselines,
        "paired_diff_bpb": paired,
        "eval_draws": {"windows": config.final_eval_windows, "reps": config.final_eval_reps,
                       "isoflop_reps": config.eval_reps},
        "gen_ppl": gen, "gen_ppl_interval": gen_ci, "gen_ppl_steps_effect": steps_effect,
        "entropy": ent, "tokens_per_s": tps,
        "evaluator": {"val_bpb": ev_bpb, "params": param_count(ev.params),
                      "steps": config.evaluator.steps, "seconds": sw.seconds,
                      "trained_here": ev.result.steps_run > 0},
        "isoflop": {f: grid_lib.isoflop_summary(fit, g.sizes[f], g.steps[f], g.losses[f],
                                                g.se[f]) for f, fit in fits.items()},
        "isoflop_schedule": config.optim.schedule,
        "ce_vs_nelbo_flops_ratio": ce_ratio,
        "params": {f: m.params_count for f, m in ref.items()},
        "flops_per_token": {f: m.flops_per_token for f, m in ref.items()},
        "reference_size": tuple(g.reference_size),
        "reference_budget": grid_lib.reference_of(config)[1],
        "reference_steps": g.reference_steps, "train_seconds": g.seconds,
        "t_range": [config.process.t_min, 1.0], "samples": text,
    }
    if "esolm" in ref:
        metrics["esolm_bpb_at_sampling_alpha0"] = nats_to_bpb(val_at["mean"])
    hist = {f: report.read_json_lines(os.path.join(g.reference_runs[f], "train_metrics.jsonl"))
            for f in ref}
    return report.finish(out, title="Scaling beyond masked diffusion LMs (diffusion_lm)",
                         metrics=metrics, body=_body(config, metrics), claim=config.claim,
                         figures={"isoflop": _plot_isoflop(g, fits, budgets, baselines),
                                  "pareto": _plot_pareto(gen_ci, tps),
                                  "loss_curves": _plot_losses(hist, baselines)})


BASELINE_STYLE = {"unigram": ("0.45", "--"), "bigram": ("0.45", ":")}


def _baseline_lines(ax, baselines) -> None:
    """The count-based reference levels (bits/byte) as grey horizontal lines, labelled."""
    for name, bpb in (baselines or {}).items():
        color, ls = BASELINE_STYLE[name]
        ax.axhline(bpb, color=color, ls=ls, lw=1, label=f"{name} (add-one) {bpb:.2f}")


def _plot_isoflop(g, fits, budgets, baselines=None) -> plt.Figure:
    fig, axes = plt.subplots(1, len(fits), figsize=(3.2 * len(fits), 3.0), sharey=True, squeeze=False)
    for ax, (fam, fit) in zip(axes[0], fits.items()):
        for k, c in enumerate(budgets):
            ax.plot(g.sizes[fam], nats_to_bpb(g.losses[fam][k]), "o-", ms=3, color=f"C{k}",
                    label=f"budget {style.compact_number(c)} FLOPs")
        edge = np.asarray(fit.at_edge, bool)
        n_opt, l_opt = np.asarray(fit.n_opt), nats_to_bpb(np.asarray(fit.loss_opt))
        if (~edge).any():
            ax.plot(n_opt[~edge], l_opt[~edge], "k*", ls="none", ms=8, label="fitted optimum $N^*$")
        if edge.any():  # not an optimum: the grid does not bracket it
            ax.plot(n_opt[edge], l_opt[edge], "*", ls="none", ms=8, mfc="none", mec="k",
                    label="budget not bracketed by the grid (no $N^*$)")
        _baseline_lines(ax, baselines)
        ax.set_xscale("log")
        style.log_ticks(ax, "x")
        law = (f"$N^* \\propto C^{{{fit.exponent:.2f}}}$" if np.isfinite(fit.exponent) else
               "$N^*$ at grid edge:\nnot resolved")
        ax.set(title=f"{LABELS[fam]}: {law}", xlabel="parameters N")
    axes[0, 0].set_ylabel("held-out NELBO (bits/byte)")
    style.figure_legend(fig)
    return fig


def _plot_pareto(gen_ci, tps) -> plt.Figure:
    """Generative perplexity against sampling throughput; ``gen_ci[fam][steps]`` carries ``ppl``
    and its 95% interval ``lo`` / ``hi`` (drawn as error bars)."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for fam in gen_ci:
        keys = list(gen_ci[fam])
        xs, ys = [tps[fam][k] for k in keys], [gen_ci[fam][k]["ppl"] for k in keys]
        err = [[y - gen_ci[fam][k]["lo"] for k, y in zip(keys, ys)],
               [gen_ci[fam][k]["hi"] - y for k, y in zip(keys, ys)]]
        ax.errorbar(xs, ys, yerr=err, fmt="o-", color=COLORS[fam], label=LABELS[fam], capsize=3,
                    elinewidth=1)
        for x, y, k in zip(xs, ys, keys):
            ax.annotate(k, (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set(xscale="log", yscale="log", xlabel="sampling throughput (tokens/s)",
           ylabel="generative perplexity (evaluator)",
           title="Speed-quality (labels: sampling steps; bars: 95% intervals)")
    ax.margins(0.08)  # room for the step labels at the ends
    style.log_ticks(ax, "x")
    style.log_ticks(ax, "y")
    style.legend_outside(ax)
    return fig


def _plot_losses(hist, baselines=None) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for fam, h in hist.items():
        ax.plot([r["step"] for r in h], [nats_to_bpb(r["nelbo"]) for r in h], color=COLORS[fam],
                label=LABELS[fam])
    _baseline_lines(ax, baselines)
    ax.set(xlabel="step", ylabel="training-batch NELBO (bits/byte)",
           title="Training curves (reference size)")
    style.integer_ticks(ax, "x")
    style.legend_outside(ax)
    return fig


def _body(config, m) -> str:
    fams = sorted(m["val_bpb"], key=lambda f: m["val_bpb"][f])
    rows = [(m["val_bpb"][f], [LABELS[f], m["val_bpb"][f], m["val_bpb_se"][f],
                               m["val_ppl_bound"][f]]) for f in fams]
    rows += [(b, [f"*{n} baseline (add-one counts of the training split)*", b, "—", 2.0 ** b])
             for n, b in m["baseline_bpb"].items()]
    table = report.markdown_table(
        ["family", "val bits/byte (NELBO)", "s.e. (windows)", "perplexity bound"],
        [r for _, r in sorted(rows, key=lambda r: r[0])])
    base = m["baseline_bpb"]
    above = [LABELS[f] for f in fams if m["val_bpb"][f] >= base["bigram"]]
    base_line = (f"Count-based reference levels on the same tokens: unigram {base['unigram']:.3f}, "
                 f"bigram {base['bigram']:.3f} bits/byte (each window's first byte scored by the "
                 "unigram). " + ("Every family is below the bigram." if not above else
                                 f"At or above the bigram: {', '.join(above)} (not past the "
                                 "previous byte's information)."))
    ptable = report.markdown_table(
        ["difference (bits/byte)", "mean", "s.e.", "95% interval", "resolved"],
        [[f"{LABELS[a]} - {LABELS[b]}", d["mean"], d["se"], f"[{d['lo']:+.3f}, {d['hi']:+.3f}]",
          "yes" if d["resolved"] else "no"]
         for a, b in PAIRS if (d := m["paired_diff_bpb"].get(f"{a}_minus_{b}"))])
    gci = m["gen_ppl_interval"]
    stable = report.markdown_table(
        ["family", "steps", "gen. perplexity (evaluator)", "95% interval", "entropy (nats)",
         "tokens/s"],
        [[LABELS[f], k, gci[f][k]["ppl"], f"{gci[f][k]['lo']:.1f}-{gci[f][k]['hi']:.1f}",
          m["entropy"][f][k], m["tokens_per_s"][f][k]] for f in gci for k in gci[f]])
    eff = m["gen_ppl_steps_effect"]
    moved = [f"{LABELS[f]} ({100 * math.expm1(e['log_ratio']):+.0f}%)" for f, e in eff.items()
             if e["resolved"]]
    steps_line = ""
    if eff:
        e0 = next(iter(eff.values()))
        n = next(iter(next(iter(gci.values())).values()))["n"]
        steps_line = (f"From {e0['from']} to {e0['to']} sampling steps the generative perplexity "
                      "changes beyond its 95% interval for "
                      + (", ".join(moved) if moved else "no family")
                      + f"; every other change lies within it (not resolved with {n} samples "
                      "per setting).")
    itable = report.markdown_table(
        ["family", "N* exponent a", "L* exponent b", "N*(C) per budget"],
        [[LABELS[f], EDGE if v["exponent"] is None else v["exponent"], v["loss_exponent"],
          ", ".join(f"{n:,.0f}" + ("†" if e else "") for n, e in zip(v["n_opt"], v["at_edge"]))]
         for f, v in m["isoflop"].items()], fmt=".3f")
    r, ev, dr = m["ce_vs_nelbo_flops_ratio"], m["evaluator"], m["eval_draws"]
    unbracketed = [LABELS[f] for f in ("mdlm", "mdlm_ce")
                   if f in m["isoflop"] and not m["isoflop"][f]["resolved"]]
    ce_edge = (f" Not a compute-optimal comparison: the grid does not bracket the optimum of "
               f"{' and '.join(unbracketed)} at every budget, so those frontiers are read at the "
               "grid's edge (not resolved)." if unbracketed else "")
    eso = (f" Eso-LM (trained at α0 = 1 with the cross-entropy objective, as the authors' scaling "
           f"runs) reads {m['esolm_bpb_at_sampling_alpha0']:.3f} bits/byte under its sampling "
           f"process (α0 = {config.sampling.alpha0}: diffusion then AR)."
           if "esolm_bpb_at_sampling_alpha0" in m else "")
    sched = ("one run per (size, budget), its cosine learning rate decayed to that budget"
             if m["isoflop_schedule"] == "cosine" else
             "one constant-rate run per size, read where each budget is spent")
    return "\n".join([
        f"Byte-level models at the reference size {m['reference_size']} (d_model, layers, heads), "
        f"{m['reference_steps']} steps of {config.batch_size}x{config.seq_len} tokens "
        f"({m['reference_budget']:.3g} FLOPs for AR; the same steps for every family). Validation "
        f"is the true NELBO (exact NLL for AR) on {dr['windows']} held-out windows x "
        f"{dr['reps']} time / mask draws, the same windows and draws for every family (paired), "
        f"with diffusion times drawn from U[t_min, 1], t_min = {config.process.t_min}: the "
        "estimate is (1/(1-t_min)) times the integral over [t_min, 1], so it omits the slice "
        f"nearest clean data.{eso}", "", table, "", base_line, "",
        f"Ordering by held-out bits/byte: {' < '.join(LABELS[f] for f in fams)}. Paper: AR < "
        "masked < uniform-state (test perplexity at equal compute). Paired differences (per "
        "window, same draws; s.e. over windows):", "", ptable, "",
        f"IsoFLOP grid: {sched}; each cell evaluated on {config.eval_windows} windows x "
        f"{dr['isoflop_reps']} draws. Fits (parabola in log N per budget, then power laws; † = "
        "the grid does not bracket that budget's optimum: the lowest loss is at the smallest or "
        "largest size, and a family with any † gets no exponent a; L* there is read at the "
        "grid's edge, an upper bound on the optimum):", "", itable,
        "", f"MDLM-CE reaches MDLM-NELBO's frontier loss with {r['ratio']:.3f}x the FLOPs (paired "
        f"bootstrap over windows, both grids resampled jointly: 68% interval {r['lo']:.3f}-"
        f"{r['hi']:.3f}, 95% {r['lo95']:.3f}-{r['hi95']:.3f}; paper: ~0.89, i.e. 12% more "
        "efficient)." + ce_edge, "",
        f"Sampling: every family's samples are scored by one evaluator, a causal LM of "
        f"{ev['params']:,} parameters trained for {ev['steps']} steps on the same training split "
        f"(held-out {ev['val_bpb']:.3f} bits/byte on the same windows), not by a model of the "
        f"grid; {config.sampling.batches} batches of {config.batch_size} samples per setting, "
        "95% interval over the samples:", "", stable, "", steps_line, "",
        "    python -m experiments.diffusion_lm --config=experiments/configs/diffusion_lm.py:"
        f"{config.get('variant', 'tiny')}",
    ])


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compile of the paper step (``experiments.aot``)


def train_step_spec(config: ml_collections.ConfigDict, family: str, devices,
                    size_index: int | None = None):
    """:meth:`algorithms.diffusion_lm.grid.Runner.build_step` of ``family`` at
    ``config.sizes[size_index]`` (default the reference size), abstract, on a runner over
    ``devices``, with its model FLOPs and sizes: a ``core.aot_steps.StepSpec``."""
    from core import aot_steps

    runner = grid_lib.Runner(config, ByteTokenizer(), devices=devices)
    size = config.sizes[config.reference_size if size_index is None else size_index]
    spec, mcfg = runner.model_config(family, size)
    step = runner.build_step(family, size, abstract=True)
    b, L = config.batch_size, config.seq_len
    n = param_count(step.args[0]["params"])
    return aot_steps.StepSpec.of(
        step, model_flops=3.0 * runner.flops_per_token(spec, mcfg) * b * L, params=n,
        shape=(f"{family}, B {b} x L {L}, d {size[0]} x {size[1]} layers, {mcfg.dtype.name}, "
               f"{mcfg.attention} attention, remat {mcfg.remat}, EMA, {n / 1e6:.0f}M params"),
        layer_loop=mcfg.scan_layers)


def paper_steps():
    """The AOT rows of ``diffusion_lm``: each family's ``paper`` train step at the reference
    size, and MDLM's at the largest grid size (as run, and with its blocks fully
    rematerialised), as ``core.aot_steps.PaperSteps``."""
    from experiments.configs import diffusion_lm as dl_config

    def build(family, size_index=None, **overrides):
        def builder(devices):
            config = dl_config.get_config("paper")
            config.update_from_flattened_dict(overrides)
            return train_step_spec(config, family, devices, size_index)
        return builder

    names = {"mdlm": "MDLM", "ar": "AR", "duo": "Duo", "gidd": "GIDD", "esolm": "Eso-LM"}
    return {**{f"{NAME}/{f}": (build(f), f"{label} train step, reference size")
               for f, label in names.items()},
            f"{NAME}/mdlm@largest": (build("mdlm", -1), "MDLM train step, largest grid size"),
            f"{NAME}/mdlm@largest-remat-full": (
                build("mdlm", -1, **{"backbone.remat": "full"}),
                "MDLM train step, largest grid size, blocks fully rematerialised (for v5e)")}


if __name__ == "__main__":
    common.app_main(NAME, run)
