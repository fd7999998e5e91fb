"""A generic training loop: jitted step with donation, progress bar, JSON-lines metrics,
periodic checkpoints, exact resume, a stop on a non-finite loss that keeps the last good
checkpoint, evaluation hooks (every k steps, once per epoch, or at listed steps) and early stopping
on an evaluated metric with the best state kept.

The step is a pure function ``step(state, batch, key) -> (state, metrics)`` over pytrees;
``metrics["loss"]`` must be a scalar. An evaluation ``evaluate(step, state) -> {name: value}`` runs
on the host between steps (held-out loss, sample quality, ...); its record also carries the mean
training loss since the previous evaluation, and :class:`EarlyStopping` watches one of its names.
The per-step key is ``fold_in(key, step)``, and the batch iterator's position is saved with the
state (with early stopping, also the best state and its bookkeeping), so a run killed and restarted
from its last checkpoint ends bit-identical (on CPU) to an uninterrupted one.

A killed run leaves things behind, and a rerun copes with each: a damaged newest checkpoint (the
newest step that restores cleanly is used, see ``core.checkpoint``), metrics logged after the
restored step or a torn last log line (the log is cut back to the restored step), a second process
on the same workdir (refused: the workdir is locked). Ctrl-C during a save is delivered once the
save has committed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from core import files
from core.checkpoint import (
    Checkpointer,
    CheckpointRestoreError,
    Restored,
    run_dir_lock,
)
from core.report import JsonLinesWriter
from core.timing import Stopwatch

PyTree = Any
StepFn = Callable[[PyTree, PyTree, jax.Array], tuple[PyTree, dict[str, jax.Array]]]


class NonFiniteLossError(RuntimeError):
    """Raised when the training loss becomes NaN or infinite; the last good checkpoint is kept."""

    def __init__(self, step: int, value: float, checkpoint_step: int | None):
        self.step, self.value, self.checkpoint_step = step, value, checkpoint_step
        super().__init__(
            f"non-finite loss {value} at step {step}; training stopped. Last good checkpoint: "
            f"{'none' if checkpoint_step is None else f'step {checkpoint_step}'}"
        )


class PositionedIterator(Protocol):
    """A batch iterator with an integer ``position`` that fully determines what comes next."""

    position: int

    def __next__(self) -> Any: ...


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
    """Stop when an evaluated metric has not improved for ``patience`` evaluations in a row.

    The state at the best evaluation is kept (a copy, checkpointed beside the training state so a
    resumed run keeps it too) and returned as :attr:`LoopResult.best_state`.

    Attributes:
      metric: the name in ``evaluate``'s result to watch (e.g. ``"val_loss"``).
      patience: evaluations without improvement after which training stops (>= 1).
      mode: ``"min"`` (lower is better) or ``"max"``.
      min_delta: an improvement must beat the best value by more than this (>= 0).

    A NaN or infinite value never counts as an improvement.
    """

    metric: str = "val_loss"
    patience: int = 3
    mode: str = "min"
    min_delta: float = 0.0

    def __post_init__(self):
        if self.patience < 1 or self.mode not in ("min", "max") or not self.min_delta >= 0:
            raise ValueError(f"invalid EarlyStopping {self}: need patience >= 1, mode 'min' or "
                             "'max' and min_delta >= 0")

    def improves(self, value: float, best: float | None) -> bool:
        """Whether ``value`` is a finite improvement on ``best`` (``None``: no best yet)."""
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        return value < best - self.min_delta if self.mode == "min" else \
            value > best + self.min_delta


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Loop settings.

    Attributes:
      num_steps: total optimizer steps (a resumed run continues up to this number).
      log_every: steps between metric records (and non-finite checks).
      checkpoint_every: steps between checkpoints (0: only at the end).
      keep_checkpoints: how many checkpoints orbax keeps.
      progress: show a tqdm progress bar.
      desc: progress bar label.
      steps_per_epoch: steps in one pass over the data (0: no epochs). With it, records carry
        ``epoch`` (completed passes, a float) and ``eval_every_epoch`` may be used.
      eval_every: steps between evaluations (0: none by period).
      eval_every_epoch: evaluate at the end of every epoch (needs ``steps_per_epoch``).
      eval_steps: further steps at which to evaluate (e.g. a compute ladder's checkpoints).
      early_stopping: stop on an evaluated metric (needs ``evaluate`` and some evaluation steps).
    """

    num_steps: int
    log_every: int = 10
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    progress: bool = True
    desc: str = "train"
    steps_per_epoch: int = 0
    eval_every: int = 0
    eval_every_epoch: bool = False
    eval_steps: tuple[int, ...] = ()
    early_stopping: EarlyStopping | None = None

    def __post_init__(self):
        if self.num_steps < 0 or self.log_every < 1 or self.checkpoint_every < 0:
            raise ValueError(f"invalid LoopConfig {self}: need num_steps >= 0, log_every >= 1, "
                             "checkpoint_every >= 0")
        if self.steps_per_epoch < 0 or self.eval_every < 0 or any(s < 1 for s in self.eval_steps):
            raise ValueError(f"invalid LoopConfig {self}: need steps_per_epoch >= 0, eval_every "
                             ">= 0 and every eval_steps entry >= 1")
        if self.eval_every_epoch and not self.steps_per_epoch:
            raise ValueError(f"invalid LoopConfig {self}: eval_every_epoch needs steps_per_epoch "
                             ">= 1")
        object.__setattr__(self, "eval_steps", tuple(sorted({int(s) for s in self.eval_steps})))
        if self.early_stopping is not None and not self.evaluates:
            raise ValueError(f"invalid LoopConfig {self}: early_stopping needs evaluation steps "
                             "(eval_every, eval_every_epoch or eval_steps)")

    @property
    def evaluates(self) -> bool:
        """Whether any step is an evaluation step."""
        return bool(self.eval_every or self.eval_every_epoch or self.eval_steps)

    def is_eval_step(self, step: int) -> bool:
        """Whether ``evaluate`` runs after optimizer step ``step`` (1-based)."""
        return bool((self.eval_every and step % self.eval_every == 0)
                    or (self.eval_every_epoch and step % self.steps_per_epoch == 0)
                    or step in self.eval_steps)

    def epoch(self, step: int) -> float | None:
        """Completed passes over the data after ``step`` steps (``None`` without epochs)."""
        return step / self.steps_per_epoch if self.steps_per_epoch else None


