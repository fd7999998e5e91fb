"""Training the SPF network: problems from run settings, the data-parallel mesh, the positioned
iterator of simulated training episodes, and the pieces ``core.training.train_loop`` takes.

Dimensions: E episodes per training step, T time steps, M samples per step, d decision dimension.

SPF training is data-parallel: each step's E simulated episodes are split over the ``data`` axis of
a mesh over every device (:func:`data_parallel_mesh`, :class:`EpisodeBatches`) with the network
replicated; the trained network does not depend on the device count beyond the order of the sums
over episodes.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from algorithms.spf import problems as P
from algorithms.spf import spf as S
from core import sharding
from core import steps as core_steps
from core.training import make_train_step

# the run settings a Problem is built from (besides kind, drift, dim and steps)
PROBLEM_FIELDS = ("batch", "dt", "noise", "omega_min", "omega_max", "ou_kappa", "ou_sigma")


def make_problem(name: str, settings: Mapping[str, Any], dim: int | None = None,
                 steps: int | None = None) -> P.Problem:
    """The :class:`~algorithms.spf.problems.Problem` called ``name`` (``"<kind>_<drift>"``).

    Args:
      name: e.g. ``"lsq_rotation"``.
      settings: a mapping (config) with ``dim``, ``steps`` and :data:`PROBLEM_FIELDS`.
      dim, steps: overrides of ``settings.dim`` and ``settings.steps``.

    Raises:
      ValueError: a name that is not ``<kind>_<drift>`` with known kind and drift.
    """
    kind, _, drift = name.partition("_")
    if kind not in P.KINDS or drift not in P.DRIFTS:
        raise ValueError(f"spf config: unknown problem {name!r}; expected '<kind>_<drift>' with "
                         f"kind in {P.KINDS} and drift in {P.DRIFTS}")
    return P.Problem(kind=kind, drift=drift, dim=dim or settings["dim"],
                     steps=steps or settings["steps"], **{k: settings[k] for k in PROBLEM_FIELDS})


def data_parallel_mesh(episodes: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh SPF trains on: a ``data`` axis over every device (of ``devices``, default all)
    whose size divides ``episodes``.

    The training batch (``episodes`` simulated episodes per step) is split evenly over the ``data``
    axis, so its size must divide ``episodes``. In a single-process run whose device count does not
    divide it, the mesh takes the first k devices, k the largest divisor of ``episodes`` not above
    the device count, and says so on stderr (the trained network is the same: only the split
    changes); a multi-process run must use every device.

    Raises:
      ValueError: ``episodes < 1``; or, with several processes, ``episodes`` not a multiple of the
        device count.
    """
    if episodes < 1:
        raise ValueError(f"spf config: train_episodes={episodes} must be >= 1")
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if episodes % n == 0:
        return sharding.make_mesh(devices=devices)
    if jax.process_count() > 1:
        raise ValueError(f"spf config: train_episodes={episodes} must be a multiple of the {n} "
                         "devices of this multi-process run (each device trains on an equal share)")
    k = max(c for c in range(1, n + 1) if episodes % c == 0)
    print(f"spf: train_episodes={episodes} is not a multiple of the {n} devices; training "
          f"data-parallel over {k} of them (set --config.train_episodes to a multiple of {n} to use "
          "all)", file=sys.stderr)
    return sharding.make_mesh(devices=devices[:k])


