"""Checkpoints that survive damage, the run-directory lock, and interrupts during a save.

Damage is made the way it happens: an array file cut short (a copy or a disk that filled up), an
array file or the metadata item missing, a step folder that was never filled (a kill before the
first byte). The restore must fall back to the newest intact step, name the damaged one, and keep
it (moved aside, not deleted).
"""

import glob
import json
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
from tests.core.fake_bucket import fake_gcs

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


# -- a run directory in a bucket (gs://, served from a local folder by tests.core.fake_bucket) ---


def test_checkpoints_in_a_bucket_save_restore_and_set_aside_damage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with fake_gcs(tmp_path / "store"):
        directory = "gs://b/run/checkpoints"
        ck = Checkpointer(directory, max_to_keep=5)
        for s in (2, 4):
            ck.save(s, _state(s), {"step": s, "data_position": 10 * s})
        ck.close()
        step4 = tmp_path / "store" / "b" / "run" / "checkpoints" / "4"
        assert (step4 / "commit_success.txt").exists()  # orbax's commit marker on a bucket
        shutil.rmtree(step4 / "metadata")
        ck = Checkpointer(directory)
        assert ck.directory == directory
        found = ck.restore_newest(_state(0))
        ck.close()
    assert found.step == 2 and found.metadata == {"step": 2, "data_position": 20}
    jax.tree.map(np.testing.assert_array_equal, found.state, _state(2))
    assert (tmp_path / "store" / "b" / "run" / "checkpoints.damaged" / "4").is_dir()
    assert not step4.exists() and not (tmp_path / "gs:").exists()


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_bucket_lock_excludes_a_second_holder_and_names_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt_lib, "REMOTE_SETTLE_S", 0.0)
    with fake_gcs(tmp_path):
        with run_dir_lock("gs://b/run"):
            with run_dir_lock("gs://b/run/"):  # re-entrant in the holding process
                pass
            record = json.loads((tmp_path / "b" / "run" / ckpt_lib.LOCK_FILE).read_text())
            assert record["pid"] == os.getpid() and len(record["id"]) == 32
            other = ckpt_lib._ObjectLock("gs://b/run")  # another process: another holder id
            with pytest.raises(ckpt_lib.RunDirectoryInUseError,
                               match=rf"gs://b/run is in use by pid {os.getpid()} on host "):
                other.acquire()
        assert not (tmp_path / "b" / "run" / ckpt_lib.LOCK_FILE).exists()  # released: removed
        other.acquire()  # and free for the next run
        other.release()


def test_bucket_lock_of_two_simultaneous_writers_goes_to_the_later_one(tmp_path, monkeypatch):
    clock = _Clock()
    with fake_gcs(tmp_path):
        late = ckpt_lib._ObjectLock("gs://b/run", clock=clock, sleep=lambda s: None)
        # the other writer's object lands while this one waits to read its own back
        early = ckpt_lib._ObjectLock("gs://b/run", clock=clock, sleep=lambda s: late._write())
        with pytest.raises(ckpt_lib.RunDirectoryInUseError, match="is in use by pid"):
            early.acquire()
        found = json.loads((tmp_path / "b" / "run" / ckpt_lib.LOCK_FILE).read_text())
        assert found["id"] == late.record["id"]  # the refused writer left the winner's object
        early.release()
        assert (tmp_path / "b" / "run" / ckpt_lib.LOCK_FILE).exists()


def test_bucket_lock_not_renewed_is_taken_over_with_a_warning(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(ckpt_lib, "REMOTE_SETTLE_S", 0.0)
    clock = _Clock()
    with fake_gcs(tmp_path):
        gone = ckpt_lib._ObjectLock("gs://b/run", clock=clock, sleep=lambda s: None)
        gone._write()  # a holder that was killed: its object stays
        clock.t += ckpt_lib.REMOTE_STALE_S - 1
        with pytest.raises(ckpt_lib.RunDirectoryInUseError):
            ckpt_lib._ObjectLock("gs://b/run", clock=clock, sleep=lambda s: None).acquire()
        clock.t += 2
        new = ckpt_lib._ObjectLock("gs://b/run", clock=clock, sleep=lambda s: None)
        new.acquire()
        assert "taking over an abandoned run lock" in capfd.readouterr().err
        found = json.loads((tmp_path / "b" / "run" / ckpt_lib.LOCK_FILE).read_text())
        assert found["id"] == new.record["id"] and found["renewed"] == clock.t
        new.release()
