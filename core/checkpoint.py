"""Checkpoints with orbax, the run-directory lock, and interrupts deferred while a save commits.

Saves are atomic on a local file system (orbax writes to a temporary directory and renames it on
completion), but a step folder can still be damaged afterwards (a truncated or deleted array file,
a copy that stopped half-way, a missing metadata item). Restoring walks the steps from the newest
down and restores the newest one that restores cleanly: a damaged step is named in a warning on
stderr and moved aside to ``<directory>.damaged/`` (never deleted), so that the run can save that
step number again. Restoring needs an abstract target (shapes, dtypes and shardings) so arrays come
back exactly as they were saved.

One process at a time may write into a run directory: :func:`run_dir_lock` takes a file lock
(``filelock``) and records the holder's pid and host in a side file, so a second process stops with
one line naming the holder instead of interleaving its logs and checkpoints with the first's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import filelock
import jax
import orbax.checkpoint as ocp
from etils import epath

LOCK_FILE = ".lock"
HOLDER_FILE = ".lock.holder"


class CheckpointRestoreError(ValueError):
    """No step of a checkpoint directory restores cleanly (every one is damaged)."""


class RunDirectoryInUseError(RuntimeError):
    """Another process holds the lock of a run directory."""


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _first_line(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


@contextlib.contextmanager
def _quiet_unraisable() -> Iterator[None]:
    """Silences the "Exception ignored in <coroutine>" reports that orbax's reader leaves behind
    when an array file is unreadable (the failure itself is raised and handled by the caller)."""
    previous = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        yield
    finally:
        sys.unraisablehook = previous


@contextlib.contextmanager
def defer_interrupts() -> Iterator[list[int]]:
    """Holds SIGINT and SIGTERM back for the duration of the block, then delivers them.

    A checkpoint being committed must neither be cut in half nor swallow the signal (orbax's
    commit runs in threads; an interrupt landing in the main thread while it waits can be lost).
    Inside the block a signal is only recorded; on leaving it, a recorded SIGINT raises
    ``KeyboardInterrupt`` and a recorded SIGTERM is re-sent to this process with the previous
    handler restored. Outside the main thread (where handlers cannot be installed) this does
    nothing.

    Yields:
      The list of signal numbers received so far (empty when none).
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {}

    def hold(signum, frame):
        del frame
        received.append(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, hold)
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if signal.SIGTERM in received:
        os.kill(os.getpid(), signal.SIGTERM)
    if signal.SIGINT in received:
        raise KeyboardInterrupt


@dataclasses.dataclass
class Restored:
    """What :meth:`Checkpointer.restore_newest` found.

    Attributes:
      state: the restored pytree.
      metadata: the JSON metadata saved with it.
      step: the step restored.
      skipped: ``(step, reason)`` of each newer step that did not restore and was moved aside.
    """

    state: Any
    metadata: dict[str, Any]
    step: int
    skipped: list[tuple[int, str]]


