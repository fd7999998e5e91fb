"""Scale-out of the GRPO sweep: (n, B_p, seed) lanes split over 8 fake CPU devices give the same
runs as on one device (run in their own process; see the Makefile)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.rl_scaling import grpo, sweep, tasks
from core import sharding
from models.transformer import Transformer, TransformerConfig

pytestmark = pytest.mark.multidevice


def test_sweep_lanes_sharded_over_8_devices_match_one_device(caplog):
    assert jax.device_count() == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    task = tasks.ArithmeticTask(2, 1)
    train, held = tasks.make_split(task, 64, 16, seed=0)
    prompt_len, answer_len = 1 + task.prompt_chars, task.answer_chars
    pool = {k: jnp.asarray(v)
            for k, v in tasks.encode_problems(train, task, prompt_len, answer_len).items()}
    ev = tasks.encode_problems(held, task, prompt_len, answer_len)
    evals = {s: tuple(jnp.asarray(ev[f]) for f in ("prompts", "targets", "lens"))
             for s in ("easy", "hard")}
    mcfg = TransformerConfig(vocab_size=258, max_len=prompt_len + answer_len, d_model=32,
                             num_layers=1, num_heads=2, mlp_dim=64)
    gd, params = nnx.split(Transformer(mcfg, rngs=nnx.Rngs(0)))
    # One (n, B_p) = (2, 4): one compiled step; 3 seeds = 3 lanes, padded to 8 on 8 devices.
    budgets = (16, 32)
    cfg = sweep.SweepConfig(ns=(2,), problems_per_batch=(4,), num_seeds=3, budgets=budgets,
                            grpo=grpo.GRPOConfig(inner_steps=2, clip_eps_high=0.28), pass_k=2)
    runs = {}
    for num in (8, 1):
        mesh = sharding.make_mesh(devices=jax.devices()[:num])
        caplog.clear()
        with jax.log_compiles(), caplog.at_level("WARNING"):
            res = sweep.run_sweep(cfg, gd, params, pool, evals, mesh=mesh)
        runs[num] = (res.records, res.step_metrics)
        # Lowered once for all its steps: the optimizer state the sweep starts from is placed as
        # the step returns it (an unplaced eager init compiled each group twice on one device).
        lowered = [r.getMessage()[:60] for r in caplog.records
                   if re.match(r"Compiling (jit\()?sweep_step\b", r.getMessage())]
        assert len(lowered) == 1, (num, lowered)
    (rec8, steps8), (rec1, steps1) = runs[8], runs[1]
    assert len(rec8) == len(rec1) == 3 * len(budgets)  # seeds x budgets
    for a, b in zip(rec8, rec1):
        assert {k: a[k] for k in ("budget", "n", "bp", "seed")} == \
            {k: b[k] for k in ("budget", "n", "bp", "seed")}
        for k in ("easy_pass1", "hard_pass1", "train_reward"):
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-6)
    assert steps8.keys() == steps1.keys()
    for lane in steps8:
        np.testing.assert_allclose(steps8[lane]["reward"], steps1[lane]["reward"])
