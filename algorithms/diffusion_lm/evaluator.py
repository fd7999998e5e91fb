"""The generative-perplexity evaluator: one causal LM, larger than the models of the comparison and
trained once on the same training split, that scores every family's samples (the role GPT-2 Large
plays in the papers' generative perplexity).

Dimensions: n samples, L sample length.

The evaluator is :mod:`algorithms.lm.training`'s byte-level transformer, trained in its own
directory under a settings fingerprint (so it is trained once and then only restored). Its settings
are ``config.evaluator`` (``model`` fields of :class:`models.transformer.TransformerConfig`,
``seq_len``, ``batch_size``, ``steps``, ``learning_rate``, ``warmup_steps``, ``weight_decay``,
``grad_clip``, ``log_every``, ``checkpoint_every``) with the data fields of the comparison
(``data_path``, ``val_fraction``, ``seed``) and its mesh fields.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from algorithms.lm import evaluation, training
from algorithms.lm.training import TrainedLM
from models.losses import next_token_nll


def evaluator_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The :func:`algorithms.lm.training.train` config of ``config``'s evaluator: its
    ``evaluator`` sub-config plus the comparison's data split and mesh (the same training split)."""
    shared = {k: config[k] for k in ("data_path", "val_fraction", "seed", "model_parallelism",
                                     "param_sharding")}
    return ml_collections.ConfigDict({**config.evaluator.to_dict(), **shared})


def train_evaluator(config: ml_collections.ConfigDict, workdir: str,
                    progress: bool = True) -> TrainedLM:
    """Trains (or restores, when ``workdir`` holds the finished run) the evaluator of ``config``.

    Raises:
      ValueError: ``evaluator.seq_len`` above ``evaluator.model.max_len``, a checkpoint of
        another evaluator in ``workdir``, or an unreadable corpus (see
        :func:`algorithms.lm.training.train`).
    """
    return training.train(evaluator_config(config), workdir, progress=progress,
                          desc="evaluator")


@functools.partial(jax.jit, static_argnames="graphdef")
def _sample_nll(graphdef, params, samples):
    return next_token_nll(nnx.merge(graphdef, params)(samples), samples).mean(axis=1)


def sample_nll(evaluator: TrainedLM, samples: np.ndarray, batch_size: int = 32) -> np.ndarray:
    """Each sample's mean next-token NLL (nats) under the evaluator over positions 2..L (the
    first token has no context): float64 [n] for int ``samples`` [n, L] of data ids.

    Raises:
      ValueError: ``samples`` not [n >= 1, L >= 2], or longer than the evaluator's ``max_len``.
    """
    samples = np.asarray(samples)
    if samples.ndim != 2 or samples.shape[0] < 1 or samples.shape[1] < 2:
        raise ValueError(f"sample_nll: samples must be [n >= 1, L >= 2] token ids, got shape "
                         f"{samples.shape}")
    if samples.shape[1] > evaluator.model_config.max_len:
        raise ValueError(f"sample_nll: samples of length {samples.shape[1]} exceed the "
                         f"evaluator's max_len={evaluator.model_config.max_len}")
    out = [np.asarray(_sample_nll(evaluator.graphdef, evaluator.params,
                                  jnp.asarray(samples[i:i + batch_size], jnp.int32)))
           for i in range(0, samples.shape[0], batch_size)]
    return np.concatenate(out).astype(np.float64)


def perplexity_interval(nll: np.ndarray) -> dict[str, float]:
    """Generative perplexity ``exp(mean nll)`` of per-sample mean NLLs ``nll`` [n] (nats, samples
    drawn independently, all of one length), with the 95% interval ``exp(mean -+ 1.96 s.e.)``
    (s.e. of the mean over samples) and ``log_se`` (that s.e., in nats).

    Raises:
      ValueError: fewer than 2 samples.
    """
    nll = np.asarray(nll, np.float64)
    if nll.ndim != 1 or nll.size < 2:
        raise ValueError(f"perplexity_interval: need [n >= 2] per-sample NLLs, got shape "
                         f"{nll.shape}")
    m, se = float(nll.mean()), float(nll.std(ddof=1) / math.sqrt(nll.size))
    return {"ppl": math.exp(m), "lo": math.exp(m - 1.96 * se), "hi": math.exp(m + 1.96 * se),
            "log_se": se, "n": int(nll.size)}


def generative_perplexity(evaluator: TrainedLM, samples: np.ndarray, batch_size: int = 32
                          ) -> float:
    """``exp`` of the evaluator's mean next-token NLL (nats) over positions 2..L of every sample
    (the first token has no context), for int ``samples`` [n, L] of data ids.

    Raises:
      ValueError: ``samples`` not [n >= 1, L >= 2], or longer than the evaluator's ``max_len``.
    """
    samples = np.asarray(samples)
    if samples.ndim == 2 and samples.shape[1] > evaluator.model_config.max_len:
        raise ValueError(f"generative_perplexity: samples of length {samples.shape[1]} exceed the "
                         f"evaluator's max_len={evaluator.model_config.max_len}")
    bpb = evaluation.heldout_bpb(evaluator.graphdef, evaluator.params, samples, batch_size)
    return float(math.exp(bpb * math.log(2.0)))
