"""Static TPU schedules: a kernel's cycles counted from the VLIW bundles libtpu emits.

XLA's cost analysis gives a program's bytes and FLOPs; a kernel can move few bytes and still be
slow, bound by its vector (VALU), matrix (MXU) or scalar (SALU) units or by issuing DMAs. libtpu
writes the final VLIW schedule of every program it compiles, also for compile-only devices, when
it is started with the flags of :func:`dump_flags` (``LIBTPU_INIT_ARGS``, set before JAX loads
libtpu). This module reads that dump:

* ``<id>-<kernel>-NN-final_bundles.txt``: one line per VLIW bundle (``0xADDR [LB:] >> { op ;; op
  }``); the ``>`` marks give the bundle's loop depth and ``LB:`` a loop's first bundle;
* ``<id>-<kernel>-NN-final_hlo-static-per-bundle-utilization.txt``: after ``== UTILIZATION:``,
  one line per bundle with the slots it uses of each unit (the units and their slots per bundle
  under ``== CAPACTIY:``, spelled so by libtpu).

One bundle issues per cycle when nothing stalls, so the bundles a program issues are a lower bound
on its cycles (no stalls, no DMA or memory latency): :attr:`KernelSchedule.cycles` weights each
bundle by the trip counts of the loops around it, read from the constant bound of each loop's exit
test (a loop whose bound is a register has no static trip count: the kernel then has none either).
A Pallas grid runs as a software-pipelined loop of G + 2 trips for G grid steps (the first trip
only starts the first block's copies, the last only finishes the last block's writes); the
kernel body sits in a region the loop skips unless its iteration index i satisfies ``a <= i < b``
(a branch on ``pnand(i >= a, i < b)`` over it), so that region's bundles are counted ``b - a``
times per entry (:attr:`Loop.guards`), not once per trip. Other conditionals (``pl.when`` on
program ids) are counted on every trip, both sides: an upper bound for those bundles.
For the XLA part of a step, each instruction of the compiled TPU HLO carries the compiler's own
``"estimated_cycles"`` in its backend config (:func:`xla_estimated_cycles`), counted once per
execution: a ``while`` loop's body once per trip (:func:`while_trip_count`); Pallas kernels
(``tpu_custom_call``) carry none and are added from their schedules (:func:`static_step`).

Clock (:data:`CLOCK_HZ`): peak bf16 FLOP/s / (2 x MXU multiply-accumulates per cycle): v5e 197
TFLOP/s over 4 MXUs of 128 x 128 = 1.50 GHz, v6e 918 TFLOP/s over 4 MXUs of 256 x 256 = 1.75 GHz
(https://cloud.google.com/tpu/docs/v5e, https://cloud.google.com/tpu/docs/v6e). XLA's estimates
agree on the ratio: an elementwise pass over 512 MB is 1,216,396 cycles on v5e and 710,016 on v6e,
and 2 x 710,016 / 1,216,396 = 1.17 = 1.75 / 1.50 at twice the HBM bandwidth (measured with libtpu
0.0.42.1).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import Iterable, Mapping

# TensorCore clock per target (see the module docstring).
CLOCK_HZ: dict[str, float] = {"tpu-v5e": 197e12 / (2 * 4 * 128 * 128),
                              "tpu-v6e": 918e12 / (2 * 4 * 256 * 256)}


def dump_flags(dump_dir: str | os.PathLike) -> str:
    """The ``LIBTPU_INIT_ARGS`` flags that make libtpu write every compiled program's final
    schedule and per-bundle utilization under ``dump_dir`` (only the final passes: about 50 MB for
    a Llama-3-8B decode step). They take effect only if set before JAX loads libtpu."""
    return (f"--xla_jf_dump_to={os.fspath(dump_dir)} --xla_jf_dump_llo_text=true "
            "--xla_jf_emit_annotations=true --xla_jf_dump_llo_pass_label_regex=final")


def dump_enabled() -> str | None:
    """The dump folder named in ``LIBTPU_INIT_ARGS`` (``--xla_jf_dump_to``), or None."""
    m = re.search(r"--xla_jf_dump_to=(\S+)", os.environ.get("LIBTPU_INIT_ARGS", ""))
    return m.group(1) if m else None


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop of a schedule.

    Attributes:
      start: index of its first bundle (the ``LB:`` bundle) in the schedule.
      depth: loop depth (1: outermost, e.g. a Pallas kernel's grid loop).
      bundles: bundles of one iteration (nested loops' bundles counted once), including the
        branch's delay-slot bundles.
      trips: iterations per entry, from the constant bound of its exit test; None if the bound
        is not a constant.
      utilization: per unit, the fraction of its slots the loop's bundles use, in [0, 1].
      guards: (start, end exclusive, runs) of regions of its bundles that run on ``runs`` of its
        trips only: a branch skips them unless the loop's iteration index lies in a constant
        range (the pipeline's compute stage of a Pallas grid; module docstring).
    """

    start: int
    depth: int
    bundles: int
    trips: int | None
    utilization: dict[str, float]
    guards: tuple[tuple[int, int, int], ...] = ()

    @property
    def bound_unit(self) -> str:
        """The unit with the largest slot utilization in this loop."""
        return max(self.utilization, key=self.utilization.get)


