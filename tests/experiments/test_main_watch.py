"""The main job's limits on an isolated experiment (``--stall_minutes``, ``--timeout_minutes``):
a value that is not a positive number of minutes is refused with one line. The watch itself is
tested in ``tests/core/test_core_process_watch.py``."""

import sys

import pytest

from tests.experiments import forked_cli

LIMIT_FLAGS = ["--stall_minutes=-1", "--stall_minutes=0", "--timeout_minutes=-1",
               "--timeout_minutes=0"]


@pytest.fixture(scope="module")
def limit_runs():
    """Every flag of LIMIT_FLAGS given to ``experiments.main``, run as forks of one process."""
    return forked_cli.run_commands({
        flag: [sys.executable, "-m", "experiments.main", flag, "--only_check_args"]
        for flag in LIMIT_FLAGS})


@pytest.mark.parametrize("flag", LIMIT_FLAGS)
def test_non_positive_limits_are_rejected(limit_runs, flag):
    proc = limit_runs[flag]
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "expected a positive number of minutes" in lines[0], lines
