"""Interrupted and repeated runs of the training loop: the metrics log holds every step once, a
torn log line or a damaged newest checkpoint does not stop a rerun, a rerun asking for fewer steps
than were trained is refused, an interrupt during a save is not lost, and a locked workdir is
refused. A two-parameter least-squares model keeps each run to a fraction of a second."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from core.checkpoint import RunDirectoryInUseError
from core.report import read_json_lines
from core.training import LoopConfig, TrainingInterrupted, train_loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Batches:
    """Batch ``i`` depends only on ``i``: the position is the whole iterator state."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        rng = np.random.default_rng(self.position)
        self.position += 1
        x = rng.normal(size=(8, 2)).astype(np.float32)
        return {"x": x, "y": x @ np.array([1.5, -2.0], np.float32)}


def step_fn(state, batch, key):
    def loss(w):
        return jnp.mean((batch["x"] @ w - batch["y"]) ** 2) + 1e-3 * jax.random.normal(key, ())

    value, grad = jax.value_and_grad(loss)(state["w"])
    return {"w": state["w"] - 0.1 * grad, "step": state["step"] + 1}, {"loss": value}


def init():
    return {"w": jnp.zeros((2,), jnp.float32), "step": jnp.zeros((), jnp.int32)}


def go(workdir, num_steps, checkpoint_every=2, on_log=None):
    return train_loop(step_fn, init(), Batches(), jax.random.key(3),
                      LoopConfig(num_steps=num_steps, log_every=1,
                                 checkpoint_every=checkpoint_every, progress=False),
                      workdir=str(workdir), on_log=on_log, fingerprint="f")


def log_steps(workdir):
    return [r["step"] for r in read_json_lines(os.path.join(workdir, "train_metrics.jsonl"))]


class Killed(Exception):
    pass


def kill_after(step):
    def on_log(s, record):
        if s == step:
            raise Killed
    return on_log


def test_resume_logs_every_step_once_and_matches_an_uninterrupted_run(tmp_path):
    full = go(tmp_path / "full", 8)
    with pytest.raises(Killed):  # killed after logging step 5; last checkpoint at step 4
        go(tmp_path / "split", 8, on_log=kill_after(5))
    assert log_steps(tmp_path / "split") == [1, 2, 3, 4, 5]
    resumed = go(tmp_path / "split", 8)
    assert resumed.resumed_from == 4
    assert log_steps(tmp_path / "split") == list(range(1, 9))
    assert read_json_lines(tmp_path / "split" / "train_metrics.jsonl") == \
        read_json_lines(tmp_path / "full" / "train_metrics.jsonl")
    jax.tree.map(np.testing.assert_array_equal, full.state, resumed.state)


def test_torn_last_line_is_dropped_with_a_warning(tmp_path, capfd):
    with pytest.raises(Killed):
        go(tmp_path, 8, on_log=kill_after(5))
    path = tmp_path / "train_metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"loss": 0.12, "st')  # the kill came in the middle of a write
    assert log_steps(tmp_path) == [1, 2, 3, 4, 5]
    err = capfd.readouterr().err
    assert f"{path}:6: dropped a torn last line" in err
    go(tmp_path, 8)
    assert log_steps(tmp_path) == list(range(1, 9))
    assert path.read_text().endswith("}\n")


def test_a_bad_line_before_the_last_names_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON line"):
        read_json_lines(str(path))


def test_fresh_start_empties_a_stale_log(tmp_path):
    (tmp_path / "train_metrics.jsonl").write_text('{"step": 40, "loss": 1.0}\n')
    go(tmp_path, 3)
    assert log_steps(tmp_path) == [1, 2, 3]


def test_damaged_newest_checkpoint_resumes_from_the_previous_step(tmp_path, capfd):
    full = go(tmp_path / "full", 6)
    go(tmp_path / "run", 6)  # checkpoints at 4 and 6 are kept
    step6 = tmp_path / "run" / "checkpoints" / "6"
    os.remove(step6 / "metadata" / "metadata")
    again = go(tmp_path / "run", 6)
    assert again.resumed_from == 4 and again.steps_run == 2
    jax.tree.map(np.testing.assert_array_equal, full.state, again.state)
    err = capfd.readouterr().err
    assert "step 6 does not restore" in err and "restored step 4" in err
    assert "different run" not in err and "delete" not in err
    assert log_steps(tmp_path / "run") == list(range(1, 7))
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints.damaged")) == ["6"]


def test_rerun_with_fewer_steps_is_refused(tmp_path):
    go(tmp_path, 6)
    with pytest.raises(ValueError, match="trained to step 6, beyond num_steps=4"):
        go(tmp_path, 4)
    assert go(tmp_path, 6).steps_run == 0  # the run itself is intact
    assert go(tmp_path, 7).steps_run == 1  # and can be extended


