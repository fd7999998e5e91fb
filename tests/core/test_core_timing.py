"""core.timing: the stopwatch on a clock the test moves (no wall-clock margins), and the module's
promise that it can be imported without JAX. (best_seconds is tested with the benchmarks.)"""

import os
import subprocess
import sys

import pytest

from core import timing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_stopwatch_block_reads_running_time_inside_and_the_total_after():
    clock = _Clock()
    clock.t = 10.0
    with timing.Stopwatch(clock) as sw:
        clock.t += 1.5
        assert sw.seconds == 1.5  # running
        clock.t += 0.25
    clock.t += 100.0  # after the block: the total stays
    assert sw.seconds == 1.75


def test_stopwatch_start_for_a_span_that_is_not_one_block():
    clock = _Clock()
    sw = timing.Stopwatch(clock)
    with pytest.raises(RuntimeError, match="before the stopwatch was started"):
        _ = sw.seconds
    assert sw.start() is sw
    clock.t = 2.0
    assert sw.seconds == 2.0
    sw.start()  # restarts
    clock.t = 2.5
    assert sw.seconds == 0.5


def test_the_default_clock_is_monotonic_now():
    sw = timing.Stopwatch().start()
    readings = [timing.now() for _ in range(1000)]
    assert readings == sorted(readings) and sw.seconds >= readings[-1] - readings[0] >= 0.0


def test_importing_timing_does_not_import_jax():
    # the main job reads the clock before it imports JAX (bad flags must fail fast)
    code = "import sys, core.timing; print('jax' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
