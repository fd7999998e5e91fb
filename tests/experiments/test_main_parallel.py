"""The main job with ``--jobs`` > 1: at most ``jobs`` isolated experiments at once, each started
only after the experiments it requires have finished; an experiment that times itself runs after
the others with nothing beside it; a folder taken by another process stops the job and every
running child. The children are stand-ins (threads that wait on events the test sets), so no
outcome depends on how fast this machine runs them."""

import threading
import time

import pytest

from core import report
from core.checkpoint import RunDirectoryInUseError
from experiments import main as main_lib

GUARD_S = 60.0  # real seconds the test waits for an event before it gives up


class _Children:
    """Stands in for ``main._run_isolated``: each child records its start, waits until the test
    releases it, and returns a section (or raises what the test planted)."""

    def __init__(self, fail=None):
        self.lock = threading.Lock()
        self.events = []  # ("start" | "end", name), in order
        self.running, self.most = set(), 0
        self.release = {}
        self.fail = fail or {}
        self.stops = {}

    def __call__(self, name, variant, workdir, stall_s, timeout_s=None, stop=None, prefix=""):
        assert prefix == f"[{name}] "
        with self.lock:
            self.events.append(("start", name))
            self.running.add(name)
            self.most = max(self.most, len(self.running))
            gate = self.release.setdefault(name, threading.Event())
        try:
            if name in self.fail:
                raise self.fail[name]
            deadline = time.monotonic() + GUARD_S
            while not gate.wait(0.005):
                if stop is not None and stop.is_set():
                    self.stops[name] = True
                    raise KeyboardInterrupt
                assert time.monotonic() < deadline, f"{name} was never released"
            verdict = "failed" if name == "spf" else "yes"
            return report.Section(f"{name}: run", "body", headline={
                "method": name, "claim": "", "ours": "", "reproduces": verdict})
        finally:
            with self.lock:
                self.running.discard(name)
                self.events.append(("end", name))

    def started(self, name):
        with self.lock:
            return ("start", name) in self.events

    def wait_started(self, name):
        deadline = time.monotonic() + GUARD_S
        while not self.started(name):
            assert time.monotonic() < deadline, f"{name} never started"
            time.sleep(0.002)

    def finish(self, name):
        """Releases ``name`` once it has started (waiting for its start) and waits for its end."""
        deadline = time.monotonic() + GUARD_S
        self.wait_started(name)
        with self.lock:
            gate = self.release.setdefault(name, threading.Event())
        gate.set()
        while ("end", name) not in self.events:
            assert time.monotonic() < deadline, f"{name} never ended"
            time.sleep(0.002)


def _run(children, monkeypatch, names, alone, script):
    """run_all with ``jobs=2`` on a thread of its own while ``script(children)`` releases the
    children; returns (sections, failed, names passed to on_done)."""
    monkeypatch.setattr(main_lib, "_run_isolated", children)
    result, done = {}, []

    def target():
        try:
            result["value"] = main_lib.run_all(
                names, "tiny", "unused", isolate=True, jobs=2, alone=frozenset(alone),
                on_done=lambda n, s: done.append(n))
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            result["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    try:
        script(children)
    finally:
        for gate in list(children.release.values()):
            gate.set()
        thread.join(GUARD_S)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]
    return (*result["value"], done)


def test_two_at_a_time_requirements_first_and_the_timed_experiment_alone(monkeypatch):
    # kv_quant and sparse_decode require lm (their configs' REQUIRES); judge_btl and
    # sparse_decode time themselves here
    names = ["judge_btl", "lm", "kv_quant", "spf", "sparse_decode", "benchmark_game"]

    def script(c):
        c.wait_started("spf")  # lm and spf start first: judge_btl waits for the end, kv_quant for lm
        assert not c.started("kv_quant")
        c.finish("lm")
        assert not c.started("judge_btl")
        c.finish("kv_quant")
        c.finish("spf")
        c.finish("benchmark_game")
        c.finish("judge_btl")
        c.finish("sparse_decode")

    children = _Children()
    sections, failed, done = _run(children, monkeypatch, names,
                                  {"judge_btl", "sparse_decode"}, script)
    assert children.most == 2
    starts = [n for kind, n in children.events if kind == "start"]
    ends = [n for kind, n in children.events if kind == "end"]
    assert starts[:2] == ["lm", "spf"]
    assert starts.index("kv_quant") > ends.index("lm")
    for name in ("judge_btl", "sparse_decode"):  # nothing ran beside them
        i = children.events.index(("start", name))
        assert children.events[i + 1] == ("end", name)
        assert all(("end", other) in children.events[:i] for other in starts[:starts.index(name)])
    assert starts[-2:] == ["judge_btl", "sparse_decode"]
    assert done == ends and [s.title for s in sections] == [f"{n}: run" for n in ends]
    assert failed == ["spf"]
    assert all(s.variant == "tiny" and "took" in s.body for s in sections)


def test_a_taken_folder_stops_the_job_and_the_child_beside_it(monkeypatch):
    children = _Children(fail={"spf": RunDirectoryInUseError("spf: held by process 1")})

    def script(c):
        deadline = time.monotonic() + GUARD_S
        while "lm" not in c.stops:
            assert time.monotonic() < deadline, "lm was not stopped"
            time.sleep(0.002)

    with pytest.raises(RunDirectoryInUseError, match="held by process 1"):
        _run(children, monkeypatch, ["lm", "spf", "benchmark_game"], set(), script)
    assert children.stops == {"lm": True}
    assert not children.started("benchmark_game")


@pytest.mark.parametrize("jobs, isolate", [(0, True), (2, False)])
def test_jobs_needs_isolation_and_a_positive_count(jobs, isolate):
    with pytest.raises(ValueError, match=f"jobs={jobs}"):
        main_lib.run_all(["lm"], "tiny", "unused", isolate=isolate, jobs=jobs)


def test_which_experiments_run_alone():
    assert main_lib.runs_alone("sparse_decode", "tiny")
    assert main_lib.runs_alone("judge_btl", "tiny")
    assert not main_lib.runs_alone("kv_quant", "tiny")
    assert main_lib.runs_alone("kv_quant", "tiny,decode_timing=True")
    assert not main_lib.runs_alone("lm", "tiny")
