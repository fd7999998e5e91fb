"""The runs of the diffusion-LM comparison on :func:`core.training.train_loop`: the IsoFLOP grid
(families x sizes x budgets), the per-family runs at the reference size, paired held-out NELBO
evaluation and sampling.

Dimensions: B batch, L sequence, W held-out windows, S model sizes, C compute budgets.

The run settings are an ``ml_collections.ConfigDict`` with the fields of
``experiments/configs/diffusion_lm.py`` (``optim``, ``process``, ``backbone`` and ``sampling`` are
grouped sub-configs). Each run trains in its own directory (``<runs_dir>/<family>_d<d>_l<layers>``:
orbax checkpoints, ``train_metrics.jsonl``) under one settings fingerprint
(:func:`core.training.config_fingerprint`); its held-out evaluations go to ``cache`` (any mutable
mapping; the experiment keeps it in a JSON file), so a restarted grid skips what it has. With
``optim.schedule = "cosine"`` each (size, budget) is its own run, its learning rate decayed to
that budget's step (the horizon sits in the optimizer state, so one compiled step serves every
budget); with ``"constant"`` one run per size yields every budget: training continues from the
checkpoint written at the previous budget's step, which on the CPU is bit-identical to one
uninterrupted run.

Evaluation is paired: every model is evaluated on the same windows with draws that depend only
on the key, the batch and the draw, so differences between families (and between the two MDLM
objectives across the grid) are measured per window (:func:`paired_difference`,
:func:`scaling.paired_bootstrap_ratio`).

Compute: ``C = 3 F_fwd tokens`` with ``F_fwd`` summed over a training example's forward passes
(:attr:`FamilySpec.train_passes`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import MutableMapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from algorithms.diffusion_lm import scaling
from algorithms.diffusion_lm.families import FamilySpec, sample, transformer_config
from algorithms.diffusion_lm.training import init_state, make_eval, make_step
from core import sharding, steps, timing
from core.data import ByteTokenizer, TextBatcher
from core.data.text import sequential_windows
from core.training import LoopConfig, config_fingerprint, train_loop
from models.attention import check_platform as check_attention_platform
from models.transformer import (
    PARAM_AXES,
    Transformer,
    TransformerConfig,
    forward_flops_per_token,
    param_count,
)


class ScheduleState(NamedTuple):
    """State of :func:`budget_schedule`: the update count and the run's horizon (its last step;
    0 = no decay), int32 scalars. The horizon lives in the optimizer state, so runs decayed to
    different budgets share one compiled step and a checkpoint carries its own horizon."""

    count: jax.Array
    horizon: jax.Array


def learning_rate(count: jax.Array, horizon: jax.Array, peak: float, warmup: int,
                  final_fraction: float) -> jax.Array:
    """The learning rate of update ``count`` (0-based), float32: linear warmup from 0 over
    ``warmup`` updates, then a cosine from ``peak`` to ``final_fraction * peak`` at update
    ``horizon`` (constant after it); ``horizon = 0`` keeps ``peak`` after warmup (no decay)."""
    count = jnp.asarray(count, jnp.float32)
    horizon = jnp.asarray(horizon, jnp.float32)
    warm = peak * count / warmup if warmup > 0 else jnp.float32(peak)
    frac = jnp.clip((count - warmup) / jnp.maximum(horizon - warmup, 1.0), 0.0, 1.0)
    cosine = peak * (final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
    decayed = jnp.where(horizon > 0, cosine, peak)
    return jnp.where(count < warmup, warm, decayed).astype(jnp.float32)


def budget_schedule(peak: float, warmup: int, final_fraction: float
                    ) -> optax.GradientTransformation:
    """Scales updates by ``-learning_rate(count, horizon, ...)`` (see :func:`learning_rate`); the
    horizon starts at 0 and is set per run with :func:`with_horizon`."""

    def init(params):
        del params
        return ScheduleState(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        del params
        lr = learning_rate(state.count, state.horizon, peak, warmup, final_fraction)
        updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
        return updates, ScheduleState(state.count + 1, state.horizon)

    return optax.GradientTransformation(init, update)


def with_horizon(train_state: dict[str, Any], horizon: int) -> dict[str, Any]:
    """``train_state`` with its :class:`ScheduleState` horizon set to ``horizon`` (0: no decay),
    placed as the old value (replicated)."""

    def put(s):
        if isinstance(s, ScheduleState):
            return ScheduleState(s.count, s.horizon * 0 + jnp.int32(horizon))
        return s

    return {**train_state, "opt_state": jax.tree.map(
        put, train_state["opt_state"], is_leaf=lambda s: isinstance(s, ScheduleState))}


def optimizer(optim: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW (b1 0.9, b2 0.98) after global-norm clipping, with linear warmup then either a cosine
    decay to ``final_lr_fraction`` of the peak at the run's horizon (:func:`with_horizon`: one run
    per budget, as Chinchilla's Approach 2) or, with horizon 0, a constant rate. ``optim``:
    ``learning_rate``, ``warmup_steps``, ``weight_decay``, ``grad_clip``, ``final_lr_fraction``.
    With horizon 0 the arithmetic is ``optax.adamw`` with a warmup-then-constant schedule."""
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip),
                       optax.scale_by_adam(b1=0.9, b2=0.98),
                       optax.add_decayed_weights(optim.weight_decay),
                       budget_schedule(optim.learning_rate, optim.warmup_steps,
                                       optim.get("final_lr_fraction", 0.1)))


