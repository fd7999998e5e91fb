"""Supervised warm start of the policy in two stages that end on measured pass rates.

Dimensions: B batch of problems, Lp prompt length, T answer length.

A small model sits on a loss plateau (digits predicted without using the operands) for a number
of steps that depends on the batch order, and learns nothing about hard sums from easy ones. So:
(1) easy sums alone until the exact pass@1 on ``probe_problems`` easy *training* problems reaches
``easy_target``; (2) a mixture with ``hard_fraction`` hard sums until the hard probe reaches
``hard_target``. Each stage is capped (``max_easy_steps``, ``max_steps`` in all) and checked every
``check_every`` steps; held-out problems are never looked at. Both stages run through
:func:`core.training.train_loop` (checkpointed, resumable, early stop by ``stop_when``); the caller
chooses where.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from algorithms.rl_scaling import tasks, trainer
from core.training import (
    LoopConfig,
    config_fingerprint,
    init_train_state,
    make_train_step,
    train_loop,
)


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Static warm-start settings (see the module docstring).

    Raises (on construction):
      ValueError: targets outside (0, 1], hard_fraction outside [0, 1], non-positive sizes, or
        max_easy_steps >= max_steps.
    """

    batch_size: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    hard_fraction: float = 0.35
    easy_target: float = 0.5
    hard_target: float = 0.02
    check_every: int = 50
    probe_problems: int = 256
    max_easy_steps: int = 2500
    max_steps: int = 4500
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self):
        bad = [f"{k}={getattr(self, k)}" for k, ok in {
            "easy_target": 0 < self.easy_target <= 1, "hard_target": 0 < self.hard_target <= 1,
            "hard_fraction": 0 <= self.hard_fraction <= 1, "batch_size": self.batch_size >= 1,
            "check_every": self.check_every >= 1, "probe_problems": self.probe_problems >= 1,
            "max_easy_steps": 0 < self.max_easy_steps < self.max_steps}.items() if not ok]
        if bad:
            raise ValueError(f"WarmStartConfig: bad {', '.join(bad)}: need targets in (0, 1], "
                             "hard_fraction in [0, 1], positive sizes, 0 < max_easy_steps < "
                             "max_steps")


def warm_start(cfg: WarmStartConfig, graphdef: nnx.GraphDef, params: nnx.State,
               easy: dict[str, np.ndarray], hard: dict[str, np.ndarray], *, workdir: str,
               fingerprint: tuple = (), desc: str = "warm start") -> tuple[nnx.State, dict]:
    """Runs both stages; returns (params, info).

    Args:
      cfg: the settings.
      graphdef, params: the policy.
      easy, hard: training problems (:func:`tasks.encode_problems` dicts).
      workdir: stage ``s`` checkpoints under ``workdir/s`` (``easy``, ``mixed``); a finished stage
        is restored, not extended.
      fingerprint: values that identify the run (hashed with the stage name by
        :func:`core.training.config_fingerprint`); a workdir holding another run is refused.
      desc: progress-bar label.

    Returns:
      info = {"easy_steps", "mixed_steps", "probe_easy", "probe_hard", "reached": both targets
      met}.

    Raises:
      ValueError: probe_problems larger than a split.
    """
    for name, split in (("easy", easy), ("hard", hard)):
        if len(split["lens"]) < cfg.probe_problems:
            raise ValueError(f"warm_start: probe_problems={cfg.probe_problems} exceeds the "
                             f"{len(split['lens'])} {name} training problems")
    tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                     optax.adam(optax.warmup_constant_schedule(0.0, cfg.learning_rate,
                                                               cfg.warmup_steps)))
    step_fn = make_train_step(graphdef, tx, trainer.sft_loss)
    probe_fn = jax.jit(lambda p, *e: trainer.answer_prob(graphdef, p, *e).mean())
    probes = {name: tuple(jnp.asarray(split[f][:cfg.probe_problems])
                          for f in ("prompts", "targets", "lens"))
              for name, split in (("easy", easy), ("hard", hard))}
    last = {}

    def reached(name, target):
        def stop_when(step, state):
            last.update({k: float(probe_fn(state["params"], *v)) for k, v in probes.items()})
            return last[name] >= target
        return stop_when

    state = init_train_state(params, tx)
    steps = {}
    stages = (("easy", 0.0, cfg.seed, cfg.max_easy_steps, "easy", cfg.easy_target),
              ("mixed", cfg.hard_fraction, cfg.seed + 1, cfg.max_steps - cfg.max_easy_steps,
               "hard", cfg.hard_target))
    for label, hard_fraction, seed, cap, name, target in stages:
        result = train_loop(
            step_fn, state, tasks.MixtureBatches(easy, hard, cfg.batch_size, hard_fraction, seed),
            jax.random.key(cfg.seed),
            LoopConfig(num_steps=cap, log_every=cfg.check_every, checkpoint_every=0,
                       desc=f"{desc} ({label})"),
            workdir=os.path.join(workdir, label), stop_when=reached(name, target),
            fingerprint=config_fingerprint(label, *fingerprint))
        state = result.state
        steps[f"{label}_steps"] = result.stopped_early_at or cap
    last.update({k: float(probe_fn(state["params"], *v)) for k, v in probes.items()})
    info = {**steps, "probe_easy": last["easy"], "probe_hard": last["hard"],
            "reached": last["easy"] >= cfg.easy_target and last["hard"] >= cfg.hard_target}
    return state["params"], info
