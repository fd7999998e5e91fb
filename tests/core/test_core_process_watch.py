"""core.process_watch: the watch over a child process (the main job runs each isolated experiment
under it): a hang is a lack of progress (no output line, no file written), not a long run.

The children are real processes, but no outcome depends on how fast this machine runs them: the
watcher runs on a clock that the test moves (``clock=``, ``sleep=``), and a child that must make
progress takes each step only when the test tells it to. So a child's start-up and the machine's
load take no time on the watcher's clock, and the gaps between steps are exact. Real time is
spent only waiting for a child's step (up to ``GUARD_S``, a guard against a broken child, never a
margin on its speed).
"""

import os
import signal
import sys
import textwrap
import time

import pytest

from core import process_watch

GUARD_S = 120.0  # real seconds a child may take for one step before the test gives up


def _script(body):
    return [sys.executable, "-c", textwrap.dedent(body)]


def _stepped(ctl, steps, step_body):
    """A child that runs ``step_body`` (with ``i`` the step number) once each time a file
    ``<ctl>/<i>`` appears, then exits 0."""
    return _script(f"""
        import os, sys, time
        for i in range({steps}):
            while not os.path.exists(os.path.join({str(ctl)!r}, str(i))):
                time.sleep(0.002)
{textwrap.indent(textwrap.dedent(step_body), " " * 12)}
    """)


class _Lines:
    """Stands in for ``sys.stdout`` / ``sys.stderr``: records the lines the watcher forwards."""

    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    def flush(self):
        pass


class _Pacer:
    """The watcher's clock and ``sleep``, in step with a child built by :func:`_stepped`.

    Each ``sleep`` moves the clock by the poll interval; once the clock has reached step ``i``'s
    time, ``i * gap``, it lets the child take that step and waits (in real time) until
    ``visible(i)`` says that the step can be seen. So the child makes progress exactly every
    ``gap`` seconds of the watcher's clock, and its start-up takes none. After the last step the
    clock stands still while the child exits.
    """

    def __init__(self, ctl, steps, gap, visible):
        self.ctl, self.steps, self.gap, self.visible = ctl, steps, gap, visible
        self.t, self.taken = 0.0, 0

    def clock(self):
        return self.t

    def sleep(self, poll_s):
        if self.taken == self.steps:
            time.sleep(0.002)  # let the child exit
            return
        self.t += poll_s
        if self.t >= self.taken * self.gap:
            (self.ctl / str(self.taken)).touch()
            deadline = time.monotonic() + GUARD_S
            while not self.visible(self.taken):
                assert time.monotonic() < deadline, f"the child did not take step {self.taken}"
                time.sleep(0.002)
            self.taken += 1


def _forwarded(monkeypatch):
    """Records the lines the watcher forwards to stdout and stderr. (Called in the test itself:
    pytest's capture puts its own ``sys.stdout`` back when the test body starts.)"""
    out, err = _Lines(), _Lines()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return out, err


def _printing_child(tmp_path, monkeypatch, steps, gap):
    out, err = forwarded = _forwarded(monkeypatch)
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    cmd = _stepped(ctl, steps, """
        if i == 0:
            print("a line on stderr", file=sys.stderr, flush=True)
        print(f"step {i}", flush=True)
    """)
    return cmd, _Pacer(ctl, steps, gap, lambda i: len(out.lines) > i and err.lines), forwarded


# Times below are multiples of 1/8 s, exact in binary, so that they can be compared with ==.
# The poll interval is 1/8 s and the stall limit 1 s: the files are looked for every 1/4 s.

def test_a_slow_run_that_keeps_printing_is_not_stopped(tmp_path, monkeypatch):
    # 12 lines half a stall limit apart: 5.5 stall limits from the first to the last
    cmd, pacer, forwarded = _printing_child(tmp_path, monkeypatch, steps=12, gap=0.5)
    outcome, code, _ = process_watch.watch(cmd, str(tmp_path / "run"), stall_s=1.0, poll_s=0.125,
                                           clock=pacer.clock, sleep=pacer.sleep)
    assert (outcome, code, pacer.t) == ("exited", 0, 5.5)
    out, err = forwarded
    assert "".join(out.lines) == "".join(f"step {i}\n" for i in range(12))  # whole, in order
    assert err.lines == ["a line on stderr\n"]


