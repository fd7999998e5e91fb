"""Count-based reference levels for the diffusion-LM comparison: the held-out bits per token of
add-one-smoothed unigram and bigram models fitted on the training split, scored on every token
the families are scored on.

Dimensions: T training tokens, W held-out windows, L window length, N data ids (256 bytes).

Every family's held-out number is a per-token NELBO over all L tokens of each window (AR: the
exact NLL with a ``[BOS]`` prefix, so the first token is predicted without context). The
baselines are scored on the same W x L tokens: the unigram on each of them; the bigram on
positions 1..L-1 given the previous token of the window, and on position 0, which has no
previous token in the window, by the unigram (the context a ``[BOS]``-prompted AR model has
there). A family that has learned nothing beyond letter frequencies sits at the unigram level;
one below the bigram uses more than the previous byte.
"""

from __future__ import annotations

import numpy as np


def ngram_counts_bpb(train: np.ndarray, windows: np.ndarray, num_classes: int = 256
                     ) -> dict[str, float]:
    """Held-out bits per token of add-one (Laplace) unigram and bigram models.

    ``p(j) = (n_j + 1) / (T + N)`` and ``p(j | i) = (n_ij + 1) / (n_i. + N)``, with ``n_ij`` the
    count of ``j`` right after ``i`` in ``train`` and ``n_i.`` the count of pairs starting with
    ``i``.

    Args:
      train: int [T] training token ids in [0, num_classes), T >= 2.
      windows: int [W, L] held-out token ids in [0, num_classes), W >= 1, L >= 1.
      num_classes: N.

    Returns:
      ``{"unigram": bits, "bigram": bits}``: mean negative log2-probability over all W x L
      tokens (the bigram's position-0 tokens scored by the unigram, see the module docstring).

    Raises:
      ValueError: arrays of the wrong rank or size, or ids outside [0, num_classes).
    """
    train, windows = np.asarray(train), np.asarray(windows)
    if train.ndim != 1 or train.size < 2:
        raise ValueError(f"ngram_counts_bpb: train must be [T >= 2] token ids, got shape "
                         f"{train.shape}")
    if windows.ndim != 2 or windows.size == 0:
        raise ValueError(f"ngram_counts_bpb: windows must be [W >= 1, L >= 1] token ids, got "
                         f"shape {windows.shape}")
    for name, x in (("train", train), ("windows", windows)):
        if x.min() < 0 or x.max() >= num_classes:
            raise ValueError(f"ngram_counts_bpb: {name} holds ids outside [0, {num_classes}) "
                             f"(min {x.min()}, max {x.max()})")
    uni = np.bincount(train, minlength=num_classes).astype(np.float64) + 1.0
    log_uni = np.log2(uni / uni.sum())
    pairs = np.ones((num_classes, num_classes))
    np.add.at(pairs, (train[:-1], train[1:]), 1.0)
    log_big = np.log2(pairs / pairs.sum(axis=1, keepdims=True))
    big = np.concatenate([log_uni[windows[:, :1]], log_big[windows[:, :-1], windows[:, 1:]]],
                         axis=1)
    return {"unigram": float(-log_uni[windows].mean()), "bigram": float(-big.mean())}
