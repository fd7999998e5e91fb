"""A battery of bad inputs and interrupted runs, run as a user would: each must give one line on
stderr and a non-zero exit, or the right result.

The command-line cases stop before any JAX compilation; they run as subprocesses, several at a
time, started once for the module (``_fast`` below). One ``lm`` smoke run (about half a minute)
then serves the cases that need real checkpoints and logs: a rerun asking for fewer steps, a
torn log line and a damaged newest checkpoint, links of a report written to a relative workdir,
and progress output into a pipe.
"""

import atexit
import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from core.checkpoint import run_dir_lock
from core.report import read_json_lines
from experiments import registry
from tests.experiments import forked_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRATCH = tempfile.mkdtemp(prefix="bad-inputs-")
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
A_FILE = os.path.join(SCRATCH, "a_file")
LOCKED = os.path.join(SCRATCH, "locked")
SUB_IS_FILE = os.path.join(SCRATCH, "sub_is_file")
UNWRITABLE = "/sys/kernel"  # sysfs: no new files, even for root


def _setup():
    open(A_FILE, "w").close()
    os.makedirs(os.path.join(SUB_IS_FILE), exist_ok=True)
    open(os.path.join(SUB_IS_FILE, "lm"), "w").close()


def _cmd(module, *args):
    return [sys.executable, "-m", module, *args]


# name -> (command, expected exit code, text the one stderr line must contain)
CASES = {
    **{f"{name} workdir is a file": (_cmd(f"experiments.{name}", f"--workdir={A_FILE}"), 2,
                                     "it is a file, not a directory")
       for name in registry.EXPERIMENTS},
    "main workdir is a file": (_cmd("experiments.main", f"--workdir={A_FILE}"), 2,
                               "it is a file, not a directory"),
    "lm workdir cannot be created": (_cmd("experiments.lm", f"--workdir={A_FILE}/sub"), 2,
                                     "cannot create it"),
    "main workdir cannot be created": (_cmd("experiments.main", f"--workdir={A_FILE}/sub"), 2,
                                       "cannot create it"),
    "lm workdir not writable": (_cmd("experiments.lm", f"--workdir={UNWRITABLE}"), 2,
                                "cannot write in"),
    "main workdir not writable": (_cmd("experiments.main", f"--workdir={UNWRITABLE}"), 2,
                                  "cannot write in"),
    "lm output folder is a file": (_cmd("experiments.lm", f"--workdir={SUB_IS_FILE}"), 2,
                                   "lm is a file, not a directory"),
    "main negative time limit": (_cmd("experiments.main", "--timeout_minutes=-1"), 2,
                                 "--timeout_minutes=-1.0: expected a positive number"),
    "main zero stall limit": (_cmd("experiments.main", "--stall_minutes=0"), 2,
                              "--stall_minutes=0.0: expected a positive number"),
    "lm workdir in use": (_cmd("experiments.lm", f"--workdir={LOCKED}"), 2,
                          f"is in use by pid {os.getpid()} on host"),
    "main workdir in use": (_cmd("experiments.main", "--experiments=lm", f"--workdir={LOCKED}"), 2,
                            f"is in use by pid {os.getpid()} on host"),
}
HELP = {
    "lm": _cmd("experiments.lm", "--config=experiments/configs/lm.py:smoke", "--helpshort"),
    "main": _cmd("experiments.main", "--experiments=lm,spf", "--helpshort"),
}


def _default_sigint():
    # A job started in the background of a non-interactive shell inherits SIGINT ignored; the
    # child must start with the default disposition, as it does from a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_until_jax_is_loading(proc, guard_s=120.0):
    """Waits until ``proc`` has loaded JAX's native library: the entry module's imports are under
    way, so ``experiments/__init__.py`` has installed its Ctrl-C handler. (A fixed sleep would
    race the interpreter's start-up on a loaded machine.) Where there is no ``/proc``, waits 0.5 s."""
    maps = f"/proc/{proc.pid}/maps"
    if not os.path.exists("/proc/self/maps"):
        time.sleep(0.5)
        return
    deadline = time.monotonic() + guard_s  # a guard against a broken child, not a margin
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), open(maps) as f:
            if "jaxlib" in f.read():
                return
        time.sleep(0.005)