def test_a_gap_longer_than_the_stall_limit_stops_the_run(tmp_path, monkeypatch):
    # the same child with lines 1.5 stall limits apart: its first line comes at the first check
    # (1/8 s), and it is stopped at the first check more than 1 s later
    cmd, pacer, _ = _printing_child(tmp_path, monkeypatch, steps=12, gap=1.5)
    outcome, code, silent = process_watch.watch(cmd, str(tmp_path / "run"), stall_s=1.0,
                                                poll_s=0.125, clock=pacer.clock, sleep=pacer.sleep)
    assert (outcome, code, silent) == ("stalled", -signal.SIGTERM, 1.125)
    assert (pacer.t, pacer.taken) == (1.25, 1)


@pytest.mark.parametrize("gap, expected", [(0.5, ("exited", 0, 0.0, 5.5, 12)),
                                           (1.5, ("stalled", -signal.SIGTERM, 1.125, 1.375, 1))])
def test_a_silent_run_that_keeps_writing_files_is_not_stopped(tmp_path, gap, expected):
    # A write is seen at the next look at the files: the first (at 1/8 s) at 1/4 s. With writes
    # 1.5 s apart the run is stopped at the first check more than 1 s after that.
    ctl, run = tmp_path / "ctl", tmp_path / "run"
    ctl.mkdir()
    run.mkdir()
    log = run / "log.txt"
    cmd = _stepped(ctl, 12, f"""
        with open({str(log)!r}, "a") as f:
            f.write("x")
    """)
    pacer = _Pacer(ctl, 12, gap, lambda i: log.exists() and log.stat().st_size > i)
    outcome, code, silent = process_watch.watch(cmd, str(run), stall_s=1.0, poll_s=0.125,
                                                clock=pacer.clock, sleep=pacer.sleep)
    assert (outcome, code, silent, pacer.t, pacer.taken) == expected


def test_writes_in_a_required_experiments_folder_are_progress(tmp_path):
    # kv_quant training the lm it needs writes only under <workdir>/lm: with both folders watched
    # a write every 0.5 s keeps it going; with its own folder alone it is stopped as hung
    for folders, expected in (([tmp_path / "kv_quant", tmp_path / "lm"], ("exited", 0)),
                              ([tmp_path / "kv_quant"], ("stalled", -signal.SIGTERM))):
        ctl, lm = tmp_path / f"ctl{len(folders)}", tmp_path / "lm"
        ctl.mkdir()
        lm.mkdir(exist_ok=True)
        log = lm / f"train_metrics{len(folders)}.jsonl"
        cmd = _stepped(ctl, 8, f"""
            with open({str(log)!r}, "a") as f:
                f.write("x")
        """)
        pacer = _Pacer(ctl, 8, 0.5, lambda i, log=log: log.exists() and log.stat().st_size > i)
        outcome, code, _ = process_watch.watch(cmd, [str(f) for f in folders], stall_s=1.0,
                                               poll_s=0.125, clock=pacer.clock, sleep=pacer.sleep)
        assert (outcome, code) == expected


def test_an_object_store_folder_is_not_listed_and_output_alone_is_progress(tmp_path, monkeypatch):
    # a gs:// folder is never walked (os.walk of a URL would find nothing and hide that): lines
    # keep the run going, and the folder's files are not looked at
    monkeypatch.setattr(process_watch, "_files_state", lambda d: pytest.fail(f"listed {d}"))
    cmd, pacer, _ = _printing_child(tmp_path, monkeypatch, steps=6, gap=0.5)
    outcome, code, _ = process_watch.watch(cmd, ["gs://bucket/run/kv_quant", "gs://bucket/run/lm"],
                                           stall_s=1.0, poll_s=0.125, clock=pacer.clock,
                                           sleep=pacer.sleep)
    assert (outcome, code) == ("exited", 0)