@dataclasses.dataclass
class LoopResult:
    """What :func:`train_loop` returns.

    Attributes:
      state: the state after the last step run (or restored).
      history: the records logged by this call (``step``, the step's metrics, ``epoch``).
      steps_run: optimizer steps this call ran.
      seconds: wall-clock seconds of this call's steps and evaluations.
      resumed_from: the checkpoint step resumed from, or ``None``.
      stopped_early_at: the step at which ``stop_when`` or early stopping ended training.
      evals: the evaluation records of this call (``step``, ``epoch``, ``train_loss`` — the mean
        training loss since the previous evaluation — and ``evaluate``'s values).
      best_state: with :class:`EarlyStopping`, the state at the best evaluation (also when
        restored); else ``None``.
      best_step: the step of ``best_state``; best_value: its metric value.
    """

    state: PyTree
    history: list[dict[str, float]]
    steps_run: int
    seconds: float
    resumed_from: int | None
    stopped_early_at: int | None = None
    evals: list[dict[str, float]] = dataclasses.field(default_factory=list)
    best_state: PyTree | None = None
    best_step: int | None = None
    best_value: float | None = None


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                    loss_fn: Callable[[nnx.Module, PyTree, jax.Array],
                                      tuple[jax.Array, dict[str, jax.Array]]]) -> StepFn:
    """A pure train step for an NNX model used functionally.

    ``state`` is ``{"params": nnx.State, "opt_state": optax state, "step": int32 scalar}``.
    ``loss_fn(model, batch, key) -> (loss, aux_metrics)``. Metrics returned: ``loss``,
    ``grad_norm`` and the aux metrics.
    """

    def step(state, batch, key):
        def objective(params):
            return loss_fn(nnx.merge(graphdef, params), batch, key)

        (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, metrics

    return step


def init_train_state(params: nnx.State, tx: optax.GradientTransformation) -> PyTree:
    """``{"params", "opt_state", "step"}`` for :func:`make_train_step`."""
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}


