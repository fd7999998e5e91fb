"""The model and held-out text that a KV-cache quality experiment measures.

``sparse_decode`` and ``kv_quant`` measure kept softmax mass, attention-output error, needle recall
and held-out NLL on the queries, keys and values of a real model. By default that model is the
project's byte-level LM (trained by the ``lm`` experiment into ``<workdir>/lm``); with the config
field ``checkpoint=DIR`` it is a local Hugging Face Llama / Qwen2 / Mistral directory
(``config.json``, ``*.safetensors``, ``tokenizer.json``; :mod:`models.hf_checkpoint`), read with
its own tokenizer. The text is the config field ``data_path`` (a UTF-8 file) or, when empty, for a
checkpoint the English prose it cannot have seen in training (:data:`core.data.text.UNSEEN_PROSE`,
written after its release) and for the byte LM its own held-out Shakespeare plays.

When the lm's checkpoint is missing or unfinished, :func:`load` trains it first, saying so in
one line and then showing the lm's usual progress (a stall watcher sees its output and its files in
``<workdir>/lm``).

Nothing is downloaded: the numbers describe whatever weights the directory holds, and the report's
note says which kind they are (:func:`weights_note`: trained, or no better than chance on the text).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from core import files
from core.data.files import read_text
from core.data.text import UNSEEN_PROSE, ByteTokenizer, sequential_windows
from models import capture, llama, transformer

# Tokens of the text on which :func:`weights_note` measures the checkpoint's loss.
NOTE_TOKENS = 128
# A loss at or above this fraction of log V (a uniform guess over the vocabulary) is untrained.
CHANCE_FRACTION = 0.9
DEFAULT_TEXT = "English prose written after the model's release (core.data.text.UNSEEN_PROSE)"


@dataclasses.dataclass(frozen=True)
class MeasuredModel:
    """A decoder in functional form, its held-out token ids and a description.

    Attributes:
      graphdef, params: ``nnx.split`` of a :class:`models.transformer.Transformer` (byte LM) or a
        :class:`models.llama.Llama` (checkpoint).
      config: its ``TransformerConfig`` / ``LlamaConfig``.
      text: int32 [N] token ids of the held-out text (no special tokens).
      prefix: special ids each window starts with (the tokenizer's BOS, if it adds one).
      info: what was measured, written to metrics.json under ``model``: ``kind``
        (``"byte_lm"`` or ``"checkpoint"``), ``checkpoint`` (its path), ``architecture``, sizes,
        ``text``, ``text_tokens``, and for a checkpoint ``note`` (:func:`weights_note`),
        ``note_nll`` and ``note_tokens``.
      tokenizer: a checkpoint's tokenizer (``encode(text, add_special_tokens=False)``,
        ``decode(ids)``); ``None`` for the byte LM (:class:`core.data.text.ByteTokenizer`).
    """

    graphdef: Any
    params: Any
    config: Any
    text: np.ndarray
    prefix: tuple[int, ...]
    info: dict
    tokenizer: Any = None

    @property
    def is_checkpoint(self) -> bool:
        return self.info["kind"] == "checkpoint"

    @property
    def rope(self):
        """The model's RoPE (:func:`models.capture.model_rope`)."""
        return capture.model_rope(self.config)

    @functools.cached_property
    def scanned(self) -> tuple[Any, Any]:
        """(graphdef, params) of the same model with its blocks stacked (``scan_layers=True``,
        :func:`models.transformer.scanned`), built once: one compiled block instead of one per
        layer. For programs that compile once and run briefly (a prefill and a few generated
        tokens: about a fifth of the compile time of SmolLM2's 30 layers unrolled), not for long
        decode loops (slower per step on CPU than the unrolled layout).

        Raises:
          ValueError: a Llama whose layers have different sliding windows.
        """
        if self.config.scan_layers:
            return self.graphdef, self.params
        to_scanned = llama.scanned if isinstance(self.config, llama.LlamaConfig) else \
            transformer.scanned
        _, graphdef, params = to_scanned(self.config, self.params)
        return graphdef, params

    def windows(self, length: int, count: int) -> np.ndarray:
        """int32 [n, length], n = min(count, what the text holds): each window is :attr:`prefix`
        then the next ``length - len(prefix)`` text tokens (non-overlapping, evenly spread over
        the text as :func:`core.data.text.sequential_windows`).

        Raises:
          ValueError: ``length`` does not exceed the prefix, or the text is shorter than one
            window (naming the text).
        """
        body = length - len(self.prefix)
        if body < 1:
            raise ValueError(f"window length {length}: expected more than the tokenizer's "
                             f"{len(self.prefix)} prefix token(s)")
        if self.text.size < body:
            raise ValueError(f"text {self.info['text']}: {self.text.size} tokens are fewer than one "
                             f"window of {body} (plus {len(self.prefix)} prefix token(s)); give a "
                             "longer text or a shorter context")
        w = sequential_windows(self.text, body, count)
        if self.prefix:
            pre = np.broadcast_to(np.asarray(self.prefix, np.int32), (w.shape[0], len(self.prefix)))
            w = np.concatenate([pre, w], axis=1)
        return w

    def describe(self) -> str:
        """One paragraph for a report: which model and text were measured (and, for a checkpoint,
        what its weights are, :func:`weights_note`)."""
        i = self.info
        sizes = (f"{i['layers']} layer{'s' if i['layers'] != 1 else ''}, {i['heads']} query / "
                 f"{i['kv_heads']} kv heads, head dim "
                 f"{i['head_dim']}, max_len {i['max_len']}, {i['params']:,} parameters")
        if self.is_checkpoint:
            return (f"Model measured: {i.get('source', i['checkpoint'])} "
                    f"({i['architecture']}; {sizes}) on {i['text']} ({i['text_tokens']:,} tokens of "
                    f"its own tokenizer). {i['note']}")
        return (f"Model measured: the {i['architecture']} of the lm experiment "
                f"(`{i['checkpoint']}`, lm_config "
                f"{i['lm_config']!r}; {sizes}) on {i['text']} ({i['text_tokens']:,} bytes).")