def test_interrupt_while_a_checkpoint_commits_is_delivered_after_it(tmp_path, monkeypatch):
    original = ocp.CheckpointManager.wait_until_finished
    calls = []

    def interrupted_wait(self):
        calls.append(1)
        if len(calls) == 1:  # SIGINT arrives while the first save (step 2) is being committed
            os.kill(os.getpid(), signal.SIGINT)
        return original(self)

    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", interrupted_wait)
    with pytest.raises(TrainingInterrupted) as info:
        go(tmp_path, 8)
    assert info.value.checkpoint_step == 2
    assert "last checkpoint: step 2" in str(info.value) and "\n" not in str(info.value)
    monkeypatch.undo()
    assert go(tmp_path, 8).resumed_from == 2


def test_a_workdir_locked_by_another_process_is_refused(tmp_path):
    ready = tmp_path / "ready"
    # the holder keeps the lock until it is killed (it reads a stdin that stays open), so the
    # lock cannot be released before the check however slowly this machine runs
    code = textwrap.dedent(f"""
        import pathlib, sys
        from core.checkpoint import run_dir_lock
        with run_dir_lock({str(tmp_path)!r}):
            pathlib.Path({str(ready)!r}).touch()
            sys.stdin.read()
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600  # a guard against a broken holder, not a margin
        while not ready.exists() and time.monotonic() < deadline and holder.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), f"the lock holder did not start (exit code {holder.poll()})"
        with pytest.raises(RunDirectoryInUseError, match=rf"in use by pid {holder.pid} on host"):
            go(tmp_path, 2)
        assert not (tmp_path / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()
    assert go(tmp_path, 2).steps_run == 2  # the OS released the dead holder's lock


def test_log_records_are_json(tmp_path):
    go(tmp_path, 2)
    for line in (tmp_path / "train_metrics.jsonl").read_text().splitlines():
        assert set(json.loads(line)) == {"step", "loss"}


# ---------------------------------------------------------------------------------------------
# Evaluation hooks and early stopping across an interruption


def val_loss(step, state):
    # a held-out batch the training batches never reach; deterministic in (step, state)
    b = Batches()
    b.position = 10_000
    batch = next(b)
    return {"val_loss": float(jnp.mean((batch["x"] @ state["w"] - batch["y"]) ** 2)),
            "w0": float(state["w"][0])}


def go_eval(workdir, num_steps, on_log=None, patience=2):
    from core.training import EarlyStopping

    # eval every 3 steps with an epoch of 3; w0 rising from 0 to 1.5 is "maximised" so the
    # watched metric improves for a while and then stalls at its limit
    config = LoopConfig(num_steps=num_steps, log_every=1, checkpoint_every=2, progress=False,
                        steps_per_epoch=3, eval_every_epoch=True,
                        early_stopping=EarlyStopping("w0", patience=patience, mode="max",
                                                     min_delta=0.05))
    return train_loop(step_fn, init(), Batches(), jax.random.key(3), config,
                      workdir=str(workdir), on_log=on_log, fingerprint="f", evaluate=val_loss)


def eval_records(workdir):
    return read_json_lines(os.path.join(workdir, "eval_metrics.jsonl"))


def test_resume_with_evaluation_and_early_stopping_matches_an_uninterrupted_run(tmp_path):
    full = go_eval(tmp_path / "full", 60)
    assert full.stopped_early_at is not None and full.stopped_early_at % 3 == 0
    with pytest.raises(Killed):  # killed after step 7 (checkpoint at 6, evaluations at 3 and 6)
        go_eval(tmp_path / "split", 60, on_log=kill_after(7))
    resumed = go_eval(tmp_path / "split", 60)
    assert resumed.resumed_from == 6
    assert resumed.stopped_early_at == full.stopped_early_at
    assert resumed.best_step == full.best_step and resumed.best_value == full.best_value
    jax.tree.map(np.testing.assert_array_equal, full.state, resumed.state)
    jax.tree.map(np.testing.assert_array_equal, full.best_state, resumed.best_state)
    # every evaluation logged once, and the same (train_loss spans the interruption exactly)
    assert eval_records(tmp_path / "split") == eval_records(tmp_path / "full")
    assert [r["step"] for r in eval_records(tmp_path / "full")] == \
        list(range(3, full.stopped_early_at + 1, 3))
    # a rerun of the early-stopped run restores it, best state included, and trains no further
    again = go_eval(tmp_path / "full", 60)
    assert again.steps_run == 0 and again.stopped_early_at == full.stopped_early_at
    jax.tree.map(np.testing.assert_array_equal, full.best_state, again.best_state)
