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

Compile options per target (:data:`FALLBACKS`, applied by :func:`compile_lowered`): a program is
compiled with XLA's defaults first; when the compiler refuses it with a known symptom of compiling
without a device, it is compiled again with the options that avoid it and the result says so. The
one known today: XLA:GPU rewrites float32 dots into Triton GEMM fusions whose tile sizes it picks by
autotuning on the device; without one it can find no tiling for some dots ("Couldn't find output
tile sizes that satisfy ...", seen in the forecasting and GRPO steps on H100/H200), and with
``xla_gpu_enable_triton_gemm=False`` those dots go to cuBLAS(Lt) instead. On a real GPU the
autotuner picks tiles and the defaults stand.

Public helpers shared with :mod:`core.aot_steps`: :data:`TARGET_DIR`, :func:`install_command`,
:func:`require_extras`, :func:`ensure_ptxas_on_path`, :func:`topology_description`,
:func:`compile_lowered` and :func:`memory_bytes`; :func:`bytes_read_outside_custom_calls` counts what a
compiled program reads around its kernels (for XLA:GPU, which gives no cost analysis).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
import re
import shutil
from collections.abc import Callable
from typing import Any

import jax

# The GPU device descriptions (``GpuTargetConfigProto`` text), one file per GPU target.
TARGET_DIR = pathlib.Path(__file__).parent / "aot_targets"


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


def install_command(platform: str) -> str:
    """The ``pip install`` line that brings compile-only devices of ``platform`` (``"tpu"`` or
    ``"cuda"``), pinned to the running jax version. Raises ValueError for another platform."""
    if platform not in _INSTALL:
        raise ValueError(f"install_command: platform {platform!r} is not one of {sorted(_INSTALL)}")
    return _INSTALL[platform]


@dataclasses.dataclass(frozen=True)
class CompileFallback:
    """Compile options to retry with when XLA refuses a program with a known symptom.

    Attributes:
      platform: ``"tpu"`` or ``"cuda"``: the targets it applies to.
      symptom: a substring of the compiler's error message.
      options: XLA debug options for ``Lowered.compile(compiler_options=...)``.
      reason: one sentence for the report: why the defaults fail and what the options change.
    """

    platform: str
    symptom: str
    options: dict[str, Any]
    reason: str


FALLBACKS: tuple[CompileFallback, ...] = (
    CompileFallback(
        "cuda", "Couldn't find output tile sizes", {"xla_gpu_enable_triton_gemm": False},
        "XLA:GPU picks Triton GEMM tiles by autotuning on the device and found none for a float32 "
        "dot without one; compiled with xla_gpu_enable_triton_gemm=False (the dots go to cuBLAS)"),
    CompileFallback(
        "cuda", "cudaErrorInvalidDevice", {"xla_gpu_enable_cub_radix_sort": False},
        "XLA:GPU rewrites a large sort (here jax.random.permutation of the problem pool) into a CUB "
        "radix sort and sizes its scratch through the CUDA runtime, which has no device here; "
        "compiled with xla_gpu_enable_cub_radix_sort=False (XLA's own sort kernel)"),
)


def fallback_for(platform: str, message: str) -> CompileFallback | None:
    """The :data:`FALLBACKS` entry of ``platform`` whose symptom is in ``message``, or None."""
    return next((f for f in FALLBACKS if f.platform == platform and f.symptom in message), None)


def compile_lowered(lowered: Any, platform: str,
                    compiler_options: dict[str, Any] | None = None) -> tuple[Any, CompileFallback | None]:
    """Compiles ``lowered`` (a ``jax.stages.Lowered``) for a target of ``platform``.

    With XLA's defaults (or ``compiler_options``) first; each time the compiler refuses the
    program with the symptom of a :data:`FALLBACKS` entry of that platform whose options are not in
    force yet, once more with that entry's options added (a program may need several).

    Returns:
      (the ``jax.stages.Compiled``, the fallback used or None; several are merged into one whose
      symptoms, options and reasons are those of each, in the order they were needed).

    Raises:
      jax.errors.JaxRuntimeError: the compiler refused the program, and no further fallback
        applies (XLA's last message).
    """
    options = dict(compiler_options or {})
    used: list[CompileFallback] = []
    while True:
        try:
            compiled = lowered.compile(compiler_options=dict(options) or None)
            break
        except jax.errors.JaxRuntimeError as e:
            fallback = fallback_for(platform, str(e))
            if fallback is None or all(options.get(k) == v for k, v in fallback.options.items()):
                raise
            used.append(fallback)
            options.update(fallback.options)
    if len(used) <= 1:
        return compiled, (used[0] if used else None)
    return compiled, CompileFallback(
        platform, "; ".join(f.symptom for f in used),
        {k: v for f in used for k, v in f.options.items()}, "; then ".join(f.reason for f in used))


def memory_bytes(compiled: Any) -> dict[str, int]:
    """``compiled.memory_analysis()`` as bytes: ``argument``, ``output``, ``alias``, ``temp``,
    ``generated_code`` and ``peak`` (0 where the backend does not report one)."""
    stats = compiled.memory_analysis()
    keys = ("argument", "output", "alias", "temp", "generated_code")
    memory = {k: int(getattr(stats, f"{k}_size_in_bytes", 0) or 0) for k in keys}
    memory["peak"] = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    return memory


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
      fallback: the :class:`CompileFallback` the compile needed (None: XLA's defaults).
    """

    compiled: Any
    target: str
    memory: dict[str, int]
    shared_memory: dict[str, int] | None = None
    fallback: CompileFallback | None = None


def target_names() -> tuple[str, ...]:
    """The valid target names, sorted."""
    return tuple(sorted(TARGETS))


def _target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown compile target {name!r}; expected one of {list(target_names())}")
    return TARGETS[name]


def target(name: str) -> Target:
    """The :class:`Target` called ``name``.

    Raises:
      ValueError: an unknown name (the message lists the valid ones).
    """
    return _target(name)


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


def ensure_ptxas_on_path() -> None:
    """Puts the ``nvidia-cuda-nvcc-cu12`` wheel's ``bin`` (with ``ptxas``) first on ``PATH`` when no
    ``ptxas`` is on it: Mosaic GPU calls ``ptxas`` from PATH and the wheel does not put it there.
    A no-op when ``ptxas`` is found or the wheel is not installed."""
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


def require_extras(name: str, what: str | None = None) -> None:
    """Raises :class:`CompileExtrasMissing` (one line naming the ``pip install``) unless the packages
    of target ``name`` are installed; ``what`` names what is being compiled (default the target).

    Raises:
      ValueError: unknown target name.
    """
    t = _target(name)
    if not extras_available(name):
        raise CompileExtrasMissing(f"compiling for {what or repr(name)} needs "
                                   f"{install_command(t.platform)} (or run `make aot-env` and use "
                                   ".venv-aot)")


def topology_description(name: str, topology: str | None = None, what: str | None = None) -> Any:
    """The compile-only topology of target ``name``: libtpu's ``topology`` (e.g. ``"v5e:4x4"``) on
    TPU, ``topology`` (``slices x hosts x GPUs``, e.g. ``"1x2x8"``) of the target's GPU description
    (``TARGET_DIR``) on GPU; default the target's own :attr:`Target.topology`.

    Raises:
      ValueError: unknown target name.
      CompileExtrasMissing: the target's packages are not installed, or the CUDA plugin is
        installed but JAX did not start with ``JAX_PLATFORMS=cpu`` on a machine without a GPU.
    """
    from jax.experimental import topologies

    t = _target(name)
    what = what or repr(name)
    require_extras(name, what)
    topology = topology or t.topology
    if t.platform == "tpu":
        # libtpu takes a machine-wide lock file for the TPU chips; compile-only devices use no chip,
        # so concurrent compiling processes (pytest workers, two test runs) may all load it.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        return topologies.get_topology_desc(topology_name=topology, platform="tpu")
    ensure_ptxas_on_path()
    spec = (TARGET_DIR / t.spec).read_text()
    try:
        return topologies.get_topology_desc(platform="cuda", target_config=spec, topology=topology)
    except NotImplementedError as e:
        raise CompileExtrasMissing(
            f"compiling for {what}: the CUDA plugin offers no topology ({e}); start JAX with "
            "JAX_PLATFORMS=cpu on a machine without a GPU") from None


@functools.cache
def compile_only_device(name: str) -> jax.Device:
    """A compile-only device of target ``name`` (cached per process).

    Raises:
      ValueError: unknown target name (the message lists the valid ones).
      CompileExtrasMissing: see :func:`topology_description`.
    """
    t = _target(name)
    device = topology_description(name).devices[0]
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
        exceeded, a block shape Mosaic cannot tile) and no :data:`FALLBACKS` entry applies; the
        message is XLA's.
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
    platform = TARGETS[target].platform
    if shared_memory and platform == "cuda":
        import tempfile

        with tempfile.TemporaryDirectory() as dump:
            compiled, fallback = compile_lowered(lowered, platform, {"xla_dump_to": dump})
            smem = _thunk_shared_memory(dump)
    else:
        compiled, fallback = compile_lowered(lowered, platform)
    memory = memory_bytes(compiled)
    del memory["peak"]
    return CompileResult(compiled, target, memory, smem, fallback)


# -- bytes a compiled program touches outside its custom calls ----------------------------------

_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
                  "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_SHAPE = re.compile(r"\b(\w+)\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^(ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) .*\{$")
_NO_TRAFFIC = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def _shape_bytes(shape: str) -> int:
    """Bytes of every array in an HLO shape string (tuples summed; layouts and tiling ignored)."""
    total = 0
    for dtype, dims in _SHAPE.findall(shape):
        if dtype in _ELEMENT_BYTES:
            total += math.prod(int(d) for d in dims.split(",") if d) * _ELEMENT_BYTES[dtype]
    return total


def _computations(hlo_text: str) -> dict[str, tuple[bool, list[dict]]]:
    comps: dict[str, tuple[bool, list[dict]]] = {}
    current = None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m and not line.startswith(" "):
            current = m.group(2)
            comps[current] = (bool(m.group(1)), [])
            continue
        m = _INSTRUCTION.match(line.strip()) if current and line.startswith(" ") else None
        if m:
            root, name, shape, op, rest = m.groups()
            args = rest.split("), ")[0] if "), " in rest else rest
            comps[current][1].append({"root": bool(root), "name": name, "shape": shape, "op": op,
                                      "operands": re.findall(r"%([\w.\-]+)", args),
                                      "rest": rest})
    return comps


def _fused_reads(body: list[dict], full: list[int]) -> int:
    """Bytes a fusion reads of its operands (``full``: their sizes): an operand the fused
    computation only slices is read as its slices; one it only updates in place (operand 0 of a
    ``dynamic-update-slice`` or ``scatter``) is not read; any other operand is read whole."""
    total = 0
    for ins in body:
        if ins["op"] != "parameter":
            continue
        index = int(re.match(r"(\d+)", ins["rest"]).group(1))
        users = [u for u in body if ins["name"] in u["operands"]]
        first = bool(users) and all(u["operands"][0] == ins["name"] for u in users)
        if first and all(u["op"] in ("slice", "dynamic-slice") for u in users):
            total += sum(_shape_bytes(u["shape"]) for u in users)
        elif first and all(u["op"] in ("dynamic-update-slice", "scatter") for u in users):
            continue
        elif index < len(full):
            total += full[index]
    return total


def bytes_read_outside_custom_calls(hlo_text: str) -> tuple[int, int]:
    """(outside, custom): bytes the top-level instructions of a compiled program's entry
    computation read, split into those of ordinary instructions (fusions, copies, ...) and those
    passed to custom calls (Pallas / Triton kernels, library calls), from the instructions'
    operand shapes in ``compiled.as_text()``.

    For the backends without a cost analysis (XLA:GPU): what the code around the kernels costs.
    A fusion that only slices an operand reads the slices; an operand that a fusion updates in
    place (a cache written by ``dynamic-update-slice`` or ``scatter``) is not read; any other
    operand is read whole. Writes are not counted; layouts and tiling are ignored; a loop body is
    not entered (count loop-free programs).
    """
    comps = _computations(hlo_text)
    shapes = {i["name"]: i["shape"] for _, body in comps.values() for i in body}
    entry = next((body for is_entry, body in comps.values() if is_entry), None)
    if entry is None:
        raise ValueError("bytes_read_outside_custom_calls: no ENTRY computation in the HLO text")
    outside = custom = 0
    for ins in entry:
        if ins["op"] in _NO_TRAFFIC:
            continue
        full = [_shape_bytes(shapes.get(o, "")) for o in ins["operands"]]
        called = re.search(r"calls=%?([\w.\-]+)", ins["rest"])
        if ins["op"] == "fusion" and called and called.group(1) in comps:
            read = _fused_reads(comps[called.group(1)][1], full)
        elif ins["op"] in ("dynamic-update-slice", "scatter"):
            read = sum(full[1:])
        else:
            read = sum(full)
        if ins["op"] == "custom-call":
            custom += read
        else:
            outside += read
    return outside, custom
