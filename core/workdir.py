"""The output directory (workdir) of an entry point: checked before any work, locked while one
process writes into it. A workdir is a local path or an object-store URL (``gs://bucket/run``)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence

from core import files


def check_workdir(workdir: str, names: Sequence[str] = ()) -> str:
    """Checks, before any work, that ``workdir`` can hold the outputs of experiments ``names``.

    ``workdir`` is created if missing; it and any existing ``<workdir>/<name>`` must be writable
    directories (a file is written and removed in each to make sure, since permission bits do
    not tell for every user or file system). For an object-store URL (``gs://bucket/run``) a
    probe object is written, read back and removed under ``workdir``, so that a missing client
    library (``gcsfs``: the ``gcs`` extra), missing credentials or a bucket that does not exist
    are reported here rather than after the first experiment's work.

    Returns:
      ``workdir``.

    Raises:
      ValueError: one line: the path is empty, is (or has in its path) a file, cannot be created,
        or is not writable; the message names the path and the reason.
    """
    if not workdir:
        raise ValueError("--workdir is empty; expected a directory path")
    where = f"--workdir={workdir}"
    if files.scheme(workdir) == "file":
        workdir = files.display(workdir)
    if not files.is_local(workdir):
        _check_remote_workdir(workdir, where)
        return workdir
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"{where}: it is a file, not a directory")
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{where}: cannot create it ({_os_reason(e)})") from None
    for path in [workdir] + [os.path.join(workdir, n) for n in names]:
        if not os.path.exists(path):
            continue
        if not os.path.isdir(path):
            raise ValueError(f"{where}: {path} is a file, not a directory")
        try:
            fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise ValueError(f"{where}: cannot write in {path} "
                             f"({e.strerror or type(e).__name__})") from None
    return workdir


def _check_remote_workdir(workdir: str, where: str) -> None:
    probe = files.join(workdir, f".write-check-{os.getpid()}-{time.monotonic_ns()}")
    try:
        files.write_text(probe, "probe\n")
        if files.read_text(probe) != "probe\n":
            raise OSError("a probe object written there read back different")
        files.remove(probe)
    except ImportError as e:
        raise ValueError(f"{where}: {files.missing_client(workdir, e)}") from None
    except Exception as e:  # noqa: BLE001 - any failure of the store: credentials, bucket, network
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{where}: cannot write there ({type(e).__name__}: {reason})") from None


def _os_reason(error: OSError) -> str:
    reason = error.strerror or type(error).__name__
    return f"{reason}: {error.filename}" if error.filename else reason


def lock_workdir(directory: str):
    """A context holding ``core.checkpoint.run_dir_lock(directory)`` on the first JAX process and
    doing nothing on the others (in a multi-host run every host writes into one shared workdir).

    Raises:
      core.checkpoint.RunDirectoryInUseError: another process holds the lock.
    """
    import contextlib

    import jax

    from core.checkpoint import run_dir_lock

    return run_dir_lock(directory) if jax.process_index() == 0 else contextlib.nullcontext()
