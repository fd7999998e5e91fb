"""Ahead-of-time compilation for TPU and GPU targets on a machine that has neither.

XLA can compile for a device it cannot run on when it is given a description of that device: a
TPU topology from libtpu (``jax[tpu]``), or an NVIDIA GPU from a ``GpuTargetConfigProto`` (SM count,
shared memory, compute capability) through the CUDA PJRT plugin. The compiled executable is real:
Mosaic's TPU tiling rules, Triton's shared-memory limit and ptxas all run, which lowering alone
(``jax.export``) never does. :func:`compile_for` compiles a function for one named target on a
single compile-only device and returns the executable with XLA's memory analysis.

Targets (:data:`TARGETS`): ``"tpu-v5e"``, ``"tpu-v6e"`` (libtpu topologies ``v5e:2x2`` and
``v6e:2x2``, the smallest slice libtpu describes; we compile for its first chip), ``"h100"``,
``"h200"`` (``aot_targets/*.txtpb``: XLA's public device descriptions, openxla/xla
``xla/backends/gpu/target_config/specs/``, Apache-2.0).

What must be installed (``make aot-env`` builds ``.venv-aot`` with it, from the ``aot`` extra):

* TPU: ``jax[tpu]`` of the same version as jax (brings libtpu).
* GPU: ``jax-cuda12-plugin`` and ``jax-cuda12-pjrt`` of the same version, ``nvidia-cuda-nvcc-cu12``
  (ptxas) and ``nvidia-cuda-runtime-cu12``; JAX must start with ``JAX_PLATFORMS=cpu`` on a
  machine without a GPU (otherwise the plugin fails to initialise and offers no topology).

Measured on a 2-core CPU with JAX 0.10.2: a device description takes 0.1-0.6 s, a small Pallas
kernel compiles in 0.3-3 s. ``cost_analysis()`` is empty for GPU targets and there is no Triton
autotuning without a device.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import jax

_TARGET_DIR = pathlib.Path(__file__).parent / "aot_targets"


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target.

    Attributes:
      name: the name :func:`compile_for` takes.
      platform: ``"tpu"`` or ``"cuda"``.
      topology: libtpu topology name (TPU) or ``slices x hosts x devices`` (GPU).
      spec: file under ``core/aot_targets/`` with the GPU description (GPU only).
      device_kind: what ``device.device_kind`` reports for it (checked).
    """

    name: str
    platform: str
    topology: str
    spec: str | None
    device_kind: str


TARGETS: dict[str, Target] = {
    t.name: t for t in (
        Target("tpu-v5e", "tpu", "v5e:2x2", None, "TPU v5 lite"),
        Target("tpu-v6e", "tpu", "v6e:2x2", None, "TPU v6 lite"),
        Target("h100", "cuda", "1x1x1", "h100_sxm.txtpb", "NVIDIA H100 80GB HBM3"),
        Target("h200", "cuda", "1x1x1", "h200.txtpb", "NVIDIA H200 141GB HBM3e"),
    )
}

_INSTALL = {
    "tpu": f'pip install "jax[tpu]=={jax.__version__}"',
    "cuda": (f"pip install jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__} "
             "nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12"),
}


class CompileExtrasMissing(RuntimeError):
    """The packages that describe a target are not installed (the message names them)."""


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """A compiled executable for a compile-only device and XLA's memory analysis of it.

    Attributes:
      compiled: the ``jax.stages.Compiled`` object (it cannot run here).
      target: the target's name.
      memory: bytes, from ``memory_analysis()``: ``argument``, ``output``, ``temp``, ``alias`` and
        ``generated_code`` (0 where the backend does not report it: XLA:GPU reports no code size).
      shared_memory: GPU targets with ``shared_memory=True``: bytes of shared memory per launched
        kernel, by kernel name (XLA's thunk sequence); None otherwise.
    """

    compiled: Any
    target: str
    memory: dict[str, int]
    shared_memory: dict[str, int] | None = None


def target_names() -> tuple[str, ...]:
    """The valid target names, sorted."""
    return tuple(sorted(TARGETS))


def _target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown compile target {name!r}; expected one of {list(target_names())}")
    return TARGETS[name]


def extras_available(name: str) -> bool:
    """Whether the packages needed to compile for target ``name`` are importable (ValueError for
    an unknown name). Does not start any backend."""
    import importlib.util

    t = _target(name)
    module = "libtpu" if t.platform == "tpu" else "jax_plugins.xla_cuda12"
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _ensure_ptxas_on_path() -> None:
    """Mosaic GPU calls ``ptxas`` from PATH; the nvcc wheel ships one that is not on it."""
    if shutil.which("ptxas"):
        return
    try:
        import nvidia.cuda_nvcc as nvcc
    except ImportError:
        return
    for root in getattr(nvcc, "__path__", []):
        bin_dir = pathlib.Path(root) / "bin"
        if (bin_dir / "ptxas").exists():
            os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
            return


