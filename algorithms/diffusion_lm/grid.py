"""The runs of the diffusion-LM comparison on :func:`core.training.train_loop`: the IsoFLOP grid
(families x sizes, each run evaluated where each compute budget is spent), the per-family runs at
the reference size, held-out NELBO evaluation and sampling.

Dimensions: B batch, L sequence, W held-out windows, S model sizes, C compute budgets.

The run settings are an ``ml_collections.ConfigDict`` with the fields of
``experiments/configs/diffusion_lm.py`` (``optim``, ``process``, ``backbone`` and ``sampling`` are
grouped sub-configs). Each run trains in its own directory (``<runs_dir>/<family>_d<d>_l<layers>``:
orbax checkpoints, ``train_metrics.jsonl``) under one settings fingerprint
(:func:`core.training.config_fingerprint`); its held-out evaluations go to ``cache`` (any mutable
mapping; the experiment keeps it in a JSON file), so a restarted grid skips what it has. One run
yields every budget: training continues from the checkpoint written at the previous budget's step,
which on the CPU is bit-identical to one uninterrupted run.

Compute: ``C = 3 F_fwd tokens`` with ``F_fwd`` summed over a training example's forward passes
(:attr:`FamilySpec.train_passes`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import MutableMapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from algorithms.diffusion_lm import scaling
from algorithms.diffusion_lm.families import FamilySpec, sample, transformer_config
from algorithms.diffusion_lm.training import init_state, make_step
from core import sharding, timing
from core.data import ByteTokenizer, TextBatcher
from core.data.text import sequential_windows
from core.training import LoopConfig, config_fingerprint, train_loop
from models.attention import check_platform as check_attention_platform
from models.transformer import PARAM_AXES, Transformer, forward_flops_per_token, param_count


def optimizer(optim: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW (b1 0.9, b2 0.98), linear warmup then constant (so one run yields every budget of the
    IsoFLOP grid), after global-norm clipping. ``optim``: ``learning_rate``, ``warmup_steps``,
    ``weight_decay``, ``grad_clip``."""
    lr = optax.join_schedules([optax.linear_schedule(0.0, optim.learning_rate, optim.warmup_steps),
                               optax.constant_schedule(optim.learning_rate)],
                              [optim.warmup_steps])
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip),
                       optax.adamw(lr, b1=0.9, b2=0.98, weight_decay=optim.weight_decay))


def family_spec(config: ml_collections.ConfigDict, name: str,
                tokenizer: ByteTokenizer | None = None) -> FamilySpec:
    """The :class:`FamilySpec` of ``name``: the tokenizer's ids, ``config.eps`` and
    ``config.process`` (t_min, alpha0, p_uniform, gidd_max_weight).

    Raises:
      ValueError: an unknown family or invalid process parameters.
    """
    tok = tokenizer or ByteTokenizer()
    return FamilySpec(name, vocab_size=tok.vocab_size,
                      num_classes=tok.vocab_size - len(tok.SPECIALS), mask_id=tok.mask_id,
                      bos_id=tok.bos_id, eps=config.eps, **config.process.to_dict())


@dataclasses.dataclass
class Model:
    """One model of the comparison: its family, size (d_model, layers, heads), backbone config,
    ``nnx.split`` graph, train state (placed on the mesh) and analytic cost."""

    spec: FamilySpec
    size: tuple[int, int, int]
    graphdef: nnx.GraphDef
    state: dict[str, Any]
    state_sharding: Any
    params_count: int
    flops_per_token: float

    @property
    def eval_params(self) -> nnx.State:
        """The parameters used for evaluation and sampling (the EMA if kept)."""
        return self.state.get("ema", self.state["params"])

    @property
    def name(self) -> str:
        return f"{self.spec.name}_d{self.size[0]}_l{self.size[1]}"


