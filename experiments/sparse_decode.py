"""Experiment ``sparse_decode``: Faster Flash Decoding (FFD) against dense decode and Quest.

Measures, on this machine's XLA path: decode attention time of dense, FFD with the paper's top-delta
rule, its top-k budget variant and Quest on a workload whose attention is concentrated on a few
pages (:func:`kernels.sparse_decode.workload.concentrated_workload`; timed by
:mod:`kernels.sparse_decode.benchmark`), bytes read; on keys/values/queries captured from the trained
``lm`` on held-out text, the fraction of pages FFD keeps, the true softmax mass on them and the
output error; planted-needle recall; greedy decoding of the trained model with the FFD cache at a
large delta against the dense cache. With ``checkpoint=DIR`` the captures and the greedy decoding
use that Hugging Face checkpoint and its tokenizer (:mod:`experiments.measured_model`), on one
window of ``min(real_context, max_len)`` tokens.

    python -m experiments.sparse_decode --config=experiments/configs/sparse_decode.py:tiny --workdir=workdir
    python -m experiments.sparse_decode --config=experiments/configs/sparse_decode.py:tiny --workdir=workdir \
        --config.checkpoint=DIR
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from core import figures as style
from core import report, timing
from experiments import common, measured_model
from kernels.sparse_decode import benchmark, workload
from kernels.sparse_decode.cache import FFDCache
from models import capture
from models import kv_cache as kvc
from models.sampling import generate

NAME = "sparse_decode"


def speed_setup(config: ml_collections.ConfigDict) -> benchmark.SpeedSetup:
    """The timing geometry and rules of ``config`` (the budget variant and Quest attend
    ``max_density`` of the pages)."""
    return benchmark.SpeedSetup(
        num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        page_size=config.page_size, delta=config.delta, budget_fraction=config.max_density,
        repeats=config.timing_reps)


def real_context_windows(config, model: measured_model.MeasuredModel) -> np.ndarray:
    """Token windows [n, W] whose captures make the measured context: for the byte LM, n =
    real_context // max_len windows of its max_len (stitched end to end); for a checkpoint, one
    window of min(real_context, max_len) tokens rounded down to whole pages.

    Raises:
      ValueError: a checkpoint context of fewer than two pages, or a text too short for it.
    """
    if not model.is_checkpoint:
        w = model.config.max_len
        return model.windows(w, config.real_context // w)
    p = config.real_page_size
    s = min(config.real_context, model.config.max_len) // p * p
    if s < 2 * p:
        raise ValueError(f"config fields real_context={config.real_context} and real_page_size="
                         f"{p}: the checkpoint's max_len={model.config.max_len} allows a context "
                         f"of {min(config.real_context, model.config.max_len)} tokens, fewer than "
                         "two pages; expected a smaller real_page_size")
    return model.windows(s, 1)


def real_quality(config, model: measured_model.MeasuredModel) -> dict:
    """:func:`workload.selection_quality` per layer of the captured model, at ``real_queries``
    ragged decode positions in the second half of the context; means (and worst cases)."""
    windows = real_context_windows(config, model)
    s = windows.size
    rng = np.random.default_rng(config.seed)
    qpos = np.sort(rng.integers(s // 2, s, config.real_queries))
    lengths = jnp.asarray(qpos + 1, jnp.int32)
    captured = capture.capture_attention_inputs(model.graphdef, model.params, jnp.asarray(windows))
    layers = [workload.selection_quality(q[qpos].astype(jnp.float32), k, v, lengths,
                                         config.real_page_size, config.delta)
              for q, k, v in workload.stitch_windows(captured, model.rope)]
    return {key: float(np.mean([r[key] for r in layers])) for key in layers[0]} | {
        "layers": len(layers), "context": s, "page_size": config.real_page_size,
        "min_kept_mass": min(r["kept_mass"] for r in layers),
        "max_rel_err": max(r["rel_err"] for r in layers)}


def needles(config) -> dict:
    trials = [workload.needle_recall(
        jax.random.key(config.seed + 1000 + t), config.num_heads, config.num_kv_heads,
        config.needle_context, config.head_dim, config.page_size, config.delta, config.needles)
        for t in range(config.needle_trials)]
    return {key: float(np.mean([r[key] for r in trials])) for key in trials[0]} | {
        "needle_context": config.needle_context}


def greedy_match(config, model: measured_model.MeasuredModel) -> dict:
    n, page, limit = config.greedy_prompt + config.greedy_new, config.greedy_page_size, \
        model.config.max_len
    if n > limit or n % page:
        raise ValueError(f"config fields greedy_prompt={config.greedy_prompt}, greedy_new="
                         f"{config.greedy_new} and greedy_page_size={page}: expected a sum <= the "
                         f"model's max_len={limit} and a multiple of greedy_page_size (the FFD "
                         "cache holds whole pages)")
    prompt = jnp.asarray(model.windows(config.greedy_prompt, 2))
    kw = dict(max_new_tokens=config.greedy_new, temperature=0.0)
    dense, _ = generate(model.graphdef, model.params, prompt, jax.random.key(0),
                        backend=kvc.DENSE, **kw)
    ffd, _ = generate(model.graphdef, model.params, prompt, jax.random.key(0),
                      backend=FFDCache(page_size=page, delta=50.0), **kw)
    return {"greedy_token_match": float(jnp.mean(dense == ffd)), "greedy_tokens": int(dense.size)}


def speed_figure(rows, real, label):
    """Decode time per step against the context (smallest batch) and the softmax mass and share of
    pages that FFD and Quest keep on the real model; one legend beside both panels."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    b1 = [r for r in rows if r["batch"] == min(r["batch"] for r in rows)]
    ctx = [r["context"] for r in b1]
    for name, key in (("dense", "dense_ms"), ("FFD, top-delta", "ffd_ms"),
                      ("FFD, top-k budget", "ffd_budget_ms"), ("Quest", "quest_ms")):
        ax1.plot(ctx, [r[key] for r in b1], "o-", label=name)
    ax1.set_xscale("log", base=2)
    ax1.set(yscale="log", xlabel="context (tokens)", ylabel="ms per decode step",
            title="Decode attention (concentrated workload)")
    ax1.set_xticks(ctx, [f"{c // 1024}k" if c % 1024 == 0 else str(c) for c in ctx])
    ax1.xaxis.set_minor_formatter(plt.NullFormatter())
    style.log_ticks(ax1, "y")
    ax2.bar(np.arange(2) - 0.2, [real["kept_mass"], real["quest_kept_mass"]], 0.4, color="C4",
            label="kept softmax mass")
    ax2.bar(np.arange(2) + 0.2, [real["density"], real["quest_density"]], 0.4, color="C5",
            label="density (share of pages read)")
    ax2.set_xticks(range(2), ["FFD", "Quest"])
    ax2.set(ylim=(0, 1.05), ylabel="fraction", title=f"{label} captures, {real['context']} tokens")
    style.figure_legend(fig)
    return fig


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    with timing.Stopwatch() as sw:
        model = measured_model.load(config, workdir, NAME)
        if model.config.dim_per_head % 16:
            raise ValueError(f"sparse_decode: the model's head dimension {model.config.dim_per_head}"
                             " is not a multiple of 16 (FFD packs 2-bit key codes 16 to a word)")
        bandwidth = timing.read_bandwidth_gbs(config.bandwidth_mb)
        rows = benchmark.speed_table(jax.random.key(config.seed), config.contexts,
                                     config.batch_sizes, speed_setup(config), bandwidth)
        real = real_quality(config, model)
        needle = needles(config)
        greedy = greedy_match(config, model)
    top = max(rows, key=lambda r: (r["context"], -r["batch"]))
    metrics = {
        "model": model.info, "largest_context": top["context"], "delta": config.delta,
        **{key: top[key] for key in ("speedup_vs_dense", "budget_speedup_vs_dense", "bytes_ratio",
                                     "cpu_bytes_ratio", "dense_bw_fraction", "ffd_bw_fraction",
                                     "kept_fraction")},
        "timed_kept_mass": top["kept_mass"],
        "density": real["density"], "kept_mass": real["kept_mass"], "rel_err": real["rel_err"],
        "needle_recall": needle["needle_recall"],
        "quest": {"speedup_vs_dense": top["quest_speedup_vs_dense"],
                  "density": real["quest_density"], "kept_mass": real["quest_kept_mass"],
                  "rel_err": real["quest_rel_err"], "needle_recall": needle["quest_needle_recall"]},
        "read_bandwidth_gbs": bandwidth, "speed": rows, "real": real, "needle": needle,
        "greedy": greedy, "device": jax.devices()[0].device_kind, "seconds": sw.seconds,
    }
    table = report.markdown_table(
        ["context", "kept pages", "kept mass", "dense ms", "FFD ms (scan + attend)",
         "FFD speed-up", "budget speed-up", "Quest speed-up", "bytes ratio (accel / CPU)",
         "dense BW frac"],
        [[r["context"], f"{r['kept_fraction']:.1%}", f"{r['kept_mass']:.4f}", r["dense_ms"],
          f"{r['ffd_ms']:.3g} ({r['ffd_scan_ms']:.3g} + {r['ffd_attend_ms']:.3g})",
          f"{r['speedup_vs_dense']:.2f}x", f"{r['budget_speedup_vs_dense']:.2f}x",
          f"{r['quest_speedup_vs_dense']:.2f}x",
          f"{r['bytes_ratio']:.3g} / {r['cpu_bytes_ratio']:.3g}", r["dense_bw_fraction"]]
         for r in rows], fmt=".3g")
    quality = report.markdown_table(
        ["method", "density", "kept mass", "rel err", "needle recall"],
        [[f"FFD (delta={config.delta:g})", real["density"], real["kept_mass"], real["rel_err"],
          needle["needle_recall"]],
         ["Quest (matched density)", real["quest_density"], real["quest_kept_mass"],
          real["quest_rel_err"], needle["quest_needle_recall"]]], fmt=".4g")
    who = "the checkpoint" if model.is_checkpoint else "the trained lm"
    body = "\n".join([
        model.describe(), "",
        f"Read bandwidth measured in the same run: {bandwidth:.1f} GB/s "
        f"({jax.devices()[0].device_kind}). Timed workload: per kv head, an attention sink, a "
        "recent window and 6% of the pages with retrieval tokens, aligned with the query (logits "
        "11-15 nats) over N(0, 1) background logits; FFD's top-delta rule (delta "
        f"{config.delta:g} nats) attends the kept pages; the budget variant (top-k) and Quest "
        f"attend {config.max_density:.0%} of the pages. Bytes ratio: dense bf16 over FFD in the "
        "accelerator format (2-bit codes) / in the CPU path's own format (byte codes).", "",
        table, "",
        f"Quality on q/k/v captured from {who} ({real['layers']} layers, "
        f"{real['context']} tokens of held-out text, pages of {real['page_size']}):", "", quality,
        "", f"Greedy decoding of {who} with the FFD cache at delta=50 matches the dense "
        f"cache on {greedy['greedy_token_match']:.1%} of {greedy['greedy_tokens']} tokens.",
    ])
    return report.finish(
        out, title="Sparse long-context decoding (FFD vs dense and Quest)", metrics=metrics,
        body=body, claim=config.claim,
        figures={NAME: speed_figure(rows, real, "checkpoint" if model.is_checkpoint else "lm")})


if __name__ == "__main__":
    common.app_main(NAME, run)
