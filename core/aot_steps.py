"""Compiling whole sharded steps for TPU and GPU pods on a machine that has neither.

:mod:`core.aot` compiles one kernel for one compile-only device; this module compiles a full step
(train step, decode step, fit) for a named pod topology (16 to 256 chips), from abstract arguments
(``jax.ShapeDtypeStruct`` with ``NamedSharding``s on the pod's mesh: nothing is allocated), and
reports what XLA's compiled program needs per device and a roofline estimate of its step time.

Topologies (:data:`POD_TOPOLOGIES`): ``"v5e:4x4"``, ``"v5e:8x8"``, ``"v5e:16x16"``, ``"v6e:4x4"``,
``"v6e:8x8"``, ``"v6e:16x16"`` (libtpu's topology descriptions; ``jax[tpu]``), and
``"h100:1x2x8"``, ``"h100:1x4x8"``, ``"h100:1x8x8"``, ``"h200:..."`` the same (slices x hosts x
GPUs per host, from ``core/aot_targets/*.txtpb`` through the CUDA plugin; JAX must start with
``JAX_PLATFORMS=cpu``). A step's mesh is built by ``core.sharding.make_mesh(...,
devices=pod_devices(name))``, so the compiled program uses the project's own sharding rules.

Roofline (:func:`roofline`): ``step time = max(FLOPs / peak FLOP/s, bytes / HBM bandwidth)`` per
chip; ``MFU = model FLOPs / (step time * peak * chips)``. XLA's ``cost_analysis`` counts the body
of a ``while`` loop (``lax.scan``, ``fori_loop``) once, so the FLOPs used are the larger of XLA's
count and the analytic model FLOPs per chip, and XLA's byte count is a lower bound whenever the
program loops (the table says which was used). XLA:GPU reports no cost analysis: GPU rows give
memory only.

Each experiment exports its own ``paper`` steps (``paper_steps()`` in ``experiments/<name>.py``,
mapping a step name to a builder ``devices -> StepSpec`` and a description): a builder calls the
recipe the run calls (``build_step`` in ``algorithms/<method>/``, returning a
``core.steps.Step``) with the ``paper`` config, abstract values and a mesh over the pod's
devices, and describes the row (:meth:`StepSpec.of`); :class:`StepSpec` is here, so that
experiments need not import the orchestrator (``experiments.aot``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from core import aot, steps, timing

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published per-chip peaks.

    Attributes:
      name: short name (``"tpu-v5e"``, ...; the :mod:`core.aot` target of the same chip).
      peak_flops: dense bf16 FLOP/s per chip.
      hbm_bandwidth: HBM bytes/s per chip.
      hbm_bytes: HBM capacity per chip, bytes.
      usable_bytes: what a step may use of it, bytes (see :data:`CHIPS`).
    """

    name: str
    peak_flops: float
    hbm_bandwidth: float
    hbm_bytes: int
    usable_bytes: float


# Vendor figures (dense bf16, no sparsity):
#   TPU v5e: 197 TFLOP/s, 819 GB/s, 16 GiB HBM2 -- https://cloud.google.com/tpu/docs/v5e
#   TPU v6e (Trillium): 918 TFLOP/s, 1640 GB/s, 32 GiB -- https://cloud.google.com/tpu/docs/v6e
#   H100 SXM: 989 TFLOP/s (the 1979 of the datasheet is with 2:4 sparsity), 3.35 TB/s, 80 GB --
#     https://www.nvidia.com/en-us/data-center/h100/
#   H200: 989 TFLOP/s, 4.8 TB/s, 141 GB -- https://www.nvidia.com/en-us/data-center/h200/
# Usable HBM: compile-only devices report no memory statistics ("MemoryStats is only supported
# for addressable PjRt devices"). TPU: what libtpu 0.0.42 says is available when a program does not
# fit ("exceeds available HBM (15.75G)" on v5e, "(31.25G)" on v6e; it refuses such a program at
# compile time). GPU: 75% of the chip, JAX's default preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION;
# raise it to use more); XLA:GPU compiles a program of any size.
CHIPS: dict[str, Chip] = {
    c.name: c for c in (
        Chip("tpu-v5e", 197e12, 819e9, 16 * GIB, 15.75 * GIB),
        Chip("tpu-v6e", 918e12, 1640e9, 32 * GIB, 31.25 * GIB),
        Chip("h100", 989e12, 3.35e12, 80 * GIB, 0.75 * 80 * GIB),
        Chip("h200", 989e12, 4.8e12, 141 * GIB, 0.75 * 141 * GIB),
    )
}


