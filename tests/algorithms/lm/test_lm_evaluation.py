import math

import jax
import numpy as np
import pytest
from flax import nnx

from algorithms.lm import evaluation
from models.transformer import Transformer, TransformerConfig


def test_ngram_baselines_closed_form():
    # a deterministic alternating sequence: the bigram model predicts it almost perfectly
    train = np.tile(np.array([1, 2], np.int32), 5000)
    windows = np.tile(np.array([1, 2], np.int32), 8)[None, :]
    uni, big = evaluation.ngram_bpb(train, windows, vocab=4)
    # unigram with add-one over 4 symbols: p(1) = p(2) = 5001 / 10004
    assert math.isclose(uni, -math.log2(5001 / 10004), rel_tol=1e-9)
    # bigram with add-one over 4 successors: p(2|1) = (5000 + 1) / (5000 + 4) over the 8 pairs
    # (1, 2) of the window, p(1|2) = (4999 + 1) / (4999 + 4) over its 7 pairs (2, 1)
    p21, p12 = 5001 / 5004, 5000 / 5003
    expected = -(8 * math.log2(p21) + 7 * math.log2(p12)) / 15
    assert math.isclose(big, expected, rel_tol=1e-9)


def test_heldout_bpb_of_a_zero_output_model_is_log2_vocab():
    # zeroed output projection: uniform next-token distribution -> log2(V) bits for every window
    cfg = TransformerConfig(vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
                            max_len=16, causal=True)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    params = jax.tree.map(lambda x: x * 0, params)
    windows = np.random.default_rng(0).integers(0, 16, (5, 9))
    assert math.isclose(evaluation.heldout_bpb(graphdef, params, windows, batch_size=2), 4.0,
                        rel_tol=1e-6)


@pytest.mark.parametrize("shape", [(0, 4), (3, 1), (4,)])
def test_heldout_bpb_refuses_windows_without_a_predicted_position(shape):
    with pytest.raises(ValueError, match="heldout_bpb: windows must be"):
        evaluation.heldout_bpb(None, None, np.zeros(shape, np.int32))


def test_ngram_bpb_refuses_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match="windows holds ids outside \\[0, 4\\)"):
        evaluation.ngram_bpb(np.zeros(8, np.int32), np.full((1, 3), 7), vocab=4)
