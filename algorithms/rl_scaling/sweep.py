"""The IsoCompute sweep: every (n, B_p, seed) GRPO run trained once to the largest budget and
evaluated at each budget of a log grid (Cheng et al. 2026, Sec. 3: iso-compute curves).

Dimensions: L lanes (independent runs) sharing one compiled step, R = n B_p rollouts per step,
G distinct-problem rows per step, N held-out problems per split, J budgets, S seeds, T rollout
streams per seed.

Replicates. Each (n, B_p) runs S x T times: a seed s fixes the order of the training problems
(the batches drawn), a stream t the randomness of the rollouts sampled on them, from separate PRNG
keys (:func:`lane_keys`). Streams measure what the rollouts' own randomness does to a run; the
same run on another CPU, whose float rounding differs in its last bits, drifts away from this
one as a run with another stream does (a policy-gradient run amplifies any difference in a
sampled token), so the analysis bootstraps over both (:func:`algorithms.rl_scaling.fit.resample_mean`).

With a constant learning rate the run at budget C is the first M = C / (n B_p) steps of the run at
the largest budget, so each lane is trained once and read off at every budget. Lanes with the same
R = n B_p run as one ``vmap``-ed, jitted step (n is traced): one compilation per distinct R. The
step follows core.training's protocol (pure ``step(params, opt_state, ...)``, state donated, keys
derived from the step number ``fold_in(key, m)``, one key for the batch and one for the
rollouts); the lane axis is split over the ``data`` axis of
a mesh of all devices (independent runs, so no cross-device traffic), padded with repeats of the
last lane. The host does not wait on a step: per-step metrics stay on the device until the next
evaluation, so dispatch runs ahead of the computation.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from algorithms.rl_scaling import allocation, grpo, metrics, trainer
from core import sharding, steps
from core.timing import Stopwatch

PyTree = Any


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """Static settings of a sweep (hashable).

    Attributes:
      ns: rollouts per problem n to try.
      problems_per_batch: B_p values to try.
      num_seeds: seeds per (n, B_p): orders of the training problems.
      budgets: rollout budgets C, increasing; a lane (n, B_p) runs iff n B_p divides the largest.
      grpo: the loss configuration.
      learning_rate: constant Adam learning rate (constant, so budgets are prefixes of one run).
      grad_clip: global-norm clip.
      temperature: rollout sampling temperature tau; the loss's log-probs and the held-out exact
        pass@1 / pass@k are under the same policy softmax(logits / tau).
      pass_k: k of the exact pass@k in the records.
      seed: base seed of every lane's keys (:func:`lane_keys`).
      num_streams: rollout streams per seed: T runs that share a seed's problem order and sample
        their rollouts from independent keys.

    Raises (on construction):
      ValueError: empty grids, non-increasing budgets, num_seeds < 1, num_streams < 1,
        pass_k < 1, or no (n, B_p) that fits the largest budget.
    """

    ns: tuple[int, ...]
    problems_per_batch: tuple[int, ...]
    num_seeds: int
    budgets: tuple[int, ...]
    grpo: grpo.GRPOConfig = grpo.GRPOConfig()
    learning_rate: float = 3e-4
    grad_clip: float = 1.0
    temperature: float = 1.0
    pass_k: int = 8
    seed: int = 0
    num_streams: int = 1

    def __post_init__(self):
        if not self.ns or not self.problems_per_batch or not self.budgets:
            raise ValueError(f"SweepConfig: ns={self.ns}, problems_per_batch="
                             f"{self.problems_per_batch} and budgets={self.budgets} must be "
                             "non-empty")
        if any(b <= a for a, b in zip(self.budgets, self.budgets[1:])):
            raise ValueError(f"SweepConfig.budgets={self.budgets}: expected increasing budgets")
        if self.num_seeds < 1 or self.num_streams < 1 or self.pass_k < 1:
            raise ValueError(f"SweepConfig: need num_seeds, num_streams and pass_k >= 1, got "
                             f"{self.num_seeds}, {self.num_streams}, {self.pass_k}")
        if not self.groups():
            raise ValueError(f"SweepConfig: no (n, B_p) with n * B_p dividing the largest budget "
                             f"{self.budgets[-1]}")

    def groups(self) -> dict[int, list[tuple[int, int]]]:
        """{R: [(n, B_p), ...]} for the feasible (n, B_p) at the largest budget, by increasing R."""
        out = collections.defaultdict(list)
        for n in self.ns:
            for bp in self.problems_per_batch:
                if allocation.feasible(self.budgets[-1], n, bp):
                    out[n * bp].append((n, bp))
        return dict(sorted(out.items()))

    def lanes(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
        """The runs (n, B_p, seed, stream) of the (n, B_p) ``pairs``, seeds outer."""
        return [(n, bp, s, t) for n, bp in pairs for s in range(self.num_seeds)
                for t in range(self.num_streams)]


@dataclasses.dataclass
class SweepResult:
    """What a sweep measured.

    Attributes:
      records: one dict per (lane, budget): budget, n, bp, seed, stream, steps, easy_pass1,
        hard_pass1,
        easy_passk, hard_passk (held-out, exact, at the sweep's temperature), train_reward (mean over the steps so far).
      step_metrics: {(n, bp, seed, stream): {metric: float32 [M]}} per-step diagnostics of each
        lane
        (see :func:`trainer.make_rl_step`).
      rollouts: rollouts sampled in the timed steps (every step but each group's first).
      seconds: wall seconds of those steps (rollout + update; compilation and evaluation
        excluded).
      compile_seconds: wall seconds of each group's first step (compilation + one step).
    """

    records: list[dict]
    step_metrics: dict[tuple[int, int, int, int], dict[str, np.ndarray]]
    rollouts: int
    seconds: float
    compile_seconds: float

    @property
    def rollouts_per_second(self) -> float:
        return self.rollouts / self.seconds if self.seconds else float("nan")


def pad_lanes(lanes: list, num_devices: int) -> list:
    """``lanes`` extended by copies of its last entry to a multiple of ``num_devices``; the copies
    recompute that lane (same key), their results are dropped."""
    return lanes + [lanes[-1]] * (-len(lanes) % num_devices)


def stack(tree: PyTree, num: int) -> PyTree:
    """``tree`` with every leaf broadcast to a leading lane axis of size ``num``."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (num, *x.shape)), tree)


def lane_key(seed: int, n: int, bp: int, s: int) -> jax.Array:
    """The base PRNG key of (n, B_p) at seed s: ``fold_in(fold_in(key(seed + 1 + s), n), B_p)``."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed + 1 + s), n), bp)


def lane_keys(seed: int, n: int, bp: int, s: int, t: int) -> tuple[jax.Array, jax.Array]:
    """(problem-order key, rollout key) of lane (n, B_p, seed s, stream t): the two halves of
    ``split(lane_key(seed, n, B_p, s))``, the second folded with t. Step m draws its batch with
    ``fold_in(order, m)`` and samples its rollouts with ``fold_in(rollout, m)``, so the streams of
    a seed see the same problems and independent rollouts."""
    order, streams = jax.random.split(lane_key(seed, n, bp, s))
    return order, jax.random.fold_in(streams, t)


def optimizer(cfg: SweepConfig) -> optax.GradientTransformation:
    """Every lane's optimizer: Adam at the constant ``learning_rate`` after global-norm clipping
    at ``grad_clip`` (constant, so the budgets are prefixes of one run)."""
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), optax.adam(cfg.learning_rate))


def group_spec(cfg: SweepConfig, rollouts_per_step: int, answer_len: int) -> trainer.RLSpec:
    """The :class:`trainer.RLSpec` of the lanes with R = ``rollouts_per_step`` (a key of
    ``cfg.groups()``): the loss, the temperature, ``answer_len`` new tokens, and room for the
    distinct problems of the group's smallest n (R / min n rows).

    Raises:
      ValueError: R is not one of the sweep's groups.
    """
    groups = cfg.groups()
    if rollouts_per_step not in groups:
        raise ValueError(f"group_spec: R={rollouts_per_step} is not a group of the sweep; "
                         f"groups: {sorted(groups)}")
    return trainer.RLSpec(rollouts_per_step=rollouts_per_step, max_new_tokens=answer_len,
                          grpo=cfg.grpo, temperature=cfg.temperature,
                          max_problems=rollouts_per_step // min(
                              n for n, _ in groups[rollouts_per_step]))


def sweep_step_fn(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                  spec: trainer.RLSpec):
    """The lane-vmapped step ``(params [L], opt_state [L], order_keys [L], rollout_keys [L], m,
    n [L], pool, ref) -> (params, opt_state, metrics [L])``, not jitted (:func:`group_step`);
    at step m lane i draws its batch with ``fold_in(order_keys[i], m)`` and its rollouts with
    ``fold_in(rollout_keys[i], m)`` (:func:`lane_keys`)."""
    step = jax.vmap(trainer.make_rl_step(graphdef, tx, spec),
                    in_axes=(0, 0, 0, 0, None, None, 0))
    at_step = jax.vmap(jax.random.fold_in, in_axes=(0, None))

    def sweep_step(params, opt_state, order_keys, rollout_keys, m, ns, pool, ref):
        return step(params, opt_state, at_step(order_keys, m), ns, pool, ref,
                    at_step(rollout_keys, m))

    return sweep_step


def group_step(cfg: SweepConfig, graphdef: nnx.GraphDef, params0: nnx.State,
               pool: dict[str, jax.Array], rollouts_per_step: int,
               mesh: jax.sharding.Mesh) -> steps.Step:
    """The step :func:`run_sweep` jits for the lanes sharing R = ``rollouts_per_step``
    (:func:`sweep_step_fn`), with its arguments on ``mesh``: the group's lanes padded for the
    ``data`` axis (:func:`pad_lanes`; ``aux``) with their stacked ``params0``, Adam states, ``n``s
    and :func:`lane_keys` split over ``data``; m (an int at each call); ``pool`` and the KL
    reference (None when ``kl_beta`` is 0) replicated. Params and Adam states are donated.
    Abstract ``params0`` and ``pool`` give abstract arguments (``make aot``).

    Raises:
      ValueError: R is not a group of the sweep.
    """
    abstract = steps.is_abstract(params0)
    spec = group_spec(cfg, rollouts_per_step, pool["targets"].shape[1])
    lanes = pad_lanes(cfg.lanes(cfg.groups()[rollouts_per_step]), mesh.shape[sharding.DATA])
    tx, rep = optimizer(cfg), sharding.replicated(mesh)

    def split(tree):  # the lane axis over `data`
        return steps.place(tree, steps.batch_shardings(tree, mesh), abstract)

    # the optimizer state placed as the step returns it (lanes over `data`): left where the eager
    # init puts it, the second step would compile the group's program again
    params = split(steps.build(lambda p: stack(p, len(lanes)), params0, abstract=abstract))
    opt_state = split(steps.build(jax.vmap(tx.init), params, abstract=abstract))
    keys = steps.build(lambda: tuple(jnp.stack(k) for k in zip(
        *(lane_keys(cfg.seed, *lane) for lane in lanes))), abstract=abstract)
    m = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep, weak_type=True)
    args = (params, opt_state, *split(keys), m,
            split(np.asarray([lane[0] for lane in lanes], np.int32)), steps.place(pool, rep),
            steps.place(params0, rep) if cfg.grpo.kl_beta > 0 else None)
    return steps.Step(sweep_step_fn(graphdef, tx, spec), args, (0, 1), lanes)


def run_sweep(cfg: SweepConfig, graphdef: nnx.GraphDef, params0: nnx.State,
              pool: dict[str, jax.Array], evals: dict[str, tuple[jax.Array, ...]], *,
              mesh: jax.sharding.Mesh | None = None, desc: str = "sweep") -> SweepResult:
    """Trains every (n, B_p, seed) lane to the largest budget, evaluating at each budget.

    Args:
      cfg: the sweep.
      graphdef, params0: the policy (warm start), split with nnx.
      pool: training problems {"prompts" int32 [N, Lp], "targets" int32 [N, T], "lens" int32 [N]}
        with N >= the largest n B_p.
      evals: {"easy": (prompts, targets, lens), "hard": (...)} held-out problems.
      mesh: mesh whose ``data`` axis splits the lanes (default: every device).
      desc: progress-bar label.

    Returns:
      a :class:`SweepResult`; its numbers do not depend on the number of devices.

    Raises:
      ValueError: a pool smaller than the largest n B_p, or an (n, B_p) that the loss
        configuration refuses (n < 2 with group normalisation).
    """
    groups = cfg.groups()
    if pool["prompts"].shape[0] < max(groups):
        raise ValueError(f"run_sweep: training pool of {pool['prompts'].shape[0]} problems is "
                         f"smaller than the largest n * B_p = {max(groups)}")
    for pairs in groups.values():
        for n, bp in pairs:
            allocation.Allocation(cfg.budgets[-1], n, bp, cfg.grpo.advantage == "grpo")
    mesh = mesh or sharding.make_mesh()
    pool, evals = sharding.replicate((pool, evals), mesh)
    c_max, budgets = cfg.budgets[-1], set(cfg.budgets)

    @jax.jit
    def evaluate(params):
        def one(p):
            return (trainer.answer_prob(graphdef, p, *evals["easy"], cfg.temperature),
                    trainer.answer_prob(graphdef, p, *evals["hard"], cfg.temperature))
        return jax.vmap(one)(params)

    records, step_metrics = [], {}
    rollouts_done, seconds, compile_seconds = 0, 0.0, 0.0
    bar = tqdm(total=sum(c_max // r for r in groups), desc=desc, mininterval=2.0, leave=False)
    for r, pairs in groups.items():
        lanes = cfg.lanes(pairs)
        group = group_step(cfg, graphdef, params0, pool, r, mesh)
        step = jax.jit(group.fn, donate_argnums=group.donate_argnums)
        params, opt_state, order_keys, rollout_keys, _, ns, _, ref = group.args
        run_lanes = group.aux
        hist = []
        for m in range(1, c_max // r + 1):
            evaluate_now = m * r in budgets
            with Stopwatch() as sw:
                params, opt_state, met = step(params, opt_state, order_keys, rollout_keys, m,
                                              ns, pool, ref)
                if m == 1 or evaluate_now:
                    jax.block_until_ready(params)
            if m == 1:
                compile_seconds += sw.seconds
            else:
                seconds += sw.seconds
                rollouts_done += r * len(run_lanes)
            hist.append(met)
            bar.update(1)
            if evaluate_now:
                hist = jax.device_get(hist)
                pe, ph = jax.device_get(evaluate(params))
                for i, (n, bp, s, t) in enumerate(lanes):
                    records.append({
                        "budget": m * r, "n": n, "bp": bp, "seed": s, "stream": t, "steps": m,
                        "easy_pass1": float(pe[i].mean()), "hard_pass1": float(ph[i].mean()),
                        "hard_passk": float(metrics.expected_pass_at_k(ph[i], cfg.pass_k).mean()),
                        "easy_passk": float(metrics.expected_pass_at_k(pe[i], cfg.pass_k).mean()),
                        "train_reward": float(np.mean([h["reward"][i] for h in hist]))})
        hist = jax.device_get(hist)
        for i, lane in enumerate(lanes):
            step_metrics[lane] = {k: np.asarray([h[k][i] for h in hist]) for k in hist[0]}
    bar.close()
    return SweepResult(records, step_metrics, rollouts_done, seconds, compile_seconds)