class EpisodeBatches:
    """The training loop's batches (a positioned iterator): SPF trains on fresh simulated episodes.

    Batch ``i`` is ``(theta [E, T, d], A [E, T, M, d], y [E, T, M])`` float32, the first fields of
    ``sample_episodes(fold_in(key, i), problem, E)``: a function of ``key`` and ``i`` only, so a
    resumed run sees the same episodes, and any mesh the same values up to float32 rounding (each
    mesh compiles its own program, which may fuse a multiply-add where another does not). The
    episodes are simulated on the devices by one jitted call whose outputs are laid out along
    ``mesh``'s ``data`` axis (E / n per device; nothing passes through the host). The simulator's batched draw is one
    ``rbg`` stream for all E episodes, which XLA may compute whole on each device before keeping
    its slice; that is O(E T M d), small beside the training step's rollout and backward pass,
    which are split.

    Raises:
      ValueError: E is not a multiple of the size of ``mesh``'s ``data`` axis.
    """

    def __init__(self, problem: P.Problem, episodes: int, key: jax.Array, mesh: Mesh):
        n = mesh.shape[sharding.DATA]
        if episodes < 1 or episodes % n:
            raise ValueError(f"spf: {episodes} training episodes per step cannot be split evenly "
                             f"over {n} data-parallel devices")
        out = tuple(sharding.batch_sharding(mesh, nd) for nd in (3, 4, 3))
        self._sample = jax.jit(lambda k: tuple(P.sample_episodes(k, problem, episodes)[:3]),
                               out_shardings=out)
        self._key = key
        self.position = 0

    def __next__(self):
        batch = self._sample(jax.random.fold_in(self._key, self.position))
        self.position += 1
        return batch


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How the SPF network is trained.

    Attributes:
      steps: optimizer steps. episodes: E simulated episodes per step.
      episode_steps: T of a training episode (may differ from the test episodes').
      learning_rate: Adam's rate. grad_clip: global-norm clipping threshold.
      seed: network initialisation and episode-stream seed.
    """

    steps: int = 120
    episodes: int = 6
    episode_steps: int = 100
    learning_rate: float = 3e-3
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if min(self.steps, self.episodes, self.episode_steps) < 1 or not (
                self.learning_rate > 0 and self.grad_clip > 0):
            raise ValueError(f"invalid TrainSettings {self}: need positive steps, episodes, "
                             "episode_steps, learning_rate and grad_clip")


@dataclasses.dataclass
class SPFTraining:
    """Everything ``core.training.train_loop`` takes to train SPF (see :func:`spf_training`)."""

    graphdef: nnx.GraphDef
    step_fn: Callable
    state: Any
    batches: EpisodeBatches
    key: jax.Array


def training_problem(problem: P.Problem, settings: TrainSettings) -> P.Problem:
    """``problem`` with the training episodes' length (``settings.episode_steps``)."""
    return dataclasses.replace(problem, steps=settings.episode_steps)


def build_step(problem: P.Problem, cfg: S.SPFConfig, settings: TrainSettings, mesh: Mesh, *,
               abstract: bool = False) -> core_steps.Step:
    """The SPF train step ``(state, (theta, A, y), key) -> (state, metrics)``: Adam with
    global-norm clipping (``settings``) on :func:`algorithms.spf.spf.make_episode_loss_fn`, with
    its arguments on ``mesh`` (``core.steps.train_step``): the replicated train state of a network
    initialised at ``settings.seed``; ``settings.episodes`` episodes of ``problem`` with
    ``settings.episode_steps`` steps (theta f32 [E, T, d], A [E, T, M, d], y [E, T, M]) split over
    ``data``; the key ``jax.random.key(settings.seed)``. ``aux``: the network's ``nnx.GraphDef``.
    With ``abstract`` nothing is allocated (``make aot``)."""
    graphdef, params = core_steps.split(
        lambda: S.CoordinateMLP(cfg, rngs=nnx.Rngs(settings.seed)), abstract)
    tx = optax.chain(optax.clip_by_global_norm(settings.grad_clip),
                     optax.adam(settings.learning_rate))
    batch = jax.eval_shape(lambda k: tuple(P.sample_episodes(
        k, training_problem(problem, settings), settings.episodes)[:3]), jax.random.key(0))
    return core_steps.train_step(make_train_step(graphdef, tx, S.make_episode_loss_fn(
        problem.kind, cfg)), params, tx, mesh, batch=batch, key=settings.seed, aux=graphdef)


def spf_training(problem: P.Problem, cfg: S.SPFConfig, settings: TrainSettings) -> SPFTraining:
    """The train step, replicated initial state, episode stream and key of an SPF training run
    (:func:`build_step`), data-parallel over :func:`data_parallel_mesh`. Step ``i``'s episodes
    come from ``fold_in(key, i)``, as the step's key does. Pass the fields to ``train_loop``.

    Raises:
      ValueError: see :func:`data_parallel_mesh`.
    """
    mesh = data_parallel_mesh(settings.episodes)
    step = build_step(problem, cfg, settings, mesh)
    state, _, key = step.args
    batches = EpisodeBatches(training_problem(problem, settings), settings.episodes, key, mesh)
    return SPFTraining(step.aux, step.fn, state, batches, key)