@dataclasses.dataclass(frozen=True)
class PodTopology:
    """A pod-sized compile target.

    Attributes:
      name: what :func:`pod_devices` takes, e.g. ``"v5e:4x4"`` or ``"h100:1x2x8"``.
      chip: key of :data:`CHIPS` (and of ``core.aot.TARGETS``).
      topology: libtpu topology name (TPU) or ``slices x hosts x GPUs`` (GPU).
      num_devices: chips in the topology.
    """

    name: str
    chip: str
    topology: str
    num_devices: int


def _tpu(gen: str, shape: str) -> PodTopology:
    a, b = (int(s) for s in shape.split("x"))
    return PodTopology(f"{gen}:{shape}", f"tpu-{gen}", f"{gen}:{shape}", a * b)


def _gpu(chip: str, shape: str) -> PodTopology:
    s, h, g = (int(x) for x in shape.split("x"))
    return PodTopology(f"{chip}:{shape}", chip, shape, s * h * g)


POD_TOPOLOGIES: dict[str, PodTopology] = {
    t.name: t for t in (
        *(_tpu(g, s) for g in ("v5e", "v6e") for s in ("4x4", "8x8", "16x16")),
        *(_gpu(c, s) for c in ("h100", "h200") for s in ("1x2x8", "1x4x8", "1x8x8")),
    )
}


def topology_names() -> tuple[str, ...]:
    """The valid pod topology names, sorted."""
    return tuple(sorted(POD_TOPOLOGIES))


def pod_topology(name: str) -> PodTopology:
    """The :class:`PodTopology` called ``name``.

    Raises:
      ValueError: an unknown name (the message lists the valid ones).
    """
    if name not in POD_TOPOLOGIES:
        raise ValueError(f"unknown pod topology {name!r}; expected one of {list(topology_names())}")
    return POD_TOPOLOGIES[name]


@functools.cache
def pod_devices(name: str) -> tuple[jax.Device, ...]:
    """The compile-only devices of pod topology ``name`` (cached per process).

    Raises:
      ValueError: unknown name.
      core.aot.CompileExtrasMissing: the chip's packages are not installed (one line naming the
        ``pip install``), or the CUDA plugin offers no topology because JAX did not start with
        ``JAX_PLATFORMS=cpu``.
    """
    t = pod_topology(name)
    target = aot.target(t.chip)
    topo = aot.topology_description(t.chip, t.topology, what=repr(name))
    devices = tuple(topo.devices)
    if len(devices) != t.num_devices or devices[0].device_kind != target.device_kind:
        raise RuntimeError(f"topology {name!r} gave {len(devices)} x {devices[0].device_kind!r}; "
                           f"expected {t.num_devices} x {target.device_kind!r}")
    return devices


