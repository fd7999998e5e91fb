"""algorithms.lm.training: the learning-rate schedule and resuming a run in its workdir."""

import math

import pytest

from algorithms.lm import training
from experiments.configs import lm as lm_config


def _cosine_rate(count, peak, warmup, steps, final=0.1):
    """Linear warm-up from 0 to ``peak`` over ``warmup`` updates, then cosine decay to
    ``final * peak`` at ``steps`` (the closed form of the schedule :func:`training.optimizer`
    documents)."""
    if count < warmup:
        return peak * count / warmup
    frac = min((count - warmup) / (steps - warmup), 1.0)
    return peak * (final + (1 - final) * 0.5 * (1 + math.cos(math.pi * frac)))


def test_a_rerun_with_other_steps_is_refused_not_continued_on_another_schedule(tmp_path, capsys):
    """8 steps, then the same workdir asked for 16: the 8-step schedule has decayed to 4.8e-4 at
    its last update while a 16-step run's rate at that step is 1.95e-3, so continuing would train
    neither run; the rerun is refused in one line that names both counts, and the 8-step run is
    restored as it was."""
    eight = lm_config.get_config("smoke,steps=8")
    sixteen = lm_config.get_config("smoke,steps=16")
    peak, warmup = eight.learning_rate, eight.warmup_steps
    assert _cosine_rate(7, peak, warmup, 8) == pytest.approx(4.8e-4, abs=5e-6)  # as quoted
    assert _cosine_rate(8, peak, warmup, 16) == pytest.approx(1.95e-3, abs=5e-6)
    for cfg in (eight, sixteen):  # the optimizer's schedule is that closed form
        for count in range(cfg.steps + 2):
            assert float(training.learning_rate(cfg)(count)) == pytest.approx(
                _cosine_rate(count, peak, warmup, cfg.steps), rel=1e-5, abs=1e-9)
    first = training.train(eight, str(tmp_path), progress=False)
    assert first.result.steps_run == 8
    with pytest.raises(ValueError) as e:
        training.train(sixteen, str(tmp_path), progress=False)
    message = str(e.value)
    assert "\n" not in message
    assert "schedule was built for 8 steps, and this run's for 16" in message
    assert "Ask for 8 steps" in message and "another --workdir" in message
    capsys.readouterr()
    again = training.train(eight, str(tmp_path), progress=False)  # untouched by the refusal
    assert again.result.steps_run == 0 and again.result.resumed_from == 8
    assert "restored the finished run at step 8" in capsys.readouterr().err
