"""The grid's runs on core.training.train_loop: evaluating at each budget's step (training resumed
from the checkpoint in between) ends where one uninterrupted run ends; cached evaluations are
reused and the finished run restored; the evaluator scores samples by its next-token NLL."""

import math

import jax
import numpy as np
import pytest

from algorithms.diffusion_lm import evaluator as evaluator_lib
from algorithms.diffusion_lm import grid
from core.data import ByteTokenizer
from experiments.configs import diffusion_lm as dlm_config
from models.losses import next_token_nll


def _config():
    return dlm_config.get_config("smoke,eval_windows=8,eval_reps=1")


def _data(config):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, size=4096).astype(np.int32)
    windows = rng.integers(0, 256, size=(config.eval_windows, config.seq_len)).astype(np.int32)
    return train, windows


def test_budget_steps_spend_each_budget():
    assert grid.budget_steps([3e6, 6e6], 1000.0, 100) == [10, 20]
    assert grid.budget_steps([1.0], 1e9, 100) == [1]  # at least one step


def test_evaluating_at_each_budget_equals_one_uninterrupted_run(tmp_path):
    config = _config()
    runner = grid.Runner(config, ByteTokenizer())
    train, windows = _data(config)
    split, whole, cache = runner.model("mdlm", (8, 1, 1)), runner.model("mdlm", (8, 1, 1)), {}
    res = runner.train(split, train, [3, 6], windows, str(tmp_path / "split"), cache)
    ref = runner.train(whole, train, [6], windows, str(tmp_path / "whole"), {})
    assert set(res["evals"]) == {"3", "6"} and res["evals"]["6"] == ref["evals"]["6"]
    jax.tree.map(np.testing.assert_array_equal, split.state["params"], whole.state["params"])
    assert int(split.state["step"]) == 6
    # A rerun reuses the cached evaluations and only restores the finished run.
    again = runner.model("mdlm", (8, 1, 1))
    assert int(again.state["step"]) == 0
    rerun = runner.train(again, train, [3, 6], windows, str(tmp_path / "split"), cache)
    assert rerun["evals"] == res["evals"]
    jax.tree.map(np.testing.assert_array_equal, again.state["params"], split.state["params"])


def test_reference_outside_the_grid_is_its_own_run_for_every_family(tmp_path):
    # the grid: MDLM at three sizes and two budgets; the comparison: a larger model at a larger
    # budget, which every family (MDLM too) trains in its own run for the same steps
    config = dlm_config.get_config(
        "smoke,eval_windows=8,eval_reps=1,isoflop_families=('mdlm',),"
        "families=('ar','mdlm','duo'),budgets=(2e7,4e7),reference=(16,1,2),"
        "reference_budget=2e8")
    assert grid.reference_of(config) == ((16, 1, 2), 2e8, False)
    assert grid.reference_of(dlm_config.get_config("smoke"))[2]  # the default: a grid cell
    runner = grid.Runner(config, ByteTokenizer())
    train, windows = _data(config)
    g = grid.run_grid(runner, train, windows, str(tmp_path), {})
    ar = runner.model("ar", (16, 1, 2))
    steps = grid.budget_steps([2e8], ar.flops_per_token, config.batch_size * config.seq_len)[0]
    assert g.reference_size == (16, 1, 2) and g.reference_steps == steps
    assert set(g.reference) == {"ar", "mdlm", "duo"}
    for fam, m in g.reference.items():
        assert m.size == (16, 1, 2) and int(m.state["step"]) == steps
        assert g.reference_runs[fam] == str(tmp_path / f"{fam}_d16_l1_ref")
    # the grid itself is unchanged: every MDLM cell spends its budget at its own size
    assert g.losses["mdlm"].shape == (2, 3)
    for k, budget in enumerate(config.budgets):
        for s, size in enumerate(config.sizes):
            m = runner.model("mdlm", size)
            assert g.steps["mdlm"][k, s] == grid.budget_steps(
                [budget], m.flops_per_token, config.batch_size * config.seq_len)[0]


def test_flops_count_the_ablations_ar_pass():
    runner = grid.Runner(_config(), ByteTokenizer())
    paper, ablation = runner.model("esolm", (8, 1, 1)), runner.model("esolm_nelbo", (8, 1, 1))
    mdlm = runner.model("mdlm", (8, 1, 1))
    assert paper.flops_per_token == mdlm.flops_per_token < ablation.flops_per_token


def test_evaluator_scores_samples_by_next_token_nll(tmp_path):
    config = _config()
    ev_config = evaluator_lib.evaluator_config(config)
    assert ev_config.data_path == config.data_path and ev_config.seed == config.seed
    assert ev_config.model.d_model == config.evaluator.model.d_model
    ev = evaluator_lib.train_evaluator(config, str(tmp_path / "ev"), progress=False)
    assert ev.result.steps_run == config.evaluator.steps
    samples = np.random.default_rng(1).integers(0, 256, size=(5, config.seq_len))
    from flax import nnx

    # the forward jitted (eager, every primitive of the model compiles on its own)
    logits = jax.jit(lambda p, x: nnx.merge(ev.graphdef, p)(x))(ev.params, samples)
    expected = math.exp(float(np.mean(np.asarray(next_token_nll(logits, samples)))))
    assert evaluator_lib.generative_perplexity(ev, samples) == pytest.approx(expected, rel=1e-5)
    again = evaluator_lib.train_evaluator(config, str(tmp_path / "ev"), progress=False)
    assert again.result.steps_run == 0  # trained once, then restored
    with pytest.raises(ValueError, match="max_len"):
        evaluator_lib.generative_perplexity(ev, np.zeros((1, 200), np.int32))
