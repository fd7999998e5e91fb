"""Command-line behaviour of ``python -m experiments.<name>`` and ``python -m experiments.main``:
one-line errors with exit status 2, ``--helpshort`` listing the entry point's flags, and the
report of a ``smoke`` run judging no claim."""

import os
import subprocess
import sys

import pytest

from core import report
from experiments import main as main_lib
from tests.experiments import forked_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "--config=experiments/configs/judge_btl.py:smoke"


def _cmd(*args, module="experiments.judge_btl", only_check_args=True):
    # --only_check_args: absl exits 0 right after a successful parse, so nothing runs
    extra = ["--only_check_args"] if only_check_args else []
    return [sys.executable, "-m", module, *args, *extra]


BAD_EXPERIMENT_FLAGS = [
    ((CONFIG, "--config.sed=1"), "config has no field 'sed' (did you mean 'seed'?)"),
    # no --config: ml_collections would fail while the flag is being defined
    (("--config.sed=1",), "config has no field 'sed' (did you mean 'seed'?)"),
    ((CONFIG, "--config.sim.num_model=3"), "did you mean 'sim.num_models'"),
    ((CONFIG, "--config.seed=abc"), "--config.seed=abc: expected int"),
    (("--config=experiments/configs/judge_btl.py:smok",),
     "unknown config variant 'smok' (did you mean 'smoke'?)"),
    (("--config=experiments/configs/nope.py:tiny",), "'experiments/configs/nope.py' does not exist"),
    ((CONFIG, "--workdr=x"), "Unknown command line flag 'workdr'"),
]
HELPSHORT = [
    ("experiments.judge_btl", ("--config", "--workdir", "--[no]multihost")),
    ("experiments.main", ("--experiments", "--variant", "--workdir", "--timeout_minutes",
                          "--[no]isolate")),
]
# Every command line of this module, run once as forks of one process (forked_cli).
COMMANDS = {
    **{args: _cmd(*args) for args, _ in BAD_EXPERIMENT_FLAGS},
    "valid overrides": _cmd(CONFIG, "--config.seed=3", "--config.columns.judge=annotator",
                            "--config.ridge_grid=1.0", "--config.ridge_grid=2.0",
                            "--workdir=unused"),
    # the variant is checked in main(), before any experiment runs
    "main bad variant": _cmd("--variant=smok", "--experiments=judge_btl", "--workdir=unused",
                             module="experiments.main", only_check_args=False),
    "main bad timeout": _cmd("--timeout_minutes=x", module="experiments.main"),
    **{f"help {module}": [sys.executable, "-m", module, "--helpshort"] for module, _ in HELPSHORT},
    # Plain modules, whose own processes are cheap: the forks must behave as those do.
    "stdout, status 0": [sys.executable, "-m", "platform", "--terse"],
    "stderr, status 2": [sys.executable, "-m", "json.tool", "--no-such-flag"],
    "uncaught exception": [sys.executable, "-m", "zipfile", "-l", "/no/such/file.zip"],
}


@pytest.fixture(scope="module")
def runs():
    return forked_cli.run_commands(COMMANDS)


@pytest.mark.parametrize("key", ["stdout, status 0", "stderr, status 2"])
def test_a_forked_command_line_behaves_as_its_own_process(runs, key):
    own = subprocess.run(COMMANDS[key], cwd=ROOT, capture_output=True, text=True, timeout=60)
    forked = runs[key]
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (own.returncode, own.stdout, own.stderr)
    assert own.returncode == int(key[-1]) and (own.stdout if key[-1] == "0" else own.stderr)


def test_a_forked_uncaught_exception_is_a_traceback_and_status_1(runs):
    own = subprocess.run(COMMANDS["uncaught exception"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    forked = runs["uncaught exception"]
    assert forked.returncode == own.returncode == 1
    # the frames above the module's own differ (runpy's entry point); the error does not
    assert forked.stderr.startswith("Traceback (most recent call last):")
    assert forked.stderr.splitlines()[-1] == own.stderr.splitlines()[-1]
    assert "FileNotFoundError" in own.stderr.splitlines()[-1]


def _one_error_line(proc, prefix):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


@pytest.mark.parametrize("args, expected", BAD_EXPERIMENT_FLAGS)
def test_experiment_bad_flags_give_one_line_and_status_2(runs, args, expected):
    line = _one_error_line(runs[args], "error: judge_btl: ")
    assert expected in line


def test_experiment_valid_overrides_parse(runs):
    proc = runs["valid overrides"]
    assert proc.returncode == 0, proc.stderr


def test_main_bad_flags_give_one_line_and_status_2(runs):
    line = _one_error_line(runs["main bad variant"], "error: main: ")
    assert "unknown config variant 'smok' (did you mean 'smoke'?)" in line
    line = _one_error_line(runs["main bad timeout"], "error: main: ")
    assert "--timeout_minutes=x: expected float" in line


@pytest.mark.parametrize("module, expected", HELPSHORT)
def test_helpshort_lists_the_entry_points_flags(runs, module, expected):
    proc = runs[f"help {module}"]
    flags_part = proc.stdout.split("\nflags:\n", 1)
    assert len(flags_part) == 2, proc.stdout
    listed = [line.split(":")[0].strip() for line in flags_part[1].splitlines()
              if line.startswith("  --")]
    for flag in expected:
        assert flag in listed, listed


def _sections():
    return [
        report.Section("a", headline={"method": "A", "claim": "c", "ours": "1", "reproduces": "no"}),
        report.Section("b", headline={"method": "B", "claim": "c", "ours": "2",
                                      "reproduces": "yes"}),
        report.Section("c: FAILED", headline={"method": "C", "claim": "", "ours": "boom",
                                              "reproduces": "failed"}),
    ]


def _table_verdicts(text):
    rows = [line for line in text.splitlines() if line.startswith("| ") and "method" not in line]
    return {r.split("|")[1].strip(): r.split("|")[4].strip() for r in rows}


@pytest.mark.parametrize("variant", ["smoke", "smoke,seed=1"])
def test_smoke_report_judges_no_claim(tmp_path, variant):
    path = main_lib.write_main_report(str(tmp_path), variant, ["a", "b", "c"], _sections(), 3.0)
    text = open(path).read()
    assert _table_verdicts(text) == {"A": "n/a (smoke)", "B": "n/a (smoke)", "C": "failed"}
    notice = text.split("\n\n")[1]  # the first paragraph under the title
    assert "`smoke`" in notice and "meaningless" in notice


def test_tiny_report_keeps_verdicts(tmp_path):
    sections = _sections()
    path = main_lib.write_main_report(str(tmp_path), "tiny", ["a", "b", "c"], sections, 3.0)
    text = open(path).read()
    assert _table_verdicts(text) == {"A": "no", "B": "yes", "C": "failed"}
    assert "meaningless" not in text
    assert sections[0].headline["reproduces"] == "no"  # the sections themselves are not changed