class Runner:
    """Builds, trains, evaluates and samples the models of one config on one mesh; compiled steps
    are shared between runs of the same graph and objective."""

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: ByteTokenizer | None = None):
        self.config, self.tok = config, tokenizer or ByteTokenizer()
        self.tx = optimizer(config.optim)
        self.mesh = sharding.make_mesh(config.model_parallelism)
        self._steps: dict[tuple, Any] = {}

    def model(self, family: str, size: Sequence[int]) -> Model:
        """A freshly initialised model (seed ``config.seed``) of ``family`` at ``size``."""
        c = self.config
        spec = family_spec(c, family, self.tok)
        d, layers, heads = size
        backbone = {**c.backbone.to_dict(), "dtype": jnp.dtype(c.backbone.dtype)}
        cfg = transformer_config(spec, c.seq_len, d_model=d, num_layers=layers, num_heads=heads,
                                 **backbone)
        cfg.check_model_parallelism(c.model_parallelism)
        check_attention_platform(cfg.attention)
        graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(c.seed)))
        state, state_sharding = sharding.shard_train_state(
            init_state(params, self.tx, c.ema_decay), PARAM_AXES, self.mesh, self.tx,
            rules=c.param_sharding, logical_sizes=cfg.logical_sizes)
        fpt = sum(forward_flops_per_token(cfg, n * c.seq_len) * n for n in spec.train_passes)
        return Model(spec, tuple(size), graphdef, state, state_sharding, param_count(params),
                     fpt)

    def step(self, model: Model, spec: FamilySpec | None = None):
        """The pure train-or-evaluate step of ``model`` (objective of ``spec``, default its own),
        sharding-constrained; the same object for the same graph and objective, so ``jax.jit``
        compiles it once (``mdlm`` and ``mdlm_ce`` share it: the objective is a traced flag)."""
        spec = spec or model.spec
        if spec.name == "mdlm_ce":
            spec = dataclasses.replace(spec, name="mdlm")
        key = (model.graphdef, spec)
        if key not in self._steps:
            step = make_step(model.graphdef, self.tx, spec, self.config.ema_decay)
            self._steps[key] = sharding.constrain_step(step, model.state_sharding)
        return self._steps[key]

    def batch(self, x: np.ndarray, train: bool, ce: bool) -> dict[str, jax.Array]:
        """``{"x": int32 [B, L] split over data, "train", "ce": replicated f32 flags}``."""
        return {"x": sharding.shard_batch(np.asarray(x, np.int32), self.mesh),
                **sharding.replicate({"train": jnp.float32(train), "ce": jnp.float32(ce)},
                                     self.mesh)}

    def evaluate(self, model: Model, windows: np.ndarray, reps: int, key: jax.Array,
                 spec: FamilySpec | None = None) -> tuple[float, float]:
        """Held-out NELBO (nats/token; exact NLL for AR) of ``model`` under ``spec``'s process
        (default its own): the mean over ``reps`` time / mask draws of every window, and its
        standard error over the (batch, draw) estimates. Times are drawn from ``U[t_min, 1]``
        (the convention of :mod:`families`).

        Args:
          windows: int [W, L] held-out tokens, W a multiple of ``batch_size``.
        """
        spec = spec or model.spec
        step = jax.jit(self.step(model, spec), donate_argnums=0)
        b, vals = self.config.batch_size, []
        for r in range(reps):
            for i in range(0, windows.shape[0], b):
                k = jax.random.fold_in(key, r * 100_003 + i)
                model.state, m = step(model.state,
                                      self.batch(windows[i:i + b], False, spec.name == "mdlm_ce"),
                                      k)
                vals.append(m["nelbo"])
        vals = np.asarray(jax.device_get(vals), np.float64)
        se = float(vals.std(ddof=1) / math.sqrt(vals.size)) if vals.size > 1 else 0.0
        return float(vals.mean()), se

    def fingerprint(self, model: Model) -> str:
        """The settings that shape ``model``'s run and its evaluations."""
        c = self.config
        return config_fingerprint(
            dataclasses.asdict(model.spec), model.size, c.seed, c.data_path, c.val_fraction,
            c.seq_len, c.batch_size, c.backbone, c.optim, c.eval_windows, c.eval_reps)

    def train(self, model: Model, train_tokens: np.ndarray, eval_steps: Sequence[int],
              windows: np.ndarray, run_dir: str, cache: MutableMapping[str, Any],
              keep: bool = True) -> dict[str, Any]:
        """Trains ``model`` to ``max(eval_steps)`` steps in ``run_dir``, evaluating on ``windows``
        at each of ``eval_steps``; evaluations already in ``cache`` (same fingerprint) are reused
        and their training is skipped. With ``keep`` the trained state ends in ``model.state``.

        Returns:
          ``{"evals": {str(step): (nats, s.e.)}, "seconds": training wall time here}``.
        """
        c, fp = self.config, self.fingerprint(model)
        entry = cache.get(model.name) or {}
        evals = dict(entry.get("evals", {})) if entry.get("fingerprint") == fp else {}
        batches = TextBatcher(train_tokens, c.batch_size, c.seq_len, seed=c.seed)
        ce = model.spec.name == "mdlm_ce"
        seconds = 0.0
        todo = [s for s in sorted(set(eval_steps)) if str(s) not in evals]
        if keep and not todo:
            todo = [max(eval_steps)]  # restore the finished run
        for s in todo:
            res = train_loop(
                self.step(model), model.state, batches, jax.random.key(c.seed + 1),
                LoopConfig(num_steps=s, log_every=c.log_every, keep_checkpoints=1,
                           desc=f"{model.spec.name} d={model.size[0]}"),
                workdir=run_dir, put_batch=lambda x: self.batch(x, True, ce), fingerprint=fp)
            model.state, seconds = res.state, seconds + res.seconds
            if str(s) not in evals:
                evals[str(s)] = self.evaluate(model, windows, c.eval_reps,
                                              jax.random.key(c.seed + 7))
                cache[model.name] = {"fingerprint": fp, "evals": evals}
        return {"evals": evals, "seconds": seconds}

    def samples(self, model: Model, num_steps: int, seed: int = 100
                ) -> tuple[np.ndarray, float]:
        """``sampling.batches`` batches of unconditional samples (keys ``seed``, ``seed + 1``,
        ...), int32 [n B, L], and the sampling throughput in tokens per second (compilation
        excluded: one warm-up call first)."""
        c = self.config
        kw = dict(batch_size=c.batch_size, seq_len=c.seq_len, num_steps=num_steps)
        sample(model.spec, model.graphdef, model.eval_params, jax.random.key(0),
               **kw).block_until_ready()
        outs, secs = [], 0.0
        for b in range(c.sampling.batches):
            with timing.Stopwatch() as clock:
                s = sample(model.spec, model.graphdef, model.eval_params, jax.random.key(seed + b),
                           **kw)
                s.block_until_ready()
            secs += clock.seconds
            outs.append(np.asarray(s))
        smp = np.concatenate(outs)
        return smp, smp.size / secs