@dataclasses.dataclass(frozen=True)
class StepCompile:
    """What XLA reports for one compiled step, per device.

    Attributes:
      memory: bytes per device from ``memory_analysis()``: ``argument``, ``output``, ``alias``
        (outputs written into donated arguments), ``temp``, ``generated_code``, ``peak`` (0 where
        the backend does not report it).
      flops: XLA's FLOP count per device (None on GPU: no cost analysis); loop bodies counted once.
      bytes_accessed: XLA's HBM bytes per device (None on GPU); loop bodies counted once.
      seconds: wall time of lowering plus compiling (both compiles when a fallback was needed).
      fallback: the ``core.aot.CompileFallback`` the compile needed (None: XLA's defaults).
      hlo_text: the compiled program's text (``compiled.as_text()``) on TPU, whose instructions
        carry XLA's ``estimated_cycles`` (``core.tpu_schedule``); None on other platforms.
    """

    memory: dict[str, int]
    flops: float | None
    bytes_accessed: float | None
    seconds: float
    fallback: aot.CompileFallback | None = None
    hlo_text: str | None = None

    @property
    def needed_bytes(self) -> int:
        """Bytes a device holds at once: arguments + outputs not aliased onto donated arguments
        + temporaries + code (XLA's buffer assignment; ``memory["peak"]`` is reported beside it
        where the backend gives one)."""
        m = self.memory
        return m["argument"] + m["output"] - m["alias"] + m["temp"] + m["generated_code"]


def compile_step(fn: Callable, args: tuple, *, donate_argnums: tuple[int, ...] = (),
                 static_argnums: tuple[int, ...] = ()) -> StepCompile:
    """Compiles ``fn(*args)`` for the devices its arguments' shardings name, without running it.

    Args:
      fn: a function of pytrees of arrays (not yet jitted).
      args: pytrees of ``jax.ShapeDtypeStruct`` whose ``sharding`` is a ``NamedSharding`` on a mesh
        of compile-only devices (:func:`pod_devices`).
      donate_argnums: arguments whose buffers the step may reuse (the train state).
      static_argnums: arguments passed as static values.

    Returns:
      :class:`StepCompile`. A program the compiler refuses with a known symptom of compiling
      without a device is compiled again with that target's fallback options
      (``core.aot.compile_lowered``); ``fallback`` says which.

    Raises:
      ValueError: ``args`` is not a tuple, or a leaf has no sharding.
      jax.errors.JaxRuntimeError: XLA rejected the program (message is XLA's).
    """
    if not isinstance(args, tuple):
        raise ValueError(f"compile_step: args must be a tuple of argument pytrees; got "
                         f"{type(args).__name__}")
    for i, a in enumerate(args):
        if i in static_argnums:
            continue
        for leaf in jax.tree.leaves(a):
            if getattr(leaf, "sharding", None) is None:
                raise ValueError(f"compile_step: argument {i} has a leaf of shape "
                                 f"{getattr(leaf, 'shape', None)} without a sharding; expected "
                                 "ShapeDtypeStructs with NamedShardings on the pod's mesh")
    with timing.Stopwatch() as clock:
        lowered = jax.jit(fn, donate_argnums=donate_argnums,
                          static_argnums=static_argnums).lower(*args)
        platform = _platform(args, static_argnums)
        compiled, fallback = aot.compile_lowered(lowered, platform)
    seconds = clock.seconds
    memory = aot.memory_bytes(compiled)
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 (a backend without cost analysis)
        cost = None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    flops = float(cost["flops"]) if cost and "flops" in cost else None
    nbytes = float(cost["bytes accessed"]) if cost and "bytes accessed" in cost else None
    return StepCompile(memory, flops, nbytes, seconds, fallback,
                       compiled.as_text() if platform == "tpu" else None)


