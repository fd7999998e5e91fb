"""Rows of the ahead-of-time compile table (``AOT.md``) and their store: one row per step and
pod topology, its roofline, its cells, the rendered table, and the JSON list of rows kept beside it.

A row is a JSON-able dict: ``step``, ``topology`` (``core.aot_steps.POD_TOPOLOGIES``), ``chip``,
``chips``, ``status`` (``"ok"`` or ``"error"`` with ``reason``, one line), ``seconds`` (compile
time); an ``ok`` row also has ``memory`` (per-device bytes by kind, ``core.aot.memory_bytes``),
``needed_bytes``, ``flops`` and ``bytes_accessed`` (XLA's cost analysis per device, None where the
backend gives none), ``model_flops``, ``shape``, and optionally ``layer_loop``, ``static``
(``core.tpu_schedule``), ``fallback``, ``fallback_change`` and ``compile_options``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence

from core import aot_steps, files


def add_roofline(row: dict) -> dict:
    """Adds ``roofline`` (step seconds, bound, MFU, which FLOP count was used) to an ``ok`` row
    that has XLA's cost analysis (TPU) of every layer; others (and rows whose layers run in one
    loop, whose cost XLA counts for one block) are returned unchanged."""
    if (row.get("status") != "ok" or row.get("flops") is None or row.get("bytes_accessed") is None
            or row.get("layer_loop")):
        return row
    model = row.get("model_flops")
    per_chip_model = 0.0 if model is None else model / row["chips"]
    flops = max(row["flops"], per_chip_model)
    r = aot_steps.roofline(row["chip"], flops_per_chip=flops, bytes_per_chip=row["bytes_accessed"],
                           model_flops=model or 0.0, num_chips=row["chips"])
    return {**row, "roofline": {"step_seconds": r.step_seconds, "bound": r.bound,
                                "mfu": None if model is None else r.mfu,
                                "flops_source": "xla" if row["flops"] >= per_chip_model
                                else "model"}}



def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB"


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


_UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def hbm_exhausted(reason: str) -> tuple[float, float] | None:
    """(required, available) bytes from libtpu's refusal of a program that does not fit ("... the
    total memory required for HLO temporaries (16.85G) exceeds available HBM (15.75G)"; G read as
    GiB), or None for another reason."""
    m = re.search(r"\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)", reason)
    if m is None:
        return None
    return float(m[1]) * _UNITS[m[2]], float(m[3]) * _UNITS[m[4]]


def usable_bytes(topology: str) -> float:
    """Usable HBM per device of ``topology`` (``core.aot_steps.CHIPS``)."""
    return aot_steps.CHIPS[aot_steps.pod_topology(topology).chip].usable_bytes


def _percent(x: float) -> str:
    """Two significant digits: ``19%``, ``8.4%``, ``0.031%``."""
    return f"{100 * x:.2g}%" if x < 0.1 else f"{100 * x:.0f}%"


def fit_cell(row: dict | None) -> str:
    """The steps x topologies cell: ``fits 6.1/15.8 GiB``, ``over by 3.0 GiB``, ``error`` or
    ``not run``."""
    if row is None:
        return "not run"
    if row["status"] != "ok":
        oom = hbm_exhausted(row.get("reason", ""))
        if oom is None:
            return "error"
        return (f"**over by {_gib(oom[0] - oom[1])}** (temporaries {oom[0] / 2 ** 30:.1f}/"
                f"{oom[1] / 2 ** 30:.1f} GiB)")
    need, usable = row["needed_bytes"], usable_bytes(row["topology"])
    mark = " (fallback)" if row.get("fallback") else ""
    if need <= usable:
        return f"fits {need / 2 ** 30:.1f}/{usable / 2 ** 30:.1f} GiB{mark}"
    return (f"**over by {_gib(need - usable)}** ({need / 2 ** 30:.1f}/{usable / 2 ** 30:.1f} GiB)"
            f"{mark}")


def static_cell(row: dict) -> str:
    """The static step time of a TPU row (``>= 15.5 ms``: a lower bound from the compiler's
    schedule, ``core.tpu_schedule``) with its kernels' share and each kernel's bound unit, or
    ``-``."""
    st = row.get("static")
    if st is None:
        return "-"
    total = st["kernel_cycles"] + st["xla_cycles"]
    cell = f">= {st['seconds'] * 1e3:.1f} ms"
    if st["kernels"]:
        bound = ", ".join(sorted({k["bound_unit"] for k in st["kernels"] if "bound_unit" in k}))
        cell += f" (kernels {st['kernel_cycles'] / total:.0%}" + (f", {bound}" if bound else "") + ")"
    return cell


def _fallback_change(row: dict) -> str:
    """What a fallback row changed: the builder's words, else the compile options."""
    return row.get("fallback_change") or ", ".join(
        f"`{k}={v}`" for k, v in row.get("compile_options", {}).items())