@dataclasses.dataclass(frozen=True)
class KernelSchedule:
    """The final schedule of one compiled kernel.

    Attributes:
      name: the kernel's HLO instruction name (e.g. ``qvg_chunk_attention.1``).
      bundles: bundles in the schedule (straight-line count).
      loops: its loops, in program order.
      utilization: per unit, the fraction of its slots used over the whole schedule.
    """

    name: str
    bundles: int
    loops: tuple[Loop, ...]
    utilization: dict[str, float]

    def cycles_at(self, dynamic_trips: int | None = None) -> int | None:
        """Bundles issued by one call: each bundle once per iteration of every loop around it
        (nested loops multiply), a loop without a static trip count taken to run
        ``dynamic_trips`` times; None when such a loop exists and ``dynamic_trips`` is None.

        Raises:
          ValueError: ``dynamic_trips`` < 0.
        """
        if dynamic_trips is not None and dynamic_trips < 0:
            raise ValueError(f"{self.name}: dynamic_trips={dynamic_trips} must be >= 0")
        weight = [1] * self.bundles
        for lp in self.loops:
            trips = lp.trips if lp.trips is not None else dynamic_trips
            if trips is None:
                return None
            runs = [trips] * lp.bundles
            for start, end, n in lp.guards:
                runs[start - lp.start:end - lp.start] = [min(n, trips)] * (end - start)
            for i in range(lp.start, lp.start + lp.bundles):
                weight[i] *= runs[i - lp.start]
        return sum(weight)

    @property
    def cycles(self) -> int | None:
        """:meth:`cycles_at` with static trip counts only."""
        return self.cycles_at(None)

    @property
    def dynamic(self) -> bool:
        """Whether a loop has no static trip count."""
        return any(lp.trips is None for lp in self.loops)

    @property
    def inner_loop(self) -> Loop | None:
        """The deepest loop (the largest of those at that depth); None for a loop-free kernel."""
        if not self.loops:
            return None
        return max(self.loops, key=lambda lp: (lp.depth, lp.bundles))

    def summary(self) -> dict:
        """A JSON-ready dict: name, bundles, cycles, and the inner loop's bundles, trips, bound
        unit and utilization."""
        inner = self.inner_loop
        out = {"name": self.name, "bundles": self.bundles, "cycles": self.cycles}
        if inner is not None:
            out.update(inner_loop_bundles=inner.bundles, inner_loop_trips=inner.trips,
                       bound_unit=inner.bound_unit,
                       utilization={k: round(v, 3) for k, v in inner.utilization.items()})
        return out