@functools.cache
def compile_only_device(name: str) -> jax.Device:
    """A compile-only device of target ``name`` (cached per process).

    Raises:
      ValueError: unknown target name (the message lists the valid ones).
      CompileExtrasMissing: the target's packages are not installed, or the CUDA plugin is
        installed but JAX did not start with ``JAX_PLATFORMS=cpu`` on a machine without a GPU.
    """
    from jax.experimental import topologies

    t = _target(name)
    if not extras_available(name):
        raise CompileExtrasMissing(f"compiling for {name!r} needs {_INSTALL[t.platform]} "
                                   "(or run `make aot-env` and use .venv-aot)")
    if t.platform == "tpu":
        # libtpu takes a machine-wide lock file for the TPU chips; compile-only devices use no chip,
        # so concurrent compiling processes (pytest workers, two test runs) may all load it.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        topo = topologies.get_topology_desc(topology_name=t.topology, platform="tpu")
    else:
        _ensure_ptxas_on_path()
        spec = (_TARGET_DIR / t.spec).read_text()
        try:
            topo = topologies.get_topology_desc(platform="cuda", target_config=spec,
                                                topology=t.topology)
        except NotImplementedError as e:
            raise CompileExtrasMissing(
                f"compiling for {name!r}: the CUDA plugin offers no topology ({e}); start JAX with "
                "JAX_PLATFORMS=cpu on a machine without a GPU") from None
    device = topo.devices[0]
    if device.device_kind != t.device_kind:
        raise RuntimeError(f"target {name!r} gave a {device.device_kind!r} device; expected "
                           f"{t.device_kind!r}")
    return device


def _on_device(tree: Any, sharding: jax.sharding.Sharding) -> Any:
    def leaf(x):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"compile_for: every argument leaf must be a ShapeDtypeStruct or an "
                             f"array; got {type(x).__name__}")
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return jax.tree.map(leaf, tree)


def _thunk_shared_memory(dump_dir: str) -> dict[str, int]:
    """{kernel name: shared memory bytes} from XLA:GPU's dumped thunk sequence."""
    import re

    out: dict[str, int] = {}
    files = sorted(pathlib.Path(dump_dir).glob("*thunk_sequence.txt"))
    for line in (files[-1].read_text().splitlines() if files else []):
        m = re.search(r"\]\s+(\S+)\s+grid:.*shared_memory:\s*(\d+)\s*bytes", line)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)))
    return out


def compile_for(fn: Callable, args: tuple, target: str, *, kwargs: dict | None = None,
                shared_memory: bool = False) -> CompileResult:
    """Compiles ``fn(*args, **kwargs)`` for one device of ``target`` without running it.

    Args:
      fn: a function of arrays (jitted or not; a jitted one keeps its static arguments, which
        then go in ``kwargs``).
      args: a tuple of pytrees of ``jax.ShapeDtypeStruct`` (or arrays: only shape and dtype are
        used); every leaf is placed on a single compile-only device.
      target: one of :func:`target_names`.
      kwargs: keyword arguments passed through unchanged (static values).
      shared_memory: GPU targets only: also report each kernel's shared memory (XLA dumps its
        thunk sequence to a temporary directory, which makes the compile slower).

    Returns:
      :class:`CompileResult`.

    Raises:
      ValueError: unknown target or a leaf without shape and dtype.
      CompileExtrasMissing: see :func:`compile_only_device`.
      jax.errors.JaxRuntimeError: the compiler rejected the program (e.g. shared memory or VMEM
        exceeded, a block shape Mosaic cannot tile); the message is XLA's.
    """
    if not isinstance(args, tuple):
        raise ValueError(f"compile_for: args must be a tuple of argument pytrees; got "
                         f"{type(args).__name__}")
    device = compile_only_device(target)
    sharding = jax.sharding.SingleDeviceSharding(device)
    specs = _on_device(args, sharding)
    kwargs = kwargs or {}
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = jitted.lower(*specs, **kwargs)
    smem = None
    if shared_memory and TARGETS[target].platform == "cuda":
        import tempfile

        with tempfile.TemporaryDirectory() as dump:
            compiled = lowered.compile(compiler_options={"xla_dump_to": dump})
            smem = _thunk_shared_memory(dump)
    else:
        compiled = lowered.compile()
    stats = compiled.memory_analysis()
    memory = {key: int(getattr(stats, f"{key}_size_in_bytes", 0) or 0)
              for key in ("argument", "output", "temp", "alias", "generated_code")}
    return CompileResult(compiled, target, memory, smem)
