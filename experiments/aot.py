"""Ahead-of-time compile of every experiment's ``paper`` step for TPU and GPU pods -> ``AOT.md``.

Each experiment exports its own ``paper`` steps: ``paper_steps()`` in ``experiments/<name>.py``
returns ``{step name: (builder(devices) -> core.aot_steps.StepSpec, description)}``, the builder
calling the recipe the run calls (``build_step`` in ``algorithms/<method>/``, a
``core.steps.Step``) on the ``paper`` config with abstract values. This module only
orchestrates: :data:`STEPS` is assembled from every registered experiment
(``experiments.registry``) that defines ``paper_steps``, in the registry's order (the decode
rows, ``lm/decode-*`` and ``llama3_8b/*``, come from ``sparse_decode``). For each step and
pod topology (``core.aot_steps.POD_TOPOLOGIES``) the step is built from the experiment's ``paper``
config with abstract values only (``nnx.eval_shape`` for the model, ``jax.eval_shape`` for the
optimizer state: nothing is allocated), placed with the project's mesh and parameter sharding rules
(``core.sharding``) on the topology's compile-only devices, and compiled by XLA for that chip.
``AOT.md`` gets a steps x topologies table (fits or by how much it does not, per device), the
per-device bytes XLA assigned, a roofline step time and MFU on TPU, and the compile time. A step
that fails to compile is a row with XLA's one-line reason. The rows, their cells, the table's text
and the rows' store are ``core.aot_table``'s.

    make aot                                                  # .venv-aot, every step x topology
    JAX_PLATFORMS=cpu .venv-aot/bin/python -m experiments.aot --steps=lm/train \\
        --topologies=v5e:4x4,h100:1x2x8 --out=AOT.md

    JAX_PLATFORMS=cpu .venv-aot/bin/python -m experiments.aot --only='llama3_8b/*@v5e:4x4'

Results are kept in ``<out>.json`` beside the table and merged across runs (``--fresh`` drops
them), so that steps can be compiled a few at a time; the table lists what has not run yet.
``--only`` recompiles exactly the rows its shell patterns name (``<step>@<topology>``) and merges
them in; every write of the table and its store is atomic. A program XLA refuses with a known
symptom of compiling without a device is compiled again with the target's fallback options
(``core.aot.FALLBACKS``), and a builder may state a change it made for a target (the judge_btl fit
in float32 on TPU, ``experiments.judge_btl.aot_precision``); AOT.md lists both with the reason.
Needs ``jax[tpu]`` and the CUDA plugin (``make aot-env``); JAX must start with ``JAX_PLATFORMS=cpu``;
without them the run stops with one line before writing anything.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from core import aot, aot_steps, aot_table, files, timing, tpu_schedule

DEFAULT_TOPOLOGIES = ("v5e:4x4", "v6e:4x4", "h100:1x2x8", "h200:1x2x8")


def discover_steps() -> dict[str, tuple[Callable[[Sequence[Any]], aot_steps.StepSpec], str]]:
    """Every registered experiment's AOT rows, in the registry's order
    (``experiments.registry.available``): each experiment module that defines ``paper_steps()``
    contributes its ``{step name: (builder(devices) -> core.aot_steps.StepSpec, description)}``
    in its own order.

    Raises:
      ValueError: two experiments export a step of the same name.
    """
    import importlib

    from experiments import registry

    steps: dict[str, tuple[Callable[[Sequence[Any]], aot_steps.StepSpec], str]] = {}
    owner: dict[str, str] = {}
    for name in registry.available():
        paper_steps = getattr(importlib.import_module(f"experiments.{name}"), "paper_steps", None)
        if paper_steps is None:
            continue
        for step, row in paper_steps().items():
            if step in steps:
                raise ValueError(f"AOT step {step!r} is exported by both experiments.{owner[step]} "
                                 f"and experiments.{name}; step names must be unique")
            steps[step], owner[step] = row, name
    return steps


# name -> (builder, what it is), from the experiments' own ``paper_steps()``. Order is the table's.
STEPS: dict[str, tuple[Callable[[Sequence[Any]], aot_steps.StepSpec], str]] = discover_steps()

# Steps of the paper variants not yet registered here (listed in AOT.md so that the gap is visible).
NOT_REGISTERED: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------------------
# One compile -> one result row


def one_line(err: BaseException, limit: int = 240) -> str:
    """``Type: first non-empty line of the message``, at most ``limit`` characters."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = f"{type(err).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def compile_row(step: str, topology: str) -> dict:
    """Builds and compiles ``step`` for ``topology``; a dict for the table (``status`` ``"ok"``
    or ``"error"`` with ``reason``). Never raises for a failed build or compile.

    Raises:
      core.aot.CompileExtrasMissing: the topology's compile extras are missing (no row is made).
    """
    import jax

    topo = aot_steps.pod_topology(topology)
    row: dict[str, Any] = {"step": step, "topology": topology, "chip": topo.chip,
                           "chips": topo.num_devices}
    dump = tpu_schedule.dump_enabled() if topo.chip.startswith("tpu") else None
    before = set(os.listdir(dump)) if dump and os.path.isdir(dump) else set()
    with timing.Stopwatch() as clock:
        try:
            devices = aot_steps.pod_devices(topology)
            spec = STEPS[step][0](devices)
            row.update(shape=spec.shape, params=spec.params, model_flops=spec.model_flops)
            if spec.layer_loop:
                row["layer_loop"] = True
            with jax.enable_x64(spec.x64):
                result = aot_steps.compile_step(spec.fn, spec.args, donate_argnums=spec.donate_argnums)
        except aot.CompileExtrasMissing:
            raise  # the machine cannot compile for this topology at all: not a row of the table
        except Exception as e:  # noqa: BLE001 (a failed compile is a row, not a crash)
            row.update(status="error", reason=one_line(e), seconds=clock.seconds)
            return row
    row.update(status="ok", seconds=result.seconds, memory=result.memory,
               needed_bytes=result.needed_bytes, flops=result.flops,
               bytes_accessed=result.bytes_accessed)
    if dump and result.hlo_text is not None:
        row.update(static_schedule(dump, before, result.hlo_text, topo.chip, spec.dynamic_trips))
    if spec.fallback is not None:
        row.update(fallback_change=spec.fallback[0], fallback=spec.fallback[1])
    if result.fallback is not None:
        row.update(compile_options=result.fallback.options, fallback=result.fallback.reason,
                   fallback_change=", ".join(f"`{k}={v}`" for k, v in
                                             result.fallback.options.items()))
    return row


def static_schedule(dump: str, before: set[str], hlo_text: str, chip: str,
                    dynamic_trips: dict[str, int] | None = None) -> dict:
    """``{"static": ...}``: the static step time of the program just compiled (its kernels'
    schedules from the files libtpu added to the dump folder ``dump`` since ``before``, plus XLA's
    estimated cycles; ``core.tpu_schedule.static_step``), or ``{"static_note": why not}``. The
    program's dump files are deleted."""
    new = sorted(set(os.listdir(dump)) - before) if os.path.isdir(dump) else []
    try:
        st = tpu_schedule.static_step(tpu_schedule.read_dump(dump, files=new), hlo_text, chip,
                                      dynamic_trips)
        out = {"static": {"seconds": st.seconds, "kernel_cycles": st.kernel_cycles,
                          "xla_cycles": st.xla_cycles, "clock_hz": st.clock_hz,
                          "kernels": list(st.kernels)}}
    except ValueError as e:
        out = {"static_note": one_line(e)}
    for name in new:
        path = os.path.join(dump, name)
        if os.path.isfile(path):
            os.unlink(path)
    return out


# What was found out about a failure, by a substring of its reason (measured on this machine).
FAILURE_NOTES = {
    "tuple parameter that is being flattened": (
        "float64 on TPU is emulated: the same fit compiles for one v5e chip (225 s at 1000 rows) "
        "and in float32 on the 16-chip mesh (10 s); `experiments.judge_btl.aot_precision` "
        "compiles it in float32 on TPU"),
}


NOTES = (
    "Built by `make aot` (`experiments/aot.py`): each experiment's `paper` step, from abstract "
    "values only, placed by `core.sharding` (FSDP over `data`, tensor parallelism over `model`, "
    "the config's `model_parallelism`), compiled by XLA for compile-only devices of each "
    "topology on a CPU-only machine. Needed = arguments + outputs not aliased onto the donated "
    "state + temporaries + code, per device (XLA's buffer assignment); usable HBM: what libtpu "
    "reports available on TPU (15.75 GiB v5e, 31.25 GiB v6e; libtpu refuses to compile a program "
    "that does not fit, and the cell gives its numbers), 75% of the chip on GPU (JAX's default "
    "preallocation; `core/aot_steps.py`). Roofline (TPU "
    "only; XLA:GPU gives no cost analysis): max(FLOPs/peak, bytes/HBM bandwidth) per chip, "
    "MFU = model FLOPs (3 x analytic forward FLOPs x tokens) / (step time x peak x chips). XLA "
    "counts a loop body once (layer scans, blockwise attention), so the roofline uses the larger "
    "of XLA's FLOP count and the model's share per chip (shown as \"model: ...\" when larger); "
    "XLA's byte count is its estimate of HBM traffic after fusion (a loop body again counted "
    "once; rows whose layers are scanned therefore have no roofline). Static step (TPU, loop-free "
    "programs): a lower bound from the compiler's own schedule (`core/tpu_schedule.py`): each "
    "Pallas kernel's VLIW bundles weighted by its loops' trip counts (a grid's kernel body once "
    "per grid step, not on the two extra trips of its pipelined loop), times its calls, plus XLA's "
    "estimated cycles of every other instruction, at the TensorCore clock (v5e 1.50 GHz, v6e "
    "1.75 GHz); no stalls or DMA latency are counted. Beside it: the kernels' share of those "
    "cycles and the unit that bounds each kernel's inner loop (AOT.md.json, `static`: per kernel "
    "its cycles, calls, inner-loop bundles and trips, and slot utilization per unit). Train steps with "
    "attention 'auto' run splash attention on TPU; on GPU they run "
    "blockwise attention here, because cuDNN's is chosen only when a GPU is attached while "
    "tracing, so their GPU temporaries are an upper bound. The Llama-3-8B decode rows run FFD's "
    "and QVG's Pallas kernels inside `shard_map` (`kernels/*/sharded.py`); the `lm` decode rows "
    "use their XLA paths. Recompile chosen rows "
    "with `python -m experiments.aot --only='<step>@<topology>,...'` (shell patterns; merged into "
    "this table). Kernel compiles (single device, Pallas TPU and GPU) are the compile tests: "
    "`make test-aot` (`tests/**/test_*_compile.py`).")


def parse_list(text: str, valid: Sequence[str], what: str) -> list[str]:
    """Comma list -> names, each checked against ``valid`` (ValueError naming the bad ones)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise ValueError(f"--{what}: {bad or 'empty'} not in {list(valid)}")
    return names


def select_rows(steps: Sequence[str], topologies: Sequence[str], only: Sequence[str]
                ) -> list[tuple[str, str]]:
    """The (step, topology) pairs of ``steps x topologies`` that a pattern of ``only`` names:
    shell-style patterns (``fnmatch``) matched against the step name or ``<step>@<topology>``,
    e.g. ``llama3_8b/*``, ``lm/decode-ffd@v5e:4x4`` or ``*@h100:1x2x8``.

    Raises:
      ValueError: a pattern that matches no pair (naming it).
    """
    import fnmatch

    pairs = [(s, t) for s in steps for t in topologies]
    for pattern in only:
        if not any(fnmatch.fnmatchcase(s, pattern) or fnmatch.fnmatchcase(f"{s}@{t}", pattern)
                   for s, t in pairs):
            raise ValueError(f"--only: {pattern!r} matches no row of the {len(steps)} steps x "
                             f"{list(topologies)}; rows are named <step>@<topology>")
    return [(s, t) for s, t in pairs if any(
        fnmatch.fnmatchcase(s, p) or fnmatch.fnmatchcase(f"{s}@{t}", p) for p in only)]


def run(out: str, steps: Sequence[str], topologies: Sequence[str], fresh: bool = False,
        retry_failed: bool = False, only: Sequence[str] = (),
        log: Callable[[str], None] = print) -> list[dict]:
    """Compiles every step x topology not already in ``<out>.json`` (all of them with ``fresh``;
    also those that failed with ``retry_failed``; with ``only``, exactly the rows its patterns
    name (:func:`select_rows`), whatever is stored for them) and rewrites ``out`` and
    ``<out>.json`` atomically after each compile, merging into what is stored. Returns the rows.

    Raises:
      ValueError: an ``only`` pattern that names no row; a damaged ``<out>.json``; an unknown
        topology.
      core.aot.CompileExtrasMissing: a topology's compile extras are not installed (checked
        before anything is written; one line naming the ``pip install``).
    """
    import hashlib

    import filelock

    forced = set(select_rows(steps, topologies, only)) if only else None
    for t in topologies:  # before anything is written: a machine that cannot compile for them
        aot.require_extras(aot_steps.pod_topology(t).chip, repr(t))
    store = out + ".json"
    # Several runs may share one table (e.g. TPU and GPU topologies in two processes): each save
    # re-reads the store under a lock and merges this run's rows into it.
    lock = filelock.FileLock(os.path.join(tempfile.gettempdir(), "aot-" + hashlib.sha1(
        os.path.abspath(store).encode()).hexdigest()[:16] + ".lock"))
    mine: dict[tuple[str, str], dict] = {}

    def save() -> list[dict]:
        with lock:
            rows = [r for r in aot_table.load_rows(store) if (r["step"], r["topology"]) not in mine]
            rows += list(mine.values())
            all_steps = list(dict.fromkeys([*STEPS, *(r["step"] for r in rows)]))
            order = list(aot_steps.POD_TOPOLOGIES)  # TPU first, then GPU; small to large
            all_topos = sorted({*topologies, *(r["topology"] for r in rows)}, key=order.index)
            aot_table.save_rows(store, rows)
            files.write_text(out, aot_table.render(rows, all_steps, all_topos, NOTES,
                                                   not_registered=NOT_REGISTERED,
                                                   failure_notes=FAILURE_NOTES))
        return rows

    if fresh:
        with lock:
            aot_table.save_rows(store, [])
    rows = save()

    def finished(r):  # a program libtpu refused for its size is a result, not a failure
        return not (retry_failed and r["status"] != "ok"
                    and aot_table.hbm_exhausted(r.get("reason", "")) is None)

    done = {(r["step"], r["topology"]) for r in rows if finished(r)}
    for s in steps:
        for t in topologies:
            if forced is not None:
                if (s, t) not in forced or (s, t) in mine:
                    continue
            elif (s, t) in done:
                continue
            with lock:  # another run sharing the table may have compiled it meanwhile
                if forced is None and any((r["step"], r["topology"]) == (s, t) and (finished(r) or r not in rows)
                       for r in aot_table.load_rows(store)):
                    continue
            log(f"compiling {s} for {t} ...")
            row = aot_table.add_roofline(compile_row(s, t))
            mine[(s, t)] = row
            rows = save()
            log(f"  {aot_table.fit_cell(row)}" + (f": {row['reason']}" if row["status"] != "ok" else "")
                + f" ({row['seconds']:.0f} s)")
    return rows


def main(argv: Sequence[str]) -> None:
    from absl import flags

    del argv
    f = flags.FLAGS
    try:
        steps = parse_list(f.steps, list(STEPS), "steps") if f.steps != "all" else list(STEPS)
        topos = parse_list(f.topologies, aot_steps.topology_names(), "topologies")
        only = [p.strip() for p in f.only.split(",") if p.strip()]
        with tempfile.TemporaryDirectory(prefix="libtpu-schedules-") as dump:
            # every TPU program's final schedule (core.tpu_schedule), read and deleted per row;
            # libtpu reads these flags once, when it loads
            if tpu_schedule.dump_enabled() is None:
                os.environ["LIBTPU_INIT_ARGS"] = " ".join(filter(None, (
                    os.environ.get("LIBTPU_INIT_ARGS", ""), tpu_schedule.dump_flags(dump))))
            run(f.out, steps, topos, fresh=f.fresh, retry_failed=f.retry_failed, only=only)
    except (ValueError, aot.CompileExtrasMissing) as e:
        print(f"aot: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("out", "AOT.md", "the table to write (results kept in <out>.json)")
    flags.DEFINE_string("steps", "all", f"comma list of: {', '.join(STEPS)}")
    flags.DEFINE_string("topologies", ",".join(DEFAULT_TOPOLOGIES),
                        f"comma list of: {', '.join(aot_steps.topology_names())}")
    flags.DEFINE_bool("fresh", False, "ignore the results kept from earlier runs")
    flags.DEFINE_string("only", "", "comma list of row patterns (<step>@<topology>, shell-style: "
                        "'llama3_8b/*', '*@h100:1x2x8'): compile exactly those rows again and merge "
                        "them into the table")
    flags.DEFINE_bool("retry_failed", False, "compile again the steps that failed before (not "
                      "those refused for not fitting in HBM)")
    app.run(main)
