"""Runs every benchmark module in ``experiments/bench`` and writes ``BENCHMARKS.md``.

    python -m experiments.bench.run_all --out=BENCHMARKS.md [--only=decode,sparse_decode] [--size=cpu]

Each module ``experiments.bench.<name>`` has ``SIZES`` and ``run(size="cpu") -> str`` (a markdown
section whose numbers are ratios against a baseline measured in the same run, with the command that
reproduces it). ``--size`` picks the problem sizes of every module: ``cpu`` (default; the whole run
takes a few minutes on a 2-core CPU), ``accelerator`` (sized for a GPU/TPU) or ``smoke`` (seconds,
numbers meaningless). A failing benchmark is reported and does not stop the others; the exit code
is 1 if any failed, 2 for an unknown benchmark or size. With ``--only``, the sections of the other
benchmarks already in ``--out`` are kept as they are (each section runs from its ``## <name>:``
heading to the next ``## `` heading), so one benchmark can be rerun without losing the rest.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import platform
import sys
import traceback

import jax
from absl import app, flags, logging

from core import timing
from experiments.bench.timing import SIZE_NAMES

_OUT = flags.DEFINE_string("out", "BENCHMARKS.md", "output markdown file")
_ONLY = flags.DEFINE_string("only", "", "comma-separated subset of benchmark modules")
_SIZE = flags.DEFINE_string("size", "cpu", "problem sizes: one of " + ", ".join(SIZE_NAMES))

_SKIP = {"run_all", "timing"}


def machine_description() -> str:
    """One paragraph: CPU, cores, Python, JAX version and backend devices."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return (f"{cpu}; {os.cpu_count()} logical cores; Python {platform.python_version()}; "
            f"JAX {jax.__version__} on {jax.default_backend()} ({jax.device_count()} x {devices}).")


def discover() -> list[str]:
    """Sorted names of the benchmark modules in ``experiments/bench`` (helpers excluded)."""
    import experiments.bench as bench

    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name not in _SKIP)


def existing_sections(path: str) -> dict[str, str]:
    """``{benchmark name: its section's markdown}`` of a ``BENCHMARKS.md`` written by this module
    (empty if the file does not exist); a section runs from its ``## <name>:`` heading to the next
    ``## `` heading."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    sections = {}
    for chunk in text.split("\n## ")[1:]:
        name = chunk.split(":", 1)[0].strip()
        sections[name] = ("## " + chunk).strip()
    return sections


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    names = discover()
    if _ONLY.value:
        wanted = [n.strip() for n in _ONLY.value.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            print(f"error: unknown benchmarks {unknown}; known: {names}", file=sys.stderr)
            return 2
        names = wanted
    if _SIZE.value not in SIZE_NAMES:
        print(f"error: unknown size {_SIZE.value!r}; expected one of {list(SIZE_NAMES)}", file=sys.stderr)
        return 2
    size = _SIZE.value
    size_flag = "" if size == "cpu" else f" --size={size}"
    parts = ["# Benchmarks", "",
             f"Machine: {machine_description()}", "",
             f"Regenerate with `make bench` (`python -m experiments.bench.run_all{size_flag}`); one "
             "benchmark alone with `python -m experiments.bench.run_all --only=<name>` or the command "
             f"under its table. Problem sizes: `{size}`. Every number is a ratio against a baseline "
             "measured in the same run, or an absolute time with its baseline beside it.", "",
             "On a shared 2-core CPU absolute times are noisy (other jobs compete for the cores and "
             "the memory bandwidth): only ratios measured in the same run are meaningful. Baseline "
             "and method are timed in alternation and the best call of each is kept, but a ratio "
             "can still move between runs when the load changes; compare runs by their ratios, "
             "never by their times.", ""]
    kept = existing_sections(_OUT.value) if _ONLY.value else {}
    failed = []
    for name in discover() if _ONLY.value else names:
        if name not in names:
            if name in kept:
                parts += [kept[name], ""]
            continue
        print(f"bench {name} ...", file=sys.stderr, flush=True)
        with timing.Stopwatch() as clock:
            try:
                section = importlib.import_module(f"experiments.bench.{name}").run(size=size)
            except Exception:  # noqa: BLE001 - report and continue
                failed.append(name)
                section = f"## {name}: FAILED\n\n```\n{traceback.format_exc()[-3000:]}\n```\n"
        parts += [section.strip(), "", f"_{name}: {clock.seconds:.0f} s._", ""]
    with open(_OUT.value, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {os.path.abspath(_OUT.value)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    app.run(main)