def _sizes(cfg) -> dict:
    return {"layers": cfg.num_layers, "heads": cfg.num_heads, "kv_heads": cfg.kv_heads,
            "head_dim": cfg.dim_per_head, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
            "max_len": cfg.max_len}


def _read_text(path: str) -> str:
    if not os.path.exists(path):
        raise ValueError(f"config field data_path = {path!r}: no such file (expected a UTF-8 text "
                         "file, or '' for the default text)")
    return read_text(path, "config field data_path =")


def weights_note(nll: float, tokens: int, vocab_size: int) -> str:
    """What a report says about a local checkpoint's weights, from its mean next-token loss.

    Args:
      nll: mean next-token negative log-likelihood, nats per token, on ``tokens`` text tokens.
      tokens: how many tokens it was measured on.
      vocab_size: V; a uniform guess scores ``log V``.

    Returns:
      A loss of at least :data:`CHANCE_FRACTION` x ``log V`` says the weights are untrained (a
      random test checkpoint: the numbers only prove the plumbing); a lower one gives the loss
      beside ``log V``. Both say the weights were read locally, nothing downloaded.
    """
    chance = math.log(vocab_size)
    measured = (f"{nll:.2f} nats per token on the first {tokens} tokens of the text, against "
                f"log V = {chance:.2f} for a uniform guess over its {vocab_size:,} tokens")
    if nll >= CHANCE_FRACTION * chance:
        return (f"Its weights, read as given (nothing is downloaded), predict the "
                f"text no better than chance ({measured}): they are untrained, e.g. a random test "
                "checkpoint, so these numbers only prove the plumbing, not the method.")
    return (f"Its weights were read as given (nothing is downloaded) "
            f"and predict the text: {measured}.")


def _mean_nll(graphdef, params, ids: np.ndarray) -> float:
    """Mean next-token loss (nats) of int32 [L] ``ids`` under the model (one compiled program)."""
    return float(_mean_nll_jit(graphdef, params, jnp.asarray(ids, jnp.int32)[None]))


@functools.partial(jax.jit, static_argnums=0)
def _mean_nll_jit(graphdef, params, tokens: jax.Array) -> jax.Array:
    from flax import nnx

    from models.losses import next_token_nll

    return next_token_nll(nnx.merge(graphdef, params)(tokens), tokens).mean()


def _lm_checkpoint_step(lm_dir: str) -> int | None:
    """The newest checkpoint step in ``<lm_dir>/checkpoints``, or ``None`` when there is none."""
    from core.checkpoint import Checkpointer

    directory = files.join(lm_dir, "checkpoints")
    if not files.exists(directory):
        return None
    ckpt = Checkpointer(directory)
    try:
        return ckpt.latest_step()
    finally:
        ckpt.close()


