"""Shared experiment plumbing: the per-experiment absl entry point and output paths."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import ml_collections

from core import report, sharding


def experiment_dir(workdir: str, name: str) -> str:
    """``<workdir>/<name>``, created if missing."""
    path = os.path.join(workdir, name)
    os.makedirs(path, exist_ok=True)
    return path


def check_data_path(path: str | None, what: str) -> str | None:
    """Returns ``path`` unchanged if it is empty or an existing file.

    Raises:
      FileNotFoundError: the file does not exist (the message names it and ``what`` it is).
    """
    if path and not os.path.exists(path):
        raise FileNotFoundError(f"{what}: data file {path!r} does not exist")
    return path or None


def app_main(name: str, run: Callable[[ml_collections.ConfigDict, str], report.Section]) -> None:
    """``python -m experiments.<name> --config=experiments/configs/<name>.py:tiny --workdir=DIR
    [--config.<field>=value ...]``: runs one experiment and writes ``DIR/report.md``."""
    from absl import app, flags, logging
    from ml_collections import config_flags

    config_flag = config_flags.DEFINE_config_file(
        "config", f"experiments/configs/{name}.py:tiny", "experiment config (file:variant)",
        lock_config=True)
    workdir_flag = flags.DEFINE_string("workdir", "workdir", "output directory")
    multihost = flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() first")

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
        sharding.initialize_distributed(multihost.value)
        try:
            section = run(config_flag.value, workdir_flag.value)
        except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
            print(f"error: {name}: {e}", file=sys.stderr)
            return 2
        # <workdir>/<name>/report.md, so runs of several experiments into one workdir coexist.
        path = report.write_report(os.path.join(workdir_flag.value, name, "report.md"),
                                   f"Report: {name} ({config_flag.value.get('variant', '')})",
                                   [section])
        print(f"report: {os.path.abspath(path)}", file=sys.stderr)
        return 0

    app.run(main)
