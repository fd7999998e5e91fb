"""Experiment ``kv_quant``: quantized KV caches (QVG, QVG-Pro, KIVI) and EntroKV budgets.

On SmolLM2-135M-Instruct (the packaged GGUF, ``checkpoint="smollm2-135m"``, the default; any GGUF
file or Hugging Face Llama / Qwen2 / Mistral directory; ``checkpoint=""`` the trained byte-level LM)
and windows of English prose written after its release (the byte LM: its held-out plays), read with
its own tokenizer (:mod:`experiments.measured_model`):
true compression (every scale, zero point, assignment and centroid counted, vs bf16),
attention-output relative error on the model's real keys / values / queries
(:mod:`algorithms.kv_budget.quality`), held-out bits per token (per byte for the byte LM) and
perplexity when decoding through each cache (teacher-forced, prompt prefilled then one token at a
time), both also for QVG with its keys stored after RoPE (``qvg_post_rope``, the same bits; the
paper stores them before), EntroKV vs uniform (SnapKV) budgets with the spread of the per-head
entropies they come from, and the decode-time ratio quantized / full. The same error comparison
on synthetic long-context keys with outlier channels (where the paper's 256 centroids amortise).

    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:tiny --workdir=workdir
    python -m experiments.kv_quant --config=experiments/configs/kv_quant.py:tiny --workdir=workdir \
        --config.checkpoint=DIR

The metric keys ``bpb_*`` hold bits per token of the measured model's tokenizer (``nll_unit`` says
which): bits per byte for the byte LM.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
from tqdm import tqdm

from algorithms.kv_budget import cache as budget_cache
from algorithms.kv_budget import entrokv, quality
from core import figures as style
from core import report, timing
from experiments import common, measured_model
from experiments.configs import kv_quant as kv_quant_config
from kernels.kv_quant import reference as ref
from kernels.kv_quant.reference import quantizer_configs
from models import capture
from models import kv_cache as kvc

NAME = "kv_quant"
# the quantizers of kernels.kv_quant.reference.quantizer_configs; "qvg_post_rope" is QVG with its
# keys stored after RoPE (the paper stores them before)
METHODS = ("qvg", "qvg_post_rope", "qvg_pro", "kivi")
# those measured on the synthetic keys too (they carry no RoPE: post-RoPE QVG would repeat QVG)
SYNTHETIC_METHODS = ("qvg", "qvg_pro", "kivi")
LABELS = {"qvg": "QVG", "qvg_pro": "QVG-Pro", "kivi": "KIVI", "qvg_post_rope": "QVG post-RoPE"}
MARKERS = {"qvg": "o", "qvg_pro": "s", "kivi": "^", "qvg_post_rope": "D"}
# One colour per cache in both panels; the full-precision cache in grey.
COLORS = {**style.method_colors(("qvg", "qvg_pro", "kivi", "entrokv", "uniform", "qvg_post_rope")),
          "full": "0.55"}


def _bpb(graphdef, params, windows, backend, prompt_len, keep=None):
    s, n = budget_cache.teacher_forced_nll(graphdef, params, windows, backend, prompt_len, keep)
    return float(s) / int(n) / math.log(2.0)


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    model = measured_model.load(config, workdir, NAME)
    d, seq = model.config.dim_per_head, min(config.context, model.config.max_len)
    if model.is_checkpoint:
        kv_quant_config.check_model_shapes(config, d, model.config.max_len,
                                           f"the checkpoint {config.checkpoint}")
    # one compiled block for every layer (the capture, each cache's layer-by-layer decoding)
    (graphdef, params), rope = model.scanned, model.rope
    unit = "bits per token" if model.is_checkpoint else "bits per byte"
    cfgs = quantizer_configs(config, d)
    prompt_len = kv_quant_config.prompt_length(config, seq)
    windows = jnp.asarray(model.windows(seq, config.windows))
    key = jax.random.key(config.seed)
    metrics: dict = {"model": model.info, "nll_unit": unit}
    bar = tqdm(total=4, desc=NAME)  # attention error, decoding, budgets, synthetic

    # 1. True compression and attention error on the model's real activations.
    acts = capture.capture_attention_inputs(graphdef, params, windows)
    for m, c in cfgs.items():
        bits = ref.effective_bits(c, d)
        metrics[f"{m}_compression"], metrics[f"{m}_effective_bits"] = (bits["compression"],
                                                                       bits["effective"])
        # the rope base makes QVG quantize the un-rotated keys (pre_rope); KIVI and post-RoPE QVG
        # quantize the keys as the model rotated them
        metrics[f"{m}_rel_err"] = quality.attention_error(
            acts, c, key, rope if getattr(c, "pre_rope", False) else None)
    bar.update()

    # 2. Held-out bits per byte decoding through each cache, and the decode time.
    backends = {"full": kvc.get_backend("dense"),
                "qvg": kvc.get_backend("qvg", config=cfgs["qvg"], rope_base=rope, seed=config.seed),
                "kivi": kvc.get_backend("kivi", config=cfgs["kivi"])}
    seconds = {}
    for m, be in backends.items():
        metrics[f"bpb_{m}"] = _bpb(graphdef, params, windows, be, prompt_len)  # compiles
        if config.decode_timing:
            seconds[m] = timing.seconds(lambda be=be: budget_cache.teacher_forced_nll(
                graphdef, params, windows, be, prompt_len), repeats=1, warmup=0)
    # QVG-Pro and post-RoPE QVG decode through the same cache class with their own quantizers
    # (held-out bpb only: they are not timed, the decode-time ratio reported is QVG's); the
    # post-RoPE cache stores the rotated keys and attends them as stored (None: not decoded)
    metrics["bpb_qvg_post_rope"] = None
    for m in ("qvg_pro", "qvg_post_rope") if config.decode_post_rope else ("qvg_pro",):
        metrics[f"bpb_{m}"] = _bpb(graphdef, params, windows, kvc.get_backend(
            "qvg", config=cfgs[m], rope_base=rope, seed=config.seed), prompt_len)
    metrics["seconds"] = seconds
    metrics["dequant_overhead"] = seconds["qvg"] / seconds["full"] if seconds else None
    metrics["kivi_time_ratio"] = seconds["kivi"] / seconds["full"] if seconds else None
    # perplexity per token of the model's tokenizer (per byte for the byte lm): 2^(bits per token)
    for m in ("full", *METHODS):
        bpb = metrics[f"bpb_{m}"]
        metrics[f"ppl_{m}"] = None if bpb is None else 2.0 ** bpb
    bar.update()

    # 3. EntroKV vs uniform budgets at the configured fraction of the prompt.
    ecfg = entrokv.EntroKVConfig(window=config.entrokv_window, alpha=config.entrokv_alpha,
                                 prior=config.entrokv_prior, pool=config.entrokv_pool)
    prompt_qk = [(q[:, :, :prompt_len], k[:, :, :prompt_len]) for q, k, _ in acts]
    budgets, pct = {}, round(100 * config.budget_fraction)
    for m in ("entrokv", "uniform"):
        budgets[m], keep = budget_cache.budgets_and_keep(prompt_qk, ecfg, config.budget_fraction, m)
        bpb = _bpb(graphdef, params, windows, kvc.get_backend("budgeted"), prompt_len,
                   keep)
        metrics[f"bpb_{m}_{pct}pct"] = bpb
        # quality relative to the full cache: ratio of bits per byte (1 = as good as full)
        metrics[f"{m}_quality"] = metrics["bpb_full"] / bpb
    ent = np.asarray(budget_cache.head_entropies(prompt_qk, ecfg))
    eb = np.asarray(budgets["entrokv"])
    metrics["entrokv_heads"] = {
        "entropy_min": float(ent.min()), "entropy_max": float(ent.max()),
        "entropy_std": float(ent.std()), "budget_min": int(eb.min()), "budget_max": int(eb.max()),
        "uniform_budget": int(np.asarray(budgets["uniform"])[0, 0]),
        "heads_below_window": float(np.mean(eb < config.entrokv_window)),
        "budgets_row0": eb[0].tolist()}
    bar.update()

    # 4. Synthetic long-context keys with outlier channels, the paper's centroid count.
    q, k, v = quality.synthetic_keys(jax.random.fold_in(key, 99), config.synth_tokens,
                                     config.synth_head_dim, config.synth_heads,
                                     config.synth_clusters, config.synth_outlier_channels,
                                     config.synth_queries)
    n_syn, b = config.synth_tokens, config.bits
    syn_cfgs = {"qvg": ref.qvg_preset("qvg", bits=b, block=min(64, config.synth_head_dim),
                                      num_centroids=config.synth_centroids, chunk=n_syn,
                                      kmeans_iters=config.kmeans_iters, seed=config.seed),
                "qvg_pro": ref.qvg_preset("qvg_pro", bits=b, num_centroids=config.synth_centroids,
                                          chunk=n_syn, kmeans_iters=config.kmeans_iters,
                                          seed=config.seed),
                "kivi": ref.KIVIConfig(bits=b, group=32, block=32, residual=n_syn)}
    metrics["synthetic"] = {m: quality.synthetic_error(q, k, v, c, jax.random.fold_in(key, 7))
                            for m, c in syn_cfgs.items()}
    bar.update()
    bar.close()
    metrics["config"] = {"head_dim": d, "context": seq, "prompt_len": prompt_len,
                         "windows": int(windows.shape[0]), **{m: str(c) for m, c in cfgs.items()}}
    return report.finish(out, title="Quantized KV cache: QVG, KIVI, EntroKV (kv_quant)",
                         metrics=metrics, body=_body(config, metrics, model, unit, cfgs),
                         claim=config.claim, figures={"kv_quant": _figure(config, metrics, unit)})


def _figure(config, metrics, unit):
    """Error vs true bits (LM and synthetic) and held-out bpb per cache (bars from 0, each with its
    value, so a 0.01 difference looks as small as it is; post-RoPE QVG's bar only where it was
    decoded)."""
    syn = metrics["synthetic"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for m in METHODS:
        axes[0].scatter(metrics[f"{m}_effective_bits"], metrics[f"{m}_rel_err"], marker=MARKERS[m],
                        color=COLORS[m], label=f"{LABELS[m]} (LM)")
    for m in SYNTHETIC_METHODS:
        axes[0].scatter(syn[m]["effective_bits"], syn[m]["rel_err"], marker=MARKERS[m],
                        facecolors="none", edgecolors=COLORS[m], label=f"{LABELS[m]} (synthetic)")
    axes[0].set(xlabel="true bits per element", ylabel="attention relative error",
                title=f"Error vs true bits (INT{config.bits})")
    style.legend_outside(axes[0])
    pct = round(100 * config.budget_fraction)
    # colour key: (bar name, its bits-per-byte metric)
    caches = {"full": ("full", "bpb_full"), "qvg": ("QVG", "bpb_qvg"),
              "qvg_post_rope": ("QVG\npost-RoPE", "bpb_qvg_post_rope"),
              "kivi": ("KIVI", "bpb_kivi"),
              "entrokv": (f"EntroKV\n{pct}%", f"bpb_entrokv_{pct}pct"),
              "uniform": (f"uniform\n{pct}%", f"bpb_uniform_{pct}pct")}
    shown = [k for k, (_, key) in caches.items() if metrics[key] is not None]
    bars = axes[1].bar([caches[k][0] for k in shown], [metrics[caches[k][1]] for k in shown],
                       color=[COLORS[k] for k in shown])
    axes[1].bar_label(bars, fmt="%.3f", fontsize=7)
    style.include_baseline(axes[1], 0.0)
    axes[1].set(ylabel=f"held-out {unit}", title="Decoding through each cache")
    axes[1].tick_params(axis="x", labelsize=8)
    return fig


def _body(config, metrics, model, unit, cfgs):
    syn, heads = metrics["synthetic"], metrics["entrokv_heads"]
    pct = round(100 * config.budget_fraction)
    # post-RoPE QVG has no synthetic cells: the synthetic keys carry no RoPE (it would repeat QVG)
    # and no held-out ones where it was not decoded (decode_post_rope off)
    rows = [[m, cfgs[m].bits, metrics[f"{m}_effective_bits"], metrics[f"{m}_compression"],
             metrics[f"{m}_rel_err"],
             *((metrics[f"bpb_{m}"], metrics[f"ppl_{m}"]) if metrics[f"bpb_{m}"] is not None
               else ("not decoded", "-")),
             *((syn[m]["effective_bits"], syn[m]["compression"], syn[m]["rel_err"])
               if m in syn else ("-", "-", "-"))] for m in METHODS]
    rows.append(["full (bf16)", 16, 16.0, 1.0, 0.0, metrics["bpb_full"], metrics["ppl_full"],
                 16.0, 1.0, 0.0])
    cfg = metrics["config"]
    return "\n".join([
        model.describe(), "",
        report.markdown_table(
            ["cache", "nominal bits", "true bits (LM)", "compression (LM)", "attn rel. err (LM)",
             f"held-out {unit}", "perplexity", "true bits (synth)", "compression (synth)",
             "attn rel. err (synth)"], rows), "",
        report.markdown_table(
            ["budget", f"held-out {unit} at {pct}%", "quality (full / budgeted)"],
            [["full cache", metrics["bpb_full"], 1.0],
             ["EntroKV", metrics[f"bpb_entrokv_{pct}pct"], metrics["entrokv_quality"]],
             ["uniform (SnapKV)", metrics[f"bpb_uniform_{pct}pct"],
              metrics["uniform_quality"]]]), "",
        f"EntroKV's per-head normalised entropies span {heads['entropy_min']:.3f} to "
        f"{heads['entropy_max']:.3f} (std {heads['entropy_std']:.3f}); its budgets "
        f"{heads['budget_min']} to {heads['budget_max']} slots against the uniform "
        f"{heads['uniform_budget']}, with {100 * heads['heads_below_window']:.0f}% of heads below "
        f"the {config.entrokv_window}-token observation window (such a head keeps only its most "
        "recent window tokens).", "",
        f"{'Checkpoint' if model.is_checkpoint else 'LM'}: head dim {cfg['head_dim']}, "
        f"{cfg['windows']} held-out windows of {cfg['context']} "
        f"{'tokens' if model.is_checkpoint else 'bytes'}, prompt {cfg['prompt_len']} then "
        f"teacher-forced decoding; chunk {config.chunk} tokens, {config.num_centroids} centroids "
        f"per chunk (the paper's 256 cannot amortise over a {config.chunk}-token chunk). "
        f"Synthetic: {config.synth_tokens} tokens per head, D={config.synth_head_dim}, "
        f"{config.synth_outlier_channels} outlier channels (x10), {config.synth_centroids} "
        "centroids. QVG post-RoPE is QVG's quantizer with the keys stored after RoPE (the paper "
        "stores them before, un-rotating the model's keys to quantize them): the same bits per "
        f"element, attention error {metrics['qvg_post_rope_rel_err']:.3f} against QVG's "
        f"{metrics['qvg_rel_err']:.3f}" + (
            f", perplexity {metrics['ppl_qvg_post_rope']:.4g} against {metrics['ppl_qvg']:.4g}. "
            if metrics["ppl_qvg_post_rope"] is not None
            else " (not decoded here: decode_post_rope = False). ") + (
            f"Decode time ratio QVG / full {metrics['dequant_overhead']:.2f}, KIVI / full "
            f"{metrics['kivi_time_ratio']:.2f} (fused XLA path on {jax.default_backend()}, one run "
            "of the whole teacher-forced decode)." if metrics["dequant_overhead"] is not None
            else "Decode time not measured (decode_timing = False)."),
    ])


if __name__ == "__main__":
    common.app_main(NAME, run)
