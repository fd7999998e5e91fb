"""Checkpoints with orbax: model and optimizer state, step, and data position.

Saves are atomic (orbax writes to a temporary directory and renames it on completion), so a run
killed mid-save keeps the previous checkpoint intact. Restoring needs an abstract target (shapes,
dtypes and shardings) so arrays come back exactly as they were saved.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


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
        """The newest complete checkpoint's step, or ``None``."""
        return self._manager.latest_step()

    def save(self, step: int, state: Any, metadata: dict[str, Any]) -> None:
        """Saves the pytree ``state`` and a JSON-able ``metadata`` dict (step, data position, ...)
        at ``step`` and blocks until written."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)
            ),
            force=True,
        )
        self._manager.wait_until_finished()

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restores ``(state, metadata)`` at ``step`` (default: latest).

        Args:
          abstract_state: a pytree like the saved state (arrays or ``jax.ShapeDtypeStruct``s);
            its shardings are used for the restored arrays.

        Raises:
          FileNotFoundError: no checkpoint exists in the directory.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), metadata=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["metadata"])

    def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The metadata dict saved at ``step`` (default: latest), without reading the state.

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
