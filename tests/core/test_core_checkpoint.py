"""Checkpoints that survive damage, the run-directory lock, and interrupts during a save.

Damage is made the way it happens: an array file cut short (a copy or a disk that filled up), an
array file or the metadata item missing, a step folder that was never filled (a kill before the
first byte). The restore must fall back to the newest intact step, name the damaged one, and keep
it (moved aside, not deleted).
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import checkpoint as ckpt_lib
from core.checkpoint import (
    Checkpointer,
    CheckpointRestoreError,
    defer_interrupts,
    run_dir_lock,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(step):
    # distinct values per step, so that the step restored is visible in the arrays themselves
    rng = np.random.default_rng(step)
    return {"w": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(32,)), jnp.float32),
            "step": jnp.asarray(step, jnp.int32)}


def _saved(tmp_path, steps=(2, 4)):
    directory = str(tmp_path / "checkpoints")
    ck = Checkpointer(directory, max_to_keep=5)
    for s in steps:
        ck.save(s, _state(s), {"step": s, "data_position": 10 * s})
    ck.close()
    return directory


def _truncate_arrays(step_dir):
    files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "*"), recursive=True)
             if os.path.isfile(f) and os.path.basename(os.path.dirname(f)) == "d"]
    assert files, os.listdir(step_dir)
    for f in files:
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)


def _remove_arrays(step_dir):
    for f in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True):
        os.remove(f)


DAMAGE = {
    "truncated array files": _truncate_arrays,
    "missing array files": _remove_arrays,
    "missing metadata item": lambda d: shutil.rmtree(os.path.join(d, "metadata")),
    "missing state tree metadata": lambda d: os.remove(os.path.join(d, "state", "_METADATA")),
    "half-written (empty) step": lambda d: (shutil.rmtree(d), os.makedirs(d)),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_newest_step_falls_back_to_the_previous_one(tmp_path, kind, capfd):
    directory = _saved(tmp_path)
    DAMAGE[kind](os.path.join(directory, "4"))
    ck = Checkpointer(directory)
    found = ck.restore_newest(_state(0))
    assert found.step == 2 and found.metadata == {"step": 2, "data_position": 20}
    jax.tree.map(np.testing.assert_array_equal, found.state, _state(2))
    assert [s for s, _ in found.skipped] == [4]
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "step 4 does not restore" in warnings[0], err
    assert "restored step 2" in warnings[0] and "delete" not in err
    assert "Exception ignored" not in err  # orbax's unraisable coroutine reports are silenced
    # kept, not deleted: moved beside the checkpoint directory; the good step is untouched
    assert os.path.isdir(os.path.join(f"{directory}.damaged", "4"))
    assert ck.all_steps() == [2]
    # the step number is free again: a resumed run can save step 4
    ck.save(4, _state(4), {"step": 4, "data_position": 40})
    jax.tree.map(np.testing.assert_array_equal, ck.restore(_state(0))[0], _state(4))
    ck.close()


def test_no_intact_step_is_one_clear_error_and_nothing_is_moved(tmp_path):
    directory = _saved(tmp_path)
    for s in ("2", "4"):
        _truncate_arrays(os.path.join(directory, s))
    ck = Checkpointer(directory)
    with pytest.raises(CheckpointRestoreError) as info:
        ck.restore(_state(0))
    message = str(info.value)
    assert "\n" not in message and "no checkpoint restores cleanly" in message
    assert "step 4" in message and "step 2" in message and "delete" not in message
    assert ck.all_steps() == [4, 2] and not os.path.exists(f"{directory}.damaged")
    ck.close()


def test_other_shapes_are_another_run_not_damage(tmp_path):
    directory = _saved(tmp_path)
    other = {**_state(0), "w": jnp.zeros((8, 8), jnp.float32)}
    ck = Checkpointer(directory)
    with pytest.raises(ValueError, match="step 4 saved 3 arrays that do not match"):
        ck.restore(other)
    assert ck.all_steps() == [4, 2]  # nothing moved
    ck.close()


def test_refusing_metadata_stops_the_walk(tmp_path):
    directory = _saved(tmp_path)

    def refuse(meta):
        raise ValueError(f"not this run (step {meta['step']})")

    ck = Checkpointer(directory)
    with pytest.raises(ValueError, match=r"not this run \(step 4\)"):
        ck.restore_newest(_state(0), check_metadata=refuse)
    assert ck.all_steps() == [4, 2]
    ck.close()


def test_empty_directory_restores_nothing(tmp_path):
    ck = Checkpointer(str(tmp_path / "c"))
    assert ck.restore_newest(_state(0)) is None
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ck.restore(_state(0))
    ck.close()


def test_defer_interrupts_delivers_sigint_after_the_block():
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under a background job
    order = []
    with pytest.raises(KeyboardInterrupt):
        with defer_interrupts() as received:
            os.kill(os.getpid(), signal.SIGINT)
            order.append("after the signal, still inside")
            assert received == [signal.SIGINT]
    assert order == ["after the signal, still inside"]
    assert signal.getsignal(signal.SIGINT) is before
    with defer_interrupts() as received:  # no signal: no interrupt
        pass
    assert received == []


def test_lock_is_exclusive_across_processes_and_names_the_holder(tmp_path):
    workdir = str(tmp_path / "run")
    with run_dir_lock(workdir):
        with run_dir_lock(workdir):  # re-entrant in the holding process
            pass
        code = textwrap.dedent(f"""
            from core.checkpoint import run_dir_lock, RunDirectoryInUseError
            try:
                with run_dir_lock({workdir!r}):
                    print("acquired")
            except RunDirectoryInUseError as e:
                print("busy:", e)
        """)
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        line = proc.stdout.strip()
        assert line.startswith("busy: ") and f"pid {os.getpid()} on host " in line, proc
        assert "use another --workdir" in line and "\n" not in line
        assert os.path.exists(os.path.join(workdir, ckpt_lib.HOLDER_FILE))
    # released: the side file is gone and another process gets the lock
    assert not os.path.exists(os.path.join(workdir, ckpt_lib.HOLDER_FILE))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == "acquired", proc


def test_lock_holder_without_a_readable_record(tmp_path):
    assert ckpt_lib.lock_holder(str(tmp_path)) == "an unknown process"
    (tmp_path / ckpt_lib.HOLDER_FILE).write_text('{"pid": 12')  # torn side file
    assert ckpt_lib.lock_holder(str(tmp_path)) == "an unknown process"
    (tmp_path / ckpt_lib.HOLDER_FILE).write_text('{"pid": 12, "host": "h", "since": "t"}')
    assert ckpt_lib.lock_holder(str(tmp_path)) == "pid 12 on host h since t"
