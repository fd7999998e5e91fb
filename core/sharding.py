"""Device mesh and sharding rules.

One rules table maps logical array axes to mesh axes. The mesh has a ``data`` axis (batch
parallelism; the default uses every device) and a ``model`` axis (tensor parallelism; size 1 by
default). Multi-host runs call :func:`initialize_distributed` before anything touches devices;
``jax.devices()`` then lists every host's devices and the same code shards over all of them.

Logical axes: ``batch`` (examples), ``embed`` (model width), ``heads``/``kv_heads``, ``mlp``
(hidden width), ``vocab``, ``seq`` (sequence), ``layers`` (stacked layers), ``norm`` (norm scales),
``cond`` (conditioning width). Unlisted axes are replicated.

Parameters are placed by :data:`PARAM_RULES`, as in MaxText: fully-sharded data parallelism (FSDP:
parameters, gradients and optimizer state sharded along the model width over ``data``, gathered
per layer by the compiler) and tensor parallelism (Megatron-style: attention heads, MLP hidden width
and vocabulary over ``model``). A model declares the logical axes of its parameters in one table
from parameter-path suffixes to axis names (e.g. ``models.transformer.PARAM_AXES``);
:func:`param_shardings` turns it into ``NamedSharding``s and :func:`train_state_shardings` extends
them to the optimizer state. A dimension whose mesh axis does not divide it is replicated (e.g. a
vocabulary of 259 bytes); the model's own check rejects a ``model`` axis that does not divide its
heads or MLP width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA, MODEL = "data", "model"

# logical axis -> mesh axis (None = replicated)
RULES: dict[str, str | None] = {
    "batch": DATA,
    "seq": None,
    "embed": None,
    "heads": MODEL,
    "kv_heads": MODEL,
    "mlp": MODEL,
    "vocab": MODEL,
}


# Parameters: logical axis -> mesh axis. FSDP over ``data`` (the model width), tensor parallelism
# over ``model``.
PARAM_RULES: dict[str, str | None] = {
    "embed": DATA,
    "heads": MODEL,
    "kv_heads": MODEL,
    "mlp": MODEL,
    "vocab": MODEL,
    "layers": None,
    "norm": None,
    "cond": None,
}
# Data parallelism only: every parameter replicated.
REPLICATED_RULES: dict[str, str | None] = {name: None for name in PARAM_RULES}
# The rule sets a config names (``param_sharding`` fields).
RULE_SETS: dict[str, dict[str, str | None]] = {"fsdp": PARAM_RULES, "replicated": REPLICATED_RULES}


def rules_named(name: str) -> dict[str, str | None]:
    """The parameter rule set called ``name`` (``"fsdp"``: FSDP + tensor parallelism;
    ``"replicated"``: data parallelism only). Raises ValueError for another name."""
    if name not in RULE_SETS:
        raise ValueError(f"param_sharding={name!r} is not one of {sorted(RULE_SETS)}")
    return RULE_SETS[name]


def check_rules(rules: Mapping[str, str | None], mesh: Mesh | None = None) -> None:
    """Raises ValueError when a rules table maps a logical axis to a mesh axis that does not exist
    (``data``, ``model``, or ``mesh``'s own axis names)."""
    known = set(mesh.axis_names) if mesh is not None else {DATA, MODEL}
    for logical, axis in rules.items():
        if axis is not None and axis not in known:
            raise ValueError(f"sharding rules: logical axis {logical!r} maps to mesh axis {axis!r}, "
                             f"which is not one of {sorted(known)}")


def initialize_distributed(enabled: bool) -> None:
    """Calls ``jax.distributed.initialize()`` (multi-host; coordinator from the environment, e.g. on
    Cloud TPU or SLURM) when ``enabled``; a no-op otherwise. Must run before any device is used."""
    if enabled:
        jax.distributed.initialize()


def make_mesh(model_parallelism: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 2-D ``Mesh`` with axes (``data``, ``model``) over all devices.

    Args:
      model_parallelism: size of the ``model`` axis; must divide the number of devices.
      devices: defaults to ``jax.devices()`` (all hosts).

    Raises:
      ValueError: ``model_parallelism`` does not divide the device count.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if model_parallelism < 1 or n % model_parallelism:
        raise ValueError(f"model_parallelism={model_parallelism} must divide the {n} devices")
    grid = np.asarray(devices, dtype=object).reshape(n // model_parallelism, model_parallelism)
    return Mesh(grid, (DATA, MODEL))


def logical_to_spec(logical_axes: Sequence[str | None], rules: dict[str, str | None] = RULES
                    ) -> PartitionSpec:
    """``PartitionSpec`` for an array whose dimensions have the given logical names."""
    return PartitionSpec(*(rules.get(a) if a is not None else None for a in logical_axes))


def constrain(x: jax.Array, logical_axes: Sequence[str | None],
              rules: Mapping[str, str | None] = RULES) -> jax.Array:
    """Pins the sharding of activation ``x`` (dimension ``i`` named ``logical_axes[i]``) on the
    mesh in context (``jax.sharding.use_abstract_mesh``, as :func:`constrain_step` traces a step)
    by the activation ``rules``.

    The identity without a multi-device mesh in context; a mesh axis missing from the mesh or not
    dividing its dimension leaves that dimension to the compiler.

    Raises:
      ValueError: ``logical_axes`` does not name every dimension of ``x``.
    """
    if len(logical_axes) != x.ndim:
        raise ValueError(f"constrain: {len(logical_axes)} logical axes {tuple(logical_axes)} for "
                         f"an array of rank {x.ndim}")
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return x
    spec = [axis if axis in mesh.axis_names and dim % mesh.shape[axis] == 0 else None
            for dim, axis in zip(x.shape, logical_to_spec(logical_axes, dict(rules)))]
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Sharding of a batch-leading array of rank ``ndim``: dimension 0 on ``data``."""
    return NamedSharding(mesh, PartitionSpec(DATA, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())


def shard_batch(batch, mesh: Mesh):
    """Places a pytree of arrays with leading batch dimension on ``mesh``, split over ``data``
    (host arrays are copied to the devices; JAX arrays move between devices, not through the host).

    Raises:
      ValueError: a leaf's batch size is not divisible by the ``data`` axis size.
    """
    n_data = mesh.shape[DATA]

    def put(x):
        if not isinstance(x, jax.Array):
            x = np.asarray(x)
        if x.ndim == 0 or x.shape[0] % n_data:
            raise ValueError(
                f"batch leaf of shape {x.shape} cannot be split over {n_data} data-parallel devices"
            )
        return jax.device_put(x, batch_sharding(mesh, x.ndim))

    return jax.tree.map(put, batch)


def replicate(tree, mesh: Mesh):
    """Places every leaf of ``tree`` fully replicated on ``mesh``."""
    return jax.device_put(tree, replicated(mesh))


# ----------------------------------------------------------------------------------------------
# Parameter and train-state shardings


def _path_names(path) -> tuple[str, ...]:
    """Names of a pytree key path (dict keys, attributes, indices), without NNX's trailing
    ``value`` attribute."""
    names = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                names.append(str(getattr(k, attr)))
                break
    if names and names[-1] == "value":
        names.pop()
    return tuple(names)


def param_logical_axes(params: Any, table: Mapping[tuple[str, ...], tuple[str | None, ...]]) -> Any:
    """The logical axis names of every parameter, from a table of parameter-path suffixes.

    Args:
      params: a parameter pytree (e.g. an ``nnx.State``); leaves are arrays or
        ``ShapeDtypeStruct``s.
      table: ``{path suffix: logical axes}``, e.g. ``{("q_proj", "kernel"): ("embed", "heads")}``.
        The longest matching suffix wins. A leaf with one more dimension than its entry (stacked
        layers, ``scan_layers``) gets a leading ``layers`` axis.

    Returns:
      a pytree of the same structure whose leaves are tuples of logical names (one per dimension).

    Raises:
      ValueError: a parameter matches no entry, or its rank fits neither the entry nor the entry
        plus a layer axis (naming the parameter path).
    """
    suffixes = sorted(table, key=len, reverse=True)

    def axes(path, leaf):
        names = _path_names(path)
        for suffix in suffixes:
            if names[-len(suffix):] == tuple(suffix):
                logical = tuple(table[suffix])
                ndim = len(leaf.shape)
                if ndim == len(logical) + 1:
                    return ("layers", *logical)
                if ndim == len(logical):
                    return logical
                raise ValueError(f"parameter {'/'.join(names)} has shape {tuple(leaf.shape)} but "
                                 f"the sharding table gives {len(logical)} axes {logical}")
        raise ValueError(f"parameter {'/'.join(names)} has no entry in the sharding table "
                         f"(known suffixes: {sorted('/'.join(s) for s in table)})")

    return jax.tree_util.tree_map_with_path(axes, params)


def spec_for(shape: Sequence[int], logical: Sequence[str | None], mesh: Mesh,
             rules: Mapping[str, str | None] = PARAM_RULES,
             logical_sizes: Mapping[str, int] | None = None) -> PartitionSpec:
    """``PartitionSpec`` of an array of ``shape`` with the given logical axes.

    Each dimension goes on its rule's mesh axis when that axis's size divides both the dimension and,
    for axes listed in ``logical_sizes`` (e.g. ``{"kv_heads": 2}`` for a fused [E, K * D] kernel),
    the logical count, so that a split never cuts through a head; otherwise it is replicated. A mesh
    axis is used at most once per array (the first dimension that asks for it)."""
    sizes = logical_sizes or {}
    used, spec = set(), []
    for size, name in zip(shape, logical, strict=True):
        axis = rules.get(name) if name is not None else None
        n = mesh.shape[axis] if axis is not None else 1
        if (axis is not None and axis not in used and size % n == 0
                and sizes.get(name, n) % n == 0):
            spec.append(axis)
            used.add(axis)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def param_shardings(params: Any, table: Mapping[tuple[str, ...], tuple[str | None, ...]],
                    mesh: Mesh, rules: Mapping[str, str | None] = PARAM_RULES,
                    logical_sizes: Mapping[str, int] | None = None) -> Any:
    """``NamedSharding`` of every parameter (same pytree structure as ``params``).

    Args:
      params: parameter pytree (arrays or ``ShapeDtypeStruct``s).
      table: the model's path-suffix -> logical-axes table (see :func:`param_logical_axes`).
      mesh: the (``data``, ``model``) mesh.
      rules: logical -> mesh axis; :data:`PARAM_RULES` (FSDP + tensor parallelism) or
        :data:`REPLICATED_RULES` (data parallelism only).
      logical_sizes: counts of fused logical axes (``{"heads": H, "kv_heads": K}``): a split must
        divide them too (see :func:`spec_for`).

    Raises:
      ValueError: as :func:`param_logical_axes`; a rule naming an axis the mesh lacks.
    """
    check_rules(rules, mesh)
    logical = param_logical_axes(params, table)
    return jax.tree.map(
        lambda x, names: NamedSharding(mesh, spec_for(x.shape, names, mesh, rules, logical_sizes)),
        params, logical, is_leaf=lambda x: isinstance(x, tuple))


def train_state_shardings(state: Mapping[str, Any], params_sharding: Any,
                          tx: optax.GradientTransformation, mesh: Mesh) -> dict[str, Any]:
    """Shardings of a ``{"params", "opt_state", "step", ...}`` train state: the parameters' own,
    every parameter-shaped optimizer leaf (Adam moments, EMA copies under ``"ema"``) like its
    parameter, everything else (counters, the step) replicated."""
    rep = replicated(mesh)
    out = {}
    for name, value in state.items():
        if name in ("params", "ema"):
            out[name] = params_sharding
        elif name == "opt_state":
            out[name] = optax.tree_map_params(tx, lambda _, s: s, value, params_sharding,
                                              transform_non_params=lambda _: rep)
        else:
            out[name] = jax.tree.map(lambda _: rep, value)
    return out


def constrain_step(step: Callable, state_sharding: Any) -> Callable:
    """Wraps a train step ``(state, batch, key) -> (state, metrics)`` so that the new state keeps
    ``state_sharding`` (a sharding constraint inside jit: the compiler then reduce-scatters
    gradients onto the FSDP shards and the donated state buffers are reused in place).

    The step is traced under the mesh of ``state_sharding`` (``jax.sharding.use_abstract_mesh``),
    so that code which must be partitioned by hand sees it: a Pallas kernel, which XLA cannot split
    across devices, runs inside ``shard_map`` over that mesh (``models.attention``'s splash path).
    """
    meshes = {s.mesh for s in jax.tree.leaves(state_sharding) if isinstance(s, NamedSharding)}
    if len(meshes) > 1:
        raise ValueError(f"constrain_step: state_sharding spans {len(meshes)} meshes; expected one")
    mesh = meshes.pop() if meshes else None

    def sharded(state, batch, key):
        if mesh is None:
            new_state, metrics = step(state, batch, key)
        else:
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                new_state, metrics = step(state, batch, key)
        return jax.lax.with_sharding_constraint(new_state, state_sharding), metrics

    return sharded


def bytes_per_device(tree: Any) -> int:
    """Bytes of ``tree``'s arrays held by one device (the largest addressable shard per leaf)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shard = x.sharding.shard_shape(x.shape)
        total += int(np.prod(shard)) * x.dtype.itemsize
    return total
