"""Experiment ``lm``: a causal byte-level transformer on the Shakespeare plays.

Trains on the training plays, reports bits per byte on held-out plays next to unigram and bigram
baselines fitted on the same split, samples text, and leaves its checkpoint in
``<workdir>/lm/checkpoints`` for the KV-cache experiments (:func:`load_trained`).

    python -m experiments.lm --config=experiments/configs/lm.py:tiny --workdir=workdir
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np
import optax
from flax import nnx

from core import report, sharding
from core.data import ByteTokenizer, TextBatcher, load_corpus
from core.data.text import sequential_windows
from core.training import (
    LoopConfig,
    config_fingerprint,
    init_train_state,
    make_train_step,
    train_loop,
)
from experiments import common
from models.attention import check_platform as check_attention_platform
from models.losses import next_token_nll
from models.sampling import generate
from models.transformer import (
    PARAM_AXES,
    Transformer,
    TransformerConfig,
    forward_flops_per_token,
    param_count,
)

NAME = "lm"


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
    """The model's :class:`TransformerConfig`, straight from ``config.model`` (``mlp_dim=0``: the
    default width; ``dtype`` by name)."""
    m = config.model.to_dict()
    m["mlp_dim"] = m["mlp_dim"] or None
    m["dtype"] = jnp.dtype(m["dtype"])
    return TransformerConfig(vocab_size=vocab_size, causal=True, **m)


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW with linear warmup and cosine decay, global-norm clipping."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, config.warmup_steps, max(config.steps, config.warmup_steps + 1),
        end_value=config.learning_rate * 0.1)
    return optax.chain(optax.clip_by_global_norm(config.grad_clip),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=config.weight_decay))


def lm_loss(model: Transformer, tokens: jax.Array, key: jax.Array):
    del key
    nll = next_token_nll(model(tokens), tokens)
    return nll.mean(), {}


@functools.partial(jax.jit, static_argnames="graphdef")
def _window_nll(graphdef, params, windows):
    model = nnx.merge(graphdef, params)
    return next_token_nll(model(windows), windows).sum(), windows.shape[0] * (windows.shape[1] - 1)


def heldout_bpb(graphdef, params, windows: np.ndarray, batch_size: int = 32) -> float:
    """Bits per byte of next-token prediction over ``windows`` [n, L] (positions 1..L-1)."""
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch_size):
        s, c = _window_nll(graphdef, params, jnp.asarray(windows[i:i + batch_size]))
        total += float(s)
        count += int(c)
    return total / count / math.log(2.0)


def ngram_bpb(train: np.ndarray, windows: np.ndarray, vocab: int = 256) -> tuple[float, float]:
    """(unigram, bigram) bits per byte on the same predicted positions as :func:`heldout_bpb`,
    with add-one (Laplace) smoothing fitted on ``train``."""
    uni = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    uni /= uni.sum()
    big = np.ones((vocab, vocab))
    np.add.at(big, (train[:-1], train[1:]), 1.0)
    big /= big.sum(axis=1, keepdims=True)
    prev, nxt = windows[:, :-1].ravel(), windows[:, 1:].ravel()
    return float(-np.log2(uni[nxt]).mean()), float(-np.log2(big[prev, nxt]).mean())


def build(config: ml_collections.ConfigDict, tokenizer: ByteTokenizer):
    """(graphdef, initial train state, tx, model config) for ``config``."""
    mcfg = model_config(config, tokenizer.vocab_size)
    graphdef, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(config.seed)))
    tx = optimizer(config)
    return graphdef, init_train_state(params, tx), tx, mcfg


def train(config: ml_collections.ConfigDict, workdir: str, progress: bool = True):
    """Trains (or resumes) the LM in ``workdir``. Returns (graphdef, params, corpus, loop result)."""
    tokenizer = ByteTokenizer()
    corpus = load_corpus(config.corpus or None, val_fraction=config.val_fraction,
                         tokenizer=tokenizer)
    if config.seq_len > config.model.max_len:
        raise ValueError(f"lm config: seq_len={config.seq_len} exceeds model.max_len="
                         f"{config.model.max_len}")
    graphdef, state, tx, mcfg = build(config, tokenizer)
    mcfg.check_model_parallelism(config.model_parallelism)
    check_attention_platform(mcfg.attention)
    mesh = sharding.make_mesh(config.model_parallelism)
    state, state_sharding = sharding.shard_train_state(
        state, PARAM_AXES, mesh, tx, rules=config.param_sharding, logical_sizes=mcfg.logical_sizes)
    batches = TextBatcher(corpus.train, config.batch_size, config.seq_len, seed=config.seed)
    result = train_loop(
        sharding.constrain_step(make_train_step(graphdef, tx, lm_loss), state_sharding), state,
        batches, jax.random.key(config.seed),
        LoopConfig(num_steps=config.steps, log_every=config.log_every,
                   checkpoint_every=config.checkpoint_every, progress=progress, desc=NAME),
        workdir=workdir, put_batch=lambda b: sharding.shard_batch(b, mesh),
        # what shapes the run (not `steps`: a finished run can be extended by raising it)
        fingerprint=config_fingerprint(config.model, config.corpus, config.seed,
                                       config.val_fraction, config.seq_len, config.batch_size,
                                       config.learning_rate, config.warmup_steps,
                                       config.weight_decay, config.grad_clip))
    return graphdef, result.state["params"], corpus, result


def load_trained(workdir: str, config: ml_collections.ConfigDict | str | None = None):
    """The trained ``lm`` model of ``workdir`` (trained now if absent or unfinished).

    Args:
      workdir: the run's work directory (the model lives in ``<workdir>/lm``).
      config: the lm config, or a variant name of ``experiments/configs/lm.py`` (default ``tiny``);
        it must match the one the checkpoint was trained with.

    Returns:
      (graphdef, params, model config, corpus).
    """
    from experiments.configs import lm as lm_config

    if config is None or isinstance(config, str):
        config = lm_config.get_config(config or "tiny")
    graphdef, params, corpus, _ = train(config, common.experiment_dir(workdir, NAME),
                                        progress=False)
    return graphdef, params, model_config(config, ByteTokenizer().vocab_size), corpus


def run(config: ml_collections.ConfigDict, workdir: str) -> report.Section:
    out = common.experiment_dir(workdir, NAME)
    graphdef, params, corpus, result = train(config, out)
    tokenizer = ByteTokenizer()
    mcfg = model_config(config, tokenizer.vocab_size)
    windows = sequential_windows(corpus.val, config.seq_len, config.eval_windows)
    val_bpb = heldout_bpb(graphdef, params, windows)
    unigram, bigram = ngram_bpb(corpus.train, windows)

    # Throughput over the steps run in this process (includes compilation of the first step); a
    # run restored from its final checkpoint trained nothing here and has no throughput.
    tokens = result.steps_run * config.batch_size * config.seq_len
    tokens_per_s = tokens / result.seconds if result.steps_run > 0 and result.seconds > 0 else None
    prompt = tokenizer.encode("ROMEO.\n")[None, :]
    sample_ids, _ = generate(graphdef, params, jnp.asarray(prompt), jax.random.key(1),
                             max_new_tokens=min(config.sample_len,
                                                config.model.max_len - prompt.shape[1]),
                             temperature=0.8,
                             banned_ids=(tokenizer.mask_id, tokenizer.bos_id))
    sample = tokenizer.decode(np.concatenate([prompt[0], np.asarray(sample_ids[0])]))

    metrics = {
        "val_bpb": val_bpb, "unigram_bpb": unigram, "bigram_bpb": bigram,
        "train_tokens_per_s": tokens_per_s, "params": param_count(params),
        "steps": config.steps, "flops_per_token": forward_flops_per_token(mcfg, config.seq_len),
        "val_docs": list(corpus.val_docs), "train_bytes": int(corpus.train.size),
        "val_bytes": int(corpus.val.size), "resumed_from": result.resumed_from,
    }
    report.write_json(os.path.join(out, "metrics.json"), metrics)

    hist = report.read_json_lines(os.path.join(out, "train_metrics.jsonl"))
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([h["step"] for h in hist], [h["loss"] / math.log(2) for h in hist], label="train")
    ax.axhline(val_bpb, color="C1", ls="--", label=f"held-out {val_bpb:.3f}")
    ax.axhline(bigram, color="C2", ls=":", label=f"bigram {bigram:.3f}")
    ax.set(xlabel="step", ylabel="bits per byte", title="Byte-level LM on Shakespeare")
    ax.legend()
    fig_path = report.save_figure(fig, os.path.join(out, "loss.png"))

    body = "\n".join([
        report.markdown_table(
            ["model", "held-out bits/byte"],
            [["unigram (add-one)", unigram], ["bigram (add-one)", bigram],
             [f"transformer ({metrics['params']:,} params, {config.steps} steps)", val_bpb]]),
        "",
        f"Held-out plays: {', '.join(corpus.val_docs)}. "
        + (f"Training throughput {tokens_per_s:,.0f} tokens/s (including compilation)."
           if tokens_per_s is not None else
           f"Restored from the finished run's checkpoint at step {result.resumed_from}: nothing was "
           "trained in this process, so no throughput is reported."),
        "", "Sample (temperature 0.8):", "", "```", sample, "```",
    ])
    return report.Section(
        title="Byte-level language model (lm)", body=body, figures=[fig_path],
        headline={"method": "Transformer LM (foundation)",
                  "claim": "held-out bpb well under the bigram baseline",
                  "ours": f"{val_bpb:.3f} vs bigram {bigram:.3f} bpb",
                  "reproduces": "yes" if val_bpb < bigram - 0.3 else "no"})


if __name__ == "__main__":
    common.app_main(NAME, run)
