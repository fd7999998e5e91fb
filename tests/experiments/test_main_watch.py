"""The main job's watch over an isolated experiment: a hang is a lack of progress (no output line,
no file written), not a long run. Children are small Python scripts, so each case takes seconds."""

import sys
import textwrap

import pytest

from experiments import main as main_lib


def _script(body):
    return [sys.executable, "-c", textwrap.dedent(body)]


def test_a_slow_run_that_keeps_printing_is_not_stopped(tmp_path, capfd):
    # runs 4x longer than the stall limit, printing a line every 0.25 s
    cmd = _script("""
        import time
        for i in range(12):
            print(f"step {i}", flush=True)
            time.sleep(0.25)
    """)
    outcome, code, _ = main_lib.watch(cmd, str(tmp_path), stall_s=0.75, poll_s=0.05)
    assert (outcome, code) == ("exited", 0)
    out = capfd.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("step")] == \
        [f"step {i}" for i in range(12)]  # forwarded whole and in order


def test_a_silent_run_that_keeps_writing_files_is_not_stopped(tmp_path):
    cmd = _script(f"""
        import time
        for i in range(12):
            with open({str(tmp_path / "log.txt")!r}, "a") as f:
                f.write("x")
            time.sleep(0.25)
    """)
    outcome, code, _ = main_lib.watch(cmd, str(tmp_path), stall_s=0.75, poll_s=0.05)
    assert (outcome, code) == ("exited", 0)


def test_a_run_without_progress_is_stopped_as_hung(tmp_path):
    cmd = _script("""
        import time
        print("started", flush=True)
        time.sleep(120)
    """)
    outcome, code, silent = main_lib.watch(cmd, str(tmp_path), stall_s=1.0, poll_s=0.05)
    assert outcome == "stalled" and code != 0
    assert 1.0 < silent < 60


def test_the_optional_total_cap(tmp_path):
    cmd = _script("""
        import time
        while True:
            print("busy", flush=True)
            time.sleep(0.1)
    """)
    outcome, code, _ = main_lib.watch(cmd, str(tmp_path), stall_s=30, timeout_s=1.0, poll_s=0.05)
    assert outcome == "timed out" and code != 0


def test_exit_code_of_a_failing_child_is_kept(tmp_path):
    outcome, code, _ = main_lib.watch(_script("import sys; sys.exit(3)"), str(tmp_path), 30,
                                      poll_s=0.05)
    assert (outcome, code) == ("exited", 3)


@pytest.mark.parametrize("flag", ["--stall_minutes=-1", "--stall_minutes=0",
                                  "--timeout_minutes=-1", "--timeout_minutes=0"])
def test_non_positive_limits_are_rejected(flag):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "experiments.main", flag, "--only_check_args"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "expected a positive number of minutes" in lines[0], lines