def load(config: ml_collections.ConfigDict, workdir: str,
         experiment: str = "this experiment") -> MeasuredModel:
    """The model ``config`` names (fields ``checkpoint``, ``text``, ``lm_config``).

    Without ``checkpoint``, the lm experiment's model in ``<workdir>/lm`` is restored; when its
    checkpoint is missing or short of the lm config's ``steps``, it is trained there first: one
    line on stderr says so and why (naming ``experiment``), then the lm's progress bar runs.

    Raises:
      ValueError: an unreadable or unsupported checkpoint or tokenizer (naming the file, see
        :mod:`models.hf_checkpoint`), a missing or non-UTF-8 text file, a text that encodes to
        no tokens, or token ids outside the model's vocabulary.
    """
    if config.checkpoint:
        return _load_checkpoint(config.checkpoint, config.data_path)
    from algorithms.lm import training
    from experiments import common
    from experiments.configs import lm as lm_config

    # The lm experiment's model (trained now if absent or unfinished; a finished run is restored).
    lm_cfg = lm_config.get_config(config.lm_config or "tiny")
    lm_dir = common.experiment_dir(workdir, "lm")
    step = _lm_checkpoint_step(lm_dir)
    if step is None or step < lm_cfg.steps:
        why = (f"no lm checkpoint in {files.display(lm_dir)}" if step is None else
               f"the lm checkpoint in {files.display(lm_dir)} stops at step {step}")
        print(f"{experiment}: training the lm first ({lm_cfg.steps} steps of lm config "
              f"{config.lm_config or 'tiny'!r}): {why}, and its model is the one "
              f"{experiment} measures", file=sys.stderr, flush=True)
    lm = training.train(lm_cfg, lm_dir, desc=f"lm (for {experiment})")
    graphdef, params, mcfg, corpus = lm.graphdef, lm.params, lm.model_config, lm.corpus
    if config.data_path:
        text = ByteTokenizer().encode(_read_text(config.data_path))
    else:
        text = corpus.val
    info = {"kind": "byte_lm", "checkpoint": os.path.join(workdir, "lm"),
            "architecture": "byte-level transformer LM",
            "lm_config": config.lm_config or "tiny", **_sizes(mcfg),
            "params": int(sum(x.size for x in jax.tree.leaves(params))),
            "text": config.data_path or "the lm's held-out text", "text_tokens": int(text.size)}
    return MeasuredModel(graphdef, params, mcfg, np.asarray(text, np.int32), (), info)


def _load_checkpoint(path: str, text_path: str) -> MeasuredModel:
    """A Hugging Face checkpoint and its held-out text (see :func:`load`)."""
    from models import checkpoints  # a directory, a .gguf file or a packaged model's short name

    tokenizer = checkpoints.load_tokenizer(path)
    ck = checkpoints.load_checkpoint(path)
    if text_path:
        text = _read_text(text_path)
    else:  # text written after the checkpoint's release
        text = read_text(UNSEEN_PROSE, "the default held-out text")
    ids = np.asarray(tokenizer.encode(text, add_special_tokens=False), np.int32)
    if ids.size == 0:
        raise ValueError(f"text {text_path or DEFAULT_TEXT}: encodes to no tokens")
    prefix = tokenizer.prefix_ids()
    k = len(prefix)
    if k and ids.size > k and tuple(ids[:k].tolist()) == tuple(prefix):
        # the text itself begins with the prefix's text (e.g. "<s>"): every window already starts
        # with the prefix, so the first one would hold it twice
        logging.warning("text %s begins with the tokenizer's prefix %s; that copy was dropped "
                        "(each window starts with it once)", text_path or DEFAULT_TEXT, list(prefix))
        ids = ids[k:]
    top = max(int(ids.max()), *prefix) if prefix else int(ids.max())
    if top >= ck.config.vocab_size:
        raise ValueError(f"checkpoint {path}: token id {top} of its tokenizer is outside the "
                         f"model's vocabulary of {ck.config.vocab_size}")
    first = np.concatenate([np.asarray(prefix, np.int32),
                            ids[:min(NOTE_TOKENS, ck.config.max_len) - k]])
    nll = _mean_nll(ck.graphdef, ck.params, first) if first.size > 1 else None
    resolved, fmt = checkpoints.resolve(path)
    packaged = checkpoints.PACKAGED.get(path)
    source = (f"the packaged {packaged.description}, `{path}` (from {packaged.distribution})"
              if packaged else f"{'GGUF file' if fmt == 'gguf' else 'Hugging Face checkpoint'} "
              f"`{os.path.abspath(resolved)}`")
    info = {"kind": "checkpoint", "checkpoint": path if packaged else os.path.abspath(resolved),
            "format": fmt, "source": source,
            "architecture": ck.config.model_type, **_sizes(ck.config),
            "params": int(sum(x.size for x in jax.tree.leaves(ck.params))),
            "text": text_path or DEFAULT_TEXT, "text_tokens": int(ids.size),
            "prefix_tokens": list(prefix), "note_nll": nll, "note_tokens": int(first.size),
            "note": weights_note(nll, int(first.size), ck.config.vocab_size)
            if first.size > 1 else "Its weights were read as given (nothing is downloaded); the "
            "text is too short to measure them."}
    return MeasuredModel(ck.graphdef, ck.params, ck.config, ids, prefix, info, tokenizer)