def _platform(args: tuple, static_argnums: tuple[int, ...]) -> str:
    """``"tpu"``, ``"cuda"`` or ``"cpu"``: the platform of the first sharded argument's devices."""
    for i, a in enumerate(args):
        for leaf in ([] if i in static_argnums else jax.tree.leaves(a)):
            platform = next(iter(leaf.sharding.device_set)).platform
            return "cuda" if platform == "gpu" else platform
    return "cpu"


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A roofline estimate of one step on a pod.

    Attributes:
      step_seconds: ``max(compute_seconds, memory_seconds)``.
      compute_seconds: FLOPs per chip / peak FLOP/s.
      memory_seconds: bytes per chip / HBM bandwidth.
      mfu: model FLOPs / (step seconds * peak * chips), in [0, 1] when the FLOPs per chip are at
        least the model's share.
      bound: ``"compute"`` or ``"memory"``.
    """

    step_seconds: float
    compute_seconds: float
    memory_seconds: float
    mfu: float
    bound: str


def roofline(chip: str, *, flops_per_chip: float, bytes_per_chip: float, model_flops: float,
             num_chips: int) -> Roofline:
    """Roofline step time and model-FLOPs utilisation.

    Args:
      chip: key of :data:`CHIPS`.
      flops_per_chip: FLOPs one chip executes per step (>= 0).
      bytes_per_chip: HBM bytes one chip moves per step (>= 0).
      model_flops: the step's useful FLOPs over the whole pod (e.g. ``6 N T`` for training:
        ``3 * forward_flops_per_token * tokens``), >= 0.
      num_chips: chips in the pod (>= 1).

    Returns:
      :class:`Roofline`.

    Raises:
      ValueError: unknown chip, a negative count, ``num_chips < 1``, or both per-chip counts zero.
    """
    if chip not in CHIPS:
        raise ValueError(f"roofline: unknown chip {chip!r}; expected one of {sorted(CHIPS)}")
    for label, v in (("flops_per_chip", flops_per_chip), ("bytes_per_chip", bytes_per_chip),
                     ("model_flops", model_flops)):
        if not v >= 0:
            raise ValueError(f"roofline: {label}={v} must be a non-negative number")
    if num_chips < 1:
        raise ValueError(f"roofline: num_chips={num_chips} must be >= 1")
    if flops_per_chip == 0 and bytes_per_chip == 0:
        raise ValueError("roofline: flops_per_chip and bytes_per_chip are both 0")
    c = CHIPS[chip]
    compute = flops_per_chip / c.peak_flops
    memory = bytes_per_chip / c.hbm_bandwidth
    step = max(compute, memory)
    return Roofline(step, compute, memory, model_flops / (step * c.peak_flops * num_chips),
                    "compute" if compute >= memory else "memory")


# ----------------------------------------------------------------------------------------------
# Steps as the experiments export them (``paper_steps()``; compiled by ``experiments.aot``)


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """A step ready to compile for a pod (:func:`compile_step`).

    Attributes:
      fn: the step function (not jitted): the function the run itself jits.
      args: pytrees of ``ShapeDtypeStruct`` with ``NamedSharding``s on the pod's mesh.
      donate_argnums: donated arguments (the train state).
      model_flops: useful FLOPs of one call over the whole pod (``3 F_fwd tokens`` for training);
        None where there is no analytic count (then no MFU).
      params: parameter count.
      shape: one line describing the sizes (batch, sequence, model).
      x64: the step computes in float64 (it is compiled under ``jax.enable_x64``).
      fallback: (what differs from the experiment's own step, why) when the builder had to
        change the step for this target; None otherwise. Shown in ``AOT.md``.
      layer_loop: the layers run in one loop (``scan_layers``): XLA's cost analysis counts one
        block, so the row gets no roofline.
      dynamic_trips: {Pallas kernel name: iterations} of kernel loops whose bound is a runtime
        value, as the kernel's cost estimate assumes (for the static step time,
        ``core.tpu_schedule.static_step``); None if there are none.
    """

    fn: Callable
    args: tuple
    donate_argnums: tuple[int, ...]
    model_flops: float | None
    params: int
    shape: str
    x64: bool = False
    fallback: tuple[str, str] | None = None
    layer_loop: bool = False
    dynamic_trips: dict[str, int] | None = None

    @classmethod
    def of(cls, step: steps.Step, **row: Any) -> StepSpec:
        """The row of an abstract ``core.steps.Step``, described by ``row`` (the other fields)."""
        return cls(step.fn, step.args, step.donate_argnums, **row)


# What an experiment's ``paper_steps()`` returns: step name -> (builder(devices) -> StepSpec,
# description), in the order of the AOT table.
PaperSteps = dict[str, tuple[Callable[[Any], StepSpec], str]]
