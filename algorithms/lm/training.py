"""Training of the byte-level causal transformer LM on a text corpus (next-token cross-entropy).

AdamW with linear warm-up and cosine decay (Loshchilov & Hutter 2019), global-norm clipping,
parameters and optimizer state sharded by :mod:`core.sharding` (FSDP over ``data``, tensor
parallelism over ``model``), the step run by :func:`core.training.train_loop` (checkpoints, exact
resume, a settings fingerprint that refuses another run's checkpoint).

The run is described by an ``ml_collections.ConfigDict`` with the fields of
``experiments/configs/lm.py`` (``model`` holds :class:`models.transformer.TransformerConfig`'s
fields; ``dtype`` by name, ``mlp_dim=0`` for the default width).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from core import config as cfg_lib
from core import sharding, steps
from core.data import ByteTokenizer, TextBatcher, load_corpus
from core.data.text import Corpus
from core.training import (
    LoopConfig,
    LoopResult,
    config_fingerprint,
    make_train_step,
    train_loop,
)
from models.attention import check_platform as check_attention_platform
from models.losses import next_token_nll
from models.transformer import PARAM_AXES, Transformer, TransformerConfig


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> TransformerConfig:
    """The model's :class:`TransformerConfig`, straight from ``config.model`` (causal)."""
    m = config.model.to_dict()
    m["mlp_dim"] = m["mlp_dim"] or None
    m["dtype"] = jnp.dtype(m["dtype"])
    return TransformerConfig(vocab_size=vocab_size, causal=True, **m)


def check_seq_len(seq_len: int, max_len: int) -> None:
    """A run's windows fit its model: RoPE is trained only on positions below ``seq_len``, and the
    model holds ``model.max_len``.

    Raises:
      core.config.FieldError: ``seq_len > max_len``, naming both fields.
    """
    if seq_len > max_len:
        raise cfg_lib.FieldError("expected seq_len <= model.max_len", seq_len=seq_len,
                                 **{"model.max_len": max_len})


def learning_rate(config: ml_collections.ConfigDict) -> optax.Schedule:
    """The learning rate at each update count: linear warm-up from 0 to ``learning_rate`` over
    ``warmup_steps``, then cosine decay to a tenth of it at ``steps`` (constant after), so the
    schedule is built for ``steps`` (:func:`train` refuses to continue a run asked for another)."""
    return optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, config.warmup_steps, max(config.steps, config.warmup_steps + 1),
        end_value=config.learning_rate * 0.1)


def optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW (b1 0.9, b2 0.95) under :func:`learning_rate`, after global-norm clipping at
    ``grad_clip``."""
    return optax.chain(optax.clip_by_global_norm(config.grad_clip),
                       optax.adamw(learning_rate(config), b1=0.9, b2=0.95,
                                   weight_decay=config.weight_decay))


def build_step(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, *,
               abstract: bool = False) -> steps.Step:
    """The train step :func:`train` runs, ``(state, tokens, key) -> (state, metrics)``:
    :func:`lm_loss` under :func:`optimizer`, with its arguments on ``mesh``
    (``core.steps.train_step``): the state of a model initialised at ``seed``, placed by
    ``param_sharding``; int32 [batch_size, seq_len] tokens; the key ``jax.random.key(seed)``.
    ``aux``: the model's ``nnx.GraphDef``. With ``abstract`` nothing is allocated (``make aot``).

    Raises:
      ValueError: a ``model_parallelism`` that does not divide the heads or MLP width, or an
        unknown ``param_sharding``.
    """
    mcfg = model_config(config, ByteTokenizer().vocab_size)
    mcfg.check_model_parallelism(config.model_parallelism)
    graphdef, params = steps.split(lambda: Transformer(mcfg, rngs=nnx.Rngs(config.seed)), abstract)
    tx = optimizer(config)
    return steps.train_step(
        make_train_step(graphdef, tx, lm_loss), params, tx, mesh, param_axes=PARAM_AXES,
        rules=config.param_sharding, logical_sizes=mcfg.logical_sizes, key=config.seed,
        batch=jax.ShapeDtypeStruct((config.batch_size, config.seq_len), jnp.int32), aux=graphdef)


def lm_loss(model: Transformer, tokens: jax.Array, key: jax.Array):
    """Mean next-token NLL (nats) of int32 [B, L] ``tokens``; ``key`` is unused (deterministic)."""
    del key
    return next_token_nll(model(tokens), tokens).mean(), {}


def fingerprint(config: ml_collections.ConfigDict) -> str:
    """The settings that shape a run, but for ``steps``, which :func:`train` checks on its own
    (the learning-rate schedule is built for ``steps``: a checkpoint of a run asked for another
    number of steps is refused with a message that names both)."""
    return config_fingerprint(config.model, config.data_path, config.seed, config.val_fraction,
                              config.seq_len, config.batch_size, config.learning_rate,
                              config.warmup_steps, config.weight_decay, config.grad_clip)


@dataclasses.dataclass(frozen=True)
class TrainedLM:
    """A trained (or restored) LM: ``nnx.split`` parts, its config, the corpus, the loop result."""

    graphdef: nnx.GraphDef
    params: nnx.State
    model_config: TransformerConfig
    corpus: Corpus
    result: LoopResult


def train(config: ml_collections.ConfigDict, workdir: str, progress: bool = True,
          desc: str = "lm") -> TrainedLM:
    """Trains the LM of ``config`` in ``workdir`` (``<workdir>/checkpoints``,
    ``train_metrics.jsonl``), resuming from its newest intact checkpoint; a finished run is only
    restored. The cosine schedule decays to a tenth at ``steps`` (:func:`optimizer`), so a
    checkpoint of a run asked for another number of steps is not resumed from: finishing it
    under this schedule would train neither run.

    Raises:
      ValueError: ``seq_len`` above ``model.max_len`` (:func:`check_seq_len`), a checkpoint of
        another run in ``workdir`` (settings fingerprint), or of this run asked for another
        ``steps`` (one line naming both step counts), a ``model_parallelism`` that does not
        divide the heads or MLP width, an attention implementation the platform lacks, or
        unreadable or unsplittable text at ``data_path`` (naming the file,
        :func:`core.data.text.load_corpus`), or a split shorter than one window of
        ``seq_len + 1`` tokens.
      FileNotFoundError: a ``data_path`` entry does not exist.
    """
    check_seq_len(config.seq_len, config.model.max_len)
    tokenizer = ByteTokenizer()
    corpus = load_corpus(config.data_path or None, val_fraction=config.val_fraction,
                         tokenizer=tokenizer)
    for split, ids, names in (("training", corpus.train, corpus.train_docs),
                              ("held-out", corpus.val, corpus.val_docs)):
        if ids.shape[0] < config.seq_len + 1:
            raise ValueError(
                f"lm: the {split} split of data_path={config.data_path or 'the plays'!r} "
                f"({', '.join(names)}) has {ids.shape[0]} tokens, fewer than one window of "
                f"seq_len + 1 = {config.seq_len + 1}; give a longer text (or several files), or "
                "lower --config.seq_len")
    mcfg = model_config(config, tokenizer.vocab_size)
    mcfg.check_model_parallelism(config.model_parallelism)
    check_attention_platform(mcfg.attention)
    mesh = sharding.make_mesh(config.model_parallelism)
    step = build_step(config, mesh)
    state, _, key = step.args
    batches = TextBatcher(corpus.train, config.batch_size, config.seq_len, seed=config.seed)
    result = train_loop(
        step.fn, state, batches, key,
        LoopConfig(num_steps=config.steps, log_every=config.log_every,
                   checkpoint_every=config.checkpoint_every, progress=progress, desc=desc),
        workdir=workdir, put_batch=lambda b: sharding.shard_batch(b, mesh),
        fingerprint=fingerprint(config), schedule_steps=int(config.steps))
    return TrainedLM(step.aux, result.state["params"], mcfg, corpus, result)
