"""The training loop: exact resume, non-finite stop with the last good checkpoint kept."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from core.checkpoint import Checkpointer
from core.data import TextBatcher
from core.training import (
    LoopConfig,
    NonFiniteLossError,
    init_train_state,
    make_train_step,
    restore_message,
    train_loop,
)
from models.losses import next_token_nll
from models.transformer import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=64, max_len=16, d_model=32, num_layers=1, num_heads=2)
TOKENS = np.random.default_rng(0).integers(0, 64, size=5000).astype(np.int32)


def lm_loss(model, batch, key):
    # dropout-like use of the key so that the per-step key matters for exactness
    noise = 1e-3 * jax.random.normal(key, ())
    return next_token_nll(model(batch), batch).mean() + noise, {}


def setup(lr=1e-2):
    graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
    tx = optax.adam(lr)
    return make_train_step(graphdef, tx, lm_loss), init_train_state(params, tx)


def run(workdir, num_steps, step_fn=None, state=None, checkpoint_every=2):
    fn, st = setup()
    return train_loop(step_fn or fn, state or st, TextBatcher(TOKENS, 4, 16, seed=1),
                      jax.random.key(7),
                      LoopConfig(num_steps=num_steps, log_every=1, checkpoint_every=checkpoint_every,
                                 progress=False), workdir=str(workdir))


def test_resume_is_bit_identical(tmp_path):
    full = run(tmp_path / "full", 6)
    run(tmp_path / "split", 3)  # "killed" after 3 steps (checkpoint at 2 and 3)
    resumed = run(tmp_path / "split", 6)
    assert resumed.resumed_from == 3 and resumed.steps_run == 3
    jax.tree.map(np.testing.assert_array_equal, full.state, resumed.state)
    assert int(resumed.state["step"]) == 6
    # the metrics stream continues where it stopped
    assert [h["step"] for h in resumed.history] == [4, 5, 6]
    assert resumed.history[-1]["loss"] == full.history[-1]["loss"]


def test_restore_says_whether_it_continues_a_finished_run_or_resumes_an_interrupted_one(
        tmp_path, capsys):
    # nested budgets: one run trained to 2 steps, then the same run to 4 (an IsoFLOP grid's
    # larger budget), then asked for 4 again; and a run stopped at its step-2 checkpoint of 4
    run(tmp_path / "nested", 2)
    assert capsys.readouterr().err == ""  # a fresh start says nothing
    run(tmp_path / "nested", 4)
    assert "continuing the same run from step 2, where its 2-step budget ended, to 4 steps" \
        in capsys.readouterr().err
    run(tmp_path / "nested", 4)
    err = capsys.readouterr().err
    assert "restored the finished run at step 4" in err and "resuming" not in err
    run(tmp_path / "cut", 4)  # checkpoints at 2 and 4; the run is "killed" before step 4's
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "4")
    capsys.readouterr()
    run(tmp_path / "cut", 4)
    assert "resuming from step 2 of an interrupted run of 4 steps" in capsys.readouterr().err
    assert restore_message(2, None, 4) == "resuming from step 2"  # saved before it was recorded


def test_loss_decreases(tmp_path):
    res = run(tmp_path, 30, checkpoint_every=0)
    assert res.history[-1]["loss"] < res.history[0]["loss"] - 0.3


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    fn, state = setup()

    def poisoned(state, batch, key):
        new_state, metrics = fn(state, batch, key)
        bad = state["step"] >= 4  # the 5th step produces NaN
        metrics["loss"] = jnp.where(bad, jnp.nan, metrics["loss"])
        return new_state, metrics

    with pytest.raises(NonFiniteLossError, match="step 5.*Last good checkpoint: step 4"):
        run(tmp_path, 10, step_fn=poisoned, state=state, checkpoint_every=2)
    ckpt = Checkpointer(str(tmp_path / "checkpoints"))
    assert ckpt.latest_step() == 4
    restored, meta = ckpt.restore(setup()[1])
    assert meta == {"step": 4, "data_position": 4, "stopped_early": False, "target_steps": 10}
    chex_finite = all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(restored))
    assert chex_finite


def test_bad_loop_config():
    with pytest.raises(ValueError, match="log_every"):
        LoopConfig(num_steps=3, log_every=0)


def test_early_stop_checkpoints_and_is_final_on_rerun(tmp_path):
    fn, st = setup()
    seen = []

    def stop_when(step, state):
        seen.append((step, int(state["step"])))
        return step == 4

    def go(stop=None):
        return train_loop(fn, st if stop else setup()[1], TextBatcher(TOKENS, 4, 16, seed=1),
                          jax.random.key(7),
                          LoopConfig(num_steps=10, log_every=2, checkpoint_every=0, progress=False),
                          workdir=str(tmp_path), stop_when=stop)

    stopped = go(stop_when)
    # consulted at log steps only, with the state after that step; stopped at step 4
    assert seen == [(2, 2), (4, 4)]
    assert stopped.stopped_early_at == 4 and stopped.steps_run == 4
    assert int(stopped.state["step"]) == 4 and [h["step"] for h in stopped.history] == [2, 4]
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 4
    # a rerun restores the early-stopped state and trains no further
    again = go()
    assert again.stopped_early_at == 4 and again.steps_run == 0 and again.resumed_from == 4
    jax.tree.map(np.testing.assert_array_equal, stopped.state, again.state)
    # the same steps without stopping give the same state at step 4 (stopping changes nothing)
    ref = train_loop(*setup(), TextBatcher(TOKENS, 4, 16, seed=1), jax.random.key(7),
                     LoopConfig(num_steps=4, log_every=2, progress=False))
    jax.tree.map(np.testing.assert_array_equal, ref.state, stopped.state)


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    fn, st = setup()

    def go(fingerprint, state=None, step_fn=None):
        return train_loop(step_fn or fn, state or st, TextBatcher(TOKENS, 4, 16, seed=1),
                          jax.random.key(7), LoopConfig(num_steps=2, log_every=1, progress=False),
                          workdir=str(tmp_path), fingerprint=fingerprint)

    go("aaaa")
    assert go("aaaa").steps_run == 0  # same run: restored, nothing left to do
    with pytest.raises(ValueError, match="different run.*aaaa.*bbbb"):
        go("bbbb")
    # another model (different state structure) in the same workdir: one clear error
    other = TransformerConfig(vocab_size=64, max_len=16, d_model=16, num_layers=2, num_heads=2)
    graphdef, params = nnx.split(Transformer(other, rngs=nnx.Rngs(0)))
    tx = optax.adam(1e-2)
    with pytest.raises(ValueError, match="different run.*does not match"):
        go(None, init_train_state(params, tx), make_train_step(graphdef, tx, lm_loss))
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 2  # nothing overwritten


# ---------------------------------------------------------------------------------------------
# Evaluation hooks and early stopping (a one-parameter model: each run is milliseconds)


class Counter:
    """Batches carry their own index: batch ``i`` is ``i``."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        self.position += 1
        return jnp.float32(self.position - 1)