def family_spec(config: ml_collections.ConfigDict, name: str,
                tokenizer: ByteTokenizer | None = None) -> FamilySpec:
    """The :class:`FamilySpec` of ``name``: the tokenizer's ids, ``config.eps``,
    ``config.process`` (t_min, alpha0, p_uniform, gidd_max_weight, gidd_weighting) and
    ``config.sampling.alpha0`` (Eso-LM's alpha_0 at sampling).

    Raises:
      ValueError: an unknown family or invalid process parameters.
    """
    tok = tokenizer or ByteTokenizer()
    return FamilySpec(name, vocab_size=tok.vocab_size,
                      num_classes=tok.vocab_size - len(tok.SPECIALS), mask_id=tok.mask_id,
                      bos_id=tok.bos_id, eps=config.eps, sampling_alpha0=config.sampling.alpha0,
                      **config.process.to_dict())


@dataclasses.dataclass
class Model:
    """One model of the comparison: its family, size (d_model, layers, heads), ``nnx.split`` graph,
    train state (placed on the mesh), train step (:meth:`Runner.build_step`) and analytic cost."""

    spec: FamilySpec
    size: tuple[int, int, int]
    graphdef: nnx.GraphDef
    state: dict[str, Any]
    step: Any
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

    def __init__(self, config: ml_collections.ConfigDict, tokenizer: ByteTokenizer | None = None,
                 devices: Sequence[jax.Device] | None = None):
        self.config, self.tok = config, tokenizer or ByteTokenizer()
        self.tx = optimizer(config.optim)
        self.mesh = sharding.make_mesh(config.model_parallelism, devices=devices)
        self._steps: dict[tuple, Any] = {}
        self._evals: dict[tuple, Any] = {}

    def model_config(self, family: str, size: Sequence[int]) -> tuple[FamilySpec,
                                                                       TransformerConfig]:
        """(family spec, backbone config) of ``family`` at ``size`` = (d_model, layers, heads).

        Raises:
          ValueError: an unknown family, or a ``model_parallelism`` that does not divide the
            heads or MLP width.
        """
        c = self.config
        spec = family_spec(c, family, self.tok)
        d, layers, heads = size
        backbone = {**c.backbone.to_dict(), "dtype": jnp.dtype(c.backbone.dtype)}
        cfg = transformer_config(spec, c.seq_len, d_model=d, num_layers=layers, num_heads=heads,
                                 **backbone)
        cfg.check_model_parallelism(c.model_parallelism)
        return spec, cfg

    def flops_per_token(self, spec: FamilySpec, cfg: TransformerConfig) -> float:
        """Analytic forward FLOPs per data token, summed over a training example's passes
        (:attr:`FamilySpec.train_passes`), as the grid counts a run's compute."""
        return sum(forward_flops_per_token(cfg, n * self.config.seq_len) * n
                   for n in spec.train_passes)

    def init_state(self, params: nnx.State) -> dict[str, Any]:
        """The train state of ``params`` (optimizer state, EMA when ``ema_decay`` > 0)."""
        return init_state(params, self.tx, self.config.ema_decay)

    def build_step(self, family: str, size: Sequence[int], abstract: bool = False) -> steps.Step:
        """The train-or-evaluate step the grid runs for ``family`` at ``size`` (``mdlm_ce`` runs
        ``mdlm``'s: the objective is a traced flag), with its arguments on this runner's mesh
        (``core.steps.train_step``): the state (EMA when ``ema_decay`` > 0) of a model
        initialised at ``seed``, placed by ``param_sharding``; the batch as :meth:`batch` places
        it; the key ``jax.random.key(seed + 1)``. ``aux``: the model's ``nnx.GraphDef``. One step
        function per graph and objective (``jax.jit`` compiles it once). With ``abstract``
        nothing is allocated (``make aot``).

        Raises:
          ValueError: as :meth:`model_config`.
        """
        c = self.config
        spec, cfg = self.model_config(family, size)
        if spec.name == "mdlm_ce":
            spec = dataclasses.replace(spec, name="mdlm")
        graphdef, params = steps.split(lambda: Transformer(cfg, rngs=nnx.Rngs(c.seed)), abstract)
        b, L = c.batch_size, c.seq_len
        step = steps.train_step(
            make_step(graphdef, self.tx, spec, c.ema_decay), params, self.tx, self.mesh,
            init_state=lambda p, _: self.init_state(p), param_axes=PARAM_AXES,
            rules=c.param_sharding, logical_sizes=cfg.logical_sizes, key=c.seed + 1,
            batch={"x": jax.ShapeDtypeStruct((b, L), jnp.int32),
                   "train": jax.ShapeDtypeStruct((), jnp.float32),
                   "ce": jax.ShapeDtypeStruct((), jnp.float32)}, aux=graphdef)
        return dataclasses.replace(step, fn=self._steps.setdefault((graphdef, spec), step.fn))

    def model(self, family: str, size: Sequence[int]) -> Model:
        """A freshly initialised model (seed ``config.seed``) of ``family`` at ``size``."""
        spec, cfg = self.model_config(family, size)
        check_attention_platform(cfg.attention)
        step = self.build_step(family, size)
        state = step.args[0]
        return Model(spec, tuple(size), step.aux, state, step.fn, param_count(state["params"]),
                     self.flops_per_token(spec, cfg))

    def batch(self, x: np.ndarray, train: bool, ce: bool) -> dict[str, jax.Array]:
        """``{"x": int32 [B, L] split over data, "train", "ce": replicated f32 flags}``."""
        return {"x": sharding.shard_batch(np.asarray(x, np.int32), self.mesh),
                **sharding.replicate({"train": jnp.float32(train), "ce": jnp.float32(ce)},
                                     self.mesh)}

    def evaluate(self, model: Model, windows: np.ndarray, reps: int, key: jax.Array,
                 spec: FamilySpec | None = None) -> dict[str, Any]:
        """Held-out NELBO (nats/token; exact NLL for AR) of ``model`` under ``spec``'s process
        (default its own), ``reps`` time / mask draws of every window. Times are drawn from
        ``U[t_min, 1]`` (the convention of :mod:`families`), antithetic within each batch.

        The draws depend on ``key``, the window's batch and the draw only: every model evaluated
        with one ``key`` on one ``windows`` sees the same times (and, for processes with the same
        ``alpha_t``, the same clean positions), so differences between models are paired
        (common random numbers; :func:`paired_difference`).

        Args:
          windows: int [W, L] held-out tokens, W a multiple of ``batch_size``.

        Returns:
          ``{"mean": nats, "se": its standard error over windows, "windows": [W] each window's
          mean over the draws}`` (JSON-able floats).
        """
        spec = spec or model.spec
        ev_spec = dataclasses.replace(spec, name="mdlm") if spec.name == "mdlm_ce" else spec
        ck = (model.graphdef, ev_spec)
        if ck not in self._evals:
            self._evals[ck] = jax.jit(make_eval(model.graphdef, ev_spec, self.config.ema_decay))
        fn = self._evals[ck]
        b = self.config.batch_size
        rows = []
        for r in range(reps):
            row = []
            for i in range(0, windows.shape[0], b):
                k = jax.random.fold_in(key, r * 100_003 + i)
                row.append(fn(model.state, self.batch(windows[i:i + b], False, False), k))
            rows.append(row)
        vals = np.asarray(jax.device_get(rows), np.float64)          # [reps, W / b, b]
        per_window = vals.mean(axis=0).reshape(-1)
        n = per_window.size
        se = float(per_window.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
        return {"mean": float(per_window.mean()), "se": se, "windows": per_window.tolist()}

    def fingerprint(self, model: Model, horizon: int = 0) -> str:
        """The settings that shape ``model``'s run (to ``horizon``) and its evaluations
        (Eso-LM's sampling alpha_0 shapes neither)."""
        c = self.config
        spec = dataclasses.asdict(model.spec)
        spec.pop("sampling_alpha0")
        return config_fingerprint(
            spec, model.size, c.seed, c.data_path, c.val_fraction, c.seq_len, c.batch_size,
            c.backbone, c.optim, c.eval_windows, c.eval_reps, horizon)

    def train(self, model: Model, train_tokens: np.ndarray, eval_steps: Sequence[int],
              windows: np.ndarray, run_dir: str, cache: MutableMapping[str, Any],
              keep: bool = True, horizon: int = 0) -> dict[str, Any]:
        """Trains ``model`` to ``max(eval_steps)`` steps in ``run_dir`` with its learning rate
        decayed to ``horizon`` (0: constant after warmup; :func:`optimizer`), evaluating on
        ``windows`` at each of ``eval_steps``; evaluations already in ``cache`` (under the run
        directory's name, same fingerprint) are reused and their training is skipped. With
        ``keep`` the trained state ends in ``model.state``.

        Returns:
          ``{"evals": {str(step): Runner.evaluate's dict}, "seconds": training wall time here}``.
        """
        c, fp = self.config, self.fingerprint(model, horizon)
        name = os.path.basename(os.path.normpath(run_dir))
        entry = cache.get(name) or {}
        evals = dict(entry.get("evals", {})) if entry.get("fingerprint") == fp else {}
        batches = TextBatcher(train_tokens, c.batch_size, c.seq_len, seed=c.seed)
        ce = model.spec.name == "mdlm_ce"
        model.state = with_horizon(model.state, horizon)
        seconds = 0.0
        todo = [s for s in sorted(set(eval_steps)) if str(s) not in evals]
        if keep and not todo:
            todo = [max(eval_steps)]  # restore the finished run
        for s in todo:
            res = train_loop(
                model.step, model.state, batches, jax.random.key(c.seed + 1),
                LoopConfig(num_steps=s, log_every=c.log_every, keep_checkpoints=1,
                           desc=f"{model.spec.name} d={model.size[0]}"),
                workdir=run_dir, put_batch=lambda x: self.batch(x, True, ce), fingerprint=fp)
            model.state, seconds = res.state, seconds + res.seconds
            if str(s) not in evals:
                evals[str(s)] = self.evaluate(model, windows, c.eval_reps,
                                              jax.random.key(c.seed + 7))
                cache[name] = {"fingerprint": fp, "evals": evals}
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
      losses, se: {family: [C, S]} held-out NELBO (nats/token) and its standard error over
        windows.
      windows: {family: [C, S, W]} each held-out window's NELBO (mean over the draws); every cell
        is evaluated on the same windows with the same key (paired).
      sizes: {family: [S]} parameter counts.
      steps: {family: [C, S]} steps at which each budget was spent.
      reference: {family: Model} trained models at the reference size (every family).
      reference_runs: {family: run directory} of those models (``train_metrics.jsonl``).
      reference_size: (d_model, layers, heads) of those models.
      reference_steps: their step count (:func:`reference_of`).
      seconds: training wall time spent here.
    """

    losses: dict[str, np.ndarray]
    se: dict[str, np.ndarray]
    windows: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    reference: dict[str, Model]
    reference_runs: dict[str, str]
    reference_steps: int
    seconds: float
    reference_size: tuple[int, int, int] = ()


SCHEDULES = ("cosine", "constant")


def reference_of(config: ml_collections.ConfigDict) -> tuple[tuple[int, int, int], float, bool]:
    """The per-family comparison's size, its budget (FLOPs) and whether it is a cell of the grid.

    ``config.reference`` (a (d_model, layers, heads) triple; empty: ``sizes[reference_size]``)
    and ``config.reference_budget`` (FLOPs; 0: the largest of ``budgets``). Every family trains
    there for the same number of steps: those that spend the reference budget at that size for
    the first family trained there (of ``isoflop_families`` when the comparison is a grid cell,
    else of ``families``). When the size is one of
    ``sizes`` and the budget the largest, the grid's runs there are the comparison's; otherwise
    each family gets its own run.
    """
    size = tuple(config.get("reference", ()) or config.sizes[config.reference_size])
    largest = max(float(b) for b in config.budgets)
    budget = float(config.get("reference_budget", 0.0)) or largest
    in_grid = size in {tuple(s) for s in config.sizes} and budget == largest
    return size, budget, in_grid


def run_grid(runner: Runner, train_tokens: np.ndarray, windows: np.ndarray, runs_dir: str,
             cache: MutableMapping[str, Any]) -> GridResult:
    """Trains ``config.isoflop_families`` at every size and budget, then the other ``families`` at
    the reference size for the reference step count (:func:`reference_of`; every run sees the
    same batch stream and key: differences come from the family, the size and the budget). A
    reference outside the grid (another size, or a budget above the grid's) is its own run for
    every family, in ``<runs_dir>/<family>_d<d>_l<layers>_ref``.

    ``config.optim.schedule``: ``"cosine"`` trains one run per (size, budget), its learning rate
    decayed to that budget's step (Chinchilla's Approach 2, as Sahoo et al. 2026 do), in
    ``<runs_dir>/<family>_d<d>_l<layers>_c<k>`` (k: the budget's index); ``"constant"`` trains
    one warmup-then-constant run per size and reads it where each budget is spent (cheaper; it
    favours small models at small budgets).

    Raises:
      ValueError: an unknown ``optim.schedule``.
    """
    c = runner.config
    schedule = c.optim.get("schedule", "constant")
    if schedule not in SCHEDULES:
        raise ValueError(f"config field optim.schedule={schedule!r}: expected one of {SCHEDULES}")
    budgets = sorted(float(b) for b in c.budgets)
    ref, ref_budget, in_grid = reference_of(c)
    tokens_per_step = c.batch_size * c.seq_len
    cosine = schedule == "cosine"
    out = GridResult({}, {}, {}, {}, {}, {}, {}, 0, 0.0, ref)
    for fam in c.isoflop_families:
        cells, counts, used = [], [], []
        for size in c.sizes:
            m = runner.model(fam, size)
            steps = budget_steps(budgets, m.flops_per_token, tokens_per_step)
            is_ref = in_grid and tuple(size) == ref
            row = []
            if cosine:
                for k, n in enumerate(steps):
                    if k:
                        m = runner.model(fam, size)
                    keep = is_ref and k == len(steps) - 1
                    run_dir = os.path.join(runs_dir, f"{m.name}_c{k}")
                    res = runner.train(m, train_tokens, [n], windows, run_dir, cache, keep,
                                       horizon=n)
                    row.append(res["evals"][str(n)])
                    out.seconds += res["seconds"]
            else:
                run_dir = os.path.join(runs_dir, m.name)
                res = runner.train(m, train_tokens, steps, windows, run_dir, cache, is_ref)
                row = [res["evals"][str(n)] for n in steps]
                out.seconds += res["seconds"]
            cells.append(row)
            counts.append(m.params_count)
            used.append(steps)
            if is_ref:
                out.reference[fam], out.reference_steps = m, max(steps)
                out.reference_runs[fam] = run_dir
        out.losses[fam] = np.asarray([[e["mean"] for e in r] for r in cells]).T
        out.se[fam] = np.asarray([[e["se"] for e in r] for r in cells]).T
        out.windows[fam] = np.asarray([[e["windows"] for e in r] for r in cells]).transpose(1, 0, 2)
        out.sizes[fam], out.steps[fam] = np.asarray(counts, np.float64), np.asarray(used).T
    for fam in c.families:
        if fam in out.reference:
            continue
        m = runner.model(fam, ref)
        steps = out.reference_steps or budget_steps([ref_budget], m.flops_per_token,
                                                    tokens_per_step)[0]
        name = (f"{m.name}_c{len(budgets) - 1}" if cosine else m.name) if in_grid else \
            f"{m.name}_ref"
        run_dir = os.path.join(runs_dir, name)
        res = runner.train(m, train_tokens, [steps], windows, run_dir, cache,
                           horizon=steps if cosine else 0)
        out.reference[fam], out.reference_runs[fam] = m, run_dir
        out.reference_steps = out.reference_steps or steps
        out.seconds += res["seconds"]
    return out


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Mean and standard error over windows of ``a - b`` for two evaluations of the same windows
    with the same draws (:meth:`Runner.evaluate`'s ``windows``, [W] each, W >= 2), with the 95%
    normal interval ``lo``, ``hi`` (mean -+ 1.96 s.e.).

    Raises:
      ValueError: shapes differ or fewer than 2 windows.
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"paired_difference: need two [W >= 2] arrays of one shape, got "
                         f"{a.shape} and {b.shape}")
    d = a - b
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    return {"mean": mean, "se": se, "lo": mean - 1.96 * se, "hi": mean + 1.96 * se}


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
    """One family's IsoFLOP grid and fit as JSON-able numbers. ``at_edge`` [C] marks budgets whose
    optimum the size grid does not bracket (:attr:`scaling.IsoFlopFit.at_edge`); ``resolved`` is
    1 when none does; ``exponent`` (a of N* ~ C^a) is then a number, else None: a minimum at the
    grid's edge is not a minimum, so no exponent is reported."""
    return {"budgets": fit.budgets, "sizes": sizes, "steps": steps, "losses": losses,
            "loss_se": se, "n_opt": fit.n_opt, "loss_opt": fit.loss_opt, "concave": fit.concave,
            "at_edge": fit.at_edge, "resolved": int(fit.resolved),
            "exponent": float(fit.exponent) if fit.resolved else None,
            "loss_exponent": fit.loss_exponent}


def unigram_entropy(samples: np.ndarray, vocab_size: int) -> float:
    """Mean over rows of the entropy (nats) of each row's token histogram; ``samples`` int [n, L]."""
    ents = []
    for row in np.asarray(samples):
        p = np.bincount(row, minlength=vocab_size).astype(np.float64)
        p = p[p > 0] / row.size
        ents.append(float(-(p * np.log(p)).sum()))
    return float(np.mean(ents))
