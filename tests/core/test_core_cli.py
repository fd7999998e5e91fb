"""core.cli: the one-line exit after Ctrl-C."""

import signal

import pytest

from core import cli


def test_ctrl_c_outside_training_names_no_checkpoint(monkeypatch, capsys):
    monkeypatch.setattr(signal, "signal", lambda *a: None)

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", leave)
    with pytest.raises(SystemExit) as e:
        cli.interrupted("judge_btl", KeyboardInterrupt())
    assert e.value.code == 130
    err = capsys.readouterr().err.strip()
    assert err == ("judge_btl: interrupted; rerun the same command to resume: what the workdir "
                   "already holds (finished or checkpointed training, cached results) is reused "
                   "and the rest runs again")