def budget_steps(budgets: Sequence[float], flops_per_token: float, tokens_per_step: int
                 ) -> list[int]:
    """Optimizer steps at which each budget ``C = 3 F_fwd tokens`` (FLOPs) is spent (>= 1)."""
    return [max(1, round(c / (3 * flops_per_token * tokens_per_step))) for c in budgets]


@dataclasses.dataclass
class GridResult:
    """The trained grid.

    Attributes:
      losses, se: {family: [C, S]} held-out NELBO (nats/token) and its standard error.
      sizes: {family: [S]} parameter counts.
      steps: {family: [C, S]} steps at which each budget was spent.
      reference: {family: Model} trained models at the reference size (every family).
      reference_steps: the reference size's step count at the largest budget.
      seconds: training wall time spent here.
    """

    losses: dict[str, np.ndarray]
    se: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    reference: dict[str, Model]
    reference_steps: int
    seconds: float


def run_grid(runner: Runner, train_tokens: np.ndarray, windows: np.ndarray, runs_dir: str,
             cache: MutableMapping[str, Any]) -> GridResult:
    """Trains ``config.isoflop_families`` at every size and budget, then the other ``families`` at
    the reference size for the reference size's largest-budget step count (every run sees the
    same batch stream and key: differences come from the family and the size)."""
    c = runner.config
    budgets = sorted(float(b) for b in c.budgets)
    ref = tuple(c.sizes[c.reference_size])
    tokens_per_step = c.batch_size * c.seq_len
    out = GridResult({}, {}, {}, {}, {}, 0, 0.0)
    for fam in c.isoflop_families:
        losses, ses, counts, used = [], [], [], []
        for size in c.sizes:
            m = runner.model(fam, size)
            steps = budget_steps(budgets, m.flops_per_token, tokens_per_step)
            keep = tuple(size) == ref
            res = runner.train(m, train_tokens, steps, windows, os.path.join(runs_dir, m.name),
                               cache, keep)
            losses.append([res["evals"][str(s)][0] for s in steps])
            ses.append([res["evals"][str(s)][1] for s in steps])
            counts.append(m.params_count)
            used.append(steps)
            out.seconds += res["seconds"]
            if keep:
                out.reference[fam], out.reference_steps = m, max(steps)
        out.losses[fam], out.se[fam] = np.asarray(losses).T, np.asarray(ses).T
        out.sizes[fam], out.steps[fam] = np.asarray(counts, np.float64), np.asarray(used).T
    for fam in c.families:
        if fam in out.reference:
            continue
        m = runner.model(fam, ref)
        steps = out.reference_steps or budget_steps(budgets[-1:], m.flops_per_token,
                                                    tokens_per_step)[0]
        res = runner.train(m, train_tokens, [steps], windows, os.path.join(runs_dir, m.name),
                           cache)
        out.reference[fam] = m
        out.reference_steps = out.reference_steps or steps
        out.seconds += res["seconds"]
    return out


