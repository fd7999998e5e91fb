"""A step with its placed arguments, built by one recipe for the run and for ahead-of-time compiles.

A method's recipe (``build_step`` in ``algorithms/<method>/``) takes its config and a mesh and
returns a :class:`Step`. The run builds it with real arrays and jits ``step.fn``; ``make aot``
builds it with abstract values on a pod's compile-only devices (every argument a
``jax.ShapeDtypeStruct`` with its ``NamedSharding``; ``core.aot_steps``), so the compiled program
is the run's by construction. An argument the run feeds anew at each call (a train step's batch)
is a ``ShapeDtypeStruct`` in both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax
from flax import nnx

from core import sharding
from core.training import init_train_state


@dataclasses.dataclass(frozen=True)
class Step:
    """A pure step ``fn`` (not jitted); its ``args``, pytrees of arrays placed on a mesh or of
    ``jax.ShapeDtypeStruct``s with ``NamedSharding``s; the ``donate_argnums`` whose buffers it
    reuses (a train state, a cache); ``aux``: what else the recipe built that its caller needs
    (a model's ``nnx.GraphDef``), or None."""

    fn: Callable
    args: tuple
    donate_argnums: tuple[int, ...] = ()
    aux: Any = None


def is_abstract(tree: Any) -> bool:
    """Whether every leaf of ``tree`` is a ``jax.ShapeDtypeStruct`` (False for an empty tree)."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def build(fn: Callable, *args: Any, abstract: bool) -> Any:
    """``fn(*args)``, or with ``abstract`` its ``ShapeDtypeStruct``s (``jax.eval_shape``)."""
    return jax.eval_shape(fn, *args) if abstract else fn(*args)


def split(make: Callable[[], nnx.Module], abstract: bool) -> tuple[nnx.GraphDef, nnx.State]:
    """``nnx.split(make())``, the module built under ``nnx.eval_shape`` with ``abstract``."""
    return nnx.split(nnx.eval_shape(make) if abstract else make())


def place(tree: Any, shardings: Any, as_abstract: bool | None = None) -> Any:
    """``tree`` on ``shardings`` (a pytree of the same structure, or one sharding for every
    leaf): arrays are copied to their devices (``jax.device_put``); a tree of
    ``ShapeDtypeStruct``s, or any tree when ``as_abstract`` is True, becomes
    ``ShapeDtypeStruct``s with the shardings."""
    if not (is_abstract(tree) if as_abstract is None else as_abstract):
        return jax.device_put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def batch_shardings(batch: Any, mesh: jax.sharding.Mesh) -> Any:
    """Each leaf of ``batch`` split over ``data`` along its first dimension (scalars replicated),
    as ``core.sharding.shard_batch`` and ``replicate`` place a run's batches."""
    return jax.tree.map(lambda x: sharding.batch_sharding(mesh, len(x.shape)) if len(x.shape)
                        else sharding.replicated(mesh), batch)


def train_step(step_fn: Callable, params: Any, tx: optax.GradientTransformation,
               mesh: jax.sharding.Mesh, *, batch: Any, key: int | jax.Array,
               init_state: Callable = init_train_state,
               param_axes: Mapping[tuple[str, ...], tuple[str | None, ...]] | None = None,
               rules: str = "fsdp", logical_sizes: Mapping[str, int] | None = None,
               aux: Any = None) -> Step:
    """A train step ``(state, batch, key) -> (state, metrics)`` with its arguments on ``mesh``:
    the state ``init_state(params, tx)``, placed by the parameter table ``param_axes`` under the
    rule set ``rules`` (``core.sharding``: FSDP over ``data``, tensor parallelism over ``model``;
    ``step_fn`` then wrapped by ``core.sharding.constrain_step``) or, without a table,
    replicated; the batch (``ShapeDtypeStruct``s) split over ``data`` (:func:`batch_shardings`);
    the key (``jax.random.key`` of an int) replicated. The state is donated. Abstract ``params``
    give abstract arguments.

    Raises:
      ValueError: as ``core.sharding.param_shardings``.
    """
    abstract = is_abstract(params)
    state = build(lambda p: init_state(p, tx), params, abstract=abstract)
    rep = sharding.replicated(mesh)
    if param_axes is None:
        state_sh, fn = rep, step_fn
    else:
        p_sh = sharding.param_shardings(params, param_axes, mesh, sharding.rules_named(rules),
                                        logical_sizes=logical_sizes)
        state_sh = sharding.train_state_shardings(state, p_sh, tx, mesh)
        fn = sharding.constrain_step(step_fn, state_sh)
    if isinstance(key, int):
        key = build(lambda: jax.random.key(key), abstract=abstract)
    return Step(fn, (place(state, state_sh), place(batch, batch_shardings(batch, mesh), True),
                     place(key, rep)), (0,), aux)