class Checkpointer:
    """A thin wrapper of ``ocp.CheckpointManager`` for ``(state, metadata)`` pairs.

    Args:
      directory: where step folders are written (created if missing; made absolute).
      max_to_keep: how many recent checkpoints to keep.
    """

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        """The newest step folder's step (complete or not: see :meth:`restore_newest`), or
        ``None``."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Every step that has a folder, newest first."""
        return sorted(self._manager.all_steps(), reverse=True)

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> None:
        """Saves the pytree ``state`` and a JSON-able ``metadata`` dict (step, data position, ...)
        at ``step`` and blocks until written. SIGINT/SIGTERM arriving meanwhile are delivered
        once the step is committed (:func:`defer_interrupts`)."""
        with defer_interrupts():
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)
                ),
                force=True,
            )
            self._manager.wait_until_finished()

    def _restore_step(self, step: int, target: Any) -> tuple[Any, dict[str, Any]]:
        with _quiet_unraisable():
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target), metadata=ocp.args.JsonRestore()
                ),
            )
        return restored["state"], dict(restored["metadata"])

    def _saved_leaves(self, step: int) -> list[tuple[tuple[int, ...], str]]:
        """Sorted (shape, dtype) of every array saved at ``step``, from orbax's tree metadata.

        Raises:
          ValueError: the tree metadata is missing or unreadable.
        """
        handler = ocp.StandardCheckpointHandler()
        try:
            tree = handler.metadata(epath.Path(self.directory) / str(step) / "state")
        finally:
            handler.close()
        if tree is None:
            raise ValueError("its state has no tree metadata")
        return sorted((tuple(leaf.shape), str(leaf.dtype)) for leaf in jax.tree.leaves(tree))

    def restore_newest(self, abstract_state: Any,
                       check_metadata: Callable[[dict[str, Any]], None] | None = None
                       ) -> Restored | None:
        """Restores the newest step that restores cleanly, moving damaged newer steps aside.

        Each step, newest first: its metadata is read and given to ``check_metadata`` (which may
        raise to refuse the directory, e.g. a checkpoint of another run), its saved arrays' shapes
        and dtypes are compared with ``abstract_state``'s, and then it is restored. A step whose
        metadata or arrays cannot be read is damaged: a warning on stderr names it, it is moved to
        ``<directory>.damaged/<step>`` (kept, not deleted), and the next older step is tried.

        Args:
          abstract_state: a pytree like the saved state (arrays or ``jax.ShapeDtypeStruct``s); its
            shardings are used for the restored arrays.
          check_metadata: called with each readable step's metadata before its state is read.

        Returns:
          A :class:`Restored`, or ``None`` when the directory holds no step.

        Raises:
          ValueError: the newest readable step saved arrays of other shapes or dtypes than
            ``abstract_state`` (a checkpoint of another model; nothing is moved), or
            ``check_metadata`` refused a step.
          CheckpointRestoreError: every step is damaged (they are left in place).
        """
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        expected = sorted((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves(target))
        damaged: list[tuple[int, str]] = []
        for step in self.all_steps():
            try:
                metadata = self.restore_metadata(step)
            except Exception as e:  # noqa: BLE001 - any unreadable metadata marks a damaged step
                damaged.append((step, f"metadata unreadable ({_first_line(e)})"))
                continue
            if check_metadata is not None:
                check_metadata(metadata)
            try:
                saved = self._saved_leaves(step)
            except Exception as e:  # noqa: BLE001
                damaged.append((step, f"state unreadable ({_first_line(e)})"))
                continue
            if saved != expected:
                raise ValueError(
                    f"{self.directory}: step {step} saved {len(saved)} arrays that do not match "
                    f"this run's {len(expected)} (other shapes or dtypes)")
            try:
                state, metadata = self._restore_step(step, target)
            except Exception as e:  # noqa: BLE001 - e.g. a truncated or missing array file
                damaged.append((step, f"state unreadable ({_first_line(e)})"))
                continue
            for bad, reason in damaged:
                # one process moves (every host of a multi-host run sees the same directory)
                where = self._set_aside(bad) if jax.process_index() == 0 else "the side"
                _warn(f"{self.directory}: step {bad} does not restore: {reason}; restored step "
                      f"{step} instead and moved step {bad} to {where}")
            return Restored(state, metadata, step, damaged)
        if damaged:
            listed = "; ".join(f"step {s}: {r}" for s, r in damaged)
            raise CheckpointRestoreError(
                f"{self.directory}: no checkpoint restores cleanly ({listed}); move that "
                "directory aside to train from scratch")
        return None

    def _set_aside(self, step: int) -> str:
        """Moves step folder ``step`` to ``<directory>.damaged/<step>[-<n>]``; returns the path."""
        parent = f"{self.directory}.damaged"
        os.makedirs(parent, exist_ok=True)
        dest, n = os.path.join(parent, str(step)), 1
        while os.path.exists(dest):
            dest, n = os.path.join(parent, f"{step}-{n}"), n + 1
        shutil.move(os.path.join(self.directory, str(step)), dest)
        self._manager.reload()
        return dest

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restores ``(state, metadata)`` at ``step``, or by default the newest step that
        restores cleanly (see :meth:`restore_newest`).

        Args:
          abstract_state: a pytree like the saved state (arrays or ``jax.ShapeDtypeStruct``s);
            its shardings are used for the restored arrays.

        Raises:
          FileNotFoundError: no checkpoint exists in the directory.
          CheckpointRestoreError: no step restores cleanly.
        """
        if step is None:
            found = self.restore_newest(abstract_state)
            if found is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
            return found.state, found.metadata
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        return self._restore_step(step, target)

    def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The metadata dict saved at ``step`` (default: the newest step), without reading the
        state.

        Raises:
          FileNotFoundError: no checkpoint exists in the directory.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self._manager.restore(
            step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))
        return dict(restored["metadata"])

    def close(self) -> None:
        self._manager.close()


# ------------------------------------------------------------------------------------------------
# The run-directory lock.

_HELD: dict[str, list] = {}  # real path -> [FileLock, depth]: re-entrant within this process


def lock_holder(directory: str) -> str:
    """A description of the process recorded as holding ``directory``'s lock ("pid 123 on host
    h since <time>: <command>"), or ``"an unknown process"`` when nothing readable is recorded."""
    try:
        with open(os.path.join(directory, HOLDER_FILE)) as f:
            h = json.load(f)
        return (f"pid {h['pid']} on host {h['host']} since {h['since']}"
                + (f" ({h['command']})" if h.get("command") else ""))
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


@contextlib.contextmanager
def run_dir_lock(directory: str) -> Iterator[None]:
    """Holds an exclusive lock on the run directory ``directory`` (created if missing).

    The lock is ``<directory>/.lock`` (``filelock``; released by the OS if the process dies), and
    ``<directory>/.lock.holder`` records the holder's pid, host, start time and command line for
    the error message of a second process. Re-entrant within one process. Object-store paths
    (``gs://...``) are not locked.

    Raises:
      RunDirectoryInUseError: another process holds the lock (one line naming it).
    """
    if "://" in directory:
        yield
        return
    os.makedirs(directory, exist_ok=True)
    path = os.path.realpath(directory)
    if path in _HELD:
        _HELD[path][1] += 1
        try:
            yield
        finally:
            _HELD[path][1] -= 1
        return
    lock = filelock.FileLock(os.path.join(path, LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise RunDirectoryInUseError(
            f"{directory} is in use by {lock_holder(path)}; wait for it to finish or use another "
            "--workdir") from None
    holder = os.path.join(path, HOLDER_FILE)
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)[:300]}
    with open(holder, "w") as f:
        json.dump(record, f)
    _HELD[path] = [lock, 1]
    try:
        yield
    finally:
        del _HELD[path]
        with contextlib.suppress(OSError):
            os.remove(holder)
        lock.release()