def _interrupted_at_start():
    proc = subprocess.Popen(_cmd("experiments.lm", f"--workdir={SCRATCH}/interrupted"),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    _wait_until_jax_is_loading(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def fast():
    """Every fast case, run while this process holds the lock of ``LOCKED``, as forks of one
    process (``forked_cli``); the interrupt at start-up, meanwhile, in a process of its own (it
    interrupts the imports)."""
    _setup()
    commands = {k: cmd for k, (cmd, _, _) in CASES.items()}
    commands |= {f"help {k}": cmd for k, cmd in HELP.items()}
    with run_dir_lock(os.path.join(LOCKED, "lm")), run_dir_lock(LOCKED):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            interrupt = pool.submit(_interrupted_at_start)
            return forked_cli.run_commands(commands) | {"interrupt": interrupt.result()}


def _one_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line_and_non_zero_exit(fast, case):
    if case.endswith("not writable") and os.access(UNWRITABLE, os.W_OK) and \
            _probe_writable(UNWRITABLE):
        pytest.skip(f"{UNWRITABLE} is writable here")
    _, code, expected = CASES[case]
    proc = fast[case]
    line = _one_line(proc)
    assert proc.returncode == code, (proc.returncode, line)
    assert line.startswith("error: ") and expected in line, line


def _probe_writable(path):
    try:
        fd, probe = tempfile.mkstemp(dir=path)
    except OSError:
        return False
    os.close(fd)
    os.remove(probe)
    return True


def test_interrupt_during_start_up_is_one_line_and_130(fast):
    proc = fast["interrupt"]
    line = _one_line(proc)
    assert proc.returncode == 130 and "interrupted" in line, (proc.returncode, line)


@pytest.mark.parametrize("which, expected", [
    ("lm", ["variants (--config=experiments/configs/lm.py:VARIANT", "tiny, smoke, paper",
            "defaults of `smoke`", "  steps = 4", "  model.d_model = 32", "  seed = 0",
            "  data_path = ''  # the text to train on: a text file, or comma-separated files"]),
    ("main", ["  tiny: every selected experiment", "config fields common to lm, spf",
              "  seed = 0", "--stall_minutes", "--timeout_minutes"]),
])
def test_helpshort_lists_variants_and_fields_and_exits_0(fast, which, expected):
    proc = fast[f"help {which}"]
    assert proc.returncode == 0, proc.stderr
    for text in expected:
        assert text in proc.stdout, (text, proc.stdout[-2000:])
    if which == "main":  # rl_scaling is not selected, so its `full` variant is not listed
        assert re.search(r"^  full: ", proc.stdout, re.M) is None


# ------------------------------------------------------------------------------------------------
# Cases that need a trained run: one lm smoke run, started from a relative workdir.

LM_CONFIG = f"--config={ROOT}/experiments/configs/lm.py:smoke"


def _lm(cwd, *args):
    return subprocess.run(_cmd("experiments.lm", LM_CONFIG, "--workdir=workdir", *args), cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("lm_run")
    proc = _lm(cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, proc


def test_progress_into_a_pipe_is_plain_lines(trained):
    _, proc = trained
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr
    assert any(line.startswith("lm: ") for line in proc.stderr.splitlines()), proc.stderr


def test_report_links_of_a_relative_workdir_open(trained):
    cwd, _ = trained
    report_md = cwd / "workdir" / "lm" / "report.md"
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report_md.read_text())
    assert links
    for link in links:
        with open(report_md.parent / link, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", link


def test_rerun_with_fewer_steps_is_refused(trained):
    cwd, _ = trained
    proc = _lm(cwd, "--config.steps=2")
    line = _one_line(proc)
    assert proc.returncode == 2 and "trained to step 4, beyond num_steps=2" in line, line


def test_torn_log_and_damaged_newest_checkpoint_resume_from_the_previous_step(trained):
    cwd, _ = trained
    run_dir = cwd / "workdir" / "lm"
    log = run_dir / "train_metrics.jsonl"
    assert [r["step"] for r in read_json_lines(str(log))] == [2, 4]
    with open(log, "a") as f:
        f.write('{"grad_norm": 1.0, "lo')  # a kill during the write
    os.remove(run_dir / "checkpoints" / "4" / "metadata" / "metadata")  # a damaged newest step
    proc = _lm(cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 4 does not restore" in proc.stderr and "restored step 2" in proc.stderr
    assert "resuming from step 2" in proc.stderr and "delete" not in proc.stderr
    assert [r["step"] for r in read_json_lines(str(log))] == [2, 4]  # each step once
    assert (run_dir / "checkpoints.damaged" / "4").is_dir()
