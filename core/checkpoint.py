"""Checkpoints with orbax, the run-directory lock, and interrupts deferred while a save commits.

Saves are atomic on a local file system (orbax writes to a temporary directory and renames it on
completion), but a step folder can still be damaged afterwards (a truncated or deleted array file,
a copy that stopped half-way, a missing metadata item). Restoring walks the steps from the newest
down and restores the newest one that restores cleanly: a damaged step is named in a warning on
stderr and moved aside to ``<directory>.damaged/`` (never deleted), so that the run can save that
step number again. Restoring needs an abstract target (shapes, dtypes and shardings) so arrays come
back exactly as they were saved.

Directories may be local or object-store URLs (``gs://bucket/run``): orbax is given an
``epath.Path``, and on an object store it marks a finished step with a commit file instead of a
rename.

One process at a time may write into a run directory: :func:`run_dir_lock` takes a file lock
(``filelock``) and records the holder's pid and host in a side file, so a second process stops with
one line naming the holder instead of interleaving its logs and checkpoints with the first's. An
object store has no file locks: there the lock is an object holding a unique holder id, written,
read back after a pause, and renewed while held (:func:`run_dir_lock` says how far that goes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import filelock
import jax
import orbax.checkpoint as ocp

from core import files

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
      directory: where step folders are written (created if missing): a local path (made
        absolute) or an object-store URL such as ``gs://bucket/run/checkpoints``.
      max_to_keep: how many recent checkpoints to keep.

    Attributes:
      directory: the directory as a string (absolute path or URL).
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2):
        self.directory = files.display(directory)
        self._manager = ocp.CheckpointManager(
            files.as_path(self.directory),
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
            tree = handler.metadata(files.as_path(self.directory) / str(step) / "state")
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
        parent = files.makedirs(f"{self.directory}.damaged")
        dest, n = parent / str(step), 1
        while dest.exists():
            dest, n = parent / f"{step}-{n}", n + 1
        source = files.as_path(self.directory) / str(step)
        if files.is_local(self.directory):
            shutil.move(os.fspath(source), os.fspath(dest))
        else:  # an object store: a copy of every object, then the originals removed
            source.rename(dest)
        self._manager.reload()
        return files.join(os.fspath(parent), dest.name)

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

_HELD: dict[str, list] = {}  # real path or URL -> [lock, depth]: re-entrant within this process

# The object-store lock (see run_dir_lock): seconds between writing the lock object and reading it
# back, between two renewals, and without renewal after which a lock is taken as abandoned.
REMOTE_SETTLE_S = 2.0
REMOTE_RENEW_S = 60.0
REMOTE_STALE_S = 600.0


def _describe(h: dict[str, Any]) -> str:
    return (f"pid {h['pid']} on host {h['host']} since {h['since']}"
            + (f" ({h['command']})" if h.get("command") else ""))


def _holder_record() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)[:300]}


def lock_holder(directory: str) -> str:
    """A description of the process recorded as holding ``directory``'s lock ("pid 123 on host
    h since <time>: <command>"), or ``"an unknown process"`` when nothing readable is recorded."""
    name = HOLDER_FILE if files.is_local(directory) else LOCK_FILE
    try:
        return _describe(json.loads(files.read_text(files.join(directory, name))))
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process"