class _Ticking:
    """A clock that moves by the poll interval at each ``sleep`` (and really sleeps a little, so
    that the child gets to run)."""

    def __init__(self):
        self.t = 0.0

    def clock(self):
        return self.t

    def sleep(self, poll_s):
        time.sleep(0.002)
        self.t += poll_s


def test_a_run_without_progress_is_stopped_as_hung(tmp_path):
    # never prints, never writes: stopped at the first check more than stall_s after its start,
    # whether or not it has got past its own start-up by then
    ticking = _Ticking()
    cmd = _script("import time; time.sleep(600)")
    outcome, code, silent = process_watch.watch(cmd, str(tmp_path), stall_s=4.0, poll_s=1.0,
                                                clock=ticking.clock, sleep=ticking.sleep)
    assert (outcome, code, silent) == ("stalled", -signal.SIGTERM, 5.0)
    assert ticking.t == 5.0


def test_the_optional_total_cap(tmp_path, monkeypatch):
    # a line every 0.5 s never stalls it, but the cap of 2 s ends it at the first check past 2 s,
    # 1/8 s after the line at 2 s
    cmd, pacer, _ = _printing_child(tmp_path, monkeypatch, steps=12, gap=0.5)
    outcome, code, silent = process_watch.watch(cmd, str(tmp_path / "run"), stall_s=1.0,
                                                timeout_s=2.0, poll_s=0.125, clock=pacer.clock,
                                                sleep=pacer.sleep)
    assert (outcome, code, silent) == ("timed out", -signal.SIGTERM, 0.125)
    assert (pacer.t, pacer.taken) == (2.125, 5)


def test_exit_code_of_a_failing_child_is_kept(tmp_path):
    # a clock that never moves: nothing but the child's exit can end the watch
    outcome, code, _ = process_watch.watch(_script("import sys; sys.exit(3)"), str(tmp_path), 1.0,
                                           poll_s=0.01, clock=lambda: 0.0)
    assert (outcome, code) == ("exited", 3)


def test_ctrl_c_is_passed_on_as_sigint_and_re_raised(tmp_path, monkeypatch):
    out, _ = _forwarded(monkeypatch)
    got = tmp_path / "got"
    cmd = _script(f"""
        import os, signal, sys, time
        def on_sigint(signum, frame):
            with open({str(got)!r}, "w") as f:
                f.write("SIGINT")
            print("not forwarded after Ctrl-C", flush=True)
            os._exit(0)
        signal.signal(signal.SIGINT, on_sigint)
        print("ready", flush=True)
        time.sleep(600)
    """)

    def sleep(_poll_s):
        deadline = time.monotonic() + GUARD_S
        while not out.lines:  # the handler is installed once "ready" is out
            assert time.monotonic() < deadline, "the child did not start"
            time.sleep(0.002)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        process_watch.watch(cmd, str(tmp_path), stall_s=1.0, clock=lambda: 0.0, sleep=sleep)
    assert got.read_text() == "SIGINT"
    assert out.lines == ["ready\n"]


def test_files_state_changes_with_each_file_created_grown_or_removed(tmp_path):
    # consecutive states only: two changes within one tick of the file system's clock may leave
    # the newest time as it was, but each change here also changes the count or the size
    state = process_watch._files_state
    assert state(str(tmp_path / "missing")) == (0, 0, 0)
    states = [state(str(tmp_path))]
    (tmp_path / "sub").mkdir()
    states.append(state(str(tmp_path)))
    (tmp_path / "sub" / "a").write_text("x")
    states.append(state(str(tmp_path)))
    with open(tmp_path / "sub" / "a", "a") as f:
        f.write("yz")
    states.append(state(str(tmp_path)))
    os.remove(tmp_path / "sub" / "a")
    states.append(state(str(tmp_path)))
    assert [s[1] for s in states] == [1, 2, 3, 3, 2]  # entries, the folder itself included
    assert states[3][2] - states[2][2] == 2  # the two bytes appended
    assert all(a != b for a, b in zip(states, states[1:]))