_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+(?:([A-Z]{2}):\s*)?:?\s*(>*)\s*\{(.*)$")
_EXIT_TEST = re.compile(r"scmp\.\w+\.s32\.totalorder\s+(\(!?%p\w+\)\s*,?\s*)?%s\w+,\s*(\d+)\s*"
                        r"/\* loop exit test \*/")


@dataclasses.dataclass(frozen=True)
class _Bundle:
    depth: int
    head: bool
    empty: bool
    text: str


def parse_bundles(text: str, where: str = "bundles") -> list[_Bundle]:
    """The bundles of a ``final_bundles`` file, in order (a bundle may span several lines).

    Raises:
      ValueError: no bundle found (``where`` names the file).
    """
    out: list[_Bundle] = []
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if m:
            body = m.group(4)
            out.append(_Bundle(len(m.group(3)), m.group(2) == "LB",
                               body.strip().startswith("}"), body))
        elif out:  # continuation of a multi-line comment inside the last bundle
            last = out[-1]
            out[-1] = dataclasses.replace(last, text=last.text + "\n" + line)
    if not out:
        raise ValueError(f"{where}: no VLIW bundle lines ('0xADDR : {{ ... }}'); expected a "
                         "libtpu final_bundles file")
    return out


def parse_utilization(text: str, where: str = "utilization") -> tuple[dict[str, int], list[list[int]]]:
    """({unit: slots per bundle}, one row of slot counts per bundle) from a
    ``final_hlo-static-per-bundle-utilization`` file.

    Raises:
      ValueError: the capacity or utilization section is missing or malformed.
    """
    lines = [ln.strip() for ln in text.splitlines()]
    try:
        c = next(i for i, ln in enumerate(lines) if ln.startswith("== CAPAC"))
        u = lines.index("== UTILIZATION:")
    except (StopIteration, ValueError):
        raise ValueError(f"{where}: expected '== CAPACTIY:' and '== UTILIZATION:' sections") from None
    units = [s.strip() for s in lines[c + 1].split(",")]
    capacity = [int(s) for s in lines[c + 2].split()]
    if len(units) != len(capacity):
        raise ValueError(f"{where}: {len(units)} units but {len(capacity)} capacities")
    rows = [[int(s) for s in ln.split()] for ln in lines[u + 1:] if ln]
    if any(len(r) != len(units) for r in rows):
        raise ValueError(f"{where}: a utilization row does not have {len(units)} columns")
    return dict(zip(units, capacity)), rows


def _utilization(capacity: dict[str, int], rows: list[list[int]]) -> dict[str, float]:
    n = max(len(rows), 1)
    return {unit: sum(r[i] for r in rows) / (cap * n)
            for i, (unit, cap) in enumerate(capacity.items()) if cap}


def _loop_extents(bundles: list[_Bundle]) -> list[tuple[int, int, int]]:
    """(start, end exclusive, depth) of each loop: from its ``LB:`` bundle through the last
    following bundle at its depth or deeper, with the empty delay-slot bundles after it."""
    out = []
    for i, b in enumerate(bundles):
        if not b.head:
            continue
        last, j = i, i + 1
        while j < len(bundles):
            if bundles[j].empty and bundles[j].depth == 0:
                j += 1
                continue
            if bundles[j].depth < b.depth or (bundles[j].head and bundles[j].depth == b.depth):
                break
            last = j
            j += 1
        end = last + 1
        while end < len(bundles) and bundles[end].empty and bundles[end].depth == 0:
            end += 1
        out.append((i, end, b.depth))
    return out


def _trip_counts(bundles: list[_Bundle], extents: list[tuple[int, int, int]]) -> list[int | None]:
    """Each loop's constant exit-test bound: an unpredicated test in the loop's own bundles (not
    in a loop nested in it); else a predicated test in its range (a loop whose body is mostly
    an inner loop tests its bound there)."""
    tests = []  # (bundle index, bound, predicated)
    for i, b in enumerate(bundles):
        for m in _EXIT_TEST.finditer(b.text):
            tests.append((i, int(m.group(2)), m.group(1) is not None))
    trips: list[int | None] = []
    used: set[int] = set()
    for s, e, d in extents:
        inner = [(s2, e2) for s2, e2, d2 in extents if d2 > d and s <= s2 < e]
        own = [t for t in tests if s <= t[0] < e and not any(a <= t[0] < z for a, z in inner)]
        pick = next((t for t in own if not t[2]), None)
        if pick is None:
            pick = next((t for t in tests if s <= t[0] < e and t[2] and t[0] not in used), None)
        if pick is not None:
            used.add(pick[0])
        trips.append(None if pick is None else pick[1])
    return trips


BRANCH_DELAY_SLOTS = 4  # bundles after a scalar branch that issue whether it is taken or not
# (libtpu 0.0.42.1, v5e and v6e: every `sbr.rel` in the dumps is followed by 4 such bundles)

_OP_DEF = re.compile(r"%(p\w+) = (?:scmp\.(ge|lt)\.s32\.totalorder %(s\w+), (\d+)\b"
                     r"|pnand %(p\w+), %(p\w+))")
_BRANCH = re.compile(r"sbr\.rel \(%(p\w+)\) target = \$region(\d+)")
_ITERATION_INDEX = re.compile(r"%(s\w+) = sphi [^;]*?iteration index, stage = 0\b")
_SPILL_STORE = re.compile(r"sst \[smem:\[#(allocation\w+_spill)\]\] %(s\w+)")
_SPILL_LOAD = re.compile(r"%(s\w+) = sld \[smem:\[#(allocation\w+_spill)\]\]")
_COPY = re.compile(r"%(s\w+) = smov %(s\w+)\s*(?:$|/\*)")


def _copies(bundles: list[_Bundle], reg: str) -> set[str]:
    """``reg`` and the scalar registers holding its value: unpredicated ``smov`` copies and
    reloads of a spill slot that only ``reg`` or its copies are stored to."""
    ops = [op.strip() for b in bundles for op in b.text.split(";;")]
    stores: dict[str, set[str]] = {}
    for op in ops:
        m = _SPILL_STORE.search(op)
        if m:
            stores.setdefault(m.group(1), set()).add(m.group(2))
    same = {reg}
    while True:
        grown = set(same)
        for op in ops:
            m = _COPY.search(op)
            if m and m.group(2) in same:
                grown.add(m.group(1))
            m = _SPILL_LOAD.search(op)
            if m and stores.get(m.group(2), {None}) <= same:
                grown.add(m.group(1))
        if grown == same:
            return same
        same = grown


def _guards(bundles: list[_Bundle], extents: list[tuple[int, int, int]],
            trips: list[int | None]) -> list[tuple[tuple[int, int, int], ...]]:
    """Per loop, the regions of its bundles a forward branch skips unless the loop's iteration
    index i is in ``[a, b)``: the branch's predicate is ``pnand(i >= a, i < b)`` (constant a, b;
    i or a copy of it, :func:`_copies`) and its target the bundle that opens the region it
    names, less the branch's delay slots (:data:`BRANCH_DELAY_SLOTS`). Each region runs
    ``min(b, trips) - max(a, 0)`` times per entry of the loop."""
    cmp: dict[str, tuple[str, str, int]] = {}  # predicate -> (ge / lt, register, bound)
    nand: dict[str, tuple[str, str]] = {}
    for b in bundles:
        for m in _OP_DEF.finditer(b.text):
            if m.group(2):
                cmp[m.group(1)] = (m.group(2), m.group(3), int(m.group(4)))
            else:
                nand[m.group(1)] = (m.group(5), m.group(6))
    out = []
    for (s, e, _), t in zip(extents, trips):
        index = _ITERATION_INDEX.search(bundles[s].text)
        found = []
        if index is not None and t is not None:
            same = _copies(bundles, index.group(1))
            for i in range(s, e):
                for m in _BRANCH.finditer(bundles[i].text):
                    ops = [cmp.get(x) for x in nand.get(m.group(1), ())]
                    if len(ops) != 2 or None in ops or not {o[1] for o in ops} <= same:
                        continue
                    bounds = dict((o[0], o[2]) for o in ops)
                    if set(bounds) != {"ge", "lt"}:
                        continue
                    label = re.compile(rf"\bregion {m.group(2)}\b")
                    end = next((j for j in range(i + 1, e) if label.search(bundles[j].text)), None)
                    start = i + 1 + BRANCH_DELAY_SLOTS  # the delay slots run on every trip
                    if end is not None and start <= end:
                        runs = max(0, min(bounds["lt"], t) - max(bounds["ge"], 0))
                        found.append((start, end, runs))
        out.append(tuple(found))
    return out


def kernel_schedule(name: str, bundles_text: str, utilization_text: str) -> KernelSchedule:
    """A :class:`KernelSchedule` from the texts of a kernel's ``final_bundles`` and
    ``final_hlo-static-per-bundle-utilization`` files.

    Raises:
      ValueError: a malformed file, or the two disagree on the number of bundles.
    """
    bundles = parse_bundles(bundles_text, f"{name} final_bundles")
    capacity, rows = parse_utilization(utilization_text, f"{name} utilization")
    if len(rows) != len(bundles):
        raise ValueError(f"{name}: {len(bundles)} bundles but {len(rows)} utilization rows")
    extents = _loop_extents(bundles)
    trips = _trip_counts(bundles, extents)
    guards = _guards(bundles, extents, trips)
    loops = tuple(Loop(s, d, e - s, t, _utilization(capacity, rows[s:e]), g)
                  for (s, e, d), t, g in zip(extents, trips, guards))
    return KernelSchedule(name, len(bundles), loops, _utilization(capacity, rows))


_FILE = re.compile(r"^(\d+)-(.+)-(\d+)-(final_bundles|final_hlo-static-per-bundle-utilization)"
                   r"\.txt$")


def read_dump(dump_dir: str | os.PathLike, files: Iterable[str] | None = None,
              kernels_only: bool = True) -> dict[str, KernelSchedule]:
    """{kernel name: :class:`KernelSchedule`} of the programs in a libtpu dump folder.

    Args:
      dump_dir: the ``--xla_jf_dump_to`` folder.
      files: only these file names of it (e.g. those one compile added); default all.
      kernels_only: keep only Pallas kernels (programs whose entry bundle is a ``custom-call``),
        not XLA's fusions and top-level programs.

    Raises:
      ValueError: ``dump_dir`` is not a folder, a program has one of the two files without the
        other, or a file is malformed.
    """
    root = pathlib.Path(dump_dir)
    if not root.is_dir():
        raise ValueError(f"read_dump: {root} is not a folder")
    found: dict[tuple[str, str], dict[str, tuple[int, pathlib.Path]]] = {}
    for fname in (sorted(files) if files is not None else sorted(os.listdir(root))):
        m = _FILE.match(fname)
        if not m:
            continue
        key = (m.group(1), m.group(2))
        kind, order = m.group(4), int(m.group(3))
        slot = found.setdefault(key, {})
        if kind not in slot or order > slot[kind][0]:
            slot[kind] = (order, root / fname)
    out: dict[str, KernelSchedule] = {}
    for (_, name), slot in sorted(found.items()):
        if len(slot) != 2:
            raise ValueError(f"read_dump: {root}: program {name!r} has only its {list(slot)} file")
        text = slot["final_bundles"][1].read_text()
        if kernels_only and not re.search(r"entry bundle: %\S+ = custom-call\(", text):
            continue
        out[name] = kernel_schedule(
            name, text, slot["final_hlo-static-per-bundle-utilization"][1].read_text())
    return out


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = ")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$")
_CALLED = re.compile(r"\b(condition|body|calls|to_apply|true_computation|false_computation)="
                     r"%([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")