def heldout_windows(tokens: np.ndarray, seq_len: int, count: int) -> np.ndarray:
    """The first ``count`` consecutive windows of ``seq_len`` tokens of held-out ``tokens``,
    int32 [count, seq_len].

    Raises:
      ValueError: the held-out text has fewer than ``count`` such windows.
    """
    windows = sequential_windows(tokens, seq_len, count)
    if windows.shape[0] < count:
        raise ValueError(f"the held-out text has {windows.shape[0]} windows of {seq_len} tokens; "
                         f"the config asks for {count}")
    return windows


def isoflop_summary(fit: scaling.IsoFlopFit, sizes: np.ndarray, steps: np.ndarray,
                    losses: np.ndarray, se: np.ndarray) -> dict[str, Any]:
    """One family's IsoFLOP grid and fit as JSON-able numbers; ``at_edge`` [C] marks optima
    clipped to the smallest or largest size (their exponent is not identified)."""
    at_edge = (fit.n_opt <= sizes.min() * (1 + 1e-6)) | (fit.n_opt >= sizes.max() * (1 - 1e-6))
    return {"budgets": fit.budgets, "sizes": sizes, "steps": steps, "losses": losses,
            "loss_se": se, "n_opt": fit.n_opt, "loss_opt": fit.loss_opt, "concave": fit.concave,
            "at_edge": at_edge, "exponent": fit.exponent, "loss_exponent": fit.loss_exponent}


def unigram_entropy(samples: np.ndarray, vocab_size: int) -> float:
    """Mean over rows of the entropy (nats) of each row's token histogram; ``samples`` int [n, L]."""
    ents = []
    for row in np.asarray(samples):
        p = np.bincount(row, minlength=vocab_size).astype(np.float64)
        p = p[p > 0] / row.size
        ents.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(ents))
