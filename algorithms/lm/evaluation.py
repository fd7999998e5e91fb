"""Held-out bits per byte of a causal LM and of add-one-smoothed n-gram baselines.

Dimensions: n windows, L window length (tokens), V vocabulary. Bits per byte = mean next-token
negative log-likelihood in nats / ln 2, over positions 1..L-1 of every window (position 0 has no
context), so the LM and the baselines are scored on the same predicted tokens.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.losses import next_token_nll


@functools.partial(jax.jit, static_argnames="graphdef")
def _window_nll(graphdef, params, windows):
    model = nnx.merge(graphdef, params)
    return next_token_nll(model(windows), windows).sum(), windows.shape[0] * (windows.shape[1] - 1)


def heldout_bpb(graphdef, params, windows: np.ndarray, batch_size: int = 32) -> float:
    """Bits per byte of a causal LM over ``windows``.

    Args:
      graphdef, params: ``nnx.split`` of a :class:`models.transformer.Transformer` (causal).
      windows: int [n, L] token ids, L >= 2.
      batch_size: windows per jitted call (the last call may be smaller: one more compile).

    Returns:
      Mean next-token NLL over positions 1..L-1, in bits.

    Raises:
      ValueError: ``windows`` not 2-D with L >= 2 and n >= 1, or ``batch_size`` < 1.
    """
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[0] < 1 or windows.shape[1] < 2:
        raise ValueError(f"heldout_bpb: windows must be [n >= 1, L >= 2] token ids, got shape "
                         f"{windows.shape}")
    if batch_size < 1:
        raise ValueError(f"heldout_bpb: batch_size must be >= 1, got {batch_size}")
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch_size):
        s, c = _window_nll(graphdef, params, jnp.asarray(windows[i:i + batch_size]))
        total += float(s)
        count += int(c)
    return total / count / math.log(2.0)


def ngram_bpb(train: np.ndarray, windows: np.ndarray, vocab: int = 256) -> tuple[float, float]:
    """(unigram, bigram) bits per byte with add-one (Laplace) smoothing fitted on ``train``.

    Scored on the same predicted positions as :func:`heldout_bpb` (1..L-1 of each window; the
    bigram conditions on the previous token of the window).

    Args:
      train: int [T] training token ids in [0, vocab).
      windows: int [n, L] held-out token ids in [0, vocab).
      vocab: V.

    Returns:
      (unigram bits per byte, bigram bits per byte).

    Raises:
      ValueError: token ids outside [0, vocab), or windows that are not [n, L >= 2].
    """
    train, windows = np.asarray(train), np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < 2:
        raise ValueError(f"ngram_bpb: windows must be [n, L >= 2], got shape {windows.shape}")
    for name, x in (("train", train), ("windows", windows)):
        if x.size and (x.min() < 0 or x.max() >= vocab):
            raise ValueError(f"ngram_bpb: {name} holds ids outside [0, {vocab}) "
                             f"(min {x.min()}, max {x.max()})")
    uni = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    uni /= uni.sum()
    big = np.ones((vocab, vocab))
    np.add.at(big, (train[:-1], train[1:]), 1.0)
    big /= big.sum(axis=1, keepdims=True)
    prev, nxt = windows[:, :-1].ravel(), windows[:, 1:].ravel()
    return float(-np.log2(uni[nxt]).mean()), float(-np.log2(big[prev, nxt]).mean())