@contextlib.contextmanager
def run_dir_lock(directory: str | os.PathLike) -> Iterator[None]:
    """Holds an exclusive lock on the run directory ``directory`` (created if missing).

    On a local file system the lock is ``<directory>/.lock`` (``filelock``; released by the OS if
    the process dies), and ``<directory>/.lock.holder`` records the holder's pid, host, start time
    and command line for the error message of a second process.

    On an object store (``gs://...``), which has no locks, ``<directory>/.lock`` is an object
    recording a random holder id with the pid, host and command. It is taken when absent or
    abandoned: written, then read back after ``REMOTE_SETTLE_S`` seconds, and kept only if it
    still holds this process's id (of two processes that wrote it together, the later writer
    keeps it and the other stops). While held, a thread renews it every ``REMOTE_RENEW_S``
    seconds; one not renewed for ``REMOTE_STALE_S`` seconds (by the wall clocks of the hosts
    involved) is abandoned (its holder was killed) and is taken over with a warning; on exit it is
    removed. This lock is advisory: it stops a second run started by mistake, but two processes
    whose writes are more than ``REMOTE_SETTLE_S`` apart in the store yet cross each other's
    reads are not excluded, and a holder whose renewals stop for ``REMOTE_STALE_S`` loses it.

    Re-entrant within one process.

    Raises:
      RunDirectoryInUseError: another process holds the lock (one line naming it).
    """
    text = os.fspath(directory)
    local = files.is_local(text)
    if local:
        os.makedirs(files.as_path(text), exist_ok=True)
        key = os.path.realpath(files.as_path(text))
    else:
        key = text.rstrip("/")
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    lock = _LocalLock(key, text) if local else _ObjectLock(key)
    lock.acquire()
    _HELD[key] = [lock, 1]
    try:
        yield
    finally:
        del _HELD[key]
        lock.release()


class _LocalLock:
    """``filelock`` on ``<path>/.lock`` plus the holder record in ``<path>/.lock.holder``."""

    def __init__(self, path: str, shown: str):
        self.path, self.shown = path, shown
        self._lock = filelock.FileLock(os.path.join(path, LOCK_FILE), timeout=0)

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise RunDirectoryInUseError(
                f"{self.shown} is in use by {lock_holder(self.path)}; wait for it to finish or use "
                "another --workdir") from None
        with open(os.path.join(self.path, HOLDER_FILE), "w") as f:
            json.dump(_holder_record(), f)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(self.path, HOLDER_FILE))
        self._lock.release()


class _ObjectLock:
    """The object-store lock of :func:`run_dir_lock`: ``<url>/.lock`` with a holder id, renewed by a
    daemon thread."""

    def __init__(self, url: str, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep):
        self.url, self.path = url, files.join(url, LOCK_FILE)
        self._clock, self._sleep = clock, sleep
        self.record = {**_holder_record(), "id": uuid.uuid4().hex}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> dict[str, Any] | None:
        try:
            record = json.loads(files.read_text(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable (not JSON): no renewal time, so taken as abandoned
        return record if isinstance(record, dict) else {}

    def _write(self) -> None:
        files.write_text(self.path, json.dumps({**self.record, "renewed": self._clock()}))

    def _refuse(self, found: dict[str, Any]) -> RunDirectoryInUseError:
        try:
            who = _describe(found)
        except KeyError:
            who = "an unknown process"
        return RunDirectoryInUseError(
            f"{self.url} is in use by {who}; wait for it to finish or use another --workdir (if "
            f"that process is gone, delete {self.path}, or wait {REMOTE_STALE_S:.0f} s after its "
            "last renewal)")

    def acquire(self) -> None:
        found = self._read()
        if found is not None:
            renewed = found.get("renewed")
            age = self._clock() - renewed if isinstance(renewed, (int, float)) else math.inf
            if age < REMOTE_STALE_S:
                raise self._refuse(found)
            when = "no renewal recorded" if math.isinf(age) else f"last renewed {age:.0f} s ago"
            _warn(f"{self.url}: taking over an abandoned run lock ({lock_holder(self.url)}; {when})")
        self._write()
        self._sleep(REMOTE_SETTLE_S)
        now = self._read()
        if now is None or now.get("id") != self.record["id"]:
            raise self._refuse(now or {})
        self._thread = threading.Thread(target=self._renew, daemon=True, name="run-dir-lock")
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(REMOTE_RENEW_S):
            try:
                found = self._read()
                if found is None or found.get("id") != self.record["id"]:
                    _warn(f"{self.url}: the run lock was taken by "
                          f"{lock_holder(self.url)}; this run no longer holds it")
                    return
                self._write()
            except Exception as e:  # noqa: BLE001 - a failed renewal is retried at the next tick
                _warn(f"{self.url}: could not renew the run lock ({_first_line(e)})")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            found = self._read()
            if found is not None and found.get("id") == self.record["id"]:
                files.remove(self.path)