def render(rows: Sequence[dict], steps: Sequence[str], topologies: Sequence[str],
           header: str = "", *, not_registered: Sequence[str] = (),
           failure_notes: Mapping[str, str] | None = None) -> str:
    """``AOT.md``'s text: the steps x topologies fit table, the details of each compiled row, the
    failures with their reasons (and the note of ``failure_notes`` that matches each, see
    :func:`failure_note`), and what has not run (with the steps ``not_registered``)."""
    by = {(r["step"], r["topology"]): r for r in rows}
    out = ["# Ahead-of-time compiles for TPU and GPU pods", ""]
    if header:
        out += [header, ""]
    out += ["## Fits per device (needed / usable HBM)", "",
            "| step | " + " | ".join(topologies) + " |",
            "|---|" + "---|" * len(topologies)]
    for s in steps:
        out.append(f"| {s} | " + " | ".join(fit_cell(by.get((s, t))) for t in topologies) + " |")
    ok = [r for r in rows if r["status"] == "ok"]
    out += ["", "## Details (per device)", ""]
    if ok:
        out += ["| step | topology | sizes | arguments | outputs (aliased) | temporaries | code | "
                "XLA FLOPs | XLA bytes | roofline step | bound | MFU | static step | compile s |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(ok, key=lambda r: (list(steps).index(r["step"]) if r["step"] in steps
                                           else len(steps), r["topology"])):
            m = r["memory"]
            rf = r.get("roofline")
            flops = "-" if r["flops"] is None else _si(r["flops"])
            if rf is not None and rf["flops_source"] == "model":
                flops += f" (model: {_si(r['model_flops'] / r['chips'])})"
            nbytes = "-" if r["bytes_accessed"] is None else _si(r["bytes_accessed"]) + "B"
            step_t = "-" if rf is None else f"{rf['step_seconds'] * 1e3:.1f} ms"
            if rf is not None and r.get("model_flops") is None:
                step_t = ">= " + step_t  # XLA's counts alone: a loop body counted once
            out.append(" | ".join([
                f"| {r['step']}", r["topology"], r.get("shape", ""), _gib(m["argument"]),
                f"{_gib(m['output'])} ({_gib(m['alias'])})", _gib(m["temp"]),
                _gib(m["generated_code"]), flops, nbytes, step_t,
                "-" if rf is None else rf["bound"],
                "-" if rf is None or rf["mfu"] is None else _percent(rf["mfu"]),
                static_cell(r), f"{r['seconds']:.0f} |"]))
    else:
        out.append("No step has compiled yet.")
    fell_back = [r for r in ok if r.get("fallback")]
    if fell_back:
        out += ["", "## Compiled with a fallback", "",
                "These rows differ from the experiment's own step on this target: compile options "
                "(`core.aot.FALLBACKS`: XLA's defaults refused the program with a known symptom "
                "of compiling without a device) or a change the step's builder states.",
                "", "| step | topology | what changed | why |", "|---|---|---|---|"]
        out += [f"| {r['step']} | {r['topology']} | {_fallback_change(r)} | {r['fallback']} |"
                for r in fell_back]
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        out += ["", "## Failed or refused", "", "| step | topology | reason | note |",
                "|---|---|---|---|"]
        out += [f"| {r['step']} | {r['topology']} | {r['reason'].replace('|', '/')} | "
                f"{failure_note(r['reason'], failure_notes)} |" for r in bad]
    missing = [(s, t) for s in steps for t in topologies if (s, t) not in by]
    out += ["", "## Not yet run", ""]
    if missing:
        out += [f"- {s} on {t}" for s, t in missing]
    else:
        out.append("Every registered step has been compiled for every topology above.")
    out += [f"- not registered: {n}" for n in not_registered]
    others = [t for t in aot_steps.POD_TOPOLOGIES if t not in topologies]
    if others:
        out += ["", f"Other topologies (`--topologies`): {', '.join(others)}."]
    return "\n".join(out) + "\n"


def failure_note(reason: str, notes: Mapping[str, str] | None = None) -> str:
    """The note of ``notes`` (what was found out about a failure, by a substring of its reason)
    whose key is in ``reason`` (``""`` if none)."""
    return next((note for key, note in (notes or {}).items() if key in reason), "")


def load_rows(path: str) -> list[dict]:
    """Rows saved beside the table (``[]`` when absent). Raises ValueError for a damaged file."""
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            rows = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON list of AOT rows ({e}); delete it or pass --fresh"
                         ) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "step" in r for r in rows):
        raise ValueError(f"{path}: expected a JSON list of rows with a 'step'")
    return rows


def save_rows(path: str, rows: Sequence[dict]) -> None:
    """Writes ``rows`` to ``path`` as a JSON list (sorted keys), whole or not at all
    (:func:`core.files.write_text`)."""
    files.write_text(path, json.dumps(list(rows), indent=1, sort_keys=True))
