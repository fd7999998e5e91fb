"""The step each experiment exports for ahead-of-time compiles is the step its run path runs.

For each experiment the run path is entered at its smoke size and stopped where it hands its step
to the loop (the loop, or the step factory, is replaced by a catcher); the exported step
(``paper_steps``' builder, called with the same smoke config on the local devices) must lower to
the same program on the same abstract arguments, and its state arguments must have the shapes and
dtypes of the state the run path built. Lowering only (no compile), smoke sizes.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest


class Caught(Exception):
    """Raised by a catcher once it has what the run path passed it."""


def _catch(store: dict, **names):
    """A replacement for a loop or factory: keeps its arguments under ``names`` (name -> index)
    in ``store``, then stops the run path."""

    def catcher(*args, **kwargs):
        store.update({k: args[i] if i < len(args) else kwargs[k] for k, i in names.items()})
        store["kwargs"] = kwargs
        raise Caught

    return catcher


def _program(fn, args, donate=()) -> str:
    text = jax.jit(fn, donate_argnums=donate).lower(*args).as_text()
    return re.sub(r"module @jit_\w+", "module @jit_step", text, count=1)  # the function's name


def _structure(tree):
    """Shapes and (canonical: float64 -> float32 without x64) dtypes of ``tree``'s leaves."""
    return jax.tree.map(lambda x: (tuple(np.shape(x)), jax.dtypes.canonicalize_dtype(
        x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype)), tree)


def _same_step(run_step, spec):
    """The run path's step lowers, on the exported step's arguments, to the exported program."""
    assert _program(run_step, spec.args, spec.donate_argnums) == _program(
        spec.fn, spec.args, spec.donate_argnums)


def test_judge_btl_fit(monkeypatch):
    from algorithms.ranking import data, speed
    from experiments import judge_btl
    from experiments.configs import judge_btl as cfg

    config = cfg.get_config("smoke")
    t = config.timing
    spec = judge_btl.fit_step_spec(config, jax.devices())
    got: dict = {}
    monkeypatch.setattr(speed, "solve", _catch(got, table=0))
    with pytest.raises(Caught):
        speed.speed_comparison(t.num_models, t.num_judges, t.num_comparisons, (), repeats=1)
    with jax.enable_x64(spec.x64):
        assert _structure(got["table"]) == _structure(spec.args[0])
        assert jax.tree.structure(got["table"]) == jax.tree.structure(spec.args[0])
    monkeypatch.undo()
    assert spec.fn is speed.solve  # the function the timing study times (caught above)
    assert isinstance(got["table"], data.ComparisonTable)


def test_benchmark_game_sweeps(monkeypatch):
    from algorithms.benchmark_game import analysis, designer
    from experiments import benchmark_game
    from experiments.configs import benchmark_game as cfg

    config = cfg.get_config("smoke")
    games = benchmark_game.games(config)
    for game in ("main", "five"):
        got: dict = {}
        monkeypatch.setattr(analysis, "sweep_deltas", _catch(got, score=0, contest=1, deltas=2))
        score, contest, theta, rewards, deltas = games[game]
        with pytest.raises(Caught):
            analysis.analyse(score, benchmark_game.bg.PowerCost(config.cost_scale,
                                                                config.cost_power),
                             contest, theta, rewards, deltas, config.max_rounds,
                             config.bisection_steps)
        monkeypatch.undo()
        spec = benchmark_game.sweep_step_spec(config, game, jax.devices())
        caught = (got["score"], got["contest"], got["deltas"])
        assert _structure(caught) == _structure(spec.args)
        assert spec.fn is designer.sweep_deltas and not got["kwargs"]
        _same_step(designer.sweep_deltas, spec)


def test_decode_steps_build_their_caches_through_get_backend(monkeypatch):
    """Every lm decode row's cache backend comes from ``models.kv_cache.get_backend`` with the
    experiments' paper options (FFD: sparse_decode's page size and delta; QVG: the quantizer
    kv_quant runs, ``kernels.kv_quant.reference.quantizer_configs`` of its paper config, at the
    lm model's head dim)."""
    from algorithms.lm import training
    from core.data import ByteTokenizer
    from experiments import sparse_decode
    from experiments.configs import kv_quant as kq_cfg
    from experiments.configs import lm as lm_cfg
    from experiments.configs import sparse_decode as sd_cfg
    from kernels.kv_quant.reference import quantizer_configs
    from models import kv_cache as kvc

    calls = []
    real = kvc.get_backend
    monkeypatch.setattr(kvc, "get_backend",
                        lambda name, **o: calls.append((name, o)) or real(name, **o))
    for backend in ("dense", "ffd", "qvg"):  # the rows' builders at a small cache
        sparse_decode.lm_decode_spec(backend, jax.devices()[:1], context=1024, batch=2)
    assert [c[0] for c in calls] == ["dense", "ffd", "qvg"]
    sd = sd_cfg.get_config("paper")
    assert (calls[1][1]["page_size"], calls[1][1]["delta"]) == (sd.page_size, sd.delta)
    d = training.model_config(lm_cfg.get_config("paper"), ByteTokenizer().vocab_size).dim_per_head
    assert calls[2][1]["config"] == quantizer_configs(kq_cfg.get_config("paper"), d)["qvg"]