@dataclasses.dataclass(frozen=True)
class _Instr:
    name: str
    opcode: str
    operands: tuple[str, ...]  # operand names without '%', or a constant's literal
    line: str


def _closing(text: str, start: int) -> int:
    """The index after the parenthesis that closes one opened just before ``start``."""
    depth, j = 1, start
    while j < len(text) and depth:
        depth += text[j] == "("
        depth -= text[j] == ")"
        j += 1
    return j


def _parse_instr(line: str) -> _Instr | None:
    """An HLO instruction line split into name, opcode and operands (None if not one)."""
    m = _INSTR.match(line)
    if not m:
        return None
    rest = line[m.end():]
    # a tuple shape: skip to its closing parenthesis
    i = _closing(rest, 1) if rest.startswith("(") else rest.find(" ")
    call = re.match(r"\s*([\w\-]+)\(", rest[i:])
    if not call:
        return None
    start = i + call.end()
    args = [a.strip() for a in rest[start:_closing(rest, start) - 1].split(",") if a.strip()]
    return _Instr(m.group(1), call.group(1), tuple(a.lstrip("%") for a in args), line)


def _computations(hlo_text: str) -> tuple[dict[str, dict[str, _Instr]], str | None]:
    """({computation: {instruction name: instruction}}, the entry computation's name)."""
    comps: dict[str, dict[str, _Instr]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m and " = " not in line.split("{", 1)[0]:
            current = m.group(2)
            comps[current] = {}
            if m.group(1):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is not None:
            ins = _parse_instr(line)
            if ins is not None:
                comps[current][ins.name] = ins
    return comps, entry


def _root(comp: dict[str, _Instr]) -> _Instr | None:
    return next((i for i in comp.values() if i.line.lstrip().startswith("ROOT ")), None)


def _through_copies(comp: dict[str, _Instr], name: str) -> _Instr | None:
    ins = comp.get(name)
    while ins is not None and ins.opcode in ("copy", "bitcast", "convert") and ins.operands:
        ins = comp.get(ins.operands[0])
    return ins


def _constant(comp: dict[str, _Instr], name: str) -> int | None:
    ins = _through_copies(comp, name)
    if ins is None or ins.opcode != "constant" or not ins.operands:
        return None
    try:
        return int(ins.operands[0])
    except ValueError:
        return None


def _tuple_index(comp: dict[str, _Instr], name: str) -> int | None:
    """The tuple index ``name`` reads of the computation's parameter (get-tuple-element)."""
    ins = _through_copies(comp, name)
    if ins is None or ins.opcode != "get-tuple-element":
        return None
    m = re.search(r"\bindex=(\d+)", ins.line)
    src = comp.get(ins.operands[0]) if ins.operands else None
    return int(m.group(1)) if m and src is not None and src.opcode == "parameter" else None


def while_trip_count(hlo_text: str, name: str) -> int:
    """The trip count of the ``while`` instruction ``name`` of a compiled HLO program: XLA's
    ``known_trip_count`` when its backend config has one; else from the induction variable: the
    condition's root compares a tuple element with a constant, the body adds a constant to that
    element, and the loop's initial tuple holds a constant there.

    Raises:
      ValueError: no such while instruction, or its trip count is not static in one of these
        forms.
    """
    comps, _ = _computations(hlo_text)
    for comp in comps.values():
        if name in comp and comp[name].opcode == "while":
            return _trip_count(comps, comp, comp[name])
    raise ValueError(f"while_trip_count: no while instruction {name!r} in the program")


def _trip_count(comps: dict[str, dict[str, _Instr]], caller: dict[str, _Instr], w: _Instr) -> int:
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', w.line)
    if known:
        return int(known.group(1))
    fail = (f"while loop {w.name!r}: no static trip count (expected its condition to compare a "
            "tuple element with a constant, its body to add a constant to it, and a constant "
            "initial value)")
    cond_name = re.search(r"\bcondition=%([\w.\-]+)", w.line)
    body_name = re.search(r"\bbody=%([\w.\-]+)", w.line)
    cond = comps.get(cond_name.group(1)) if cond_name else None
    body = comps.get(body_name.group(1)) if body_name else None
    root = _root(cond) if cond is not None else None
    direction = re.search(r"\bdirection=(\w+)", root.line) if root is not None else None
    if body is None or root is None or root.opcode != "compare" or direction is None:
        raise ValueError(fail)
    a, b = root.operands[:2]
    d = direction.group(1)
    if _tuple_index(cond, a) is None:  # constant on the left: i OP k with OP mirrored
        a, b = b, a
        d = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(d, d)
    index, bound = _tuple_index(cond, a), _constant(cond, b)
    body_root = _root(body)
    if index is None or bound is None or body_root is None or body_root.opcode != "tuple":
        raise ValueError(fail)
    update = _through_copies(body, body_root.operands[index])
    step = None
    if update is not None and update.opcode in ("add", "subtract") and len(update.operands) == 2:
        x, y = update.operands
        if update.opcode == "add" and _tuple_index(body, x) != index:
            x, y = y, x
        if _tuple_index(body, x) == index and _constant(body, y) is not None:
            step = _constant(body, y) * (1 if update.opcode == "add" else -1)
    init_tuple = _through_copies(caller, w.operands[0]) if w.operands else None
    init = (_constant(caller, init_tuple.operands[index])
            if init_tuple is not None and init_tuple.opcode == "tuple" else None)
    if step is None or init is None or step == 0:
        raise ValueError(fail)
    span = {"LT": bound - init, "LE": bound - init + 1, "GT": init - bound,
            "GE": init - bound + 1, "NE": bound - init}.get(d)
    if span is None or (d in ("LT", "LE", "NE") and step < 0) or (d in ("GT", "GE") and step > 0):
        raise ValueError(fail)
    if d == "NE" and span % step:
        raise ValueError(fail)
    return max(0, -(-span // abs(step)))


def instruction_executions(hlo_text: str) -> dict[str, int]:
    """{instruction name: times one run of the program executes it}: 1 in the entry computation
    and in the computations it calls (fusions, calls, both branches of a conditional: each
    counted once, as when the estimates are summed), times the trip count of every ``while``
    loop around it (:func:`while_trip_count`; its condition runs once more than its body).

    Raises:
      ValueError: no entry computation, or a while loop without a static trip count.
    """
    comps, entry = _computations(hlo_text)
    if entry is None:
        raise ValueError("instruction_executions: no ENTRY computation; expected the text of a "
                         "compiled HLO module")
    out: dict[str, int] = {}

    def visit(comp_name: str, w: int, stack: tuple[str, ...]) -> None:
        if comp_name not in comps or comp_name in stack:
            return
        comp = comps[comp_name]
        for ins in comp.values():
            out[ins.name] = out.get(ins.name, 0) + w
            stack2 = stack + (comp_name,)
            if ins.opcode == "while":
                trips = _trip_count(comps, comp, ins)
                for kind, callee in _CALLED.findall(ins.line):
                    visit(callee, w * (trips + 1 if kind == "condition" else trips), stack2)
                continue
            for _, callee in _CALLED.findall(ins.line):
                visit(callee, w, stack2)
            for group in _BRANCHES.findall(ins.line):
                for callee in re.findall(r"%([\w.\-]+)", group):
                    visit(callee, w, stack2)

    visit(entry, 1, ())
    return out


def xla_estimated_cycles(hlo_text: str) -> int:
    """Sum of the ``"estimated_cycles"`` XLA's TPU compiler writes in the backend config of a
    compiled program's instructions (``compiled.as_text()``), each times the executions of its
    instruction per run (:func:`instruction_executions`: a ``while`` body's instructions times
    its trip count); Pallas kernels carry none.

    Raises:
      ValueError: a while loop without a static trip count, or the program has no estimate and
        no Pallas kernel (not a compiled TPU program).
    """
    estimates = []
    for line in hlo_text.splitlines():
        c = re.search(r'"estimated_cycles":"(\d+)"', line)
        m = _INSTR.match(line)
        if c and m:
            estimates.append((m.group(1), int(c.group(1))))
    if not estimates and 'custom_call_target="tpu_custom_call"' not in hlo_text:
        raise ValueError("xla_estimated_cycles: no instruction carries estimated_cycles; expected "
                         "the text of a program compiled for TPU")
    runs = instruction_executions(hlo_text)
    return sum(c * runs.get(name, 0) for name, c in estimates)


def kernel_calls(hlo_text: str) -> dict[str, list[str]]:
    """{first instruction name: names of every call of the same kernel}: the Pallas custom calls
    (``tpu_custom_call``) of a compiled program grouped by kernel body and result shape. libtpu
    compiles one kernel per group and names it after the group's first call."""
    groups: dict[tuple[str, str], list[str]] = {}
    for line in hlo_text.splitlines():
        if 'custom_call_target="tpu_custom_call"' not in line:
            continue
        m = _INSTR.match(line)
        body = re.search(r'"body":"([^"]*)"', line)
        shape = line.split(" = ", 1)[1].split(" custom-call(", 1)[0]
        if m:
            groups.setdefault((body.group(1) if body else m.group(1), shape), []).append(m.group(1))
    return {names[0]: names for names in groups.values()}


@dataclasses.dataclass(frozen=True)
class StaticStep:
    """A static lower bound on a compiled step's time on one chip.

    Attributes:
      seconds: (kernel cycles + XLA cycles) / clock.
      kernel_cycles: bundles the Pallas kernels issue per step (each kernel's cycles times its
        calls, a call inside a ``while`` loop counted once per trip).
      xla_cycles: XLA's estimated cycles of every other instruction.
      clock_hz: the TensorCore clock used.
      kernels: per kernel: :meth:`KernelSchedule.summary` plus ``calls``.
    """

    seconds: float
    kernel_cycles: int
    xla_cycles: int
    clock_hz: float
    kernels: tuple[dict, ...]


def base_name(name: str) -> str:
    """A kernel's name without XLA's instance suffix: ``ffd_pages_attention.32`` ->
    ``ffd_pages_attention``."""
    return re.sub(r"\.\d+$", "", name)


def static_step(kernels: Mapping[str, KernelSchedule], hlo_text: str, target: str,
                dynamic_trips: Mapping[str, int] | None = None) -> StaticStep:
    """The static step time of a compiled TPU program: its kernels' schedules (from
    :func:`read_dump` of its compile) times their calls (:func:`kernel_calls`, each call times
    its executions, :func:`instruction_executions`), plus
    :func:`xla_estimated_cycles`, at :data:`CLOCK_HZ` of ``target``.

    Args:
      dynamic_trips: {kernel base name (:func:`base_name`): iterations} of the loops whose bound
        is a runtime value (e.g. FFD's rounds over the kept pages): what the caller assumes,
        as its ``pl.CostEstimate`` does.

    Raises:
      ValueError: unknown target; a kernel call with no schedule, or one with a loop without a
        static trip count that ``dynamic_trips`` does not give; and as
        :func:`xla_estimated_cycles`.
    """
    if target not in CLOCK_HZ:
        raise ValueError(f"static_step: target {target!r} has no clock; expected one of "
                         f"{sorted(CLOCK_HZ)}")
    calls = kernel_calls(hlo_text)
    runs = instruction_executions(hlo_text)
    total, rows = 0, []
    for first, names in calls.items():
        k = next((kernels[n] for n in names if n in kernels), None)
        if k is None:
            raise ValueError(f"static_step: kernel {first!r} ({len(names)} calls) has no schedule "
                             f"in the dump (found {sorted(kernels)})")
        assumed = (dynamic_trips or {}).get(base_name(first))
        cycles = k.cycles_at(assumed)
        if cycles is None:
            raise ValueError(f"static_step: kernel {first!r} has a loop without a static trip "
                             f"count; pass dynamic_trips={{{base_name(first)!r}: ...}}")
        executions = sum(runs.get(n, 0) for n in names)
        total += cycles * executions
        rows.append({**k.summary(), "cycles": cycles, "calls": executions,
                     **({"assumed_trips": assumed} if k.dynamic else {})})
    xla = xla_estimated_cycles(hlo_text)
    clock = CLOCK_HZ[target]
    return StaticStep((total + xla) / clock, total, xla, clock, tuple(rows))


__all__ = ["CLOCK_HZ", "KernelSchedule", "Loop", "StaticStep", "base_name", "dump_enabled",
           "dump_flags", "instruction_executions", "kernel_calls", "kernel_schedule",
           "parse_bundles", "parse_utilization", "read_dump", "static_step", "while_trip_count",
           "xla_estimated_cycles"]