def _to_float(x) -> float:
    return float(np.asarray(x))


def config_fingerprint(*configs: Any) -> str:
    """A short stable hash (16 hex digits) of JSON-able settings (dicts, ConfigDicts via
    ``to_dict()``, numbers, strings, tuples) for :func:`train_loop`'s ``fingerprint``."""
    plain = [c.to_dict() if hasattr(c, "to_dict") else c for c in configs]
    text = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped :func:`train_loop`; the message names the last checkpoint.

    A ``KeyboardInterrupt``, so code that lets interrupts through still does; an entry point
    prints ``str(error)`` as its one line. A checkpoint being written when the signal came is
    committed first (``core.checkpoint.defer_interrupts``).
    """

    def __init__(self, desc: str, step: int, checkpoint_step: int | None, directory: str | None):
        self.step, self.checkpoint_step = step, checkpoint_step
        if checkpoint_step is None:
            then = ("no checkpoint yet" if directory else "no checkpoints are kept") + \
                "; rerun the same command to start again"
        else:
            then = (f"last checkpoint: step {checkpoint_step} in {directory}; rerun the same "
                    "command to resume from it")
        super().__init__(f"{desc}: interrupted at step {step}; {then}")


def _restore_same_run(ckpt: Checkpointer, state: PyTree, fingerprint: str | None,
                      desc: str) -> Restored | None:
    """The newest cleanly restoring checkpoint of this run (see train_loop), or None."""
    fix = "use another --workdir, or move that directory aside to start this run afresh"

    def same_run(meta: dict[str, Any]) -> None:
        stored = meta.get("fingerprint")
        if fingerprint is not None and stored is not None and stored != fingerprint:
            raise ValueError(f"{desc}: {ckpt.directory} holds a checkpoint of a different run "
                             f"(settings fingerprint {stored}, this run {fingerprint}); {fix}")

    try:
        return ckpt.restore_newest(state, check_metadata=same_run)
    except CheckpointRestoreError as e:
        raise CheckpointRestoreError(f"{desc}: {e}") from None
    except ValueError as e:
        message = str(e)
        if "different run" in message:
            raise
        raise ValueError(f"{desc}: {ckpt.directory} holds a checkpoint of a different run (its "
                         f"state does not match this run's: {_first_line(message)}); {fix}"
                         ) from None


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def restore_message(step: int, saved_target: int | None, num_steps: int) -> str:
    """What a run restored at ``step`` does next, in words for the terminal.

    Args:
      step: the checkpoint's step.
      saved_target: the number of steps the run that saved it was asked for (the checkpoint's
        ``target_steps``; ``None`` for a checkpoint written before it was recorded).
      num_steps: the number of steps asked for now (``>= step``).

    Returns:
      ``"restored the finished run at step s"`` when nothing is left to train; ``"continuing the
      same run from step s, where its s-step budget ended, to n steps"`` when the checkpoint is
      the end of a finished shorter run (nested budgets, e.g. an IsoFLOP grid, or a longer rerun);
      otherwise ``"resuming from step s of an interrupted run of t steps"``.
    """
    if step >= num_steps:
        return f"restored the finished run at step {step}"
    if saved_target == step:
        return (f"continuing the same run from step {step}, where its {step}-step budget ended, "
                f"to {num_steps} steps")
    of = f" of an interrupted run of {saved_target} steps" if saved_target else ""
    return f"resuming from step {step}{of}"


def train_loop(step_fn: StepFn, state: PyTree, batches: PositionedIterator, key: jax.Array,
               config: LoopConfig, workdir: str | None = None,
               put_batch: Callable[[Any], Any] | None = None,
               on_log: Callable[[int, dict[str, float]], None] | None = None,
               stop_when: Callable[[int, PyTree], bool] | None = None,
               fingerprint: str | None = None,
               evaluate: Callable[[int, PyTree], dict[str, Any]] | None = None,
               schedule_steps: int | None = None) -> LoopResult:
    """Runs ``step_fn`` for ``config.num_steps`` steps, resuming from ``workdir`` if possible.

    Args:
      step_fn: pure ``(state, batch, key) -> (state, metrics)``; jitted here once with the state
        donated.
      state: the initial state (also the abstract target for restoring).
      batches: iterator with a ``position`` attribute.
      key: base PRNG key; step ``i`` uses ``fold_in(key, i)``.
      config: loop settings (evaluation steps and early stopping included).
      workdir: a local folder or an object-store URL (``gs://bucket/run``); checkpoints go to
        ``workdir/checkpoints``, metrics to ``workdir/train_metrics.jsonl`` and evaluations to
        ``workdir/eval_metrics.jsonl``; ``None`` disables all three. The directory is locked for the duration
        (``core.checkpoint.run_dir_lock``). On resume from step ``s`` the metrics files keep only
        the records of steps ``<= s`` (a torn last line is dropped), so every step is logged once;
        a fresh start empties them.
      put_batch: maps a host batch to device arrays (e.g. ``core.sharding.shard_batch``).
      on_log: called with ``(step, record)`` at every log step and, for evaluation records, at
        every evaluation step (an evaluation record has ``train_loss``).
      stop_when: early stopping; called with ``(step, state)`` at every log step (after
        ``on_log``). Returning True ends training at that step: the state is checkpointed with
        ``stopped_early`` in its metadata, and a rerun on the same ``workdir`` restores it and
        trains no further.
      fingerprint: a string identifying what is trained (e.g. :func:`config_fingerprint` of the
        settings that shape the run); stored with every checkpoint, and a checkpoint in
        ``workdir`` with a different fingerprint is not resumed from (``ValueError``).
      evaluate: ``(step, state) -> {name: float}`` called after each evaluation step of
        ``config`` (after that step's log record); it must not modify ``state`` (the loop's next
        step donates it) and should be deterministic in ``(step, state)`` for exact resume
        (derive its keys from ``step``). :class:`EarlyStopping` in ``config`` stops on one of the
        names it returns, and ends training as ``stop_when`` does.
      schedule_steps: the run length the optimizer's schedule was built for, when the schedule
        depends on it (e.g. a cosine decay that ends at the last step; ``None``: it does not).
        Stored with every checkpoint; a checkpoint whose schedule was built for another length
        is not resumed from (``ValueError``), since the rate would jump to the new schedule's
        value at the step resumed from and the run would be neither schedule.

    Returns:
      :class:`LoopResult` with the final state, the logged history and evaluations
      (``stopped_early_at`` is the step at which training was stopped early, also when restored
      from such a run; ``best_state`` the kept best state under early stopping).

    Raises:
      NonFiniteLossError: a NaN/inf loss; the checkpoint directory keeps the last good step.
      ValueError: ``workdir`` holds a checkpoint of a different run (another fingerprint, or a
        state of another structure), one trained beyond ``config.num_steps``, or one whose
        ``schedule_steps`` differs from this call's; nothing is overwritten. Evaluation steps
        or early stopping without ``evaluate``, or an ``evaluate`` result without the
        early-stopping metric.
      core.checkpoint.CheckpointRestoreError: no checkpoint in ``workdir`` restores cleanly. (A
        damaged newest step with an intact older one is not an error: the older one is restored
        and the damaged one named in a warning and moved aside.)
      core.checkpoint.RunDirectoryInUseError: another process is training in ``workdir``.
      TrainingInterrupted: SIGINT; a checkpoint being saved is committed first.
    """
    if config.evaluates and evaluate is None:
        raise ValueError(f"{config.desc}: LoopConfig asks for evaluations (eval_every, "
                         "eval_every_epoch or eval_steps) but no evaluate function was given")
    args = (step_fn, state, batches, key, config, workdir, put_batch, on_log, stop_when,
            fingerprint, evaluate, schedule_steps)
    if workdir is None or jax.process_index() != 0:
        return _train_loop(*args)
    with run_dir_lock(workdir):
        return _train_loop(*args)


def _copy(tree: PyTree) -> PyTree:
    # A copy that survives the donation of ``tree`` to the next step (same shardings).
    return jax.tree.map(jnp.copy, tree)


def _train_loop(step_fn, state, batches, key, config, workdir, put_batch, on_log, stop_when,
                fingerprint, evaluate, schedule_steps) -> LoopResult:
    jitted = jax.jit(step_fn, donate_argnums=0)
    early = config.early_stopping
    ckpt = Checkpointer(files.join(workdir, "checkpoints"), config.keep_checkpoints) if workdir \
        else None
    writer = JsonLinesWriter(files.join(workdir, "train_metrics.jsonl")) if workdir else None
    eval_writer = JsonLinesWriter(files.join(workdir, "eval_metrics.jsonl")) \
        if workdir and config.evaluates else None
    start, resumed, stopped_at = 0, None, None
    end = config.num_steps
    # early stopping: the best state so far and its bookkeeping (checkpointed with the state)
    best = _copy(state) if early is not None else None
    tracker = {"best_step": None, "best_value": None, "bad_evals": 0, "loss_sum": 0.0,
               "loss_count": 0}

    def packed(st, bst):
        return st if early is None else {"state": st, "best": bst}

    try:
        found = _restore_same_run(ckpt, packed(state, best), fingerprint, config.desc) \
            if ckpt else None
    except BaseException:
        ckpt.close()
        raise
    if found is not None:
        meta = found.metadata
        state, best = (found.state, None) if early is None else \
            (found.state["state"], found.state["best"])
        start = resumed = int(meta["step"])
        if start > config.num_steps:
            ckpt.close()
            raise ValueError(
                f"{config.desc}: {ckpt.directory} holds this run trained to step {start}, beyond "
                f"num_steps={config.num_steps}; ask for at least {start} steps to reuse it, or use "
                "another --workdir")
        # A checkpoint from before schedule_steps was stored: its run's schedule was built for
        # the steps it was asked for (the only callers that pass schedule_steps pass num_steps).
        stored = meta.get("schedule_steps", meta.get("target_steps"))
        if schedule_steps is not None and stored is not None and int(stored) != schedule_steps:
            ckpt.close()
            raise ValueError(
                f"{config.desc}: {ckpt.directory} holds a run (at step {start}) whose learning-rate "
                f"schedule was built for {int(stored)} steps, and this run's for {schedule_steps}; "
                f"continuing would switch schedules at step {start} and train neither. Ask for "
                f"{int(stored)} steps to finish or restore that run, or use another --workdir to "
                f"train {schedule_steps} steps afresh")
        batches.position = int(meta["data_position"])
        tracker.update({k: meta[k] for k in tracker if k in meta})
        if meta.get("stopped_early"):
            stopped_at = end = start
            print(f"{config.desc}: restored the early-stopped run at step {start} "
                  f"({ckpt.directory})", file=sys.stderr)
        else:
            print(f"{config.desc}: {restore_message(start, meta.get('target_steps'), end)} "
                  f"({ckpt.directory})", file=sys.stderr)
    for w in (writer, eval_writer):
        if w is not None:
            dropped = w.truncate(lambda r, s=start: int(r.get("step", 0)) <= s)
            if dropped and found is not None:
                print(f"{config.desc}: dropped {dropped} record(s) after step {start} from "
                      f"{w.path}", file=sys.stderr)
    last_good = resumed
    history: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    pending: list[tuple[int, dict[str, jax.Array]]] = []

    def with_epoch(record: dict[str, Any]) -> dict[str, Any]:
        epoch = config.epoch(record["step"])
        return record if epoch is None else {**record, "epoch": epoch}

    def flush() -> None:
        # Pull pending metrics to the host; stop on the first non-finite loss.
        for step_i, m in pending:
            loss = _to_float(m["loss"])
            if not math.isfinite(loss):
                raise NonFiniteLossError(step_i, loss, last_good)
            tracker["loss_sum"] += loss
            tracker["loss_count"] += 1
        if pending:
            step_i, m = pending[-1]
            record = with_epoch({"step": step_i, **{k: _to_float(v) for k, v in m.items()}})
            history.append(record)
            if writer:
                writer.write(record)
            if on_log:
                on_log(step_i, record)
            if bar is not None:
                bar.set_postfix(loss=f"{record['loss']:.4f}")
        pending.clear()

    def run_eval(step_i: int) -> bool:
        # Evaluate after step_i; returns whether early stopping ends training here.
        nonlocal best
        values = {k: _to_float(v) for k, v in evaluate(step_i, state).items()}
        count = tracker["loss_count"]
        record = with_epoch({"step": step_i, "train_loss": tracker["loss_sum"] / count
                             if count else math.nan, **values})
        tracker["loss_sum"], tracker["loss_count"] = 0.0, 0
        evals.append(record)
        if eval_writer:
            eval_writer.write(record)
        if on_log:
            on_log(step_i, record)
        if early is None:
            return False
        if early.metric not in values:
            raise ValueError(f"{config.desc}: early stopping watches {early.metric!r} but evaluate "
                             f"returned {sorted(values)}")
        value = values[early.metric]
        if early.improves(value, tracker["best_value"]):
            best = _copy(state)
            tracker.update(best_step=step_i, best_value=value, bad_evals=0)
            return False
        tracker["bad_evals"] += 1
        return tracker["bad_evals"] >= early.patience

    bar = tqdm(total=config.num_steps, initial=start, desc=config.desc, mininterval=2.0,
               disable=not config.progress, leave=False)
    stopwatch = Stopwatch().start()
    step_reached = start
    try:
        for i in range(start, end):
            batch = next(batches)
            if put_batch is not None:
                batch = put_batch(batch)
            state, metrics = jitted(state, batch, jax.random.fold_in(key, i))
            step_done = step_reached = i + 1
            pending.append((step_done, metrics))
            log_now = step_done % config.log_every == 0 or step_done == end
            eval_now = evaluate is not None and config.is_eval_step(step_done)
            if log_now or eval_now:
                flush()
            if eval_now and run_eval(step_done) and step_done < end:
                stopped_at = end = step_done
            if log_now and stop_when is not None and step_done < end \
                    and stop_when(step_done, state):
                stopped_at = end = step_done
            save_now = ckpt is not None and (
                step_done == end
                or (config.checkpoint_every and step_done % config.checkpoint_every == 0))
            if save_now:
                flush()
                meta = {"step": step_done, "data_position": batches.position,
                        "stopped_early": stopped_at is not None, "target_steps": end}
                if early is not None or config.evaluates:
                    meta.update(tracker)
                if fingerprint is not None:
                    meta["fingerprint"] = fingerprint
                if schedule_steps is not None:
                    meta["schedule_steps"] = int(schedule_steps)
                last_good = None  # unknown until the save returns (it may raise after committing)
                ckpt.save(step_done, packed(state, best), meta)
                last_good = step_done
            bar.update(1)
            if step_done == end:
                break
        flush()
    except KeyboardInterrupt:
        if ckpt is not None and last_good is None:
            last_good = ckpt.latest_step()
        raise TrainingInterrupted(config.desc, step_reached, last_good,
                                  ckpt.directory if ckpt is not None else None) from None
    finally:
        bar.close()
        if ckpt is not None:
            ckpt.close()
    jax.block_until_ready(state)
    return LoopResult(state, history, end - start, stopwatch.seconds, resumed, stopped_at,
                      evals, best, tracker["best_step"], tracker["best_value"])
