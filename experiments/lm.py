"""Experiment ``lm``: a causal byte-level transformer on the Shakespeare plays or your own text.

Trains on the training split (:mod:`algorithms.lm.training`), reports bits per byte on the held-out
split next to unigram and bigram baselines fitted on the same split
(:mod:`algorithms.lm.evaluation`), samples text, and leaves its checkpoint in
``<workdir>/lm/checkpoints`` for the KV-cache experiments. The text is the config field
``data_path`` (empty: the Shakespeare plays, held out by whole play; a single file: its tail is
held out, see :func:`core.data.text.load_corpus`); the sample's prompt is ``ROMEO.`` on the plays
and the first line of the held-out text otherwise.

    python -m experiments.lm --config=experiments/configs/lm.py:tiny --workdir=workdir
    python -m experiments.lm --workdir=workdir --config.data_path=my_text.txt
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from algorithms.lm import evaluation, training
from core import figures as style
from core import report
from core.data import ByteTokenizer
from core.data.text import sequential_windows
from experiments import common
from models.sampling import generate
from models.transformer import forward_flops_per_token, param_count

NAME = "lm"
# Bytes of held-out text a prompt takes at most (cut after its first line break).
PROMPT_BYTES = 32


def sample_prompt(config: ml_collections.ConfigDict, val: np.ndarray,
                  tokenizer: ByteTokenizer) -> np.ndarray:
    """int32 [P] prompt ids: ``"ROMEO.\n"`` on the Shakespeare plays; on the text of
    ``data_path`` the held-out text's first line, at most ``PROMPT_BYTES`` bytes and half the
    model's ``max_len``."""
    if not config.data_path:
        return tokenizer.encode("ROMEO.\n")
    head = np.asarray(val[:max(1, min(PROMPT_BYTES, config.model.max_len // 2))], np.int32)
    newline = np.flatnonzero(head == tokenizer.encode("\n")[0])
    return head[:newline[0] + 1] if newline.size and newline[0] > 0 else head


def data_name(data_path: str) -> str:
    """How a figure names the text of ``data_path``: ``"Shakespeare"`` for the default, else the
    first path's name (``"..."`` after it when there are several)."""
    if not data_path:
        return "Shakespeare"
    first = data_path.split(",")[0].rstrip("/")
    return os.path.basename(first) + ("..." if "," in data_path else "")


def loss_figure(hist: list[dict], val_bpb: float, bigram_bpb: float,
                text_name: str = "Shakespeare") -> plt.Figure:
    """The training loss in bits per byte against the step (``hist``: the records of
    ``train_metrics.jsonl``, keys ``step`` and ``loss`` in nats per byte), with the held-out and
    bigram bits per byte as horizontal lines; ``text_name`` names the text in the title."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.plot([h["step"] for h in hist], [h["loss"] / math.log(2) for h in hist], label="train (batch)")
    ax.axhline(val_bpb, color="C1", ls="--", label=f"held-out {val_bpb:.3f}")
    ax.axhline(bigram_bpb, color="C2", ls=":", label=f"bigram {bigram_bpb:.3f}")
    ax.set(xlabel="step", ylabel="bits per byte", title=f"Byte-level LM on {text_name}")
    style.integer_ticks(ax, "x")
    style.legend_outside(ax)
    return fig


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    lm = training.train(config, out, desc=NAME)
    corpus, result, tokenizer = lm.corpus, lm.result, ByteTokenizer()
    windows = sequential_windows(corpus.val, config.seq_len, config.eval_windows)
    val_bpb = evaluation.heldout_bpb(lm.graphdef, lm.params, windows)
    unigram, bigram = evaluation.ngram_bpb(corpus.train, windows, tokenizer.vocab_size)

    # Throughput over the steps run in this process (includes compilation of the first step); a
    # run restored from its final checkpoint trained nothing here and has no throughput.
    tokens = result.steps_run * config.batch_size * config.seq_len
    tokens_per_s = tokens / result.seconds if result.steps_run > 0 and result.seconds > 0 else None
    prompt = sample_prompt(config, corpus.val, tokenizer)[None, :]
    sample_ids, _ = generate(lm.graphdef, lm.params, jnp.asarray(prompt), jax.random.key(1),
                             max_new_tokens=min(config.sample_len,
                                                config.model.max_len - prompt.shape[1]),
                             temperature=0.8, banned_ids=(tokenizer.mask_id, tokenizer.bos_id))
    sample = tokenizer.decode(np.concatenate([prompt[0], np.asarray(sample_ids[0])]))

    metrics = {
        "val_bpb": val_bpb, "unigram_bpb": unigram, "bigram_bpb": bigram,
        "train_tokens_per_s": tokens_per_s, "params": param_count(lm.params),
        "steps": config.steps, "flops_per_token": forward_flops_per_token(lm.model_config,
                                                                          config.seq_len),
        "val_docs": list(corpus.val_docs), "train_bytes": int(corpus.train.size),
        "val_bytes": int(corpus.val.size), "resumed_from": result.resumed_from,
    }
    hist = report.read_json_lines(os.path.join(out, "train_metrics.jsonl"))
    fig = loss_figure(hist, val_bpb, bigram, data_name(config.data_path))

    body = "\n".join([
        report.markdown_table(
            ["model", "held-out bits/byte"],
            [["unigram (add-one)", unigram], ["bigram (add-one)", bigram],
             [f"transformer ({metrics['params']:,} params, {config.steps} steps)", val_bpb]]),
        "",
        f"Held-out {'text' if config.data_path else 'plays'}: {', '.join(corpus.val_docs)}. "
        + (f"Training throughput {tokens_per_s:,.0f} tokens/s (including compilation)."
           if tokens_per_s is not None else
           f"Restored from the finished run's checkpoint at step {result.resumed_from}: nothing was "
           "trained in this process, so no throughput is reported."),
        "", "Sample (temperature 0.8):", "", "```", sample, "```",
    ])
    return report.finish(out, title="Byte-level language model (lm)", metrics=metrics, body=body,
                         claim=config.claim, figures={"loss": fig})


# ----------------------------------------------------------------------------------------------
# Ahead-of-time compile of the paper step (``experiments.aot``)

# Larger models for the scale rows (memory): the paper batch (B 256 x L 1024) and one sequence per
# chip of a 16-chip slice, the blocks fully rematerialised and scanned, as one would run them
# (unrolled, the 1.1B step needs 18.9 GiB of temporaries on v5e against 6.1 GiB scanned). XLA's
# cost analysis counts a scanned block once, so those rows have no roofline; the 4-block row at
# the 1.1B model's width, unrolled, gives the roofline at that width.
SCALE_ROWS = {
    "lm/train@1.1B": {"model.d_model": 2048, "model.num_layers": 24, "model.num_heads": 16,
                      "model.num_kv_heads": 4, "model.remat": "full", "model.scan_layers": True},
    # the 1.1B model's width and batch over 4 unrolled blocks: its roofline (MFU by width)
    "lm/train@d2048x4": {"model.d_model": 2048, "model.num_layers": 4, "model.num_heads": 16,
                         "model.num_kv_heads": 4, "model.remat": "full"},
    "lm/train@5.6B-b16": {"model.d_model": 4096, "model.num_layers": 32, "model.num_heads": 32,
                          "model.num_kv_heads": 8, "model.remat": "full",
                          "model.scan_layers": True, "batch_size": 16},
}


def train_step_spec(config: ml_collections.ConfigDict, devices):
    """:func:`algorithms.lm.training.build_step` of ``config``, abstract, on a mesh of
    ``devices``, with its model FLOPs and sizes: a ``core.aot_steps.StepSpec``."""
    from core import aot_steps, sharding

    step = training.build_step(
        config, sharding.make_mesh(config.model_parallelism, devices=devices), abstract=True)
    mcfg = training.model_config(config, ByteTokenizer().vocab_size)
    b, L = config.batch_size, config.seq_len
    n = param_count(step.args[0]["params"])
    return aot_steps.StepSpec.of(
        step, model_flops=3.0 * forward_flops_per_token(mcfg, L) * b * L, params=n,
        shape=(f"B {b} x L {L}, d {mcfg.d_model} x {mcfg.num_layers} "
               f"{'scanned ' if mcfg.scan_layers else ''}layers, {mcfg.dtype.name}, "
               f"{mcfg.attention} attention, remat {mcfg.remat}, {n / 1e6:.0f}M params"),
        layer_loop=mcfg.scan_layers)


def paper_steps():
    """The AOT rows of ``lm``: the ``paper`` train step and larger models (:data:`SCALE_ROWS`),
    as ``core.aot_steps.PaperSteps``."""
    from experiments.configs import lm as lm_config

    def build(overrides):
        def builder(devices):
            config = lm_config.get_config("paper")
            config.update_from_flattened_dict(overrides)
            return train_step_spec(config, devices)
        return builder

    return {"lm/train": (build({}), "byte LM train step"),
            **{name: (build(o), "byte LM train step, larger model")
               for name, o in SCALE_ROWS.items()}}


if __name__ == "__main__":
    common.app_main(NAME, run)
