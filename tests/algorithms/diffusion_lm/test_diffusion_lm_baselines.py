"""The unigram and bigram reference levels: closed forms on a periodic text, the same numbers as
the causal LM's n-gram baselines on the positions both score, and refused inputs."""

import math

import numpy as np
import pytest

from algorithms.diffusion_lm.baselines import ngram_counts_bpb
from algorithms.lm.evaluation import ngram_bpb


def test_periodic_text_closed_form():
    # train: 0 1 2 3 repeated n times; every id n times, so the add-one unigram is exactly 1/4
    n = 250
    train = np.tile(np.arange(4), n)
    windows = np.tile(np.arange(4), 2)[None, :]  # 0 1 2 3 0 1 2 3
    out = ngram_counts_bpb(train, windows, num_classes=4)
    assert math.isclose(out["unigram"], 2.0, rel_tol=1e-12)
    # pairs (0,1), (1,2), (2,3) occur n times and start n pairs each: p = (n + 1) / (n + 4);
    # (3,0) occurs n - 1 times of n - 1 pairs starting with 3: p = n / (n + 3). The window holds
    # six of the first kind, one (3,0), and its first token costs the unigram's 2 bits.
    expected = (2.0 - 6 * math.log2((n + 1) / (n + 4)) - math.log2(n / (n + 3))) / 8
    assert math.isclose(out["bigram"], expected, rel_tol=1e-12)


def test_iid_text_unigram_reaches_its_entropy():
    # i.i.d. draws from a known law: the held-out unigram cross-entropy tends to its entropy
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])  # entropy 1.875 bits
    train = rng.choice(5, size=400_000, p=p)
    windows = rng.choice(5, size=(2000, 64), p=p)
    out = ngram_counts_bpb(train, windows, num_classes=5)
    # s.e. of the mean of -log2 p(x) over 128,000 tokens is about 0.003 bits
    assert abs(out["unigram"] - 1.875) < 0.012
    # the next byte does not depend on the previous one: the bigram cannot beat the unigram
    assert abs(out["bigram"] - out["unigram"]) < 0.005


def test_matches_the_causal_lm_baselines_on_the_positions_they_share():
    rng = np.random.default_rng(1)
    train = rng.integers(0, 256, size=20_000)
    windows = rng.integers(0, 256, size=(7, 16))
    out = ngram_counts_bpb(train, windows)
    uni_rest, big_rest = ngram_bpb(train, windows, 256)  # positions 1..L-1
    first = ngram_counts_bpb(train, windows[:, :1])["unigram"]  # position 0
    assert math.isclose(out["unigram"], (first + 15 * uni_rest) / 16, rel_tol=1e-12)
    assert math.isclose(out["bigram"], (first + 15 * big_rest) / 16, rel_tol=1e-12)


@pytest.mark.parametrize("train, windows, match", [
    (np.zeros(1, np.int32), np.zeros((1, 4), np.int32), "train must be"),
    (np.zeros(8, np.int32), np.zeros(4, np.int32), "windows must be"),
    (np.zeros(8, np.int32), np.zeros((0, 4), np.int32), "windows must be"),
    (np.full(8, 4), np.zeros((1, 4), np.int32), "train holds ids outside"),
    (np.zeros(8, np.int32), np.full((1, 4), -1), "windows holds ids outside"),
])
def test_refuses_bad_inputs(train, windows, match):
    with pytest.raises(ValueError, match=match):
        ngram_counts_bpb(train, windows, num_classes=4)