def count_step(state, batch, key):
    del key
    return {"w": state["w"] + 1.0, "step": state["step"] + 1}, {"loss": batch}


def count_state():
    return {"w": jnp.zeros((), jnp.float32), "step": jnp.zeros((), jnp.int32)}


def test_evaluate_runs_at_the_requested_steps_with_the_state_after_them():
    seen = []

    def evaluate(step, state):
        seen.append((step, float(state["w"])))
        return {"val_loss": 1.0 / step}

    config = LoopConfig(num_steps=20, log_every=7, progress=False, eval_every=6,
                        eval_steps=(1, 13, 6, 25))
    res = train_loop(count_step, count_state(), Counter(), jax.random.key(0), config,
                     evaluate=evaluate)
    assert seen == [(1, 1.0), (6, 6.0), (12, 12.0), (13, 13.0), (18, 18.0)]
    assert [r["step"] for r in res.evals] == [1, 6, 12, 13, 18]
    # train_loss: the mean loss of the steps since the previous evaluation (step s has loss s - 1)
    assert [r["train_loss"] for r in res.evals] == [0.0, 3.0, 8.5, 12.0, 15.0]
    assert res.evals[2]["val_loss"] == 1.0 / 12
    assert [h["step"] for h in res.history] == [1, 6, 7, 12, 13, 14, 18, 20]  # logs at evals too


def test_epochs_evaluation_and_early_stopping_at_the_right_step():
    from core.training import EarlyStopping

    # validation losses per epoch (5 steps each): best at epoch 3, then two epochs without
    # an improvement larger than min_delta, so patience 2 stops after epoch 5 (step 25)
    curve = {5: 3.0, 10: 2.0, 15: 1.0, 20: 0.95, 25: 1.2, 30: 0.1}
    config = LoopConfig(num_steps=40, log_every=5, progress=False, steps_per_epoch=5,
                        eval_every_epoch=True,
                        early_stopping=EarlyStopping("val_loss", patience=2, min_delta=0.1))
    res = train_loop(count_step, count_state(), Counter(), jax.random.key(0), config,
                     evaluate=lambda step, state: {"val_loss": curve[step]})
    assert res.stopped_early_at == 25 and res.steps_run == 25
    assert res.best_step == 15 and res.best_value == 1.0
    assert float(res.best_state["w"]) == 15.0 and float(res.state["w"]) == 25.0
    assert [r["epoch"] for r in res.evals] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert res.history[-1]["epoch"] == 5.0


def test_early_stopping_ignores_non_finite_values_and_needs_its_metric():
    from core.training import EarlyStopping

    config = LoopConfig(num_steps=10, progress=False, eval_every=2,
                        early_stopping=EarlyStopping("val_loss", patience=1))
    values = iter([1.0, float("nan"), 0.5, 0.4, 0.3])
    res = train_loop(count_step, count_state(), Counter(), jax.random.key(0), config,
                     evaluate=lambda step, state: {"val_loss": next(values)})
    assert res.stopped_early_at == 4 and res.best_step == 2  # NaN at step 4 is no improvement
    with pytest.raises(ValueError, match="watches 'val_loss' but evaluate returned \\['other'\\]"):
        train_loop(count_step, count_state(), Counter(), jax.random.key(0), config,
                   evaluate=lambda step, state: {"other": 1.0})


def test_evaluation_settings_are_checked():
    from core.training import EarlyStopping

    with pytest.raises(ValueError, match="eval_every_epoch needs steps_per_epoch"):
        LoopConfig(num_steps=3, eval_every_epoch=True)
    with pytest.raises(ValueError, match="early_stopping needs evaluation steps"):
        LoopConfig(num_steps=3, early_stopping=EarlyStopping())
    with pytest.raises(ValueError, match="patience >= 1"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="no evaluate function"):
        train_loop(count_step, count_state(), Counter(), jax.random.key(0),
                   LoopConfig(num_steps=3, eval_steps=(2,), progress=False))
